"""What a training audit's canary scores certify, estimate, and could have certified at best.

The statistics of `attacks.audit.canaries` (a training's canaries, read by one threat) against
one claim:

- **Counted bounds** (`counted_bounds`), fixed by the mechanism and the design before any score
  is seen. The one-run bounds of Steinke, Nasr, Jagielski ("Privacy Auditing with One (1)
  Training Run", NeurIPS 2023, arXiv:2305.08846, Theorem 3.1) hold for any canaries of one
  training; the f-DP refinement (Mahloujifar et al. 2024, arXiv:2410.22235) tests Gaussian
  trade-off curves, so it counts only for Gaussian-shaped mechanisms. Where each canary's score
  is a function of its own coin and of randomness drawn for it alone (`independent`), the
  canaries are independent trials and the many-trial tests of Nasr et al. ("Tight Auditing of
  Differentially Private Machine Learning", USENIX Security 2023, arXiv:2302.07956) apply too:
  Clopper-Pearson and, for Gaussian-shaped mechanisms, the GDP bound (searched over every
  threshold, Bonferroni over them; and, where the design fixes a threshold before the data, the
  GDP bound at that one threshold, `epsilon_gdp_midpoint`: a replace-one canary's score is
  symmetric about 0 between its worlds, so 0 is the midpoint, and one pre-registered threshold
  pays no search); with the claim's privacy profile, the profile test
  (`eval.auditing.profile_violation`) as one more test.
- **The verdict** (`audit`): each of the k counted tests at 1 - (1 - c) / k (Bonferroni), so a
  violation is a verdict at family-wise c. A row whose canaries could not refute its claim even
  under a perfect attack (`attainable`: the same tests on perfectly separated scores, the same
  canaries, delta and level) says "cannot refute", not "no violation", and `canaries_needed`
  says how many would (None: none up to the search's cap, e.g. one-run bounds, whose term
  2 m delta grows with m).
- **Estimates** (not bounds): Andrew et al.'s Gaussian fit (ICLR 2024, arXiv:2302.03098,
  Sect. 3; `gaussian_fit_epsilon`) for Gaussian-shaped mechanisms, and for a Poisson-subsampled
  Gaussian read at every step the fit of its own family (`subsampled_fit_epsilon`), whose
  trade-off curve is far from Gaussian (Andrew et al.'s fit reads about 4.4 at a claimed 8).
- **A simulated reference** (`simulated_bound`): the bound the same tests reach on scores drawn
  from the claimed mechanism's own trade-off curve (its likelihood-ratio statistic), the same
  number of canaries: what an optimal attack with these canaries certifies.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import numpy as np

from fl_privacy.attacks.audit.poisson_mle import subsampled_fit_epsilon  # re-exported
from fl_privacy.eval import auditing

# Mechanisms whose trade-off curve is not Gaussian: the f-DP one-run bound and the GDP bound
# (which test Gaussian curves) are reported there but not counted.
NON_GAUSSIAN = ('ldp_sgd', 'dp_sgd_poisson', 'central_dp_without_replacement',
                'weak_dp_without_replacement')
# Pure-DP randomizers: their trade-off curve is randomized response's over any number of
# reports, so Andrew et al.'s Gaussian fit says nothing about them (it reads 15 at a claimed
# 8 for LDP-SGD over 5 reports); `audit` leaves the estimate out (NaN).
NO_ESTIMATE = ('ldp_sgd',)
BOUNDS = ('epsilon_one_run', 'epsilon_one_run_fdp', 'epsilon_cp', 'epsilon_gdp',
          'epsilon_gdp_midpoint')
VERDICTS = ('violation', 'no violation', 'cannot refute')
# What each counted test assumes of the mechanism beyond its claim. 'none': valid for any
# mechanism (the one-run bound counts guesses, Clopper-Pearson bounds the rates at one
# threshold, the profile test compares the rates with the claim's own delta(epsilon)).
# 'gaussian': valid only where the mechanism's trade-off curve is Gaussian (the GDP bounds
# read epsilon off the mu-GDP curve they reject; so does the f-DP one-run bound, which tests
# Gaussian trade-off curves: rejecting mu-GDP refutes (epsilon(mu), delta)-DP only for a
# mechanism at most as private as the Gaussian with that epsilon).
# 'poisson_subsampled_gaussian': the MLE / PLD bound of `poisson_mle` (valid where the
# mechanism is a Poisson-subsampled Gaussian read at every step, whatever its q, noise, shift).
ASSUMES = {'epsilon_one_run': 'none', 'epsilon_cp': 'none', 'profile': 'none',
           'epsilon_one_run_fdp': 'gaussian', 'epsilon_gdp': 'gaussian',
           'epsilon_gdp_midpoint': 'gaussian',
           'epsilon_mle_pld': 'poisson_subsampled_gaussian'}
# The largest number of canaries `canaries_needed` searches (2^24, about 1.7e7).
NEEDED_CAP = 1 << 24


def counted_bounds(mechanism: str, independent: bool, midpoint: bool = False
                   ) -> tuple[str, ...]:
  """The bounds that bound `mechanism`'s epsilon from these canaries (module docstring);
  `midpoint`: the design fixes a threshold before the data."""
  gaussian = mechanism not in NON_GAUSSIAN
  out = ('epsilon_one_run',) + (('epsilon_one_run_fdp',) if gaussian else ())
  if independent:
    out += ('epsilon_cp',) + (('epsilon_gdp',) if gaussian else ())
    if gaussian and midpoint:
      out += ('epsilon_gdp_midpoint',)
  return out


def gaussian_fit_epsilon(in_scores: np.ndarray, out_scores: np.ndarray, delta: float) -> tuple[
    float, float]:
  """Andrew et al. 2024's one-shot estimate (ICLR 2024, arXiv:2302.03098, Sect. 3): a
  Gaussian fitted to each world's scores, mu = |mean_in - mean_out| / pooled std, and the
  epsilon of mu-GDP at `delta`. An ESTIMATE (no confidence), not a bound. (mu, epsilon)."""
  sd = math.sqrt(0.5 * (np.var(in_scores, ddof=1) + np.var(out_scores, ddof=1)))
  if not sd > 0:
    return math.inf, math.inf
  mu = abs(float(np.mean(in_scores) - np.mean(out_scores))) / sd
  return mu, auditing.gdp_epsilon(mu, delta)


def assumes(test: str) -> str:
  """'none', 'gaussian' or 'poisson_subsampled_gaussian': what `test` (a bound of `BOUNDS`,
  'profile' or 'epsilon_mle_pld') assumes (`ASSUMES`); an unknown name is refused, never
  taken as assumption-free."""
  if test not in ASSUMES:
    raise ValueError(f'no assumption recorded for the test {test!r} (one of {tuple(ASSUMES)})')
  return ASSUMES[test]


def _largest(found: dict, names) -> tuple[float, str]:
  """(the largest finite bound among `names`, its name); (0, 'none') when there is none."""
  best, name = 0.0, 'none'
  for k in names:
    v = float(found[k])
    if math.isfinite(v) and v > best:
      best, name = v, k
  return best, name


def labelled_bounds(found: dict, counted: tuple) -> dict[str, Any]:
  """The counted bounds split by what they assume: `certified_free` (the largest bound that
  assumes nothing of the mechanism, with `certified_free_test`), `certified_gaussian` (the
  largest that assumes a Gaussian trade-off curve, with its test; 0 and 'none' where no such
  test is counted), and the best of all (`best_bound`'s `best_bound_test` and
  `best_bound_assumes`). A headline reads `certified_free`."""
  bounds = [k for k in counted if k in BOUNDS]
  free, free_test = _largest(found, [k for k in bounds if assumes(k) == 'none'])
  gauss, gauss_test = _largest(found, [k for k in bounds if assumes(k) == 'gaussian'])
  best, best_test = _largest(found, bounds)
  return {'certified_free': free, 'certified_free_test': free_test,
          'certified_free_assumes': 'none', 'certified_gaussian': gauss,
          'certified_gaussian_test': gauss_test,
          'certified_gaussian_assumes': 'gaussian' if gauss_test != 'none' else 'none',
          'best_bound_test': best_test,
          'best_bound_assumes': assumes(best_test) if best_test != 'none' else 'none'}


def refuting(r: dict, claimed_epsilon: float) -> tuple[str, ...]:
  """The counted tests of `_tests`' result `r` that refute the claim (a bound above it, or
  the profile test's violation), in counted order."""
  out = tuple(k for k in r['counted'] if float(r['found'][k]) > float(claimed_epsilon))
  if r['profile'] and r['tests']['profile_violation'] == 1.0:
    out += ('profile',)
  return out


