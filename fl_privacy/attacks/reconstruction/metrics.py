"""How well a reconstruction recovered the client's inputs: PSNR, SSIM, matching, intervals.

Recovered inputs come in no particular order, so each is scored against the true input it is
matched to one-to-one (`match`: the Hungarian assignment that maximises the total PSNR, scipy's
`linear_sum_assignment`). Images are float arrays [..., H, W, C] in [0, data_range].

A point's trials are independent clients, but the examples of one client are not: they fail
together when they share an imprint bin, or all at once when the client's upload is noised.
So every interval treats the client (trial) as the unit: rates carry Korn and Graubard's
effective-sample-size Clopper-Pearson interval (`clustered_rate`), PSNR means and medians a
bootstrap that resamples whole trials (`cluster_bootstrap`). The Clopper-Pearson interval over
examples, which takes them as independent, is kept beside the rates under its own name.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import ndimage
from scipy import optimize
from scipy import stats as sp_stats

from fl_privacy.attacks.reconstruction import value_grid

EXACT = 1.0 / 255.0   # "exact recovery": every value within one 8-bit grey level
PSNR_CAP = 200.0      # dB: an exact copy's PSNR is infinite; capped so that means exist
SSIM_WINDOW = 11      # Wang et al.'s Gaussian window: 11 x 11 taps ...
SSIM_SIGMA = 1.5      # ... of standard deviation 1.5 pixels
_SSIM_TRUNCATE = ((SSIM_WINDOW - 1) // 2) / SSIM_SIGMA   # radius 5 taps in scipy's terms


def psnr(recovered: np.ndarray, true: np.ndarray, data_range: float = 1.0) -> float:
  """Peak signal-to-noise ratio 10 log10(range^2 / MSE) in dB (inf for an exact copy)."""
  recovered, true = np.asarray(recovered, np.float64), np.asarray(true, np.float64)
  if recovered.shape != true.shape:
    raise ValueError(f'shapes differ: {recovered.shape} vs {true.shape}')
  mse = float(np.mean((recovered - true) ** 2))
  return np.inf if mse == 0 else float(10 * np.log10(data_range ** 2 / mse))


def ssim(recovered: np.ndarray, true: np.ndarray, data_range: float = 1.0,
         win_size: int = 7) -> float:
  """SSIM with scikit-image's default uniform `win_size` window and sample variances.

  Not Wang et al.'s window (that is `ssim_gaussian`, which the metrics report); kept because it
  is what `structural_similarity` returns without options, for comparison. Images [H, W] or
  [H, W, C], averaged over channels, K1 = 0.01, K2 = 0.03, the mean over the positions where the
  window fits.
  """
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
  return _mean_ssim(x, y, mean, cov_norm, data_range, (win_size - 1) // 2)


def _mean_ssim(x, y, mean, cov_norm, data_range, pad) -> float:
  """Wang et al.'s Eq. (13) at every window position, averaged over those where it fits."""
  ux, uy = mean(x), mean(y)
  vx = cov_norm * (mean(x * x) - ux * ux)
  vy = cov_norm * (mean(y * y) - uy * uy)
  vxy = cov_norm * (mean(x * y) - ux * uy)
  c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
  s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux ** 2 + uy ** 2 + c1) * (vx + vy + c2))
  return float(s[pad:-pad or None, pad:-pad or None].mean())


def ssim_window_fits(shape: tuple[int, ...]) -> bool:
  """Whether Wang et al.'s 11 x 11 window fits images of `shape` ([H, W] or [H, W, C])."""
  return len(shape) in (2, 3) and min(shape[:2]) >= SSIM_WINDOW


