"""The CIFAR variant of AlexNet used by FedMIA (Zhu et al.).

Five convolutions with ReLU (max-pooling after the first two), a global max-pool
over the spatial positions and one dense classifier; no batch norm, no dropout.
Sizes follow the FedMIA code (SEED-NOTES section 3): conv1 64@11x11 stride 4
padding 5, conv2 192@5x5 padding 2, conv3 384@3x3, conv4 256@3x3, conv5 256@3x3
(padding 1). A 32x32x3 input gives 8x8 -> 4x4 -> 4x4 -> 2x2 spatial maps and 256
trunk features; 2,495,396 parameters for CIFAR-100. Inputs need a side of at
least 13 so that both poolings see a 2x2 window.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from fl_privacy.models import cnn


def _pad(p: int):
  return ((p, p), (p, p))


class AlexNetCifar(nn.Module):
  """AlexNet for 32x32 images, as in FedMIA's experiments.

  Attributes:
    num_classes: Number of output logits.
    conv_impl: 'auto' (im2col + matmul on CPU, XLA's convolution elsewhere), 'xla' or
      'im2col' (`cnn.Im2colConv`: same parameters, same function up to float rounding; see
      there why CPU training loops need it).
  """
  num_classes: int = 100
  conv_impl: str = 'auto'

  def setup(self):
    conv = lambda *a, **kw: cnn.make_conv(self.conv_impl, *a, **kw)
    self.conv1 = conv(64, (11, 11), strides=(4, 4), padding=_pad(5))
    self.conv2 = conv(192, (5, 5), padding=_pad(2))
    self.conv3 = conv(384, (3, 3), padding=_pad(1))
    self.conv4 = conv(256, (3, 3), padding=_pad(1))
    self.conv5 = conv(256, (3, 3), padding=_pad(1))
    self.fc1 = nn.Dense(self.num_classes)

  def embed(self, x: jnp.ndarray) -> jnp.ndarray:
    """Globally max-pooled trunk features [N, 256] of NHWC images `x`."""
    for conv in (self.conv1, self.conv2):
      x = nn.max_pool(nn.relu(conv(x)), (2, 2), strides=(2, 2))
    for conv in (self.conv3, self.conv4, self.conv5):
      x = nn.relu(conv(x))
    return jnp.max(x, axis=(1, 2))

  def head(self, h: jnp.ndarray) -> jnp.ndarray:
    """Logits [N, num_classes] from trunk features `h` [N, 256]."""
    return self.fc1(h)

  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    return self.head(self.embed(x))
