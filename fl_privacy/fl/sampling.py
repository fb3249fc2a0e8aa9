"""Poisson minibatches for DP-SGD: every real row joins every step independently.

DP-SGD's standard accounting (dp-accounting's `PoissonSampledDpEvent`, through
`fl_privacy.accounting`; under PLD the truncation below is accounted exactly by
`TruncatedSubsampledGaussianDpEvent`) is exact only when each example joins each step's batch
independently with probability q. (jax-privacy's `batch_selection.CyclicPoissonSampling` draws
the same batches host-side with numpy, once per training; the clients here are jitted and
vmapped, so the draw is in JAX, keyed per client, round and step.) `poisson_batch_order` draws such batches on a padded shard:
with n real rows and expected batch size B, q = B / n and each local epoch has ceil(n / B) real
steps (the same count as `local.masked_batch_order`). n is treated as public, as DP-SGD
implementations do when they set q from the dataset size.

Static shapes. The number of selected rows is Binomial(n, q) and unbounded by anything but n,
while `jit` needs a static batch: the rows are packed into `max_batch_size` slots (row mask 1 for
a selected row, 0 for an empty slot). When more than `max_batch_size` rows are selected (an
overflow) the step keeps a uniformly random subset of `max_batch_size` of them: every selected
row draws an independent priority and the `max_batch_size` smallest priorities are kept, in
priority order (so the packing order is uniformly random too).

Privacy on overflow. Couple the truncated mechanism M' with the exact Poisson mechanism M through
the same draws: they differ only on the event that some step overflows. If M is
(eps, delta)-DP, then for any neighbouring D, D' and any set A,
P[M'(D) in A] <= P[M(D) in A] + p_D <= e^eps P[M(D') in A] + delta + p_D
<= e^eps P[M'(D') in A] + delta + p_D + e^eps p_D', so M' is (eps, delta + (1 + e^eps) p)-DP
with p the larger overflow probability of all steps on D and D' (`overflow_probability` with
`steps` = every Poisson step the accounting covers, all rounds included). The defense therefore
picks the slot count with `max_batch_size(n, B, steps, overflow)` so that this term is
negligible next to delta (the default overflow, 1e-12, adds at most ~1e-12 (1 + e^eps)).

Real steps are never skipped. A real step whose draw selects no row still runs (its row masks
are all zero): DP-SGD's noise is added on an empty batch as on any other, and skipping it would
make the step's output a point mass that the accounting does not cover. That is why the
sampler returns a third array, `step_masks` [E, S], which tells `local.fedavg` which steps are
real; steps beyond the client's ceil(n / B) per epoch (the capacity's padding steps) have
`step_masks` 0 and all-zero row masks, and are skipped as `fedavg` skips empty masked steps.

Keys. `local.fedavg` gives a sampler `client.batches_key(k_tk)` (a salt of its own, so no
shuffling or step key is reused). Step j of epoch e uses
`k_ej = fold_in(fold_in(key, e), j)`; a real row of rank r among the real rows uses
`k_ejr = fold_in(k_ej, r)` and makes one draw, `w = bits(k_ejr, (2,), uint32)`: it joins when
u = (w[0] >> 8) / 2^24 < q (u uniform on a 2^-24 grid, so the rate is q to within 6e-8) and its
priority is w[1]. Keyed by the rank, not the row index, so padding the shard anywhere or
to any capacity leaves the real rows' draws, and so the steps' selected rows, unchanged (the
property `local.masked_batch_order` has).
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats


def _check(epochs: int, batch_size: int, max_batch_size: int) -> None:
  if epochs < 1:
    raise ValueError(f'epochs must be >= 1 (got {epochs})')
  if batch_size < 1:
    raise ValueError(f'batch_size must be >= 1 (got {batch_size})')
  if max_batch_size < 1:
    raise ValueError(f'max_batch_size must be >= 1 (got {max_batch_size})')


def poisson_batch_order(key, mask: jnp.ndarray, *, epochs: int, batch_size: int,
                        max_batch_size: int
                        ) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """Poisson-sampled minibatches of every local step of a padded shard.

  Each epoch has S = ceil(capacity / B) steps; the first ceil(n / B) are real. In a real step
  every real row joins independently with probability q = min(B / n, 1); the selected rows are
  packed, in a uniformly random order, into `max_batch_size` slots, and a step that selects more
  keeps a uniformly random subset of `max_batch_size` of them (see the module docstring for
  the keys and the privacy cost of truncation).

  Args:
    key: The sampler's key (`client.batches_key(k_tk)` in `local.fedavg`).
    mask: [capacity] 1.0 for real rows, 0.0 for padding (anywhere; n may be traced).
    epochs: E (static).
    batch_size: B, the expected batch size (static).
    max_batch_size: Slots per step (static), e.g. from `max_batch_size(...)`.

  Returns:
    (indices int32 [E, S, max_batch_size], row_masks float32 [E, S, max_batch_size],
    step_masks float32 [E, S]): row mask 1 marks a selected real row; the index of an empty
    slot is an arbitrary row. step_masks is 1 for the client's real steps (run even when no row
    is selected) and 0 for the padding steps after them (all their row masks are 0).
  """
  _check(epochs, batch_size, max_batch_size)
  capacity = mask.shape[0]
  steps = -(-capacity // batch_size)
  real = mask > 0
  num_real = jnp.sum(real.astype(jnp.int32))
  # q = B / n, capped at 1 (a shard smaller than B trains on all of it in its one step).
  rate = jnp.minimum(batch_size / jnp.maximum(num_real, 1).astype(jnp.float32), 1.0)
  real_steps = (num_real + batch_size - 1) // batch_size
  rows = jnp.arange(capacity, dtype=jnp.int32)
  # A real row's rank among the real rows: the same whether and where padding sits.
  rank = jnp.cumsum(real.astype(jnp.int32)) - 1

  def one_step(epoch, step):
    step_key = jax.random.fold_in(jax.random.fold_in(key, epoch), step)

    # One draw of two words per row (few hashes: they dominate the compile time).
    words = jax.vmap(lambda r: jax.random.bits(jax.random.fold_in(step_key, r), (2,),
                                               jnp.uint32))(rank)
    # u = top 24 bits / 2^24, exact in float32: P[u < q] = ceil(q 2^24) / 2^24, and q = 1
    # always joins.
    u = (words[:, 0] >> 8).astype(jnp.float32) * (2.0 ** -24)
    joins, priority = u < rate, words[:, 1]
    live = step < real_steps
    selected = real & joins & live
    # Selected rows first, by priority (ties, p ~ 2^-32 a pair, by index, which follows the
    # rank): the first max_batch_size are a uniform random subset in a uniform random order.
    _, _, order = jax.lax.sort(
        (jnp.where(selected, 0, 1).astype(jnp.int32), priority, rows), num_keys=3)
    if max_batch_size > capacity:
      order = jnp.concatenate([order, jnp.zeros(max_batch_size - capacity, jnp.int32)])
    kept = jnp.minimum(jnp.sum(selected.astype(jnp.int32)), max_batch_size)
    row_mask = (jnp.arange(max_batch_size) < kept).astype(jnp.float32)
    return order[:max_batch_size], row_mask, live.astype(jnp.float32)

  epoch_ids = jnp.arange(epochs)[:, None] * jnp.ones((1, steps), jnp.int32)
  step_ids = jnp.ones((epochs, 1), jnp.int32) * jnp.arange(steps)[None, :]
  return jax.vmap(jax.vmap(one_step))(epoch_ids, step_ids)


def poisson_sampler(max_batch_size: int) -> Callable:
  """The `ClientHooks.batches` sampler of Poisson minibatches with `max_batch_size` slots.

  Returns:
    `sampler(key, mask, *, epochs, batch_size) -> (indices, row_masks, step_masks)`, i.e.
    `poisson_batch_order` with `max_batch_size` closed over (static under `jit`).
  """
  if max_batch_size < 1:
    raise ValueError(f'max_batch_size must be >= 1 (got {max_batch_size})')

  def sampler(key, mask, *, epochs, batch_size):
    return poisson_batch_order(key, mask, epochs=epochs, batch_size=batch_size,
                               max_batch_size=max_batch_size)
  return sampler


def overflow_probability(num_examples: int, rate: float, max_batch_size: int,
                         steps: int) -> float:
  """P[at least one of `steps` independent Binomial(n, q) batch sizes exceeds the slots].

  Exact, not a union bound: the steps' draws are independent, so the probability is
  1 - (1 - p)^steps with p = P[Binomial(n, q) > max_batch_size] (scipy's `binom.sf`), computed
  as -expm1(steps * log1p(-p)) so that tiny p keep their digits.

  Args:
    num_examples: n >= 0 real rows.
    rate: q in [0, 1].
    max_batch_size: Slots per step, >= 0.
    steps: Number of independent steps, >= 0.

  Returns:
    The probability in [0, 1].
  """
  if num_examples < 0 or max_batch_size < 0 or steps < 0:
    raise ValueError('num_examples, max_batch_size and steps must be >= 0 (got '
                     f'{num_examples}, {max_batch_size}, {steps})')
  if not 0.0 <= rate <= 1.0:
    raise ValueError(f'rate must be in [0, 1] (got {rate})')
  p = float(stats.binom.sf(max_batch_size, num_examples, rate))
  if p >= 1.0:
    return 1.0 if steps > 0 else 0.0
  return float(-np.expm1(steps * np.log1p(-p)))


def max_batch_size(num_examples: int, batch_size: int, steps: int,
                   overflow: float = 1e-12) -> int:
  """The fewest slots b <= n whose `overflow_probability` over `steps` is <= `overflow`.

  The rate is q = min(B / n, 1), as `poisson_batch_order` draws it. b = n means no overflow
  can happen (always feasible). `overflow_probability` falls as b grows, so a bisection finds
  the smallest feasible b.

  Args:
    num_examples: n >= 1 real rows.
    batch_size: B >= 1, the expected batch size.
    steps: Every Poisson step the accounting covers (>= 1).
    overflow: Tolerated probability of any overflow, in [0, 1).

  Returns:
    The minimal b.
  """
  if num_examples < 1 or batch_size < 1 or steps < 1:
    raise ValueError('num_examples, batch_size and steps must be >= 1 (got '
                     f'{num_examples}, {batch_size}, {steps})')
  if not (0.0 <= overflow < 1.0 and math.isfinite(overflow)):
    raise ValueError(f'overflow must be in [0, 1) (got {overflow})')
  rate = min(batch_size / num_examples, 1.0)
  lo, hi = 0, num_examples  # invariant: hi is feasible, every b < lo is not
  while lo < hi:
    mid = (lo + hi) // 2
    if overflow_probability(num_examples, rate, mid, steps) <= overflow:
      hi = mid
    else:
      lo = mid + 1
  return hi
