"""DP defenses: clipping bounds, noise scale (KS test), accounting equal to dp-accounting."""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

from fl_privacy import accounting
from fl_privacy import defenses
from fl_privacy import models
from fl_privacy.defenses import dp
from fl_privacy.defenses import registry
from fl_privacy.fl import local
from fl_privacy.fl import losses
from fl_privacy.mechanisms import gaussian


def _per_example(seed=0, n=16):
  rng = np.random.default_rng(seed)
  # Norms spread from well below to well above C = 1.
  return {'w': jnp.asarray(rng.normal(size=(n, 6, 5)) * rng.uniform(0.01, 0.5, (n, 1, 1)),
                           jnp.float32),
          'b': jnp.asarray(rng.normal(size=(n, 5)) * 0.05, jnp.float32)}


def test_clipped_per_example_norms_at_most_c():
  g = _per_example()
  clipped, norms = gaussian.clip_per_example(g, 1.0)
  after = np.asarray(gaussian.per_example_norms(clipped))
  assert np.all(after <= 1.0 + 1e-5)
  small = np.asarray(norms) <= 1.0
  assert small.any() and (~small).any()
  np.testing.assert_allclose(after[small], np.asarray(norms)[small], rtol=1e-6)
  np.testing.assert_allclose(after[~small], 1.0, rtol=1e-5)


@pytest.mark.parametrize('jit', [False, True])
def test_noise_free_private_gradient_is_the_masked_mean_of_clipped(jit):
  g = _per_example()
  mask = jnp.asarray([1.0] * 12 + [0.0] * 4)
  hook = defenses.make('dp_sgd', clip_norm=1.0, noise_multiplier=0.0).grad
  out = (jax.jit(hook) if jit else hook)(jax.random.key(0), g, mask)
  clipped, _ = gaussian.clip_per_example(g, 1.0)
  for k in g:
    np.testing.assert_allclose(out[k], np.asarray(clipped[k])[:12].sum(0) / 12, rtol=1e-5,
                               atol=1e-7)


def _noise_samples(noise_multiplier, clip_norm, batch=8, size=4000):
  # A zero per-example gradient isolates the noise: out = N(0, (sigma C)^2) / B per entry.
  g = {'w': jnp.zeros((batch, size), jnp.float32)}
  out = defenses.make('dp_sgd', clip_norm=clip_norm,
                      noise_multiplier=noise_multiplier).grad(jax.random.key(7), g,
                                                              jnp.ones(batch))
  return np.asarray(out['w']) * batch


def test_dp_sgd_noise_scale_by_ks_test():
  sigma, c = 1.3, 0.7
  x = _noise_samples(sigma, c)
  scale = sigma * c
  # n = 4,000: the KS test at level 1e-3 accepts the stated scale and rejects 2/3x and 3/2x.
  assert stats.kstest(x, 'norm', args=(0, scale)).pvalue > 1e-3
  assert stats.kstest(x, 'norm', args=(0, scale * 2 / 3)).pvalue < 1e-3
  assert stats.kstest(x, 'norm', args=(0, scale * 3 / 2)).pvalue < 1e-3


def test_update_dp_clips_then_noises():
  delta = {'w': jnp.full((100,), 1.0)}  # norm 10
  out = defenses.make('update_dp', clip_norm=2.0, noise_multiplier=0.0).upload(
      jax.random.key(0), delta, None)
  np.testing.assert_allclose(np.linalg.norm(np.asarray(out['w'])), 2.0, rtol=1e-5)
  big = {'w': jnp.zeros((5000,))}
  noisy = defenses.make('update_dp', clip_norm=2.0, noise_multiplier=0.5).upload(
      jax.random.key(1), big, None)
  assert stats.kstest(np.asarray(noisy['w']), 'norm', args=(0, 1.0)).pvalue > 1e-3


def test_central_dp_clips_each_upload_and_scales_noise_by_k():
  k = 4
  uploads = {'w': jnp.stack([jnp.full((10,), float(i + 1)) for i in range(k)])}
  weights = jnp.asarray([100.0, 1.0, 0.0, 5.0])  # client 2 does not participate
  hook = defenses.make('central_dp', clip_norm=1.0, noise_multiplier=0.0).aggregate
  mean = hook(jax.random.key(0), uploads, weights)
  # Each participant's update clipped to norm 1 (all point the same way), equal weights / 3.
  np.testing.assert_allclose(np.asarray(mean['w']), np.full(10, 1 / np.sqrt(10)), rtol=1e-5)
  zeros = {'w': jnp.zeros((k, 6000))}
  noisy = defenses.make('central_dp', clip_norm=1.5, noise_multiplier=2.0).aggregate(
      jax.random.key(1), zeros, jnp.ones(k))
  assert stats.kstest(np.asarray(noisy['w']), 'norm', args=(0, 2.0 * 1.5 / k)).pvalue > 1e-3


