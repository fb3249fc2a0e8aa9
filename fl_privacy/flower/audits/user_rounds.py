"""The one-run audit of a user's own Flower app from the rounds its `CanaryAuditStrategy`
recorded (`fl_privacy.flower.inapp`): the threats' statistics, `audit_rounds` (one-run
bounds, the Gaussian fit, the most the canaries can certify) against the stated claim.

Statistics per threat (rounds equally weighted: a fixed clip and noise; an adaptive clip only
costs power, any statistic fixed before the data gives valid bounds):
- `all_iterates` (a reader of every global model): sum_t <aggregate_t - model_t, v_i>;
- `last_iterate` (the final model only): <aggregate_T - model_1, v_i>;
- `uploads` (the server reading uploads, LocalDpMod's adversary): sum_t <upload_(i,t) -
  model_t, v_i>.
With client sampling the server knows whom it sampled (`canary_design.ADVERSARY`): canary i
is scored over its own rounds S_i, standardised by sqrt(|S_i|) (last iterate: sqrt(T)); a
canary never sampled scores 0 (it abstains) and is left out of the fit. The m canaries are
the trials of Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS
2023, arXiv:2305.08846): `auditing.audit_scores`, the 'split' threshold, LOWER bounds, and its
f-DP refinement (counted when the mechanism is Gaussian); the verdict takes the largest of
the counted bounds, each at 1 - (1 - c) / (their number) (Bonferroni), so it holds at
family-wise confidence c. The Gaussian fit of Andrew et al., "One-shot Empirical Privacy
Estimation for Federated Learning" (ICLR 2024, arXiv:2302.03098) against the null directions
(for `uploads`: the excluded canaries) is an ESTIMATE. Every epsilon is per client (`UNIT`),
zero-out neighbours (`RELATION`), against the stated adversary with the observed sampling.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from fl_privacy.eval import auditing
from fl_privacy.flower.audits import canary_design
from fl_privacy.flower.audits import canary_stats
from fl_privacy.flower.inapp import fl_privacy_canaries as inapp
from fl_privacy.flower.inapp import fl_privacy_canary_strategy as recorder

CanaryRound = recorder.CanaryRound
THREATS = recorder.THREATS
DEFAULT_THREATS = recorder.DEFAULT_THREATS
READERS = {'all_iterates': 'reads every global model (each round\'s aggregate)',
           'last_iterate': 'reads the final model only',
           'uploads': 'the server reading each canary\'s upload'}
UNIT = 'client'
RELATION = 'zero_out'
THRESHOLD_STRATEGY = 'split'  # `auditing.audit_scores`' default, as `canaries.audit`
SAMPLING_VARYING = 'server_chosen_varying_size'
# The fit's bootstrap draws from SeedSequence([seed, _FIT_INDEX, _FIT]): a purpose and an
# index no canary coin or direction (`inapp`'s purposes 0 and 1) reaches.
_FIT, _FIT_INDEX = 2, 2**32 - 1


def counted_bounds(threats: Sequence[str], gaussian: bool = True) -> tuple[str, ...]:
  """'<threat>/<bound>' of every bound the verdict takes the largest of (fixed by the threats
  and the mechanism's shape before any score: `canary_design.BOUNDS` per threat, the f-DP one
  only for a Gaussian mechanism)."""
  bounds = canary_design.BOUNDS if gaussian else canary_design.BOUNDS[:1]
  return tuple(f'{t}/{b}' for t in threats for b in bounds)


def max_certifiable(n_in: int, n_out: int, *, delta: float, confidence: float,
                    num_counted: int, gaussian: bool = True) -> float:
  """The largest epsilon these canaries can certify: the counted one-run bounds (each at
  1 - (1 - c) / num_counted, the 'split' threshold) on perfectly separated scores (every
  guess right). 0 where the split leaves a part without both worlds."""
  if not auditing.split_possible(int(n_in), int(n_out)):
    return 0.0
  each = 1.0 - (1.0 - float(confidence)) / int(num_counted)
  a = auditing.audit_scores(np.ones(int(n_in)), np.zeros(int(n_out)), delta=float(delta),
                            confidence=each, fdp=bool(gaussian))
  return float(max(a['epsilon_one_run'], a['epsilon_one_run_fdp'] if gaussian else 0.0))


def statistics(rounds: Sequence[CanaryRound], num_canaries: int, threats: Sequence[str]
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
  """({threat: canary scores [k]}, {threat: null scores}, participation [T, k]) (module
  docstring). Every canary sampled every round: the sums as they are; else each canary over
  its own rounds, standardised."""
  k = int(num_canaries)
  part = np.stack([r.sampled for r in rounds])
  before = np.stack([r.before for r in rounds])
  after = np.stack([r.after for r in rounds])
  deltas = after - before
  t = len(rounds)
  every = bool(part.all())
  counts = part.sum(axis=0)
  taken = counts > 0
  root = np.sqrt(np.maximum(counts, 1))
  last = after[-1] - before[0]
  canary, null = {}, {}
  if 'all_iterates' in threats:
    if every:
      canary['all_iterates'] = deltas[:, :k].sum(axis=0)
      null['all_iterates'] = deltas[:, k:].sum(axis=0)
    else:
      canary['all_iterates'] = np.where(taken, (deltas[:, :k] * part).sum(axis=0) / root, 0.0)
      null['all_iterates'] = deltas[:, k:].sum(axis=0) / math.sqrt(t)
  if 'last_iterate' in threats:
    scale = 1.0 if every else math.sqrt(t)
    canary['last_iterate'] = np.where(taken, last[:k] / scale, 0.0)
    null['last_iterate'] = last[k:] / scale
  if 'uploads' in threats:
    ups = np.stack([r.uploads for r in rounds])
    own = np.where(part & np.isfinite(ups), ups, 0.0).sum(axis=0)
    canary['uploads'] = own if every else np.where(taken, own / root, 0.0)
  return canary, null, part


def _sampling(rounds: Sequence[CanaryRound], part: np.ndarray) -> str:
  if part.all():
    return canary_design.SAMPLING_NONE
  if len({r.num_messages for r in rounds}) == 1:
    return canary_design.SAMPLING_FIXED_SIZE
  return SAMPLING_VARYING


def audit_rounds(rounds: Sequence[CanaryRound], *, seed: int, num_canaries: int, delta: float,
                 confidence: float, threats: Sequence[str] = DEFAULT_THREATS,
                 gaussian: bool = True, stated: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
  """The one-run audit of recorded rounds against the stated claim.

  Returns:
    Per threat `<threat>/epsilon_one_run`, `/epsilon_one_run_fdp` (LOWER bounds, each at
    `bound_confidence`), `/n_in`, `/n_out`, `/adversary`, the fit's `/fit_mu`, `/epsilon_fit`
    (ESTIMATES, with bootstrap intervals at c), `/n_null`, `/fit_n_in`; `best_bound`,
    `privacy_violation` (best_bound above the stated epsilon: 1.0 / 0.0, NaN without a claim),
    `max_certifiable`, `counted_bounds`, `verdict_confidence` (c, family-wise),
    `bound_confidence`, `unit`, `relation`, `adversary`, `sampling`, rounds per canary,
    `lost_canary_replies` (sampled, no model back: they carry no signal), `n_in`, `n_out`,
    `num_canaries`, `num_rounds`, `num_null`, `seed`, `delta`, `threshold_strategy`, and the
    stated claim's fields (`stated_epsilon`, `stated_delta`, `stated_epsilon_source`, ...).
  """
  if not rounds:
    raise ValueError('no recorded round to audit')
  k = int(num_canaries)
  threats = tuple(t for t in THREATS if t in threats)
  if 'uploads' in threats and any(r.uploads is None for r in rounds):
    raise ValueError("the 'uploads' threat needs the canaries' uploads, which these rounds "
                     'did not keep')
  included = np.asarray([inapp.canary_coin(seed, i) for i in range(k)])
  if included.sum() < 2 or (~included).sum() < 2:
    raise ValueError(f'{int(included.sum())} of {k} canaries included: the one-run bounds need '
                     'at least two in each world (more canaries, or another seed)')
  counted = counted_bounds(threats, gaussian)
  each = 1.0 - (1.0 - float(confidence)) / len(counted)
  scores, null, part = statistics(rounds, k, threats)
  taken = part.any(axis=0)
  replied = np.stack([r.replied for r in rounds])
  counts = part.sum(axis=0)
  m: dict[str, Any] = dict(
      unit=UNIT, relation=RELATION, adversary=canary_design.ADVERSARY,
      sampling=_sampling(rounds, part), num_canaries=k, num_rounds=len(rounds),
      num_null=int(rounds[0].before.size - k), seed=int(seed), delta=float(delta),
      n_in=int(included.sum()), n_out=int((~included).sum()),
      threshold_strategy=THRESHOLD_STRATEGY, counted_bounds=','.join(counted),
      verdict_confidence=float(confidence), bound_confidence=each,
      confidence=float(confidence), rounds_per_canary_min=int(counts.min()),
      rounds_per_canary_median=float(np.median(counts)),
      rounds_per_canary_max=int(counts.max()), canaries_never_sampled=int(np.sum(~taken)),
      lost_canary_replies=int(np.sum(part & ~replied)))
  fit_rng = inapp._rng(seed, _FIT_INDEX, _FIT)  # pylint: disable=protected-access
  for threat in threats:
    s = scores[threat]
    m.update(canary_stats.threat_metrics(
        threat, s, included, taken, null.get(threat, s[~included & taken]), delta=delta,
        each=each, confidence=float(confidence), rng=fit_rng,
        threshold_strategy=THRESHOLD_STRATEGY, fdp=gaussian))
    m[f'{threat}/adversary'] = READERS[threat]
  best = max([float(m[c]) for c in counted if not math.isnan(m[c])] + [0.0])
  m['best_bound'] = best
  m['max_certifiable'] = max_certifiable(m['n_in'], m['n_out'], delta=delta,
                                         confidence=confidence, num_counted=len(counted),
                                         gaussian=gaussian)
  m.update(stated or dict(stated_epsilon=math.nan, stated_delta=math.nan,
                          stated_epsilon_source='none'))
  eps = float(m['stated_epsilon'])
  m['privacy_violation'] = math.nan if math.isnan(eps) else float(best > eps * (1 + 1e-9))
  return m
