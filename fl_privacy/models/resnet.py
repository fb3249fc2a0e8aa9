"""ResNet-18 with GroupNorm for 32x32 images (FedMIA's second model).

The CIFAR layout of He et al. (2016): a 3x3 stem without pooling, four stages of
two basic blocks (64, 128, 256, 512 channels; stride 2 at the start of stages
2-4), global average pooling and one dense classifier. Batch norm is replaced by
GroupNorm with 32 groups, as in the FedMIA code, so that a client's output does
not depend on the rest of its batch. 11,173,962 parameters for 10 classes.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from fl_privacy.models import cnn

STAGES = (64, 128, 256, 512)
BLOCKS_PER_STAGE = 2
GROUPS = 32
# PyTorch's GroupNorm epsilon, not Flax's 1e-6: keeps outputs comparable.
GN_EPSILON = 1e-5


def _conv3x3(impl: str, features: int, stride: int, name: str | None = None) -> nn.Module:
  # Explicit symmetric padding: 'SAME' pads a stride-2 conv asymmetrically.
  return cnn.make_conv(impl, features, (3, 3), strides=(stride, stride),
                       padding=((1, 1), (1, 1)), use_bias=False, name=name)


def _norm(name: str | None = None) -> nn.GroupNorm:
  return nn.GroupNorm(num_groups=GROUPS, epsilon=GN_EPSILON, name=name)


class BasicBlockGN(nn.Module):
  """Two 3x3 convolutions with GroupNorm and an identity or 1x1 shortcut.

  Attributes:
    features: Output channels.
    stride: Stride of the first convolution and of the projection shortcut.
    conv_impl: as `ResNet18GN.conv_impl`.
  """
  features: int
  stride: int = 1
  conv_impl: str = 'auto'

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    out = nn.relu(_norm('norm1')(_conv3x3(self.conv_impl, self.features,
                                          self.stride, 'conv1')(x)))
    out = _norm('norm2')(_conv3x3(self.conv_impl, self.features, 1, 'conv2')(out))
    shortcut = x
    if self.stride != 1 or x.shape[-1] != self.features:
      shortcut = cnn.make_conv(self.conv_impl, self.features, (1, 1),
                               strides=(self.stride, self.stride), padding='VALID',
                               use_bias=False, name='conv_shortcut')(x)
      shortcut = _norm('norm_shortcut')(shortcut)
    return nn.relu(out + shortcut)


class ResNet18GN(nn.Module):
  """ResNet-18 with GroupNorm, CIFAR layout.

  Parameters: stem `conv1`/`norm1`, blocks `block1` ... `block8` (each with
  `conv1`, `conv2`, `norm1`, `norm2` and, where shapes change, `conv_shortcut`,
  `norm_shortcut`), classifier `fc1`.

  Attributes:
    num_classes: Number of output logits.
    conv_impl: 'auto' (im2col + matmul on CPU, XLA's convolution elsewhere), 'xla' or
      'im2col' (`cnn.Im2colConv`: same parameters, same function up to float rounding). On
      CPU, XLA's convolutions inside the local-training loop run 20-40x slower than
      outside it (see `cnn.Im2colConv`); im2col avoids that.
  """
  num_classes: int = 10
  conv_impl: str = 'auto'

  def setup(self):
    self.conv1 = _conv3x3(self.conv_impl, STAGES[0], 1)
    self.norm1 = _norm()
    index = 0
    for stage, features in enumerate(STAGES):
      for block in range(BLOCKS_PER_STAGE):
        index += 1
        stride = 2 if stage > 0 and block == 0 else 1
        setattr(self, f'block{index}', BasicBlockGN(features, stride, self.conv_impl))
    self.num_blocks = index
    self.fc1 = nn.Dense(self.num_classes)

  def embed(self, x: jnp.ndarray) -> jnp.ndarray:
    """Globally average-pooled trunk features [N, 512] of NHWC images `x`."""
    x = nn.relu(self.norm1(self.conv1(x)))
    for index in range(1, self.num_blocks + 1):
      x = getattr(self, f'block{index}')(x)
    return jnp.mean(x, axis=(1, 2))

  def head(self, h: jnp.ndarray) -> jnp.ndarray:
    """Logits [N, num_classes] from trunk features `h` [N, 512]."""
    return self.fc1(h)

  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    return self.head(self.embed(x))