def verdict_of(refutes: tuple, reachable: tuple) -> str:
  """'violation' when a test refutes, else 'no violation' when a perfect attack could have
  refuted (`reachable`: the tests that refute perfectly separated scores), else 'cannot
  refute'."""
  return 'violation' if refutes else 'no violation' if reachable else 'cannot refute'


def verdict_labels(refutes: tuple, reachable: tuple) -> dict[str, str]:
  """What the verdict rests on. `verdict_tests`: the tests that refute (a violation) or that
  could have (otherwise); `verdict_assumes`: 'none' when an assumption-free test carries the
  verdict (refutes, or could have refuted), else what the tests that carry it assume
  ('gaussian', 'poisson_subsampled_gaussian', or both joined by a comma); `verdict_free`:
  the verdict of the assumption-free tests alone (what the row says of a mechanism whose
  curve is not Gaussian)."""
  free = lambda tests: tuple(t for t in tests if assumes(t) == 'none')
  carry = refutes if refutes else reachable
  return {'verdict_tests': ','.join(carry) if carry else 'none',
          'verdict_assumes': 'none' if (free(carry) or not carry) else ','.join(
              sorted({assumes(t) for t in carry})),
          'verdict_free': verdict_of(free(refutes), free(reachable)),
          'reach_tests': ','.join(reachable) if reachable else 'none'}


