"""Auditing one catalog entry (buggy or twin) against its claim: lower bounds and a verdict.

The scores of a `bug_entries.Game` go to `eval.auditing.audit_scores` (jax-privacy's auditor:
Clopper-Pearson, Gaussian-DP and one-run lower bounds of epsilon at the claim's delta). Which
bounds count follows the game's curve, as in `attacks.audit.dp_canary.counted_bounds`:

- every game: `epsilon_cp` (Clopper-Pearson at a threshold chosen on half of each world's
  games; assumption-free: it holds for any mechanism) and `epsilon_one_run` (Steinke, Nasr,
  Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023, arXiv:2305.08846);
- Gaussian games: `epsilon_gdp` (Nasr et al., "Tight Auditing of Differentially Private
  Machine Learning", USENIX Security 2023, arXiv:2302.07956), a lower bound of epsilon only
  where the released mechanism's trade-off curve is Gaussian;
- games whose claim carries an accountant's event: the claim's whole privacy profile,
  `auditing.profile_violation` (Kairouz, Oh, Viswanath, ICML 2015, Theorem 2.1).

The verdict takes the largest of the k counted tests, each at 1 - (1 - c) / k (Bonferroni,
the family fixed by the game before it is played), so `privacy_violation` holds at
family-wise confidence c: a correct twin is flagged with probability at most 1 - c.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from fl_privacy.attacks.audit import bug_entries
from fl_privacy.eval import auditing

# The epsilon grid of the profile test, as multiples of the claim.
PROFILE_GRID = tuple(np.round(np.linspace(0.0, 2.0, 21), 3))


def counted(curve: str, profile: bool) -> tuple[str, ...]:
  """The tests behind the verdict of a game with this curve (module docstring)."""
  tests = ('epsilon_cp', 'epsilon_one_run')
  if curve == 'gaussian':
    tests += ('epsilon_gdp',)
  return tests + (('profile',) if profile else ())


def verdict(present: np.ndarray, scores: np.ndarray, claim: bug_entries.Claim, curve: str,
            *, confidence: float, event: Any = None) -> dict[str, Any]:
  """The audit of one point: bounds at `confidence` each, the verdict at family-wise
  `confidence` (`privacy_violation`, `verdict`), the assumption-free certified bound.

  Returns flat metrics: `epsilon_cp`, `epsilon_gdp`, `gdp_mu`, `epsilon_one_run` (each at
  `confidence`), `verdict_<test>` (each at the verdict's per-test level), `best_bound`
  (largest counted bound at that level), `certified_cp` (the Clopper-Pearson bound at that
  level: it assumes nothing of the mechanism), `profile_violation` / `profile_excess` where
  counted, `privacy_violation` (1/0), `verdict` ('violation' / 'no violation'), `n_in`,
  `n_out`, `counted_tests`, `verdict_bound_confidence`. `event`: the profile the audited
  variant's accountant states, where it is not the claim's (`bug_entries.Game.event`).
  """
  present = np.asarray(present, bool)
  scores = np.asarray(scores, np.float64)
  ins, outs = scores[present], scores[~present]
  if not auditing.split_possible(len(ins), len(outs)):
    raise ValueError(f'too few games for the audit ({len(ins)} in, {len(outs)} out): each '
                     'world needs at least 2')
  grid = [float(g) * claim.epsilon for g in PROFILE_GRID]
  # The profile this variant's accountant states (`Game.event`), else the claim's.
  if event is not None:
    claim = dataclasses.replace(claim, event=event)
  claimed = claim.profile(grid)
  tests = counted(curve, claimed is not None)
  each = 1.0 - (1.0 - float(confidence)) / len(tests)
  at_c = auditing.audit_scores(ins, outs, delta=claim.delta, confidence=confidence, fdp=False)
  at_v = auditing.audit_scores(ins, outs, delta=claim.delta, confidence=each, fdp=False)
  m: dict[str, Any] = {k: float(at_c[k]) for k in ('epsilon_cp', 'epsilon_gdp', 'gdp_mu',
                                                    'epsilon_one_run')}
  bounds = [t for t in tests if t != 'profile']
  m.update({f'verdict_{t}': float(at_v[t]) for t in bounds})
  finite = [float(at_v[t]) for t in bounds if math.isfinite(float(at_v[t]))]
  best = max(finite + [0.0])
  flagged = best > claim.epsilon
  if claimed is not None:
    p = auditing.profile_violation(ins, outs, lambda e: np.asarray(claimed), np.asarray(grid),
                                   confidence=each)
    m.update(p)
    flagged = flagged or p['profile_violation'] == 1.0
  m.update(best_bound=best, certified_cp=float(at_v['epsilon_cp']),
           privacy_violation=float(flagged),
           verdict='violation' if flagged else 'no violation',
           n_in=int(len(ins)), n_out=int(len(outs)), counted_tests=','.join(tests),
           verdict_bound_confidence=each, confidence=float(confidence),
           score_in_mean=float(np.mean(ins)), score_out_mean=float(np.mean(outs)))
  return m


def claim_metrics(claim: bug_entries.Claim) -> dict[str, Any]:
  """The claim as a results point carries it (`dp_*` fields as the other audits name them)."""
  return {'claimed_epsilon': float(claim.epsilon), 'dp_delta': float(claim.delta),
          'dp_unit': claim.unit, 'dp_relation': claim.relation,
          'dp_adversary': claim.adversary, 'dp_sampling': claim.sampling,
          'claim_stated_by': claim.stated_by,
          'claim_accountant_epsilon': (bug_entries.event_epsilon(claim.event, claim.delta)
                                       if claim.event is not None else float('nan'))}
