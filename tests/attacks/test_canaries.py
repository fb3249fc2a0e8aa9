"""Canaries inside the training that runs (`attacks.audit.canaries`, `fl.rounds.Injected`).

Every `canaries.train` call here shares one optimizer object (`OPT`) and one model: the
trainings are compiled once per static configuration (the optimizer is one of its keys), so
the tests that share a configuration share its program.

The statistics (counted bounds, the Gaussian fit, `audit`) moved to
`attacks.audit.canary_statistics` (re-exported by `canaries`). Those of their properties that
tests/attacks/test_canary_statistics.py tests (the counted bounds, the Gaussian fit's recovery
of mu, the verdict's family-wise level under the null) are tested there only; the others stay
here, called from `canary_statistics`.
"""

from __future__ import annotations

import math

import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats as sp_stats

from fl_privacy import models
from fl_privacy.attacks.audit import canaries
from fl_privacy.attacks.audit import canary_statistics
from fl_privacy.attacks.audit import canary_training
from fl_privacy.defenses import configured
from fl_privacy.defenses import dp
from fl_privacy.defenses import registry
from fl_privacy.eval import auditing
from fl_privacy.fl import client as client_lib
from fl_privacy.fl import local
from fl_privacy.fl import losses
from fl_privacy.fl import rounds
from fl_privacy.fl import sampling
from tests import decisions

DIM_IN, CLASSES = 6, 3
MODEL = models.MLP(hidden=(4,), num_classes=CLASSES)   # 43 parameters
OPT = optax.sgd(0.1)   # one object: a static argument of train's compiled programs
C = 1.0                # every clip norm here
CANARY_NORM = 2.0      # the canaries' norm, above the clip: the clip must act
# A KS test's p-value under its null is uniform: 1e-3 is the false alarm each such test allows.
P_MIN = 1e-3


def _model():
  params = MODEL.init(jax.random.key(0), jnp.zeros((1, DIM_IN)))
  return MODEL, params


def _ravel(p):
  return flatten_util.ravel_pytree(p)[0]


def _clients(k=3, n=8, seed=0):
  rng = np.random.default_rng(seed)
  return rounds.ClientData(x=rng.normal(size=(k, n, DIM_IN)).astype(np.float32),
                           y=rng.integers(0, CLASSES, (k, n)).astype(np.int32))


def _stack(trees):
  """Replicates stacked on a leading axis R (what `train` takes)."""
  return jax.tree_util.tree_map(lambda *a: np.stack([np.asarray(v) for v in a]), *trees)


def _run(model, params, clients, hooks, injected=None, participation=1.0, observe=None,
         reduce=None, init=None):
  return rounds.run(losses.make_loss_fn(model.apply), params, clients, key=jax.random.key(1),
                    num_rounds=3, optimizer=optax.sgd(0.1), epochs=1, batch_size=4,
                    hooks=hooks, participation=participation, injected=injected,
                    observe=observe, reduce=reduce, init=init)


# --------------------------------------------------------------------- the round loop ---


def test_injected_clients_reporting_no_examples_leave_the_training_unchanged():
  model, params = _model()
  flat, unravel = flatten_util.ravel_pytree(params)
  deltas = jax.vmap(unravel)(jnp.ones((5, flat.shape[0])))
  plain, _ = _run(model, params, _clients(), None)
  idle, _ = _run(model, params, _clients(), None,
                 injected=rounds.Injected(deltas=deltas, sizes=jnp.zeros(5)))
  for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(idle)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)


def test_injected_update_enters_the_weighted_mean_with_its_size():
  model, params = _model()
  flat, unravel = flatten_util.ravel_pytree(params)
  zero_clients = _clients()
  # Real clients with a learning rate of 0 upload zeros, so w_T - w_0 is the canaries' part.
  run = lambda inj: rounds.run(
      losses.make_loss_fn(model.apply), params, zero_clients, key=jax.random.key(1),
      num_rounds=2, optimizer=optax.sgd(0.0), epochs=1, batch_size=4, injected=inj)[0]
  v = np.zeros(flat.shape[0], np.float32)
  v[3] = 1.0
  inj = rounds.Injected(deltas=jax.vmap(unravel)(jnp.asarray(v[None])), sizes=jnp.asarray([8.0]))
  final = flatten_util.ravel_pytree(run(inj))[0]
  # The canary trains through the client protocol (`local.canary_loss`: one SGD step at rate 1
  # whose update is its delta). Weight 8 against 3 x 8: each round moves coordinate 3 by -1/4.
  np.testing.assert_allclose(np.asarray(final - flat)[3], -0.5, rtol=1e-6)
  np.testing.assert_allclose(np.delete(np.asarray(final - flat), 3), 0.0, atol=1e-7)


def test_injected_uploads_go_through_the_upload_hook_with_their_own_keys():
  model, params = _model()
  flat, unravel = flatten_util.ravel_pytree(params)
  j = 40   # orthonormal directions: at most the model's 43 coordinates
  dirs = canaries.directions(jax.random.key(2), j, flat.shape[0], 'random')
  world = canaries.coins(jax.random.key(3), j)
  inj = canaries.injected_clients(dirs, world, unravel, norm=2.0, relation='replace_one',
                                  size=8.0)
  hooks = client_lib.ClientHooks(upload=dp.update_dp_hook(1.0, 0.5))
  d = jnp.asarray(dirs)

  def observe(k, t, i, gp, upload):
    del k, t, gp
    return _ravel(upload) @ d[jnp.clip(i - 3, 0, j - 1)]

  def reduce(state, t, seen, part):
    del part
    return state.at[t].set(seen[3:])

  _, log = _run(model, params, _clients(), hooks, injected=inj, observe=observe,
                reduce=reduce, init=jnp.zeros((3, j)))
  seen = np.asarray(log.observed)
  sign = np.where(world, 1.0, -1.0)
  resid = seen - sign[None] * 1.0          # clipped to C = 1, noise N(0, 0.5^2)
  # Noise of std 0.5 around the clipped canary (120 readings: a KS test), and fresh noise
  # every round (the correlation of two rounds' 40 residuals: sd 1/sqrt(40)).
  assert sp_stats.kstest(resid.ravel() / 0.5, 'norm').pvalue > P_MIN
  assert np.abs(np.corrcoef(resid[0], resid[1])[0, 1]) < 4 / math.sqrt(j)


def test_participation_is_drawn_over_real_and_injected_clients_unless_canaries_always_take_part():
  model, params = _model()
  flat, unravel = flatten_util.ravel_pytree(params)
  deltas = jax.vmap(unravel)(jnp.zeros((7, flat.shape[0])))
  _, log = _run(model, params, _clients(), None,
                injected=rounds.Injected(deltas=deltas, sizes=jnp.ones(7)), participation=0.5)
  parts = np.asarray(log.participants)
  assert parts.shape == (3, 10)
  assert np.all(parts.sum(axis=1) == 5)
  assert 0 < parts[:, 3:].mean() < 1
  # always: every canary in every round; the fraction draws round(0.5 x 3) = 2 of the 3 real
  # clients, those `participant_indices` names over the real clients alone.
  _, log = _run(model, params, _clients(), None, participation=0.5,
                injected=rounds.Injected(deltas=deltas, sizes=jnp.ones(7), always=True))
  parts = np.asarray(log.participants)
  assert parts.shape == (3, 10) and parts[:, 3:].all()
  for t in range(3):
    want = np.zeros(3, bool)
    want[np.asarray(rounds.participant_indices(jax.random.key(1), t, 3, 0.5))] = True
    np.testing.assert_array_equal(parts[t, :3], want)


# ------------------------------------------------------------------------- canaries ---


def test_coins_are_fair_independent_of_their_number_and_keyed():
  c = canaries.coins(jax.random.key(0), 20_000)
  np.testing.assert_array_equal(canaries.coins(jax.random.key(0), 50), c[:50])
  lo, hi = sp_stats.binomtest(int(c.sum()), c.size).proportion_ci(0.999)
  assert lo < 0.5 < hi
  assert not np.array_equal(canaries.coins(jax.random.key(1), 50), c[:50])


