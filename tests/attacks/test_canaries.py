"""Canaries inside the training that runs (`attacks.audit.canaries`, `fl.rounds.Injected`)."""

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
from fl_privacy.defenses import dp
from fl_privacy.eval import auditing
from fl_privacy.fl import client as client_lib
from fl_privacy.fl import local
from fl_privacy.fl import losses
from fl_privacy.fl import rounds

DIM_IN, CLASSES = 6, 3


def _model():
  model = models.MLP(hidden=(4,), num_classes=CLASSES)
  params = model.init(jax.random.key(0), jnp.zeros((1, DIM_IN)))
  return model, params


def _clients(k=3, n=8, seed=0):
  rng = np.random.default_rng(seed)
  return rounds.ClientData(x=rng.normal(size=(k, n, DIM_IN)).astype(np.float32),
                           y=rng.integers(0, CLASSES, (k, n)).astype(np.int32))


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
  # Weight 8 against 3 x 8: each round moves coordinate 3 by -1/4.
  np.testing.assert_allclose(np.asarray(final - flat)[3], -0.5, rtol=1e-6)
  np.testing.assert_allclose(np.delete(np.asarray(final - flat), 3), 0.0, atol=1e-7)


def test_injected_uploads_go_through_the_upload_hook_with_their_own_keys():
  model, params = _model()
  flat, unravel = flatten_util.ravel_pytree(params)
  j = 400
  dirs = canaries.directions(jax.random.key(2), j, flat.shape[0], 'random')
  world = canaries.coins(jax.random.key(3), j)
  inj = canaries.injected_clients(dirs, world, unravel, norm=2.0, relation='replace_one',
                                  size=8.0)
  hooks = client_lib.ClientHooks(upload=dp.update_dp_hook(1.0, 0.5))
  ravel = lambda p: flatten_util.ravel_pytree(p)[0]
  d = jnp.asarray(dirs)

  def observe(k, t, i, gp, upload):
    del k, t, gp
    return ravel(upload) @ d[jnp.clip(i - 3, 0, j - 1)]

  def reduce(state, t, seen, part):
    return state.at[t].set(seen[3:])

  _, log = _run(model, params, _clients(), hooks, injected=inj, observe=observe,
                reduce=reduce, init=jnp.zeros((3, j)))
  seen = np.asarray(log.observed)
  sign = np.where(world, 1.0, -1.0)
  resid = seen - sign[None] * 1.0          # clipped to C = 1, noise N(0, 0.5^2)
  # Noise of std 0.5 around the clipped canary: a KS test, and fresh noise every round.
  assert sp_stats.kstest(resid.ravel() / 0.5, 'norm').pvalue > 1e-3
  assert np.abs(np.corrcoef(resid[0], resid[1])[0, 1]) < 4 / math.sqrt(j)


def test_participation_is_drawn_over_real_and_injected_clients():
  model, params = _model()
  flat, unravel = flatten_util.ravel_pytree(params)
  inj = rounds.Injected(deltas=jax.vmap(unravel)(jnp.zeros((7, flat.shape[0]))),
                        sizes=jnp.ones(7))
  _, log = _run(model, params, _clients(), None, injected=inj, participation=0.5)
  parts = np.asarray(log.participants)
  assert parts.shape == (3, 10)
  assert np.all(parts.sum(axis=1) == 5)


# ------------------------------------------------------------------------- canaries ---


def test_coins_are_fair_independent_of_their_number_and_keyed():
  c = canaries.coins(jax.random.key(0), 20_000)
  np.testing.assert_array_equal(canaries.coins(jax.random.key(0), 50), c[:50])
  lo, hi = sp_stats.binomtest(int(c.sum()), c.size).proportion_ci(0.999)
  assert lo < 0.5 < hi
  assert not np.array_equal(canaries.coins(jax.random.key(1), 50), c[:50])


def test_directions_are_unit_and_dirac_ones_distinct():
  r = canaries.directions(jax.random.key(0), 50, 30, 'random')
  np.testing.assert_allclose(np.linalg.norm(r, axis=1), 1.0, rtol=1e-5)
  d = canaries.directions(jax.random.key(0), 30, 30, 'dirac')
  np.testing.assert_array_equal(d.sum(axis=0), np.ones(30))
  with pytest.raises(ValueError, match='need as many coordinates'):
    canaries.directions(jax.random.key(0), 31, 30, 'dirac')
  with pytest.raises(ValueError, match='direction must be'):
    canaries.directions(jax.random.key(0), 3, 30, 'gaussian')


