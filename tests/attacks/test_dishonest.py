"""The dishonest-server detector: Lemma 2.1, Eq. (9), and the game's exactness properties."""

from __future__ import annotations

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fl_privacy import data as data_lib
from fl_privacy import models
from fl_privacy.attacks import dishonest
from fl_privacy.eval import runner
from fl_privacy.fl import client as client_lib
from fl_privacy.fl import losses
from fl_privacy.fl import optimizers

EPS = 1e-3


def _crafted(padding='SAME', shape=(8, 8, 1), num_classes=10, m=4, label=3, seed=0):
  """A model crafted for the first of six random images; one compilation."""
  model = models.FlowerCNN(num_classes, padding=padding)

  @jax.jit
  def build(key):
    x = jax.random.uniform(key, (6,) + shape)
    variables = model.init(jax.random.fold_in(key, 1), x[:1])
    h = model.apply(variables, x, method='embed')
    crafted, chosen = dishonest.craft(variables, h[0], label, m, EPS)
    return variables, crafted, chosen, h, x

  return (model,) + build(jax.random.key(seed))


@pytest.fixture(scope='module')
def crafted():
  """FlowerCNN on 8x8x1 with M = 4 detected features, target label 3."""
  return _crafted(m=4, label=3)


def _near_target(h_t, chosen, key, count=64):
  """Feature vectors around the target: some within eps of it (L1), the rest farther away."""
  scales = jnp.geomspace(1e-6, 1e-1, count)
  noise = jax.random.normal(key, (count, chosen.shape[0]))
  noise = noise / jnp.sum(jnp.abs(noise), axis=1, keepdims=True) * scales[:, None]
  return jnp.tile(h_t, (count, 1)).at[:, chosen].add(noise)


def test_select_components_are_the_largest_magnitudes():
  rng = np.random.default_rng(0)
  for m in (1, 3, 16):
    features = rng.normal(size=64).astype(np.float32)
    idx, values = dishonest.select_components(jnp.asarray(features), m)
    assert set(np.asarray(idx)) == set(np.argsort(-np.abs(features))[:m])
    np.testing.assert_array_equal(values, features[np.asarray(idx)])


def _check_eq3(model, crafted_vars, chosen, h, label):
  hs = jnp.concatenate([h[:1], _near_target(h[0], chosen, jax.random.key(5))])
  logits = jax.jit(lambda v, f: model.apply(v, f, method='head'))(crafted_vars, hs)
  want = dishonest.detector_output(hs[:, chosen], h[0, chosen], EPS)
  np.testing.assert_allclose(logits[:, label], want, rtol=0, atol=1e-7)
  assert np.any(want > 0) and np.any(want == 0)
  np.testing.assert_array_equal(np.delete(np.asarray(logits), label, axis=1), -1.0)
  # The target itself gives b = eps.
  np.testing.assert_allclose(want[0], EPS, rtol=1e-5)


def test_target_logit_is_eq3_and_other_logits_constant(crafted):
  model, _, crafted_vars, chosen, h, _ = crafted
  _check_eq3(model, crafted_vars, chosen, h, 3)


def test_eq3_on_28x28_valid_trunk():
  model, _, crafted_vars, chosen, h, _ = _crafted('VALID', (28, 28, 1), m=8, label=6)
  assert h.shape[1] == 256
  _check_eq3(model, crafted_vars, chosen, h, 6)


def test_crafted_block_has_2m_plus_1_live_neurons(crafted):
  _, variables, crafted_vars, _, _, _ = crafted
  p = crafted_vars['params']
  assert np.count_nonzero(p['fc1']['kernel']) == 8
  assert np.count_nonzero(p['fc2']['kernel']) == 8
  assert np.count_nonzero(p['fc3']['kernel']) == 1
  np.testing.assert_array_equal(np.asarray(p['fc1']['bias'][8:]), -1.0)
  np.testing.assert_array_equal(np.asarray(p['fc2']['bias'][1:]), -1.0)
  assert float(dishonest.detector_bias(crafted_vars)) == pytest.approx(EPS)
  # The trunk keeps the weights it had.
  for name in ('conv1', 'conv2'):
    chex.assert_trees_all_equal(p[name], variables['params'][name])


