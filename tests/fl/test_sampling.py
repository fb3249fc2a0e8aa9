"""Poisson minibatches: inclusion law, padding invariance, truncation, overflow maths, fedavg."""

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
from fl_privacy.fl import client
from fl_privacy.fl import local
from fl_privacy.fl import optimizers
from fl_privacy.fl import sampling

KEY = jax.random.key(0)
LEVEL = 1 - 1e-6  # coverage of each binomial interval: a fixed seed, many cells, no flakes
# 10 real rows among 13, padding in three places; B = 3 gives q = 0.3 and 4 real steps of 5.
MASK = jnp.asarray([0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1], jnp.float32)
REAL = np.flatnonzero(np.asarray(MASK))
N, B, E = 10, 3, 2
Q = B / N


@functools.partial(jax.jit, static_argnames=('num_keys', 'epochs', 'batch_size', 'slots'))
def _draws(seed_key, mask, *, num_keys, epochs, batch_size, slots):
  keys = jax.random.split(seed_key, num_keys)
  return jax.vmap(lambda k: sampling.poisson_batch_order(
      k, mask, epochs=epochs, batch_size=batch_size, max_batch_size=slots))(keys)


# Jitted once per shape: eager calls compile op by op, which is most of a test's time.
_order = jax.jit(sampling.poisson_batch_order,
                 static_argnames=('epochs', 'batch_size', 'max_batch_size'))
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
  idx, rm, sm = _draws(jax.random.key(1), MASK, num_keys=k, epochs=E, batch_size=B, slots=N)
  return k, _selected(idx, rm, MASK.shape[0]), np.asarray(sm)