def test_injected_clients_signs_and_sizes_follow_the_relation():
  flat = jnp.zeros(4)
  unravel = lambda v: v
  dirs = np.eye(4, dtype=np.float32)[:3]
  world = np.array([True, False, True])
  rep = canaries.injected_clients(dirs, world, unravel, norm=2.0, relation='replace_one',
                                  size=5.0)
  np.testing.assert_allclose(np.asarray(rep.deltas)[:, :3], np.diag([2.0, -2.0, 2.0]))
  np.testing.assert_allclose(rep.sizes, [5.0, 5.0, 5.0])
  add = canaries.injected_clients(dirs, world, unravel, norm=2.0, relation='add_remove',
                                  size=5.0)
  np.testing.assert_allclose(np.asarray(add.deltas)[:, :3], np.diag([2.0, 2.0, 2.0]))
  np.testing.assert_allclose(add.sizes, [5.0, 0.0, 5.0])
  del flat


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


def test_gradient_canary_rows_have_the_dirac_gradient_and_real_rows_their_own():
  model, params = _model()
  ravel = lambda p: flatten_util.ravel_pytree(p)[0]
  loss_fn = losses.make_loss_fn(model.apply)
  coords = np.array([5, 11])
  hook = canaries.gradient_canary_loss(client_lib.IDENTITY.loss, CLASSES, coords,
                                       np.array([1.0, -1.0], np.float32), 3.0, ravel)
  x = np.random.default_rng(0).normal(size=(3, DIM_IN)).astype(np.float32)
  y = np.array([CLASSES + 1, 2, CLASSES], np.int32)
  one = lambda i: ravel(jax.grad(lambda p: hook(None, loss_fn, p, x[i:i + 1], y[i:i + 1],
                                                jnp.ones(1), None))(params))
  g_canary = np.asarray(one(0))
  expect = np.zeros_like(g_canary)
  expect[11] = -3.0
  np.testing.assert_allclose(g_canary, expect, atol=1e-7)
  g_first = np.asarray(one(2))
  assert g_first[5] == pytest.approx(3.0) and np.count_nonzero(g_first) == 1
  g_real = np.asarray(one(1))
  plain = np.asarray(ravel(jax.grad(lambda p: loss_fn(p, x[1:2], y[1:2]))(params)))
  np.testing.assert_allclose(g_real, plain, rtol=1e-6, atol=1e-7)


def test_dp_sgd_clips_the_gradient_canary_to_the_clip_norm():
  model, params = _model()
  ravel = lambda p: flatten_util.ravel_pytree(p)[0]
  loss_fn = losses.make_loss_fn(model.apply)
  hook = canaries.gradient_canary_loss(client_lib.IDENTITY.loss, CLASSES, np.array([2]),
                                       np.array([1.0], np.float32), 5.0, ravel)
  hooks = client_lib.ClientHooks(loss=hook, grad=dp.dp_sgd_hook(1.0, 0.0))
  x = np.zeros((1, DIM_IN), np.float32)
  y = np.array([CLASSES], np.int32)
  new = local.fedavg(loss_fn, params, x, y, key=jax.random.key(0), optimizer=optax.sgd(1.0),
                     epochs=1, batch_size=1, hooks=hooks, mask=jnp.ones(1))
  delta = np.asarray(ravel(params) - ravel(new))
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


