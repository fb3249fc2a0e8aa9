"""Poisson minibatches on a public schedule: inclusion law, schedule independent of the shard,
padding invariance, truncation, overflow maths, fedavg, and the two-sample test that the
upload's norm at n and n + 1 rows cannot be told apart (which the old data-dependent schedule
fails)."""

from __future__ import annotations

import functools
import math
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fl_privacy import defenses
from fl_privacy import fl
from fl_privacy import models
from fl_privacy.defenses import configured
from fl_privacy.defenses import registry
from fl_privacy.fl import client
from fl_privacy.fl import local
from fl_privacy.fl import optimizers
from fl_privacy.fl import sampling
from fl_privacy.pipelines import training_audit_runs

KEY = jax.random.key(0)
LEVEL = 1 - 1e-6  # coverage of each binomial interval: a fixed seed, many cells, no flakes
# 10 real rows among 13, padding in three places. The public schedule declares N = 10 records
# and B = 3: q = 0.3 and S = ceil(10 / 3) = 4 steps an epoch, all real (whatever the capacity).
MASK = jnp.asarray([0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1], jnp.float32)
REAL = np.flatnonzero(np.asarray(MASK))
N, B, E = 10, 3, 2
Q = B / N
S = 4
SCHEDULE = sampling.public_schedule(N, B)


@functools.partial(jax.jit, static_argnames=('num_keys', 'epochs', 'schedule', 'slots'))
def _draws(seed_key, mask, *, num_keys, epochs, schedule, slots):
  keys = jax.random.split(seed_key, num_keys)
  return jax.vmap(lambda k: sampling.poisson_batch_order(
      k, mask, epochs=epochs, schedule=schedule, max_batch_size=slots))(keys)


# Jitted once per shape: eager calls compile op by op, which is most of a test's time.
_order = jax.jit(sampling.poisson_batch_order,
                 static_argnames=('epochs', 'schedule', 'max_batch_size'))
_fedavg = jax.jit(local.fedavg, static_argnames=(
    'loss_fn', 'optimizer', 'epochs', 'batch_size', 'shuffle', 'hooks'))
SGD = optimizers.make('sgd', 1.0)
ADAM = optimizers.make('adam', 0.05)
MOMENTUM = optimizers.make('momentum', 0.1)


def _selected(indices, row_masks, capacity):
  """Boolean [..., capacity] of the rows a step kept (from its slots)."""
  idx, rm = np.asarray(indices), np.asarray(row_masks) > 0
  out = np.zeros(idx.shape[:-1] + (capacity,), bool)
  # ufunc.at, not fancy assignment: an empty slot may repeat a kept row's index.
  np.logical_or.at(out, tuple(np.indices(idx.shape)[:-1]) + (idx,), rm)
  return out


def _within(count, trials, p):
  lo, hi = stats.binom.interval(LEVEL, trials, p)
  return lo <= count <= hi


@pytest.fixture(scope='module')
def many():
  """4,000 independent draws on MASK without truncation (slots = n)."""
  k = 4000
  idx, rm, sm = _draws(jax.random.key(1), MASK, num_keys=k, epochs=E, schedule=SCHEDULE,
                       slots=N)
  return k, _selected(idx, rm, MASK.shape[0]), np.asarray(sm)


# --- the public schedule ----------------------------------------------------------------------


def test_public_schedule_is_rate_b_over_n_and_ceil_n_over_b_steps():
  assert SCHEDULE == sampling.Schedule(rate=Q, steps_per_epoch=S)
  assert sampling.public_schedule(80, 8) == (0.1, 10)
  assert sampling.public_schedule(81, 8) == (8 / 81, 11)  # a partial batch rounds up
  assert sampling.public_schedule(5, 8) == (1.0, 1)  # B >= N: every record, one step
  assert sampling.public_schedule(80, 8, steps_per_epoch=3) == (0.1, 3)  # declared steps
  s = sampling.public_schedule(np.int64(80), np.int64(8))
  assert type(s.rate) is float and type(s.steps_per_epoch) is int


def test_shapes_steps_and_padding_rows_never_selected(many):
  k, sel, sm = many
  assert sel.shape == (k, E, S, 13) and sm.shape == (k, E, S)
  np.testing.assert_array_equal(sm, np.ones_like(sm))  # every step of the schedule is real
  assert not sel[..., np.asarray(MASK) == 0].any()


def test_each_real_row_joins_each_step_with_probability_q(many):
  k, sel, _ = many
  counts = sel[..., REAL].sum(0)  # [E, S, n]
  bad = [(c, e) for e, c in np.ndenumerate(counts) if not _within(c, k, Q)]
  assert not bad, f'inclusion counts outside {stats.binom.interval(LEVEL, k, Q)}: {bad}'


def test_rows_and_steps_are_pairwise_independent(many):
  k, sel, _ = many
  real = sel[..., REAL].reshape(k, E * S, N)  # [k, 8 steps, n rows]
  pairs = []
  for i in range(N):  # every pair of rows in the same step
    for j in range(i + 1, N):
      pairs.append(int((real[:, 0, i] & real[:, 0, j]).sum()))
  for s in range(E * S - 1):  # the same row in consecutive steps (across the epoch too)
    pairs.append(int((real[:, s, 0] & real[:, s + 1, 0]).sum()))
    pairs.append(int((real[:, s, 5] & real[:, s + 1, 5]).sum()))
  bad = [c for c in pairs if not _within(c, k, Q * Q)]
  assert not bad, f'joint counts outside {stats.binom.interval(LEVEL, k, Q * Q)}: {bad}'


