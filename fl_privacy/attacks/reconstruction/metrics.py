"""How well a reconstruction recovered the client's inputs: PSNR, SSIM, matching.

Recovered inputs come in no particular order, so each is scored against the true input it is
matched to one-to-one (`match`: the Hungarian assignment that maximises the total PSNR, scipy's
`linear_sum_assignment`). Images are float arrays [..., H, W, C] in [0, data_range].
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage
from scipy import optimize

EXACT = 1.0 / 255.0   # "exact recovery": every value within one 8-bit grey level


def psnr(recovered: np.ndarray, true: np.ndarray, data_range: float = 1.0) -> float:
  """Peak signal-to-noise ratio 10 log10(range^2 / MSE) in dB (inf for an exact copy)."""
  recovered, true = np.asarray(recovered, np.float64), np.asarray(true, np.float64)
  if recovered.shape != true.shape:
    raise ValueError(f'shapes differ: {recovered.shape} vs {true.shape}')
  mse = float(np.mean((recovered - true) ** 2))
  return np.inf if mse == 0 else float(10 * np.log10(data_range ** 2 / mse))


def ssim(recovered: np.ndarray, true: np.ndarray, data_range: float = 1.0,
         win_size: int = 7) -> float:
  """Structural similarity (Wang, Bovik, Sheikh, Simoncelli, IEEE TIP 2004, Eq. (13)) of two
  images [H, W] or [H, W, C], averaged over channels: a `win_size` x `win_size` uniform window,
  K1 = 0.01, K2 = 0.03, unbiased (sample) local variances, the mean over the positions where
  the window fits (the convention of scikit-image's `structural_similarity`)."""
  x, y = np.asarray(recovered, np.float64), np.asarray(true, np.float64)
  if x.shape != y.shape:
    raise ValueError(f'shapes differ: {x.shape} vs {y.shape}')
  if x.ndim == 3:
    return float(np.mean([ssim(x[..., c], y[..., c], data_range, win_size)
                          for c in range(x.shape[-1])]))
  if x.ndim != 2 or min(x.shape) < win_size:
    raise ValueError(f'ssim needs [H, W(, C)] images at least {win_size} wide (got {x.shape})')
  n = win_size * win_size
  cov_norm = n / (n - 1.0)
  mean = lambda a: ndimage.uniform_filter(a, size=win_size)
  ux, uy = mean(x), mean(y)
  vx = cov_norm * (mean(x * x) - ux * ux)
  vy = cov_norm * (mean(y * y) - uy * uy)
  vxy = cov_norm * (mean(x * y) - ux * uy)
  c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
  s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux ** 2 + uy ** 2 + c1) * (vx + vy + c2))
  pad = (win_size - 1) // 2
  return float(s[pad:-pad or None, pad:-pad or None].mean())


def match(recovered: np.ndarray, true: np.ndarray, data_range: float = 1.0
          ) -> tuple[np.ndarray, np.ndarray]:
  """One-to-one pairs (recovered index, true index) maximising the total PSNR (Hungarian).

  With fewer recovered than true inputs every recovered one is paired; with more, every
  true one. PSNRs are capped at 200 dB so that exact copies still rank.
  """
  r = np.asarray(recovered, np.float64).reshape(len(recovered), -1)
  t = np.asarray(true, np.float64).reshape(len(true), -1)
  mse = ((r[:, None, :] - t[None, :, :]) ** 2).mean(axis=-1)
  gain = np.minimum(10 * np.log10(data_range ** 2 / np.maximum(mse, 1e-300)), 200.0)
  rows, cols = optimize.linear_sum_assignment(gain, maximize=True)
  return rows, cols


def batch_metrics(recovered: np.ndarray, true: np.ndarray, *, data_range: float = 1.0,
                  psnr_threshold: float = 30.0) -> dict[str, float]:
  """A trial's scores: mean PSNR / SSIM over matched pairs, the fraction of the client's batch
  recovered above `psnr_threshold` dB and exactly (max abs error < 1/255)."""
  rows, cols = match(recovered, true, data_range)
  ps = [psnr(recovered[i], true[j], data_range) for i, j in zip(rows, cols)]
  exact = [float(np.max(np.abs(np.asarray(recovered[i], np.float64) - true[j]))) < EXACT
           for i, j in zip(rows, cols)]
  out = {'psnr_mean': float(np.mean(np.minimum(ps, 200.0))) if ps else float('nan'),
         'recovered_fraction': float(np.sum(np.asarray(ps) > psnr_threshold)) / len(true),
         'exact_fraction': float(np.sum(exact)) / len(true)}
  if np.asarray(true).ndim >= 3 and min(np.asarray(true).shape[1:3]) >= 7:
    out['ssim_mean'] = float(np.mean([ssim(recovered[i], true[j], data_range)
                                      for i, j in zip(rows, cols)])) if ps else float('nan')
  return out