def test_gradients_vanish_exactly_outside_eps(crafted):
  """Lemma 2.1: every hidden-layer (and trunk) parameter has zero gradient when sum > eps."""
  model, _, crafted_vars, chosen, h, x = crafted
  far = np.asarray(dishonest.detector_distance(h[1:, chosen], h[0, chosen])) > EPS
  assert far.all()

  def b(params, xs):
    return jnp.sum(model.apply({'params': params}, xs)[:, 3])

  def loss(params, xs, ys):
    return losses.cross_entropy(model.apply({'params': params}, xs), ys)

  @jax.jit
  def both(params, xs, ys):
    return jax.grad(b)(params, xs), jax.grad(loss)(params, xs, ys)

  for grads in both(crafted_vars['params'], x[1:], jnp.array([3, 3, 0, 1, 2])):
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
      name = jax.tree_util.keystr(path)
      if 'fc3' in name and 'bias' in name:
        continue  # output biases sit outside the hidden layers of Fig. 1: they always learn
      np.testing.assert_array_equal(leaf, 0.0, err_msg=name)


def test_eps_gradient_is_the_indicator_of_eq4(crafted):
  model, _, crafted_vars, chosen, h, _ = crafted
  hs = _near_target(h[0], chosen, jax.random.key(9))

  def b_of_eps(eps, one):
    p = crafted_vars['params']
    p = {**p, 'fc2': {**p['fc2'], 'bias': p['fc2']['bias'].at[0].set(eps)}}
    return model.apply({'params': p}, one[None], method='head')[0, 3]

  grads = jax.jit(jax.vmap(jax.grad(b_of_eps), in_axes=(None, 0)))(jnp.float32(EPS), hs)
  inside = np.asarray(dishonest.detector_distance(hs[:, chosen], h[0, chosen])) <= EPS
  assert 0 < inside.sum() < len(inside)
  np.testing.assert_array_equal(np.asarray(grads), inside.astype(np.float32))


def test_craft_rejects_m_beyond_features_or_fc1():
  model = models.FlowerCNN(10, padding='SAME')
  variables = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
  with pytest.raises(ValueError, match=r'^M=61 needs M <= 64 features and 2M <= 120 units of fc1$'):
    dishonest.craft(variables, jnp.ones(64), 0, 61, EPS)
  dishonest.craft(variables, jnp.ones(64), 0, 60, EPS)  # 2M = 120 units: fits exactly
  with pytest.raises(ValueError, match=r'^fc1 takes 64 inputs, features have 63$'):
    dishonest.craft(variables, jnp.ones(63), 0, 4, EPS)
  # 4x4 inputs: 16 trunk features, so M = 17 exceeds the features while 2M fits fc1.
  small = model.init(jax.random.key(0), jnp.zeros((1, 4, 4, 1)))
  with pytest.raises(ValueError, match=r'^M=17 needs M <= 16 features and 2M <= 120 units'):
    dishonest.craft(small, jnp.ones(16), 0, 17, EPS)
  dishonest.craft(small, jnp.arange(16.0), 0, 16, EPS)  # M = F


def test_delta_statistic_eq9():
  eps = jnp.float32(EPS)
  assert float(dishonest.delta_statistic(eps, eps + 1e-4, eps, 32)) == 0.0
  assert float(dishonest.delta_statistic(eps, eps, eps, 32)) == 0.0
  assert float(dishonest.delta_statistic(eps - 1e-4, eps + 1e-4, eps, 32)) == pytest.approx(
      32, rel=1e-4)
  assert float(dishonest.delta_statistic(eps + 2e-5, eps - 1e-4, eps, 8)) == pytest.approx(
      1.6, rel=1e-4)
  assert not dishonest.decide(jnp.float32(0.0), 0.1)
  assert dishonest.decide(jnp.float32(0.1), 0.1)


def test_server_step_is_one_optimizer_step_on_the_target(crafted):
  model, _, crafted_vars, _, _, x = crafted
  loss_fn = dishonest.loss_fn_for(model)
  params = crafted_vars['params']

  @jax.jit
  def both(params, x):
    stepped = dishonest.server_step(loss_fn, params, x[0], jnp.int32(3), optax.sgd(0.5))
    return stepped, jax.grad(loss_fn)(params, x[:1], jnp.array([3]))

  stepped, grads = both(params, x)
  chex.assert_trees_all_close(stepped, jax.tree.map(lambda p, g: p - 0.5 * g, params, grads))
  # The target fires the detector, so its own step moves eps.
  assert float(dishonest.detector_bias({'params': stepped})) != pytest.approx(EPS, abs=1e-9)
  # The optimizer sees the parameters (coupled weight decay reads them).
  decayed = jax.jit(lambda params, x: dishonest.server_step(
      loss_fn, params, x[0], jnp.int32(3), optimizers.make('sgd', 0.5, weight_decay=0.1)))(
          params, x)
  chex.assert_trees_all_close(
      decayed, jax.tree.map(lambda p, g: p - 0.5 * (g + 0.1 * p), params, grads))


