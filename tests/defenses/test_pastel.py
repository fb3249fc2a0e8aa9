"""PASTEL regulariser: JS properties, gradients through both batches, lambda = 0 is no hook."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.spatial import distance

from fl_privacy import models
from fl_privacy.defenses import pastel
from fl_privacy.fl import local
from fl_privacy.fl import losses
from fl_privacy.fl import optimizers


def _dirichlet(rng, n, d, alpha=0.5):
  return rng.dirichlet(np.full(d, alpha), size=n).astype(np.float64)


def test_js_symmetric_bounded_and_zero_iff_equal():
  rng = np.random.default_rng(0)
  p, q = _dirichlet(rng, 200, 7), _dirichlet(rng, 200, 7)
  js_pq = np.asarray(pastel.js_divergence(jnp.asarray(p), jnp.asarray(q)))
  js_qp = np.asarray(pastel.js_divergence(jnp.asarray(q), jnp.asarray(p)))
  np.testing.assert_allclose(js_pq, js_qp, rtol=1e-6, atol=1e-7)
  assert np.all(js_pq > 0) and np.all(js_pq <= math.log(2) + 1e-6)
  np.testing.assert_allclose(pastel.js_divergence(jnp.asarray(p), jnp.asarray(p)), 0.0, atol=1e-7)
  # Disjoint supports reach the bound ln 2 (nats).
  a, b = jnp.array([0.5, 0.5, 0.0, 0.0]), jnp.array([0.0, 0.0, 0.3, 0.7])
  np.testing.assert_allclose(pastel.js_divergence(a, b), math.log(2), rtol=1e-6)


def test_js_equals_scipy_jensenshannon_squared_natural_log():
  rng = np.random.default_rng(1)
  for _ in range(50):
    d = int(rng.integers(2, 12))
    p, q = _dirichlet(rng, 1, d)[0], _dirichlet(rng, 1, d)[0]
    p[rng.integers(d)] = 0.0  # a zero entry exercises 0 log 0 = 0
    p /= p.sum()
    want = distance.jensenshannon(p, q) ** 2  # base None: natural log
    got = float(pastel.js_divergence(jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)


def _mlp_setup(seed=0, n=40, h=24, d=6):
  model = models.MLP(hidden=(16, 8), num_classes=3)
  key = jax.random.key(seed)
  x = jax.random.normal(jax.random.fold_in(key, 1), (n, d))
  y = jax.random.randint(jax.random.fold_in(key, 2), (n,), 0, 3)
  vx = jax.random.normal(jax.random.fold_in(key, 3), (h, d)) + 0.5
  vy = jax.random.randint(jax.random.fold_in(key, 4), (h,), 0, 3)
  variables = model.init(jax.random.fold_in(key, 5), x[:1])
  return model, variables, x, y, vx, vy


@pytest.mark.parametrize('representation', pastel.REPRESENTATIONS)
def test_gradients_flow_through_both_batches(representation):
  model, variables, x, y, vx, vy = _mlp_setup()
  loss_fn = losses.make_loss_fn(model.apply)
  layers = ('fc1', 'fc2', 'fc3')

  def reg(xb, vxb):
    aux = {'x': vxb, 'y': vy, 'mask': jnp.ones(vy.shape[0])}
    return pastel.regulariser(jax.random.key(7), model.apply, loss_fn, variables, xb, y, None,
                              aux, layers=layers, representation=representation,
                              heldout_batch_size=vy.shape[0])

  # Jitted: traced once, not dispatched op by op (eager second derivatives take seconds).
  value = jax.jit(reg)(x, vx)
  assert 0 < float(value) <= math.log(2)
  gx, gv = jax.jit(jax.grad(reg, argnums=(0, 1)))(x, vx)
  assert np.all(np.isfinite(gx)) and np.all(np.isfinite(gv))
  assert float(jnp.max(jnp.abs(gx))) > 0 and float(jnp.max(jnp.abs(gv))) > 0
  gp = jax.jit(jax.grad(lambda v: pastel.regulariser(
      jax.random.key(7), model.apply, loss_fn, v, x, y, None,
      {'x': vx, 'y': vy, 'mask': jnp.ones(vy.shape[0])}, layers=layers,
      representation=representation)))(variables)
  assert all(np.all(np.isfinite(g)) for g in jax.tree_util.tree_leaves(gp))
  assert float(jnp.abs(gp['params']['fc1']['kernel']).max()) > 0


def test_gradient_representation_is_a_distribution():
  model, variables, x, y, _, _ = _mlp_setup()
  loss_fn = losses.make_loss_fn(model.apply)
  dist = pastel.gradient_distributions(loss_fn, variables, x, y, None, ('fc1', 'fc3'))
  assert dist['fc1'].shape == (6 * 16,) and dist['fc3'].shape == (8 * 3,)
  for v in dist.values():
    assert float(jnp.min(v)) >= 0
    np.testing.assert_allclose(float(jnp.sum(v)), 1.0, rtol=1e-5)


def test_activation_on_output_layer_is_mean_predicted_distribution():
  model, variables, x, _, _, _ = _mlp_setup()
  dist = pastel.activation_distributions(model.apply, variables, x, None, ('fc3',), 1.0)
  want = jnp.mean(jax.nn.softmax(model.apply(variables, x)), axis=0)
  np.testing.assert_allclose(dist['fc3'], want, rtol=1e-5, atol=1e-7)
  # A mask drops rows exactly.
  mask = jnp.concatenate([jnp.ones(10), jnp.zeros(x.shape[0] - 10)])
  dist = pastel.activation_distributions(model.apply, variables, x, mask, ('fc3',), 1.0)
  want = jnp.mean(jax.nn.softmax(model.apply(variables, x[:10])), axis=0)
  np.testing.assert_allclose(dist['fc3'], want, rtol=1e-5, atol=1e-7)


def test_conv_outputs_are_averaged_over_space():
  model = models.FlowerCNN(10, padding='SAME')
  x = jnp.ones((3, 8, 8, 1))
  variables = model.init(jax.random.key(0), x)
  names = pastel.available_layers(model.apply, variables, x)
  assert 'conv1' in names and 'fc3' in names
  hs = pastel.layer_outputs(model.apply, variables, x, ('conv1', 'fc1'))
  assert hs['conv1'].shape == (3, 6) and hs['fc1'].shape == (3, 120)
  assert pastel.dense_layers(variables) == ('fc1', 'fc2', 'fc3')


def test_draw_heldout_takes_distinct_real_rows():
  aux = {'x': jnp.arange(10.0)[:, None], 'y': jnp.arange(10), 'mask':
         jnp.array([1, 0, 1, 1, 0, 1, 1, 0, 1, 1], jnp.float32)}
  for i in range(20):
    vx, vy, vm = pastel.draw_heldout(jax.random.key(i), aux, 5)
    assert len(set(np.asarray(vy).tolist())) == 5
    assert np.all(np.asarray(aux['mask'])[np.asarray(vy)] == 1) and np.all(vm == 1)
  # Fewer real rows than asked: the extra slots are masked out.
  _, vy, vm = pastel.draw_heldout(jax.random.key(0), aux, 9)
  assert float(jnp.sum(vm)) == 7
  assert set(np.asarray(vy)[np.asarray(vm) > 0].tolist()) == {0, 2, 3, 5, 6, 8, 9}


@pytest.mark.parametrize('padded', [False, True])
def test_weight_zero_trains_bit_for_bit_as_without_the_hook(padded):
  model, variables, x, y, vx, vy = _mlp_setup(n=45)
  loss_fn = losses.make_loss_fn(model.apply)
  aux = {'x': vx, 'y': vy, 'mask': jnp.ones(vy.shape[0])}
  mask = None
  if padded:
    mask = jnp.concatenate([jnp.ones(37), jnp.zeros(8)])
  kw = dict(key=jax.random.key(3), optimizer=optimizers.make('adagrad', 0.1), epochs=2,
            batch_size=8, mask=mask)
  hook = pastel.make(model.apply, weight=0.0, layers=('fc1',))
  plain = local.fedavg(loss_fn, variables, x, y, **kw)
  hooked = local.fedavg(loss_fn, variables, x, y, hooks=hook, aux=aux, **kw)
  for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(hooked)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # A positive weight changes training (the regulariser is active).
  active = local.fedavg(loss_fn, variables, x, y, aux=aux,
                        hooks=pastel.make(model.apply, weight=1.0, layers=('fc1', 'fc3')), **kw)
  assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
             zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(active)))


def test_regulariser_shrinks_its_divergence_when_trained_on_alone():
  """Minimising only the JS term (huge lambda relative to CE) lowers the member/held-out JS."""
  model, variables, x, y, vx, vy = _mlp_setup(seed=2)
  vx = vx + 1.5  # a large member / held-out shift, well above the batch-sampling noise
  loss_fn = losses.make_loss_fn(model.apply)
  aux = {'x': vx, 'y': vy, 'mask': jnp.ones(vy.shape[0])}
  layers = ('fc1', 'fc2', 'fc3')
  before = pastel.mean_jsd(model.apply, loss_fn, variables, x, y, vx, vy, layers=layers)
  zero_ce = lambda params, xb, yb, mb=None: 0.0 * loss_fn(params, xb, yb, mb)
  hook = pastel.make(model.apply, weight=1.0, layers=layers, heldout_batch_size=24)
  trained = local.fedavg(zero_ce, variables, x, y, key=jax.random.key(0), hooks=hook, aux=aux,
                         optimizer=optimizers.make("adagrad", 0.1), epochs=100, batch_size=40)
  after = pastel.mean_jsd(model.apply, loss_fn, trained, x, y, vx, vy, layers=layers)
  assert after < 0.5 * before


def test_make_rejects_bad_arguments():
  with pytest.raises(ValueError):
    pastel.make(lambda *a, **k: None, weight=-1.0, layers=('fc1',))
  with pytest.raises(ValueError):
    pastel.make(lambda *a, **k: None, weight=1.0, layers=('fc1',), representation='logits')
  with pytest.raises(ValueError):
    pastel.make(lambda *a, **k: None, weight=1.0, layers=())


def test_heldout_aux_pads_with_a_mask():
  aux = pastel.heldout_aux([np.ones((3, 2)), np.ones((5, 2))], [np.zeros(3), np.zeros(5)])
  assert aux['x'].shape == (2, 5, 2) and aux['mask'].sum(axis=1).tolist() == [3, 5]


def _heldout_seen(key, batch_size=8):
  """Held-out labels of V at each local step of one `fedavg` run (PASTEL's draw, recorded)."""
  model, variables, x, y, _, _ = _mlp_setup(n=32)
  loss_fn = losses.make_loss_fn(model.apply)
  # 24 held-out rows labelled 0..23: a V of 8 of them names itself by its labels.
  aux = {'x': jnp.zeros((24, x.shape[1])), 'y': jnp.arange(24), 'mask': jnp.ones(24)}
  seen = []

  def loss(k, lf, params, xb, yb, mask, aux):
    _, vy, _ = pastel.draw_heldout(k, aux, batch_size)
    jax.debug.callback(lambda v: seen.append(tuple(sorted(np.asarray(v).tolist()))), vy)
    return lf(params, xb, yb, mask) if mask is not None else lf(params, xb, yb)

  from fl_privacy.fl import client  # pylint: disable=g-import-not-at-top
  local.fedavg(loss_fn, variables, x, y, key=key, optimizer=optimizers.make('adagrad', 0.1),
               epochs=2, batch_size=batch_size, hooks=client.ClientHooks(loss=loss), aux=aux)
  return seen


def test_v_is_a_fresh_batch_every_step_and_the_same_key_gives_the_same_v():
  # 2 epochs x 4 steps: the loss hook's step keys (fold_in of (epoch, step)) draw 8 distinct
  # V batches of 8 rows out of 24; a batch repeating by chance has probability ~1e-5.
  seen = _heldout_seen(jax.random.key(0))
  assert len(seen) == 8 and all(len(set(v)) == 8 for v in seen)
  assert len(set(seen)) == 8
  assert _heldout_seen(jax.random.key(0)) == seen
  assert _heldout_seen(jax.random.key(1)) != seen


def test_gradient_reading_has_a_finite_gradient_where_the_model_fits_the_batch():
  # Huge logits with the predicted labels: the CE gradient is exactly 0, P_l(X) uniform. The
  # regulariser's gradient must stay finite (it was NaN: 0 x d(a / t)/dt at t = 0).
  model = models.MLP(hidden=(4,), num_classes=3)
  variables = jax.tree_util.tree_map(lambda a: 1e3 * a,
                                     model.init(jax.random.key(0), jnp.ones((1, 2))))
  x = 10.0 * jnp.ones((2, 2))
  y = jnp.argmax(model.apply(variables, x), -1)
  loss_fn = losses.make_loss_fn(model.apply)

  def js(v):
    p = pastel.gradient_distributions(loss_fn, v, x, y, None, ('fc1',))['fc1']
    q = pastel.gradient_distributions(loss_fn, v, 0.5 * x, y, None, ('fc1',))['fc1']
    return pastel.js_divergence(p, q)

  grads = jax.grad(js)(variables)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))


