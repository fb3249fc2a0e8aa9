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


def bootstrap_mean(values, rng: np.random.Generator, resamples: int = 1000,
                   confidence: float = 0.95) -> tuple[float, float]:
  """Percentile bootstrap interval of the mean of `values` (one per trial: trials are the
  independent units, so examples of one client are resampled together); NaNs are dropped,
  (nan, nan) when none is left."""
  v = np.asarray(values, np.float64)
  v = v[np.isfinite(v)]
  if v.size == 0:
    return float('nan'), float('nan')
  means = v[rng.integers(0, v.size, (int(resamples), v.size))].mean(axis=1)
  tail = (1.0 - confidence) / 2
  return float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))


def trial_scores(recovered: np.ndarray, valid: np.ndarray, true: np.ndarray, *,
                 data_range: float = 1.0, psnr_threshold: float = 30.0) -> dict[str, float]:
  """One trial's counts and means: `recovered` [K, d] flat rows, `valid` [K], `true` [N, ...].

  Returns `n` (N), `recovered` and `exact` (how many of the N true inputs were recovered above
  the PSNR threshold / exactly, each matched to at most one recovered row), `psnr_mean` and
  `ssim_mean` over the matched pairs (NaN when nothing was recovered).
  """
  true = np.asarray(true, np.float64)
  rows = np.asarray(recovered, np.float64)[np.asarray(valid, bool)]
  n = len(true)
  if len(rows) == 0:
    return dict(n=n, recovered=0, exact=0, psnr_mean=float('nan'), ssim_mean=float('nan'))
  m = batch_metrics(rows.reshape((len(rows),) + true.shape[1:]), true, data_range=data_range,
                    psnr_threshold=psnr_threshold)
  return dict(n=n, recovered=int(round(m['recovered_fraction'] * n)),
              exact=int(round(m['exact_fraction'] * n)), psnr_mean=m['psnr_mean'],
              ssim_mean=m.get('ssim_mean', float('nan')))


def point_metrics(outcome: dict, x_pool: np.ndarray, y_pool: np.ndarray, *, n: int | None = None,
                  rng: np.random.Generator, psnr_threshold: float = 30.0,
                  resamples: int = 1000) -> dict[str, float]:
  """Every trial of a point scored and summarised, each rate with its interval.

  `outcome`: `game.run`'s fields stacked over T trials, of clients holding the first `n` of
  their `index` rows (None: all). Rates over examples (`recovered`,
  `exact`: T x N examples, 95% Clopper-Pearson, which takes the examples as independent)
  stand beside the per-trial means with a bootstrap over trials (`recovered_trial_mean`,
  `exact_trial_mean`, `psnr_mean`, `ssim_mean`), which does not; `all_exact` is the rate of
  trials whose whole batch was recovered exactly (Clopper-Pearson over trials); `label_acc`
  the iDLG label's accuracy over the trials of one-example clients (only where N = 1).
  """
  from fl_privacy.eval import stats  # pylint: disable=g-import-not-at-top
  index = np.asarray(outcome['index'])
  index = index if n is None else index[:, :n]
  trials, n = index.shape
  scores = [trial_scores(outcome['recovered'][t], outcome['valid'][t], x_pool[index[t]],
                         psnr_threshold=psnr_threshold) for t in range(trials)]
  out: dict[str, float] = {'n_trials': trials, 'n_examples': trials * n,
                           'psnr_threshold': float(psnr_threshold)}
  for name in ('recovered', 'exact'):
    k = sum(s[name] for s in scores)
    out.update(stats.rate(name, k, trials * n))
    per_trial = [s[name] / n for s in scores]
    out[f'{name}_trial_mean'] = float(np.mean(per_trial))
    lo, hi = bootstrap_mean(per_trial, rng, resamples)
    out[f'{name}_trial_mean_ci_low'], out[f'{name}_trial_mean_ci_high'] = lo, hi
  out.update(stats.rate('all_exact', sum(s['exact'] == n for s in scores), trials))
  for name in ('psnr_mean', 'ssim_mean'):
    v = np.array([s[name] for s in scores], np.float64)
    out[name] = float(np.nanmean(v)) if np.isfinite(v).any() else float('nan')
    out[f'{name}_ci_low'], out[f'{name}_ci_high'] = bootstrap_mean(v, rng, resamples)
  if n == 1:
    correct = int(np.sum(np.asarray(outcome['label']) == np.asarray(y_pool)[index[:, 0]]))
    out.update(stats.rate('label_acc', correct, trials))
  return out