def _dense_vars(features, width1, width2, classes, *, collection='params', names=None,
                seed=0):
  """A hand-made variables dict: a trunk entry and three dense layers of random weights."""
  rng = np.random.default_rng(seed)
  dims = [(features, width1), (width1, width2), (width2, classes)]
  layers = {name: {'kernel': jnp.asarray(rng.normal(size=d), jnp.float32),
                   'bias': jnp.asarray(rng.normal(size=d[1]), jnp.float32)}
            for name, d in zip(names or dishonest.FC_LAYERS, dims)}
  layers['trunk'] = {'kernel': jnp.asarray(rng.normal(size=(2, 2)), jnp.float32)}
  return {collection: layers}


def test_craft_writes_exactly_the_fig1_block():
  """Section 2.2, steps 1-3, on a hand-made dict (F = 6, M = 3, widths 8 / 4, 5 classes):
  the chosen features are 3, 1, 5 (|3.0| > |-2.0| > |1.5|), the other units dead (bias -1)."""
  names = ('first', 'second', 'out')
  variables = _dense_vars(6, 8, 4, 5, collection='weights', names=names)
  h_t = jnp.asarray([0.5, -2.0, 0.1, 3.0, -0.7, 1.5], jnp.float32)
  crafted, chosen = jax.jit(functools.partial(
      dishonest.craft, num_components=3, layers=names, collection='weights'))(
          variables, h_t, jnp.int32(2), epsilon=0.25)
  np.testing.assert_array_equal(chosen, [3, 1, 5])
  assert chosen.dtype == jnp.int32
  k1 = np.zeros((6, 8))
  b1 = np.full(8, -1.0)
  for m, (i, eta) in enumerate([(3, 3.0), (1, -2.0), (5, 1.5)]):
    k1[i, 2 * m], k1[i, 2 * m + 1] = 1, -1
    b1[2 * m], b1[2 * m + 1] = -eta, eta
  k2 = np.zeros((8, 4))
  k2[:6, 0] = -1
  k3 = np.zeros((4, 5))
  k3[0, 2] = 1
  want = {'first': (k1, b1), 'second': (k2, [0.25, -1, -1, -1]), 'out': (k3, [-1, -1, 0, -1, -1])}
  p = crafted['weights']
  assert set(p) == {'first', 'second', 'out', 'trunk'}
  for name, (kernel, bias) in want.items():
    np.testing.assert_array_equal(p[name]['kernel'], kernel, err_msg=name)
    np.testing.assert_array_equal(p[name]['bias'], bias, err_msg=name)
    assert p[name]['kernel'].dtype == p[name]['bias'].dtype == jnp.float32
  np.testing.assert_array_equal(p['trunk']['kernel'], variables['weights']['trunk']['kernel'])
  assert float(dishonest.detector_bias(crafted, layers=names, collection='weights')) == 0.25


def test_craft_checks_the_layer_sizes_it_needs():
  variables = _dense_vars(6, 8, 4, 5)
  with pytest.raises(ValueError, match=r'^M=5 needs M <= 6 features and 2M <= 8 units of fc1$'):
    dishonest.craft(variables, jnp.ones(6), 0, 5, EPS)
  with pytest.raises(ValueError, match=r'^fc1 takes 6 inputs, features have 5$'):
    dishonest.craft(variables, jnp.ones(5), 0, 2, EPS)
  narrow = _dense_vars(3, 8, 4, 5)
  with pytest.raises(ValueError, match=r'^M=4 needs M <= 3 features and 2M <= 8 units of fc1$'):
    dishonest.craft(narrow, jnp.ones(3), 0, 4, EPS)
  craft = jax.jit(dishonest.craft, static_argnums=3)
  _, chosen = craft(variables, jnp.arange(6.0), jnp.int32(0), 4, EPS)  # 2M = 8 units: fits
  np.testing.assert_array_equal(chosen, [5, 4, 3, 2])
  _, chosen = craft(narrow, jnp.asarray([1.0, -3.0, 2.0]), jnp.int32(0), 3, EPS)  # M = F
  np.testing.assert_array_equal(chosen, [1, 2, 0])


