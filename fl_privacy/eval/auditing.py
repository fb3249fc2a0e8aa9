"""Privacy auditing from attack scores: epsilon lower bounds on jax-privacy.

The statistics come from `jax_privacy.auditing.CanaryScoreAuditor`; this module
validates the scores, chooses the settings, flattens the results into a metrics
dict and documents what each number certifies. Every epsilon here is a LOWER
bound that holds with probability at least `confidence` over the trials.

Scores: one per trial (canary); `in_scores` are the trials where the canary was
present (IN, the positive world), `out_scores` those where it was absent; a
higher score means "more likely IN" (negate a loss first).

Choosing the threshold from the data needs a correction fixed before the data
are seen. jax-privacy 2.0.0's `Bonferroni()` divides the significance by the
number of thresholds on the ROC's Pareto frontier, a number the data choose
(152 of 200,000 thresholds in one of our runs), so its family is not a valid
Bonferroni family. Here `'bonferroni'` divides by n + 1, n = n_in + n_out (every
threshold at which the counts can change: the distinct scores and +inf, at most
n + 1), through the library's own code path (see `_bonferroni_significance`);
the frontier only saves work, since the largest bound over any subset of
simultaneously valid bounds is valid. The default is `'split'` (choose the
threshold on one part, bound on the other), which needs no correction.

`import jax_privacy` pulls in its whole package (about 1.6 s on top of
`fl_privacy.eval`), so it is imported inside the functions that need it.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from scipy import special
from scipy import stats as sps

from fl_privacy.eval import stats

THRESHOLD_STRATEGIES = ('split', 'bonferroni', 'explicit')


class _StandardNormal:
  """The standard normal's functions that jax-privacy's auditor calls
  (`cdf`, `ppf`, `isf`, `sf`, `logcdf`), as the scipy.special functions that
  `scipy.stats.norm` itself evaluates them with (`ndtr`, `ndtri`, `log_ndtr`):
  the same numbers without `rv_continuous`'s argument checking, which costs
  ~0.4 ms a scalar call. The auditor's f-DP one-run bound calls it ~180 times a
  bound (a root search over a scalar lambda), and it was most of the time of an
  `audit_scores` call (measured 2026-12-08: 73k `norm.ppf` calls took 30 of a
  test's 78 s). Anything else (another method, loc / scale arguments) goes to
  `scipy.stats.norm`. tests/eval/test_auditing_library.py checks that every
  value, and every bound, is the same as with `scipy.stats.norm`."""

  def __getattr__(self, name):
    return getattr(sps.norm, name)

  @staticmethod
  def cdf(x):
    return special.ndtr(x)

  @staticmethod
  def sf(x):
    return special.ndtr(-np.asarray(x, np.float64))

  @staticmethod
  def ppf(q):
    return special.ndtri(q)

  @staticmethod
  def isf(q):
    return -special.ndtri(q)

  @staticmethod
  def logcdf(x):
    return special.log_ndtr(x)


STANDARD_NORMAL = _StandardNormal()


def _library():
  # Lazy: the package import costs seconds that callers of the rest of `eval`
  # should not pay.
  from jax_privacy import auditing  # pylint: disable=g-import-not-at-top
  if getattr(auditing, '_norm', None) is sps.norm:
    auditing._norm = STANDARD_NORMAL  # pylint: disable=protected-access
  return auditing


def _check_scores(scores, name: str) -> np.ndarray:
  scores = np.asarray(scores, dtype=np.float64)
  if scores.ndim != 1:
    raise ValueError(f'{name} must be 1-dimensional (got shape {scores.shape})')
  if scores.size < 1:
    raise ValueError(f'{name} needs at least 1 score (got 0)')
  if not np.all(np.isfinite(scores)):
    raise ValueError(f'{name} must be finite (got NaN or inf)')
  return scores


def _check_delta(delta: float) -> float:
  delta = float(delta)
  if not 0.0 < delta < 1.0:
    raise ValueError(f'delta must be in (0, 1) (got {delta})')
  return delta


def _check_audit_confidence(confidence: float) -> float:
  confidence = float(confidence)
  # The library's Clopper-Pearson and GDP bounds take a significance
  # 1 - confidence in (0, 0.5).
  if not 0.5 < confidence < 1.0:
    raise ValueError(f'confidence must be in (0.5, 1) (got {confidence})')
  return confidence


def _strategy(name: str, split_fraction: float, seed: int | None,
              threshold: float | None = None):
  """The library's threshold strategy for `name` (see `audit_scores`)."""
  if name not in THRESHOLD_STRATEGIES:
    raise ValueError(
        f'threshold_strategy must be one of {THRESHOLD_STRATEGIES} (got {name!r})')
  auditing = _library()
  if name == 'bonferroni':
    return auditing.Bonferroni()
  if name == 'explicit':
    if threshold is None or not math.isfinite(float(threshold)):
      raise ValueError("threshold_strategy 'explicit' needs a finite threshold "
                       f'(got {threshold})')
    return auditing.Explicit(float(threshold))
  if not 0.0 < split_fraction < 1.0:
    raise ValueError(f'split_fraction must be in (0, 1) (got {split_fraction})')
  return auditing.Split(threshold_estimation_frac=float(split_fraction),
                        seed=seed)


def threshold_family(n_in: int, n_out: int) -> int:
  """The Bonferroni family of a threshold search: n + 1 thresholds, n = n_in + n_out.

  The decision "score >= t" changes its counts only at the scores, so the
  distinct scores and +inf (at most n + 1 thresholds) are every test there is.
  The size depends on the design (how many trials), not on the scores, so it
  is fixed before they are seen, as a Bonferroni family must be.
  """
  return int(n_in) + int(n_out) + 1


def _frontier_size(auditor) -> int:
  # The number of thresholds jax-privacy 2.0.0's `Bonferroni()` divides by: the
  # ROC's Pareto frontier (`CanaryScoreAuditor._fn_counts`, private).
  return len(auditor._fn_counts)  # pylint: disable=protected-access


def _bonferroni_significance(auditor, significance: float) -> float:
  """The significance to hand the library's `Bonferroni()` so that it tests each
  threshold at significance / `threshold_family` (n + 1), not / the frontier.

  The library's Bonferroni searches the frontier's thresholds at significance /
  (frontier size). Passing significance x (frontier size) / (n + 1) makes
  that significance / (n + 1): the library's own search, at the level of the
  fixed family. The frontier has at most n + 1 points, so the value passed is
  at most `significance` and inside the library's checks.
  """
  n_in = auditor._in_canary_scores.size  # pylint: disable=protected-access
  n_out = auditor._out_canary_scores.size  # pylint: disable=protected-access
  return significance * _frontier_size(auditor) / threshold_family(n_in, n_out)


def split_possible(n_in: int, n_out: int, split_fraction: float = 0.5) -> bool:
  """Whether `'split'` leaves scores of both sides in both parts (the library
  keeps int(n x fraction) of each side to choose the threshold)."""
  return all(0 < int(int(n) * float(split_fraction)) < int(n)
             for n in (n_in, n_out))


def one_run_trials(n_in: int, n_out: int, threshold_strategy: str,
                   split_fraction: float = 0.5) -> int:
  """m, the trials the one-run bounds count: all of them under `'bonferroni'`
  and `'explicit'`, the bounding part under `'split'` (the library keeps
  int(n x fraction) of each side to choose the threshold and bounds on the
  rest)."""
  if threshold_strategy != 'split':
    return int(n_in) + int(n_out)
  return sum(int(n) - int(int(n) * float(split_fraction)) for n in (n_in, n_out))


def gdp_mu_lower_bound(auditor, significance: float, delta: float,
                       threshold: float | None = None) -> float:
  """Lower bound on the Gaussian-DP mu from the ROC (Nasr et al., USENIX Sec. 2023).

  The GDP audit of "Tight Auditing of Differentially Private Machine Learning"
  (arXiv:2302.07956): at every threshold t, one-sided Clopper-Pearson upper
  bounds on FPR(t) and FNR(t) give, by Eq. 6 of Dong et al. (arXiv:1905.02383),
  mu >= Phi^-1(1 - FPR) - Phi^-1(FNR). The Bonferroni family is the
  2 x `threshold_family` (n + 1 thresholds) rates, fixed before the data (the
  library divides by 2 x its frontier's size, which the data choose); the
  search runs over the frontier's thresholds, a subset of that family. The
  bound is the largest such value (0 when none is positive); thresholds where
  either upper bound reaches 1 - delta are skipped, as in the library.

  Why not `CanaryScoreAuditor.epsilon_from_gdp`: in jax-privacy 2.0.0 it takes
  the largest |mu| over thresholds, so a threshold where FPR + FNR > 1 (upper
  bounds of a null distinguisher) counts as evidence, and identical IN/OUT
  distributions get epsilons of 2-6 at delta = 1e-5. Upstream fixed this
  (google-deepmind/jax_privacy commit aab3e1c: keep the forward rule, clamp at
  0); this function computes the fixed bound from the auditor's own frontier
  counts, so once a release has the fix the two agree when the library is
  handed `_bonferroni_significance` (its family is the frontier).

  With `threshold` (fixed before the data, e.g. 1 for 0/1 guesses) only that
  threshold is tested, its two rates at significance / 2 each.

  Args:
    auditor: a `jax_privacy.auditing.CanaryScoreAuditor`.
    significance: 1 - confidence, in (0, 0.5).
    delta: thresholds with an upper bound >= 1 - delta are ignored.
    threshold: test only "score >= threshold" (None: every threshold).

  Returns:
    mu_lb >= 0: with probability >= 1 - significance the mechanism is not
    mu-GDP for any mu < mu_lb.
  """
  # The library's frontier (private attributes): FN and TN counts per
  # threshold, the last entry being n_pos and n_neg.
  fn_counts = np.asarray(auditor._fn_counts)  # pylint: disable=protected-access
  tn_counts = np.asarray(auditor._tn_counts)  # pylint: disable=protected-access
  n_pos, n_neg = fn_counts[-1], tn_counts[-1]
  each = significance / (2 * threshold_family(n_pos, n_neg))
  if threshold is not None:
    in_scores = auditor._in_canary_scores  # pylint: disable=protected-access
    out_scores = auditor._out_canary_scores  # pylint: disable=protected-access
    fn_counts = np.array([np.sum(in_scores < threshold)])
    tn_counts = np.array([np.sum(out_scores < threshold)])
    each = significance / 2
  # The upper end of a two-sided interval at 1 - 2 * each is the one-sided
  # upper bound at 1 - each.
  fnr_ub = stats.clopper_pearson_arrays(fn_counts, n_pos, 1 - 2 * each)[1]
  fpr_ub = stats.clopper_pearson_arrays(n_neg - tn_counts, n_neg,
                                        1 - 2 * each)[1]
  keep = np.maximum(fnr_ub, fpr_ub) < 1 - delta
  if not np.any(keep):
    return 0.0
  mu = np.max(sps.norm.isf(fpr_ub[keep]) - sps.norm.ppf(fnr_ub[keep]))
  return max(0.0, float(mu))


def gdp_epsilon(mu: float, delta: float) -> float:
  """Epsilon of mu-GDP at `delta` (Corollary 2.13 of Dong et al., arXiv:1905.02383).

  mu-GDP is the Gaussian mechanism with sensitivity 1 and noise 1 / mu, whose
  (epsilon, delta) curve is the analytic one of Balle & Wang (2018);
  dp-accounting computes it.
  """
  if mu <= 0.0:
    return 0.0
  import dp_accounting  # pylint: disable=g-import-not-at-top
  return float(dp_accounting.get_epsilon_gaussian(1.0 / mu, delta))


def audit_scores(in_scores, out_scores, *, delta: float,
                 confidence: float = 0.95,
                 threshold_strategy: str = 'split',
                 split_fraction: float = 0.5, seed: int | None = 0,
                 threshold: float | None = None,
                 fdp: bool = True, bootstrap: int = 0,
                 raw_min_count: int = 50) -> dict[str, float]:
  """Epsilon lower bounds of a membership distinguisher, on jax-privacy.

  Every epsilon returned is a LOWER bound on the epsilon (at `delta`) of the
  mechanism that produced the scores: it exceeds the true value with
  probability at most `1 - confidence` (each bound separately; they are not
  simultaneous: a verdict on the largest of k of them needs each at
  1 - (1 - confidence) / k, as `attacks.audit.dp_canary.claim_metrics` does).
  The distinguisher is "score >= t means IN" (one-sided).

  - `epsilon_cp`: Clopper-Pearson bound on (epsilon, delta)-DP from the
    rates at a threshold (Jagielski et al., arXiv:2006.07709; Nasr et al.,
    arXiv:2101.04535; the library's `epsilon_clopper_pearson`):
    epsilon >= log((TPR_lb - delta) / FPR_ub).
    The threshold is chosen validly: `'split'` (the default) picks it on a
    random `split_fraction` of each side and bounds on the rest (`seed`);
    `'bonferroni'` tests every threshold at significance / (n + 1), n =
    n_in + n_out (`threshold_family`: fixed by the design, unlike the size of
    the ROC frontier jax-privacy 2.0.0 divides by; see the module docstring);
    `'explicit'` tests the one `threshold` given, fixed before the data (0/1
    guesses: 1), at the full significance.
  - `gdp_mu`: lower bound on mu if the mechanism is mu-GDP (Nasr et al.,
    "Tight Auditing of Differentially Private Machine Learning", USENIX
    Security 2023, arXiv:2302.07956); see `gdp_mu_lower_bound`. Bonferroni
    over the 2 (n + 1) rates of every threshold under `'split'` and
    `'bonferroni'`; the one threshold under `'explicit'`. `epsilon_gdp` is the
    epsilon of `gdp_mu`-GDP at `delta`: a lower bound on epsilon only for
    mechanisms whose trade-off curve is Gaussian (e.g. Gaussian noise); for others (randomized
    response) it may exceed the true epsilon, while `gdp_mu` stays valid as
    "not mu-GDP below gdp_mu".
  - `epsilon_one_run`: the one-run audit of Steinke, Nasr & Jagielski
    ("Privacy Auditing with One (1) Training Run", NeurIPS 2023,
    arXiv:2305.08846, Theorem 3.1), one-sided guesses (k_- = 0):
    the m trials it counts (`one_run_trials`: all n under `'bonferroni'` and
    `'explicit'`, the bounding part under `'split'`) are the canaries; the guess set is the
    canaries scoring >= t, guessed IN; the others abstain. `epsilon_one_run_fdp`
    is the f-DP refinement of Mahloujifar et al. (arXiv:2410.22235), testing
    Gaussian trade-off curves: like `epsilon_gdp`, a lower bound for
    mechanisms at most as private as the Gaussian mechanism with the same
    (epsilon, delta). With many independent trials of one canary each, the
    theorem holds because each canary's output depends only on its own trial;
    it assumes every trial's IN/OUT bit is an independent fair coin. A design
    with fixed or unequal numbers of IN and OUT trials breaks that assumption
    (with n_in > n_out, guessing IN everywhere already "certifies" epsilon > 0).
    Both depend on m and delta, not only on the scores: the theorem's p-value
    is beta + alpha x 2 m delta (alpha <= 1, small at a confident guess), and
    it must fall below the level of each test (1 - confidence under `'split'`
    and `'explicit'`, (1 - confidence) / (n + 1) under `'bonferroni'`).
    `one_run_delta_term` =
    2 m delta reports that factor. Measured on one set of Gaussian scores
    (shift 0.864, 200,000 trials; CP 2.06 at delta 1e-5): `'split'` (m =
    100,000, 2 m delta = 2) gives 2.03 at delta 1e-5 and 2.15 at 1e-7;
    jax-privacy's frontier Bonferroni gave 0.41 and 2.12; the fixed n + 1
    family gives 0 down to delta 1e-7 (0.06 at 1e-8). A low one-run bound at
    large m delta is this price for allowing m canaries in one run, not a
    property of the mechanism.

  Args:
    in_scores: 1-D scores of the trials with the canary (IN).
    out_scores: 1-D scores of the trials without it (OUT).
    delta: the delta of the (epsilon, delta) bounds, in (0, 1).
    confidence: in (0.5, 1): the library's significance is 1 - confidence.
    threshold_strategy: `'split'` (default), `'bonferroni'` (for `epsilon_cp`
      and the one-run bounds) or `'explicit'` (for every bound).
    split_fraction: the share of each side used to choose the threshold
      (`'split'` only).
    seed: seed of the split and of the bootstrap (None: non-deterministic).
    threshold: the threshold of `'explicit'` (required there, ignored else).
    fdp: compute `epsilon_one_run_fdp` (NaN when False). The library's f-DP
      search loops in Python over the correct guesses at every step of a root
      search: about 0.5 s for 1,000 trials, most of the call.
    bootstrap: number of bootstrap resamples; 0 (default) for none. The library
      bootstraps only its point estimates, not the bounds: with `bootstrap` > 0
      the result adds `epsilon_raw` (the raw-count estimate
      log((TPR - delta) / FPR) over thresholds with at least `raw_min_count`
      false positives; an estimate, not a bound) with its bias-corrected
      bootstrap interval `epsilon_raw_ci_low` / `epsilon_raw_ci_high` at
      `confidence`.
    raw_min_count: see `bootstrap`.

  Returns:
    Flat floats: `epsilon_cp`, `gdp_mu`, `epsilon_gdp`, `epsilon_one_run`,
    `epsilon_one_run_fdp`, `one_run_delta_term` (2 m delta), and the settings
    `audit_delta`, `audit_confidence`, `audit_threshold_strategy` (the name, a
    str), `audit_threshold_family` (n + 1, the Bonferroni family of `gdp_mu`
    except under `'explicit'`, and of `epsilon_cp` and the one-run bounds under
    `'bonferroni'`), `n_in`,
    `n_out`; with `bootstrap` > 0 also `epsilon_raw`, `epsilon_raw_ci_low`,
    `epsilon_raw_ci_high`, `audit_bootstrap`.

  Raises:
    ValueError: bad delta, confidence, strategy, or scores (not 1-D, empty,
      not finite).
  """
  in_scores = _check_scores(in_scores, 'in_scores')
  out_scores = _check_scores(out_scores, 'out_scores')
  delta = _check_delta(delta)
  confidence = _check_audit_confidence(confidence)
  strategy = _strategy(threshold_strategy, split_fraction, seed, threshold)
  bootstrap = int(bootstrap)
  if bootstrap < 0:
    raise ValueError(f'bootstrap must be >= 0 (got {bootstrap})')
  if threshold_strategy == 'split' and not split_possible(
      in_scores.size, out_scores.size, split_fraction):
    raise ValueError(
        f"threshold_strategy 'split' (fraction {split_fraction}) needs scores of "
        f'each side in both parts (got {in_scores.size} IN, {out_scores.size} '
        "OUT); use 'bonferroni' for so few trials")
  significance = 1.0 - confidence

  auditor = _library().CanaryScoreAuditor(in_scores, out_scores)
  mu = gdp_mu_lower_bound(
      auditor, significance, delta,
      threshold if threshold_strategy == 'explicit' else None)
  # Under 'bonferroni' the library divides by its frontier's size; hand it the
  # significance that makes its per-threshold level significance / (n + 1).
  searched = (_bonferroni_significance(auditor, significance)
              if threshold_strategy == 'bonferroni' else significance)
  one_run_fdp = math.nan
  if fdp:
    one_run_fdp = float(auditor.epsilon_one_run_fdp(
        searched, delta, threshold_strategy=strategy))
  m = one_run_trials(in_scores.size, out_scores.size, threshold_strategy,
                     split_fraction)
  result = {
      'epsilon_cp': float(auditor.epsilon_clopper_pearson(
          searched, delta, threshold_strategy=strategy)),
      'gdp_mu': mu,
      'epsilon_gdp': gdp_epsilon(mu, delta),
      'epsilon_one_run': float(auditor.epsilon_one_run(
          searched, delta, threshold_strategy=strategy)),
      'epsilon_one_run_fdp': one_run_fdp,
      'one_run_delta_term': 2.0 * m * delta,
      'audit_delta': delta,
      'audit_confidence': confidence,
      'audit_threshold_strategy': threshold_strategy,
      'audit_threshold_family': threshold_family(in_scores.size,
                                                 out_scores.size),
      'n_in': int(in_scores.size),
      'n_out': int(out_scores.size),
  }
  if bootstrap:
    params = _library().BootstrapParams.confidence_interval(
        num_samples=bootstrap, confidence=confidence, seed=seed)
    low, high = auditor.epsilon_raw_counts(raw_min_count, delta,
                                           bootstrap_params=params)
    result.update(
        epsilon_raw=float(auditor.epsilon_raw_counts(raw_min_count, delta)),
        epsilon_raw_ci_low=float(low), epsilon_raw_ci_high=float(high),
        audit_bootstrap=bootstrap)
  return result


def privacy_profile(in_scores, out_scores, epsilons, *,
                    confidence: float = 0.95) -> np.ndarray:
  """Lower confidence bounds on the privacy profile delta(epsilon).

  (epsilon, delta)-DP implies TPR <= e^epsilon FPR + delta for every test, and
  the same with the roles of IN and OUT exchanged (TNR <= e^epsilon FNR +
  delta) (Theorem 2.1 of Kairouz, Oh & Viswanath, "The Composition Theorem
  for Differential Privacy", ICML 2015), so delta(epsilon) >=
  max_t max(TPR_lb(t) - e^epsilon FPR_ub(t), TNR_lb(t) - e^epsilon FNR_ub(t)),
  clipped at 0.

  jax-privacy offers epsilon(delta) but not delta(epsilon), so the rates come
  from `stats`: one-sided Clopper-Pearson upper bounds on FPR(t) and FNR(t)
  at every threshold t in (the distinct scores, +inf), with a Bonferroni
  correction over the 2 (n + 1) rates of `threshold_family` (fixed by n =
  n_in + n_out, not by how many distinct scores the data have). All bounds then hold
  together with probability >= `confidence`, so the whole returned curve is
  below the true profile simultaneously for every epsilon.

  Args:
    in_scores: 1-D scores of the IN trials (higher = more likely IN).
    out_scores: 1-D scores of the OUT trials.
    epsilons: epsilons >= 0 (scalar or array).
    confidence: in (0, 1), for the whole curve.

  Returns:
    Lower bounds on delta(epsilon), float64 with the shape of `epsilons`.
  """
  in_scores = _check_scores(in_scores, 'in_scores')
  out_scores = _check_scores(out_scores, 'out_scores')
  confidence = float(confidence)
  if not 0.0 < confidence < 1.0:
    raise ValueError(f'confidence must be in (0, 1) (got {confidence})')
  epsilons = np.asarray(epsilons, dtype=np.float64)
  if not np.all(np.isfinite(epsilons)) or np.any(epsilons < 0):
    raise ValueError('epsilons must be finite and >= 0')

  thresholds = np.append(np.union1d(in_scores, out_scores), np.inf)
  # Decision "IN" iff score >= t: FN = IN scores below t, FP = OUT at or above.
  fn = np.searchsorted(np.sort(in_scores), thresholds, side='left')
  fp = out_scores.size - np.searchsorted(np.sort(out_scores), thresholds,
                                         side='left')
  each = (1.0 - confidence) / (2 * threshold_family(in_scores.size,
                                                    out_scores.size))
  fnr_ub = stats.clopper_pearson_arrays(fn, in_scores.size, 1 - 2 * each)[1]
  fpr_ub = stats.clopper_pearson_arrays(fp, out_scores.size, 1 - 2 * each)[1]
  scale = np.exp(epsilons)[..., None]
  forward = (1.0 - fnr_ub) - scale * fpr_ub
  reverse = (1.0 - fpr_ub) - scale * fnr_ub
  best = np.maximum(forward.max(axis=-1), reverse.max(axis=-1))
  return np.maximum(best, 0.0)


def profile_violation(in_scores: np.ndarray, out_scores: np.ndarray, claimed_delta: Callable[
    [np.ndarray], np.ndarray], epsilons: np.ndarray, *, confidence: float) -> dict[str, float]:
  """Does the empirical privacy profile exceed the claimed one anywhere? (any mechanism)

  (epsilon, delta(epsilon))-DP for every epsilon, the claim's whole privacy profile (the
  accountant's: `claimed_delta(epsilons) -> deltas`, e.g. `fl_privacy.accounting.delta_curve`), bounds every test's rates (Kairouz, Oh, Viswanath,
  ICML 2015, Theorem 2.1); `auditing.privacy_profile` gives lower bounds on the true
  delta(epsilon) simultaneous over the grid at `confidence` (`privacy_profile`). A lower bound above the claimed
  delta at some epsilon refutes the claim without assuming a Gaussian curve, which is what the
  subsampled mechanisms (Poisson or without replacement) need. Valid for independent trials.

  Returns:
    `profile_violation` (1.0 / 0.0), `profile_excess` (the largest lower bound minus the
    claimed delta, over the grid) and `profile_epsilon` (where it is largest).
  """
  lower = privacy_profile(in_scores, out_scores, epsilons, confidence=confidence)
  claimed = np.asarray(claimed_delta(np.asarray(epsilons, np.float64)), np.float64)
  excess = lower - claimed
  i = int(np.argmax(excess))
  return {'profile_violation': float(excess[i] > 0), 'profile_excess': float(excess[i]),
          'profile_epsilon': float(epsilons[i])}


def attack_bounds(scores, labels, delta: float, *, confidence: float = 0.95
                  ) -> dict[str, float]:
  """A membership attack's strength in epsilon units: an ESTIMATE, not a certified bound.

  `audit_scores` on members (label 1, IN) vs non-members (OUT), without the slow f-DP
  search: `attack_epsilon_cp` (the (epsilon, delta) Clopper-Pearson formula with a valid
  threshold choice) and `attack_gdp_mu`. Clopper-Pearson and the GDP bound treat the entries
  as independent trials; the members and non-members of ONE training are not (they share
  the one model every score is read from), so these numbers certify nothing about the
  mechanism's epsilon. Only the one-run bound (Steinke, Nasr & Jagielski, "Privacy Auditing
  with One (1) Training Run", NeurIPS 2023, arXiv:2305.08846) applies to the entries of one
  training, and only with membership an independent fair coin per entry. Read them as the
  attack's strength on the scale of a claimed epsilon, an estimate beside the DP claim. NaN
  when a score is not finite or a side has fewer than 2 entries (`audit_scores`' default
  `'split'` needs one of each side in both halves).
  """
  scores = np.asarray(scores, np.float64)
  labels = np.asarray(labels).astype(bool)
  if not (np.all(np.isfinite(scores)) and split_possible(labels.sum(), (~labels).sum())):
    return {'attack_epsilon_cp': math.nan, 'attack_gdp_mu': math.nan}
  b = audit_scores(scores[labels], scores[~labels], delta=delta, confidence=confidence,
                   fdp=False)
  return {'attack_epsilon_cp': float(b['epsilon_cp']), 'attack_gdp_mu': float(b['gdp_mu'])}
