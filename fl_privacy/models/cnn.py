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

import flax.linen as nn
import jax.numpy as jnp

PADDINGS = ('VALID', 'SAME')


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
  """
  num_classes: int
  padding: str = 'VALID'

  def setup(self):
    _check_padding(self.padding)
    self.conv1 = nn.Conv(6, (5, 5), padding=self.padding)
    self.conv2 = nn.Conv(16, (5, 5), padding=self.padding)
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