def test_detector_distance_and_bias_read_the_documented_entries():
  a = np.random.default_rng(1).normal(size=(2, 3, 4)).astype(np.float32)
  eta = np.asarray([0.5, -1.0, 2.0, 0.0], np.float32)
  np.testing.assert_allclose(dishonest.detector_distance(jnp.asarray(a), jnp.asarray(eta)),
                             np.sum(np.abs(a - eta), axis=-1), rtol=1e-6)
  names = ('x', 'y', 'z')
  variables = {**_dense_vars(3, 4, 4, 2, collection='other', names=names),
               **_dense_vars(3, 4, 4, 2, seed=1)}
  assert float(dishonest.detector_bias(variables)) == float(variables['params']['fc2']['bias'][0])
  assert float(dishonest.detector_bias(variables, layers=names, collection='other')) == float(
      variables['other']['y']['bias'][0])


class _Linear:
  """The least a `loss_fn_for` model needs: `apply({'params': p}, x)` -> logits."""

  def apply(self, variables, x):
    return x @ variables['params']['w']


def test_loss_fn_for_is_the_masked_cross_entropy_of_the_model():
  x = np.random.default_rng(2).normal(size=(4, 2)).astype(np.float32)
  y = np.asarray([0, 2, 1, 2])
  params = {'w': jnp.asarray([[1.0, -0.5, 2.0], [0.3, 0.7, -1.2]])}
  logits = x @ np.asarray(params['w'])
  nll = np.log(np.sum(np.exp(logits), axis=1)) - logits[np.arange(4), y]
  loss_fn = jax.jit(dishonest.loss_fn_for(_Linear()))
  np.testing.assert_allclose(loss_fn(params, x, y), np.mean(nll), rtol=1e-6)
  np.testing.assert_allclose(loss_fn(params, x, y, jnp.asarray([1.0, 0.0, 1.0, 1.0])),
                             np.mean(nll[[0, 2, 3]]), rtol=1e-6)


def test_server_step_takes_one_fresh_step_on_the_target_batch():
  """client(theta, {s}): the gradient of the loss on the one-sample batch [1, ...]."""
  params = {'w': jnp.asarray([0.5, -1.0, 2.0]), 'b': jnp.asarray(0.25)}
  x_t, y_t = jnp.asarray([1.0, 2.0, -1.0]), jnp.asarray(0.5)

  def loss_fn(params, x, y):
    assert x.shape == (1, 3) and y.shape == (1,)
    return jnp.mean((x @ params['w'] + params['b'] - y) ** 2)

  residual = float(x_t @ params['w'] + params['b'] - y_t)  # -3.25
  grads = {'w': 2 * residual * x_t, 'b': 2 * residual}
  # Momentum from a fresh (zero) trace: the first step is the plain SGD step.
  for opt, step in ((optax.sgd(0.5), lambda p, g: p - 0.5 * g),
                    (optax.sgd(0.5, momentum=0.9), lambda p, g: p - 0.5 * g),
                    (optimizers.make('sgd', 0.5, weight_decay=0.1),
                     lambda p, g: p - 0.5 * (g + 0.1 * p))):
    got = dishonest.server_step(loss_fn, params, x_t, y_t, opt)
    chex.assert_trees_all_close(got, jax.tree.map(step, params, grads), rtol=1e-6)


def test_draw_client_halves_and_membership():
  for i in range(8):
    idx, target, member = dishonest.draw_client(jax.random.key(i), jnp.int32(i), 100, 32)
    idx = np.asarray(idx)
    assert len(set(idx)) == 32 and idx.max() < 100
    assert bool(member) == (i % 2 == 0) == (int(target) in idx)
    # Reproducible draws: an inside target is the client's first example.
    assert not bool(member) or int(target) == idx[0]


@pytest.fixture(scope='module')
def digits():
  train = data_lib.load(dict(name='digits'))['train']
  return jnp.asarray(data_lib.to_float(train.x)), jnp.asarray(train.y)


def _game(opt, m=4, j=2, e=1):
  kw = {'momentum': 0.9} if opt == 'sgd' else {}
  return dishonest.Game(model=models.FlowerCNN(10, padding='SAME'), num_components=m,
                        num_batches=j, epochs=e, batch_size=32,
                        optimizer=optimizers.make(opt, 1e-3, **kw))


