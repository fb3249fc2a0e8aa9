"""What runs inside a user's own Flower app: numpy and flwr only, no JAX, no other fl_privacy.

`fl_privacy_canaries` is one self-contained file (the canary ClientApp wrapper `with_canaries`,
`canary_client_app` and the recording `CanaryAuditStrategy`) that a user's app vendors:
`python -m fl_privacy.flower.inapp.vendor DEST` copies it. The analysis of what it records is
`fl_privacy.flower.audits.user_app` (docs/experiments/flower_own_app.md).
"""
