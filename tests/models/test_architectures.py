"""Architectures: exact parameter counts, layer names, embed/head split."""

from __future__ import annotations

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy import models
from fl_privacy.validate import ConfigError

KEY = jax.random.key(0)


def _random_variables(model, x, seed=0):
  """Variables shaped as `model.init` makes them, filled from numpy.

  Flax's initialisers are the slow part of these tests on CPU and play no role
  in the properties tested.
  """
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda s: jnp.asarray(0.1 * rng.normal(size=s.shape), jnp.float32),
      jax.eval_shape(model.init, KEY, x))

# (model, input shape, expected parameter count, expected embed width)
CASES = [
    # FlowerCNN, 32x32x3 'VALID': conv1 5*5*3*6+6 = 456 -> 28 -> pool 14;
    # conv2 5*5*6*16+16 = 2,416 -> 10 -> pool 5; flatten 5*5*16 = 400;
    # fc1 400*120+120 = 48,120; fc2 120*84+84 = 10,164; fc3 84*10+10 = 850.
    # 456 + 2,416 + 48,120 + 10,164 + 850 = 62,006.
    pytest.param(models.FlowerCNN(10), (2, 32, 32, 3), 62_006, 400,
                 id='flower-cifar'),
    # 28x28x1: conv1 5*5*1*6+6 = 156 -> 24 -> 12; conv2 2,416 -> 8 -> 4;
    # flatten 256; fc1 256*120+120 = 30,840; 10,164; 850. Total 44,426.
    pytest.param(models.FlowerCNN(10), (2, 28, 28, 1), 44_426, 256,
                 id='flower-mnist'),
    # 'SAME' on 8x8x1: 8 -> pool 4 -> 4 -> pool 2; flatten 2*2*16 = 64;
    # 156 + 2,416 + (64*120+120 = 7,800) + 10,164 + 850 = 21,386.
    pytest.param(models.FlowerCNN(10, padding='SAME'), (2, 8, 8, 1), 21_386,
                 64, id='flower-digits'),
    # AuditCNN 'SAME', 28x28x1: conv1 8*8*1*16+16 = 1,040 -> 14 -> pool 7;
    # conv2 4*4*16*32+32 = 8,224 -> 4 -> pool 2; flatten 2*2*32 = 128;
    # fc1 128*32+32 = 4,128; fc2 32*10+10 = 330. Total 13,722.
    pytest.param(models.AuditCNN(10), (2, 28, 28, 1), 13_722, 128,
                 id='audit-mnist'),
    # 8x8x1: 8 -> 4 -> 2 -> 1 -> 1; flatten 32; fc1 32*32+32 = 1,056.
    # 1,040 + 8,224 + 1,056 + 330 = 10,650.
    pytest.param(models.AuditCNN(10), (2, 8, 8, 1), 10_650, 32,
                 id='audit-digits'),
    # AlexNetCifar, 100 classes: conv1 11*11*3*64+64 = 23,296;
    # conv2 5*5*64*192+192 = 307,392; conv3 3*3*192*384+384 = 663,936;
    # conv4 3*3*384*256+256 = 884,992; conv5 3*3*256*256+256 = 590,080;
    # fc1 256*100+100 = 25,700. Total 2,495,396.
    pytest.param(models.AlexNetCifar(100), (2, 32, 32, 3), 2_495_396, 256,
                 id='alexnet-cifar100'),
    # ResNet18GN, 10 classes (GroupNorm: scale + bias per channel):
    # stem 3*3*3*64 = 1,728 + 128; stage 1: 2 * (2*36,864 + 2*128) = 147,968;
    # stage 2: 230,144 + 295,424 = 525,568; stage 3: 919,040 + 1,180,672 =
    # 2,099,712; stage 4: 3,673,088 + 4,720,640 = 8,393,728; fc1 5,130.
    # Total 11,173,962 (the usual CIFAR ResNet-18 count).
    pytest.param(models.ResNet18GN(10), (2, 32, 32, 3), 11_173_962, 512,
                 id='resnet18gn'),
    # MLP 64 -> 16 -> 8 -> 10: 1,040 + 136 + 90 = 1,266.
    pytest.param(models.MLP(hidden=(16, 8), num_classes=10), (2, 64), 1_266, 64,
                 id='mlp'),
]


@pytest.mark.parametrize('model, shape, count, width', CASES)
def test_param_count_and_embed_width(model, shape, count, width):
  x = jnp.zeros(shape, jnp.float32)
  variables = jax.eval_shape(model.init, KEY, x)
  assert models.param_count(variables) == count
  h = jax.eval_shape(lambda v, x: model.apply(v, x, method=model.embed),
                     variables, x)
  assert h.shape == (shape[0], width)


@pytest.mark.parametrize('model, shape, num_dense', [
    (models.FlowerCNN(7), (1, 28, 28, 1), 3),
    (models.AuditCNN(7), (1, 28, 28, 1), 2),
    (models.AlexNetCifar(7), (1, 32, 32, 3), 1),
    (models.MLP(hidden=(5, 4, 3), num_classes=7), (1, 6), 4),
])
def test_dense_layers_named_in_order_last_is_classifier(model, shape,
                                                        num_dense):
  params = jax.eval_shape(model.init, KEY, jnp.zeros(shape))['params']
  dense = sorted((k for k in params if k.startswith('fc')),
                 key=lambda k: int(k[2:]))
  assert dense == [f'fc{i}' for i in range(1, num_dense + 1)]
  assert params[dense[-1]]['kernel'].shape[-1] == 7
  for i in range(1, num_dense):
    assert (params[f'fc{i}']['kernel'].shape[-1]
            == params[f'fc{i + 1}']['kernel'].shape[0])


