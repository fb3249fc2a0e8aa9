"""A toy Bernoulli game: the smallest experiment through the whole pipeline.

Each trial draws one Bernoulli(p) bit with the trial's key; a point reports the
rate of ones with its 95% Clopper-Pearson interval.

  python -m experiments.toy_game                    # configs/toy.py, its default
  python -m experiments.toy_game --config=configs/toy.py:smoke --workdir=runs/toy
"""

from __future__ import annotations

import jax
import numpy as np

from experiments import common
from fl_privacy import report
from fl_privacy import validate
from fl_privacy.eval import runner
from fl_privacy.report import progress
from fl_privacy.report import summary

SUMMARY = summary.Table('Toy game', (summary.param('p'), summary.rate('rate'),
                                     summary.seconds()))


def bernoulli_trial(key, index, p):
  """One trial: a Bernoulli(p) draw (index unused: the key is already per trial)."""
  del index
  return jax.random.bernoulli(key, p)


def prepare(config) -> dict:
  """Validates the `toy` and `game` sections; returns the swept values of p."""
  validate.in_range(config, 'toy.p', 0.0, 1.0)
  validate.positive(config, 'toy.num_trials', integer=True)
  validate.positive(config, 'game.chunk_size', integer=True)
  p = config.toy.p
  ps = tuple(p) if isinstance(p, (list, tuple)) else (p,)
  validate.require(len(ps) > 0, 'toy.p', 'a number or non-empty list', p)
  return {'ps': tuple(float(v) for v in ps)}


def run_game(key, p: float, num_trials: int, chunk_size: int):
  """Metrics of one point: the rate of ones with its interval."""
  ones = runner.run_trials(bernoulli_trial, key, num_trials,
                           chunk_size=chunk_size, args=(np.float32(p),))
  metrics = common.rate('rate', int(np.sum(ones)), num_trials)
  return metrics, num_trials


def sweep(config, state, store, key) -> None:
  num_trials = int(config.toy.num_trials)
  chunk_size = int(config.game.chunk_size)
  progress.plan(len(state['ps']))
  for p in state['ps']:
    point_key = report.point_key(key, {'p': p})
    common.run_point(store, {'p': p},
                     lambda k=point_key, p=p: run_game(k, p, num_trials,
                                                       chunk_size))


if __name__ == '__main__':
  common.main('toy_game', prepare, sweep, summary=SUMMARY, default_config='configs/toy.py')