_PLAY_GAME = _game('sgd', m=8, j=1)
# `play` of one game (M = 8, J = 1, SGD with momentum), compiled once for the tests that call it.
_play = jax.jit(functools.partial(dishonest.play, _PLAY_GAME))


@functools.lru_cache(maxsize=None)
def _outcomes(opt):
  """24 runs (E = 2, J = 2, M = 4) of `opt` on digits, computed once per test session."""
  train = data_lib.load(dict(name='digits'))['train']
  x, y = jnp.asarray(data_lib.to_float(train.x)), jnp.asarray(train.y)
  game = _game(opt, e=2)
  out = runner.run_trials(dishonest.make_trial(game), jax.random.key(11), 24, chunk_size=24,
                          args=(x, y), progress=False)
  return game, out


@pytest.fixture(params=['sgd', 'adam'])
def outcomes(request):
  return _outcomes(request.param)


def test_outside_runs_give_delta_exactly_zero_and_inside_runs_fire(outcomes):
  _, out = outcomes
  member = out['member']
  np.testing.assert_array_equal(member, np.arange(24) % 2 == 0)
  np.testing.assert_array_equal(out['delta'][~member], 0.0)  # exact, not approximate
  assert np.all(out['num_activating'][~member] == 0)
  assert np.all(out['delta'][member] >= 0.1)


def test_vmapped_runs_match_single_runs(digits):
  """Same run key and index -> same run, whether vmapped in a chunk or alone (SGD)."""
  game, out = _outcomes('sgd')
  x, y = digits
  one = jax.jit(dishonest.make_trial(game))
  for i in (0, 1, 5):
    single = one(jax.random.fold_in(jax.random.key(11), i), jnp.int32(i), x, y)
    for k in ('member', 'target', 'nearest', 'num_activating'):
      assert int(single[k]) == int(out[k][i]), k
    np.testing.assert_allclose(float(single['delta']), out['delta'][i], rtol=1e-4)


def test_im2col_convolutions_give_the_same_runs(digits):
  """The CPU form of the Flower CNN (im2col + matmul) keeps decisions and Deltas."""
  x, y = digits
  key = jax.random.key(5)
  probe = x[:4].reshape((4, 8, 8, 1))
  games, outs = {}, {}
  for impl in ('xla', 'im2col'):
    model = models.FlowerCNN(10, padding='SAME', conv_impl=impl)
    games[impl] = dishonest.Game(model=model, num_components=4, num_batches=2, epochs=1,
                                 batch_size=32, optimizer=optimizers.make('sgd', 1e-3,
                                                                          momentum=0.9))
    outs[impl] = runner.run_trials(dishonest.make_trial(games[impl]), key, 16,
                                   args=(x, y), progress=False)
  # Same parameters (names, shapes, initial values) and the same function.
  va = games['xla'].model.init(jax.random.key(0), probe)
  vb = games['im2col'].model.init(jax.random.key(0), probe)
  chex.assert_trees_all_equal(va, vb)
  np.testing.assert_allclose(games['im2col'].model.apply(va, probe),
                             games['xla'].model.apply(va, probe), rtol=1e-5, atol=1e-6)
  a, b = outs['xla'], outs['im2col']
  for k in ('member', 'decision', 'target', 'nearest', 'num_activating'):
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  np.testing.assert_allclose(a['delta'], b['delta'], rtol=1e-4, atol=1e-7)
  assert np.any(a['decision'])


def test_exact_duplicate_of_target_is_a_false_positive(digits):
  """An outside target whose copy is in the client's data fires, and is attributed to it."""
  x, y = digits
  x = x.at[1].set(x[0])
  y = y.at[1].set(y[0])
  client = jnp.arange(1, 33, dtype=jnp.int32)
  out = _play(jax.random.key(0), jax.random.key(1), x, y, client, jnp.int32(0),
              jnp.bool_(False))
  assert int(out['nearest']) == 1
  # Zero up to rounding: the client's batch and the target alone go through differently
  # blocked convolutions (3.6e-7 on this machine's CPU, exactly 0 on others); far below eps.
  assert float(out['nearest_distance']) <= 1e-5
  assert int(out['num_activating']) == 1
  assert float(out['delta']) >= 0.1


