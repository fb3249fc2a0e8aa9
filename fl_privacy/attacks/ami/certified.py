"""Certified guarantee of success of the AMI attack under LDP (Section 4 of the AMI paper).

Nguyen et al. (AISTATS 2023), Theorem 1 and Corollary 1: with v(x) = h . ReLU(W x + b) + c the
chosen neuron's value, the attack is certified at broken probability delta when the Hoeffding
lower bound on E[v(M(t))] is > 0 and the upper bound on E[v(M(x))] is <= 0 (Eqs. 9-11), from
p Monte Carlo draws M(t) of the randomized target and q draws M(x) of randomized non-targets.

Range(v). Hoeffding's inequality needs an interval that contains every value v can take, not
the spread of the values seen: an empirical min/max is not a valid range (the bound would hold
only for the draws already made). We bound it analytically by interval arithmetic over the
mechanism's output box: a randomized feature decodes into [min_value, max_value] of the
fixed-point encoding (every code has positive probability under BitRand and OME), so each
first-layer pre-activation lies in b_i + sum_j [min(W_ji lo, W_ji hi), max(...)], each ReLU in
the positive part of that, and v in c + sum_i [min(h_i a_lo, h_i a_hi), max(...)]. This range
is valid but wide, so certified deltas are conservative; the empirical spread is reported
beside it for comparison only (`empirical_range`, flagged as not a valid Hoeffding range).

Confidence accounting: Theorem 1 states each bound at confidence 1 - delta; both hold together
with probability >= 1 - 2 delta (union bound). We report the paper's delta.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy.attacks.ami import crafting as ami
from fl_privacy.eval import stats


def value_range(neuron: ami.CraftedNeuron, low: float, high: float) -> tuple[float, float]:
  """Interval [v_min, v_max] containing v(x) for every x in the box [low, high]^d.

  Args:
    neuron: the crafted block (unbatched).
    low: smallest value a (randomized, decoded) feature can take.
    high: largest value.

  Returns:
    (v_min, v_max) as floats (interval arithmetic in float64).
  """
  w = np.asarray(neuron.w, np.float64)
  b = np.asarray(neuron.b, np.float64)
  h = np.asarray(neuron.h, np.float64)
  c = float(neuron.c)
  pre_lo = b + np.sum(np.minimum(w * low, w * high), axis=0)
  pre_hi = b + np.sum(np.maximum(w * low, w * high), axis=0)
  a_lo, a_hi = np.maximum(pre_lo, 0.0), np.maximum(pre_hi, 0.0)
  v_lo = c + np.sum(np.minimum(h * a_lo, h * a_hi))
  v_hi = c + np.sum(np.maximum(h * a_lo, h * a_hi))
  return float(v_lo), float(v_hi)


def monte_carlo_values(key: jax.Array, neuron: ami.CraftedNeuron, x: jax.Array,
                       randomize, num_draws: int | None = None) -> np.ndarray:
  """v(M(x)) for independent draws of the mechanism.

  Args:
    key: PRNG key (one randomization call).
    neuron: the crafted block.
    x: [d] a single sample (drawn `num_draws` times: the p draws of M(t)) or [q, d] samples
      (each randomized once: the q draws of M(x)).
    randomize: `(key, x) -> x'`, the client's mechanism.
    num_draws: number of draws of a single sample; None when `x` is [q, d].

  Returns:
    float64 [num_draws] or [q].
  """
  if num_draws is not None:
    x = jnp.broadcast_to(x, (num_draws,) + x.shape[-1:])
  # Eager on purpose: `randomize` is a new closure per epsilon, and compiling it would cost
  # more than the one pass it runs.
  v = ami.chosen_value(neuron, randomize(key, x))
  return np.asarray(v, np.float64)


def bounds(values_target: np.ndarray, values_other: np.ndarray, range_target: float,
           range_other: float, delta: float) -> dict[str, float]:
  """Eqs. 9-10 of the AMI paper and the condition of Theorem 1 (Eq. 11).

  Args:
    values_target: the p values v(M(t)).
    values_other: the q values v(M(x)).
    range_target: Range(v(t)), the width of an interval containing every value.
    range_other: Range(v(x)).
    delta: broken probability.

  Returns:
    {'mean_target', 'lower_target', 'mean_other', 'upper_other', 'certified'} with
    certified = 1.0 when lower_target > 0 and upper_other <= 0, else 0.0.
  """
  p, q = len(values_target), len(values_other)
  mean_t, mean_x = float(np.mean(values_target)), float(np.mean(values_other))
  lower = stats.hoeffding_lower(mean_t, range_target, p, delta)
  upper = stats.hoeffding_upper(mean_x, range_other, q, delta)
  return {'mean_target': mean_t, 'lower_target': lower, 'mean_other': mean_x,
          'upper_other': upper, 'certified': float(lower > 0 and upper <= 0)}


def smallest_delta_closed_form(mean_target: float, range_target: float, p: int,
                               mean_other: float, range_other: float, q: int) -> float:
  """The infimum of the deltas for which Theorem 1 holds (Corollary 1, Eq. 12), in closed form.

  lower > 0 iff delta > exp(-2 p (mean_t / R_t)^2) (needs mean_t > 0); upper <= 0 iff
  delta >= exp(-2 q (mean_x / R_x)^2) (needs mean_x <= 0). Returns 1.0 when no delta < 1 works.
  """
  if mean_target <= 0 or mean_other > 0:
    return 1.0
  terms = []
  for mean, r, n in ((mean_target, range_target, p), (mean_other, range_other, q)):
    terms.append(0.0 if r == 0 else math.exp(-2.0 * n * (mean / r) ** 2))
  return max(terms)


def smallest_delta(values_target: np.ndarray, values_other: np.ndarray, range_target: float,
                   range_other: float, grid: Sequence[float] | None = None) -> float:
  """Line search for the smallest broken probability delta for which Theorem 1 holds.

  Corollary 1 of the AMI paper: with the mechanism and epsilon fixed, search delta. The
  condition is monotone in delta (both bounds tighten as delta grows), so the first grid value
  (ascending) that satisfies it is the answer; the search bisects the grid.

  Args:
    values_target: the p values v(M(t)).
    values_other: the q values v(M(x)).
    range_target: Range(v(t)).
    range_other: Range(v(x)).
    grid: ascending deltas in (0, 1); default 10^-k for k = 300 .. 0.05 in steps of 0.05
      decade, then 0.9 .. 0.9975 in steps of 0.0025.

  Returns:
    The smallest grid delta satisfying Eq. 11, or 1.0 if none does.
  """
  if grid is None:
    grid = np.concatenate([10.0 ** np.arange(-300.0, -0.05 + 1e-9, 0.05),
                           np.arange(0.9, 0.9995, 0.0025)])
  grid = np.asarray(grid, np.float64)

  def holds(i: int) -> bool:
    return bool(bounds(values_target, values_other, range_target, range_other,
                       float(grid[i]))['certified'])

  # Bisection on the ascending grid (the condition is monotone in delta).
  lo, hi = 0, len(grid)
  while lo < hi:
    mid = (lo + hi) // 2
    if holds(mid):
      hi = mid
    else:
      lo = mid + 1
  return float(grid[lo]) if lo < len(grid) else 1.0


def certify(values_target: np.ndarray, values_other: np.ndarray,
            v_range: tuple[float, float], delta: float) -> dict[str, float]:
  """All numbers of one Fig. 7 point: means, bounds at `delta`, smallest delta, ranges.

  Args:
    values_target: the p values v(M(t)).
    values_other: the q values v(M(x)).
    v_range: the analytic (valid) interval of v, used for both ranges.
    delta: the broken probability of the reported bounds (the paper: 1e-8).

  Returns:
    Flat metrics: `bounds(...)` at `delta`, `delta_star` (line search), `delta_star_exact`
    (closed form), `range` (analytic width), `empirical_range` (max - min of all draws; NOT a
    valid Hoeffding range), `delta_star_empirical_range` (closed-form delta* with that
    invalid range, for comparison only), `p`, `q`.
  """
  width = float(v_range[1] - v_range[0])
  out = bounds(values_target, values_other, width, width, delta)
  out['delta_star'] = smallest_delta(values_target, values_other, width, width)
  out['delta_star_exact'] = smallest_delta_closed_form(
      out['mean_target'], width, len(values_target), out['mean_other'], width,
      len(values_other))
  every = np.concatenate([values_target, values_other])
  out['range'] = width
  out['empirical_range'] = float(np.max(every) - np.min(every))
  # What the certificate would say with the observed spread as "Range" (as a paper-style
  # computation might): NOT valid for Hoeffding, reported only to show the difference.
  out['delta_star_empirical_range'] = smallest_delta_closed_form(
      out['mean_target'], out['empirical_range'], len(values_target), out['mean_other'],
      out['empirical_range'], len(values_other))
  out['p'] = int(len(values_target))
  out['q'] = int(len(values_other))
  return out


def sample_rows(key: jax.Array, num_rows: int, q: int) -> np.ndarray:
  """q of `num_rows` indices at random without replacement, sorted (all of them when q is
  num_rows): the certificate's non-target samples, drawn from rows independent of the
  crafted neuron, as Hoeffding's inequality needs."""
  if q == num_rows:
    return np.arange(num_rows)
  return np.sort(data_lib.rng_from_key(key).choice(num_rows, q, replace=False))