def test_directions_are_unit_and_dirac_ones_distinct():
  r = canaries.directions(jax.random.key(0), 30, 30, 'random')
  np.testing.assert_allclose(np.linalg.norm(r, axis=1), 1.0, rtol=1e-5)
  assert r.shape == (30, 30) and r.dtype == np.float32
  d = canaries.directions(jax.random.key(0), 30, 30, 'dirac')
  np.testing.assert_array_equal(d.sum(axis=0), np.ones(30))
  assert d.dtype == np.float32
  for kind in ('dirac', 'random'):   # num <= dim: orthogonal directions need the coordinates
    with pytest.raises(ValueError, match='31 orthogonal canary directions need as many'):
      canaries.directions(jax.random.key(0), 31, 30, kind)
  with pytest.raises(ValueError, match='direction must be'):
    canaries.directions(jax.random.key(0), 3, 30, 'gaussian')


# The float32 rounding of an exactly orthonormal float64 frame: each entry moves by at most
# u |q| (u = 2^-24), so <f_i, f_j> moves by at most 2u + u^2 (Cauchy-Schwarz on the unit
# rows); the float64 QR adds ~1e-15. 3u bounds it; a frame of independent unit vectors is
# off by ~1/sqrt(dim).
ORTHONORMAL_ATOL = 3 * 2.0 ** -24


def test_random_directions_are_an_orthonormal_frame_of_uniform_unit_vectors():
  dim, num, keys = 5, 5, 400
  frames = np.stack([canaries.directions(jax.random.key(i), num, dim, 'random')
                     for i in range(keys)]).astype(np.float64)
  gram = np.einsum('kid,kjd->kij', frames, frames)
  np.testing.assert_allclose(gram, np.broadcast_to(np.eye(num), gram.shape), rtol=0,
                             atol=ORTHONORMAL_ATOL)
  # Fewer rows than coordinates: still orthonormal, and the first rows of a bigger frame
  # (row i is drawn from fold_in(key, i); the QR is a Gram-Schmidt of the rows in order).
  part = canaries.directions(jax.random.key(7), 3, 43, 'random').astype(np.float64)
  np.testing.assert_allclose(part @ part.T, np.eye(3), rtol=0, atol=ORTHONORMAL_ATOL)
  np.testing.assert_allclose(part, canaries.directions(jax.random.key(7), 20, 43, 'random')[:3],
                             rtol=0, atol=1e-6)
  # Reproducible for one key, different between keys.
  np.testing.assert_array_equal(canaries.directions(jax.random.key(3), num, dim), frames[3])
  assert np.abs(frames[3] - frames[4]).max() > 0.1
  # Each row is uniform on the sphere: a fixed coordinate x of a uniform unit vector in R^d
  # has mean 0, E x^2 = 1/d, Var x^2 = 2 (d - 1) / (d^2 (d + 2)), and (x + 1) / 2 ~
  # Beta((d - 1) / 2, (d - 1) / 2). Row i's coordinate i is where a QR without the Haar sign
  # fix is biased (numpy's gives mean ~ -0.35 there); 5 sd of the mean over the 400 keys.
  sd_mean = math.sqrt(1 / (dim * keys))
  sd_sq = math.sqrt(2 * (dim - 1) / (dim**2 * (dim + 2)) / keys)
  beta = sp_stats.beta((dim - 1) / 2, (dim - 1) / 2)
  for i in range(num):
    for x in (frames[:, i, i], frames[:, i, 0]):
      assert abs(x.mean()) < 5 * sd_mean, (i, x.mean())
      assert abs((x**2).mean() - 1 / dim) < 5 * sd_sq, (i, (x**2).mean())
  assert sp_stats.kstest((frames[:, 0, 0] + 1) / 2, beta.cdf).pvalue > P_MIN
  assert sp_stats.kstest((frames[:, num - 1, num - 1] + 1) / 2, beta.cdf).pvalue > P_MIN


def test_injected_clients_signs_sizes_and_always_follow_the_relation():
  unravel = lambda v: v
  dirs = np.eye(4, dtype=np.float32)[:3]
  world = np.array([True, False, True])
  rep = canaries.injected_clients(dirs, world, unravel, norm=2.0, relation='replace_one',
                                  size=5.0)
  np.testing.assert_allclose(np.asarray(rep.deltas)[:, :3], np.diag([2.0, -2.0, 2.0]))
  np.testing.assert_allclose(rep.sizes, [5.0, 5.0, 5.0])
  assert rep.always is False
  add = canaries.injected_clients(dirs, world, unravel, norm=2.0, relation='add_remove',
                                  size=5.0, always=True)
  np.testing.assert_allclose(np.asarray(add.deltas)[:, :3], np.diag([2.0, 2.0, 2.0]))
  np.testing.assert_allclose(add.sizes, [5.0, 0.0, 5.0])
  assert add.always is True


def test_place_examples_masks_out_canaries_under_add_remove_only():
  clients = _clients(k=3, n=4)
  x = np.full((5, DIM_IN), 7.0, np.float32)
  y = np.arange(5, dtype=np.int32)
  world = np.array([True, False, True, True, False])
  ex = canaries.place_examples(clients, x, y, world, 'add_remove')
  np.testing.assert_array_equal(ex.owner, [0, 1, 2, 0, 1])
  np.testing.assert_array_equal(ex.row, [4, 4, 4, 5, 5])
  mask = np.asarray(ex.clients.mask)
  assert mask.shape == (3, 6)
  np.testing.assert_array_equal(mask[:, :4], 1.0)
  np.testing.assert_array_equal(mask[ex.owner, ex.row], world.astype(np.float32))
  np.testing.assert_array_equal(np.asarray(ex.clients.y)[ex.owner, ex.row], y)
  assert mask[2, 5] == 0.0     # an unused slot is padding
  rep = canaries.place_examples(clients, x, y, world, 'replace_one')
  np.testing.assert_array_equal(np.asarray(rep.clients.mask)[rep.owner, rep.row], 1.0)


def test_place_examples_keeps_the_shards_mask_aux_and_dtypes_and_places_each_row():
  base = _clients(k=3, n=4)
  mask = np.ones((3, 4), np.float32)
  mask[1, 3] = 0.0   # a padded real row stays padding
  aux = {'tag': np.arange(3)}
  clients = base._replace(mask=mask, aux=aux)
  rng = np.random.default_rng(11)
  x = rng.normal(size=(5, DIM_IN)).astype(np.float32)
  y = np.arange(5, dtype=np.int32)
  world = np.array([True, False, True, True, False])
  for relation in ('add_remove', 'replace_one'):
    ex = canaries.place_examples(clients, x, y, world, relation)
    data = ex.clients
    assert data.aux is aux
    assert data.x.dtype == np.float32 and data.mask.dtype == np.float32
    np.testing.assert_array_equal(data.x[:, :4], base.x)
    np.testing.assert_array_equal(data.mask[:, :4], mask)
    np.testing.assert_array_equal(data.x[ex.owner, ex.row], x)
    np.testing.assert_array_equal(data.y[ex.owner, ex.row], y)
    live = world if relation == 'add_remove' else np.ones(5, bool)
    np.testing.assert_array_equal(data.mask[ex.owner, ex.row], live.astype(np.float32))
    assert data.mask.sum() == mask.sum() + live.sum()   # the slots no canary fills: padding