def test_threat_scores_read_what_each_adversary_sees():
  sc = canaries.Scores(uploads=np.array([1.0, 2.0]),
                       aggregates=np.array([[0.1, 0.2], [0.3, 0.4]]),
                       known=np.array([[1.0, 0.0], [0.0, 2.0]]), participants=np.array([10, 20]),
                       last=np.array([5.0, 6.0]), test_accuracy=0.5)
  np.testing.assert_allclose(canaries.threat_scores(sc, 'all_iterates', 'server',
                                                    participation=1.0), [1.0, 2.0])
  np.testing.assert_allclose(canaries.threat_scores(sc, 'last_iterate', 'aggregate',
                                                    participation=1.0), [5.0, 6.0])
  np.testing.assert_allclose(canaries.threat_scores(sc, 'all_iterates', 'aggregate',
                                                    participation=1.0), [0.4, 0.6])
  # k_t x aggregate - known: (1 - 1) + (6 - 0), (2 - 0) + (8 - 2)
  np.testing.assert_allclose(canaries.threat_scores(sc, 'all_iterates', 'aggregate',
                                                    participation=1.0, known=True), [6.0, 8.0])
  with pytest.raises(ValueError, match='threat must be'):
    canaries.threat_scores(sc, 'first_iterate', 'server', participation=1.0)


def test_threat_scores_under_participation_sampling_are_the_mixture_llr_by_hand():
  # float32 readings, as a training returns them: every score comes back in float64.
  f32 = lambda a: np.asarray(a, np.float32)
  sc = canaries.Scores(uploads=f32([1.0, 2.0]), aggregates=f32([[0.1, -0.2], [0.3, 0.4]]),
                       known=f32([[1.0, 0.0], [0.0, 2.0]]), participants=f32([10, 20]),
                       last=f32([5.0, 6.0]), test_accuracy=0.5)
  for threat, adversary in (('last_iterate', 'server'), ('all_iterates', 'server'),
                            ('all_iterates', 'aggregate')):
    assert canaries.threat_scores(sc, threat, adversary, participation=1.0).dtype == np.float64
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
                                                      known=True, **kw), left.sum(axis=0))


# ----------------------------------------------------------------------- statistics ---


def test_counted_bounds_follow_the_curve_and_independence():
  assert canaries.counted_bounds('update_dp', False) == ('epsilon_one_run',
                                                         'epsilon_one_run_fdp')
  assert canaries.counted_bounds('update_dp', True) == ('epsilon_one_run', 'epsilon_one_run_fdp',
                                                        'epsilon_cp', 'epsilon_gdp')
  assert canaries.counted_bounds('ldp_sgd', True) == ('epsilon_one_run', 'epsilon_cp')
  assert canaries.counted_bounds('dp_sgd_poisson', False) == ('epsilon_one_run',)
  assert canaries.counted_bounds('central_dp_without_replacement', True) == (
      'epsilon_one_run', 'epsilon_cp')


def test_gaussian_fit_recovers_mu_and_its_epsilon():
  rng = np.random.default_rng(0)
  mu, eps = canaries.gaussian_fit_epsilon(rng.normal(1.5, 2.0, 40_000),
                                          rng.normal(0.0, 2.0, 40_000), 1e-5)
  assert mu == pytest.approx(0.75, abs=4 * math.sqrt(2 / 40_000) * 1.1)
  assert eps == pytest.approx(auditing.gdp_epsilon(mu, 1e-5))


def test_audit_flags_a_mechanism_above_its_claim_and_not_one_below():
  rng = np.random.default_rng(0)
  world = rng.random(20_000) < 0.5
  # mu = 2: epsilon about 8.6 at delta 1e-5.
  strong = rng.normal(size=world.size) + 2.0 * world
  m = canaries.audit(strong, world, 'update_dp', 2.0, delta=1e-5, confidence=0.95,
                     independent=True)
  assert m['privacy_violation'] == 1.0 and m['best_bound'] > 2.0
  assert m['bound_confidence'] == pytest.approx(1 - 0.05 / 4)
  assert m['n_in'] + m['n_out'] == 20_000 == m['num_canaries']
  null = rng.normal(size=world.size)
  m0 = canaries.audit(null, world, 'update_dp', 0.5, delta=1e-5, confidence=0.95,
                      independent=True)
  assert m0['privacy_violation'] == 0.0
  with pytest.raises(ValueError, match='two canaries in each world'):
    canaries.audit(null[:3], np.array([True, False, False]), 'update_dp', 1.0, delta=1e-5,
                   confidence=0.95)