def _assert_binomial(sizes, n, q):
  """Chi-square of the batch sizes against Binomial(n, q), and their mean within 5 s.e."""
  pmf = stats.binom.pmf(np.arange(n + 1), n, q)
  observed = np.bincount(sizes, minlength=n + 1).astype(float)
  # Merge the lower and upper tails into a bin each so that every expected count is >= 5.
  expected = pmf * sizes.size
  ok = np.flatnonzero(expected >= 5)
  lo, hi = int(ok[0]), int(ok[-1])
  obs = np.concatenate([[observed[:lo + 1].sum()], observed[lo + 1:hi], [observed[hi:].sum()]])
  exp = np.concatenate([[expected[:lo + 1].sum()], expected[lo + 1:hi], [expected[hi:].sum()]])
  assert stats.chisquare(obs, exp).pvalue > 1e-6
  assert abs(sizes.mean() - n * q) < 5 * np.sqrt(n * q * (1 - q) / sizes.size)


def test_batch_sizes_are_binomial(many):
  k, sel, _ = many
  _assert_binomial(sel.sum(-1).ravel(), N, Q)  # k * 8 steps, independent


@pytest.mark.parametrize('n', [4, 25])
def test_any_shard_takes_the_public_steps_at_the_public_rate(n):
  """A shard of n != N real rows (fewer, more) still runs S = 4 real steps an epoch, each
  real row joining each step with probability q = 0.3: the batch size is Binomial(n, q)
  (mean q n, not B), and the step count is the schedule's, not ceil(n / B)."""
  k, capacity = 3000, 30
  mask = np.zeros(capacity, np.float32)
  mask[np.random.default_rng(n).choice(capacity, n, replace=False)] = 1
  idx, rm, sm = _draws(jax.random.key(5), jnp.asarray(mask), num_keys=k, epochs=E,
                       schedule=SCHEDULE, slots=n)
  assert idx.shape == (k, E, S, n) and sm.shape == (k, E, S)
  assert -(-n // B) != S and -(-capacity // B) != S  # neither the old count nor the capacity's
  np.testing.assert_array_equal(sm, np.ones_like(sm))
  sel = _selected(idx, rm, capacity)
  assert not sel[..., mask == 0].any()
  counts = sel[..., mask > 0].sum(0)  # [E, S, n]
  bad = [(c, e) for e, c in np.ndenumerate(counts) if not _within(c, k, Q)]
  assert not bad, bad
  _assert_binomial(sel.sum(-1).ravel(), n, Q)


def test_adding_a_row_changes_only_that_rows_draws():
  """The rate and the steps are public, so the shard with one more real row (rank n) runs the
  same steps and selects the same first n rows in each; only the new row's own memberships
  are added (slots enough for every row, so nothing is truncated)."""
  capacity, n = 16, 10
  small = jnp.asarray(np.arange(capacity) < n, jnp.float32)
  large = jnp.asarray(np.arange(capacity) < n + 1, jnp.float32)
  a = _draws(jax.random.key(6), small, num_keys=200, epochs=E, schedule=SCHEDULE,
             slots=capacity)
  b = _draws(jax.random.key(6), large, num_keys=200, epochs=E, schedule=SCHEDULE,
             slots=capacity)
  sa, sb = _selected(*a[:2], capacity), _selected(*b[:2], capacity)
  np.testing.assert_array_equal(sa[..., :n], sb[..., :n])
  np.testing.assert_array_equal(a[2], b[2])
  assert not sa[..., n].any() and sb[..., n].any()
  assert _within(int(sb[..., n].sum()), sb[..., n].size, Q)


def test_a_rate_of_one_takes_every_row_in_every_step():
  # N = 3 <= B = 5: q = 1 and S = 1. A shard of n = 3 rows (padded) takes them all; so does one
  # of 5 rows (more than N), in each of its S = 1 steps per epoch.
  schedule = sampling.public_schedule(3, 5)
  assert schedule == (1.0, 1)
  for mask, rows in (([1, 0, 1, 1], [0, 2, 3]), ([1, 1, 0, 1, 1, 1], [0, 1, 3, 4, 5])):
    mask = jnp.asarray(mask, jnp.float32)
    idx, rm, sm = _order(KEY, mask, epochs=3, schedule=schedule, max_batch_size=len(rows))
    assert idx.shape == (3, 1, len(rows))
    np.testing.assert_array_equal(sm, np.ones((3, 1)))
    for e in range(3):
      np.testing.assert_array_equal(
          np.sort(np.asarray(idx[e, 0])[np.asarray(rm[e, 0]) > 0]), rows)


def test_declared_steps_per_epoch_override_ceil_n_over_b():
  schedule = sampling.public_schedule(N, B, steps_per_epoch=7)
  idx, rm, sm = _order(KEY, MASK, epochs=E, schedule=schedule, max_batch_size=4)
  assert idx.shape == rm.shape == (E, 7, 4) and sm.shape == (E, 7)
  np.testing.assert_array_equal(sm, np.ones((E, 7)))
  # The first S steps are those of the default schedule (the keys are per epoch and step).
  default = _order(KEY, MASK, epochs=E, schedule=SCHEDULE, max_batch_size=4)
  np.testing.assert_array_equal(rm[:, :S], default[1])
  np.testing.assert_array_equal(np.where(np.asarray(rm[:, :S]) > 0, idx[:, :S], -1),
                                np.where(np.asarray(default[1]) > 0, default[0], -1))


# --- padding, truncation ----------------------------------------------------------------------


def test_padding_anywhere_leaves_the_real_rows_draws_alone():
  slots = 4  # P[more than 4 of 10 rows at q = 0.3] ~ 0.15: truncation is covered too
  unpadded = _order(KEY, jnp.ones(N), epochs=E, schedule=SCHEDULE, max_batch_size=slots)
  rng = np.random.default_rng(0)
  for capacity in (12, 17):
    real_rows = np.sort(rng.choice(capacity, N, replace=False))  # padding scattered
    mask = np.zeros(capacity, np.float32)
    mask[real_rows] = 1
    idx, rm, sm = _order(KEY, jnp.asarray(mask), epochs=E, schedule=SCHEDULE,
                         max_batch_size=slots)
    assert idx.shape == (E, S, slots)  # the schedule's steps, whatever the capacity
    rank = np.full(capacity, -1)
    rank[real_rows] = np.arange(N)
    live = np.asarray(rm) > 0
    np.testing.assert_array_equal(live, np.asarray(unpadded[1]) > 0)
    # Same rows (by rank), in the same slots.
    np.testing.assert_array_equal(np.where(live, rank[np.asarray(idx)], -1),
                                  np.where(live, np.asarray(unpadded[0]), -1))
    np.testing.assert_array_equal(sm, unpadded[2])
    np.testing.assert_array_equal(sm, np.ones((E, S)))
  assert (np.asarray(unpadded[1]).sum(-1) == slots).any()  # some step was truncated


def test_overflow_keeps_max_batch_size_rows_a_uniform_subset_in_random_order():
  # n = N = 20, B = 10 (q = 1/2, S = 2), 6 slots: most steps overflow. Draws do not depend on
  # the slot count, so the untruncated selection comes from the same keys with 20 slots.
  k, n, slots = 1500, 20, 6
  schedule = sampling.public_schedule(n, 10)
  mask = jnp.ones(n)
  full = _selected(*_draws(jax.random.key(2), mask, num_keys=k, epochs=1, schedule=schedule,
                           slots=n)[:2], n)
  idx, rm, _ = _draws(jax.random.key(2), mask, num_keys=k, epochs=1, schedule=schedule,
                      slots=slots)
  kept = _selected(idx, rm, n)
  sizes, kept_sizes = full.sum(-1), kept.sum(-1)
  np.testing.assert_array_equal(kept_sizes, np.minimum(sizes, slots))
  assert not (kept & ~full).any()
  np.testing.assert_array_equal(kept[sizes <= slots], full[sizes <= slots])
  # Given the selection S, each of its rows is kept with probability slots / |S|: per row,
  # the number of times it is kept is a sum of independent Bernoullis; compare by its z-score.
  over = sizes > slots
  assert over.sum() > 1000
  p_keep = np.where(over, slots / np.maximum(sizes, 1), 0.0)[..., None] * full
  kept_over = kept & over[..., None]
  z = (kept_over.sum((0, 1)) - p_keep.sum((0, 1))) / np.sqrt(
      (p_keep * (1 - p_keep)).sum((0, 1)))  # per step and row
  assert np.all(np.abs(z) < 5.5), z
  # The first slot holds each selected row with probability 1 / |S| (random packing order):
  # how often it holds the selected row of smallest index.
  first = np.asarray(idx)[..., 0]
  smallest = np.argmax(full, axis=-1)
  nonempty = sizes >= 2
  hits = (first == smallest)[nonempty].sum()
  p = 1.0 / sizes[nonempty]
  assert abs(hits - p.sum()) < 5.5 * np.sqrt((p * (1 - p)).sum())


# --- overflow maths ---------------------------------------------------------------------------


def test_overflow_probability_is_the_exact_binomial_tail_over_steps():
  n, q, b = 200, 0.05, 14
  sf = stats.binom.sf(b, n, q)
  assert sampling.overflow_probability(n, q, b, 1) == pytest.approx(sf, rel=1e-12)
  assert sampling.overflow_probability(n, q, b, 7) == pytest.approx(1 - (1 - sf) ** 7,
                                                                    rel=1e-12)
  # Tiny tails keep their digits (1 - (1 - p)^T ~ T p).
  tiny = stats.binom.sf(60, 1000, 0.01)
  assert 0 < tiny < 1e-20
  assert sampling.overflow_probability(1000, 0.01, 60, 100) == pytest.approx(100 * tiny,
                                                                              rel=1e-9)
  assert sampling.overflow_probability(n, q, n, 50) == 0.0
  assert sampling.overflow_probability(n, 1.0, n - 1, 3) == 1.0
  assert sampling.overflow_probability(n, q, b, 0) == 0.0


def test_overflow_probability_matches_monte_carlo():
  n, q, b, steps, trials = 50, 0.2, 13, 5, 20000
  rng = np.random.default_rng(3)
  hits = int((rng.binomial(n, q, size=(trials, steps)) > b).any(1).sum())
  p = sampling.overflow_probability(n, q, b, steps)
  assert 0.1 < p < 0.9
  assert _within(hits, trials, p)


def test_sampler_overflow_frequency_matches_overflow_probability(many):
  # The sampler's own batch sizes: each step overflows b = 4 slots as binom.sf says.
  k, sel, _ = many
  sizes = sel[:, 0].sum(-1)  # [k, S steps of epoch 0]
  p = sampling.overflow_probability(N, Q, 4, S)
  assert _within(int((sizes > 4).any(1).sum()), k, p)


def test_max_batch_size_is_minimal_and_monotone():
  for n, bs, steps, tol in ((1000, 50, 1000, 1e-12), (200, 20, 10, 1e-6), (60, 5, 300, 1e-9)):
    b = sampling.max_batch_size(n, bs, steps, tol)
    assert bs <= b < n
    assert sampling.overflow_probability(n, bs / n, b, steps) <= tol
    assert sampling.overflow_probability(n, bs / n, b - 1, steps) > tol
  base = sampling.max_batch_size(1000, 50, 1000)
  assert sampling.max_batch_size(1000, 50, 100000) >= base
  assert sampling.max_batch_size(1000, 50, 1000, overflow=1e-6) <= base
  assert sampling.max_batch_size(1000, 60, 1000) >= base
  sizes = [sampling.max_batch_size(1000, 50, 1000, overflow=t)
           for t in (1e-3, 1e-6, 1e-9, 1e-12, 1e-15)]
  assert sizes == sorted(sizes)
  assert sampling.max_batch_size(30, 40, 5) == 30  # q = 1: every row, every step
  assert sampling.max_batch_size(1, 1, 1) == 1


def test_max_batch_size_at_a_public_rate():
  """With `rate`, the slots hold a shard of n rows joining at the public q (not B / n)."""
  # rate None is rate min(B / n, 1).
  for n, bs, steps in ((1000, 50, 1000), (60, 5, 300), (30, 40, 5)):
    assert sampling.max_batch_size(n, bs, steps) == sampling.max_batch_size(
        n, bs, steps, rate=min(bs / n, 1.0))
  # Minimal at the given rate; a shard larger than the declared N = 50 (B = 5, q = 0.1).
  for n, rate, steps, tol in ((80, 0.1, 128, 1e-12), (200, 0.02, 10, 1e-6),
                              (1000, 0.05, 1000, 1e-9)):
    b = sampling.max_batch_size(n, 5, steps, tol, rate=rate)
    assert b < n
    assert sampling.overflow_probability(n, rate, b, steps) <= tol
    assert sampling.overflow_probability(n, rate, b - 1, steps) > tol
  # The batch size argument is unused once the rate is given.
  assert sampling.max_batch_size(80, 5, 128, rate=0.1) == sampling.max_batch_size(
      80, 40, 128, rate=0.1)
  # Monotone in the rate; rate 1 needs every row.
  sizes = [sampling.max_batch_size(400, 10, 240, rate=r) for r in (0.01, 0.025, 0.1, 0.5, 1.0)]
  assert sizes == sorted(sizes) and sizes[-1] == 400
  # The public rate of N = 50 on an 80-row shard needs more slots than 80's own B / n.
  assert sampling.max_batch_size(80, 5, 128, rate=5 / 50) > sampling.max_batch_size(80, 5, 128)
  for rate in (0.0, -0.1, 1 + 1e-9, math.nan):
    with pytest.raises(ValueError, match=re.escape(f'rate must be in (0, 1] (got {rate})')):
      sampling.max_batch_size(80, 5, 128, rate=rate)


def test_max_batch_size_is_the_fewest_slots_at_exact_ties_and_at_zero():
  # A tolerance equal to b's own overflow probability admits b (<=), and not b - 1.
  n, bs, steps = 40, 6, 7
  for b in (6, 11, 17):
    tol = sampling.overflow_probability(n, bs / n, b, steps)
    assert 0 < tol < 1
    assert sampling.max_batch_size(n, bs, steps, tol) == b
    tol = sampling.overflow_probability(n, 0.3, b, steps)  # the same at a public rate
    assert 0 < tol < 1
    assert sampling.max_batch_size(n, bs, steps, tol, rate=0.3) == b
  # b = 0 is the fewest when P[some row joins] = 1 - 0.9^10 ~ 0.65 is tolerated.
  assert sampling.max_batch_size(10, 1, 1, 0.9) == 0
  assert sampling.max_batch_size(10, 1, 1, 0.6) == 1
  assert sampling.max_batch_size(10, 1, 1, 0.6, rate=0.1) == 1
  assert type(sampling.max_batch_size(10, 1, 1)) is int
  assert type(sampling.max_batch_size(10, 1, 1, rate=0.5)) is int


def test_overflow_probability_when_every_step_overflows():
  # rate 1 and fewer slots than rows: each step overflows surely (p = 1, log1p(-p) = -inf).
  for steps, want in ((0, 0.0), (1, 1.0), (4, 1.0)):
    got = sampling.overflow_probability(5, 1.0, 2, steps)
    assert type(got) is float and got == want, steps
  assert type(sampling.overflow_probability(5, 0.5, 2, 3)) is float


# --- the client protocol -------------------------------------------------------------------

CAP = 8


def _one_hot_loss(params, x, y, mask=None):
  """Sum over rows of w . x_i (x one-hot): the gradient is the sum of the rows' one-hots."""
  del y
  m = jnp.ones(x.shape[0]) if mask is None else mask
  return jnp.sum(m * (x @ params['w'])) + 0.0 * params['b']


def _sum_plus_one(key, per_example, mask):
  """Sum of the selected rows' gradients, plus 1 on `b`: counts every step that runs."""
  del key
  g = jax.tree_util.tree_map(lambda a: jnp.tensordot(mask, a, axes=1), per_example)
  return {'w': g['w'], 'b': g['b'] + 1.0}


# Declared N = 6, B = 2: q = 1/3 and S = 3 steps an epoch, on every client.
SUM_SCHEDULE = sampling.public_schedule(6, 2)
SUM_HOOKS = client.ClientHooks(grad=_sum_plus_one, batches=sampling.poisson_sampler(
    4, num_examples=6, batch_size=2))


def _one_hot_setup():
  x = jnp.eye(CAP)
  return {'w': jnp.zeros(CAP), 'b': jnp.zeros(())}, x, jnp.zeros(CAP, jnp.int32)


def _linear_loss(params, x, y, mask=None):
  m = jnp.ones(x.shape[0]) if mask is None else mask
  return jnp.sum(m * (x @ params['w'] - y) ** 2) / jnp.maximum(jnp.sum(m), 1.0)


def test_sampler_carries_its_schedule_and_is_the_batch_order():
  sampler = sampling.poisson_sampler(4, num_examples=N, batch_size=B)
  assert sampler.schedule == SCHEDULE
  assert sampling.poisson_sampler(4, num_examples=N, batch_size=B,
                                  steps_per_epoch=9).schedule == (Q, 9)
  for got, want in zip(sampler(KEY, MASK, epochs=E, batch_size=B),
                       _order(KEY, MASK, epochs=E, schedule=SCHEDULE, max_batch_size=4)):
    np.testing.assert_array_equal(got, want)


def test_fedavg_with_the_sampler_equals_a_hand_built_masked_run():
  """Default gradient (mean loss over the kept rows), momentum: a hand loop over the order."""
  x = jax.random.normal(jax.random.key(1), (9, 5))
  y = jax.random.normal(jax.random.key(2), (9,))
  params = {'w': jnp.zeros(5)}
  loss_fn, opt = _linear_loss, MOMENTUM
  mask = jnp.asarray([1, 1, 1, 0, 1, 1, 1, 1, 0], jnp.float32)
  # 7 real rows, declared N = 8, B = 1: q = 1/8 and S = 8 steps an epoch (not the shard's 7,
  # nor the capacity's 9); some steps are empty (and still move the momentum).
  sampler = sampling.poisson_sampler(5, num_examples=8, batch_size=1)
  got = _fedavg(loss_fn, params, x, y, key=KEY, optimizer=opt, epochs=2, batch_size=1,
                mask=mask, hooks=client.ClientHooks(batches=sampler))
  idx, rm, sm = _order(client.batches_key(KEY), mask, epochs=2, schedule=sampler.schedule,
                       max_batch_size=5)
  assert idx.shape == (2, 8, 5)
  np.testing.assert_array_equal(sm, np.ones((2, 8)))
  assert (np.asarray(rm).sum(-1) == 0).any()

  @jax.jit
  def step(w, state, rows, real):
    updates, state = opt.update(jax.grad(loss_fn)(w, x[rows], y[rows], real), state, w)
    return jax.tree_util.tree_map(jnp.add, w, updates), state

  w, state = params, opt.init(params)
  for e in range(2):
    for j in range(idx.shape[1]):
      w, state = step(w, state, idx[e, j], rm[e, j])
  chex.assert_trees_all_close(got, w, rtol=1e-5, atol=1e-6)


def _noisy_sum(key, per_example, mask):
  # DP-SGD-like: sum over the kept rows plus noise from the step's grad key.
  def one(i, g):
    s = jnp.tensordot(mask, g, axes=1)
    return s / 2.0 + 0.01 * jax.random.normal(jax.random.fold_in(key, i), s.shape)
  leaves, tree = jax.tree_util.tree_flatten(per_example)
  return jax.tree_util.tree_unflatten(tree, [one(i, g) for i, g in enumerate(leaves)])


def test_sampler_without_a_mask_uses_the_all_ones_mask():
  x = jax.random.normal(jax.random.key(4), (7, 5))
  y = jax.random.normal(jax.random.key(5), (7,))
  params = {'w': jnp.zeros(5)}
  hooks = client.ClientHooks(grad=_noisy_sum, batches=sampling.poisson_sampler(
      4, num_examples=7, batch_size=2))
  kw = dict(key=KEY, optimizer=ADAM, epochs=2, batch_size=2, hooks=hooks)
  plain = _fedavg(_linear_loss, params, x, y, **kw)
  chex.assert_trees_all_equal(plain, _fedavg(_linear_loss, params, x, y, mask=jnp.ones(7),
                                             **kw))
  # The sampler's key is its own: another key draws other batches and trains differently.
  other = _fedavg(_linear_loss, params, x, y, **{**kw, 'key': jax.random.key(9)})
  assert not np.allclose(plain['w'], other['w'])


def test_fedavg_trains_on_exactly_the_sampled_rows_and_runs_empty_steps_vmapped():
  """Clients vmapped: -w counts each row's sampled steps, -b the steps that ran: E S = 9 on
  every client, whatever its real row count (6, 8 or 3)."""
  params, x, y = _one_hot_setup()
  masks = jnp.asarray([[1, 1, 0, 1, 1, 0, 1, 1]] * 4 +  # n = 6 = N
                      [[1] * 8, [0, 0, 1, 1, 1, 0, 0, 0]], jnp.float32)  # n = 8, n = 3
  keys = jax.random.split(jax.random.key(7), masks.shape[0])

  def train(key, mask):
    return local.fedavg(_one_hot_loss, params, x, y, key=key, mask=mask, hooks=SUM_HOOKS,
                        optimizer=SGD, epochs=3, batch_size=2)

  stacked = jax.jit(jax.vmap(train))(keys, masks)
  empty_seen = False
  for i in range(masks.shape[0]):  # each client trained on its own draws
    idx, rm, sm = _order(client.batches_key(keys[i]), masks[i], epochs=3,
                         schedule=SUM_SCHEDULE, max_batch_size=4)
    np.testing.assert_array_equal(-np.asarray(stacked['w'][i]),
                                  _selected(idx, rm, CAP).sum((0, 1)))
    # Every step of the schedule ran, empty or not (SGD with lr 1 moves b by -1 per step).
    assert float(-stacked['b'][i]) == float(np.asarray(sm).sum()) == 3 * 3
    empty_seen |= bool((np.asarray(rm).sum(-1) == 0).any())
  assert empty_seen  # P[empty step] = (2/3)^6 ~ 0.09 for the first four clients' 36 steps
  # The order itself: eager and jitted are identical.
  eager = sampling.poisson_batch_order(KEY, MASK, epochs=E, schedule=SCHEDULE,
                                       max_batch_size=4)
  jitted = _order(KEY, MASK, epochs=E, schedule=SCHEDULE, max_batch_size=4)
  for got, want in zip(eager, jitted):
    np.testing.assert_array_equal(got, want)


def test_hooks_identity_and_combine_carry_one_sampler():
  sampler = sampling.poisson_sampler(4, num_examples=N, batch_size=B)
  hooks = client.ClientHooks(batches=sampler)
  assert not client.is_identity(hooks) and client.is_identity(client.ClientHooks())
  dp_sgd = defenses.make('dp_sgd', clip_norm=1.0, noise_multiplier=1.0)
  both = defenses.combine(dp_sgd, hooks)
  assert both.batches is sampler and both.grad is dp_sgd.grad
  assert defenses.combine(dp_sgd).batches is None
  with pytest.raises(ValueError, match='batches'):
    defenses.combine(hooks, client.ClientHooks(batches=sampling.poisson_sampler(
        5, num_examples=N, batch_size=B)))
  # At most one `report` hook too: two public counts would contradict each other.
  dp_poisson = defenses.make('dp_sgd', clip_norm=1.0, noise_multiplier=1.0, sampling='poisson',
                             batch_size=B, num_examples=N)
  assert defenses.combine(dp_poisson, client.ClientHooks()).report is dp_poisson.report
  with pytest.raises(ValueError, match='report'):
    defenses.combine(dp_poisson, client.ClientHooks(report=client.report_public(1.0)))
  # The sampler's key is a salt of its own.
  k = jax.random.key(3)
  assert client.BATCHES_SALT not in (client.STEP_SALT, client.DATA_SALT, client.UPLOAD_SALT)
  assert not np.array_equal(jax.random.key_data(client.batches_key(k)),
                            jax.random.key_data(client.upload_key(k)))


# --- the documented draws, limits and messages (fast: a few eager calls on tiny shards) -------


def _reference_order(key, mask, *, epochs, schedule, max_batch_size):
  """The module docstring's draws, row by row in Python, independently of the vectorised code.

  Returns:
    ({(e, j): kept rows in slot order}, step_masks [E, S]).
  """
  mask = np.asarray(mask)
  real_rows = np.flatnonzero(mask > 0)
  # q rounded to float32 as the sampler's float32 comparison does (u is exact in both).
  q = float(np.float32(schedule.rate))
  steps = schedule.steps_per_epoch  # the schedule's, all real, whatever the shard
  kept = {}
  for e in range(epochs):
    for j in range(steps):
      k_ej = jax.random.fold_in(jax.random.fold_in(key, e), j)
      chosen = []
      for r, row in enumerate(real_rows):  # r: the row's rank among the real rows
        w = np.asarray(jax.random.bits(jax.random.fold_in(k_ej, r), (2,), jnp.uint32))
        if (int(w[0]) >> 8) / 2.0 ** 24 < q:
          chosen.append((int(w[1]), int(row)))  # priority, then index
      kept[e, j] = [row for _, row in sorted(chosen)][:max_batch_size]
  return kept, np.ones((epochs, steps), np.float32)


# capacity 9, n = 6. Declared N = 6, B = 2: q = 1/3, S = 3; slots 2 (truncating) and 10
# (> capacity). N = 12: q = 1/6 and S = 6 steps, more than the shard's ceil(6 / 2) = 3; N = 4:
# q = 1/2 and S = 2, fewer; declared S = 5. A single real row with N = B = 1 (q = 1: it joins
# its one step every epoch); q = 1/2 with a key (found by a search over 2^24 seeds) whose rank-0
# draw in epoch 0, step 0 is u = 1/2 exactly, which must not join (u < q).
PADDED = jnp.asarray([0, 1, 1, 1, 0, 1, 1, 1, 0], jnp.float32)
TIE_SEED = 14566009
P = sampling.public_schedule
ORDER_CASES = {  # case: mask, arguments, seed
    'truncating': (PADDED, dict(epochs=2, schedule=P(6, 2), max_batch_size=2), 11),
    'more_slots_than_rows': (PADDED, dict(epochs=1, schedule=P(6, 2), max_batch_size=10), 11),
    'shard_smaller_than_declared': (PADDED, dict(epochs=2, schedule=P(12, 2), max_batch_size=3),
                                    12),
    'shard_larger_than_declared': (PADDED, dict(epochs=2, schedule=P(4, 2), max_batch_size=6),
                                   13),
    'declared_steps': (PADDED, dict(epochs=1, schedule=P(6, 2, 5), max_batch_size=4), 14),
    'one_row': (jnp.asarray([0, 1, 0], jnp.float32), dict(epochs=3, schedule=P(1, 1),
                                                          max_batch_size=1), 11),
    'u_equals_q': (jnp.ones(2), dict(epochs=1, schedule=P(2, 1), max_batch_size=2), TIE_SEED),
}


@pytest.mark.parametrize('case', list(ORDER_CASES))
def test_order_is_the_documented_draw(case):
  mask, kw, seed = ORDER_CASES[case]
  key = jax.random.key(seed)
  idx, rm, sm = sampling.poisson_batch_order(key, mask, **kw)
  kept, step_masks = _reference_order(key, mask, **kw)
  steps = kw['schedule'].steps_per_epoch
  assert idx.shape == rm.shape == (kw['epochs'], steps, kw['max_batch_size'])
  assert (idx.dtype, rm.dtype, sm.dtype) == (jnp.int32, jnp.float32, jnp.float32)
  np.testing.assert_array_equal(sm, step_masks)
  idx, rm = np.asarray(idx), np.asarray(rm)
  assert ((0 <= idx) & (idx < mask.shape[0])).all()  # empty slots hold some row too
  for (e, j), rows in kept.items():
    size = len(rows)
    np.testing.assert_array_equal(rm[e, j], np.arange(kw['max_batch_size']) < size)
    assert list(idx[e, j, :size]) == rows, (e, j)
  if case == 'truncating':  # the case exercises what it is named for: some step truncates
    full, _ = _reference_order(key, mask, **{**kw, 'max_batch_size': mask.shape[0]})
    assert any(len(r) > 2 for r in full.values())
    sampler = sampling.poisson_sampler(2, num_examples=6, batch_size=2)
    for got, want in zip(sampler(key, mask, epochs=2, batch_size=2), (idx, rm, sm)):
      np.testing.assert_array_equal(got, want)
  if case == 'one_row':
    np.testing.assert_array_equal(rm[:, 0, 0], [1, 1, 1])
  if case == 'u_equals_q':
    k_00 = jax.random.fold_in(jax.random.fold_in(key, 0), 0)
    w = jax.random.bits(jax.random.fold_in(k_00, 0), (2,), jnp.uint32)
    assert int(w[0]) >> 8 == 2 ** 23  # u = 1/2 = q
    assert 0 not in kept[0, 0]


def test_argument_limits_and_messages():
  for kw, message in ((dict(epochs=0, schedule=SCHEDULE, max_batch_size=2),
                       'epochs must be >= 1 (got 0)'),
                      (dict(epochs=1, schedule=SCHEDULE, max_batch_size=0),
                       'max_batch_size must be >= 1 (got 0)')):
    with pytest.raises(ValueError, match=f'^{re.escape(message)}$'):
      sampling.poisson_batch_order(KEY, MASK, **kw)
  # A hand-built schedule outside (0, 1] x [1, inf) is refused; rate 1 and one step are not.
  for schedule in (sampling.Schedule(0.0, 3), sampling.Schedule(1 + 1e-9, 3),
                   sampling.Schedule(-0.5, 3), sampling.Schedule(math.nan, 3),
                   sampling.Schedule(0.5, 0)):
    with pytest.raises(ValueError, match=re.escape(
        f'schedule must have a rate in (0, 1] and steps >= 1 (got {schedule})')):
      sampling.poisson_batch_order(KEY, MASK, epochs=1, schedule=schedule, max_batch_size=2)
  idx, _, sm = sampling.poisson_batch_order(KEY, MASK, epochs=1,
                                            schedule=sampling.Schedule(1.0, 1), max_batch_size=2)
  assert idx.shape == (1, 1, 2) and sm.shape == (1, 1)
  # public_schedule.
  for args, message in (((0, 2), '(got 0, 2)'), ((5, 0), '(got 5, 0)')):
    with pytest.raises(ValueError, match=re.escape(
        'num_examples and batch_size must be >= 1 ' + message)):
      sampling.public_schedule(*args)
  with pytest.raises(ValueError, match=re.escape('steps_per_epoch must be >= 1 (got 0)')):
    sampling.public_schedule(5, 2, 0)
  assert sampling.public_schedule(1, 1, 1) == (1.0, 1)
  # poisson_sampler.
  assert callable(sampling.poisson_sampler(1, num_examples=1, batch_size=1))
  with pytest.raises(ValueError, match=re.escape('max_batch_size must be >= 1 (got 0)')):
    sampling.poisson_sampler(0, num_examples=N, batch_size=B)
  with pytest.raises(ValueError, match=re.escape('num_examples and batch_size must be >= 1')):
    sampling.poisson_sampler(2, num_examples=0, batch_size=B)
  with pytest.raises(TypeError):  # the schedule's record count and B are keyword-only
    sampling.poisson_sampler(2, N, B)  # pylint: disable=too-many-function-args
  # overflow_probability: every limit accepted, just outside refused with its message.
  assert sampling.overflow_probability(0, 0.0, 0, 0) == 0.0
  assert sampling.overflow_probability(0, 1.0, 0, 5) == 0.0  # no rows: no overflow
  for args, message in (((-1, 0.5, 3, 1), '(got -1, 3, 1)'), ((5, 0.5, -1, 1), '(got 5, -1, 1)'),
                        ((5, 0.5, 3, -1), '(got 5, 3, -1)')):
    with pytest.raises(ValueError, match=re.escape(
        'num_examples, max_batch_size and steps must be >= 0 ' + message)):
      sampling.overflow_probability(*args)
  for rate in (-1e-9, 1 + 1e-9, math.nan):
    with pytest.raises(ValueError, match=re.escape(f'rate must be in [0, 1] (got {rate})')):
      sampling.overflow_probability(5, rate, 3, 1)
  # max_batch_size: the same.
  assert sampling.max_batch_size(10, 2, 3, overflow=0.0) == 10  # only b = n never overflows
  assert sampling.max_batch_size(10, 2, 3, overflow=0.0, rate=0.5) == 10
  for args, message in (((0, 2, 1), '(got 0, 2, 1)'), ((5, 0, 1), '(got 5, 0, 1)'),
                        ((5, 2, 0), '(got 5, 2, 0)')):
    with pytest.raises(ValueError, match=re.escape(
        'num_examples, batch_size and steps must be >= 1 ' + message)):
      sampling.max_batch_size(*args)
  for overflow in (-1e-9, 1.0, math.nan, math.inf):
    with pytest.raises(ValueError, match=re.escape(f'overflow must be in [0, 1) (got {overflow})')):
      sampling.max_batch_size(5, 2, 1, overflow)


def test_a_sampler_refuses_another_batch_size():
  """The schedule's rate is B / N for the B it was built with: a client protocol asking for
  another batch size is an error, eagerly and through `local.fedavg` (at trace time)."""
  sampler = sampling.poisson_sampler(4, num_examples=N, batch_size=B)
  for other in (B - 1, B + 1, 2 * B):
    with pytest.raises(ValueError, match=re.escape(
        f'the Poisson sampler was built for batch size {B} (got {other})')):
      sampler(KEY, MASK, epochs=1, batch_size=other)
  sampler(KEY, MASK, epochs=1, batch_size=np.int64(B))  # the same B, as another int type
  x = jax.random.normal(jax.random.key(4), (13, 5))
  y = jnp.zeros(13)
  with pytest.raises(ValueError, match=re.escape(
      f'the Poisson sampler was built for batch size {B} (got {B + 1})')):
    local.fedavg(_linear_loss, {'w': jnp.zeros(5)}, x, y, key=KEY, optimizer=SGD, epochs=1,
                 batch_size=B + 1, mask=MASK, hooks=client.ClientHooks(batches=sampler))


# --- the side channel the public schedule closes ----------------------------------------------
# Were the rate and the number of steps taken from the shard's private row count n (q = B / n,
# ceil(n / B) steps an epoch), one record more where n is a multiple of B would add a whole
# noisy step, which the upload's norm shows. `training_audit_runs.data_dependent_batches`
# plants that old sampler: the test below tells the two worlds apart with it, and cannot with
# the defense experiments build.

# Declared (public) N = 80 records and B = 8: q = 0.1, S = 10. Both shards are padded to 88
# rows (the plant then has ceil(88 / 8) = 11 steps, 10 or 11 of them live).
SIDE_N, SIDE_B, SIDE_CAPACITY = 80, 8, 88
SIDE_DIM, SIDE_CLASSES = 20, 10  # logistic regression: 210 parameters
SIDE_TRIALS = 2000  # independent client keys per world
NOT_REJECTED, REJECTED = 1e-3, 1e-6
SIDE_SETTING = registry.Setting(num_classes=SIDE_CLASSES, batch_size=SIDE_B,
                                num_examples=SIDE_N, epochs=1, rounds=1,
                                max_examples=SIDE_N + 1)


def _side_mask(n):
  return jnp.asarray(np.arange(SIDE_CAPACITY) < n, jnp.float32)


@functools.partial(jax.jit, static_argnames=('loss_fn', 'hooks'))
def _squared_norms(loss_fn, hooks, params, x, y, keys, masks):
  """||upload||^2 of `local.client_update` for each (key, mask), vmapped."""
  def one(key, mask):
    upload, _ = local.client_update(loss_fn, params, x, y, key=key, hooks=hooks, mask=mask,
                                    optimizer=optimizers.make('sgd', 1.0), epochs=1,
                                    batch_size=SIDE_B)
    return sum(jnp.sum(leaf ** 2) for leaf in jax.tree_util.tree_leaves(upload))
  return jax.vmap(one)(keys, masks)


def test_upload_norm_at_n_and_n_plus_one_rows_cannot_be_told_apart():
  """DP-SGD (C = 1, z = 1) as the training audit builds it (`configured.sweep_point`), Poisson
  on the public schedule of the declared N = 80, B = 8 (q = 0.1, S = 10 steps): 2,000 clients
  of n = 80 real rows and 2,000 of n + 1 = 81 (independent keys, one fixed seed; a logistic
  regression on 20 Gaussian features and random labels, SGD at rate 1, one epoch), and the two
  samples of ||upload||^2 compared by a two-sample Kolmogorov-Smirnov test.

  - Public schedule: both shards run the same 10 steps at rate 0.1, and (the draws being keyed
    by rank) the same batches of the first 80 rows; the worlds differ by one record that joins
    each step with probability 0.1 and moves the step's gradient by at most C / B = 1/8, next
    to noise of norm ~ z C sqrt(210) / B ~ 1.8 a step. The test must not reject at 1e-3.
  - The planted data-dependent sampler (rate B / n, ceil(n / B) live steps): the 81-row shard
    runs 11 noisy steps instead of 10, which raises E||upload||^2 by ~10%, about one standard
    deviation of a single upload; the same test must reject at 1e-6.

  Why neither threshold flakes: the seed is fixed, so the outcome is deterministic, and neither
  outcome rests on a lucky seed. The plant's effect is so large that at 2,000 trials a world
  its p-value is ~1e-130 (at 200 trials still ~1e-15). Without the plant the worlds are so
  close that the p-value is distributed as under the null (uniform; 1e-3 is crossed with
  probability ~1e-3 for an arbitrary seed): a paired run (the same 20,000 keys at n and n + 1)
  puts the extra record's effect on E||upload||^2 at -0.0015 +- 0.0009, 5e-4 of the upload's
  standard deviation (~3.1), far below the standard error of a difference of means at 2,000
  samples a world (~0.1).
  """
  c = configured.sweep_point('dp_sgd', 1.0, SIDE_SETTING, experiment='training_audit',
                             prefix='t', fixed={'clip_norm': 1.0, 'sampling': 'poisson'})
  hooks = c.hooks
  # The schedule is public: configuration, the same for every shard.
  assert hooks.batches.schedule == sampling.Schedule(rate=0.1, steps_per_epoch=10)
  assert c.metrics['noise_multiplier'] == 1.0
  assert (c.metrics['dp_public_examples'], c.metrics['dp_steps_per_epoch']) == (SIDE_N, 10)
  slots = c.declaration.max_batch_size
  assert slots == registry.poisson_max_batch(SIDE_SETTING)  # sized for the 81-row shard too
  planted = hooks._replace(batches=training_audit_runs.data_dependent_batches(slots))

  # The step counts behind the effect: the schedule's 10 at both sizes, the plant's 10 and 11.
  for n in (SIDE_N, SIDE_N + 1):
    mask = _side_mask(n)
    assert float(hooks.batches(KEY, mask, epochs=1, batch_size=SIDE_B)[2].sum()) == 10
    assert float(planted.batches(KEY, mask, epochs=1, batch_size=SIDE_B)[2].sum()) == -(
        -n // SIDE_B)

  model = models.MLP(hidden=(), num_classes=SIDE_CLASSES)
  x = jax.random.normal(jax.random.key(1), (SIDE_CAPACITY, SIDE_DIM))
  y = jax.random.randint(jax.random.key(2), (SIDE_CAPACITY,), 0, SIDE_CLASSES)
  params = model.init(jax.random.key(3), x)
  loss_fn = fl.make_loss_fn(model.apply)
  keys = jax.random.split(jax.random.key(4), 2 * SIDE_TRIALS)  # independent: no pairing
  masks = jnp.concatenate([jnp.broadcast_to(_side_mask(n), (SIDE_TRIALS, SIDE_CAPACITY))
                           for n in (SIDE_N, SIDE_N + 1)])

  def worlds(h):
    norms = np.asarray(_squared_norms(loss_fn, h, params, x, y, keys, masks))
    assert np.isfinite(norms).all()
    return norms[:SIDE_TRIALS], norms[SIDE_TRIALS:]

  public_n, public_n1 = worlds(hooks)
  planted_n, planted_n1 = worlds(planted)
  public_p = stats.ks_2samp(public_n, public_n1).pvalue
  planted_p = stats.ks_2samp(planted_n, planted_n1).pvalue
  assert public_p > NOT_REJECTED, public_p
  assert planted_p < REJECTED, planted_p
  # At n = N the plant's rate and live steps are the schedule's: the same draws, the same
  # uploads. Only the extra record's world differs, and by a whole step's noise.
  np.testing.assert_allclose(planted_n, public_n, rtol=1e-5)
  assert planted_n1.mean() > 1.05 * planted_n.mean()
