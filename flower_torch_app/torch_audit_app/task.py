"""The data, the model and one node's DP-SGD round with Opacus (torch, opacus, numpy only).

Data: scikit-learn's offline 8x8 digits (1,797 images, grey levels 0..16), vendored in this
package as `digits.json` (a FAB ships .py/.toml/.md/.json files only) (written from `sklearn.datasets.load_digits`, so the app needs no
scikit-learn), or a user's `.npz` (arrays `x` [N, H, W] or [N, 1, H, W] in [0, 1] and `y`
[N] in 0..9; run config `data-npz`), split once by a fixed
permutation into a test set (the first 20%) and a training set cut into `num-partitions`
contiguous shards, node `partition-id` taking its own (Flower's node config, as in Flower's
`opacus` example).

Model: a small CNN (two 3x3 convolutions, max pooling, adaptive max pooling to 2x2, two
dense layers; 13,706 parameters); `cnn_bn` adds a BatchNorm layer, which Opacus refuses (per-example
gradients do not exist for it: one example's batch statistics depend on the others).

Training: Opacus's `PrivacyEngine.make_private` (Abadi et al., "Deep Learning with
Differential Privacy", CCS 2016, arXiv:1607.00133; Yousefpour et al., "Opacus:
User-Friendly Differential Privacy Library in PyTorch", arXiv:2109.12298): per-example
clipping at `max-grad-norm`, Gaussian noise, Poisson sampling (its `DPDataLoader`), its
accountant. The node keeps its accountant's history in its Flower `Context.state` across
rounds, so the epsilon it reports is that of its whole training so far (RDP and PRV), not of
one round (Flower's example reports one round's).
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# One thread: the nodes' steps are small, and on a shared machine torch's thread pool spends
# more time waiting than computing (0.13 s a step with one thread under load, seconds with two).
torch.set_num_threads(1)

NUM_CLASSES = 10
TEST_FRACTION = 0.2
SPLIT_SEED = 0  # the fixed permutation of the examples (test split, shards)
DIGITS = pathlib.Path(__file__).with_name('digits.json')
_LEVELS = '0123456789abcdefg'


# ----------------------------------------------------------------------------------- data ---


def load_arrays(npz: str = '') -> tuple[np.ndarray, np.ndarray]:
  """All examples: x [N, 1, H, W] float32 in [0, 1], y [N] int64."""
  if npz:
    with np.load(npz) as f:
      x, y = np.asarray(f['x'], np.float32), np.asarray(f['y'], np.int64)
    if x.ndim == 3:
      x = x[:, None]
    if x.ndim != 4 or x.shape[1] != 1 or len(x) != len(y):
      raise ValueError(f'data-npz: x must be [N, H, W] or [N, 1, H, W] with N = len(y); got '
                       f'x {x.shape}, y {y.shape}')
    if y.min() < 0 or y.max() >= NUM_CLASSES:
      raise ValueError(f'data-npz: y must lie in 0..{NUM_CLASSES - 1}')
    return x, y
  d = json.loads(DIGITS.read_text())
  levels = np.frombuffer(d['images'].encode('ascii'), np.uint8)
  grey = np.searchsorted(np.frombuffer(_LEVELS.encode('ascii'), np.uint8), levels)
  x = (grey.reshape(-1, 1, 8, 8) / 16.0).astype(np.float32)
  return x, np.frombuffer(d['target'].encode('ascii'), np.uint8).astype(np.int64) - ord('0')


def split(x: np.ndarray, y: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """The fixed test / train split (`SPLIT_SEED`)."""
  perm = np.random.default_rng(SPLIT_SEED).permutation(len(y))
  n_test = int(round(TEST_FRACTION * len(y)))
  return {'test': (x[perm[:n_test]], y[perm[:n_test]]),
          'train': (x[perm[n_test:]], y[perm[n_test:]])}


def partition(partition_id: int, num_partitions: int, npz: str = ''
              ) -> tuple[np.ndarray, np.ndarray]:
  """Node `partition_id`'s training shard (contiguous, disjoint)."""
  if not 0 <= partition_id < num_partitions:
    raise ValueError(f'partition-id must lie in 0..{num_partitions - 1} (got {partition_id})')
  x, y = split(*load_arrays(npz))['train']
  bounds = np.linspace(0, len(y), num_partitions + 1).astype(int)
  lo, hi = bounds[partition_id], bounds[partition_id + 1]
  return x[lo:hi], y[lo:hi]


def test_split(npz: str = '') -> tuple[np.ndarray, np.ndarray]:
  return split(*load_arrays(npz))['test']


# ---------------------------------------------------------------------------------- model ---


