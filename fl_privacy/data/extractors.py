"""Frozen feature extractors: an ImageNet-style ResNet-18 and a small public-data CNN.

These are the adversary's embedding functions (the AMI paper embeds images with a
pretrained ResNet-18's 512-d average-pooled output), not the trainable models of
`fl_privacy.models`.

ResNet-18 weights file (`.npz`) — either of two key conventions:

* Flax names: '<collection>/<module path>/<leaf>', e.g. 'params/conv1/kernel'
  ([7, 7, 3, 64], HWIO), 'params/bn1/scale', 'params/bn1/bias',
  'batch_stats/bn1/mean', 'batch_stats/bn1/var', 'params/layer1_0/conv1/kernel',
  'params/layer2_0/downsample_conv/kernel', 'batch_stats/layer2_0/downsample_bn/mean',
  ... for blocks layer{1..4}_{0,1}, each with conv1, bn1, conv2, bn2 and (first block
  of layers 2-4) downsample_conv, downsample_bn. `resnet18_shapes()` lists all.
* torchvision names, as in `{k: v.numpy() for k, v in model.state_dict().items()}`
  of `torchvision.models.resnet18`: 'conv1.weight' (OIHW), 'bn1.running_mean',
  'layer2.0.downsample.0.weight', ...; they are converted by
  `from_torchvision`. 'fc.*' and 'num_batches_tracked' are ignored.

Inputs are uint8 images scaled to [0, 1] and normalised with the ImageNet mean and
standard deviation, as torchvision's pretrained weights expect.
"""

from __future__ import annotations

import functools
import re
import zipfile

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import validate
from fl_privacy.data.dataset import rng_from_key

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)
RESNET18_STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))
# torchvision's BatchNorm2d default.
_BN_EPS = 1e-5


def _conv(features: int, size: int, stride: int, name: str) -> nn.Conv:
  # Explicit symmetric padding, as in PyTorch; 'SAME' pads stride-2 convs unevenly and
  # would shift every feature map relative to torchvision weights.
  pad = (size - 1) // 2
  return nn.Conv(features, (size, size), strides=(stride, stride),
                 padding=((pad, pad), (pad, pad)), use_bias=False, name=name)


def _bn(name: str) -> nn.BatchNorm:
  return nn.BatchNorm(use_running_average=True, epsilon=_BN_EPS, name=name)


class BasicBlock(nn.Module):
  """ResNet basic block (two 3x3 convolutions with a residual connection)."""
  features: int
  stride: int = 1

  @nn.compact
  def __call__(self, x):
    y = nn.relu(_bn('bn1')(_conv(self.features, 3, self.stride, 'conv1')(x)))
    y = _bn('bn2')(_conv(self.features, 3, 1, 'conv2')(y))
    if self.stride != 1 or x.shape[-1] != self.features:
      x = _bn('downsample_bn')(_conv(self.features, 1, self.stride, 'downsample_conv')(x))
    return nn.relu(x + y)


class ResNet18Features(nn.Module):
  """ResNet-18 trunk in inference mode: [N, H, W, 3] floats -> [N, 512] avg-pooled."""

  @nn.compact
  def __call__(self, x):
    x = nn.relu(_bn('bn1')(_conv(64, 7, 2, 'conv1')(x)))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for stage, (features, stride) in enumerate(RESNET18_STAGES, start=1):
      x = BasicBlock(features, stride, name=f'layer{stage}_0')(x)
      x = BasicBlock(features, 1, name=f'layer{stage}_1')(x)
    return jnp.mean(x, axis=(1, 2))


def init_resnet18(key) -> dict:
  """Randomly initialised ResNet-18 variables ({'params', 'batch_stats'}).

  Convolutions get torchvision's initialisation (Kaiming normal, fan-out, ReLU gain),
  BatchNorm scale 1, bias 0, running mean 0 and variance 1. Drawn with numpy from
  `rng_from_key(key)`: tracing Flax's own initialisers costs a ~15 s compile on CPU.
  """
  rng = rng_from_key(key)
  flat = {}
  for name, shape in sorted(resnet18_shapes().items()):
    leaf = name.rsplit('/', 1)[-1]
    if leaf == 'kernel':
      fan_out = shape[0] * shape[1] * shape[3]
      flat[name] = rng.normal(0.0, np.sqrt(2.0 / fan_out), shape).astype(np.float32)
    else:
      fill = 1.0 if leaf in ('scale', 'var') else 0.0
      flat[name] = np.full(shape, fill, np.float32)
  return unflatten_variables(flat)


def resnet18_shapes() -> dict[str, tuple[int, ...]]:
  """Flax-convention weight name -> shape, for every array a weights file must hold."""
  return dict(_resnet18_shapes())


@functools.lru_cache(maxsize=1)
def _resnet18_shapes() -> dict[str, tuple[int, ...]]:
  # Shapes only: under eval_shape no random number is ever drawn from this key.
  shapes = jax.eval_shape(lambda: ResNet18Features().init(
      jax.random.key(0), jnp.zeros((1, 32, 32, 3), jnp.float32)))
  return {'/'.join(str(p.key) for p in path): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]}


