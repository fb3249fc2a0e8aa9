"""Poisson minibatches for DP-SGD on a public schedule: each real row joins each step independently.

DP-SGD's standard accounting (dp-accounting's `PoissonSampledDpEvent`, through
`fl_privacy.accounting`; under PLD the truncation below is accounted exactly by
`TruncatedSubsampledGaussianDpEvent`) is exact only when each example joins each step's batch
independently with probability q, for a number of steps the accountant knows. (jax-privacy's
`batch_selection.CyclicPoissonSampling` draws the same batches host-side with numpy, once per
training; the clients here are jitted and vmapped, so the draw is in JAX, keyed per client,
round and step.)

The public schedule. q and the number of steps are what the accountant composes, so they come
from public configuration, never from the shard: a declared record count N and the expected
batch size B give q = min(B / N, 1) and S = ceil(N / B) steps per epoch (or the declared
`steps_per_epoch`), for every client whatever its real row count n. A shard of n != N rows still
takes S steps a local epoch at rate q: each of its records joins each step with probability q,
which is all the record-level accounting assumes (the expected batch is q n, not B). Taking q
and S from n instead (the rate B / n and ceil(n / B) steps) is a side channel: adding one record
where n is a multiple of B adds a whole noisy step, which the upload's norm shows
(`tests/fl/test_sampling.py` has the two-sample test; `training_audit.plant=
'data_dependent_schedule'` plants it and the training audit's side-channel adversary flags it).

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
`steps` = every Poisson step the accounting covers, all rounds included, and n the largest shard
the slots must hold). The defense therefore picks the slot count with
`max_batch_size(n, B, steps, overflow, rate=q)` so that this term is negligible next to delta
(the default overflow, 1e-12, adds at most ~1e-12 (1 + e^eps)).

Every step is real. A step whose draw selects no row still runs (its row masks are all zero):
DP-SGD's noise is added on an empty batch as on any other, and skipping it would make the step's
output a point mass that the accounting does not cover. The sampler returns a third array,
`step_masks` [E, S], which tells `local.fedavg` which steps run: all S of the schedule.

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

import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats


class Schedule(NamedTuple):
  """DP-SGD's public Poisson schedule: the rate q every record joins a step with, and the steps
  of a local epoch. Built from public configuration (`public_schedule`), never from a shard."""
  rate: float
  steps_per_epoch: int


def public_schedule(num_examples: int, batch_size: int,
                    steps_per_epoch: int | None = None) -> Schedule:
  """q = min(B / N, 1) and S = ceil(N / B) steps per epoch (or `steps_per_epoch`) for the
  declared public record count N and the expected batch size B (the module docstring)."""
  if num_examples < 1 or batch_size < 1:
    raise ValueError('num_examples and batch_size must be >= 1 (got '
                     f'{num_examples}, {batch_size})')
  steps = -(-int(num_examples) // int(batch_size)) if steps_per_epoch is None else int(
      steps_per_epoch)
  if steps < 1:
    raise ValueError(f'steps_per_epoch must be >= 1 (got {steps_per_epoch})')
  return Schedule(rate=min(float(batch_size) / float(num_examples), 1.0), steps_per_epoch=steps)


def _check(epochs: int, max_batch_size: int) -> None:
  if epochs < 1:
    raise ValueError(f'epochs must be >= 1 (got {epochs})')
  if max_batch_size < 1:
    raise ValueError(f'max_batch_size must be >= 1 (got {max_batch_size})')


def poisson_batch_order(key, mask: jnp.ndarray, *, epochs: int, schedule: Schedule,
                        max_batch_size: int
                        ) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """Poisson-sampled minibatches of every local step of a padded shard, on a public schedule.

  Each epoch has S = `schedule.steps_per_epoch` steps, all of them real whatever the shard's
  row count. In each step every real row joins independently with probability q =
  `schedule.rate`; the selected rows are packed, in a uniformly random order, into
  `max_batch_size` slots, and a step that selects more keeps a uniformly random subset of
  `max_batch_size` of them (see the module docstring for the keys and the privacy cost of
  truncation).

  Args:
    key: The sampler's key (`client.batches_key(k_tk)` in `local.fedavg`).
    mask: [capacity] 1.0 for real rows, 0.0 for padding (anywhere; n may be traced).
    epochs: E (static).
    schedule: The public `Schedule` (static), e.g. from `public_schedule(N, B)`.
    max_batch_size: Slots per step (static), e.g. from `max_batch_size(...)`.

  Returns:
    (indices int32 [E, S, max_batch_size], row_masks float32 [E, S, max_batch_size],
    step_masks float32 [E, S]): row mask 1 marks a selected real row; the index of an empty
    slot is an arbitrary row. step_masks is 1 for every step of the schedule (each runs, even
    when no row is selected).
  """
  _check(epochs, max_batch_size)
  rate, steps = float(schedule.rate), int(schedule.steps_per_epoch)
  if not 0.0 < rate <= 1.0 or steps < 1:
    raise ValueError(f'schedule must have a rate in (0, 1] and steps >= 1 (got {schedule})')
  capacity = mask.shape[0]
  real = mask > 0
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
    selected = real & joins
    # Selected rows first, by priority (ties, p ~ 2^-32 a pair, by index, which follows the
    # rank): the first max_batch_size are a uniform random subset in a uniform random order.
    _, _, order = jax.lax.sort(
        (jnp.where(selected, 0, 1).astype(jnp.int32), priority, rows), num_keys=3)
    if max_batch_size > capacity:
      order = jnp.concatenate([order, jnp.zeros(max_batch_size - capacity, jnp.int32)])
    kept = jnp.minimum(jnp.sum(selected.astype(jnp.int32)), max_batch_size)
    row_mask = (jnp.arange(max_batch_size) < kept).astype(jnp.float32)
    return order[:max_batch_size], row_mask, jnp.float32(1.0)

  epoch_ids = jnp.arange(epochs)[:, None] * jnp.ones((1, steps), jnp.int32)
  step_ids = jnp.ones((epochs, 1), jnp.int32) * jnp.arange(steps)[None, :]
  return jax.vmap(jax.vmap(one_step))(epoch_ids, step_ids)


def poisson_sampler(max_batch_size: int, *, num_examples: int, batch_size: int,
                    steps_per_epoch: int | None = None) -> Callable:
  """The `ClientHooks.batches` sampler of Poisson minibatches on the public schedule of
  `public_schedule(num_examples, batch_size, steps_per_epoch)` with `max_batch_size` slots.

  Returns:
    `sampler(key, mask, *, epochs, batch_size) -> (indices, row_masks, step_masks)`, i.e.
    `poisson_batch_order` with the schedule and the slots closed over (static under `jit`).
    The batch size the client protocol passes must be the schedule's B.
  """
  if max_batch_size < 1:
    raise ValueError(f'max_batch_size must be >= 1 (got {max_batch_size})')
  schedule = public_schedule(num_examples, batch_size, steps_per_epoch)
  expected = int(batch_size)

  def sampler(key, mask, *, epochs, batch_size):
    if int(batch_size) != expected:
      raise ValueError(f'the Poisson sampler was built for batch size {expected} (got '
                       f'{batch_size})')
    return poisson_batch_order(key, mask, epochs=epochs, schedule=schedule,
                               max_batch_size=max_batch_size)
  sampler.schedule = schedule
  return sampler


# Cached by rebinding (mutmut does not mutate decorated functions): equal arguments give the
# same sampler, so a jitted training that takes the hooks as static arguments compiles once for
# every noise of a sweep.
poisson_sampler = functools.lru_cache(maxsize=256)(poisson_sampler)


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
                   overflow: float = 1e-12, *, rate: float | None = None) -> int:
  """The fewest slots b <= n whose `overflow_probability` over `steps` is <= `overflow`.

  The rate is `rate` (the public schedule's q; see `public_schedule`) or, without it,
  q = min(B / n, 1). n is the largest shard the slots must hold. b = n means no overflow can
  happen (always feasible). `overflow_probability` falls as b grows, so a bisection finds the
  smallest feasible b.

  Args:
    num_examples: n >= 1 real rows.
    batch_size: B >= 1, the expected batch size.
    steps: Every Poisson step the accounting covers (>= 1).
    overflow: Tolerated probability of any overflow, in [0, 1).
    rate: q in (0, 1], or None for min(B / n, 1).

  Returns:
    The minimal b.
  """
  if num_examples < 1 or batch_size < 1 or steps < 1:
    raise ValueError('num_examples, batch_size and steps must be >= 1 (got '
                     f'{num_examples}, {batch_size}, {steps})')
  if not (0.0 <= overflow < 1.0 and math.isfinite(overflow)):
    raise ValueError(f'overflow must be in [0, 1) (got {overflow})')
  if rate is None:
    rate = min(batch_size / num_examples, 1.0)
  elif not 0.0 < rate <= 1.0:
    raise ValueError(f'rate must be in (0, 1] (got {rate})')
  lo, hi = 0, num_examples  # invariant: hi is feasible, every b < lo is not
  while lo < hi:
    mid = (lo + hi) // 2
    if overflow_probability(num_examples, rate, mid, steps) <= overflow:
      hi = mid
    else:
      lo = mid + 1
  return hi