class Net(nn.Module):
  """A small CNN for 1-channel images (any size >= 4 x 4)."""

  def __init__(self, batchnorm: bool = False):
    super().__init__()
    layers: list[nn.Module] = [nn.Conv2d(1, 16, 3, padding=1)]
    if batchnorm:
      layers.append(nn.BatchNorm2d(16))
    layers += [nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
               nn.AdaptiveMaxPool2d(2), nn.Flatten(), nn.Linear(128, 64), nn.ReLU(),
               nn.Linear(64, NUM_CLASSES)]
    self.net = nn.Sequential(*layers)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.net(x)


def make_model(name: str, seed: int) -> Net:
  if name not in ('cnn', 'cnn_bn'):
    raise ValueError(f"model must be 'cnn' or 'cnn_bn' (got {name!r})")
  torch.manual_seed(seed)
  return Net(batchnorm=name == 'cnn_bn')


def model_name(run_config) -> str:
  """The run's model: `model`, or 'cnn_bn' under the `batchnorm` plant."""
  return 'cnn_bn' if str(run_config.get('plant', 'none')) == 'batchnorm' else str(
      run_config['model'])


def get_weights(model: nn.Module) -> list[np.ndarray]:
  return [v.detach().cpu().numpy().copy() for v in _plain(model).state_dict().values()]


def set_weights(model: nn.Module, weights: list[np.ndarray]) -> None:
  m = _plain(model)
  keys = list(m.state_dict().keys())
  m.load_state_dict({k: torch.as_tensor(np.asarray(w)) for k, w in zip(keys, weights)})


def flat_parameters(model: nn.Module) -> np.ndarray:
  """The trainable parameters as one vector (the order of `model.parameters()`: the
  coordinates the gradient canaries' pool is cut from)."""
  return np.concatenate([p.detach().cpu().numpy().ravel() for p in _plain(model).parameters()])


def num_parameters(model: nn.Module) -> int:
  return int(sum(p.numel() for p in _plain(model).parameters()))


def _plain(model: nn.Module) -> nn.Module:
  return getattr(model, '_module', model)  # Opacus's GradSampleModule wraps the model


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
  """(mean cross-entropy, accuracy)."""
  model.eval()
  logits = model(torch.as_tensor(x))
  loss = nn.functional.cross_entropy(logits, torch.as_tensor(y)).item()
  acc = (logits.argmax(1).numpy() == y).mean()
  return float(loss), float(acc)


@torch.no_grad()
def per_example_loss(model: nn.Module, x: np.ndarray, y: np.ndarray) -> np.ndarray:
  model.eval()
  logits = model(torch.as_tensor(x))
  return nn.functional.cross_entropy(logits, torch.as_tensor(y), reduction='none').numpy()


# ------------------------------------------------------------------------------- training ---


def loader(x: np.ndarray, y: np.ndarray, tags: np.ndarray, batch_size: int) -> DataLoader:
  """Examples with a tag each (-1: ordinary; k >= 0: gradient canary k), shuffled (Opacus
  replaces it by its Poisson `DPDataLoader` unless `poisson_sampling=False`)."""
  ds = TensorDataset(torch.as_tensor(x), torch.as_tensor(y), torch.as_tensor(tags))
  return DataLoader(ds, batch_size=int(batch_size), shuffle=True)


def accountant_epsilons(history: list[tuple[float, float, int]], delta: float
                        ) -> dict[str, float]:
  """Opacus's RDP and PRV epsilons of a history of (noise multiplier, sample rate, steps)
  compositions (Poisson-subsampled Gaussian, add/remove one example)."""
  from opacus.accountants import PRVAccountant, RDPAccountant  # pylint: disable=import-outside-toplevel
  out = {}
  for name, cls in (('rdp', RDPAccountant), ('prv', PRVAccountant)):
    acc = cls()
    acc.history = [(float(z), float(q), int(n)) for z, q, n in history]
    try:
      out[name] = float(acc.get_epsilon(delta=float(delta)))
    except Exception:  # pylint: disable=broad-except
      # PRV's domain can fail at very small noise; the reply says NaN, the audit skips it.
      out[name] = math.nan
  return out


def pick_noise(target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
  """Opacus's noise multiplier for `target_epsilon` after `steps` steps (RDP accountant)."""
  from opacus.accountants.utils import get_noise_multiplier  # pylint: disable=import-outside-toplevel
  return float(get_noise_multiplier(target_epsilon=float(target_epsilon),
                                    target_delta=float(delta), sample_rate=float(sample_rate),
                                    steps=int(steps), accountant='rdp'))


def summary(values: dict[str, Any]) -> str:
  return ', '.join(f'{k}={v:.4g}' if isinstance(v, float) else f'{k}={v}'
                   for k, v in values.items())