def test_audit_verdict_holds_its_family_wise_level_under_the_null():
  # 60 null audits at a tiny claim: a verdict at family-wise 95% may fire in at most a
  # few of them (Binomial(60, 0.05) exceeds 9 with probability < 3e-3).
  rng = np.random.default_rng(1)
  fired = 0
  for _ in range(60):
    world = rng.random(400) < 0.5
    m = canaries.audit(rng.normal(size=400), world, 'update_dp', 1e-3, delta=1e-5,
                       confidence=0.95, independent=True)
    fired += int(m['privacy_violation'])
  assert fired <= 9


# ------------------------------------------------------------------- one training ---


def _train_client(hooks, participation, world, dirs, norm=2.0):
  model, params = _model()
  _, unravel = flatten_util.ravel_pytree(params)
  inj = canaries.injected_clients(dirs, world, unravel, norm=norm, relation='replace_one',
                                  size=8.0)
  return canaries.train(model.apply, params, _clients(), key=jax.random.key(4), hooks=hooks,
                        num_rounds=3, optimizer=optax.sgd(0.1), epochs=1, batch_size=4,
                        participation=participation, kind='client', clip_norm=1.0,
                        canary_dirs=dirs, injected=inj)


def test_canary_clients_scores_without_noise_are_exact():
  _, params = _model()
  dim = flatten_util.ravel_pytree(params)[0].shape[0]
  j = 12
  dirs = canaries.directions(jax.random.key(5), j, dim, 'dirac')
  world = canaries.coins(jax.random.key(6), j)
  sign = np.where(world, 1.0, -1.0)
  # update_dp at z = 0: each upload is the canary clipped to C = 1.
  up = _train_client(client_lib.ClientHooks(upload=dp.update_dp_hook(1.0, 0.0)), 1.0, world,
                     dirs)
  np.testing.assert_allclose(up.uploads, 3.0 * sign, rtol=1e-5)
  np.testing.assert_array_equal(up.participants, [15, 15, 15])
  np.testing.assert_allclose(up.last, up.aggregates.sum(axis=0), rtol=1e-4, atol=1e-6)
  # central_dp at z = 0 with participation: k_t x aggregate minus the real participants'
  # clipped uploads is the canary's clipped update where it took part, 0 elsewhere.
  agg = _train_client(client_lib.ClientHooks(aggregate=dp.central_dp_hook(1.0, 0.0)), 0.6,
                      world, dirs)
  np.testing.assert_array_equal(agg.participants, [9, 9, 9])
  left = agg.aggregates * agg.participants[:, None] - agg.known
  # Who took part: the round loop's documented draw over the 3 real and 12 canary clients.
  took_part = np.stack([np.asarray(rounds.participants(jax.random.key(4), t, 15, 0.6))[3:]
                        for t in range(3)])
  assert 0 < took_part.mean() < 1
  np.testing.assert_allclose(left, took_part * sign, atol=1e-4)
  # The server's reading of each canary's own (unclipped, norm 2) upload, over its rounds.
  np.testing.assert_allclose(agg.uploads, 2.0 * sign * took_part.sum(axis=0), rtol=1e-5)
  own = canaries.threat_scores(agg, 'all_iterates', 'aggregate', participation=1.0, known=True)
  np.testing.assert_allclose(own, left.sum(axis=0), rtol=1e-6)


