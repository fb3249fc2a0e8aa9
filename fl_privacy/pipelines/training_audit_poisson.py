"""The Poisson DP-SGD rows of the training audit (`fl_privacy.pipelines.training_audit`): the
fits of the Poisson-subsampled Gaussian to what every step showed of the gradient canaries.

- The moment fit (`poisson_mle.subsampled_fit_epsilon`): an ESTIMATE from two moments of
  the per-step readings (`Scores.step_moments`).
- The MLE / PLD test (`poisson_mle.audit`), where the trainings kept the per-step readings
  themselves (`Scores.step_readings`, [canaries, steps], NaN where a canary's client took no
  step): the maximum-likelihood (q, s, D), its profile-likelihood region, and the region's
  smallest PLD epsilon at the claim's delta, `epsilon_mle_pld`, a LOWER bound that assumes
  the mechanism's family (a Poisson-subsampled Gaussian read at every step). It joins the
  row's verdict as one more test of its Bonferroni family (`extra_tests`), labelled
  'poisson_subsampled_gaussian' (`canary_statistics.ASSUMES`); a row without the readings
  reports `mle_pld_model` saying so and the test is not counted.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fl_privacy import validate
from fl_privacy.attacks.audit import canary_statistics
from fl_privacy.attacks.audit import poisson_mle
from fl_privacy.pipelines import training_audit_power as power_lib

TEST = 'epsilon_mle_pld'


def is_poisson_row(tr: dict, threat: str) -> bool:
  """DP-SGD's gradient canaries read at every step of Poisson batches."""
  return (tr['canary'] == 'gradient' and threat == 'all_steps' and
          tr['sampling'] == 'poisson')


def readings(tr: dict, threat: str, done: dict) -> np.ndarray | None:
  """The row's per-step readings [canaries, steps] where the trainings kept them, else None."""
  if not is_poisson_row(tr, threat):
    return None
  got = getattr(done['scores'], 'step_readings', None)
  return None if got is None else np.asarray(got, np.float64)


def settings(config) -> tuple[bool, bool]:
  """(mle_test, mle_power): whether Poisson rows with readings run the MLE / PLD test, and
  whether their power simulation runs it in every draw (`audit_power.mle_verdict`: seconds a
  draw, ~100 draws a row): `training_audit.mle_test` and `training_audit.mle_power`
  (configs/_training_audit.py)."""
  s = config.training_audit
  test = bool(s.mle_test)
  return test, test and bool(s.mle_power)


def unused(config, *, defenses, dp_sgd_samplings, kinds, threats) -> dict[str, str]:
  """`mle_test` and `mle_power` where no row reads them (for `training_audit.unused_fields`,
  which hands over the chosen defenses, DP-SGD samplings, canary kinds and threats): no
  Poisson DP-SGD gradient row at every step, or, for `mle_power`, the test off."""
  s = config.training_audit
  rows = ('dp_sgd' in defenses and 'poisson' in dp_sgd_samplings and 'gradient' in kinds and
          'all_steps' in threats)
  if not rows:
    why = ('read only by Poisson DP-SGD rows of gradient canaries read at every step, which '
           'this config does not audit')
    return {f'training_audit.{f}': why for f in ('mle_test', 'mle_power')}
  if not s.mle_test:
    return {'training_audit.mle_power': 'read only when training_audit.mle_test is True'}
  return {}


def validate_settings(config) -> None:
  """`settings`' fields: True or False."""
  for field in ('mle_test', 'mle_power'):
    validate.checked(config, f'training_audit.{field}', validate.BOOLEAN)


def power_without_mle(power_model: str) -> str:
  """A simulated row's `power_model` when its power leaves the MLE / PLD test out (the
  simulated verdict then counts the scores' tests alone, a family of 3)."""
  if power_model.startswith(power_lib.NOT_SIMULATED):
    return power_model
  return power_model + '; without the MLE / PLD test (training_audit.mle_power off)'


