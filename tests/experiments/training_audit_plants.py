"""Planted bugs between a DP claim and the training that runs, audited in process.

Each planted row sets `training_audit.plant` (the knob the pipeline offers for this) and runs
the pipeline's own functions (`training_audit_runs.run_training` or `.side_channel`, then
`training_audit.point_metrics`): the experiments' round loop with the defense configured by
the registry, canaries added, the audit's verdict. A test fails if its planted row is not a
violation, or if the same row without the plant is one (so a flag cannot come from the
setting itself). The federations are small (a 64-8-10 MLP of 610 parameters; canaries as
many as each plant needs: canary-dominated, which the audit's power does not mind), so that a
claim, its plant and their baseline share one compiled training (the noise is a traced
operand) and run in seconds.
"""

from __future__ import annotations

import functools

import jax

from configs import digits
from fl_privacy.pipelines import training_audit as ta
from fl_privacy.pipelines import training_audit_runs as runs
from fl_privacy.report import point_key

KEY = jax.random.key(0)


def override(config, name: str, value) -> None:
  """`config.training_audit.<name> = value` for a dotted `name` ('record.canaries'), whatever
  the field's type (a test may set a float where the default is an int)."""
  target = config.training_audit
  *path, last = name.split('.')
  for p in path:
    target = target[p]
  with target.ignore_type():
    target[last] = value


def config(plant: str = 'none', **fields):
  """The plant tests' config: `fields` override `training_audit` (dotted names allowed)."""
  c = digits.get_config('smoke')
  s = c.training_audit
  s.plant = plant
  s.side_channel_trials = 600
  s.power_draws = s.simulated_draws = 0   # the power is tested in test_audit_power.py
  # The Poisson rows' MLE / PLD test (seconds a row at these sizes) is tested in
  # tests/attacks/test_poisson_mle.py and test_training_audit_points.py; the plants are
  # flagged by the assumption-free tests.
  s.mle_test = False
  s.record.update(num_clients=10, per_client=114, canaries_per_client=12, input_per_client=6,
                  batch_size=12, epochs=1, num_rounds=5, hidden=(8,), canaries=2048,
                  input_canaries=200, twins=0)
  s.client.update(num_clients=100, per_client=1, participation=1.0, canary_share=0.5,
                  batch_size=1, epochs=1, num_rounds=5, hidden=(8,), canaries=1024, twins=0)
  for name, value in fields.items():
    override(c, name, value)
  return c


@functools.lru_cache(maxsize=4)
def _state_for(key: str):
  del key
  return ta.prepare(config())


def state(c):
  """The data and models (the same for every plant config: they share the federations'
  sizes and widths)."""
  st = dict(_state_for('plants'))
  st['defenses'] = ta.validate_config(c)['defenses']
  st['trainings'] = {}
  return st


def audit(c, defense: str, sampling: str, claim: float, canary: str, threat: str) -> dict:
  """One row's metrics, through the pipeline's functions."""
  tr = dict(defense=defense, sampling=sampling, claimed_epsilon=float(claim), canary=canary)
  st = state(c)
  k = point_key(KEY, tr)
  done = (runs.side_channel(c, st, tr, k) if canary == 'side_channel'
          else runs.run_training(c, st, tr, k))
  metrics, _ = ta.point_metrics(c, st, tr, threat, done)
  return metrics


def flagged(planted: dict, baseline: dict) -> None:
  """The planted row is a violation, its plant-free twin row is not."""
  assert float(planted['privacy_violation']) == 1.0, {
      k: planted.get(k) for k in ('best_bound', 'dp_epsilon', 'counted_bounds', 'verdict',
                                  'profile_excess', 'max_certifiable')}
  assert float(baseline['privacy_violation']) == 0.0, {
      k: baseline.get(k) for k in ('best_bound', 'dp_epsilon', 'counted_bounds', 'verdict')}