def _matmul_precisions(jaxpr, found):
  """Precision of every dot_general / convolution in `jaxpr`, nested jaxprs included."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ('dot_general', 'conv_general_dilated'):
      found.append(eqn.params.get('precision'))
    for value in eqn.params.values():
      for v in (value if isinstance(value, (tuple, list)) else (value,)):
        inner = getattr(v, 'jaxpr', v)
        if hasattr(inner, 'eqns'):
          _matmul_precisions(inner, found)
  return found


def test_every_matmul_of_a_run_is_full_precision():
  """Decisions cannot depend on TF32/bf16 defaults of any backend (GPUs use TF32)."""
  game = _game('adam', j=1)
  x = jnp.zeros((40, 8, 8, 1))
  y = jnp.zeros((40,), jnp.int32)
  jaxpr = jax.make_jaxpr(dishonest.make_trial(game))(jax.random.key(0), jnp.int32(0), x, y)
  found = _matmul_precisions(jaxpr.jaxpr, [])
  assert len(found) > 10
  highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
  assert all(p == highest for p in found), set(map(str, found))


def test_play_inside_and_outside_and_run_uses_its_documented_keys(digits):
  """One member and one outside target through `play`; `run` = `play` on `draw_client`'s
  data with init / data / train keys fold_in(key, 0 / 1 / 2)."""
  x, y = digits
  game = _PLAY_GAME
  client = jnp.arange(1, 33, dtype=jnp.int32)
  play = functools.partial(_play, jax.random.key(0), jax.random.key(1), x, y, client)
  inside = play(jnp.int32(5), jnp.bool_(True))
  assert bool(inside['member']) and int(inside['target']) == 5
  assert float(inside['delta']) >= game.threshold and bool(inside['decision'])
  assert int(inside['nearest']) != 5 and int(inside['num_activating']) == 0
  assert inside['num_activating'].dtype == jnp.int32
  outside = play(jnp.int32(40), jnp.bool_(False))
  assert not bool(outside['member']) and int(outside['target']) == 40
  assert float(outside['delta']) == 0.0 and not bool(outside['decision'])
  assert int(outside['num_activating']) == 0
  assert float(outside['nearest_distance']) > game.epsilon
  assert int(outside['nearest']) in set(np.asarray(client).tolist())
  # run = play on the drawn client.
  key = jax.random.key(21)
  got = jax.jit(lambda k, i: dishonest.run(game, k, i, x, y))(key, jnp.int32(3))
  idx, target, member = dishonest.draw_client(jax.random.fold_in(key, 1), jnp.int32(3),
                                              x.shape[0], game.num_examples)
  want = _play(jax.random.fold_in(key, 0), jax.random.fold_in(key, 2), x, y, idx, target,
               member)
  assert set(got) == set(dishonest.OUTCOME_FIELDS)
  for k in dishonest.OUTCOME_FIELDS:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)


class _PixelNet(nn.Module):
  """Raw pixels as the trunk and dense layers not named fc1..fc3: the game's `layers`."""

  def setup(self):
    self.first = nn.Dense(16)
    self.second = nn.Dense(8)
    self.out = nn.Dense(10)

  def embed(self, x):
    return x.reshape((x.shape[0], -1))

  def head(self, h):
    return self.out(nn.relu(self.second(nn.relu(self.first(h)))))

  def __call__(self, x):
    return self.head(self.embed(x))


def _double_upload(key, delta, aux):
  del key, aux
  return jax.tree.map(lambda d: 2.0 * d, delta)


def test_play_uses_the_games_layers_and_the_upload_hook(digits):
  """The server reads w_t - upload: an upload hook that doubles Delta doubles Eq. (9)'s Delta."""
  x, y = digits
  games = [dishonest.Game(model=_PixelNet(), num_components=4, num_batches=1, epochs=1,
                          batch_size=32, optimizer=optimizers.make('sgd', 1e-3),
                          layers=('first', 'second', 'out'), hooks=hooks)
           for hooks in (None, client_lib.ClientHooks(upload=_double_upload))]
  client = jnp.arange(1, 33, dtype=jnp.int32)
  plain, doubled = (jax.jit(functools.partial(dishonest.play, game))(
      jax.random.key(0), jax.random.key(1), x, y, client, jnp.int32(5), jnp.bool_(True))
                    for game in games)
  assert float(plain['delta']) >= 0.1
  np.testing.assert_allclose(doubled['delta'], 2 * plain['delta'], rtol=1e-4)