@pytest.mark.parametrize('representation', pastel.REPRESENTATIONS)
def test_each_reading_changes_training(representation):
  """The regulariser is non-zero with a non-zero gradient, so lambda > 0 moves the model."""
  model, variables, x, y, vx, vy = _mlp_setup(n=32)
  loss_fn = losses.make_loss_fn(model.apply)
  aux = {'x': vx, 'y': vy, 'mask': jnp.ones(vy.shape[0])}
  reg = lambda v: pastel.regulariser(jax.random.key(0), model.apply, loss_fn, v, x[:8], y[:8],
                                     None, aux, layers=('fc1', 'fc2', 'fc3'),
                                     representation=representation, heldout_batch_size=8)
  value, grads = jax.value_and_grad(reg)(variables)
  assert float(value) > 0
  assert sum(float(jnp.sum(jnp.abs(g))) for g in jax.tree_util.tree_leaves(grads)) > 0
  kw = dict(key=jax.random.key(3), optimizer=optimizers.make('adagrad', 0.1), epochs=1,
            batch_size=8, aux=aux)
  plain = local.fedavg(loss_fn, variables, x, y, **kw)
  hooked = local.fedavg(loss_fn, variables, x, y, hooks=pastel.make(
      model.apply, weight=10.0, layers=('fc1', 'fc2', 'fc3'), representation=representation,
      heldout_batch_size=8), **kw)
  assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
             zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(hooked)))
