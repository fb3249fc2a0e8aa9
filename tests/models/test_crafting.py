"""Crafting helpers: purity, round trips, shape checks, intended computation."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy import models
from fl_privacy.models import crafting

KEY = jax.random.key(0)


@pytest.fixture(scope='module')
def flower():
  model = models.FlowerCNN(10)
  x = jax.random.uniform(jax.random.key(1), (4, 28, 28, 1))
  # Filled from numpy: Flax's initialisers are slow on CPU and irrelevant here.
  rng = np.random.default_rng(0)
  variables = jax.tree_util.tree_map(
      lambda s: jnp.asarray(0.1 * rng.normal(size=s.shape), jnp.float32),
      jax.eval_shape(model.init, KEY, x))
  return model, variables, x


def test_round_trip_and_purity(flower):
  _, variables, _ = flower
  before = jax.tree_util.tree_map(np.array, variables)
  w = jnp.arange(256, dtype=jnp.float32)
  new = models.write_neuron(variables, ('params', 'fc1'), 5, w, bias=-3.0)
  got_w, got_b = models.read_neuron(new, ('params', 'fc1'), 5)
  np.testing.assert_array_equal(got_w, w)
  assert float(got_b) == -3.0
  # The input is unchanged and every other entry of the new tree is too.
  chex.assert_trees_all_equal(variables, before)
  old_kernel = variables['params']['fc1']['kernel']
  new_kernel = new['params']['fc1']['kernel']
  mask = np.ones(old_kernel.shape[-1], bool)
  mask[5] = False
  np.testing.assert_array_equal(new_kernel[:, mask], old_kernel[:, mask])
  chex.assert_trees_all_equal(new['params']['fc2'], variables['params']['fc2'])
  chex.assert_trees_all_equal(new['params']['conv1'],
                              variables['params']['conv1'])


def test_bias_none_keeps_bias(flower):
  _, variables, _ = flower
  new = models.write_neuron(variables, ('params', 'fc2'), 0, jnp.zeros(120))
  np.testing.assert_array_equal(new['params']['fc2']['bias'],
                                variables['params']['fc2']['bias'])


def test_written_neuron_computes_w_dot_x_plus_b(flower):
  model, variables, x = flower
  rng = np.random.default_rng(0)
  w = rng.normal(size=256).astype(np.float32)
  b = np.float32(0.25)
  new = models.write_neuron(variables, ('params', 'fc1'), 7, w, bias=b)
  h = np.asarray(model.apply(new, x, method=model.embed), np.float64)
  pre = model.apply(new, x, method=lambda m, x: m.fc1(m.embed(x)))
  np.testing.assert_allclose(pre[:, 7], h @ w + b, rtol=1e-5, atol=1e-5)


def test_written_conv_filter_computes_correlation(flower):
  model, variables, x = flower
  rng = np.random.default_rng(1)
  w = rng.normal(size=(5, 5, 1)).astype(np.float32)
  new = models.write_neuron(variables, ('params', 'conv1'), 2, w, bias=0.5)
  out = model.apply(new, x, method=lambda m, x: m.conv1(x))
  xs = np.asarray(x, np.float64)
  for i, j in [(0, 0), (3, 11), (23, 23)]:
    want = np.sum(xs[:, i:i + 5, j:j + 5, :] * w, axis=(1, 2, 3)) + 0.5
    np.testing.assert_allclose(out[:, i, j, 2], want, rtol=1e-5, atol=1e-5)


def test_write_layer(flower):
  _, variables, _ = flower
  kernel = jnp.ones((120, 84))
  new = models.write_layer(variables, ('params', 'fc2'), kernel=kernel,
                           bias=-jnp.ones(84))
  np.testing.assert_array_equal(new['params']['fc2']['kernel'], kernel)
  np.testing.assert_array_equal(new['params']['fc2']['bias'], -np.ones(84))
  only_bias = models.write_layer(variables, ('params', 'fc3'),
                                 bias=jnp.zeros(10))
  np.testing.assert_array_equal(only_bias['params']['fc3']['kernel'],
                                variables['params']['fc3']['kernel'])


def test_bare_params_paths_work(flower):
  _, variables, _ = flower
  new = models.write_neuron(variables['params'], ('fc3',), 1, jnp.zeros(84))
  np.testing.assert_array_equal(models.read_neuron(new, ('fc3',), 1)[0],
                                np.zeros(84))


def test_traced_index_under_jit(flower):
  _, variables, _ = flower

  @jax.jit
  def craft(v, index):
    return models.write_neuron(v, ('params', 'fc1'), index, jnp.ones(256), 2.)

  new = craft(variables, jnp.int32(3))
  w, b = models.read_neuron(new, ('params', 'fc1'), 3)
  np.testing.assert_array_equal(w, np.ones(256))
  assert float(b) == 2.0


def test_errors_are_clear(flower):
  _, variables, _ = flower
  with pytest.raises(ValueError, match=r'shape \(256,\)'):
    models.write_neuron(variables, ('params', 'fc1'), 0, jnp.zeros(255))
  with pytest.raises(ValueError, match='bias'):
    models.write_neuron(variables, ('params', 'fc1'), 0, jnp.zeros(256),
                        bias=jnp.zeros(2))
  with pytest.raises(KeyError, match='fc9'):
    models.write_neuron(variables, ('params', 'fc9'), 0, jnp.zeros(256))
  with pytest.raises(KeyError, match='not a layer'):
    models.read_neuron(variables, ('params',), 0)
  with pytest.raises(IndexError, match='120 neurons'):
    models.read_neuron(variables, ('params', 'fc1'), 120)
  with pytest.raises(TypeError, match='tuple'):
    models.read_neuron(variables, 'params/fc1', 0)
  with pytest.raises(ValueError, match='kernel'):
    models.write_layer(variables, ('params', 'fc2'), kernel=jnp.ones((84, 120)))


def test_bias_on_bias_free_layer_is_rejected():
  # Shaped like ResNet18GN's stem convolution (use_bias=False).
  variables = {'params': {'conv1': {'kernel': jnp.ones((3, 3, 3, 64))}}}
  w = jnp.zeros((3, 3, 3))
  new = models.write_neuron(variables, ('params', 'conv1'), 0, w)
  assert models.read_neuron(new, ('params', 'conv1'), 0)[1] is None
  with pytest.raises(ValueError, match='no bias'):
    models.write_neuron(variables, ('params', 'conv1'), 0, w, bias=1.0)


def test_param_count_of_hand_made_tree():
  tree = {'a': {'kernel': jnp.zeros((3, 4)), 'bias': jnp.zeros(4)},
          'b': [jnp.zeros((2, 2, 2)), jnp.zeros(())]}
  assert crafting.param_count(tree) == 12 + 4 + 8 + 1


def test_vmap_over_neurons_and_weights(flower):
  # Attacks craft a different neuron per trial inside one vmapped chunk.
  _, variables, _ = flower
  indices = jnp.array([0, 5, 119])
  weights = jnp.stack([jnp.full(256, float(i)) for i in range(3)])
  crafted = jax.vmap(
      lambda i, w: models.write_neuron(variables, ('params', 'fc1'), i, w,
                                       bias=-1.0))(indices, weights)
  for t, index in enumerate([0, 5, 119]):
    one = jax.tree_util.tree_map(lambda leaf: leaf[t], crafted)
    w, b = models.read_neuron(one, ('params', 'fc1'), index)
    np.testing.assert_array_equal(w, np.full(256, float(t)))
    assert float(b) == -1.0
