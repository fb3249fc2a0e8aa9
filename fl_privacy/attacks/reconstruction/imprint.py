"""The imprint layer of Fowl, Geiping, Czaja, Goldblum, Goldstein, "Robbing the Fed: Directly
Obtaining Private Data in Federated Learning with Modified Models" (ICLR 2022,
arXiv:2110.13057), Sect. 3.

n ReLU units share one direction w (a public statistic of the input: the mean brightness,
w = 1/d) and differ in their biases: unit i fires for inputs whose statistic exceeds t_i, the
thresholds placed at quantiles of the statistic over data the server knows, so that each bin
[t_i, t_{i+1}) holds about one example of a batch. The units' outgoing weights are identical,
so dL/dh_i is one number g_x per example for every unit it activates. For a batch, dL/dW_i = sum over the
examples with s(x) >= t_i of g_x x and dL/db_i = sum of the same g_x, so an example alone in
bin i is (dL/dW_i - dL/dW_{i+1}) / (dL/db_i - dL/db_{i+1}). Two examples in a bin come out as
their weighted mixture: a failure, counted as one.
"""

from __future__ import annotations

import numpy as np

STATISTICS = ('mean',)


def thresholds(public: np.ndarray, num_bins: int, statistic: str = 'mean') -> np.ndarray:
  """The n bin thresholds t_1 < ... < t_n: the statistic's quantiles (k / (n + 1)) over the
  inputs the server knows (`public` [N, ...])."""
  if statistic not in STATISTICS:
    raise ValueError(f'statistic must be one of {STATISTICS} (got {statistic!r})')
  if num_bins < 1:
    raise ValueError(f'num_bins must be >= 1 (got {num_bins})')
  s = np.asarray(public, np.float64).reshape(len(public), -1).mean(axis=1)
  return np.quantile(s, np.arange(1, num_bins + 1) / (num_bins + 1))


def layer(dim: int, cuts: np.ndarray, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
  """(kernel [d, n], bias [n]) of the imprint units: unit i computes
  scale x (mean(x) - t_i), so it is active exactly when the statistic exceeds t_i."""
  cuts = np.asarray(cuts, np.float64)
  kernel = np.full((dim, len(cuts)), scale / dim)
  return kernel.astype(np.float32), (-scale * cuts).astype(np.float32)


def recover(kernel_grad: np.ndarray, bias_grad: np.ndarray, *, min_weight: float = 1e-10
            ) -> tuple[np.ndarray, np.ndarray]:
  """Recovered inputs [k, d] from the imprint layer's gradient (or an upload after one SGD
  step), one per bin whose bias-gradient difference is non-zero, and their bins [k]."""
  kg = np.asarray(kernel_grad, np.float64)
  bg = np.asarray(bias_grad, np.float64)
  kg = np.concatenate([kg, np.zeros((kg.shape[0], 1))], axis=1)
  bg = np.concatenate([bg, [0.0]])
  dw = kg[:, :-1] - kg[:, 1:]
  db = bg[:-1] - bg[1:]
  live = np.abs(db) > min_weight
  return (dw[:, live] / db[live]).T, np.flatnonzero(live)
