"""How strong a training audit's "no violation" is: the smallest planted bug its statistic
detects, and the simulated optimal attack's spread.

A row's verdict says "no violation" whenever its tests find nothing; what that excludes depends
on the row's power. `detectable_factor` answers it for rows whose canary scores are the claimed
mechanism's own statistic (`canary_statistics.Curve`: DP-SGD read at every step, a server
reading update_dp's uploads, an aggregate's white-box reader): it draws the scores of the
same canaries (the row's n_in IN and n_out OUT, the same threat and statistic) from the
mechanism with its noise scaled by a factor f < 1 while the score still reads the claim's
noise (`planted`), runs the row's own counted tests and profile test against the row's claim
(`canary_statistics._tests`, the same mechanism label, independence, midpoint, delta and
family-wise level), and counts how often the verdict would be "violation". The detected
factor is the largest f on a grid whose detection rate is at least `level` (0.95) over
`draws` simulations (>= 20); power rises as f moves away from 1, so the grid is bisected.
Every simulation draws fresh scores only, never a training: what it measures is the power of
the statistic and the tests, given that the training produces the scores the claimed
mechanism (at noise f) produces.

`optimum` is the same simulation at f = 1: the bound an optimal attack with these canaries
reaches on the claimed mechanism (median over `draws`, its distribution-free 95% interval,
the assumption-free bound's median beside it) and the false-alarm rate of the verdict there.

The statistics: Nasr, Hayes, Steinke, Balle, Tramer, Jagielski, Carlini, Terzis, "Tight
Auditing of Differentially Private Machine Learning", USENIX Security 2023, arXiv:2302.07956
(the per-step adversary and the power of its tests); Steinke, Nasr, Jagielski, "Privacy
Auditing with One (1) Training Run", NeurIPS 2023, arXiv:2305.08846.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np
from scipy import stats as sps

from fl_privacy.attacks.audit import canary_statistics as cs
from fl_privacy.attacks.audit import poisson_mle

# Noise factors tried, ascending (f = 1 is the claim; smaller is a larger bug).
FACTORS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
LEVEL = 0.95
MIN_DRAWS = 20


def planted(curve: cs.Curve, factor: float) -> cs.Curve:
  """`curve` with its noise scaled by `factor`, its score still reading the claim's noise."""
  if not factor > 0:
    raise ValueError(f'a noise factor must be > 0 (got {factor})')
  claimed = curve.noise if curve.score_noise is None else curve.score_noise
  return dataclasses.replace(curve, noise=float(curve.noise) * float(factor),
                             score_noise=float(claimed))


@dataclasses.dataclass(frozen=True)
class Design:
  """A row's audit: its canaries, claim and tests (the `canary_statistics.audit` arguments)."""
  n_in: int
  n_out: int
  mechanism: str
  claimed_epsilon: float
  delta: float
  confidence: float
  independent: bool
  claimed_delta: Callable | None = None
  midpoint: float | None = None
  # A Poisson row whose per-step readings join its verdict (`mle_verdict`): the steps each
  # canary saw; None: the row's scores alone.
  mle_steps: int | None = None


def _draw(curve: cs.Curve, design: Design, seed: int, draw: int) -> dict[str, Any]:
  """One simulation: scores of the design's canaries from `curve`, the row's tests on them
  (with `design.mle_steps`, the per-step readings too, and `mle_verdict`).
  Draw d's randomness is `default_rng([seed, d])` at every factor (common random numbers:
  the factors' rates differ by the noise, not by the draws)."""
  rng = np.random.default_rng([int(seed), int(draw)])
  world = np.concatenate([np.ones(design.n_in, bool), np.zeros(design.n_out, bool)])
  if design.mle_steps is not None:
    x, s = curve_readings(curve, world, rng)
    return mle_verdict(x, s, world, design, design.mle_steps)
  s = cs.curve_scores(curve, world, rng)
  return verdict(s[world], s[~world], design)


def verdict(ins: np.ndarray, outs: np.ndarray, design: Design) -> dict[str, Any]:
  """The row's counted tests on one draw's scores: `best` (the best counted bound), `free`
  (the best assumption-free one) and `flagged` (the verdict would be "violation")."""
  r = cs._tests(ins, outs, design.mechanism, design.claimed_epsilon,  # pylint: disable=protected-access
                delta=design.delta, confidence=design.confidence,
                independent=design.independent, claimed_delta=design.claimed_delta,
                midpoint=design.midpoint, report_all=False)
  free = cs.labelled_bounds(r['found'], r['counted'])['certified_free']
  return {'best': float(r['best']), 'free': float(free),
          'flagged': bool(cs.refuting(r, design.claimed_epsilon))}