def _level(counted: tuple, profile: bool, confidence: float, extra: int = 0) -> float:
  """Each test's level: Bonferroni over the counted bounds, the profile test and `extra`
  tests the caller runs beside them (the MLE / PLD test of a Poisson row)."""
  return 1.0 - (1.0 - float(confidence)) / (len(counted) + int(profile) + int(extra))


def _profile_grid(claimed_epsilon: float) -> np.ndarray:
  return np.linspace(0.0, 2.0 * float(claimed_epsilon), 41)


def _tests(ins: np.ndarray, outs: np.ndarray, mechanism: str, claimed_epsilon: float, *,
           delta: float, confidence: float, independent: bool,
           claimed_delta: Callable | None, midpoint: float | None = None,
           report_all: bool = True, extra: int = 0) -> dict[str, Any]:
  """The counted tests on one set of scores: the bounds, the best, the profile test (the
  f-DP one-run bound, about 0.5 s, is computed uncounted only with `report_all`), each at
  the family's level with `extra` more tests in it."""
  counted = counted_bounds(mechanism, independent, midpoint is not None)
  profile = independent and claimed_delta is not None
  each = _level(counted, profile, confidence, extra)
  found = dict(auditing.audit_scores(ins, outs, delta=delta, confidence=each,
                                     fdp=report_all or 'epsilon_one_run_fdp' in counted))
  found['epsilon_gdp_midpoint'] = math.nan
  if 'epsilon_gdp_midpoint' in counted:
    found['epsilon_gdp_midpoint'] = auditing.audit_scores(
        ins, outs, delta=delta, confidence=each, threshold_strategy='explicit',
        threshold=float(midpoint), fdp=False)['epsilon_gdp']
  best = max([float(found[k]) for k in counted if math.isfinite(found[k])] + [0.0])
  tests = {'profile_violation': math.nan, 'profile_excess': math.nan,
           'profile_epsilon': math.nan}
  if profile:
    tests = auditing.profile_violation(ins, outs, claimed_delta, _profile_grid(claimed_epsilon),
                                       confidence=each)
  return dict(found=found, best=best, tests=tests, counted=counted, profile=profile, each=each)


