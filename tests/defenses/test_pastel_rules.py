"""Fast rule checks of PASTEL's pieces against hand computations (no training loops)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.spatial import distance

from fl_privacy import models
from fl_privacy.defenses import pastel
from fl_privacy.fl import losses


def _np_kl(p, q, axis):
  with np.errstate(divide='ignore', invalid='ignore'):
    return np.sum(np.where(p > 0, p * np.log(p / q), 0.0), axis=axis)


def _np_js(p, q, axis=-1):
  m = (p + q) / 2
  return (_np_kl(p, m, axis) + _np_kl(q, m, axis)) / 2


def test_kl_and_js_along_an_axis_match_numpy():
  rng = np.random.default_rng(0)
  p = rng.dirichlet(np.ones(4), size=5).T  # distributions along axis 0
  q = rng.dirichlet(np.ones(4), size=5).T
  p[1, 2] = 0.0
  p[:, 2] /= p[:, 2].sum()
  for axis, (a, b) in ((0, (p, q)), (-1, (p.T, q.T)), (1, (p.T, q.T))):
    np.testing.assert_allclose(pastel.kl_divergence(jnp.asarray(a), jnp.asarray(b), axis),
                               _np_kl(a, b, axis), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(pastel.js_divergence(jnp.asarray(a), jnp.asarray(b), axis),
                               distance.jensenshannon(a, b, axis=axis) ** 2, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(pastel.kl_divergence(jnp.asarray(p.T), jnp.asarray(q.T)),
                             _np_kl(p.T, q.T, -1), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(pastel.js_divergence(jnp.asarray(p.T), jnp.asarray(q.T)),
                             _np_js(p.T, q.T), rtol=1e-5, atol=1e-7)


def test_masked_batch_mean_weights_the_real_rows():
  v = jnp.asarray(np.arange(12.0).reshape(4, 3))
  np.testing.assert_allclose(pastel._masked_batch_mean(v, None), np.arange(12.0).reshape(4, 3)
                             .mean(0))
  for mask in ([0.0, 0.0, 1.0, 0.0], [0.5, 0.0, 2.0, 0.0], [1.0, 1.0, 0.0, 1.0]):
    m = np.asarray(mask)
    want = (np.arange(12.0).reshape(4, 3) * m[:, None]).sum(0) / m.sum()
    np.testing.assert_allclose(pastel._masked_batch_mean(v, jnp.asarray(mask)), want, rtol=1e-6)
  np.testing.assert_array_equal(pastel._masked_batch_mean(v, jnp.zeros(4)), np.zeros(3))


def _setup(n=6, h=8, d=3, seed=0):
  model = models.MLP(hidden=(4,), num_classes=3)
  key = jax.random.key(seed)
  x = jax.random.normal(jax.random.fold_in(key, 1), (n, d))
  y = jax.random.randint(jax.random.fold_in(key, 2), (n,), 0, 3)
  vx = jax.random.normal(jax.random.fold_in(key, 3), (h, d)) + 0.7
  vy = jax.random.randint(jax.random.fold_in(key, 4), (h,), 0, 3)
  variables = model.init(jax.random.fold_in(key, 5), x[:1])
  return model, variables, x, y, vx, vy


def _forward(variables, x):
  p = jax.tree_util.tree_map(np.asarray, variables['params'])
  h1 = np.asarray(x) @ p['fc1']['kernel'] + p['fc1']['bias']
  h2 = np.maximum(h1, 0) @ p['fc2']['kernel'] + p['fc2']['bias']
  return {'fc1': h1, 'fc2': h2}


def _softmax(h):
  e = np.exp(h - h.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _act(variables, x, mask, tau):
  m = np.ones(len(x)) if mask is None else np.asarray(mask)
  return {k: (_softmax(h / tau) * m[:, None]).sum(0) / max(m.sum(), 1.0)
          for k, h in _forward(variables, x).items()}


def _grad_dist(loss_fn, variables, x, y, mask):
  g = jax.grad(lambda v: loss_fn(v, x, y, mask))(variables)['params']
  out = {}
  for k in ('fc1', 'fc2'):
    a = np.abs(np.asarray(g[k]['kernel'])).ravel()
    out[k] = a / a.sum()
  return out


def test_layer_outputs_and_activation_distributions_match_a_hand_forward_pass():
  model, variables, x, _, _, _ = _setup()
  hs = pastel.layer_outputs(model.apply, variables, x, ('fc2', 'fc1'))
  want = _forward(variables, x)
  assert list(hs) == ['fc2', 'fc1']
  for k in hs:
    np.testing.assert_allclose(hs[k], want[k], rtol=1e-5, atol=1e-6)
  mask = jnp.asarray([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
  for m, tau in ((None, 1.0), (mask, 2.5)):
    got = pastel.activation_distributions(model.apply, variables, x, m, ('fc1', 'fc2'), tau)
    for k, v in _act(variables, x, m, tau).items():
      np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-7)
  assert pastel.available_layers(model.apply, variables, x) == ('fc1', 'fc2')
  assert pastel.dense_layers(variables) == ('fc1', 'fc2')
  assert pastel.dense_layers({'params': {'a': {'kernel': jnp.zeros((2, 2, 1))}, 'b': 1.0,
                                         'c': {'bias': jnp.zeros(2)},
                                         'd': {'kernel': jnp.zeros((2, 3))}}}) == ('d',)


def test_gradient_distributions_normalise_the_kernel_gradients():
  model, variables, x, y, _, _ = _setup()
  loss_fn = losses.make_loss_fn(model.apply)
  mask = jnp.asarray([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
  for m in (None, mask):
    got = pastel.gradient_distributions(loss_fn, variables, x, y, m, ('fc1', 'fc2'))
    for k, v in _grad_dist(loss_fn, variables, x, y, m).items():
      assert got[k].shape == (v.size,)
      np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-8)
  # An all-zero gradient gives the uniform distribution.
  flat = lambda v, xb, yb, mb=None: 0.0 * loss_fn(v, xb, yb, mb)
  got = pastel.gradient_distributions(flat, variables, x, y, None, ('fc1',))
  np.testing.assert_array_equal(got['fc1'], np.full(12, 1 / 12, np.float32))


def test_draw_heldout_is_uniform_over_the_real_rows():
  mask = jnp.asarray([1, 0, 1, 1, 0, 1, 1, 0], jnp.float32)
  aux = {'x': jnp.arange(8.0)[:, None] * 10, 'y': jnp.arange(8), 'mask': mask}
  n = 1000
  vx, vy, vm = jax.vmap(lambda k: pastel.draw_heldout(k, aux, 3))(
      jax.random.split(jax.random.key(0), n))
  vy = np.asarray(vy)
  assert vy.shape == (n, 3) and np.all(np.asarray(vm) == 1)
  np.testing.assert_array_equal(np.asarray(vx)[..., 0], vy * 10)
  assert all(len(set(r)) == 3 for r in vy.tolist())
  counts = np.bincount(vy.ravel(), minlength=8)
  assert np.all(counts[[1, 4, 7]] == 0)
  sd = np.sqrt(n * 0.6 * 0.4)
  assert np.all(np.abs(counts[[0, 2, 3, 5, 6]] - n * 0.6) < 5 * sd), counts
  # Asking for more than H rows gives H slots, the padding ones masked out.
  vx, vy, vm = pastel.draw_heldout(jax.random.key(1), aux, 20)
  assert vy.shape == (8,) and float(vm.sum()) == 5
  assert sorted(np.asarray(vy)[np.asarray(vm) > 0].tolist()) == [0, 2, 3, 5, 6]


def _reg_by_hand(key, model, loss_fn, variables, x, y, mask, aux, layers, rep, tau, b):
  vx, vy, vm = pastel.draw_heldout(key, aux, b)
  if rep == 'activation':
    p, q = _act(variables, x, mask, tau), _act(variables, vx, vm, tau)
  else:
    p = _grad_dist(loss_fn, variables, x, y, mask)
    q = _grad_dist(loss_fn, variables, vx, vy, vm)
  return np.mean([_np_js(p[k], q[k]) for k in layers])


@pytest.mark.parametrize('rep', pastel.REPRESENTATIONS)
def test_regulariser_and_the_loss_hook_are_eq5(rep):
  model, variables, x, y, vx, vy = _setup()
  loss_fn = losses.make_loss_fn(model.apply)
  aux = {'x': vx, 'y': vy, 'mask': jnp.asarray([1, 1, 1, 0, 1, 1, 1, 1], jnp.float32)}
  key, layers = jax.random.key(7), ('fc1', 'fc2')
  mask = jnp.asarray([1.0, 1.0, 1.0, 1.0, 0.0, 1.0])
  # |V| = 8 > the 7 real held-out rows: V's padding slot is masked out of P_l(V).
  for b, want_b, m, tau in ((None, 6, None, 1.0), (3, 3, mask, 0.5), (8, 8, None, 1.5)):
    want = _reg_by_hand(key, model, loss_fn, variables, x, y, m, aux, layers, rep, tau, want_b)
    got = pastel.regulariser(key, model.apply, loss_fn, variables, x, y, m, aux, layers=layers,
                             representation=rep, temperature=tau, heldout_batch_size=b)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
    assert want > 1e-4
    calls = []

    def recording(params, xb, yb, *mb):
      calls.append(len(mb))
      return loss_fn(params, xb, yb, *mb)
    hook = pastel.make(model.apply, weight=0.3, layers=list(layers), representation=rep,
                       temperature=tau, heldout_batch_size=b)
    total = hook.loss(key, recording, variables, x, y, m, aux)
    ce = loss_fn(variables, x, y, m)
    np.testing.assert_allclose(total, ce + 0.3 * want, rtol=1e-4)
    assert calls[0] == (0 if m is None else 1)
  if rep == 'activation':
    mj = pastel.mean_jsd(model.apply, loss_fn, variables, x, y, vx, vy, layers=layers,
                         temperature=2.0)
    want = np.mean([_np_js(_act(variables, x, None, 2.0)[k], _act(variables, vx, None, 2.0)[k])
                    for k in layers])
    default = np.mean([_np_js(_act(variables, x, None, 1.0)[k],
                              _act(variables, vx, None, 1.0)[k]) for k in layers])
    np.testing.assert_allclose(  # temperature 1 by default
        pastel.mean_jsd(model.apply, loss_fn, variables, x, y, vx, vy, layers=layers), default,
        rtol=1e-4)
  else:
    mj = pastel.mean_jsd(model.apply, loss_fn, variables, x, y, vx, vy, layers=layers,
                         representation=rep)
    p, q = (_grad_dist(loss_fn, variables, x, y, None),
            _grad_dist(loss_fn, variables, vx, vy, None))
    want = np.mean([_np_js(p[k], q[k]) for k in layers])
  assert isinstance(mj, float)
  np.testing.assert_allclose(mj, want, rtol=1e-4)


def test_weight_zero_is_the_plain_loss_and_a_traced_weight_computes_the_term():
  model, variables, x, y, vx, vy = _setup()
  loss_fn = losses.make_loss_fn(model.apply)
  aux = {'x': vx, 'y': vy, 'mask': jnp.ones(8)}
  key = jax.random.key(1)
  ce = loss_fn(variables, x, y)
  zero = pastel.make(model.apply, weight=0, layers=('fc1',))
  assert zero.loss(key, loss_fn, variables, x, y, None, None) == ce  # aux is never read
  reg = pastel.regulariser(key, model.apply, loss_fn, variables, x, y, None, aux, layers=('fc1',))
  for w in (jnp.asarray(0.5), 2):
    hook = pastel.make(model.apply, weight=w, layers=('fc1',))
    np.testing.assert_allclose(hook.loss(key, loss_fn, variables, x, y, None, aux),
                               ce + float(w) * reg, rtol=1e-6)
  with pytest.raises(ValueError, match=r"^representation must be one of \('activation', "
                                       r"'gradient'\) \(got 'logits'\)$"):
    pastel.regulariser(key, model.apply, loss_fn, variables, x, y, None, aux, layers=('fc1',),
                       representation='logits')


def test_make_rejects_bad_arguments_with_their_messages():
  apply = lambda *a, **k: None
  cases = [(dict(weight=-0.5), r'^weight must be >= 0 \(got -0.5\)$'),
           (dict(representation='logits'),
            re.escape("representation must be one of ('activation', 'gradient') (got 'logits')")),
           (dict(layers=()), r'^layers must name at least one layer$'),
           (dict(temperature=0.0), r'^temperature must be > 0 \(got 0.0\)$'),
           (dict(temperature=-1.0), r'^temperature must be > 0 \(got -1.0\)$')]
  for kw, msg in cases:
    args = dict(weight=1.0, layers=('fc1',)) | kw
    with pytest.raises(ValueError, match=msg):
      pastel.make(apply, **args)
  for weight in (0.0, 0, jnp.asarray(-1.0)):  # a traced weight is not checked
    pastel.make(apply, weight=weight, layers=('fc1',), temperature=1e-3)


def test_heldout_aux_pads_rows_and_masks():
  xs = [np.arange(6.0).reshape(3, 2), np.arange(10.0).reshape(5, 2) + 100, np.ones((1, 2))]
  ys = [np.asarray([1, 2, 3]), np.asarray([4, 5, 6, 7, 8]), np.asarray([9])]
  aux = pastel.heldout_aux(xs, ys)
  assert aux['x'].shape == (3, 5, 2) and aux['y'].shape == (3, 5)
  assert aux['x'].dtype == np.float64 and aux['y'].dtype == ys[0].dtype
  assert aux['mask'].dtype == np.float32
  np.testing.assert_array_equal(aux['mask'], [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
  for k in range(3):
    n = len(ys[k])
    np.testing.assert_array_equal(aux['x'][k, :n], xs[k])
    np.testing.assert_array_equal(aux['y'][k, :n], ys[k])
    assert np.all(aux['x'][k, n:] == 0) and np.all(aux['y'][k, n:] == 0)
  with pytest.raises(ValueError, match='^every client needs at least one held-out row$'):
    pastel.heldout_aux([np.ones((2, 2)), np.ones((0, 2))], [np.zeros(2), np.zeros(0)])