def detection(curve: cs.Curve, design: Design, factor: float, *, draws: int = MIN_DRAWS,
              seed: int = 0) -> int:
  """How many of `draws` simulations at noise `factor` the row's verdict flags."""
  c = planted(curve, factor)
  return sum(_draw(c, design, seed, d)['flagged'] for d in range(int(draws)))


def rate_interval(hits: int, draws: int) -> tuple[float, float]:
  """Clopper-Pearson 95% interval of a detection rate (hits of draws)."""
  lo = 0.0 if hits == 0 else float(sps.beta.ppf(0.025, hits, draws - hits + 1))
  hi = 1.0 if hits == draws else float(sps.beta.ppf(0.975, hits + 1, draws - hits))
  return lo, hi


def detectable_factor(curve: cs.Curve, design: Design, *, factors=FACTORS,
                      draws: int = MIN_DRAWS, level: float = LEVEL,
                      seed: int = 0) -> dict[str, Any]:
  """The smallest planted bug (largest noise factor of `factors`) the row detects at `level`.

  Bisects the ascending grid for the last factor whose detection rate (hits / draws) is at
  least `level`, assuming the rate falls as the factor rises toward 1 (the tests check it on
  full grids). Returns `power_factor` (NaN when even the smallest factor is detected below
  `level`), `power_hits` / `power_draws` there
  (`power_rate_ci_low`: the 95% Clopper-Pearson lower end of its rate), `power_next_factor` and `power_next_hits` (the
  next factor up, detected below `level`; NaN / -1 when the largest factor is detected),
  `power_level`, and `power_curve` ('f:hits/draws' of every factor simulated, ascending).
  """
  f = tuple(sorted(float(x) for x in factors))
  if not f or f[0] <= 0 or f[-1] >= 1:
    raise ValueError(f'noise factors must lie in (0, 1) (got {factors})')
  if int(draws) < 1:
    raise ValueError(f'draws must be >= 1 (got {draws})')
  seen: dict[int, int] = {}

  def hits(i: int) -> int:
    if i not in seen:
      seen[i] = detection(curve, design, f[i], draws=draws, seed=seed)
    return seen[i]

  # The hits a detection needs, an integer (19 of 20 at 95%), so that no float rounding of
  # level x draws decides a factor.
  need = math.ceil(float(level) * int(draws) - 1e-9)
  ok = lambda i: hits(i) >= need
  lo, hi = -1, len(f)   # ok(lo) holds (or lo = -1), ok(hi) fails (or hi = len(f))
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if ok(mid):
      lo = mid
    else:
      hi = mid
  out = {'power_factor': f[lo] if lo >= 0 else math.nan,
         'power_hits': hits(lo) if lo >= 0 else -1, 'power_draws': int(draws),
         'power_rate_ci_low': rate_interval(hits(lo), int(draws))[0] if lo >= 0 else math.nan,
         'power_next_factor': f[hi] if hi < len(f) else math.nan,
         'power_next_hits': hits(hi) if hi < len(f) else -1, 'power_level': float(level),
         'power_curve': ';'.join(f'{f[i]:g}:{seen[i]}/{int(draws)}' for i in sorted(seen))}
  return out