def attainable(n_in: int, n_out: int, mechanism: str, claimed_epsilon: float, *, delta: float,
               confidence: float, independent: bool,
               claimed_delta: Callable | None = None, midpoint: bool = False
               ) -> dict[str, Any]:
  """What a perfect attack (IN scores all above OUT scores) certifies with these canaries.

  The counted tests of `audit` on perfectly separated scores with the same n_in, n_out,
  delta and level: `max_certifiable` (their best epsilon bound; `max_certifiable_free`, the
  best of those that assume nothing), `can_refute` (that bound above the claim, or the
  profile test refuting it) and `reach_tests` (the tests that refute, the profile test
  included: the same tests as the verdict's). No attack on these canaries certifies
  more; a claim above `max_certifiable` that the profile test cannot reach is beyond the
  audit's reach, whatever the mechanism does.
  """
  ins, outs = np.ones(int(n_in)), np.zeros(int(n_out))
  r = _tests(ins, outs, mechanism, claimed_epsilon, delta=delta, confidence=confidence,
             independent=independent, claimed_delta=claimed_delta,
             midpoint=0.5 if midpoint else None, report_all=False)
  tests = refuting(r, claimed_epsilon)
  free = labelled_bounds(r['found'], r['counted'])
  return {'max_certifiable': r['best'], 'can_refute': bool(tests),
          'max_certifiable_profile': float(r['tests']['profile_violation'] == 1.0),
          'max_certifiable_free': free['certified_free'], 'reach_tests': tests}


def canaries_needed(mechanism: str, claimed_epsilon: float, *, delta: float, confidence: float,
                    independent: bool, claimed_delta: Callable | None = None,
                    midpoint: bool = False, start: int = 16,
                    cap: int = NEEDED_CAP) -> int | None:
  """The fewest canaries (fair coins: half IN, half OUT) with which a perfect attack refutes
  the claim (`attainable`), to within a factor 2^(1/4) (doubling, then a bisection of the last
  octave on a geometric grid); None when no count up to `cap` does, or when the attainable
  bound has fallen at two doublings in a row (past the one-run bounds' peak). It depends on
  the claim only through its epsilon and profile, so it is cached by them (the profile read on
  the profile test's grid)."""
  profile = None if claimed_delta is None else tuple(
      np.round(np.asarray(claimed_delta(_profile_grid(claimed_epsilon)), np.float64), 15))
  return _needed(mechanism, float(claimed_epsilon), float(delta), float(confidence),
                 bool(independent), profile, bool(midpoint), int(start), int(cap))


@functools.lru_cache(maxsize=1024)
def _needed(mechanism, claimed_epsilon, delta, confidence, independent, profile, midpoint,
            start, cap):
  grid = _profile_grid(claimed_epsilon)
  claimed_delta = None if profile is None else (
      lambda eps: np.interp(np.asarray(eps, np.float64), grid, np.asarray(profile)))
  n = max(4, int(start))
  found = None
  falls, last = 0, -math.inf
  while n <= cap:
    a = attainable(n // 2, n - n // 2, mechanism, claimed_epsilon, delta=delta,
                   confidence=confidence, independent=independent,
                   claimed_delta=claimed_delta, midpoint=midpoint)
    if a['can_refute']:
      found = n
      break
    # The one-run bounds peak and then fall (their 2 m delta term grows with m): two falls
    # in a row below the claim, and no larger count will refute it.
    falls = falls + 1 if a['max_certifiable'] < last else 0
    if falls >= 2:
      return None
    last = a['max_certifiable']
    n *= 2
  if found is None:
    return None
  if found == max(4, int(start)):
    return found
  for frac in (2 ** -0.75, 2 ** -0.5, 2 ** -0.25):
    m = int(math.ceil(found * frac))
    if attainable(m // 2, m - m // 2, mechanism, claimed_epsilon, delta=delta,
                  confidence=confidence, independent=independent,
                  claimed_delta=claimed_delta, midpoint=midpoint)['can_refute']:
      return m
  return found


