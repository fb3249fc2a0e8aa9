"""A toy security game: each trial is one Bernoulli(p) draw.

Checks the evaluation layer end to end (runner, rate with interval, results store):

  python -m experiments.toy_game --config=configs/toy.py            # ~seconds
  python -m experiments.toy_game --config=configs/toy.py:smoke      # 1,000 trials

Expected: for each p in `toy.p`, `results.json` reports `rate` close to p with a
95% Clopper-Pearson interval [rate_ci_low, rate_ci_high] that covers p in about
95% of seeds (half-width ~0.003 at 100,000 trials and p = 0.3).
"""

from __future__ import annotations

import ml_collections

from configs import _base


def get_config(arg=None):
  opts = _base.parse_arg(arg, ('smoke',))
  smoke = opts.get('smoke', False)
  config = ml_collections.ConfigDict()
  config.dataset = 'toy'
  config.smoke = smoke
  config.seed = 0
  config.game = ml_collections.ConfigDict()
  config.game.chunk_size = 1000 if smoke else 10_000
  config.toy = ml_collections.ConfigDict()
  # A float or a list of floats in [0, 1]; each value is one results point.
  config.toy.p = (0.01, 0.3, 0.5)
  config.toy.num_trials = 1000 if smoke else 100_000
  return config