def median_interval(values: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
  """Distribution-free interval of a median from n draws: the order statistics (k, n + 1 - k),
  k the largest with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2 (NaN for too few)."""
  v = np.sort(np.asarray(values, np.float64))
  n = v.size
  k = 0
  while k < n and sps.binom.cdf(k, n, 0.5) <= (1.0 - confidence) / 2:
    k += 1
  if k < 1:
    return math.nan, math.nan
  return float(v[k - 1]), float(v[n - k])


def optimum(curve: cs.Curve, design: Design, *, draws: int = MIN_DRAWS, seed: int = 0,
            observed: float | None = None) -> dict[str, Any]:
  """The optimal attack on the claimed mechanism with the row's canaries, over `draws`
  simulations: `simulated_bound` (median best counted bound), its 95% interval
  (`simulated_bound_ci_low` / `_high`), `simulated_bound_free` (median of the
  assumption-free bound), `simulated_draws`, `simulated_false_alarms` (draws the verdict
  flags, on a mechanism exactly at its claim) and, given the row's `observed` best bound,
  `simulated_below_observed` (draws below it)."""
  got = [_draw(curve, design, seed, d) for d in range(int(draws))]
  best = np.array([g['best'] for g in got])
  lo, hi = median_interval(best)
  out = {'simulated_bound': float(np.median(best)), 'simulated_bound_ci_low': lo,
         'simulated_bound_ci_high': hi,
         'simulated_bound_free': float(np.median([g['free'] for g in got])),
         'simulated_draws': int(draws),
         'simulated_false_alarms': int(sum(g['flagged'] for g in got))}
  if observed is not None:
    out['simulated_below_observed'] = int(np.sum(best < float(observed)))
  return out


# ------------------------------------------------- the MLE / PLD test of a Poisson row ---


def curve_readings(curve: cs.Curve, world: np.ndarray, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray]:
  """The per-step readings [n, steps] of a Poisson-subsampled Gaussian `curve` (add/remove:
  noise N(0, curve.noise^2), plus the shift with probability `rate` for an IN canary) and the
  all_steps score each canary's readings give (the sum of their likelihood ratios under the
  claim's noise, `curve_scores`' statistic)."""
  if curve.relation != 'add_remove' or curve.rr_epsilon is not None or not curve.rate < 1:
    raise ValueError('readings are simulated for a Poisson-subsampled Gaussian (add/remove)')
  world = np.asarray(world, bool)
  shape = (len(world), int(curve.steps))
  s, d, q = float(curve.noise), float(curve.shift), float(curve.rate)
  v = float(s if curve.score_noise is None else curve.score_noise) ** 2
  x = rng.normal(0.0, s, size=shape) + d * ((rng.random(shape) < q) & world[:, None])
  score = np.logaddexp(np.log1p(-q), np.log(q) + (x * d - 0.5 * d * d) / v).sum(1)
  return x, score


def mle_verdict(readings: np.ndarray, scores: np.ndarray, world: np.ndarray, design: Design,
                steps: int, discretization: float = poisson_mle.VALUE_DISCRETIZATION
                ) -> dict[str, Any]:
  """A Poisson row's verdict with the MLE / PLD test in its family: the counted tests on
  the scores and `poisson_mle.audit` on the readings, each at 1 - (1 - c) / (k + 1).
  `mle_bound`, `mle_flagged`, `flagged` (any test refutes), `best`, `free`."""
  world = np.asarray(world, bool)
  r = cs._tests(scores[world], scores[~world], design.mechanism, design.claimed_epsilon,  # pylint: disable=protected-access
                delta=design.delta, confidence=design.confidence,
                independent=design.independent, claimed_delta=design.claimed_delta,
                midpoint=design.midpoint, report_all=False, extra=1)
  m = poisson_mle.audit(readings[world], readings[~world], steps=int(steps),
                        claimed_epsilon=design.claimed_epsilon, delta=design.delta,
                        level=r['each'], discretization=discretization)
  others = bool(cs.refuting(r, design.claimed_epsilon))
  free = cs.labelled_bounds(r['found'], r['counted'])['certified_free']
  return {'best': float(r['best']), 'free': float(free),
          'mle_bound': float(m['epsilon_mle_pld']),
          'mle_flagged': bool(m['mle_pld_refutes']), 'others_flagged': others,
          'flagged': others or bool(m['mle_pld_refutes']),
          'mle_point': float(m['epsilon_mle_point'])}


def mle_power(curve: cs.Curve, design: Design, factors=(1.0,), *, draws: int = MIN_DRAWS,
              seed: int = 0, discretization: float = poisson_mle.VALUE_DISCRETIZATION
              ) -> dict[float, dict[str, Any]]:
  """At each noise factor (1.0: the claimed mechanism), `draws` simulations of the row's
  readings and verdict (`mle_verdict`): the MLE / PLD test's hits and the verdict's (with its
  95% Clopper-Pearson interval), the lower bound's median with its 95% interval. At factor 1
  a hit is a false alarm. Draw d's randomness is `default_rng([seed, d])` at every factor."""
  out: dict[float, dict[str, Any]] = {}
  world = np.concatenate([np.ones(design.n_in, bool), np.zeros(design.n_out, bool)])
  for f in factors:
    c = curve if float(f) == 1.0 else planted(curve, float(f))
    got = []
    for d in range(int(draws)):
      x, sc = curve_readings(c, world, np.random.default_rng([int(seed), int(d)]))
      got.append(mle_verdict(x, sc, world, design, curve.steps, discretization))
    bound = np.array([g['mle_bound'] for g in got])
    hits = sum(g['flagged'] for g in got)
    mle_hits = sum(g['mle_flagged'] for g in got)
    lo, hi = median_interval(bound)
    out[float(f)] = {
        'mle_pld_bound': float(np.median(bound)), 'mle_pld_bound_ci_low': lo,
        'mle_pld_bound_ci_high': hi, 'mle_pld_bound_min': float(bound.min()),
        'mle_pld_hits': int(mle_hits), 'mle_pld_rate_ci': rate_interval(mle_hits, int(draws)),
        'verdict_hits': int(hits), 'verdict_rate_ci': rate_interval(hits, int(draws)),
        'others_hits': int(sum(g['others_flagged'] for g in got)), 'draws': int(draws),
        'mle_point_median': float(np.median([g['mle_point'] for g in got]))}
  return out


__all__ = ['FACTORS', 'LEVEL', 'MIN_DRAWS', 'planted', 'Design', 'verdict', 'detection', 'rate_interval',
           'detectable_factor', 'median_interval', 'optimum', 'curve_readings', 'mle_verdict',
           'mle_power']