def _poisson(q, steps, n=None):
  if q < 1:
    return accounting.Declaration('t', 'record', 'add_remove', 'server', 'poisson', 1.0, steps,
                                  q, population=n)
  return accounting.Declaration('t', 'record', 'add_remove', 'server', 'none', 1.0, steps)


@pytest.mark.parametrize('q,steps', [(1.0, 1), (1.0, 10), (0.03125, 32), (0.01, 1000)])
@pytest.mark.parametrize('accountant', ['rdp', 'pld'])
def test_epsilon_equals_dp_accounting_called_directly(q, steps, accountant):
  z, delta = 1.1, 1e-5
  event = dp_accounting.GaussianDpEvent(z)
  if q < 1:
    event = dp_accounting.PoissonSampledDpEvent(q, event)
  acc = (dp_accounting.rdp.RdpAccountant() if accountant == 'rdp'
         else dp_accounting.pld.PLDAccountant())
  acc.compose(dp_accounting.SelfComposedDpEvent(event, steps))
  got = accounting.epsilon(_poisson(q, steps), z, delta=delta, accountant=accountant)
  assert got == pytest.approx(acc.get_epsilon(delta), rel=1e-12)


@pytest.mark.parametrize('sensitivity', [1.0, 2.0])
def test_sensitivity_scales_the_noise_multiplier(sensitivity):
  decl = accounting.Declaration('t', 'record', 'replace_one', 'server', 'none', sensitivity, 3)
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(
      1.5 / sensitivity), 3))
  assert accounting.epsilon(decl, 1.5, delta=1e-5) == pytest.approx(acc.get_epsilon(1e-5))


def test_truncated_poisson_is_accounted_by_pld_and_costs_more_when_tight():
  decl = accounting.Declaration('t', 'record', 'add_remove', 'server', 'poisson', 1.0, 20,
                                0.2, population=100, max_batch_size=60)
  loose = accounting.epsilon(decl, 1.0, delta=1e-5, accountant='pld')
  plain = accounting.epsilon(_poisson(0.2, 20), 1.0, delta=1e-5, accountant='pld')
  assert loose == pytest.approx(plain, rel=1e-3)  # 60 slots: overflow ~ never
  tight = dataclasses.replace(decl, max_batch_size=22)
  assert accounting.epsilon(tight, 1.0, delta=1e-5, accountant='pld') > plain * 1.05


@pytest.mark.parametrize('target', [1.0, 4.0, 8.0])
def test_noise_multiplier_for_target_epsilon(target):
  decl = _poisson(32 / 1024, 32)
  z = accounting.noise_multiplier_for(decl, target, delta=1e-5)
  assert accounting.epsilon(decl, z, delta=1e-5) <= target
  assert accounting.epsilon(decl, z * 0.99, delta=1e-5) > target * 0.999  # (near) the smallest


def test_weak_dp_reports_per_round_and_composed():
  setting = defenses.Setting(rounds=10, num_clients=5)
  _, m = registry.dp_metrics('weak_dp', {}, setting, noise_multiplier=2.0,
                             target_epsilon=None, delta=1e-5)
  one = accounting.server_dp('weak_dp', rounds=10, num_clients=5, per_round=True)
  assert m['dp_epsilon_per_round'] == pytest.approx(accounting.epsilon(one, 2.0, delta=1e-5))
  ten = accounting.server_dp('central_dp', rounds=10, num_clients=5)
  assert m['dp_epsilon'] == pytest.approx(accounting.epsilon(ten, 2.0, delta=1e-5))
  assert m['dp_epsilon'] > m['dp_epsilon_per_round']
  assert accounting.epsilon(one, 0.0, delta=1e-5) == float('inf')


def test_bad_declarations_and_arguments_raise():
  with pytest.raises(ValueError, match='unit'):
    accounting.Declaration('t', 'batch', 'add_remove', 'server', 'none')
  with pytest.raises(ValueError, match='add_remove'):
    accounting.Declaration('t', 'record', 'replace_one', 'server', 'poisson', 2.0, 1, 0.5)
  with pytest.raises(ValueError, match='delta'):
    accounting.epsilon(_poisson(1.0, 1), 1.0, delta=0.0)
  with pytest.raises(ValueError, match='target_epsilon'):
    accounting.noise_multiplier_for(_poisson(1.0, 1), math.inf, delta=1e-5)


def test_dp_sgd_trains_through_fedavg_under_jit():
  model = models.MLP(hidden=(8,), num_classes=3)
  x = jax.random.normal(jax.random.key(0), (24, 5))
  y = jnp.arange(24) % 3
  params = model.init(jax.random.key(1), x[:1])
  loss_fn = losses.make_loss_fn(model.apply)
  hooks = defenses.make('dp_sgd', clip_norm=1e-3, noise_multiplier=0.0)
  out = jax.jit(lambda p: local.fedavg(loss_fn, p, x, y, key=jax.random.key(2),
                                       optimizer=optax.sgd(1.0), epochs=1, batch_size=8,
                                       hooks=hooks))(params)
  # Every step moves the parameters by at most lr * C (the mean of clipped gradients).
  moved = np.sqrt(sum(float(jnp.sum((a - b) ** 2)) for a, b in
                      zip(jax.tree.leaves(out), jax.tree.leaves(params))))
  assert 0 < moved <= 3 * 1e-3 + 1e-7