def certify_targets(key: jax.Array, neurons: ami.CraftedNeuron, target_x: np.ndarray,
                    other_x: jax.Array, randomize, low: float, high: float, *, num_draws: int,
                    delta: float) -> tuple[dict, dict]:
  """Theorem 1 per target; metrics of target 0 and the fraction certified, and its draws.

  p = `num_draws` randomized copies of target t (key fold_in(key, 2 t)); the q rows of
  `other_x`, each randomized once (fold_in(key, 2 t + 1)); `value_range` over [low, high].

  Returns:
    (`certified_<certify's fields>` of target 0, `certified_q`, `certified_fraction`,
    `certified_delta_star_median`; target 0's draws {'target', 'other'}).
  """
  out, draws, certified_count, deltas = {}, {}, 0, []
  for t in range(neurons.w.shape[0]):
    neuron = jax.tree.map(lambda x, t=t: x[t], neurons)
    v_t = monte_carlo_values(jax.random.fold_in(key, 2 * t), neuron, jnp.asarray(target_x[t]),
                             randomize, int(num_draws))
    v_x = monte_carlo_values(jax.random.fold_in(key, 2 * t + 1), neuron, other_x, randomize)
    res = certify(v_t, v_x, value_range(neuron, low, high), float(delta))
    certified_count += int(res['certified'])
    deltas.append(res['delta_star'])
    if t == 0:
      out = {f'certified_{k}': v for k, v in res.items()}
      draws = {'target': v_t, 'other': v_x}
  out['certified_q'] = int(other_x.shape[0])
  out['certified_fraction'] = certified_count / neurons.w.shape[0]
  out['certified_delta_star_median'] = float(np.median(deltas))
  return out, draws
