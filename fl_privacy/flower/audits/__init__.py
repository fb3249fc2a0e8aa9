"""Privacy audits of Flower's own code and of a user's Flower app.

- `dp_setting` (a DP wrapper's settings, noise and stated epsilon) and `dp_games` (Flower's
  five DP wrappers and mods on one round's release, as canary games).
- `canaries`: the one-run canary audit of every round of a deployment; `canary_design` (the
  design and its draws), `canary_deploy` (the Flower job), `canary_stats` (scores, bounds).
- `user_app` (the canary ClientApp, `with_canaries`), `user_strategy`
  (`CanaryAuditStrategy`) and `user_rounds` (`audit_rounds`, the rounds' file): the same audit
  added to a user's own Flower app.
- `opacus_record`: one-run bounds of a PyTorch + Opacus app's record-level canaries.
"""