def test_shapes_steps_and_padding_rows_never_selected(many):
  k, sel, sm = many
  steps = -(-13 // B)
  assert sel.shape == (k, E, steps, 13) and sm.shape == (k, E, steps)
  np.testing.assert_array_equal(sm, np.broadcast_to([1, 1, 1, 1, 0], sm.shape))
  assert not sel[..., np.asarray(MASK) == 0].any()
  assert not sel[:, :, 4:].any()  # the padding step is empty


def test_each_real_row_joins_each_real_step_with_probability_q(many):
  k, sel, _ = many
  counts = sel[:, :, :4][..., REAL].sum(0)  # [E, 4, n]
  bad = [(c, e) for e, c in np.ndenumerate(counts) if not _within(c, k, Q)]
  assert not bad, f'inclusion counts outside {stats.binom.interval(LEVEL, k, Q)}: {bad}'


def test_rows_and_steps_are_pairwise_independent(many):
  k, sel, _ = many
  real = sel[:, :, :4][..., REAL].reshape(k, E * 4, N)  # [k, 8 steps, n rows]
  pairs = []
  for i in range(N):  # every pair of rows in the same step
    for j in range(i + 1, N):
      pairs.append(int((real[:, 0, i] & real[:, 0, j]).sum()))
  for s in range(E * 4 - 1):  # the same row in consecutive steps (across the epoch too)
    pairs.append(int((real[:, s, 0] & real[:, s + 1, 0]).sum()))
    pairs.append(int((real[:, s, 5] & real[:, s + 1, 5]).sum()))
  bad = [c for c in pairs if not _within(c, k, Q * Q)]
  assert not bad, f'joint counts outside {stats.binom.interval(LEVEL, k, Q * Q)}: {bad}'


def test_batch_sizes_are_binomial(many):
  k, sel, _ = many
  sizes = sel[:, :, :4].sum(-1).ravel()  # k * 8 steps, independent
  pmf = stats.binom.pmf(np.arange(N + 1), N, Q)
  observed = np.bincount(sizes, minlength=N + 1).astype(float)
  # Merge the upper tail into one bin so that every expected count is >= 5.
  expected = pmf * sizes.size
  cut = int(np.flatnonzero(expected >= 5)[-1])
  obs = np.append(observed[:cut], observed[cut:].sum())
  exp = np.append(expected[:cut], expected[cut:].sum())
  assert stats.chisquare(obs, exp).pvalue > 1e-6
  # Mean within 5 standard errors of n q.
  assert abs(sizes.mean() - N * Q) < 5 * np.sqrt(N * Q * (1 - Q) / sizes.size)


def test_padding_anywhere_leaves_the_real_rows_draws_alone():
  slots = 4  # P[more than 4 of 10 rows at q = 0.3] ~ 0.15: truncation is covered too
  unpadded = _order(KEY, jnp.ones(N), epochs=E, batch_size=B, max_batch_size=slots)
  rng = np.random.default_rng(0)
  for capacity in (12, 17):
    real_rows = np.sort(rng.choice(capacity, N, replace=False))  # padding scattered
    mask = np.zeros(capacity, np.float32)
    mask[real_rows] = 1
    idx, rm, sm = _order(KEY, jnp.asarray(mask), epochs=E, batch_size=B,
                         max_batch_size=slots)
    assert idx.shape == (E, -(-capacity // B), slots)
    rank = np.full(capacity, -1)
    rank[real_rows] = np.arange(N)
    live = np.asarray(rm[:, :4]) > 0
    np.testing.assert_array_equal(live, np.asarray(unpadded[1]) > 0)
    # Same rows (by rank), in the same slots.
    np.testing.assert_array_equal(np.where(live, rank[np.asarray(idx[:, :4])], -1),
                                  np.where(live, np.asarray(unpadded[0]), -1))
    np.testing.assert_array_equal(sm[:, :4], unpadded[2])
    assert not np.asarray(rm[:, 4:]).any() and not np.asarray(sm[:, 4:]).any()
  assert (np.asarray(unpadded[1]).sum(-1) == slots).any()  # some step was truncated


def test_overflow_keeps_max_batch_size_rows_a_uniform_subset_in_random_order():
  # n = 20, B = 10 (q = 1/2), 6 slots: most steps overflow. Draws do not depend on the slot
  # count, so the untruncated selection comes from the same keys with 20 slots.
  k, n, slots = 1500, 20, 6
  mask = jnp.ones(n)
  full = _selected(*_draws(jax.random.key(2), mask, num_keys=k, epochs=1, batch_size=10,
                           slots=n)[:2], n)
  idx, rm, _ = _draws(jax.random.key(2), mask, num_keys=k, epochs=1, batch_size=10,
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
      (p_keep * (1 - p_keep)).sum((0, 1)))
  assert np.all(np.abs(z) < 5.5), z
  # The first slot holds each selected row with probability 1 / |S| (random packing order):
  # how often it holds the selected row of smallest index.
  first = np.asarray(idx)[..., 0]
  smallest = np.argmax(full, axis=-1)
  nonempty = sizes >= 2
  hits = (first == smallest)[nonempty].sum()
  p = 1.0 / sizes[nonempty]
  assert abs(hits - p.sum()) < 5.5 * np.sqrt((p * (1 - p)).sum())


def test_small_shard_takes_every_row_in_its_one_step():
  mask = jnp.asarray([1, 0, 1, 1], jnp.float32)
  idx, rm, sm = _order(KEY, mask, epochs=3, batch_size=5, max_batch_size=4)
  assert idx.shape == (3, 1, 4)
  np.testing.assert_array_equal(sm, np.ones((3, 1)))
  for e in range(3):
    np.testing.assert_array_equal(np.sort(np.asarray(idx[e, 0])[np.asarray(rm[e, 0]) > 0]),
                                  [0, 2, 3])


def test_bad_arguments_raise():
  for kw in (dict(epochs=0, batch_size=2, max_batch_size=2),
             dict(epochs=1, batch_size=0, max_batch_size=2),
             dict(epochs=1, batch_size=2, max_batch_size=0)):
    with pytest.raises(ValueError):
      sampling.poisson_batch_order(KEY, MASK, **kw)
  with pytest.raises(ValueError):
    sampling.poisson_sampler(0)
  with pytest.raises(ValueError):
    sampling.overflow_probability(10, 1.5, 3, 1)
  with pytest.raises(ValueError):
    sampling.max_batch_size(10, 2, 0)
  with pytest.raises(ValueError):
    sampling.max_batch_size(10, 2, 5, overflow=1.0)


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
  # The sampler's own batch sizes: each real step overflows b = 4 slots as binom.sf says.
  k, sel, _ = many
  sizes = sel[:, 0, :4].sum(-1)  # [k, 4 steps of epoch 0]
  p = sampling.overflow_probability(N, Q, 4, 4)
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


SUM_HOOKS = client.ClientHooks(grad=_sum_plus_one, batches=sampling.poisson_sampler(4))


def _one_hot_setup():
  x = jnp.eye(CAP)
  return {'w': jnp.zeros(CAP), 'b': jnp.zeros(())}, x, jnp.zeros(CAP, jnp.int32)


def _linear_loss(params, x, y, mask=None):
  m = jnp.ones(x.shape[0]) if mask is None else mask
  return jnp.sum(m * (x @ params['w'] - y) ** 2) / jnp.maximum(jnp.sum(m), 1.0)


def test_fedavg_with_the_sampler_equals_a_hand_built_masked_run():
  """Default gradient (mean loss over the kept rows), momentum: a hand loop over the order."""
  x = jax.random.normal(jax.random.key(1), (9, 5))
  y = jax.random.normal(jax.random.key(2), (9,))
  params = {'w': jnp.zeros(5)}
  loss_fn, opt = _linear_loss, MOMENTUM
  mask = jnp.asarray([1, 1, 1, 0, 1, 1, 1, 1, 0], jnp.float32)
  # B = 1: q = 1/7, so some real steps are empty (and still move the momentum).
  got = _fedavg(loss_fn, params, x, y, key=KEY, optimizer=opt, epochs=2, batch_size=1,
                mask=mask, hooks=client.ClientHooks(batches=sampling.poisson_sampler(5)))
  idx, rm, sm = _order(client.batches_key(KEY), mask, epochs=2, batch_size=1,
                       max_batch_size=5)
  assert ((np.asarray(rm).sum(-1) == 0) & (np.asarray(sm) > 0)).any()

  @jax.jit
  def step(w, state, rows, real):
    updates, state = opt.update(jax.grad(loss_fn)(w, x[rows], y[rows], real), state, w)
    return jax.tree_util.tree_map(jnp.add, w, updates), state

  w, state = params, opt.init(params)
  for e in range(2):
    for j in range(idx.shape[1]):
      if sm[e, j] > 0:
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
  hooks = client.ClientHooks(grad=_noisy_sum, batches=sampling.poisson_sampler(4))
  kw = dict(key=KEY, optimizer=ADAM, epochs=2, batch_size=2, hooks=hooks)
  plain = _fedavg(_linear_loss, params, x, y, **kw)
  chex.assert_trees_all_equal(plain, _fedavg(_linear_loss, params, x, y, mask=jnp.ones(7),
                                             **kw))
  # The sampler's key is its own: another key draws other batches and trains differently.
  other = _fedavg(_linear_loss, params, x, y, **{**kw, 'key': jax.random.key(9)})
  assert not np.allclose(plain['w'], other['w'])


def test_fedavg_trains_on_exactly_the_sampled_rows_and_runs_empty_real_steps_vmapped():
  """Clients vmapped: -w counts each row's sampled steps, -b the steps that ran."""
  params, x, y = _one_hot_setup()
  masks = jnp.asarray([[1, 1, 0, 1, 1, 0, 1, 1]] * 4 +  # n = 6, B = 2: q = 1/3, 3 steps
                      [[1] * 8, [0, 0, 1, 1, 1, 0, 0, 0]], jnp.float32)
  keys = jax.random.split(jax.random.key(7), masks.shape[0])

  def train(key, mask):
    return local.fedavg(_one_hot_loss, params, x, y, key=key, mask=mask, hooks=SUM_HOOKS,
                        optimizer=SGD, epochs=3, batch_size=2)

  stacked = jax.jit(jax.vmap(train))(keys, masks)
  empty_seen = False
  for i in range(masks.shape[0]):  # each client trained on its own draws
    idx, rm, sm = _order(client.batches_key(keys[i]), masks[i], epochs=3, batch_size=2,
                         max_batch_size=4)
    np.testing.assert_array_equal(-np.asarray(stacked['w'][i]),
                                  _selected(idx, rm, CAP).sum((0, 1)))
    # Every real step ran, empty or not (SGD with lr 1 moves b by -1 per step).
    n = int(masks[i].sum())
    assert float(-stacked['b'][i]) == float(np.asarray(sm).sum()) == 3 * -(-n // 2)
    empty_seen |= bool(((np.asarray(rm).sum(-1) == 0) & (np.asarray(sm) > 0)).any())
  assert empty_seen  # P[empty step] = (2/3)^6 ~ 0.09 for the first four clients' 36 steps
  # The order itself: eager and jitted are identical.
  eager = sampling.poisson_batch_order(KEY, MASK, epochs=E, batch_size=B, max_batch_size=4)
  jitted = _order(KEY, MASK, epochs=E, batch_size=B, max_batch_size=4)
  for got, want in zip(eager, jitted):
    np.testing.assert_array_equal(got, want)


def test_hooks_identity_and_combine_carry_one_sampler():
  sampler = sampling.poisson_sampler(4)
  hooks = client.ClientHooks(batches=sampler)
  assert not client.is_identity(hooks) and client.is_identity(client.ClientHooks())
  dp_sgd = defenses.make('dp_sgd', clip_norm=1.0, noise_multiplier=1.0)
  both = defenses.combine(dp_sgd, hooks)
  assert both.batches is sampler and both.grad is dp_sgd.grad
  assert defenses.combine(dp_sgd).batches is None
  with pytest.raises(ValueError, match='batches'):
    defenses.combine(hooks, client.ClientHooks(batches=sampling.poisson_sampler(5)))
  # The sampler's key is a salt of its own.
  k = jax.random.key(3)
  assert client.BATCHES_SALT not in (client.STEP_SALT, client.DATA_SALT, client.UPLOAD_SALT)
  assert not np.array_equal(jax.random.key_data(client.batches_key(k)),
                            jax.random.key_data(client.upload_key(k)))


# --- the documented draws, limits and messages (fast: a few eager calls on tiny shards) -------


def _reference_order(key, mask, *, epochs, batch_size, max_batch_size):
  """The module docstring's draws, row by row in Python, independently of the vectorised code.

  Returns:
    ({(e, j): kept rows in slot order}, step_masks [E, S]).
  """
  mask = np.asarray(mask)
  real_rows = np.flatnonzero(mask > 0)
  n = real_rows.size
  # q = min(B / n, 1) rounded to float32 as the sampler computes it (u is exact in both).
  q = min(float(np.float32(batch_size) / np.float32(max(n, 1))), 1.0)
  steps, real_steps = -(-mask.size // batch_size), -(-n // batch_size)
  kept, step_masks = {}, np.zeros((epochs, steps), np.float32)
  for e in range(epochs):
    for j in range(steps):
      k_ej = jax.random.fold_in(jax.random.fold_in(key, e), j)
      chosen = []
      if j < real_steps:
        step_masks[e, j] = 1.0
        for r, row in enumerate(real_rows):  # r: the row's rank among the real rows
          w = np.asarray(jax.random.bits(jax.random.fold_in(k_ej, r), (2,), jnp.uint32))
          if (int(w[0]) >> 8) / 2.0 ** 24 < q:
            chosen.append((int(w[1]), int(row)))  # priority, then index
      kept[e, j] = [row for _, row in sorted(chosen)][:max_batch_size]
  return kept, step_masks


# capacity 9, n = 6, B = 2: q = 1/3, 3 real steps of 5 (n / B whole, and (n + B - 1) / B not);
# slots 2 (truncating) and 10 (> capacity); a single real row with B = 1 (q = 1: it joins its
# one real step every epoch); q = 1/2 with a key (found by a search over 2^24 seeds) whose
# rank-0 draw in epoch 0, step 0 is u = 1/2 exactly, which must not join (u < q).
PADDED = jnp.asarray([0, 1, 1, 1, 0, 1, 1, 1, 0], jnp.float32)
TIE_SEED = 14566009
ORDER_CASES = {  # case: mask, arguments, seed
    'truncating': (PADDED, dict(epochs=2, batch_size=2, max_batch_size=2), 11),
    'more_slots_than_rows': (PADDED, dict(epochs=1, batch_size=2, max_batch_size=10), 11),
    'one_row': (jnp.asarray([0, 1, 0], jnp.float32), dict(epochs=3, batch_size=1,
                                                          max_batch_size=1), 11),
    'u_equals_q': (jnp.ones(2), dict(epochs=1, batch_size=1, max_batch_size=2), TIE_SEED),
}


@pytest.mark.parametrize('case', list(ORDER_CASES))
def test_order_is_the_documented_draw(case):
  mask, kw, seed = ORDER_CASES[case]
  key = jax.random.key(seed)
  idx, rm, sm = sampling.poisson_batch_order(key, mask, **kw)
  kept, step_masks = _reference_order(key, mask, **kw)
  steps = -(-mask.shape[0] // kw['batch_size'])
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
    sampler = sampling.poisson_sampler(2)
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
  for kw, message in ((dict(epochs=0, batch_size=2, max_batch_size=2),
                       'epochs must be >= 1 (got 0)'),
                      (dict(epochs=1, batch_size=0, max_batch_size=2),
                       'batch_size must be >= 1 (got 0)'),
                      (dict(epochs=1, batch_size=2, max_batch_size=0),
                       'max_batch_size must be >= 1 (got 0)')):
    with pytest.raises(ValueError, match=f'^{re.escape(message)}$'):
      sampling.poisson_batch_order(KEY, MASK, **kw)
  assert callable(sampling.poisson_sampler(1))
  with pytest.raises(ValueError, match=re.escape('max_batch_size must be >= 1 (got 0)')):
    sampling.poisson_sampler(0)
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
  for args, message in (((0, 2, 1), '(got 0, 2, 1)'), ((5, 0, 1), '(got 5, 0, 1)'),
                        ((5, 2, 0), '(got 5, 2, 0)')):
    with pytest.raises(ValueError, match=re.escape(
        'num_examples, batch_size and steps must be >= 1 ' + message)):
      sampling.max_batch_size(*args)
  for overflow in (-1e-9, 1.0, math.nan, math.inf):
    with pytest.raises(ValueError, match=re.escape(f'overflow must be in [0, 1) (got {overflow})')):
      sampling.max_batch_size(5, 2, 1, overflow)


def test_overflow_probability_when_every_step_overflows():
  # rate 1 and fewer slots than rows: each step overflows surely (p = 1, log1p(-p) = -inf).
  for steps, want in ((0, 0.0), (1, 1.0), (4, 1.0)):
    got = sampling.overflow_probability(5, 1.0, 2, steps)
    assert type(got) is float and got == want, steps
  assert type(sampling.overflow_probability(5, 0.5, 2, 3)) is float


def test_max_batch_size_is_the_fewest_slots_at_exact_ties_and_at_zero():
  # A tolerance equal to b's own overflow probability admits b (<=), and not b - 1.
  n, bs, steps = 40, 6, 7
  for b in (6, 11, 17):
    tol = sampling.overflow_probability(n, bs / n, b, steps)
    assert 0 < tol < 1
    assert sampling.max_batch_size(n, bs, steps, tol) == b
  # b = 0 is the fewest when P[some row joins] = 1 - 0.9^10 ~ 0.65 is tolerated.
  assert sampling.max_batch_size(10, 1, 1, 0.9) == 0
  assert sampling.max_batch_size(10, 1, 1, 0.6) == 1
  assert type(sampling.max_batch_size(10, 1, 1)) is int
