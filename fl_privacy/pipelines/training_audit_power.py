"""The power of each training-audit row (`fl_privacy.pipelines.training_audit`): which rows'
scores are the claimed mechanism's own statistic, the simulated optimal attack on them, and the
smallest planted bug each detects (`attacks.audit.audit_power`).

A row's statistic is simulated where its scores are a known function of the mechanism's
releases (`curve`): DP-SGD's gradient canaries read at every step (the Poisson likelihood
ratio, or the shuffled sum), the server reading update_dp's canary uploads (their sum over
rounds), and the white-box reader of central_dp's or weak_dp's aggregate (the subsampled
mixture's likelihood ratio of k_t x aggregate minus the known contributions). The aggregate
reader's canaries are coupled by the round's sample without replacement; the simulation draws
each canary's participation independently at the same rate (`power_model` says so). Other rows
(the last iterate, what the server sees of DP-SGD's uploads, input canaries, LDP-SGD's
reports, the side channels) mix the canary with the other clients' updates or read a
statistic the mechanism's curve does not give: `power_model` says 'not simulated'.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from fl_privacy import accounting
from fl_privacy.attacks.audit import audit_power
from fl_privacy.attacks.audit import canary_statistics
from fl_privacy.pipelines import training_audit_runs as runs
from fl_privacy.report import point_key

NOT_SIMULATED = 'not simulated'


def curve(config, tr: dict, threat: str, metrics: dict, decl,
          participation: float = 1.0) -> canary_statistics.Curve | None:
  """The claimed mechanism's own curve of a row whose scores are its statistic (module
  docstring), in units of the clip; None for the other rows."""
  z = metrics.get('noise_multiplier')
  if z is None or not math.isfinite(float(z)):
    return None
  if tr['canary'] == 'gradient' and threat == 'all_steps':
    if tr['sampling'] == 'poisson':
      return canary_statistics.Curve(steps=int(decl.compositions), noise=float(z),
                                     rate=float(decl.sampling_rate))
    fed = runs.federation(config, tr)
    return canary_statistics.Curve(steps=int(fed.epochs) * int(fed.num_rounds), noise=float(z),
                                   relation='replace_one')
  if tr['canary'] != 'client' or threat != 'all_iterates':
    return None
  if tr['defense'] == 'update_dp':
    return canary_statistics.Curve(steps=int(decl.compositions), noise=float(z),
                                   relation='replace_one')
  if tr['defense'] in ('central_dp', 'weak_dp'):
    rounds_ = int(runs.federation(config, tr).num_rounds)
    return canary_statistics.Curve(steps=rounds_, noise=float(z),
                                   rate=min(1.0, float(participation)), relation='replace_one')
  return None


def seed(config, tr: dict, threat: str) -> list[int]:
  """The row's simulation seed: the words of its point key under the run's seed."""
  k = point_key(jax.random.key(int(config.seed)), {**tr, 'threat': threat, 'use': 'power'})
  return [int(w) for w in np.asarray(jax.random.key_data(k)).ravel()]


def _planted_epsilon(decl, z: float, factor: float, delta: float, accountant: str) -> float:
  """The epsilon the claimed declaration spends at noise z x factor (the planted bug's)."""
  if not math.isfinite(factor):
    return math.nan
  return float(accounting.epsilon(decl, z * factor, delta=delta, accountant=accountant))


def row_power(config, tr: dict, threat: str, metrics: dict, decl, *, mechanism: str,
              independent: bool, midpoint: float | None, participation: float,
              kw: dict, mle_steps: int | None = None) -> dict[str, Any]:
  """The row's simulated optimum (independent rows) and detectable planted bug.

  `kw`: the audit's delta, confidence and claimed_delta; `mle_steps`: a Poisson row whose
  verdict counts the MLE / PLD test on its per-step readings (the steps each canary saw),
  simulated with it (`audit_power.mle_verdict`: about 5-10 s a draw at the default's
  16,440 canaries x 50 steps). Returns `power_model`, and where the
  row is simulated `audit_power.detectable_factor`'s fields, `power_planted_epsilon` (the
  epsilon the declaration spends at the detected factor's noise: the bug's size in epsilon)
  and, for independent canaries, `audit_power.optimum`'s (`simulated_bound` with its
  interval, draws and false alarms) and `attainable_ratio`."""
  s = config.training_audit
  c = curve(config, tr, threat, metrics, decl, participation)
  if c is None:
    return {'power_model': NOT_SIMULATED}
  if int(s.power_draws) == 0 and int(s.simulated_draws) == 0:
    return {'power_model': f'{NOT_SIMULATED} (training_audit.power_draws = 0)'}
  design = audit_power.Design(
      n_in=int(metrics['n_in']), n_out=int(metrics['n_out']), mechanism=mechanism,
      claimed_epsilon=float(metrics['dp_epsilon']), delta=float(kw['delta']),
      confidence=float(kw['confidence']), independent=bool(independent),
      claimed_delta=kw.get('claimed_delta'), midpoint=midpoint, mle_steps=mle_steps)
  words = seed(config, tr, threat)
  out: dict[str, Any] = {'power_model': (
      "the row's statistic on the claimed curve" if independent or c.rate >= 1 else
      "the row's statistic on the claimed curve, canaries drawn independently (the run "
      'couples them by sampling without replacement)')}
  if independent and int(s.simulated_draws) > 0:
    opt = audit_power.optimum(c, design, draws=int(s.simulated_draws), seed=words[0],
                              observed=float(metrics['best_bound']))
    out.update(opt)
    ref = opt['simulated_bound']
    out['attainable_ratio'] = float(metrics['best_bound']) / ref if ref > 0 else math.nan
  if int(s.power_draws) == 0:
    return out
  found = audit_power.detectable_factor(c, design, factors=tuple(s.power_factors),
                                        draws=int(s.power_draws), seed=words[-1])
  out.update(found)
  composed = decl if tr['defense'] != 'weak_dp' else dataclasses.replace(
      decl, compositions=int(runs.federation(config, tr).num_rounds))
  out['power_planted_epsilon'] = _planted_epsilon(
      composed, float(metrics['noise_multiplier']), float(found['power_factor']),
      float(kw['delta']), str(s.accountant))
  return out


__all__ = ['NOT_SIMULATED', 'curve', 'seed', 'row_power']