def extra_tests(tr: dict, threat: str, done: dict, enabled: bool = True) -> int:
  """The tests this module adds to the row's verdict family (1 with readings, else 0)."""
  return int(enabled and readings(tr, threat, done) is not None)


def moment_fit(done: dict, world: np.ndarray, *, steps: int, delta: float) -> dict[str, Any]:
  """The moment fit and the estimate it gives (labelled by the family it assumes)."""
  mom = done['scores'].step_moments
  fit = poisson_mle.subsampled_fit_epsilon(mom[world], mom[~world], steps=int(steps),
                                           delta=float(delta))
  return {**fit, 'epsilon_estimate': fit['fit_epsilon'],
          'estimate_method': 'subsampled_gaussian_fit (pld)',
          'estimate_assumes': poisson_mle.ASSUMES}


def _split(names: str) -> tuple[str, ...]:
  return () if names in ('none', '') else tuple(names.split(','))


def mle_test(metrics: dict, reads: np.ndarray, world: np.ndarray, *, steps: int,
             delta: float) -> dict[str, Any]:
  """The MLE / PLD test of one row at the row's per-test level (`bound_confidence`, the
  family counting this test), and the verdict with it: a lower bound above the claim
  refutes it (`refuting_tests`, `verdict`, `verdict_tests`, `verdict_assumes`). A perfect
  attack's readings (no noise) give an infinite bound, so the test is among those that could
  refute (`reach_tests`, `can_refute`)."""
  claimed = float(metrics['dp_epsilon'])
  got = poisson_mle.audit(reads[world], reads[~world], steps=int(steps),
                          claimed_epsilon=claimed, delta=float(delta),
                          level=float(metrics['bound_confidence']))
  refutes = _split(metrics['refuting_tests']) + ((TEST,) if got['mle_pld_refutes'] else ())
  reach = _split(metrics.get('reach_tests', 'none')) + (TEST,)
  out = dict(got)
  out.update(certified_family=got[TEST], certified_family_test=TEST,
             certified_family_assumes=poisson_mle.ASSUMES,
             counted_bounds=f"{metrics['counted_bounds']},{TEST}",
             refuting_tests=','.join(refutes) if refutes else 'none',
             privacy_violation=float(bool(refutes)),
             mle_pld_model='per-step readings, binned MLE, profile-LR region, PLD (optimistic)')
  if 'verdict' in metrics:
    # The readings suffice to refute (a perfect attack's bound is infinite): no count needed.
    out.update(verdict=canary_statistics.verdict_of(refutes, reach), can_refute=1.0,
               canaries_needed=0, **canary_statistics.verdict_labels(refutes, reach))
  return out


def row_fits(tr: dict, threat: str, done: dict, world: np.ndarray, metrics: dict, *,
             steps: int, delta: float, enabled: bool = True) -> dict[str, Any]:
  """A Poisson row's fits: the moment estimate always (over the claim's `steps`), the MLE /
  PLD test where the readings were kept, composed over the fewest steps a canary saw
  (`mle_steps_seen`; else `mle_pld_model` says they were not). Empty for other rows."""
  if not is_poisson_row(tr, threat):
    return {}
  out = moment_fit(done, world, steps=steps, delta=delta)
  if not enabled:
    out['mle_pld_model'] = 'not run: training_audit.mle_test = False'
    return out
  reads = readings(tr, threat, done)
  if reads is None:
    out['mle_pld_model'] = ('not run: the trainings kept two moments of the per-step '
                            'readings, not the readings (Scores.step_readings)')
    return out
  # The steps the canaries saw (their readings), not those the claim counts: a training that
  # ran more steps than it claims shows them. The fewest any canary saw keeps the bound low.
  seen = int(np.min(np.sum(np.isfinite(reads), axis=1)))
  out.update(mle_test(metrics, reads, world, steps=seen, delta=delta), mle_steps_seen=seen,
             mle_steps_claimed=int(steps))
  return out


__all__ = ['TEST', 'settings', 'unused', 'validate_settings', 'power_without_mle', 'is_poisson_row', 'readings', 'extra_tests', 'moment_fit', 'mle_test',
           'row_fits']