# ----------------------------------------------------------------------------------------------
# dp_sgd_hook / central_dp_hook: Partials over (C, z[, denominator]), operands under jit.


def _uploads(k=4, seed=1):
  rng = np.random.default_rng(seed)
  return {'w': jnp.asarray(rng.normal(size=(k, 6, 5)), jnp.float32),
          'b': jnp.asarray(rng.normal(size=(k, 5)) * 0.1, jnp.float32)}


@pytest.mark.parametrize('denominator', [None, 4.0])
def test_dp_sgd_hook_is_a_partial_giving_private_gradients_numbers(denominator):
  """The hook is a `jax.tree_util.Partial` and gives `private_gradient(key, g, mask, C, z,
  denominator)`'s numbers (float32 rounding of z C apart)."""
  g, mask = _per_example(), jnp.asarray([1.0] * 12 + [0.0] * 4)
  hook = dp.dp_sgd_hook(0.8, 1.3, denominator)
  assert isinstance(hook, jax.tree_util.Partial)
  for seed in range(3):
    key = jax.random.key(seed)
    want = dp.private_gradient(key, g, mask, 0.8, 1.3, denominator)
    for out in (hook(key, g, mask), jax.jit(hook)(key, g, mask)):
      for k in g:
        np.testing.assert_allclose(out[k], want[k], rtol=1e-6, atol=1e-7)
  # The denominator is honoured: 4 divides where 12 real rows would.
  if denominator is not None:
    plain = dp.private_gradient(jax.random.key(0), g, mask, 0.8, 1.3)
    np.testing.assert_allclose(hook(jax.random.key(0), g, mask)['b'], plain['b'] * 3,
                               rtol=1e-5, atol=1e-7)


def test_central_dp_hook_is_a_partial_giving_dp_fedavgs_numbers():
  uploads, weights = _uploads(), jnp.asarray([3.0, 0.0, 1.0, 8.0])
  hook = dp.central_dp_hook(1.5, 0.7)
  assert isinstance(hook, jax.tree_util.Partial)
  for seed in range(3):
    key = jax.random.key(seed)
    want = dp.dp_fedavg(key, uploads, weights, 1.5, 0.7)
    for out in (hook(key, uploads, weights), jax.jit(hook)(key, uploads, weights)):
      for k in uploads:
        np.testing.assert_allclose(out[k], want[k], rtol=1e-6, atol=1e-7)


def test_one_compilation_serves_two_noise_multipliers():
  """A jitted function that takes the hook as an argument traces once for z = 0.5 and z = 2.0
  (C and z are leaves, not static) and still gives each z's numbers: `dp_sgd_hook`,
  `central_dp_hook`, and the dp_sgd hook inside a jitted `local.fedavg`."""
  g, mask = _per_example(), jnp.ones(16)
  uploads, weights = _uploads(), jnp.ones(4)
  key = jax.random.key(3)
  traces = []

  @jax.jit
  def step(grad_hook, aggregate_hook):
    traces.append(1)
    return grad_hook(key, g, mask), aggregate_hook(key, uploads, weights)

  for z in (0.5, 2.0):
    grad, mean = step(dp.dp_sgd_hook(1.0, z), dp.central_dp_hook(1.0, z))
    want_grad = dp.private_gradient(key, g, mask, 1.0, z)
    want_mean = dp.dp_fedavg(key, uploads, weights, 1.0, z)
    for k in g:
      np.testing.assert_allclose(grad[k], want_grad[k], rtol=1e-6, atol=1e-7)
      np.testing.assert_allclose(mean[k], want_mean[k], rtol=1e-6, atol=1e-7)
  assert len(traces) == 1

  model = models.MLP(hidden=(4,), num_classes=3)
  x = jax.random.normal(jax.random.key(0), (12, 5))
  y = jnp.arange(12) % 3
  params = model.init(jax.random.key(1), x[:1])
  loss_fn = losses.make_loss_fn(model.apply)
  kw = dict(key=jax.random.key(2), optimizer=optax.sgd(0.5), epochs=1, batch_size=4)
  trains = []

  @jax.jit
  def train(grad_hook, p):
    trains.append(1)
    return local.fedavg(loss_fn, p, x, y, hooks=defenses.ClientHooks(grad=grad_hook), **kw)

  outs = [train(dp.dp_sgd_hook(1.0, z), params) for z in (0.5, 2.0)]
  assert len(trains) == 1
  for z, out in zip((0.5, 2.0), outs):
    want = local.fedavg(loss_fn, params, x, y, hooks=defenses.make(
        'dp_sgd', clip_norm=1.0, noise_multiplier=z), **kw)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(want)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert not np.allclose(outs[0]['params']['fc1']['kernel'], outs[1]['params']['fc1']['kernel'])