def audit(scores: np.ndarray, world: np.ndarray, mechanism: str, claimed_epsilon: float, *,
          delta: float, confidence: float, independent: bool = False,
          claimed_delta: Callable[[np.ndarray], np.ndarray] | None = None,
          midpoint: float | None = None, reach: bool = True,
          report_all: bool = True, extra_tests: int = 0) -> dict[str, Any]:
  """The audit of one threat's canary scores against a claim (module docstring).

  `midpoint`: a threshold the design fixes before the data (0 for a replace-one canary whose
  score is symmetric between its worlds), which adds the GDP bound at that threshold to the
  counted tests of an independent Gaussian-shaped mechanism. `report_all` False skips the f-DP
  one-run bound where it is not counted (NaN; about 0.5 s saved). `extra_tests`: tests the
  caller runs beside these in the verdict's Bonferroni family (each test's level, reported
  as `bound_confidence`, counts them; the caller runs its own at that level).

  Returns:
    `epsilon_one_run`, `epsilon_one_run_fdp`, `epsilon_cp`, `epsilon_gdp` (each at
    `bound_confidence`), `one_run_delta_term` (2 m delta of the one-run bound) and
    `bounding_canaries` (its m: the half of the canaries the split keeps to bound on),
    `epsilon_estimate` and `gdp_mu_estimate` (Andrew et al.'s Gaussian fit; NaN for LDP-SGD),
    `num_canaries`, `n_in`, `n_out`, `best_bound`, `tightness` (best / claim),
    `privacy_violation`, `counted_bounds`, `canaries_independent`, `verdict_confidence`,
    `bound_confidence`, `score_in_mean`, `score_out_mean`, the profile test's fields; the
    labels of `labelled_bounds` (`certified_free`: the largest counted bound that assumes
    nothing, the headline; `certified_gaussian`: the largest that assumes a Gaussian curve;
    `best_bound_test`, `best_bound_assumes`) and `refuting_tests`; with `reach`,
    `max_certifiable` (`max_certifiable_free`: of the assumption-free bounds), `can_refute`,
    `verdict` ('violation', 'no violation' or 'cannot refute', from the same tests as
    `can_refute`, the profile test included), `verdict_labels`' `verdict_tests`,
    `verdict_assumes`, `verdict_free` and `reach_tests`, and `canaries_needed` (0 when the
    canaries suffice, -1 when no count up to `NEEDED_CAP` would).
  """
  scores = np.asarray(scores, np.float64)
  world = np.asarray(world, bool)
  ins, outs = scores[world], scores[~world]
  if len(ins) < 2 or len(outs) < 2:
    raise ValueError('the audit needs at least two canaries in each world')
  r = _tests(ins, outs, mechanism, claimed_epsilon, delta=delta, confidence=confidence,
             independent=independent, claimed_delta=claimed_delta, midpoint=midpoint,
             report_all=report_all, extra=extra_tests)
  found = r['found']
  mu, est = gaussian_fit_epsilon(ins, outs, delta)
  if mechanism in NO_ESTIMATE:
    mu, est = math.nan, math.nan
  refutes = refuting(r, claimed_epsilon)
  violation = bool(refutes)
  out = {k: float(found[k]) for k in BOUNDS}
  out.update(labelled_bounds(found, r['counted']))
  out['refuting_tests'] = ','.join(refutes) if refutes else 'none'
  out.update({
      'epsilon_estimate': float(est), 'gdp_mu_estimate': float(mu),
      'num_canaries': int(len(scores)), 'n_in': int(len(ins)), 'n_out': int(len(outs)),
      'bounding_canaries': int(auditing.one_run_trials(len(ins), len(outs), 'split')),
      'one_run_delta_term': float(found['one_run_delta_term']),
      'best_bound': r['best'], 'tightness': r['best'] / float(claimed_epsilon),
      'privacy_violation': float(violation),
      'counted_bounds': ','.join(r['counted'] + (('profile',) if r['profile'] else ())),
      **r['tests'], 'canaries_independent': float(independent),
      'verdict_confidence': float(confidence), 'bound_confidence': r['each'],
      'score_in_mean': float(np.mean(ins)), 'score_out_mean': float(np.mean(outs)),
  })
  if reach:
    kw = dict(delta=delta, confidence=confidence, independent=independent,
              claimed_delta=claimed_delta, midpoint=midpoint is not None)
    reach_ = attainable(len(ins), len(outs), mechanism, claimed_epsilon, **kw)
    needed = 0
    if not reach_['can_refute']:
      # Searched from 16 (one search per claim and design, cached): the first count that
      # refutes, which may sit below this row's when more canaries no longer help (the
      # one-run bound's 2 m delta grows with m).
      n = canaries_needed(mechanism, claimed_epsilon, start=16, **kw)
      needed = -1 if n is None else int(n)
    verdict = verdict_of(refutes, reach_['reach_tests'])
    out.update(max_certifiable=reach_['max_certifiable'],
               max_certifiable_free=reach_['max_certifiable_free'],
               can_refute=float(reach_['can_refute']), verdict=verdict,
               canaries_needed=needed, **verdict_labels(refutes, reach_['reach_tests']))
  return out