@pytest.mark.parametrize('model, shape', [
    (models.FlowerCNN(10), (3, 28, 28, 1)),
    (models.FlowerCNN(10, padding='SAME'), (3, 8, 8, 1)),
    (models.AuditCNN(10), (3, 8, 8, 1)),
    (models.AlexNetCifar(10), (2, 32, 32, 3)),
    (models.MLP(hidden=(8,), num_classes=10), (3, 4, 4, 1)),
])
def test_head_of_embed_is_call(model, shape):
  x = jax.random.uniform(jax.random.key(1), shape)
  variables = _random_variables(model, x)
  logits = model.apply(variables, x)
  h = model.apply(variables, x, method=model.embed)
  composed = model.apply(variables, h, method=model.head)
  assert logits.shape == (shape[0], 10)
  chex.assert_trees_all_close(composed, logits, rtol=1e-6, atol=1e-6)


def test_resnet_head_of_embed_and_batch_independence():
  # ResNet's parameters do not depend on the input size: a small input keeps
  # the test fast and still runs every block.
  model = models.ResNet18GN(10)
  x = jax.random.uniform(jax.random.key(2), (3, 8, 8, 3))
  variables = _random_variables(model, x)
  together = model.apply(variables, x)
  h = model.apply(variables, x, method=model.embed)
  np.testing.assert_allclose(model.apply(variables, h, method=model.head),
                             together, rtol=1e-6, atol=1e-6)
  # GroupNorm normalises within an example, so no output depends on the batch.
  alone = jnp.concatenate([model.apply(variables, x[i:i + 1])
                           for i in range(3)])
  np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-5)


def test_bad_padding_is_rejected():
  with pytest.raises(ValueError, match='padding'):
    models.FlowerCNN(10, padding='FULL').init(KEY, jnp.zeros((1, 28, 28, 1)))


def test_make_by_name():
  model = models.make('mlp', 3, hidden=[4])
  assert isinstance(model, models.MLP) and model.hidden == (4,)
  assert models.make('flower_cnn', 10, padding='SAME').padding == 'SAME'
  for name in models.MODELS:
    assert models.make(name, 5).num_classes == 5
  with pytest.raises(ConfigError) as err:
    models.make('vgg', 10)
  assert err.value.field == 'model'


@pytest.mark.parametrize('kernel, strides, padding, use_bias, side', [
    ((3, 3), (1, 1), ((1, 1), (1, 1)), False, 8),   # ResNet's 3x3
    ((3, 3), (2, 2), ((1, 1), (1, 1)), False, 8),   # ResNet's strided 3x3
    ((1, 1), (2, 2), 'VALID', False, 8),            # ResNet's projection shortcut
    ((11, 11), (4, 4), ((5, 5), (5, 5)), True, 16),  # AlexNet's conv1
    ((5, 5), (1, 1), 'SAME', True, 7),              # FlowerCNN on digits
    ((4, 4), (3, 2), 'SAME', True, 9),              # asymmetric 'SAME' with strides
    ((2, 3), (1, 2), ((0, 2), (1, 0)), True, 6),    # uneven kernel and padding
])
def test_im2col_conv_is_nn_conv(kernel, strides, padding, use_bias, side):
  """Im2colConv has nn.Conv's parameters and computes its function and gradients."""
  x = jax.random.normal(jax.random.key(3), (2, side, side + 1, 3))
  kw = dict(strides=strides, padding=padding, use_bias=use_bias)
  ref, ours = nn.Conv(5, kernel, **kw), models.cnn.Im2colConv(5, kernel, **kw)
  variables = jax.jit(ref.init)(KEY, x)
  chex.assert_trees_all_equal(variables, jax.jit(ours.init)(KEY, x))
  if use_bias:  # a non-zero bias, so that a dropped bias shows
    variables = jax.tree_util.tree_map(lambda v: v + 0.5, variables)

  @jax.jit
  def outputs_and_grads(v, x):
    loss = lambda m: lambda v, x: jnp.sum(jnp.sin(m.apply(v, x)))
    return [(m.apply(v, x), jax.grad(loss(m), argnums=(0, 1))(v, x)) for m in (ours, ref)]

  (out, grads), (ref_out, ref_grads) = outputs_and_grads(variables, x)
  np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
  chex.assert_trees_all_close(grads, ref_grads, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('make, shape', [
    (lambda impl: models.ResNet18GN(10, conv_impl=impl), (2, 8, 8, 3)),
    (lambda impl: models.AlexNetCifar(10, conv_impl=impl), (2, 16, 16, 3)),
])
def test_im2col_form_of_resnet_and_alexnet(make, shape):
  """The CPU form (im2col) has the same parameters and logits as XLA's convolutions."""
  x = jax.random.uniform(jax.random.key(4), shape)
  xla, im2col = make('xla'), make('im2col')
  variables = _random_variables(xla, x)
  chex.assert_trees_all_equal_shapes(variables, jax.eval_shape(im2col.init, KEY, x))
  np.testing.assert_allclose(jax.jit(im2col.apply)(variables, x),
                             jax.jit(xla.apply)(variables, x), rtol=1e-4, atol=1e-4)
  assert make('auto').conv_impl == 'auto'
  with pytest.raises(ValueError, match='conv_impl'):
    make('fft').init(KEY, x)