def flatten_variables(variables) -> dict[str, np.ndarray]:
  """Variables pytree -> {'params/conv1/kernel': array, ...}."""
  flat = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(variables)[0]:
    flat['/'.join(str(p.key) for p in path)] = np.asarray(leaf)
  return flat


def unflatten_variables(flat: dict[str, np.ndarray]) -> dict:
  """Inverse of `flatten_variables`."""
  tree: dict = {}
  for name, value in flat.items():
    node = tree
    *parents, leaf = name.split('/')
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = jnp.asarray(value)
  return tree


_TORCH_LEAF = {'weight': ('params', 'scale'), 'bias': ('params', 'bias'),
               'running_mean': ('batch_stats', 'mean'),
               'running_var': ('batch_stats', 'var')}


def _torch_module(name: str) -> str:
  """'layer2.0.downsample.1' -> 'layer2_0/downsample_bn'; 'bn1' -> 'bn1'."""
  name = re.sub(r'^layer(\d)\.(\d)\.', r'layer\1_\2/', name)
  return name.replace('downsample.0', 'downsample_conv').replace('downsample.1',
                                                                  'downsample_bn')


def from_torchvision(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """torchvision resnet18 state_dict arrays -> Flax-convention flat weights."""
  flat = {}
  for key, value in state.items():
    module, _, leaf = key.rpartition('.')
    if module == 'fc' or leaf == 'num_batches_tracked':
      continue
    module = _torch_module(module)
    value = np.asarray(value, np.float32)
    if value.ndim == 4:  # OIHW -> HWIO.
      flat[f'params/{module}/kernel'] = value.transpose(2, 3, 1, 0)
    else:
      collection, name = _TORCH_LEAF[leaf]
      flat[f'{collection}/{module}/{name}'] = value
  return flat


def load_resnet18_weights(path: str) -> dict:
  """ResNet-18 variables from an .npz in either key convention (module docstring).

  Raises:
    ValueError: Keys missing or shapes that do not match ResNet-18.
  """
  with np.load(path, allow_pickle=False) as f:
    flat = dict(f)
  if 'conv1.weight' in flat:
    flat = from_torchvision(flat)
  expected = resnet18_shapes()
  missing = sorted(set(expected) - set(flat))
  if missing:
    raise ValueError(f'{path}: ResNet-18 weights lack {len(missing)} arrays, e.g. '
                     f'{missing[:3]}; see resnet18_shapes()')
  for k, shape in expected.items():
    if tuple(flat[k].shape) != tuple(shape):
      raise ValueError(f'{path}: {k} has shape {flat[k].shape}, expected {shape}')
  return unflatten_variables({k: flat[k] for k in expected})


def imagenet_normalise(x_uint8) -> jax.Array:
  """uint8 NHWC RGB -> float32 standardised with ImageNet statistics."""
  x = jnp.asarray(x_uint8, jnp.float32) / 255.0
  return (x - IMAGENET_MEAN) / IMAGENET_STD


class SmallCNN(nn.Module):
  """Two conv/pool stages and a hidden dense layer; `embed` returns that layer."""
  num_classes: int
  embed_dim: int = 128

  def setup(self):
    self.conv1 = nn.Conv(32, (3, 3), padding='SAME')
    self.conv2 = nn.Conv(64, (3, 3), padding='SAME')
    self.fc1 = nn.Dense(self.embed_dim)
    self.fc2 = nn.Dense(self.num_classes)

  def embed(self, x):
    x = nn.max_pool(nn.relu(self.conv1(x)), (2, 2), strides=(2, 2), padding='SAME')
    x = nn.max_pool(nn.relu(self.conv2(x)), (2, 2), strides=(2, 2), padding='SAME')
    return nn.relu(self.fc1(x.reshape(x.shape[0], -1)))

  def __call__(self, x):
    return self.fc2(self.embed(x))


def check_weights(path: str, extractor: str, field: str) -> None:
  """Refuses (ConfigError naming `field`) weights the run would not read or could not load:
  any weights beside an extractor other than 'resnet18' (they would be recorded as if they
  ran), a file that is not an .npz archive, or one `load_resnet18_weights` rejects."""
  if not path:
    return
  validate.require(extractor == 'resnet18', field,
                   "'' unless ami.extractor is 'resnet18' (the only extractor with weights)",
                   path)
  allowed = ("'' or an .npz of ResNet-18 weights (np.savez, no pickled arrays; see "
             'fl_privacy/data/extractors.py)')
  validate.require(zipfile.is_zipfile(path), field, allowed, f'{path}: not an .npz archive')
  try:
    load_resnet18_weights(path)
  except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
    why = (str(e).splitlines() or [type(e).__name__])[0].removeprefix(f'{path}: ')
    raise validate.ConfigError(field, allowed, f'{path}: {why}') from e