# -------------------------------------------------------------------- simulated reference ---


@dataclasses.dataclass(frozen=True)
class Curve:
  """A claimed mechanism's per-canary optimal statistic, to simulate its trade-off curve.

  `steps` releases. Gaussian (`rr_epsilon` None): each of std `noise` (in units of the clip),
  carrying the canary's `shift` (units of the clip) with probability `rate` (1: always); an
  add/remove canary is the shift when IN and absent when OUT, a replace-one canary +shift /
  -shift. Randomized response (`rr_epsilon` e, replace-one): each release is the canary's
  world's bit, kept with probability e^e / (1 + e^e) (the trade-off curve of any e-DP release,
  the tightest it allows: LDP-SGD's report reduced to its hemisphere). `score_noise`: the
  noise the score's likelihood ratio assumes (None: `noise`); a planted bug draws `noise`
  smaller while the audit's statistic still reads the claim's (`audit_power.planted`)."""
  steps: int
  noise: float = 1.0
  shift: float = 1.0
  rate: float = 1.0
  relation: str = 'add_remove'
  rr_epsilon: float | None = None
  score_noise: float | None = None


def curve_scores(curve: Curve, world: np.ndarray, rng: np.random.Generator,
                 chunk: int = 4096) -> np.ndarray:
  """The optimal score of each canary (its log-likelihood ratio, or for a Gaussian
  composition the sum it is a monotone function of) under `curve`, drawn in chunks."""
  world = np.asarray(world, bool)
  out = np.empty(len(world))
  s, d, q = float(curve.noise), float(curve.shift), float(curve.rate)
  v = float(s if curve.score_noise is None else curve.score_noise) ** 2   # the score's
  for lo in range(0, len(world), chunk):
    w = world[lo:lo + chunk]
    shape = (len(w), int(curve.steps))
    if curve.rr_epsilon is not None:
      keep = rng.random(shape) < 1.0 / (1.0 + math.exp(-float(curve.rr_epsilon)))
      out[lo:lo + chunk] = np.where(keep, 1.0, -1.0).sum(1) * np.where(w, 1.0, -1.0)
      continue
    noise = rng.normal(0.0, s, size=shape)
    drawn = rng.random(shape) < q if q < 1.0 else np.ones(shape, bool)
    if curve.relation == 'replace_one':
      x = noise + d * drawn * np.where(w, 1.0, -1.0)[:, None]
      if q >= 1.0:
        out[lo:lo + chunk] = x.sum(1)
      else:   # the mixture of +shift and -shift, each present with probability q
        a = (x * d - 0.5 * d * d) / v
        b = (-x * d - 0.5 * d * d) / v
        out[lo:lo + chunk] = (np.logaddexp(np.log1p(-q), np.log(q) + a) -
                              np.logaddexp(np.log1p(-q), np.log(q) + b)).sum(1)
      continue
    x = noise + d * (drawn & w[:, None])
    if q >= 1.0:
      out[lo:lo + chunk] = x.sum(1)
    else:
      a = (x * d - 0.5 * d * d) / v
      out[lo:lo + chunk] = np.logaddexp(np.log1p(-q), np.log(q) + a).sum(1)
  return out


