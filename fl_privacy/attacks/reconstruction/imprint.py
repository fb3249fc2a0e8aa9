"""The imprint layer of Fowl, Geiping, Czaja, Goldblum, Goldstein, "Robbing the Fed: Directly
Obtaining Private Data in Federated Learning with Modified Models" (ICLR 2022,
arXiv:2110.13057), Sect. 3.

n ReLU units share one direction w (a public statistic of the input: the mean brightness,
w = 1/d) and differ in their biases: unit i fires for inputs whose statistic exceeds t_i, the
thresholds placed at quantiles of the statistic over data the server knows, so that each bin
[t_i, t_{i+1}) holds about one example of a batch. The units' outgoing weights are identical,
so dL/dh_i is one number g_x per example for every unit it activates. For a batch, dL/dW_i =
sum over the examples with s(x) >= t_i of g_x x and dL/db_i = sum of the same g_x, so an
example alone in bin i is (dL/dW_i - dL/dW_{i+1}) / (dL/db_i - dL/db_{i+1}) (the paper's
Eq. (2); the number unverified, "Eq. (2)" below means this ratio). Two examples in a bin come out as their weighted mixture: a failure, counted as one.

The server's two moves are pure functions a deployment can call (a Flower strategy included):
`craft(params, cuts, key) -> params` writes the layer into a model built by `inject(model,
num_bins)` (the imprint block in front of any of our Flax models), and `recover_update(delta,
num_examples)` reads the inputs back from one client upload Delta = w_t - w_local.

Two structures of the layer (`STRUCTURES`). `cumulative` is the paper's: unit i is a ReLU of
the statistic above t_i, so an example activates every unit below its bin and is read from the
difference of two neighbours. `sparse` is the one-hot ("hat") layer of breaching's
`SparseImprintBlock` (Geiping et al.'s framework, github.com/JonasGeiping/breaching, the
imprint module: a hard-tanh of min 0 and max `gain`, each unit's weights divided by its bin's
width, "more efficient in noise/param tradeoffs"): unit i ramps from 0 to a fixed height across
its own bin [t_i, t_{i+1}) and is flat outside it, so an example's gradient reaches exactly one
unit, which is read alone (dL/dW_i / dL/db_i, no difference). Here the hard-tanh is
relu(a) - relu(a - h) (two ReLUs, as breaching's docstring says it can be), h =
`SPARSE_HEIGHT`. One example's gradient then spans one row, not up to n: per-example clipping
(DP-SGD) shrinks it less, top-k sparsification keeps it whole, and a bin's noise is one row's,
not the difference of two. The structure is a traced operand (`sparse`, 0 or 1) of `craft`,
`Imprinted` and `recover_update`, so one compiled program serves both.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy.models import crafting

STATISTICS = ('mean',)
STRUCTURES = ('cumulative', 'sparse')
# The sparse units' ramp height (pre-activation units). Only the ratio dL/dW_i / dL/db_i is
# read, which does not depend on it; the unit's slope h / (width x d) does set the float32
# rounding of its kernel entries in an upload, so h is small: at digits' narrowest bins (1/1024)
# the slope is 1.6e-3 per input, the cumulative layer's (scale 0.1 / 64).
SPARSE_HEIGHT = 1e-4
# Where the n thresholds go over the public statistic: at its quantiles k / n (the paper's
# choice: each bin holds a 1/n share of the data), or evenly over its range (min + k (max -
# min) / n; one of the adaptive server's alternatives, `pipelines.reconstruction_runs`).
PLACEMENTS = ('quantile', 'uniform')
# Parameter names of the block `inject` puts in front of a model.
IMPRINT, RESTORE, BASE = 'imprint', 'restore', 'base'
# Public statistics closer than this (relative to their scale) are one value to `thresholds`.
_DISTINCT = 1e-6


def statistic(x, name: str = 'mean'):
  """The public statistic s(x) of each input [N, ...] -> [N] (numpy or jax arrays)."""
  if name not in STATISTICS:
    raise ValueError(f'statistic must be one of {STATISTICS} (got {name!r})')
  return x.reshape(x.shape[0], -1).mean(axis=1)


def thresholds(public: np.ndarray, num_bins: int, statistic: str = 'mean',
               placement: str = 'quantile') -> np.ndarray:
  """The n bin thresholds t_0 <= ... <= t_{n-1}: the statistic's quantiles k / n (k = 0 ..
  n-1) over the inputs the server knows (`public` [N, ...]), so that each bin [t_k, t_{k+1})
  (the last one open above) holds a 1/n share of that distribution and almost nothing falls
  below t_0 (below every threshold an input fires no unit and cannot be recovered).
  `placement='uniform'` puts them evenly over the public range instead (min + k (max - min)
  / n: equal widths, unequal shares).

  Each quantile is then moved into the gap below the first distinct public value at or above
  it (values within 1e-6 of each other, relative, are one), half the smallest gap between
  distinct public values below that value: the same public
  values fall on each side, and no input on the public values' grid lies within float rounding
  of a threshold (a quantile of a statistic with few distinct values lands on one of them,
  where the float32 forward pass and a float64 check can disagree on the side: digits' means
  are multiples of 1/1024, and every threshold sits 1/2048 from each). Quantiles that share a
  gap give equal thresholds (an empty bin), as tied quantiles did."""
  if statistic not in STATISTICS:
    raise ValueError(f'statistic must be one of {STATISTICS} (got {statistic!r})')
  if num_bins < 1:
    raise ValueError(f'num_bins must be >= 1 (got {num_bins})')
  if placement not in PLACEMENTS:
    raise ValueError(f'placement must be one of {PLACEMENTS} (got {placement!r})')
  s = np.asarray(public, np.float64).reshape(len(public), -1).mean(axis=1)
  if placement == 'quantile':
    q = np.quantile(s, np.arange(num_bins) / num_bins)
  else:
    q = s.min() + (s.max() - s.min()) * np.arange(num_bins) / num_bins
  # Distinct values: runs of sorted values closer than float32's resolution are one value
  # (8-bit pixels / 255 in float32 put each grid mean at many float64 values 1e-9 apart).
  srt = np.sort(s)
  breaks = np.flatnonzero(np.diff(srt) > _DISTINCT * max(1.0, float(np.max(np.abs(srt)))))
  if not len(breaks):
    return q
  lows, highs = srt[np.r_[0, breaks + 1]], srt[np.r_[breaks, len(srt) - 1]]
  gap = float(np.min(lows[1:] - highs[:-1]))
  above = np.minimum(np.searchsorted(highs, q, side='left'), len(lows) - 1)
  return lows[above] - 0.5 * gap


def layer(dim: int, cuts: np.ndarray, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
  """(kernel [d, n], bias [n]) of the imprint units: unit i computes
  scale x (mean(x) - t_i), so it is active exactly when the statistic exceeds t_i."""
  cuts = np.asarray(cuts, np.float64)
  kernel = np.full((dim, len(cuts)), scale / dim)
  return kernel.astype(np.float32), (-scale * cuts).astype(np.float32)


class Imprinted(nn.Module):
  """`base` behind an imprint block at its input (the paper's Fig. 2).

  z = x + reshape(relu(flat(x) W + b) R), then `base(z)`. `imprint` (Dense, n units) is the
  layer the server crafts; `restore` (Dense n -> d, no bias) feeds the units back into the
  input so that they receive gradients. Honest parameters (from `init`) make it an ordinary
  (if odd) first layer; `craft` turns it into the imprint.
  `sparse` (0 or 1, traced or not) picks the structure: 1 makes each unit the hard-tanh
  relu(a) - relu(a - sparse_height) (the module docstring); 0 the paper's ReLU, computed as
  before when `sparse` is the Python 0.
  """
  base: nn.Module
  num_bins: int
  sparse_height: float = SPARSE_HEIGHT

  @nn.compact
  def __call__(self, x, sparse=0.0):
    flat = x.reshape((x.shape[0], -1))
    a = nn.Dense(self.num_bins, name=IMPRINT)(flat)
    h = nn.relu(a)
    if not _is_zero(sparse):
      h = h - sparse * nn.relu(a - self.sparse_height)
    back = nn.Dense(flat.shape[1], use_bias=False, name=RESTORE)(h)
    return self.base(x + back.reshape(x.shape))


def _is_zero(v) -> bool:
  """True for a Python or numpy 0 (not a traced value): the paper's layer, as before."""
  return isinstance(v, (int, float, np.number)) and float(v) == 0.0


def inject(model: nn.Module, num_bins: int) -> Imprinted:
  """`model` with an imprint block of `num_bins` units in front of it (any of our models)."""
  if num_bins < 1:
    raise ValueError(f'num_bins must be >= 1 (got {num_bins})')
  return Imprinted(base=model, num_bins=int(num_bins))


# The upload is w_t - w_local in float32, so each entry carries rounding of about 6e-8 x |w|:
# a small slope keeps the imprint weights (hence that rounding) small beside the gradient, and a
# large shared outgoing weight makes the gradient large. Measured on digits (B = 8, one SGD step
# of rate 0.1, 256 bins): slope 1 / restore 1 recovered 55% of the examples exactly (within
# 1/255), slope 0.1 / restore 32 93% (the rest share a bin).
SCALE, RESTORE_SCALE = 0.1, 32.0


def craft(params: Any, cuts, key: jax.Array, *, scale: float = SCALE,
          restore_scale: float = RESTORE_SCALE, layer_name: str = IMPRINT,
          restore_name: str = RESTORE, sparse=0.0, top: float = 1.0,
          sparse_height: float = SPARSE_HEIGHT) -> Any:
  """The server's crafted parameters: the imprint layer written into `params`.

  Args:
    params: the `params` collection of an `inject`ed model (or any params holding a Dense
      `layer_name` on the flat input and a Dense `restore_name` after it).
    cuts: the n thresholds (`thresholds`), n = the layer's width.
    key: draws the one outgoing direction v every unit shares.
    scale: the units' slope (the ratio of Eq. (2) does not depend on it; its precision does:
      `SCALE`).
    restore_scale: ||v|| x n: how far the block moves the base model's input (v is
      restore_scale / n times a random unit vector, so that even with every unit active the
      input moves by about restore_scale x the statistic's spread).
    sparse: 1 for the sparse (one-hot) structure, 0 for the paper's (traced or not): unit i
      then has slope sparse_height / (w_i d) and bias -sparse_height t_i / w_i, w_i its bin's
      width (t_{i+1} - t_i, the last bin's up to `top`, the statistic's largest value); a bin
      of width 0 (tied quantiles) gets a unit that never fires.
    top: the statistic's upper end (the data's largest value for the mean).
    sparse_height: the sparse units' ramp height (`Imprinted.sparse_height`).

  Returns:
    New params; the rest of the model keeps its (random, honest) weights.

  Raises:
    KeyError: `params` has no such layers (`models.crafting`).
    ValueError: the number of thresholds is not the layer's width.
  """
  kernel = crafting.read_neuron(params, (layer_name,), 0)[0]   # raises KeyError first
  dim = kernel.shape[0]
  width = params[layer_name]['kernel'].shape[1]
  cuts = jnp.asarray(cuts, jnp.float32)
  if cuts.shape != (width,):
    raise ValueError(f'{width} thresholds needed for {layer_name!r} (got {cuts.shape})')
  k = jnp.full((dim, width), scale / dim, jnp.float32)
  b = -scale * cuts
  if not _is_zero(sparse):
    upper = jnp.concatenate([cuts[1:], jnp.full((1,), top, jnp.float32)])
    w = upper - cuts
    live = w > 0
    slope = jnp.where(live, sparse_height / jnp.where(live, w, 1.0), 0.0)
    on = jnp.asarray(sparse, jnp.float32) > 0
    k = jnp.where(on, jnp.broadcast_to(slope / dim, (dim, width)), k)
    b = jnp.where(on, jnp.where(live, -slope * cuts, -1.0), b)
  out = crafting.write_layer(params, (layer_name,), kernel=k, bias=b)
  restore = out[restore_name]['kernel']
  v = jax.random.normal(key, (restore.shape[1],))
  v = restore_scale / width * v / jnp.linalg.norm(v)
  # Identical outgoing weights: dL/dh_i is then one number per example for every unit it
  # activates, which is what makes neighbouring units' gradients differ by one example.
  return crafting.write_layer(out, (restore_name,), kernel=jnp.tile(v, (width, 1)))


def bin_differences(kernel_delta, bias_delta, sparse=0.0):
  """(dW [n, d], db [n]): neighbouring units' differences, the top unit against 0 (Eq. (2));
  with `sparse` 1 each unit's own row (the sparse structure's bins do not overlap)."""
  kd = jnp.asarray(kernel_delta).T
  bd = jnp.asarray(bias_delta)
  kd = jnp.concatenate([kd, jnp.zeros_like(kd[:1])], axis=0)
  bd = jnp.concatenate([bd, jnp.zeros_like(bd[:1])])
  if _is_zero(sparse):
    return kd[:-1] - kd[1:], bd[:-1] - bd[1:]
  keep = 1.0 - jnp.asarray(sparse, kd.dtype)
  return kd[:-1] - keep * kd[1:], bd[:-1] - keep * bd[1:]


def recover_update(delta: Any, num_examples: int, *, layer_name: str = IMPRINT,
                   rtol: float = 1e-4, sparse=0.0) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The inputs the server reads from one upload (jit-able; fixed shapes).

  The bins are ranked by |db| and the `num_examples` largest kept (FedAvg clients report
  their example count; with noise on the upload every bin's db is non-zero, and the largest
  are the bins that held data). A bin whose |db| is below rtol x the largest is empty.

  Args:
    delta: the upload's params (Delta = w_t - w_local, or a gradient: Eq. (2) is a ratio).
    num_examples: N, the client's example count.
    layer_name: the imprint layer.
    rtol: relative size below which a bin counts as empty.
    sparse: the layer's structure (1: sparse, read unit by unit; 0: the paper's differences).

  Returns:
    (inputs [N, d], valid [N] bool, bins [N] int32): the recovered flat inputs (a bin read
    in one piece; zero where not valid).
  """
  dw, db = bin_differences(delta[layer_name]['kernel'], delta[layer_name]['bias'], sparse)
  k = min(int(num_examples), db.shape[0])
  _, bins = jax.lax.top_k(jnp.abs(db), k)
  w = db[bins]
  valid = jnp.abs(w) > rtol * jnp.max(jnp.abs(db))
  x = dw[bins] / jnp.where(valid, w, 1.0)[:, None]
  x = jnp.where(valid[:, None], x, 0.0)
  if k < num_examples:
    pad = num_examples - k
    x = jnp.concatenate([x, jnp.zeros((pad, x.shape[1]), x.dtype)])
    valid = jnp.concatenate([valid, jnp.zeros(pad, bool)])
    bins = jnp.concatenate([bins, jnp.full(pad, -1, bins.dtype)])
  return x, valid, bins.astype(jnp.int32)


def recover(kernel_grad: np.ndarray, bias_grad: np.ndarray, *, rtol: float = 1e-6,
            structure: str = 'cumulative') -> tuple[np.ndarray, np.ndarray]:
  """Recovered inputs [k, d] from the imprint layer's gradient (or an upload after one SGD
  step), one per bin whose bias-gradient difference is not ~0 (|db| > rtol x the largest),
  and their bins [k]: Eq. (2), in numpy float64 (`structure='sparse'`: each unit's own row)."""
  if structure not in STRUCTURES:
    raise ValueError(f'structure must be one of {STRUCTURES} (got {structure!r})')
  kg = np.asarray(kernel_grad, np.float64).T
  bg = np.asarray(bias_grad, np.float64)
  kg = np.concatenate([kg, np.zeros_like(kg[:1])], axis=0)
  bg = np.concatenate([bg, [0.0]])
  keep = 1.0 if structure == 'cumulative' else 0.0
  dw, db = kg[:-1] - keep * kg[1:], bg[:-1] - keep * bg[1:]
  live = np.abs(db) > rtol * max(float(np.max(np.abs(db))), 1e-300)
  return dw[live] / db[live][:, None], np.flatnonzero(live)
