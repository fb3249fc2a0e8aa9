"""Small convolutional classifiers from the seed papers.

`FlowerCNN` is the Flower tutorial network used by the dishonest-server paper
(Pichler et al., "Perfectly Accurate Membership Inference by a Dishonest Central
Server in Federated Learning"); `AuditCNN` is the network of Table 2 of the
LDP-audit paper (Matsumoto et al., "Measuring Lower Bounds of Local
Differential Privacy via Adversary Instantiations in Federated Learning").

Both split into `embed(x)` (convolutional trunk, flattened) and `head(h)` (the
dense layers), so that `head(embed(x)) == __call__(x)`; attacks craft the dense
layers on top of trunk features.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

PADDINGS = ('VALID', 'SAME')
# How FlowerCNN computes its convolutions: XLA's convolution, im2col + one matmul, or 'auto'
# (im2col on CPU, where it measured faster for these 5x5 kernels, XLA's convolution on
# accelerators).
CONV_IMPLS = ('auto', 'xla', 'im2col')


def _conv_impl(impl: str) -> str:
  if impl not in CONV_IMPLS:
    raise ValueError(f'conv_impl must be one of {CONV_IMPLS} (got {impl!r})')
  if impl == 'auto':
    return 'im2col' if jax.default_backend() == 'cpu' else 'xla'
  return impl


class Im2colConv(nn.Module):
  """A 2-d convolution as im2col + one matmul, with `nn.Conv`'s parameters.

  Same parameter names and shapes as `nn.Conv` (kernel [kh, kw, in, out], bias [out] unless
  `use_bias=False`), so params are interchangeable. The patches are kh * kw shifted, strided
  slices of the (padded) input concatenated on the channel axis in (kh, kw, in) order, which
  is the kernel's row-major order: their gradient is pads and adds. XLA's CPU convolution is
  slower in two places this avoids: its backward under vmap over runs (grouped
  convolutions), and any convolution inside a loop (`lax.scan` of local steps), where the
  kernel gradient is left in a layout the fast Eigen path does not take (jax-ml/jax#12868;
  20-40x slower for ResNet-18 on jax 0.10.2, `benchmarks.conv_in_loop`).

  Attributes:
    features: output channels.
    kernel_size: (kh, kw).
    strides: (sh, sw).
    padding: 'VALID', 'SAME' (XLA's: the extra row/column goes after) or explicit
      ((top, bottom), (left, right)).
    use_bias: whether to add a bias.
  """
  features: int
  kernel_size: tuple[int, int]
  strides: tuple[int, int] = (1, 1)
  padding: Any = 'VALID'
  use_bias: bool = True

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    kh, kw = self.kernel_size
    sh, sw = self.strides
    cin = x.shape[-1]
    kernel = self.param('kernel', nn.initializers.lecun_normal(), (kh, kw, cin, self.features))
    if isinstance(self.padding, str):
      pads = jax.lax.padtype_to_pads(x.shape[1:3], (kh, kw), (sh, sw), self.padding)
    else:
      pads = self.padding
    x = jnp.pad(x, ((0, 0), tuple(pads[0]), tuple(pads[1]), (0, 0)))
    h, w = (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
    patches = jnp.concatenate([x[:, i:i + (h - 1) * sh + 1:sh, j:j + (w - 1) * sw + 1:sw, :]
                               for i in range(kh) for j in range(kw)], axis=-1)
    out = patches @ kernel.reshape(kh * kw * cin, self.features)
    if self.use_bias:
      out = out + self.param('bias', nn.initializers.zeros_init(), (self.features,))
    return out


def make_conv(impl: str, features: int, kernel_size: tuple[int, int], **kw) -> nn.Module:
  """`nn.Conv` or `Im2colConv` (same parameters) as `impl` ('auto', 'xla', 'im2col') says."""
  if _conv_impl(impl) == 'im2col':
    return Im2colConv(features, kernel_size, **kw)
  return nn.Conv(features, kernel_size, **kw)


def _check_padding(padding: str) -> None:
  if padding not in PADDINGS:
    raise ValueError(f'padding must be one of {PADDINGS} (got {padding!r})')


def _flatten(x: jnp.ndarray) -> jnp.ndarray:
  return x.reshape((x.shape[0], -1))


class FlowerCNN(nn.Module):
  """The Flower tutorial CNN of the dishonest-server paper.

  conv1 6@5x5 ReLU maxpool2, conv2 16@5x5 ReLU maxpool2, flatten, fc1 120 ReLU,
  fc2 84 ReLU, fc3 `num_classes`. With the paper's 'VALID' convolutions a
  32x32x3 input gives 400 trunk features (62,006 parameters for 10 classes)
  and a 28x28x1 input 256 (44,426). 'SAME' keeps the spatial size through the
  convolutions so that tiny images (8x8 digits) still fit.

  Attributes:
    num_classes: Number of output logits.
    padding: 'VALID' (as in the paper) or 'SAME'.
    conv_impl: 'auto' (im2col on CPU, XLA's convolution elsewhere), 'xla' or 'im2col'
      (`Im2colConv`: same parameters, same function up to float rounding).
  """
  num_classes: int
  padding: str = 'VALID'
  conv_impl: str = 'auto'

  def setup(self):
    _check_padding(self.padding)
    self.conv1 = make_conv(self.conv_impl, 6, (5, 5), padding=self.padding)
    self.conv2 = make_conv(self.conv_impl, 16, (5, 5), padding=self.padding)
    self.fc1 = nn.Dense(120)
    self.fc2 = nn.Dense(84)
    self.fc3 = nn.Dense(self.num_classes)

  def embed(self, x: jnp.ndarray) -> jnp.ndarray:
    """Flattened trunk features [N, F] of float32 NHWC images `x`."""
    for conv in (self.conv1, self.conv2):
      x = nn.max_pool(nn.relu(conv(x)), (2, 2), strides=(2, 2))
    return _flatten(x)

  def head(self, h: jnp.ndarray) -> jnp.ndarray:
    """Logits [N, num_classes] from trunk features `h` [N, F]."""
    h = nn.relu(self.fc1(h))
    h = nn.relu(self.fc2(h))
    return self.fc3(h)

  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    return self.head(self.embed(x))


class AuditCNN(nn.Module):
  """The CNN of Table 2 of the LDP-audit paper.

  conv1 16@8x8 stride 2 ReLU, maxpool 2x2 stride 2, conv2 32@4x4 stride 2 ReLU,
  maxpool 2x2 stride 2, fc1 32 ReLU, fc2 `num_classes`. The paper does not give
  paddings. We use 'SAME' for every convolution and pooling by default: each
  stage then maps a side n to ceil(n / 2), so any input works, down to 8x8
  digits (28x28x1 -> 2x2x32 = 128 trunk features, 13,722 parameters for 10
  classes). 'VALID' is offered for large inputs; it needs a side of at least 46.

  Attributes:
    num_classes: Number of output logits.
    padding: 'SAME' (default) or 'VALID', for convolutions and poolings alike.
  """
  num_classes: int = 10
  padding: str = 'SAME'

  def setup(self):
    _check_padding(self.padding)
    self.conv1 = nn.Conv(16, (8, 8), strides=(2, 2), padding=self.padding)
    self.conv2 = nn.Conv(32, (4, 4), strides=(2, 2), padding=self.padding)
    self.fc1 = nn.Dense(32)
    self.fc2 = nn.Dense(self.num_classes)

  def embed(self, x: jnp.ndarray) -> jnp.ndarray:
    """Flattened trunk features [N, F] of float32 NHWC images `x`."""
    for conv in (self.conv1, self.conv2):
      x = nn.max_pool(nn.relu(conv(x)), (2, 2), strides=(2, 2),
                      padding=self.padding)
    return _flatten(x)

  def head(self, h: jnp.ndarray) -> jnp.ndarray:
    """Logits [N, num_classes] from trunk features `h` [N, F]."""
    return self.fc2(nn.relu(self.fc1(h)))

  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    return self.head(self.embed(x))