def ssim_gaussian(recovered: np.ndarray, true: np.ndarray, data_range: float = 1.0) -> float:
  """Mean SSIM as Wang, Bovik, Sheikh, Simoncelli, "Image quality assessment: from error
  visibility to structural similarity", IEEE TIP 13(4), 2004: Eq. (13) with the local
  statistics of Eqs. (14)-(16) under an 11 x 11 circular Gaussian window of sigma 1.5 (unit
  sum), K1 = 0.01, K2 = 0.03, averaged over the positions where the window fits (Eq. (17)) and
  over colour channels. Images [H, W] or [H, W, C] with both sides >= 11: on smaller images
  the window does not fit, and a smaller one would be another index (ValueError).
  """
  x, y = np.asarray(recovered, np.float64), np.asarray(true, np.float64)
  if x.shape != y.shape:
    raise ValueError(f'shapes differ: {x.shape} vs {y.shape}')
  if not ssim_window_fits(x.shape):
    raise ValueError(f'Wang et al.\'s SSIM needs [H, W(, C)] images with both sides >= '
                     f'{SSIM_WINDOW} (got {x.shape})')
  if x.ndim == 3:
    return float(np.mean([ssim_gaussian(x[..., c], y[..., c], data_range)
                          for c in range(x.shape[-1])]))
  mean = lambda a: ndimage.gaussian_filter(a, SSIM_SIGMA, truncate=_SSIM_TRUNCATE)
  return _mean_ssim(x, y, mean, 1.0, data_range, (SSIM_WINDOW - 1) // 2)


def _pair_mse(recovered, true) -> np.ndarray:
  r = np.asarray(recovered, np.float64).reshape(len(recovered), -1)
  t = np.asarray(true, np.float64).reshape(len(true), -1)
  return ((r[:, None, :] - t[None, :, :]) ** 2).mean(axis=-1)


def _capped_psnr(mse: np.ndarray, data_range: float) -> np.ndarray:
  return np.minimum(10 * np.log10(data_range ** 2 / np.maximum(mse, 1e-300)), PSNR_CAP)


def match(recovered: np.ndarray, true: np.ndarray, data_range: float = 1.0
          ) -> tuple[np.ndarray, np.ndarray]:
  """One-to-one pairs (recovered index, true index) maximising the total PSNR (Hungarian).

  With fewer recovered than true inputs every recovered one is paired; with more, every
  true one. PSNRs are capped at 200 dB so that exact copies still rank.
  """
  gain = _capped_psnr(_pair_mse(recovered, true), data_range)
  rows, cols = optimize.linear_sum_assignment(gain, maximize=True)
  return rows, cols


def pair_scores(recovered: np.ndarray, true: np.ndarray, *, data_range: float = 1.0
                ) -> dict[str, np.ndarray]:
  """The matched pairs' scores, one entry per pair: `psnr` (dB, capped at 200), `exact`
  (max abs error < 1/255) and `ssim` (Wang et al.'s, NaN where the window does not fit)."""
  recovered, true = np.asarray(recovered, np.float64), np.asarray(true, np.float64)
  mse = _pair_mse(recovered, true)
  rows, cols = optimize.linear_sum_assignment(_capped_psnr(mse, data_range), maximize=True)
  err = np.abs(recovered[rows] - true[cols]).reshape(len(rows), -1)
  fits = ssim_window_fits(true.shape[1:])
  return dict(psnr=_capped_psnr(mse[rows, cols], data_range),
              exact=err.max(axis=1, initial=0.0) < EXACT,
              ssim=np.array([ssim_gaussian(recovered[i], true[j], data_range) if fits
                             else np.nan for i, j in zip(rows, cols)], np.float64))


def batch_metrics(recovered: np.ndarray, true: np.ndarray, *, data_range: float = 1.0,
                  psnr_threshold: float = 30.0) -> dict[str, float]:
  """A trial's scores: mean PSNR / SSIM over matched pairs, the fraction of the client's batch
  recovered above `psnr_threshold` dB and exactly (max abs error < 1/255). `ssim_mean` is
  Wang et al.'s SSIM, NaN with `ssim_window_fits` 0 on images under 11 x 11 (8 x 8 digits)."""
  p = pair_scores(recovered, true, data_range=data_range)
  n = len(true)
  return {'psnr_mean': float(np.mean(p['psnr'])) if p['psnr'].size else float('nan'),
          'recovered_fraction': float(np.sum(p['psnr'] > psnr_threshold)) / n,
          'exact_fraction': float(np.sum(p['exact'])) / n,
          'ssim_mean': (float(np.mean(p['ssim'])) if p['ssim'].size and
                        ssim_window_fits(np.shape(true)[1:]) else float('nan')),
          'ssim_window_fits': float(ssim_window_fits(np.shape(true)[1:]))}


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


def rate_fields(name: str, successes, sizes) -> dict[str, float]:
  """`name`, `name_ci_low/high` and `name_effective_n` of `clustered_rate` (the client as the
  unit), with Clopper-Pearson over the pooled examples as `name_example_ci_low/high`."""
  from fl_privacy.eval import stats  # pylint: disable=g-import-not-at-top  (as point_metrics)
  rate, low, high, n_eff = clustered_rate(successes, sizes)
  k = np.asarray(successes)
  total = int(np.broadcast_to(np.asarray(sizes), k.shape).sum())
  example = stats.rate(name, int(k.sum()), total)
  return {name: rate, f'{name}_ci_low': low, f'{name}_ci_high': high,
          f'{name}_effective_n': n_eff, f'{name}_example_ci_low': example[f'{name}_ci_low'],
          f'{name}_example_ci_high': example[f'{name}_ci_high']}


def clustered_rate(successes, sizes, confidence: float = 0.95) -> tuple[float, float, float,
                                                                         float]:
  """A rate over clustered examples with an interval that takes the clusters as the unit.

  `successes[t]` of `sizes[t]` examples of cluster (client) t; returns (rate, low, high,
  effective n). The rate is sum(successes) / sum(sizes). The interval is Korn & Graubard's
  ("Confidence intervals for proportions with small expected number of positive counts
  estimated from survey data", Survey Methodology 24(2), 1998): Clopper-Pearson at the
  effective sample size n* = p(1 - p) / v, with v the ratio estimator's variance between
  clusters (with-replacement, T / (T - 1) correction), scaled by (t_{N-1} / t_{T-1})^2 for the
  T - 1 degrees of freedom that v rests on, and then at most the N examples (as R survey's
  `svyciprop(method='beta')` with the NCHS cap: clustering never adds information). Chosen
  over a bootstrap or Student's t over per-client rates because those collapse to a zero-width
  interval when every client scores the same (a rate of 0 or 1 is common here), and keep the
  interval inside [0, 1]. Where every client succeeds (or fails) completely, v = 0 and n* is
  undefined; the interval is then Clopper-Pearson over the T clients, valid for any dependence
  within a client (a client's rate r in [0, 1] with mean mu has P(r = 1) <= mu). One
  non-degenerate cluster says nothing about the spread between clusters: (0, 1).
  """
  k = np.asarray(successes, np.float64)
  m = np.broadcast_to(np.asarray(sizes, np.float64), k.shape)
  if k.ndim != 1 or np.any(m <= 0) or np.any(k < 0) or np.any(k > m):
    raise ValueError('successes must be a 1-D array with 0 <= successes <= sizes, sizes > 0')
  clusters, total = k.size, float(m.sum())
  if clusters == 0:
    return float('nan'), 0.0, 1.0, 0.0
  p = float(k.sum()) / total
  alpha = 1.0 - confidence
  if np.all(k == 0) or np.all(k == m):
    low, high = _beta_interval(p * clusters, clusters, alpha)
    return p, low, high, float(clusters)
  if clusters < 2:
    return p, 0.0, 1.0, 0.0
  v = clusters / (clusters - 1) * float(np.sum((k - p * m) ** 2)) / total ** 2
  df_scale = (sp_stats.t.ppf(1 - alpha / 2, total - 1)
              / sp_stats.t.ppf(1 - alpha / 2, clusters - 1)) ** 2
  n_eff = total if v == 0 else min(total, p * (1 - p) / v * df_scale)
  low, high = _beta_interval(p * n_eff, n_eff, alpha)
  return p, low, high, float(n_eff)


def _beta_interval(k: float, n: float, alpha: float) -> tuple[float, float]:
  """Clopper-Pearson's beta quantiles at a possibly fractional count k of n."""
  low = 0.0 if k <= 0 else float(sp_stats.beta.ppf(alpha / 2, k, n - k + 1))
  high = 1.0 if k >= n else float(sp_stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
  return low, high


def resample_counts(clusters: int, rng: np.random.Generator, resamples: int = 1000
                    ) -> np.ndarray:
  """[resamples, clusters] how often each cluster is drawn when `clusters` are drawn with
  replacement: one bootstrap resample of whole trials per row."""
  draws = rng.integers(0, clusters, (int(resamples), clusters))
  rows = np.arange(int(resamples))[:, None] * clusters
  return np.bincount((draws + rows).ravel(), minlength=int(resamples) * clusters).reshape(
      int(resamples), clusters)


def cluster_bootstrap(values, cluster, counts: np.ndarray, *, statistic: str,
                      confidence: float = 0.95) -> tuple[float, float]:
  """Percentile interval of the mean or median of pooled `values`, resampling whole clusters.

  `cluster[i]` is the trial value i belongs to, `counts` the resamples (`resample_counts`:
  trials with no value are drawn too), so values of one client stay together. Resamples with
  no value are dropped; (nan, nan) when every one is empty.
  """
  v = np.asarray(values, np.float64)
  g = np.asarray(cluster, np.int64)
  counts = np.asarray(counts)
  if statistic not in ('mean', 'median'):
    raise ValueError(f"statistic must be 'mean' or 'median' (got {statistic!r})")
  if v.size == 0:
    return float('nan'), float('nan')
  clusters = counts.shape[1]
  if statistic == 'mean':
    size = counts @ np.bincount(g, minlength=clusters)
    with np.errstate(invalid='ignore', divide='ignore'):
      stat = (counts @ np.bincount(g, weights=v, minlength=clusters)) / size
  else:
    stat = _weighted_medians(v, g, counts)
  stat = stat[np.isfinite(stat)]
  if stat.size == 0:
    return float('nan'), float('nan')
  tail = (1.0 - confidence) / 2
  return float(np.quantile(stat, tail)), float(np.quantile(stat, 1.0 - tail))


def _weighted_medians(v: np.ndarray, g: np.ndarray, counts: np.ndarray) -> np.ndarray:
  """np.median of each resample's pool (value i repeated counts[r, g[i]] times), without
  building the pools: resamples x values reaches 1e8 at 1,000 trials of 64 examples.

  The sorted values are cut into blocks; a matrix product counts each resample's pool up to
  every block's end, and only the block that holds a median rank is walked value by value.
  """
  order = np.argsort(v, kind='stable')
  v, g = v[order], g[order]
  resamples, clusters = counts.shape
  blocks = max(1, math.isqrt(v.size))   # fastest of the widths tried at 1,000 x 8 and x 64
  edges = np.linspace(0, v.size, blocks + 1).round().astype(np.int64)
  block = np.repeat(np.arange(blocks), np.diff(edges))
  per_block = np.bincount(g * blocks + block, minlength=clusters * blocks).reshape(
      clusters, blocks)
  upto = counts.astype(np.float64) @ np.cumsum(per_block, axis=1)   # pool size to block end
  total = upto[:, -1]
  width = int(np.max(np.diff(edges)))
  within = np.minimum(edges[:-1, None] + np.arange(width)[None, :], v.size - 1)
  pad = np.arange(width)[None, :] >= np.diff(edges)[:, None]
  rows = np.arange(resamples)
  medians = []
  for rank in ((total - 1) // 2, total // 2):   # the two middle ranks (equal when odd)
    k = np.argmax(upto > rank[:, None], axis=1)
    before = np.where(k > 0, upto[rows, np.maximum(k - 1, 0)], 0.0)
    pos = within[k]
    w = np.where(pad[k], 0, counts[rows[:, None], g[pos]])
    j = np.argmax(before[:, None] + np.cumsum(w, axis=1) > rank[:, None], axis=1)
    medians.append(v[pos[rows, j]])
  return np.where(total > 0, (medians[0] + medians[1]) / 2, np.nan)


def trial_scores(recovered: np.ndarray, valid: np.ndarray, true: np.ndarray, *,
                 data_range: float = 1.0, psnr_threshold: float = 30.0,
                 grid: np.ndarray | None = None) -> dict:
  """One trial's counts and means: `recovered` [K, d] flat rows, `valid` [K], `true` [N, ...].

  Returns `n` (N), `recovered` and `exact` (how many of the N true inputs were recovered above
  the PSNR threshold / exactly, each matched to at most one recovered row), `psnr_mean` and
  `ssim_mean` over the matched pairs (NaN when nothing was recovered; SSIM NaN where Wang et
  al.'s window does not fit), and the matched pairs' `pair_psnr` (capped) and `pair_exact`;
  `exact_grid` and `psnr_grid_mean` the same after rounding every recovered value to the
  data's value grid (`value_grid.round_to`, matched anew; `grid` None: equal to `exact` and
  `psnr_mean`).
  """
  true = np.asarray(true, np.float64)
  rows = np.asarray(recovered, np.float64)[np.asarray(valid, bool)]
  n = len(true)
  if len(rows) == 0:
    return dict(n=n, recovered=0, exact=0, exact_grid=0, psnr_mean=float('nan'),
                psnr_grid_mean=float('nan'), ssim_mean=float('nan'),
                pair_psnr=np.zeros(0), pair_exact=np.zeros(0, bool))
  rows = rows.reshape((len(rows),) + true.shape[1:])
  p = pair_scores(rows, true, data_range=data_range)
  out = dict(n=n, recovered=int(np.sum(p['psnr'] > psnr_threshold)),
             exact=int(np.sum(p['exact'])), psnr_mean=float(np.mean(p['psnr'])),
             ssim_mean=float(np.mean(p['ssim'])), pair_psnr=p['psnr'],
             pair_exact=p['exact'], exact_grid=int(np.sum(p['exact'])),
             psnr_grid_mean=float(np.mean(p['psnr'])))
  if grid is not None:
    g = _grid_scores(value_grid.round_to(rows, grid), true, data_range)
    out.update(exact_grid=int(np.sum(g['exact'])), psnr_grid_mean=float(np.mean(g['psnr'])))
  return out


def _grid_scores(rows: np.ndarray, true: np.ndarray, data_range: float) -> dict:
  """PSNR and exactness of rounded rows matched to `true` (no SSIM: not reported rounded)."""
  mse = _pair_mse(rows, true)
  r, c = optimize.linear_sum_assignment(_capped_psnr(mse, data_range), maximize=True)
  err = np.abs(rows[r] - true[c]).reshape(len(r), -1)
  return dict(psnr=_capped_psnr(mse[r, c], data_range),
              exact=err.max(axis=1, initial=0.0) < EXACT)


def _psnr_summaries(scores: list[dict], counts: np.ndarray) -> dict:
  """Median PSNR over every matched pair, and mean / median per group (exact pairs, the
  rest), each with its pair count and a bootstrap over trials (the resamples `counts`)."""
  psnr = np.concatenate([s['pair_psnr'] for s in scores])
  exact = np.concatenate([s['pair_exact'] for s in scores])
  trial = np.concatenate([np.full(len(s['pair_psnr']), t) for t, s in enumerate(scores)])
  out = {'psnr_pairs': int(psnr.size)}
  groups = (('psnr', np.ones(psnr.size, bool), ('median',)),
            ('psnr_exact', exact, ('mean', 'median')),
            ('psnr_rest', ~exact, ('mean', 'median')))
  for name, keep, statistics in groups:
    if name != 'psnr':
      out[f'{name}_pairs'] = int(np.sum(keep))
    for statistic in statistics:
      field = f'{name}_{statistic}'
      values = psnr[keep]
      out[field] = float(getattr(np, statistic)(values)) if values.size else float('nan')
      out[f'{field}_ci_low'], out[f'{field}_ci_high'] = cluster_bootstrap(
          values, trial[keep], counts, statistic=statistic)
  return out


def score_trials(outcome: dict, x_pool: np.ndarray, *, n: int | None = None,
                 psnr_threshold: float = 30.0, grid: np.ndarray | None = None) -> list[dict]:
  """`trial_scores` of every trial of `outcome` (clients holding the first `n` of `index`)."""
  index = np.asarray(outcome['index'])
  index = index if n is None else index[:, :n]
  return [trial_scores(outcome['recovered'][t], outcome['valid'][t], x_pool[index[t]],
                       psnr_threshold=psnr_threshold, grid=grid)
          for t in range(index.shape[0])]


def point_metrics(outcome: dict, x_pool: np.ndarray, y_pool: np.ndarray, *, n: int | None = None,
                  rng: np.random.Generator, psnr_threshold: float = 30.0,
                  resamples: int = 1000, grid: np.ndarray | None = None,
                  scores: list[dict] | None = None) -> dict[str, float]:
  """Every trial of a point scored and summarised, each rate with its interval.

  `outcome`: `game.run`'s fields stacked over T trials, of clients holding the first `n` of
  their `index` rows (None: all). The headline rates `recovered` and `exact` are over the
  T x N examples with a 95% interval that takes the client (trial) as the unit
  (`clustered_rate`: `exact_ci_low/high`, its effective sample size `exact_effective_n`);
  Clopper-Pearson over examples, which takes them as independent, sits beside it
  (`exact_example_ci_low/high`). The per-trial means with a bootstrap over trials
  (`recovered_trial_mean`, `exact_trial_mean`, `psnr_mean`, `ssim_mean`) as before; `all_exact`
  is the rate of trials whose whole batch was recovered exactly (Clopper-Pearson over trials);
  `label_acc` the iDLG label's accuracy over the trials of one-example clients (only where
  N = 1). PSNR over the matched pairs: `psnr_median` and per group (`psnr_exact_*` for pairs
  recovered exactly, `psnr_rest_*` for the others: `_pairs`, `_mean`, `_median`), each with a
  bootstrap over trials. `ssim_mean` is Wang et al.'s SSIM, NaN with `ssim_window_fits` 0
  where the images are under 11 x 11. `exact_grid` (a rate, as `exact`) and `psnr_grid_mean`
  after rounding to the value grid `grid` (`value_grid`; None: as `exact`). `scores`: the
  trials' `score_trials`, if already computed.
  """
  from fl_privacy.eval import stats  # pylint: disable=g-import-not-at-top
  index = np.asarray(outcome['index'])
  index = index if n is None else index[:, :n]
  trials, n = index.shape
  if scores is None:
    scores = score_trials(outcome, x_pool, n=n, psnr_threshold=psnr_threshold, grid=grid)
  out: dict[str, float] = {'n_trials': trials, 'n_examples': trials * n,
                           'psnr_threshold': float(psnr_threshold)}
  for name in ('recovered', 'exact', 'exact_grid'):
    counts = np.array([s[name] for s in scores])
    out.update(rate_fields(name, counts, n))
    per_trial = counts / n
    out[f'{name}_trial_mean'] = float(np.mean(per_trial))
    lo, hi = bootstrap_mean(per_trial, rng, resamples)
    out[f'{name}_trial_mean_ci_low'], out[f'{name}_trial_mean_ci_high'] = lo, hi
  out.update(stats.rate('all_exact', sum(s['exact'] == n for s in scores), trials))
  for name in ('psnr_mean', 'ssim_mean', 'psnr_grid_mean'):
    v = np.array([s[name] for s in scores], np.float64)
    out[name] = float(np.nanmean(v)) if np.isfinite(v).any() else float('nan')
    out[f'{name}_ci_low'], out[f'{name}_ci_high'] = bootstrap_mean(v, rng, resamples)
  out['ssim_window_fits'] = float(ssim_window_fits(np.shape(x_pool)[1:]))
  if n == 1:
    correct = int(np.sum(np.asarray(outcome['label']) == np.asarray(y_pool)[index[:, 0]]))
    out.update(stats.rate('label_acc', correct, trials))
  out.update(_psnr_summaries(scores, resample_counts(trials, rng, resamples)))
  return out
