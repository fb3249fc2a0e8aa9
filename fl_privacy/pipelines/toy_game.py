"""A toy Bernoulli game: the smallest experiment through the whole pipeline.

Each trial draws one Bernoulli(p) bit with the trial's key; a point reports the rate of ones
with its 95% Clopper-Pearson interval. `python -m experiments.toy_game` runs it
(`configs/toy.py`); it is the template of a pipeline (`pipelines.base`).
"""

from __future__ import annotations

import jax
import numpy as np

from fl_privacy import report
from fl_privacy import validate
from fl_privacy.eval import runner
from fl_privacy.eval import stats
from fl_privacy.pipelines import base
from fl_privacy.report import summary

NAME = 'toy_game'
SUMMARY = summary.Table('Toy game', (summary.param('p'), summary.rate('rate'),
                                     summary.seconds()))
P = validate.items(validate.number(0, 1), 'a number in [0, 1] or a non-empty list of them')


def bernoulli_trial(key, index, p):
  """One trial: a Bernoulli(p) draw (index unused: the key is already per trial)."""
  del index
  return jax.random.bernoulli(key, p)


def validate_config(config) -> tuple[float, ...]:
  """Checks the `toy` and `game` sections; returns the swept values of p."""
  p = validate.checked(config, 'toy.p', P)
  validate.positive(config, 'toy.num_trials', integer=True)
  validate.checked(config, 'toy.num_trials', validate.trials())
  validate.positive(config, 'game.chunk_size', integer=True)
  return tuple(float(v) for v in (p if isinstance(p, (list, tuple)) else (p,)))


def prepare(config) -> dict:
  return {'ps': validate_config(config)}


def run_game(key, p: float, num_trials: int, chunk_size: int):
  """Metrics of one point: the rate of ones with its interval."""
  ones = runner.run_trials(bernoulli_trial, key, num_trials,
                           chunk_size=chunk_size, args=(np.float32(p),))
  return stats.rate('rate', int(np.sum(ones)), num_trials), num_trials


def plan(config, state, store, key) -> list[base.Point]:
  del store
  n, chunk = int(config.toy.num_trials), int(config.game.chunk_size)
  return [base.Point({'p': p}, lambda k=report.point_key(key, {'p': p}), p=p:
                     run_game(k, p, n, chunk)) for p in state['ps']]


def figures(config, state, store, key) -> None:
  del config, state, store, key  # a table is all the toy game shows