def simulated_bound(curve: Curve, n_in: int, n_out: int, mechanism: str,
                    claimed_epsilon: float, *, delta: float, confidence: float,
                    independent: bool, claimed_delta: Callable | None = None,
                    midpoint: float | None = None, repeats: int = 3, seed: int = 0) -> float:
  """The median over `repeats` simulations of the best counted bound the audit's tests give on
  `n_in` + `n_out` canaries drawn from the claimed mechanism's own curve (`curve_scores`)."""
  rng = np.random.default_rng(seed)
  world = np.concatenate([np.ones(int(n_in), bool), np.zeros(int(n_out), bool)])
  best = []
  for _ in range(int(repeats)):
    s = curve_scores(curve, world, rng)
    best.append(_tests(s[world], s[~world], mechanism, claimed_epsilon, delta=delta,
                       confidence=confidence, independent=independent,
                       claimed_delta=claimed_delta, midpoint=midpoint,
                       report_all=False)['best'])
  return float(np.median(best))




def simulated_needed(curve: Curve, mechanism: str, claimed_epsilon: float, *, delta: float,
                     confidence: float, independent: bool,
                     claimed_delta: Callable | None = None, midpoint: float | None = None,
                     start: int = 256, cap: int = 1 << 20, seed: int = 0) -> int | None:
  """The fewest canaries (doubling from `start`) with which the audit's tests, on scores drawn
  from `curve` (a mechanism that does not meet the claim, e.g. half its noise), flag a
  violation in at least 2 of 3 simulations; None when no count up to `cap` does. What a
  planted bug that the default's canaries cannot flag would need."""
  rng = np.random.default_rng(seed)
  n = int(start)
  while n <= cap:
    world = np.arange(n) % 2 == 0
    hits = 0
    for _ in range(3):
      s = curve_scores(curve, world, rng)
      r = _tests(s[world], s[~world], mechanism, claimed_epsilon, delta=delta,
                 confidence=confidence, independent=independent, claimed_delta=claimed_delta,
                 midpoint=midpoint, report_all=False)
      hits += int(r['best'] > claimed_epsilon or r['tests']['profile_violation'] == 1.0)
    if hits >= 2:
      return n
    n *= 2
  return None


__all__ = ['NON_GAUSSIAN', 'NO_ESTIMATE', 'BOUNDS', 'VERDICTS', 'counted_bounds',
           'gaussian_fit_epsilon', 'subsampled_fit_epsilon', 'attainable', 'canaries_needed',
           'audit', 'Curve', 'curve_scores', 'simulated_bound', 'simulated_needed']
