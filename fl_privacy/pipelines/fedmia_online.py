"""Online LiRA in the FedMIA pipeline: which trainings record IN models, and their config rule.

`lira_online` / `lira_online_fixed` (`attacks.passive.scores.ONLINE`) read the recording's
`margin_in` (`fl.recording`, `fl.shadow`): `fedmia.lira_in_models` IN models per query and
recorded round, re-run by the server from w_t on shadow sets of the test split with the query
inserted. A training records them only when one of its points scores an online attack (the
main setting with `fedmia.attacks`, the sweeps with `fedmia.sweep_attacks`), so the other
trainings cost nothing more and record what they did before. The re-run goes through the
clients' own `local.client_update` with the training's hooks, so under a defense of the
sweeps it is the defended protocol (noise drawn with the server's keys).

A stored recording without `margin_in` (made before, or for attacks without it), or with
another number of IN models, is `stale` for a training that needs them, and so is one without
the logit margins `margin` (made before LiRA and RMIA read them, `attacks.passive.lira`): the
pipeline re-trains it (the other arrays come out bit for bit the same) rather than score LiRA
or RMIA from the float32 loss.
"""

from __future__ import annotations

import numpy as np

from fl_privacy import validate
from fl_privacy.attacks.passive import scores as scores_lib

# Both online attacks fit an IN variance to the IN models (per query, or the fixed variance's
# global sigma_in pooled over the queries' IN models): two at least.
IN_MODELS = validate.number(
    2, integer=True, words='online LiRA fits an IN variance to the IN models of each query')


def online(attacks) -> bool:
  """Whether any of `attacks` is online LiRA."""
  return any(scores_lib.parse(a)[0] in scores_lib.ONLINE for a in attacks)


def validate_config(config) -> None:
  """`fedmia.lira_in_models`: an integer >= 2 (online LiRA's IN variances need two)."""
  validate.check_all(config, {'fedmia.lira_in_models': IN_MODELS})


def in_models(config, plan) -> int:
  """IN models a training records: `fedmia.lira_in_models` if its attack plan (the pipeline's
  (attack, scoring) pairs) scores online LiRA, else 0."""
  return int(config.fedmia.lira_in_models) if online(a for a, _ in plan) else 0


def stale(rec: dict[str, np.ndarray], num_models: int) -> bool:
  """Whether a stored recording lacks the logit margins (`margin`, every recording has them
  now) or the `num_models` IN models a training needs."""
  if 'margin' not in rec:
    return True
  if not num_models:
    return False
  return 'margin_in' not in rec or np.shape(rec['margin_in'])[1] != num_models