@pytest.mark.parametrize('kind', ['gradient', 'input'])
def test_one_client_one_round_server_view_equals_the_last_iterate(kind):
  # One client, one round: w_0 - w_1 is that client's upload, so the server's reading of its
  # upload and the last iterate's reading agree exactly (for inputs: the loss decrease).
  model, params = _model()
  ravel = lambda p: flatten_util.ravel_pytree(p)[0]
  dim = ravel(params).shape[0]
  clients = _clients(k=1, n=8)
  m = 6
  world = np.array([True, False, True, True, False, True])
  rng = np.random.default_rng(3)
  kw = {}
  hooks = client_lib.ClientHooks(grad=dp.dp_sgd_hook(1.0, 0.5))
  if kind == 'gradient':
    coords = canaries.dirac_coordinates(jax.random.key(1), m, dim)
    x = np.zeros((m, DIM_IN), np.float32)
    y = (CLASSES + np.arange(m)).astype(np.int32)
    hooks = hooks._replace(loss=canaries.gradient_canary_loss(
        client_lib.IDENTITY.loss, CLASSES, coords, np.ones(m, np.float32), 2.0, ravel))
    kw.update(coordinates=coords)
  else:
    x = rng.normal(size=(m, DIM_IN)).astype(np.float32)
    y = rng.integers(0, CLASSES, m).astype(np.int32)
    kw.update(canary_x=x, canary_y=y)
  ex = canaries.place_examples(clients, x, y, world, 'add_remove')
  sc = canaries.train(model.apply, params, ex.clients, key=jax.random.key(2), hooks=hooks,
                      num_rounds=1, optimizer=optax.sgd(0.5), epochs=1, batch_size=4,
                      participation=1.0, kind=kind, clip_norm=1.0, examples=ex, **kw)
  np.testing.assert_allclose(sc.uploads, sc.last, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(sc.aggregates[0], sc.last, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------- exact values (mutation run) ---


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


def test_dirac_coordinates_are_distinct_keyed_and_allowed_up_to_the_dimension():
  c = canaries.dirac_coordinates(jax.random.key(0), 30, 30)
  np.testing.assert_array_equal(np.sort(c), np.arange(30))
  d = canaries.dirac_coordinates(jax.random.key(0), 5, 1000)
  assert len(set(d.tolist())) == 5 and d.max() < 1000
  assert not np.array_equal(d, canaries.dirac_coordinates(jax.random.key(1), 5, 1000))
  with pytest.raises(ValueError, match='31 gradient canaries need as many coordinates'):
    canaries.dirac_coordinates(jax.random.key(0), 31, 30)


@pytest.mark.parametrize('mechanism,independent', [('update_dp', True), ('update_dp', False),
                                                   ('dp_sgd_poisson', False),
                                                   ('ldp_sgd', True)])
def test_audit_reports_every_field_as_computed_by_hand(mechanism, independent):
  rng = np.random.default_rng(4)
  world = rng.random(3000) < 0.5
  scores = rng.normal(size=world.size) + 1.2 * world
  claim = 3.0
  curve = lambda grid: np.zeros_like(grid)          # a claim of pure 0-DP: refuted
  m = canaries.audit(scores, world, mechanism, claim, delta=1e-5, confidence=0.9,
                     independent=independent, claimed_delta=curve)
  counted = canaries.counted_bounds(mechanism, independent)
  k = len(counted) + int(independent)
  each = 1 - 0.1 / k
  ref = auditing.audit_scores(scores[world], scores[~world], delta=1e-5, confidence=each)
  for key in ('epsilon_one_run', 'epsilon_one_run_fdp', 'epsilon_cp', 'epsilon_gdp'):
    assert m[key] == pytest.approx(ref[key], abs=1e-12), key
  assert m['bound_confidence'] == pytest.approx(each)
  assert m['verdict_confidence'] == 0.9
  assert m['best_bound'] == pytest.approx(max(ref[c] for c in counted))
  assert m['tightness'] == pytest.approx(m['best_bound'] / claim)
  assert m['counted_bounds'] == ','.join(counted + (('profile',) if independent else ()))
  assert m['canaries_independent'] == float(independent)
  assert m['num_canaries'] == 3000 and m['n_in'] == world.sum() and m['n_out'] == (~world).sum()
  assert m['score_in_mean'] == pytest.approx(scores[world].mean())
  assert m['score_out_mean'] == pytest.approx(scores[~world].mean())
  if mechanism == 'ldp_sgd':
    assert math.isnan(m['epsilon_estimate']) and math.isnan(m['gdp_mu_estimate'])
  else:
    mu, eps = canaries.gaussian_fit_epsilon(scores[world], scores[~world], 1e-5)
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
  # A world given as 0/1 integers is the same mask as the bools.
  by_bool = canaries.audit(scores, world, 'update_dp', 2.5, delta=1e-5, confidence=0.9,
                           independent=True, claimed_delta=curve)
  by_int = canaries.audit(scores, world.astype(np.int64), 'update_dp', 2.5, delta=1e-5,
                          confidence=0.9, independent=True, claimed_delta=curve)
  assert by_int == pytest.approx(by_bool, nan_ok=True)
  assert by_int['n_in'] == world.sum()
  # The profile test runs on 41 epsilons evenly spaced over [0, 2 x claim], at the
  # Bonferroni level, and its verdict alone makes a violation.
  calls = []

  def profile(ins, outs, claimed_delta, grid, *, confidence):
    calls.append((ins, outs, claimed_delta, np.asarray(grid), confidence))
    return {'profile_violation': verdict, 'profile_excess': 0.25, 'profile_epsilon': 1.5}

  monkeypatch.setattr(canaries.auditing, 'profile_violation', profile)
  for verdict in (0.0, 1.0):
    m = canaries.audit(scores, world, 'update_dp', 2.5, delta=1e-5, confidence=0.9,
                       independent=True, claimed_delta=curve)
    ins, outs, claimed, grid, level = calls[-1]
    np.testing.assert_array_equal(grid, np.linspace(0.0, 5.0, 41))
    np.testing.assert_array_equal(ins, scores[world])
    np.testing.assert_array_equal(outs, scores[~world])
    k = len(canaries.counted_bounds('update_dp', True)) + 1
    assert claimed is curve and level == pytest.approx(1 - 0.1 / k)
    assert m['best_bound'] < 2.5  # null scores: no counted bound refutes the claim
    assert (m['profile_violation'], m['profile_excess'], m['profile_epsilon']) == (
        verdict, 0.25, 1.5)
    assert m['privacy_violation'] == verdict
  # A counted bound equal to the claim does not refute it; just above does; a bound not
  # counted decides nothing.
  bounds = {'epsilon_one_run': 2.0, 'epsilon_one_run_fdp': 1.0, 'epsilon_cp': 9.0,
            'epsilon_gdp': 9.0}
  monkeypatch.setattr(canaries.auditing, 'audit_scores',
                      lambda ins, outs, *, delta, confidence: bounds)
  for claim, want in ((2.0, 0.0), (1.999, 1.0)):
    m = canaries.audit(scores, world, 'update_dp', claim, delta=1e-5, confidence=0.95)
    assert m['best_bound'] == 2.0 and m['privacy_violation'] == want, claim


def test_gaussian_fit_of_identical_constant_scores_is_infinite_and_of_equal_means_zero():
  assert canaries.gaussian_fit_epsilon(np.ones(5), np.ones(5), 1e-5) == (math.inf, math.inf)
  mu, eps = canaries.gaussian_fit_epsilon(np.array([1.0, -1.0, 1.0, -1.0]),
                                          np.array([2.0, -2.0]), 1e-5)
  assert mu == 0.0 and eps == 0.0


def test_gaussian_fit_by_hand_with_unbiased_variances():
  ins, outs = np.array([0.0, 2.0, 4.0]), np.array([1.0, 1.0, 4.0, 6.0])
  # var (ddof 1): 4 and 6.0; pooled sd sqrt(5); means 2 and 3.
  mu, eps = canaries.gaussian_fit_epsilon(ins, outs, 1e-5)
  assert mu == pytest.approx(1.0 / math.sqrt(5.0))
  assert eps == pytest.approx(auditing.gdp_epsilon(1.0 / math.sqrt(5.0), 1e-5))


@pytest.mark.parametrize('with_mask', [True, False])
def test_gradient_canary_loss_on_a_mixed_batch_is_the_mean_over_its_real_rows(with_mask):
  model, params = _model()
  ravel = lambda p: flatten_util.ravel_pytree(p)[0]
  loss_fn = losses.make_loss_fn(model.apply)
  coords = np.array([7, 3])
  hook = canaries.gradient_canary_loss(client_lib.IDENTITY.loss, CLASSES, coords,
                                       np.array([1.0, -1.0], np.float32), 2.5, ravel)
  x = np.random.default_rng(1).normal(size=(4, DIM_IN)).astype(np.float32)
  y = np.array([1, CLASSES + 1, 2, CLASSES], np.int32)
  mask = jnp.asarray([1.0, 1.0, 1.0, 0.0]) if with_mask else None
  got = hook(None, loss_fn, params, jnp.asarray(x), jnp.asarray(y), mask, None)
  ce = losses.per_example_cross_entropy(model.apply(params, x[[0, 2]]), y[[0, 2]])
  w = ravel(params)
  if with_mask:   # rows 0, 1, 2 are real: two data rows and canary 1 (sign -1, coordinate 3)
    want = (ce.sum() - 2.5 * w[3]) / 3
  else:           # every row: canary 0 (sign +1, coordinate 7) too
    want = (ce.sum() - 2.5 * w[3] + 2.5 * w[7]) / 4
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_audit_defaults_to_dependent_canaries_and_accepts_two_a_world():
  scores = np.array([3.0, 2.5, -1.0, -0.5])
  world = np.array([True, True, False, False])
  m = canaries.audit(scores, world, 'update_dp', 1.0, delta=1e-5, confidence=0.95)
  assert m['canaries_independent'] == 0.0
  assert m['counted_bounds'] == 'epsilon_one_run,epsilon_one_run_fdp'
  assert math.isnan(m['profile_epsilon']) and math.isnan(m['profile_violation'])
  assert m['n_in'] == 2 and m['n_out'] == 2


def test_gaussian_fit_below_unit_spread():
  mu, _ = canaries.gaussian_fit_epsilon(np.array([0.0, 0.2]), np.array([0.1, 0.3]), 1e-5)
  # variances 0.02 each: pooled sd sqrt(0.02); means 0.1 and 0.2.
  assert mu == pytest.approx(0.1 / math.sqrt(0.02))


def test_test_accuracy_is_the_final_models_and_nan_without_a_test_split():
  model, params = _model()
  rng = np.random.default_rng(7)
  tx = rng.normal(size=(40, DIM_IN)).astype(np.float32)
  ty = rng.integers(0, CLASSES, 40).astype(np.int32)
  cx = rng.normal(size=(4, DIM_IN)).astype(np.float32)
  cy = np.zeros(4, np.int32)
  ex = canaries.place_examples(_clients(), cx, cy, np.array([True, False, True, False]),
                               'add_remove')
  kw = dict(key=jax.random.key(2), hooks=client_lib.ClientHooks(), num_rounds=2,
            optimizer=optax.sgd(0.5), epochs=1, batch_size=4, participation=1.0)
  sc = canaries.train(model.apply, params, ex.clients, kind='input', clip_norm=1.0,
                      examples=ex, canary_x=cx, canary_y=cy, test_x=tx, test_y=ty, **kw)
  final, _ = rounds.run(losses.make_loss_fn(model.apply), params, ex.clients, **kw)
  want = np.mean(np.argmax(np.asarray(model.apply(final, tx)), -1) == ty)
  assert 0 < want < 1
  assert sc.test_accuracy == pytest.approx(want, abs=1e-9)
  # Without a test split, and with 2 of the 3 clients taking part in one round: a canary
  # of a client that sat out has no reading (0, not a division by its 0 participation).
  kw.update(num_rounds=1, participation=0.5)
  bare = canaries.train(model.apply, params, ex.clients, kind='input', clip_norm=1.0,
                        examples=ex, canary_x=cx, canary_y=cy, **kw)
  assert math.isnan(bare.test_accuracy)
  took = np.asarray(rounds.participants(kw['key'], 0, 3, 0.5))[ex.owner]
  assert 0 < took.sum() < 4
  assert np.all(bare.uploads[~took] == 0) and np.all(bare.uploads[took] != 0)
  assert bare.known.shape == (1, 4) and not bare.known.any()  # a client canaries' field


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


def test_signs_refuse_an_unknown_relation_naming_the_allowed_ones():
  np.testing.assert_array_equal(canaries.signs('replace_one', np.array([True, False])),
                                [1.0, -1.0])
  with pytest.raises(ValueError, match="relation must be 'add_remove' or 'replace_one' "
                     r"\(got 'zero_out'\)"):
    canaries.signs('zero_out', np.array([True]))


def test_slot_positions_count_each_clients_canaries_in_order():
  owner = np.array([0, 1, 0, 0, 1, 2, 0])
  np.testing.assert_array_equal(canaries._slot_positions(owner), [0, 0, 1, 2, 1, 0, 3])  # pylint: disable=protected-access
  # place_examples' round-robin placement: canary i in slot i // K of client i mod K.
  ex = canaries.place_examples(_clients(k=3, n=2), np.zeros((8, DIM_IN), np.float32),
                               np.zeros(8, np.int32), np.ones(8, bool), 'replace_one')
  np.testing.assert_array_equal(canaries._slot_positions(ex.owner), np.arange(8) // 3)  # pylint: disable=protected-access
