"""A decisive Poisson audit: the subsampled Gaussian fitted to every per-step reading by
maximum likelihood, its confidence region, and the region's smallest epsilon (PLD).

The model. DP-SGD's white-box per-step adversary (Nasr, Hayes, Steinke, Balle, Tramer,
Jagielski, Carlini, Terzis, "Tight Auditing of Differentially Private Machine Learning",
USENIX Security 2023, arXiv:2302.07956) reads, at every step a gradient canary's client takes,
the noisy sum minus the other rows' clipped gradients on the canary's coordinate: a reading L.
For a Poisson-subsampled Gaussian with rate q, noise std s and shift D (the canary's clipped
gradient; C under add/remove), an OUT canary's readings are N(0, s^2) and an IN canary's are
the mixture (1 - q) N(0, s^2) + q N(D, s^2), independently over steps and canaries.

What this module does with the readings (not two moments of them):

- `histogram`: the readings binned on a fine grid (`BINS_PER_STD` bins per standard deviation
  of the OUT readings; the outer bins open). The likelihood used is the exact multinomial
  likelihood of those bins (`log_likelihood`: normal CDF differences, the IN bins' mixture by
  logsumexp), a likelihood of the data in its own right; at 64 bins per std the binning costs
  about w^2 / 12 = 2e-5 of a variance (Sheppard), nothing a fit of 1e6 readings resolves.
- `fit`: the maximum-likelihood (q, s, D) (scipy.optimize, several starts, the moment fit
  `subsampled_fit_epsilon` among them).
- `lower_bound`: the profile-likelihood-ratio region of the privacy-relevant pair (q, mu),
  mu = D / s (the noise std s profiled out), {(q, mu): 2 (l_max - max_s l(q, s, mu s)) <=
  chi2_2(level)} (Wilks: asymptotically a `level` confidence region); every point is one
  mechanism of the family, whose epsilon at the claim's delta is read from dp-accounting's PLD
  (Koskela et al. 2020; Doroshenko et al. 2022) for `steps` self-compositions of
  PoissonSampled(q, Gaussian(1 / mu)), with the optimistic estimate (a lower estimate of
  each point's epsilon, so the minimum stays a lower bound). The epsilon rises with q and with
  mu, so the region's smallest epsilon lies on its lower mu boundary: a grid of q across the
  region, the boundary's mu at each by root finding, the smallest epsilon refined around the
  grid's. That minimum is a LOWER bound on the mechanism's epsilon at `level` that ASSUMES THE
  MECHANISM'S FAMILY (a Poisson-subsampled Gaussian read at every step; `ASSUMES`), not an
  assumption-free one like the one-run or Clopper-Pearson bounds of Steinke, Nasr, Jagielski
  ("Privacy Auditing with One (1) Training Run", NeurIPS 2023, arXiv:2305.08846) beside it.
- The claim's (epsilon, delta) point is refuted iff every point of the region spends more
  than the claimed delta at the claimed epsilon, i.e. iff the lower bound exceeds the claimed
  epsilon (the privacy profile delta(epsilon) of each point is decreasing).

Asymptotic: Wilks' chi-square holds as the readings grow (here 1e5-1e6 readings a row); the
coverage at the sizes used is measured by simulation (`audit_power.mle_power` and the tests).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from dp_accounting.pld import privacy_loss_distribution as pld
import numpy as np
from scipy import optimize
from scipy import special
from scipy import stats as sps

from fl_privacy import accounting

# What the lower bound assumes (the labels of `canary_statistics.ASSUMES`).
ASSUMES = 'poisson_subsampled_gaussian'
BINS_PER_STD = 64
# dp-accounting's PLD discretisation of each point's epsilon (its optimistic estimate at this
# interval lies about 1% below the fine one at the default's claims; 10x faster).
VALUE_DISCRETIZATION = 1e-3
COARSE, COARSE_ENOUGH = 1e-2, 30.0
# The q grid across the region, and the golden-section refinements of its minimum.
Q_GRID = 7
REFINE = 4
MIN_RATE = 1e-4


@dataclasses.dataclass(frozen=True)
class Binned:
  """Readings binned: bin k is (lo[k], hi[k]] (the first lo and last hi infinite); the IN and
  OUT canaries' readings counted per bin (empty bins dropped: they add nothing to the
  likelihood)."""
  lo: np.ndarray
  hi: np.ndarray
  counts_in: np.ndarray
  counts_out: np.ndarray


def histogram(readings_in: np.ndarray, readings_out: np.ndarray,
              bins_per_std: int = BINS_PER_STD) -> Binned:
  """The readings of the IN and OUT canaries (any shape; NaN entries, steps a canary did not
  take, dropped) on a grid of std(OUT) / `bins_per_std` from the smallest to the largest."""
  a = np.asarray(readings_in, np.float64).ravel()
  b = np.asarray(readings_out, np.float64).ravel()
  a, b = a[np.isfinite(a)], b[np.isfinite(b)]
  if a.size < 2 or b.size < 2:
    raise ValueError('the fit needs at least two readings of IN and of OUT canaries')
  sd = float(np.std(b))
  if not sd > 0:
    raise ValueError('the OUT readings do not vary: no noise to fit')
  lo_v, hi_v = min(a.min(), b.min()), max(a.max(), b.max())
  k = max(2, int(math.ceil((hi_v - lo_v) / (sd / int(bins_per_std)))))
  edges = np.linspace(lo_v, hi_v, k + 1)
  ci = np.histogram(a, edges)[0].astype(np.float64)
  co = np.histogram(b, edges)[0].astype(np.float64)
  lo, hi = edges[:-1].copy(), edges[1:].copy()
  lo[0], hi[-1] = -np.inf, np.inf
  keep = (ci + co) > 0
  return Binned(lo[keep], hi[keep], ci[keep], co[keep])


def _log_mass(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """log(Phi(b) - Phi(a)) for a < b, accurate in both tails (the upper tail mirrored)."""
  upper = a > 0
  lo, hi = np.where(upper, -b, a), np.where(upper, -a, b)
  lb, la = special.log_ndtr(hi), special.log_ndtr(lo)
  with np.errstate(divide='ignore'):
    return lb + np.log1p(-np.exp(np.minimum(la - lb, -1e-300)))


def log_likelihood(b: Binned, q: float, s: float, d: float) -> float:
  """The binned readings' log-likelihood at rate q, noise std s, shift d (module docstring):
  OUT bins under N(0, s^2), IN bins under (1 - q) N(0, s^2) + q N(d, s^2)."""
  if not (0 <= q <= 1 and s > 0):
    return -math.inf
  p0 = _log_mass(b.lo / s, b.hi / s)
  out = float(np.dot(b.counts_out, p0))
  if q <= 0:
    return out + float(np.dot(b.counts_in, p0))
  p1 = _log_mass((b.lo - d) / s, (b.hi - d) / s)
  if q >= 1:
    mix = p1
  else:
    mix = np.logaddexp(math.log1p(-q) + p0, math.log(q) + p1)
  with np.errstate(invalid='ignore'):
    return out + float(np.dot(b.counts_in, np.where(b.counts_in > 0, mix, 0.0)))


def _moments_start(b: Binned) -> tuple[float, float, float]:
  """(q, s, d) from the binned moments (`subsampled_fit_epsilon`'s equations), clamped."""
  mid = lambda: np.where(np.isfinite(b.lo) & np.isfinite(b.hi), 0.5 * (b.lo + b.hi),
                         np.where(np.isfinite(b.lo), b.lo, b.hi))
  x = mid()
  var = float(np.dot(b.counts_out, x * x) / b.counts_out.sum())
  m1 = float(np.dot(b.counts_in, x) / b.counts_in.sum())
  m2 = float(np.dot(b.counts_in, x * x) / b.counts_in.sum())
  s = math.sqrt(max(var, 1e-12))
  if m1 > 0 and m2 - var > 0:
    d = (m2 - var) / m1
    return min(max(m1 / d, 1e-3), 1.0), s, d
  return 0.5, s, max(abs(m1), 1e-3 * s) * 2


def fit(b: Binned) -> dict[str, float]:
  """The maximum-likelihood (q, s, d) of the binned readings: L-BFGS-B over (q, log s, d / s)
  from the moment fit and two more starts (q = 1, q = 0.1 at the moments' mean); the best.
  Returns `q`, `s`, `d`, `mu` (d / s) and `loglik`."""
  q0, s0, d0 = _moments_start(b)
  m1 = q0 * d0
  starts = [(q0, s0, d0 / s0), (1.0, s0, max(m1, 1e-3 * s0) / s0),
            (0.1, s0, max(m1, 1e-3 * s0) / (0.1 * s0))]
  nll = lambda v: -log_likelihood(b, v[0], math.exp(v[1]), v[2] * math.exp(v[1]))
  best = None
  for q, s, mu in starts:
    r = optimize.minimize(nll, [q, math.log(s), min(mu, 40.0)], method='L-BFGS-B',
                          bounds=[(MIN_RATE, 1.0), (math.log(s0) - 2, math.log(s0) + 2),
                                  (0.0, 50.0)])
    if best is None or r.fun < best.fun:
      best = r
  q, ls, mu = (float(v) for v in best.x)
  return {'q': q, 's': math.exp(ls), 'd': mu * math.exp(ls), 'mu': mu,
          'loglik': -float(best.fun)}


def profile_noise(b: Binned, q: float, mu: float, s_hat: float) -> float:
  """max over s of the log-likelihood at (q, s, mu s) (s searched within a factor e^0.5 of
  the fit's `s_hat`, far wider than its spread at these sizes)."""
  f = lambda ls: -log_likelihood(b, q, math.exp(ls), mu * math.exp(ls))
  r = optimize.minimize_scalar(f, bounds=(math.log(s_hat) - 0.5, math.log(s_hat) + 0.5),
                               method='bounded', options={'xatol': 1e-7})
  return -float(r.fun)


def _profile_rate(b: Binned, q: float, m: dict) -> tuple[float, float]:
  """(max over s and mu of the log-likelihood at rate q, its maximising mu)."""
  f = lambda v: -log_likelihood(b, q, math.exp(v[0]), v[1] * math.exp(v[0]))
  # The mean shift q d of the IN readings is what the data pin: start there.
  mu0 = min(50.0, m['q'] * m['mu'] / max(q, MIN_RATE))
  r = optimize.minimize(f, [math.log(m['s']), mu0], method='L-BFGS-B',
                        bounds=[(math.log(m['s']) - 0.5, math.log(m['s']) + 0.5),
                                (0.0, 50.0)])
  return -float(r.fun), float(r.x[1])


def critical(level: float, dof: int = 2) -> float:
  """The chi-square quantile of the region at `level` (Wilks; 2 dof: q and mu)."""
  if not 0 < level < 1:
    raise ValueError(f'level must be in (0, 1) (got {level})')
  return float(sps.chi2.ppf(level, dof))


@functools.lru_cache(maxsize=4096)
def _pld(q: float, noise_multiplier: float, steps: int, delta: float,
         discretization: float) -> float:
  one = pld.from_gaussian_mechanism(
      standard_deviation=float(noise_multiplier), sampling_prob=float(min(q, 1.0)),
      pessimistic_estimate=False, value_discretization_interval=float(discretization),
      use_connect_dots=False)
  return float(one.self_compose(int(steps)).get_epsilon_for_delta(float(delta)))


def pld_epsilon(q: float, noise_multiplier: float, steps: int, delta: float,
                discretization: float = VALUE_DISCRETIZATION) -> float:
  """epsilon at `delta` of `steps` self-compositions of PoissonSampled(q, Gaussian(z)) under
  add/remove, from dp-accounting's PLD with the optimistic estimate (a lower estimate: the
  region's minimum stays a lower bound); 0 without signal (z infinite or q 0). An epsilon
  above `COARSE_ENOUGH` at the coarse interval (`COARSE`, about 10x cheaper there) is kept
  at that interval: still a lower estimate, looser by a few percent where no claim sits."""
  if not (noise_multiplier < math.inf and q > 0):
    return 0.0
  coarse = _pld(float(q), float(noise_multiplier), int(steps), float(delta), COARSE)
  if coarse > COARSE_ENOUGH or discretization >= COARSE:
    return coarse
  return _pld(float(q), float(noise_multiplier), int(steps), float(delta),
              float(discretization))


def _epsilon(q: float, mu: float, steps: int, delta: float,
             discretization: float = VALUE_DISCRETIZATION) -> float:
  if not mu > 1e-6:
    return 0.0
  return pld_epsilon(round(float(q), 10), round(1.0 / float(mu), 10), int(steps), float(delta),
                     discretization)


def _rate_range(b: Binned, m: dict, crit: float) -> tuple[float, float]:
  """The rates q of the region: 2 (l_max - max_{s, mu} l(q)) <= crit, by root finding on
  each side of the fit's q."""
  g = lambda q: 2.0 * (m['loglik'] - _profile_rate(b, q, m)[0]) - crit
  q_hat = min(max(m['q'], MIN_RATE), 1.0)
  lo = MIN_RATE if g(MIN_RATE) <= 0 or q_hat <= MIN_RATE else optimize.brentq(
      g, MIN_RATE, q_hat, xtol=1e-6)
  hi = 1.0 if g(1.0) <= 0 or q_hat >= 1.0 else optimize.brentq(g, q_hat, 1.0, xtol=1e-6)
  return lo, hi


def _mu_low(b: Binned, q: float, m: dict, crit: float) -> float:
  """The smallest mu of the region at rate q (NaN where q is outside it)."""
  top, mu_top = _profile_rate(b, q, m)
  if 2.0 * (m['loglik'] - top) > crit + 1e-9:
    return math.nan
  g = lambda mu: 2.0 * (m['loglik'] - profile_noise(b, q, mu, m['s'])) - crit
  if g(0.0) <= 0:
    return 0.0
  if mu_top <= 0 or g(mu_top) > 0:
    return mu_top
  return optimize.brentq(g, 0.0, mu_top, xtol=1e-7)


def lower_bound(b: Binned, m: dict, *, steps: int, delta: float, level: float,
                discretization: float = VALUE_DISCRETIZATION) -> dict[str, float]:
  """The region's smallest epsilon at `delta` (module docstring): `epsilon_mle_pld`, with the
  point that attains it (`mle_pld_rate`, `mle_pld_noise_multiplier`), the region's rates
  (`mle_region_rate_low` / `_high`) and `mle_pld_level`. `discretization`: PLD's value
  interval (a coarser one is cheaper and still a lower estimate, looser)."""
  crit = critical(level)
  qlo, qhi = _rate_range(b, m, crit)
  grid = np.unique(np.linspace(qlo, qhi, Q_GRID))
  seen: dict[float, tuple[float, float]] = {}

  def at(q: float) -> float:
    if q not in seen:
      mu = _mu_low(b, q, m, crit)
      seen[q] = (mu, math.inf if math.isnan(mu) else _epsilon(q, mu, steps, delta,
                                                               discretization))
    return seen[q][1]

  vals = [at(float(q)) for q in grid]
  i = int(np.argmin(vals))
  a, c = float(grid[max(i - 1, 0)]), float(grid[min(i + 1, len(grid) - 1)])
  if c > a:   # golden-section refinement of the minimum between the grid's neighbours
    r = (math.sqrt(5) - 1) / 2
    x1, x2 = c - r * (c - a), a + r * (c - a)
    for _ in range(REFINE):
      if at(x1) <= at(x2):
        c, x2 = x2, x1
        x1 = c - r * (c - a)
      else:
        a, x1 = x1, x2
        x2 = a + r * (c - a)
  q_best = min(seen, key=lambda q: seen[q][1])
  mu_best, eps = seen[q_best]
  return {'epsilon_mle_pld': float(eps), 'mle_pld_rate': float(q_best),
          'mle_pld_noise_multiplier': 1.0 / mu_best if mu_best > 0 else math.inf,
          'mle_region_rate_low': float(qlo), 'mle_region_rate_high': float(qhi),
          'mle_pld_level': float(level), 'mle_pld_points': len(seen)}


def audit(readings_in: np.ndarray, readings_out: np.ndarray, *, steps: int,
          claimed_epsilon: float, delta: float, level: float,
          bins_per_std: int = BINS_PER_STD,
          discretization: float = VALUE_DISCRETIZATION) -> dict[str, Any]:
  """The MLE / PLD audit of one row's readings against the claim's (epsilon, delta) point.

  Args:
    readings_in, readings_out: the per-step readings of the IN and OUT canaries (any shape,
      NaN where a canary's client took no step), in the units of the clip.
    steps: the compositions each canary saw (the declaration's).
    claimed_epsilon, delta: the claim's point.
    level: the region's confidence (the row's per-test level where it joins a family).
    bins_per_std, discretization: the histogram's bins per OUT std; PLD's value interval.

  Returns:
    `mle_rate`, `mle_noise_std`, `mle_shift`, `mle_noise_multiplier` (s / d) and
    `epsilon_mle_point` (the PLD epsilon at the MLE: an ESTIMATE), `mle_readings`,
    `lower_bound`'s fields (`epsilon_mle_pld`: the LOWER bound, assuming the family),
    `mle_pld_refutes` (1.0 iff it exceeds the claimed epsilon) and `mle_pld_assumes`.
  """
  b = histogram(readings_in, readings_out, bins_per_std)
  m = fit(b)
  out: dict[str, Any] = {
      'mle_rate': m['q'], 'mle_noise_std': m['s'], 'mle_shift': m['d'],
      'mle_noise_multiplier': 1.0 / m['mu'] if m['mu'] > 0 else math.inf,
      'epsilon_mle_point': _epsilon(m['q'], m['mu'], steps, delta, discretization),
      'mle_readings': int(b.counts_in.sum() + b.counts_out.sum())}
  out.update(lower_bound(b, m, steps=steps, delta=delta, level=level,
                         discretization=discretization))
  out['mle_pld_refutes'] = float(out['epsilon_mle_pld'] > float(claimed_epsilon))
  out['mle_pld_assumes'] = ASSUMES
  return out


def subsampled_fit_epsilon(in_moments: np.ndarray, out_moments: np.ndarray, *, steps: int,
                           delta: float, accountant: str = 'pld') -> dict[str, float]:
  """The Poisson-subsampled Gaussian fitted to what every step showed of the canaries.

  A white-box reader of every DP-SGD step sees, per step and canary, L = the canary's clipped
  gradient if it was drawn (shift D = C under add/remove) plus N(0, s^2): L ~ (1 - q) N(0, s^2)
  + q N(D, s^2) for an IN canary, N(0, s^2) for an OUT one. The moments pooled over canaries
  and steps give s^2 = E[L^2] of the OUT canaries (their mean is 0), q D = E[L] and
  q D^2 = E[L^2] - s^2 of the IN ones, so D = (E[L^2] - s^2) / E[L] and q = E[L] / D; the
  epsilon of `steps` compositions of that mechanism (noise multiplier s / D, rate q) is read
  from dp-accounting (`accountant`, PLD by default: the tightest it has). An ESTIMATE of what
  runs (it assumes the family), not a bound; a wrong noise, clip or sampling shows as a wrong
  s, D or q.

  Args:
    in_moments, out_moments: [n, 3] per canary (sum of L, sum of L^2, number of steps).
    steps: the compositions the mechanism's declaration counts.
    delta: of the epsilon.
    accountant: 'pld' or 'rdp'.

  Returns:
    `fit_rate`, `fit_shift`, `fit_noise_std`, `fit_noise_multiplier` and `fit_epsilon`
    (NaN where the moments do not determine them: no positive shift).
  """
  a = np.asarray(in_moments, np.float64).sum(0)
  b = np.asarray(out_moments, np.float64).sum(0)
  out = dict(fit_rate=math.nan, fit_shift=math.nan, fit_noise_std=math.nan,
             fit_noise_multiplier=math.nan, fit_epsilon=math.nan)
  if not (a[2] > 0 and b[2] > 0):
    return out
  var = b[1] / b[2]
  m1, m2 = a[0] / a[2], a[1] / a[2]
  out['fit_noise_std'] = math.sqrt(var)
  if not (m1 > 0 and m2 - var > 0):
    return out
  shift = (m2 - var) / m1
  rate = min(m1 / shift, 1.0)
  z = math.sqrt(var) / shift
  decl = accounting.Declaration('dp_sgd', 'record', 'add_remove', 'server', 'poisson', 1.0,
                                int(steps), rate)
  out.update(fit_rate=rate, fit_shift=shift, fit_noise_multiplier=z,
             fit_epsilon=accounting.epsilon(decl, z, delta=delta, accountant=accountant))
  return out


__all__ = ['ASSUMES', 'BINS_PER_STD', 'Binned', 'histogram', 'log_likelihood', 'fit',
           'profile_noise', 'critical', 'pld_epsilon', 'lower_bound', 'audit',
           'subsampled_fit_epsilon']