def test_slot_positions_and_the_slot_table_follow_the_placement():
  owner = np.array([0, 1, 0, 0, 1, 2, 0])
  positions = canary_training._slot_positions  # pylint: disable=protected-access
  np.testing.assert_array_equal(positions(owner), [0, 0, 1, 2, 1, 0, 3])
  np.testing.assert_array_equal(canaries.slot_table(owner, 4),
                                [[0, 2, 3, 6], [1, 4, -1, -1], [5, -1, -1, -1],
                                 [-1, -1, -1, -1]])
  # place_examples' round-robin placement: canary i in slot i // K of client i mod K.
  ex = canaries.place_examples(_clients(k=3, n=2), np.zeros((8, DIM_IN), np.float32),
                               np.zeros(8, np.int32), np.ones(8, bool), 'replace_one')
  positions = canary_training._slot_positions  # pylint: disable=protected-access
  np.testing.assert_array_equal(positions(ex.owner), np.arange(8) // 3)


def test_signs_refuse_an_unknown_relation_naming_the_allowed_ones():
  np.testing.assert_array_equal(canaries.signs('replace_one', np.array([True, False])),
                                [1.0, -1.0])
  np.testing.assert_array_equal(canaries.signs('add_remove', np.array([True, False])),
                                [1.0, 1.0])
  with pytest.raises(ValueError, match="relation must be 'add_remove' or 'replace_one' "
                     r"\(got 'zero_out'\)"):
    canaries.signs('zero_out', np.array([True]))


def test_dirac_coordinates_are_distinct_keyed_and_allowed_up_to_the_dimension():
  c = canaries.dirac_coordinates(jax.random.key(0), 30, 30)
  np.testing.assert_array_equal(np.sort(c), np.arange(30))
  d = canaries.dirac_coordinates(jax.random.key(0), 5, 1000)
  assert len(set(d.tolist())) == 5 and d.max() < 1000
  assert not np.array_equal(d, canaries.dirac_coordinates(jax.random.key(1), 5, 1000))
  with pytest.raises(ValueError, match='31 gradient canaries need as many coordinates'):
    canaries.dirac_coordinates(jax.random.key(0), 31, 30)


def test_gradient_canary_rows_have_the_dirac_gradient_and_real_rows_their_own():
  model, params = _model()
  loss_fn = losses.make_loss_fn(model.apply)
  coords = np.array([5, 11])
  hook = canaries.gradient_canary_loss(client_lib.IDENTITY.loss, CLASSES, coords,
                                       np.array([1.0, -1.0], np.float32), 3.0, _ravel)
  x = np.random.default_rng(0).normal(size=(3, DIM_IN)).astype(np.float32)
  y = np.array([CLASSES + 1, 2, CLASSES], np.int32)
  one = lambda i: _ravel(jax.grad(lambda p: hook(None, loss_fn, p, x[i:i + 1], y[i:i + 1],
                                                 jnp.ones(1), None))(params))
  g_canary = np.asarray(one(0))
  expect = np.zeros_like(g_canary)
  expect[11] = -3.0
  np.testing.assert_allclose(g_canary, expect, atol=1e-7)
  g_first = np.asarray(one(2))
  assert g_first[5] == pytest.approx(3.0) and np.count_nonzero(g_first) == 1
  g_real = np.asarray(one(1))
  plain = np.asarray(_ravel(jax.grad(lambda p: loss_fn(p, x[1:2], y[1:2]))(params)))
  np.testing.assert_allclose(g_real, plain, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('with_mask', [True, False])
def test_gradient_canary_loss_on_a_mixed_batch_is_the_mean_over_its_real_rows(with_mask):
  model, params = _model()
  loss_fn = losses.make_loss_fn(model.apply)
  coords = np.array([7, 3])
  hook = canaries.gradient_canary_loss(client_lib.IDENTITY.loss, CLASSES, coords,
                                       np.array([1.0, -1.0], np.float32), 2.5, _ravel)
  x = np.random.default_rng(1).normal(size=(4, DIM_IN)).astype(np.float32)
  y = np.array([1, CLASSES + 1, 2, CLASSES], np.int32)
  mask = jnp.asarray([1.0, 1.0, 1.0, 0.0]) if with_mask else None
  got = hook(None, loss_fn, params, jnp.asarray(x), jnp.asarray(y), mask, None)
  ce = losses.per_example_cross_entropy(model.apply(params, x[[0, 2]]), y[[0, 2]])
  w = _ravel(params)
  if with_mask:   # rows 0, 1, 2 are real: two data rows and canary 1 (sign -1, coordinate 3)
    want = (ce.sum() - 2.5 * w[3]) / 3
  else:           # every row: canary 0 (sign +1, coordinate 7) too
    want = (ce.sum() - 2.5 * w[3] + 2.5 * w[7]) / 4
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_dp_sgd_clips_the_gradient_canary_to_the_clip_norm():
  model, params = _model()
  loss_fn = losses.make_loss_fn(model.apply)
  hook = canaries.gradient_canary_loss(client_lib.IDENTITY.loss, CLASSES, np.array([2]),
                                       np.array([1.0], np.float32), 5.0, _ravel)
  hooks = client_lib.ClientHooks(loss=hook, grad=dp.dp_sgd_hook(1.0, 0.0))
  x = np.zeros((1, DIM_IN), np.float32)
  y = np.array([CLASSES], np.int32)
  new = local.fedavg(loss_fn, params, x, y, key=jax.random.key(0), optimizer=optax.sgd(1.0),
                     epochs=1, batch_size=1, hooks=hooks, mask=jnp.ones(1))
  delta = np.asarray(_ravel(params) - _ravel(new))
  expect = np.zeros_like(delta)
  expect[2] = 1.0                      # the Dirac of norm 5, clipped to C = 1, one step of lr 1
  np.testing.assert_allclose(delta, expect, atol=1e-6)


# --------------------------------------------------------------------------- scores ---


def test_mixture_llr_is_linear_at_full_participation_and_odd():
  x = jnp.linspace(-3, 3, 7)
  np.testing.assert_allclose(canaries.mixture_llr(x[:, None], 1.0, 0.5, 2.0),
                             2 * x * 0.5 / 4.0, rtol=1e-5, atol=1e-6)
  a = canaries.mixture_llr(x[:, None], 0.3, 1.0, 1.0)
  np.testing.assert_allclose(a, -a[::-1], rtol=1e-5, atol=1e-6)
  assert np.all(np.diff(np.asarray(a)) > 0)


def test_mixture_llr_is_the_log_ratio_of_the_two_mixtures():
  x = np.linspace(-4, 4, 9)
  for q, shift, sigma in ((0.3, 1.5, 2.0), (0.05, 0.5, 0.7), (0.9, 2.0, 1.0)):
    plus = (1 - q) * sp_stats.norm.pdf(x, 0, sigma) + q * sp_stats.norm.pdf(x, shift, sigma)
    minus = (1 - q) * sp_stats.norm.pdf(x, 0, sigma) + q * sp_stats.norm.pdf(x, -shift, sigma)
    got = canaries.mixture_llr(jnp.asarray(x)[:, None], q, shift, sigma)
    np.testing.assert_allclose(got, np.log(plus / minus), rtol=2e-4, atol=2e-5)
  # Summed over the last axis (the rounds).
  two = canaries.mixture_llr(jnp.asarray([[0.5, -1.0]]), 0.3, 1.0, 1.0)
  one = canaries.mixture_llr(jnp.asarray([[0.5], [-1.0]]), 0.3, 1.0, 1.0)
  np.testing.assert_allclose(two, one.sum(), rtol=1e-5)


def test_step_llr_is_the_log_ratio_of_the_subsampled_gaussian_to_its_absence():
  x = np.linspace(-3, 4, 15)
  for q, shift, sigma in ((0.5, 1.0, 1.0), (0.02, 1.0, 0.8), (0.9, 2.0, 3.0)):
    mix = (1 - q) * sp_stats.norm.pdf(x, 0, sigma) + q * sp_stats.norm.pdf(x, shift, sigma)
    got = canaries.step_llr(jnp.asarray(x), q, shift, sigma)
    np.testing.assert_allclose(got, np.log(mix / sp_stats.norm.pdf(x, 0, sigma)), rtol=2e-4,
                               atol=2e-5)
  # q = 1: the Gaussian's own (x D - D^2 / 2) / s^2.
  np.testing.assert_allclose(canaries.step_llr(jnp.asarray(x), 1.0, 2.0, 0.5),
                             (2 * x - 2) / 0.25, rtol=1e-6)


def _scores(**kw):
  f32 = lambda a: np.asarray(a, np.float32)
  base = dict(uploads=f32([1.0, 2.0]), aggregates=f32([[0.1, 0.2], [0.3, 0.4]]),
              known=f32([[1.0, 0.0], [0.0, 2.0]]), participants=f32([[10, 10], [20, 20]]),
              last=f32([5.0, 6.0]), test_accuracy=np.array([0.5]))
  base.update(kw)
  return canaries.Scores(**base)


def test_threat_scores_read_what_each_adversary_sees():
  sc = _scores(steps=np.array([-1.5, 2.5], np.float32))
  for threat, adversary, want in (('all_iterates', 'server', [1.0, 2.0]),
                                  ('last_iterate', 'aggregate', [5.0, 6.0]),
                                  ('all_iterates', 'aggregate', [0.4, 0.6]),
                                  ('all_steps', 'server', [-1.5, 2.5])):
    got = canaries.threat_scores(sc, threat, adversary, participation=1.0)
    assert got.dtype == np.float64   # float32 readings, as a training returns them
    np.testing.assert_allclose(got, want, rtol=1e-6)
  # k_t x aggregate - known: (1 - 1) + (6 - 0), (2 - 0) + (8 - 2)
  np.testing.assert_allclose(canaries.threat_scores(sc, 'all_iterates', 'aggregate',
                                                    participation=1.0, known=True), [6.0, 8.0],
                             rtol=1e-6)
  with pytest.raises(ValueError, match='threat must be'):
    canaries.threat_scores(sc, 'first_iterate', 'server', participation=1.0)
  with pytest.raises(ValueError, match='^all_steps needs the per-step reading of gradient '
                     'canaries$'):
    canaries.threat_scores(_scores(), 'all_steps', 'server', participation=1.0)


def test_threat_scores_under_participation_sampling_are_the_mixture_llr_by_hand():
  sc = _scores(aggregates=np.asarray([[0.1, -0.2], [0.3, 0.4]], np.float32))
  left = np.array([[0.0, -2.0], [6.0, 6.0]])   # k_t x aggregate - known, [T, m]

  def llr(x, q, d, sd):   # log(1 - q + q e^{(xD - D^2/2)/s^2}) - the same at -x, summed over t
    f = lambda y: np.log(1 - q + q * np.exp((y * d - d * d / 2) / sd**2))
    return (f(x) - f(-x)).sum(axis=0)

  for q, d, sd in ((0.5, 1.0, 2.0), (0.2, 0.5, 0.5)):
    got = canaries.threat_scores(sc, 'all_iterates', 'aggregate', participation=q, shift=d,
                                 sigma=sd, known=True)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, llr(left, q, d, sd), rtol=1e-5)
  # Without the sampling, a shift or a positive sigma: the plain sum over rounds.
  for kw in (dict(participation=1.0, shift=1.0, sigma=2.0), dict(participation=0.5, sigma=2.0),
             dict(participation=0.5, shift=1.0), dict(participation=0.5, shift=1.0, sigma=0.0)):
    np.testing.assert_allclose(canaries.threat_scores(sc, 'all_iterates', 'aggregate',
                                                      known=True, **kw), left.sum(axis=0),
                               rtol=1e-6)


# ------------------------------------------------------ statistics (canary_statistics) ---


def test_the_statistics_are_re_exported_from_canary_statistics():
  for name in ('audit', 'counted_bounds', 'gaussian_fit_epsilon', 'NON_GAUSSIAN',
               'NO_ESTIMATE'):
    assert getattr(canaries, name) is getattr(canary_statistics, name), name


def test_gaussian_fit_of_identical_constant_scores_is_infinite_and_of_equal_means_zero():
  fit = canary_statistics.gaussian_fit_epsilon
  assert fit(np.ones(5), np.ones(5), 1e-5) == (math.inf, math.inf)
  mu, eps = fit(np.array([1.0, -1.0, 1.0, -1.0]), np.array([2.0, -2.0]), 1e-5)
  assert mu == 0.0 and eps == 0.0


def test_gaussian_fit_by_hand_with_unbiased_variances():
  ins, outs = np.array([0.0, 2.0, 4.0]), np.array([1.0, 1.0, 4.0, 6.0])
  # var (ddof 1): 4 and 6.0; pooled sd sqrt(5); means 2 and 3.
  mu, eps = canary_statistics.gaussian_fit_epsilon(ins, outs, 1e-5)
  assert mu == pytest.approx(1.0 / math.sqrt(5.0))
  assert eps == pytest.approx(auditing.gdp_epsilon(1.0 / math.sqrt(5.0), 1e-5))
  mu, _ = canary_statistics.gaussian_fit_epsilon(np.array([0.0, 0.2]), np.array([0.1, 0.3]),
                                                 1e-5)
  # variances 0.02 each: pooled sd sqrt(0.02); means 0.1 and 0.2 (a spread below 1).
  assert mu == pytest.approx(0.1 / math.sqrt(0.02))


def test_audit_flags_a_mechanism_above_its_claim_and_not_one_below():
  rng = np.random.default_rng(0)
  world = rng.random(20_000) < 0.5
  # mu = 2: epsilon about 8.6 at delta 1e-5.
  strong = rng.normal(size=world.size) + 2.0 * world
  m = canary_statistics.audit(strong, world, 'update_dp', 2.0, delta=1e-5, confidence=0.95,
                              independent=True)
  assert m['privacy_violation'] == 1.0 and m['best_bound'] > 2.0
  assert m['verdict'] == 'violation'
  assert m['bound_confidence'] == pytest.approx(1 - 0.05 / 4)
  assert m['n_in'] + m['n_out'] == 20_000 == m['num_canaries']
  null = rng.normal(size=world.size)
  m0 = canary_statistics.audit(null, world, 'update_dp', 0.5, delta=1e-5, confidence=0.95,
                               independent=True)
  assert m0['privacy_violation'] == 0.0 and m0['verdict'] != 'violation'
  with pytest.raises(ValueError, match='two canaries in each world'):
    canary_statistics.audit(null[:3], np.array([True, False, False]), 'update_dp', 1.0,
                            delta=1e-5, confidence=0.95)


@pytest.mark.parametrize('mechanism,independent', [('update_dp', True), ('update_dp', False),
                                                   ('dp_sgd_poisson', False),
                                                   ('ldp_sgd', True)])
def test_audit_reports_every_field_as_computed_by_hand(mechanism, independent):
  rng = np.random.default_rng(4)
  world = rng.random(3000) < 0.5
  scores = rng.normal(size=world.size) + 1.2 * world
  claim = 3.0
  curve = lambda grid: np.zeros_like(grid)          # a claim of pure 0-DP: refuted
  m = canary_statistics.audit(scores, world, mechanism, claim, delta=1e-5, confidence=0.9,
                              independent=independent, claimed_delta=curve, reach=False)
  counted = canary_statistics.counted_bounds(mechanism, independent)
  k = len(counted) + int(independent)
  each = 1 - 0.1 / k
  ref = auditing.audit_scores(scores[world], scores[~world], delta=1e-5, confidence=each)
  for key in ('epsilon_one_run', 'epsilon_one_run_fdp', 'epsilon_cp', 'epsilon_gdp',
              'one_run_delta_term'):
    assert m[key] == pytest.approx(ref[key], abs=1e-12), key
  assert math.isnan(m['epsilon_gdp_midpoint'])     # no threshold fixed before the data
  assert m['bounding_canaries'] == auditing.one_run_trials(world.sum(), (~world).sum(), 'split')
  assert m['bound_confidence'] == pytest.approx(each)
  assert m['verdict_confidence'] == 0.9
  assert m['best_bound'] == pytest.approx(max(ref[c] for c in counted))
  assert m['tightness'] == pytest.approx(m['best_bound'] / claim)
  assert m['counted_bounds'] == ','.join(counted + (('profile',) if independent else ()))
  assert m['canaries_independent'] == float(independent)
  assert m['num_canaries'] == 3000 and m['n_in'] == world.sum() and m['n_out'] == (~world).sum()
  assert m['score_in_mean'] == pytest.approx(scores[world].mean())
  assert m['score_out_mean'] == pytest.approx(scores[~world].mean())
  assert 'verdict' not in m and 'max_certifiable' not in m   # reach=False
  if mechanism == 'ldp_sgd':
    assert math.isnan(m['epsilon_estimate']) and math.isnan(m['gdp_mu_estimate'])
  else:
    mu, eps = canary_statistics.gaussian_fit_epsilon(scores[world], scores[~world], 1e-5)
    assert m['gdp_mu_estimate'] == pytest.approx(mu) and m['epsilon_estimate'] == pytest.approx(eps)
  if independent:
    grid = np.linspace(0.0, 2 * claim, 41)
    lower = auditing.privacy_profile(scores[world], scores[~world], grid, confidence=each)
    assert m['profile_excess'] == pytest.approx(lower.max())
    assert m['profile_epsilon'] == pytest.approx(grid[np.argmax(lower)])
    assert m['profile_violation'] == 1.0 and m['privacy_violation'] == 1.0
  else:
    assert math.isnan(m['profile_violation']) and math.isnan(m['profile_excess'])
    assert m['privacy_violation'] == float(m['best_bound'] > claim)


def test_audit_profile_grid_the_claims_edge_and_a_world_of_zero_one_ints(monkeypatch):
  rng = np.random.default_rng(5)
  world = rng.random(200) < 0.5
  scores = rng.normal(size=world.size)
  curve = lambda grid: np.zeros_like(grid)
  audit = canary_statistics.audit
  # A world given as 0/1 integers is the same mask as the bools.
  by_bool = audit(scores, world, 'update_dp', 2.5, delta=1e-5, confidence=0.9,
                  independent=True, claimed_delta=curve, reach=False)
  by_int = audit(scores, world.astype(np.int64), 'update_dp', 2.5, delta=1e-5,
                 confidence=0.9, independent=True, claimed_delta=curve, reach=False)
  assert by_int == pytest.approx(by_bool, nan_ok=True)
  assert by_int['n_in'] == world.sum()
  # The profile test runs on 41 epsilons evenly spaced over [0, 2 x claim], at the
  # Bonferroni level, and its verdict alone makes a violation.
  calls = []

  def profile(ins, outs, claimed_delta, grid, *, confidence):
    calls.append((ins, outs, claimed_delta, np.asarray(grid), confidence))
    return {'profile_violation': verdict, 'profile_excess': 0.25, 'profile_epsilon': 1.5}

  monkeypatch.setattr(canary_statistics.auditing, 'profile_violation', profile)
  for verdict in (0.0, 1.0):
    m = audit(scores, world, 'update_dp', 2.5, delta=1e-5, confidence=0.9, independent=True,
              claimed_delta=curve, reach=False)
    ins, outs, claimed, grid, level = calls[-1]
    np.testing.assert_array_equal(grid, np.linspace(0.0, 5.0, 41))
    np.testing.assert_array_equal(ins, scores[world])
    np.testing.assert_array_equal(outs, scores[~world])
    k = len(canary_statistics.counted_bounds('update_dp', True)) + 1
    assert claimed is curve and level == pytest.approx(1 - 0.1 / k)
    assert m['best_bound'] < 2.5  # null scores: no counted bound refutes the claim
    assert (m['profile_violation'], m['profile_excess'], m['profile_epsilon']) == (
        verdict, 0.25, 1.5)
    assert m['privacy_violation'] == verdict
  # A counted bound equal to the claim does not refute it; just above does; a bound not
  # counted decides nothing.
  bounds = {'epsilon_one_run': 2.0, 'epsilon_one_run_fdp': 1.0, 'epsilon_cp': 9.0,
            'epsilon_gdp': 9.0, 'one_run_delta_term': 0.0}
  monkeypatch.setattr(canary_statistics.auditing, 'audit_scores',
                      lambda ins, outs, *, delta, confidence, **kw: bounds)
  for claim, want in ((2.0, 0.0), (1.999, 1.0)):
    m = audit(scores, world, 'update_dp', claim, delta=1e-5, confidence=0.95, reach=False)
    assert m['best_bound'] == 2.0 and m['privacy_violation'] == want, claim


def test_audit_defaults_to_dependent_canaries_and_accepts_two_a_world():
  scores = np.array([3.0, 2.5, -1.0, -0.5])
  world = np.array([True, True, False, False])
  m = canary_statistics.audit(scores, world, 'update_dp', 1.0, delta=1e-5, confidence=0.95,
                              reach=False)
  assert m['canaries_independent'] == 0.0
  assert m['counted_bounds'] == 'epsilon_one_run,epsilon_one_run_fdp'
  assert math.isnan(m['profile_epsilon']) and math.isnan(m['profile_violation'])
  assert m['n_in'] == 2 and m['n_out'] == 2


# ------------------------------------------------------------ canary clients, trained ---

K_REAL, ROWS, BATCH, ROUNDS = 3, 8, 4, 3


def _client_canaries(r, j, *, dirs='random', seed=0):
  """R replicates of a federation with J replace-one canary clients of norm 2 (above C):
  (params, clients, keys, planted, worlds [R, J]), each stacked on R."""
  ps, cs, planted = [], [], []
  for i in range(r):
    p = MODEL.init(jax.random.key(seed + 10 * i), jnp.zeros((1, DIM_IN)))
    flat, unravel = flatten_util.ravel_pytree(p)
    d = canaries.directions(jax.random.key(seed + 10 * i + 1), j, flat.shape[0], dirs)
    world = canaries.coins(jax.random.key(seed + 10 * i + 2), j)
    inj = canaries.injected_clients(d, world, unravel, norm=CANARY_NORM,
                                    relation='replace_one', size=float(ROWS))
    ps.append(p)
    cs.append(_clients(K_REAL, ROWS, seed=seed + i))
    planted.append(canaries.Planted(world=world, directions=d,
                                    injected=(inj.deltas, inj.sizes)))
  keys = jnp.stack([jax.random.key(seed + 10 * i + 3) for i in range(r)])
  return _stack(ps), _stack(cs), keys, _stack(planted), np.stack([p.world for p in planted])


def _train_clients(data, hooks, participation, *, always=False, chunk=8):
  params, clients, keys, planted, _ = data
  return canaries.train(MODEL.apply, params, clients, keys=keys, hooks=hooks,
                        num_rounds=ROUNDS, optimizer=OPT, epochs=1, batch_size=BATCH,
                        participation=participation, kind='client', clip_norm=C,
                        planted=planted, always=always, chunk=chunk)


def _update_dp(z):
  return client_lib.ClientHooks(upload=dp.update_dp_hook(C, z))


def _took_part(keys, j, participation):
  """[T, R x J]: who of the canary clients took part, by the round loop's documented draw over
  the K + J clients (`rounds.participants`)."""
  return np.concatenate([
      np.stack([np.asarray(rounds.participants(k, t, K_REAL + j, participation))[K_REAL:]
                for t in range(ROUNDS)]) for k in keys], axis=1)


def test_canary_clients_server_reading_is_the_clipped_canary_plus_the_upload_noise():
  # update_dp's upload hook (clip C, noise z C) on canary clients that train through the
  # client protocol: the server's reading of its canary's uploads, summed over the rounds it
  # took part in, is +/-C per round plus N(0, (z C)^2) per round.
  j, z, q = 40, 0.7, 0.5
  data = _client_canaries(3, j)
  sign = np.where(data[4].ravel(), 1.0, -1.0)
  rounds_in = _took_part(data[2], j, q).sum(axis=0)
  assert 0 < (rounds_in / ROUNDS).mean() < 1 and (rounds_in == ROUNDS).any()
  exact = _train_clients(data, _update_dp(0.0), q)
  np.testing.assert_allclose(exact.uploads, C * sign * rounds_in, rtol=1e-5, atol=1e-6)
  # round(0.5 x 43) of the 3 real and 40 canary clients take part in each round.
  np.testing.assert_array_equal(exact.participants, 22)
  np.testing.assert_allclose(exact.last, exact.aggregates.sum(axis=0), rtol=1e-4, atol=1e-6)
  np.testing.assert_array_equal(exact.test_accuracy.shape, (3,))
  assert np.isnan(exact.test_accuracy).all() and exact.steps is None
  noisy = canaries.threat_scores(_train_clients(data, _update_dp(z), q), 'all_iterates',
                                 'server', participation=q)
  took = rounds_in > 0
  resid = (noisy - C * sign * rounds_in)[took] / (z * C * np.sqrt(rounds_in[took]))
  assert sp_stats.kstest(resid, 'norm').pvalue > P_MIN
  np.testing.assert_array_equal(noisy[~took], 0.0)   # no round, no reading


def test_canary_clients_that_always_take_part_are_read_in_every_round():
  j, z, q = 40, 0.7, 0.5
  data = _client_canaries(3, j, seed=100)
  sign = np.where(data[4].ravel(), 1.0, -1.0)
  exact = _train_clients(data, _update_dp(0.0), q, always=True)
  np.testing.assert_allclose(exact.uploads, C * sign * ROUNDS, rtol=1e-5)
  # Every canary, and round(0.5 x 3) = 2 of the real clients, in every round.
  np.testing.assert_array_equal(exact.participants, j + 2)
  noisy = _train_clients(data, _update_dp(z), q, always=True).uploads
  resid = (noisy - C * sign * ROUNDS) / (z * C * math.sqrt(ROUNDS))
  assert sp_stats.kstest(resid, 'norm').pvalue > P_MIN


def test_canary_clients_aggregate_reading_without_noise_is_exact():
  # central_dp at z = 0 with participation: k_t x aggregate minus the real participants'
  # clipped uploads is the canary's clipped update where it took part, 0 elsewhere.
  j, q = 12, 0.6
  data = _client_canaries(1, j, dirs='dirac', seed=200)
  sign = np.where(data[4].ravel(), 1.0, -1.0)
  hooks = client_lib.ClientHooks(aggregate=dp.central_dp_hook(C, 0.0))
  agg = _train_clients(data, hooks, q)
  np.testing.assert_array_equal(agg.participants, 9)    # round(0.6 x 15)
  left = agg.aggregates * agg.participants - agg.known
  took_part = _took_part(data[2], j, q)
  assert 0 < took_part.mean() < 1
  np.testing.assert_allclose(left, took_part * sign, atol=1e-4)
  # The server's reading of each canary's own (unclipped, norm 2) upload, over its rounds.
  np.testing.assert_allclose(agg.uploads, CANARY_NORM * sign * took_part.sum(axis=0),
                             rtol=1e-5)
  own = canaries.threat_scores(agg, 'all_iterates', 'aggregate', participation=1.0, known=True)
  np.testing.assert_allclose(own, left.sum(axis=0), rtol=1e-6)


def test_replicates_are_the_separate_trainings_whatever_the_chunk():
  # R replicates vmapped in chunks are R independent trainings of one compiled program:
  # chunk 1, 2 (pieces of 2 and 1) and R give every Scores field of R one-replicate calls.
  # Compared to float32 rounding (rtol 1e-5, atol 1e-6), not bitwise: XLA vectorises a batch
  # of 1 and of 3 differently (`known` differed by 9e-8, measured), while a swapped key or
  # replicate (noise std 0.7) is far above it.
  data = _client_canaries(3, 40)
  hooks = _update_dp(0.7)
  whole = _train_clients(data, hooks, 0.5)
  programs = len(canary_training._PROGRAMS)   # pylint: disable=protected-access
  one = lambda i: jax.tree_util.tree_map(lambda a: a[i:i + 1], data)
  alone = [_train_clients(one(i), hooks, 0.5) for i in range(3)]
  by_chunk = [_train_clients(data, hooks, 0.5, chunk=c) for c in (1, 2, 3)]
  # The noise is an operand of the program (`split_hooks`): another z compiles nothing new.
  _train_clients(data, _update_dp(0.1), 0.5)
  assert len(canary_training._PROGRAMS) == programs   # pylint: disable=protected-access
  j = 40
  for field in ('uploads', 'last', 'test_accuracy'):
    want = np.concatenate([getattr(a, field) for a in alone])
    for got in [whole] + by_chunk:
      np.testing.assert_allclose(getattr(got, field), want, rtol=1e-5, atol=1e-6,
                                 err_msg=field)
  for field in ('aggregates', 'known', 'participants'):
    want = np.concatenate([getattr(a, field) for a in alone], axis=1)
    for got in [whole] + by_chunk:
      np.testing.assert_allclose(getattr(got, field), want, rtol=1e-5, atol=1e-6,
                                 err_msg=field)
  # Independent replicates: the three trainings' readings differ.
  u = whole.uploads.reshape(3, j)
  assert not np.allclose(u[0], u[1]) and not np.allclose(u[1], u[2])


def test_accuracy_is_the_canary_free_trainings_own():
  rng = np.random.default_rng(7)
  tx = rng.normal(size=(60, DIM_IN)).astype(np.float32)
  ty = rng.integers(0, CLASSES, 60).astype(np.int32)
  r = 2
  params = _stack([MODEL.init(jax.random.key(300 + i), jnp.zeros((1, DIM_IN)))
                   for i in range(r)])
  clients = _stack([_clients(K_REAL, ROWS, seed=300 + i) for i in range(r)])
  keys = jnp.stack([jax.random.key(310 + i) for i in range(r)])
  hooks = _update_dp(0.3)
  kw = dict(num_rounds=ROUNDS, optimizer=optax.sgd(0.5), epochs=1, batch_size=BATCH,
            participation=0.5)
  got = canaries.accuracy(MODEL.apply, params, clients, keys=keys, hooks=hooks, test_x=tx,
                          test_y=ty, **kw)
  assert got.shape == (r,) and got.dtype == np.float64
  loss_fn = losses.make_loss_fn(MODEL.apply)
  run = jax.jit(lambda p, c, k: rounds.run(loss_fn, p, c, key=k, hooks=hooks, **kw)[0])
  take = lambda tree, i: jax.tree_util.tree_map(lambda a: a[i], tree)
  want = []
  for i in range(r):
    final = run(take(params, i), take(clients, i), keys[i])
    logits = np.asarray(MODEL.apply(final, tx))
    want.append(np.mean(np.argmax(logits, -1) == ty))
    # The same correct predictions of the 60, up to rows within rounding of a tie (accuracy
    # is a float32 mean: 2^-24 relative).
    decisions.assert_correct_count(np.round(got[i] * len(ty)), logits, ty)
  assert 0 < min(want) and max(want) < 1


# ------------------------------------------------------------ canary examples, trained ---


@pytest.mark.parametrize('kind', ['gradient', 'input'])
def test_one_client_one_round_server_view_equals_the_last_iterate(kind):
  # One client, one round: w_0 - w_1 is that client's upload, so the server's reading of its
  # upload and the last iterate's reading agree exactly (for inputs: the loss decrease).
  model, params = _model()
  dim = _ravel(params).shape[0]
  clients = _clients(k=1, n=8)
  m = 6
  world = np.array([True, False, True, True, False, True])
  rng = np.random.default_rng(3)
  hooks = client_lib.ClientHooks(grad=dp.dp_sgd_hook(1.0, 0.5))
  if kind == 'gradient':
    coords = canaries.dirac_coordinates(jax.random.key(1), m, dim)
    x = np.zeros((m, DIM_IN), np.float32)
    y = (CLASSES + np.arange(m)).astype(np.int32)
    planted = canaries.Planted(world=world, coordinates=coords.astype(np.int32),
                               code_sign=canaries.signs('add_remove', world))
  else:
    x = rng.normal(size=(m, DIM_IN)).astype(np.float32)
    y = rng.integers(0, CLASSES, m).astype(np.int32)
    planted = canaries.Planted(world=world, x=x, y=y)
  ex = canaries.place_examples(clients, x, y, world, 'add_remove')
  sc = canaries.train(model.apply, _stack([params]), _stack([ex.clients]),
                      keys=jnp.stack([jax.random.key(2)]), hooks=hooks, num_rounds=1,
                      optimizer=OPT, epochs=1, batch_size=4, participation=1.0, kind=kind,
                      clip_norm=1.0, planted=_stack([planted]), owner=ex.owner,
                      num_classes=CLASSES, canary_norm=CANARY_NORM)
  np.testing.assert_allclose(sc.uploads, sc.last, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(sc.aggregates[0], sc.last, rtol=1e-4, atol=1e-6)
  assert np.abs(sc.last).max() > 1e-3
  assert np.isnan(sc.test_accuracy).all()   # no test split


def test_test_accuracy_is_the_final_models_and_a_client_that_sat_out_gives_no_reading():
  model, params = _model()
  rng = np.random.default_rng(7)
  tx = rng.normal(size=(40, DIM_IN)).astype(np.float32)
  ty = rng.integers(0, CLASSES, 40).astype(np.int32)
  cx = rng.normal(size=(4, DIM_IN)).astype(np.float32)
  cy = np.zeros(4, np.int32)
  world = np.array([True, False, True, False])
  ex = canaries.place_examples(_clients(), cx, cy, world, 'add_remove')
  key = jax.random.key(2)
  # 2 of the 3 clients take part in the one round.
  kw = dict(hooks=client_lib.ClientHooks(), num_rounds=1, optimizer=optax.sgd(0.5), epochs=1,
            batch_size=4, participation=0.5)
  planted = _stack([canaries.Planted(world=world, x=cx, y=cy)])
  sc = canaries.train(model.apply, _stack([params]), _stack([ex.clients]),
                      keys=jnp.stack([key]), kind='input', clip_norm=1.0, planted=planted,
                      owner=ex.owner, test_x=tx, test_y=ty, **kw)
  final, _ = rounds.run(losses.make_loss_fn(model.apply), params, ex.clients, key=key, **kw)
  logits = np.asarray(model.apply(final, tx))
  want = np.mean(np.argmax(logits, -1) == ty)
  assert 0 < want < 1
  assert sc.test_accuracy.shape == (1,)
  # A float32 mean of 40: the same count, up to rows within rounding of a tie.
  decisions.assert_correct_count(np.round(sc.test_accuracy[0] * len(ty)), logits, ty)
  # A canary of a client that sat out has no reading (0, not a division by its 0
  # participation).
  took = np.asarray(rounds.participants(key, 0, 3, 0.5))[ex.owner]
  assert 0 < took.sum() < 4
  assert np.all(sc.uploads[~took] == 0) and np.all(sc.uploads[took] != 0)
  assert sc.known.shape == (1, 4) and not sc.known.any()  # a client canaries' field
  np.testing.assert_array_equal(sc.participants, 2)


# ----------------------------------------------- all_steps: gradient canaries of DP-SGD ---


def _gradient_canaries(r, k, n, m, relation, *, seed):
  """R replicates of K shards of n rows with m gradient canary rows placed round-robin:
  (params, clients, keys, planted, worlds [R, m], owner)."""
  ps, cs, planted, owner = [], [], [], None
  for i in range(r):
    p = MODEL.init(jax.random.key(seed + 10 * i), jnp.zeros((1, DIM_IN)))
    dim = _ravel(p).shape[0]
    world = canaries.coins(jax.random.key(seed + 10 * i + 1), m)
    coords = canaries.dirac_coordinates(jax.random.key(seed + 10 * i + 2), m, dim)
    ex = canaries.place_examples(_clients(k, n, seed=seed + i), np.zeros((m, DIM_IN),
                                                                          np.float32),
                                 (CLASSES + np.arange(m)).astype(np.int32), world, relation)
    ps.append(p)
    cs.append(ex.clients)
    planted.append(canaries.Planted(world=world, coordinates=coords.astype(np.int32),
                                    code_sign=canaries.signs(relation, world)))
    owner = ex.owner
  keys = jnp.stack([jax.random.key(seed + 10 * i + 3) for i in range(r)])
  return (_stack(ps), _stack(cs), keys, _stack(planted),
          np.stack([p.world for p in planted]), owner)


def _train_gradient(data, hooks, reading, *, epochs, num_rounds):
  params, clients, keys, planted, _, owner = data
  return canaries.train(MODEL.apply, params, clients, keys=keys, hooks=hooks,
                        num_rounds=num_rounds, optimizer=OPT, epochs=epochs,
                        batch_size=BATCH, participation=1.0, kind='gradient', clip_norm=C,
                        planted=planted, owner=owner, reading=reading,
                        num_classes=CLASSES, canary_norm=CANARY_NORM)


# Poisson DP-SGD: K clients of n real rows (the public count: rate B / n = 0.5, ceil(n / B) =
# 2 steps an epoch), m = 40 canaries (10 a client), E = 4 epochs, one round: 8 steps a canary,
# 8 replicates (320 canaries). One round, so that every client starts from w_0 and the
# steps can be replayed client by client (`_replay_steps`).
PK, PN, PE, PM, PR, PZ = 4, 8, 4, 40, 8, 1.0


def _poisson_hooks(z):
  setting = registry.Setting(num_classes=CLASSES, batch_size=BATCH, num_examples=PN,
                             max_examples=PN + PM // PK, epochs=PE, rounds=1, num_clients=PK)
  return configured.sweep_point('dp_sgd', z, setting, experiment='training_audit', prefix='t',
                                fixed={'clip_norm': C, 'sampling': 'poisson'})


def _replay_steps(data, hooks, claimed):
  """Every client's steps of round 0 replayed outside `train`: (leftover [R, K, steps, m],
  draws [R, m, steps]).

  The leftover of every gradient canary coordinate, from the definition: each local step's
  noisy sum (B x the step's gradient: Poisson DP-SGD divides by the expected batch B) minus
  the clipped gradients of the batch's real non-canary rows, read through `local.fedavg`'s
  trace of the very steps `rounds.run` takes in round 0 (client key `rounds.client_key(key,
  0, k)`). The draws: whether each canary's row is in each step's batch, by the sampler's own
  documented draws (`sampling.poisson_batch_order` with `client.batches_key(client_key)`).
  """
  params, clients, keys, planted, _, owner = data
  static, traced = canaries.split_hooks(hooks)
  loss_fn = losses.make_loss_fn(MODEL.apply)
  sched = claimed.hooks.batches.schedule
  slots = PN + jnp.arange(PM // PK)

  def replicate(p, cl, key, coords, code_sign, traced_hooks):
    h = static._replace(**traced_hooks)
    h = h._replace(loss=canaries.gradient_canary_loss(h.loss, CLASSES, coords, code_sign,
                                                      CANARY_NORM, _ravel))

    def trace(step):
      per = jax.vmap(_ravel)(step.per_example)                        # [W, P]
      scale = C / jnp.maximum(jnp.linalg.norm(per, axis=1), C)
      others = step.row_mask * (step.indices < PN) * scale
      return BATCH * _ravel(step.grad)[coords] - others @ per[:, coords]

    def one(x, y, mask, k):
      client_key = rounds.client_key(key, 0, k)
      leftover = local.client_update(loss_fn, p, x, y, key=client_key, hooks=h, mask=mask,
                                     optimizer=OPT, epochs=PE, batch_size=BATCH,
                                     trace=trace)[2]
      idx, rows, _ = sampling.poisson_batch_order(
          client_lib.batches_key(client_key), mask, epochs=PE, schedule=sched,
          max_batch_size=int(claimed.metrics['dp_max_batch_size']))
      held = (rows[..., None] * (idx[..., None] == slots)).sum(-2)   # [E, S, per]
      return leftover, held.reshape(-1, slots.shape[0])
    return jax.vmap(one)(cl.x, cl.y, cl.mask, jnp.arange(PK))

  run = jax.jit(jax.vmap(replicate, in_axes=(0, 0, 0, 0, 0, None)))
  leftover, held = (np.asarray(a) for a in run(params, clients, keys, planted.coordinates,
                                                planted.code_sign, traced))
  # Canary i sits in slot i // K of client i mod K.
  draws = np.transpose(held[:, owner, :, np.arange(PM) // PK], (1, 0, 2))
  return leftover, draws


@pytest.fixture(scope='module')
def poisson():
  """The Poisson trainings at noise 0 and z, with their replayed steps and draws."""
  claimed = _poisson_hooks(PZ)
  assert claimed.declaration.relation == 'add_remove'
  q = float(claimed.declaration.sampling_rate)
  assert q == BATCH / PN
  data = _gradient_canaries(PR, PK, PN, PM, 'add_remove', seed=400)
  # The claim's reading (the adversary reads the claimed rate and noise whatever ran).
  reading = canaries.StepReading(poisson=True, clip_norm=C, batch_size=BATCH, rate=q,
                                 noise_std=PZ * C, base_rows=PN)
  out = dict(claimed=claimed, data=data, q=q, world=data[4].ravel())
  for z in (0.0, PZ):
    hooks = _poisson_hooks(z).hooks
    leftover, out['draws'] = _replay_steps(data, hooks, claimed)
    out[z] = (_train_gradient(data, hooks, reading, epochs=PE, num_rounds=1), leftover)
  return out


def _own(leftover, owner):
  """[R x m, steps]: each canary's leftover on its own client's steps."""
  r = leftover.shape[0]
  return np.transpose(leftover[:, owner, :, np.arange(PM)], (1, 0, 2)).reshape(r * PM, -1)


def test_poisson_step_reading_without_noise_is_the_clip_on_exactly_the_drawn_steps(poisson):
  sc, leftover = poisson[0.0]
  owner, world = poisson['data'][5], poisson['world']
  draws = poisson['draws'].reshape(PR * PM, -1)                      # [R x m, steps]
  steps = PE * -(-PN // BATCH)
  assert draws.shape[1] == steps and set(np.unique(draws)) <= {0.0, 1.0}
  assert not draws[~world].any()          # an OUT canary's row is padding: never drawn
  # The IN rows join each step at the public rate B / n = 1/2 (not B / the shard's rows).
  lo, hi = sp_stats.binomtest(int(draws[world].sum()), draws[world].size).proportion_ci(0.999)
  assert lo < poisson['q'] < hi
  # L = C on the steps whose batch drew the canary, 0 on the others; 0 on a coordinate of
  # another client's canary.
  np.testing.assert_allclose(_own(leftover, owner), C * draws, rtol=0, atol=1e-5)
  others = np.ones(leftover.shape, bool)
  others[:, owner, :, np.arange(PM)] = False
  np.testing.assert_allclose(leftover[others], 0.0, atol=1e-5)
  # train's reading of the same steps: sum L, sum L^2, the steps; the score of the claim.
  drawn = draws.sum(axis=1)
  np.testing.assert_allclose(sc.step_moments[:, 0], C * drawn, atol=1e-4)
  np.testing.assert_allclose(sc.step_moments[:, 1], C * C * drawn, atol=1e-4)
  np.testing.assert_array_equal(sc.step_moments[:, 2], steps)
  # The readings themselves (`poisson_mle`'s input): C on exactly the drawn steps.
  np.testing.assert_allclose(sc.step_readings, C * draws, rtol=0, atol=1e-5)
  llr = canaries.step_llr(jnp.asarray(C * draws), poisson['q'], C, PZ * C)
  np.testing.assert_allclose(sc.steps, np.asarray(llr).sum(axis=1), rtol=1e-5, atol=1e-4)


def test_poisson_step_reading_is_the_canary_plus_independent_gaussian_noise(poisson):
  sc, leftover = poisson[PZ]
  owner = poisson['data'][5]
  draws = poisson['draws']                                            # [R, m, steps]
  own = _own(leftover, owner)
  # train reads exactly these steps.
  np.testing.assert_allclose(sc.step_moments[:, 0], own.sum(axis=1), rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(sc.step_moments[:, 1], (own**2).sum(axis=1), rtol=1e-5,
                             atol=1e-4)
  # train keeps the readings themselves, one a step (every step of a Poisson client is live).
  assert sc.step_readings.shape == own.shape
  np.testing.assert_allclose(sc.step_readings, own, rtol=1e-5, atol=1e-4)
  # L minus the canary's own clipped gradient: N(0, (z C)^2), 2560 readings.
  resid = own - C * draws.reshape(PR * PM, -1)
  assert sp_stats.kstest(resid.ravel() / (PZ * C), 'norm').pvalue > P_MIN
  # Independent across canaries: on every client step, the leftovers of the m coordinates
  # (own contribution removed) are uncorrelated: N = R x K x steps = 256 steps, and each of
  # the 780 pairs' correlation has sd 1/16; 5 sd bounds their maximum (a union bound gives a
  # false alarm below 1e-3).
  all_resid = leftover.copy()
  all_resid[:, owner, :, np.arange(PM)] -= C * np.transpose(draws, (1, 0, 2))
  flat = all_resid.reshape(-1, PM)
  corr = np.corrcoef(flat, rowvar=False)
  assert np.abs(corr[~np.eye(PM, dtype=bool)]).max() < 5 / math.sqrt(flat.shape[0])


def test_poisson_readings_are_kept_round_by_round_and_nan_where_no_step_ran():
  # Client 0 holds canaries 0 and 1, client 1 canary 2 and an empty slot; 2 rounds of 3
  # steps. Round 1: only client 0 takes part, and its last step is padding (live 0).
  reading = canaries.StepReading(poisson=True, clip_norm=C, batch_size=2, rate=0.5,
                                 noise_std=1.0, base_rows=4)
  slot_of = jnp.asarray([[0, 1], [2, -1]])
  observe, reduce, init, _ = canary_training._example_observers(  # pylint: disable=protected-access
      'gradient', reading, slot_of, jnp.arange(3), None, None, None, lambda p: p,
      noise_std=1.0, num_rounds=2, steps=3)
  leftover = jnp.arange(9.0).reshape(3, 3) + 1.0                 # [S, m]
  live = jnp.asarray([1.0, 1.0, 0.0])

  @jax.jit   # one compiled program: op-by-op dispatch costs seconds on a loaded machine
  def rounds_of(init):
    seen = jax.vmap(lambda i: observe(None, 1, i, None, jnp.zeros(3),
                                      (leftover, jnp.zeros((3, 2)), live)))(jnp.arange(2))
    one = reduce(init, 1, seen, jnp.asarray([1.0, 0.0]))
    return seen[3], one[3], reduce(one, 0, seen, jnp.asarray([1.0, 1.0]))[3]
  reads, got, both = (np.asarray(a) for a in rounds_of(init))
  # reads [clients, slots, S]; got, both [clients, slots, T, S].
  np.testing.assert_array_equal(reads[0], [[1.0, 4.0, np.nan], [2.0, 5.0, np.nan]])
  assert got.shape == (2, 2, 2, 3)
  np.testing.assert_array_equal(got[0, :, 1], reads[0])
  assert np.isnan(got[:, :, 0]).all() and np.isnan(got[1]).all()
  # Both clients in round 0: client 1's canary gets its column, the empty slot stays NaN.
  got = both
  np.testing.assert_array_equal(got[1, 0, 0], [3.0, 6.0, np.nan])
  assert np.isnan(got[1, 1]).all()
  np.testing.assert_array_equal(got[0, :, 1], reads[0])


def test_poisson_scores_are_the_step_llr_and_follow_the_claimed_curve(poisson):
  sc, leftover = poisson[PZ]
  q, world = poisson['q'], poisson['world']
  own = _own(leftover, poisson['data'][5])
  np.testing.assert_allclose(sc.steps, np.asarray(canaries.step_llr(
      jnp.asarray(own), q, C, PZ * C)).sum(axis=1), rtol=1e-5, atol=1e-4)
  scores = canaries.threat_scores(sc, 'all_steps', 'server', participation=1.0)
  # The claimed mechanism's optimal attack, simulated (`canary_statistics.curve_scores`): the
  # same steps, noise and rate; two-sample KS per world against 8000 simulated canaries.
  curve = canary_statistics.Curve(steps=PE * -(-PN // BATCH), noise=PZ, rate=q)
  rng = np.random.default_rng(0)
  for w in (True, False):
    sim = canary_statistics.curve_scores(curve, np.full(8000, w), rng)
    assert sp_stats.ks_2samp(scores[world == w], sim).pvalue > P_MIN, w
  assert scores[world].mean() > scores[~world].mean() + 0.5   # the worlds do separate


def test_shuffled_dp_sgd_step_score_is_the_signed_clip_per_epoch_round_plus_noise():
  # Shuffled DP-SGD (replace-one: +Dirac / -Dirac): every canary row is in exactly one batch
  # an epoch, whose leftover the adversary sums: +/-C per epoch-round plus N(0, (zC)^2 E T).
  k, n, m, r, e, t, z = 2, 8, 40, 4, 2, 2, 0.8
  setting = registry.Setting(num_classes=CLASSES, batch_size=BATCH, num_examples=n, epochs=e,
                             rounds=t, num_clients=k)
  conf = lambda zz: configured.sweep_point('dp_sgd', zz, setting, experiment='training_audit',
                                           prefix='t', fixed={'clip_norm': C,
                                                              'sampling': 'shuffle'})
  assert conf(z).declaration.relation == 'replace_one'
  data = _gradient_canaries(r, k, n, m, 'replace_one', seed=500)
  reading = canaries.StepReading(poisson=False, clip_norm=C, batch_size=BATCH, rate=1.0,
                                 noise_std=z * C, base_rows=n)
  sign = np.where(data[4].ravel(), 1.0, -1.0)
  exact = _train_gradient(data, conf(0.0).hooks, reading, epochs=e, num_rounds=t)
  np.testing.assert_allclose(exact.steps, sign * C * e * t, rtol=0, atol=1e-5)
  # Off its batch a canary's coordinate moves by nothing: the sum of L over every step too.
  np.testing.assert_allclose(exact.step_moments[:, 0], sign * C * e * t, rtol=0, atol=1e-4)
  np.testing.assert_array_equal(exact.step_moments[:, 2], t * e * -(-(n + m // k) // BATCH))
  noisy = _train_gradient(data, conf(z).hooks, reading, epochs=e, num_rounds=t)
  resid = (canaries.threat_scores(noisy, 'all_steps', 'server', participation=1.0)
           - sign * C * e * t) / (z * C * math.sqrt(e * t))
  assert sp_stats.kstest(resid, 'norm').pvalue > P_MIN
