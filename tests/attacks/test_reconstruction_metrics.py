"""Reconstruction metrics: Wang et al.'s SSIM, PSNR medians and groups, client-level intervals."""

import math

import numpy as np
import pytest
from skimage import metrics as sk_metrics

from fl_privacy.attacks.reconstruction import metrics
from fl_privacy.eval import stats


def _wang_direct(x, y, data_range=1.0):
  """Eqs. (13)-(17) of Wang et al. (2004) with an explicit 11 x 11 Gaussian window (sigma 1.5,
  unit sum) at every position where it fits: no filtering library involved."""
  k = np.arange(-5, 6)
  g = np.exp(-k ** 2 / (2 * 1.5 ** 2))
  w = np.outer(g, g) / np.outer(g, g).sum()
  c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
  out = []
  for i in range(x.shape[0] - 10):
    for j in range(x.shape[1] - 10):
      a, b = x[i:i + 11, j:j + 11], y[i:i + 11, j:j + 11]
      ua, ub = np.sum(w * a), np.sum(w * b)
      va, vb = np.sum(w * (a - ua) ** 2), np.sum(w * (b - ub) ** 2)
      cov = np.sum(w * (a - ua) * (b - ub))
      out.append((2 * ua * ub + c1) * (2 * cov + c2) / ((ua ** 2 + ub ** 2 + c1) * (va + vb + c2)))
  return float(np.mean(out))


def test_gaussian_ssim_is_wang_et_al_s_and_scikit_image_s():
  rng = np.random.default_rng(0)
  for shape in ((16, 16), (32, 24), (12, 11, 3)):
    a = rng.random(shape)
    b = np.clip(a + rng.normal(0, 0.1, shape), 0, 1)
    channel = -1 if len(shape) == 3 else None
    got = metrics.ssim_gaussian(b, a)
    assert got == pytest.approx(sk_metrics.structural_similarity(
        a, b, data_range=1.0, channel_axis=channel, gaussian_weights=True, sigma=1.5,
        use_sample_covariance=False), rel=1e-9)
    direct = (np.mean([_wang_direct(b[..., c], a[..., c]) for c in range(3)])
              if channel else _wang_direct(b, a))
    assert got == pytest.approx(direct, rel=1e-9)
  assert metrics.ssim_gaussian(a, a) == pytest.approx(1.0)
  # Another data range (K1, K2 scale with it), colour, float32 inputs read in float64.
  two = 2 * rng.random((13, 12, 3))
  noisy = np.clip(two + rng.normal(0, 0.2, two.shape), 0, 2)
  want = sk_metrics.structural_similarity(two, noisy, data_range=2.0, channel_axis=-1,
                                          gaussian_weights=True, sigma=1.5,
                                          use_sample_covariance=False)
  assert metrics.ssim_gaussian(noisy, two, 2.0) == pytest.approx(want, rel=1e-9)
  assert metrics.ssim_gaussian(noisy[..., 0], two[..., 0], 2.0) == pytest.approx(
      _wang_direct(noisy[..., 0], two[..., 0], 2.0), rel=1e-9)
  low, high = two[..., 0].astype(np.float32), noisy[..., 0].astype(np.float32)
  assert metrics.ssim_gaussian(high, low, 2.0) == pytest.approx(
      metrics.ssim_gaussian(high.astype(np.float64), low.astype(np.float64), 2.0), rel=1e-13)
  assert metrics.ssim_gaussian(high.astype(np.float64), low, 2.0) == pytest.approx(
      metrics.ssim_gaussian(high.astype(np.float64), low.astype(np.float64), 2.0), rel=1e-13)
  with pytest.raises(ValueError, match='shapes differ'):
    metrics.ssim_gaussian(two, noisy[:12])


def test_uniform_ssim_and_psnr_are_scikit_image_s_defaults():
  # The uniform 7x7 SSIM is kept for comparison with earlier runs; the metrics report Wang's.
  rng = np.random.default_rng(7)
  for shape in ((8, 8), (9, 13, 2)):
    a = rng.random(shape)
    b = np.clip(a + rng.normal(0, 0.1, shape), 0, 1)
    channel = -1 if len(shape) == 3 else None
    assert metrics.ssim(b, a) == pytest.approx(sk_metrics.structural_similarity(
        a, b, data_range=1.0, channel_axis=channel), rel=1e-9)
    assert metrics.psnr(b, a, 2.0) == pytest.approx(
        sk_metrics.peak_signal_noise_ratio(a, b, data_range=2.0), rel=1e-12)
  assert metrics.ssim(b, a, win_size=3) == pytest.approx(sk_metrics.structural_similarity(
      a, b, data_range=1.0, channel_axis=-1, win_size=3), rel=1e-9)
  assert metrics.psnr(a, a) == math.inf
  for bad in ((np.zeros((6, 6)), np.zeros((6, 6))), (np.zeros((8, 8)), np.zeros((8, 9)))):
    with pytest.raises(ValueError):
      metrics.ssim(*bad)
  with pytest.raises(ValueError, match='shapes differ'):
    metrics.psnr(np.zeros(3), np.zeros(4))


def test_gaussian_ssim_refuses_images_its_window_does_not_fit():
  assert metrics.ssim_window_fits((11, 11)) and metrics.ssim_window_fits((11, 40, 3))
  assert not metrics.ssim_window_fits((10, 11)) and not metrics.ssim_window_fits((8, 8, 1))
  with pytest.raises(ValueError, match='both sides >= 11'):
    metrics.ssim_gaussian(np.zeros((8, 8)), np.zeros((8, 8)))
  # 8x8 digits: NaN and a flag that says why, never a number from a window that does not fit.
  rng = np.random.default_rng(1)
  true = rng.random((3, 8, 8))
  m = metrics.batch_metrics(true + 0.01, true)
  assert math.isnan(m['ssim_mean']) and m['ssim_window_fits'] == 0.0
  big = rng.random((3, 16, 16))
  m = metrics.batch_metrics(big, big)
  assert m['ssim_mean'] == pytest.approx(1.0) and m['ssim_window_fits'] == 1.0


def test_pair_scores_are_the_matched_pairs_psnr_and_exactness():
  rng = np.random.default_rng(2)
  true = rng.random((4, 8, 8))
  recovered = np.stack([true[2] + 0.5 / 255, true[0] + rng.normal(0, 0.05, (8, 8)),
                        true[3], true[1] + 2.0 / 255])
  p = metrics.pair_scores(recovered, true)
  rows, cols = metrics.match(recovered, true)
  assert list(cols) == [2, 0, 3, 1]
  with np.errstate(divide='ignore'):   # scikit-image's PSNR of the exact copy: inf
    want = [min(sk_metrics.peak_signal_noise_ratio(true[j], recovered[i], data_range=1.0), 200)
            for i, j in zip(rows, cols)]
  np.testing.assert_allclose(p['psnr'], want, rtol=1e-12)
  # 0.5/255 and a copy are exact; 2/255 and the noisy one are not (away from the 1/255 edge).
  np.testing.assert_array_equal(p['exact'], [True, False, True, False])
  assert np.all(np.isnan(p['ssim']))


def test_clustered_rate_degenerate_and_independent_cases():
  # Every client fully exact: Clopper-Pearson over the clients, not over their examples.
  assert metrics.clustered_rate([8] * 32, 8) == pytest.approx(
      (1.0,) + stats.clopper_pearson(32, 32) + (32.0,))
  assert metrics.clustered_rate([0] * 32, 8)[1:3] == pytest.approx(stats.clopper_pearson(0, 32))
  # Clusters of one example are independent examples: close to Clopper-Pearson over them.
  k = np.r_[np.ones(200), np.zeros(56)]
  rate, lo, hi, n_eff = metrics.clustered_rate(k, 1)
  assert rate == 200 / 256 and n_eff == pytest.approx(255.0)
  np.testing.assert_allclose((lo, hi), stats.clopper_pearson(200, 256), atol=2e-3)
  # Unequal client sizes: the pooled rate, not the mean of the clients' rates.
  assert metrics.clustered_rate([1, 4], [2, 4])[0] == pytest.approx(5 / 6)
  assert metrics.clustered_rate([1], 2) == (0.5, 0.0, 1.0, 0.0)
  _, lo, hi, n_eff = metrics.clustered_rate([2, 6], 8)   # two clients: wide, but estimated
  assert 0 < lo < 0.5 < hi <= 1 and 0 < n_eff < 1
  assert metrics.clustered_rate([], 8)[1:] == (0.0, 1.0, 0.0)   # no client: nothing known
  assert math.isnan(metrics.clustered_rate([], 8)[0])
  for k, m in (([3], 2), ([-1], 2), ([0], 0), ([[1]], 2)):
    with pytest.raises(ValueError, match='^successes must be a 1-D array with 0 <= succ'):
      metrics.clustered_rate(k, m)


def test_clustered_rate_is_korn_graubard_as_r_survey_computes_it():
  """R survey's svyciprop(method='beta') for a one-stage cluster sample drawn with replacement
  (svydesign(ids=~client)): n.eff = p(1-p)/vcov, times (qt(a/2, N-1)/qt(a/2, T-1))^2, capped
  at N (the NCHS cap), then qbeta(a/2, n.eff p, n.eff (1-p) + 1) and its upper twin."""
  from scipy import stats as sp_stats  # pylint: disable=g-import-not-at-top
  k = np.array([8, 8, 6, 7, 8, 3, 8, 8])
  m = np.array([8, 8, 8, 8, 8, 4, 8, 8])
  t, n = len(k), m.sum()
  p = k.sum() / n
  # svymean of the 0/1 outcome: the ratio estimator's linearised variance between clusters.
  resid = (k - p * m) / n
  vcov = t / (t - 1) * np.sum(resid ** 2)
  n_eff = min(n, p * (1 - p) / vcov * (sp_stats.t.ppf(0.025, n - 1)
                                        / sp_stats.t.ppf(0.025, t - 1)) ** 2)
  want = (sp_stats.beta.ppf(0.025, n_eff * p, n_eff * (1 - p) + 1),
          sp_stats.beta.ppf(0.975, n_eff * p + 1, n_eff * (1 - p)))
  rate, lo, hi, got_n = metrics.clustered_rate(k, m)
  assert rate == pytest.approx(p) and got_n == pytest.approx(n_eff)
  assert (lo, hi) == pytest.approx(want, rel=1e-12)
  assert metrics.clustered_rate(k, m, confidence=0.5)[2] < hi   # a narrower interval at 50%
  # No spread between clients at an interior rate: as many as the examples, no fewer.
  assert metrics.clustered_rate([6, 6, 6], 8)[3] == 24.0


def _coverage(draw, truth, trials, n, sims=400):
  rng = np.random.default_rng(0)
  clustered = example = 0
  for _ in range(sims):
    k = draw(rng, trials, n)
    _, lo, hi, _ = metrics.clustered_rate(k, n)
    clustered += lo <= truth <= hi
    lo, hi = stats.clopper_pearson(int(k.sum()), trials * n)
    example += lo <= truth <= hi
  return clustered / sims, example / sims


def test_client_level_interval_covers_clustered_outcomes():
  sims = 400
  floor = 0.95 - 3 * math.sqrt(0.95 * 0.05 / sims)   # three Monte-Carlo standard errors

  def noised(rng, trials, n):   # a client's upload destroyed (all its examples lost) w.p. 0.3
    return np.where(rng.random(trials) < 0.3, 0, rng.binomial(n, 0.9, trials))

  def collisions(rng, trials, n, bins=64):   # exact iff alone in its bin among the client's n
    b = rng.integers(0, bins, (trials, n))
    return ((b[:, :, None] == b[:, None, :]).sum(-1) == 1).sum(1)

  clustered, example = _coverage(noised, 0.7 * 0.9, 32, 8, sims)
  assert clustered >= floor and example < floor, (clustered, example)
  clustered, _ = _coverage(collisions, (63 / 64) ** 7, 32, 8, sims)
  assert clustered >= floor, clustered
  clustered, _ = _coverage(lambda rng, t, n: rng.binomial(n, 0.99, t), 0.99, 32, 8, sims)
  assert clustered >= floor, clustered


def test_cluster_bootstrap_pools_whole_trials():
  rng = np.random.default_rng(3)
  counts = metrics.resample_counts(7, rng, 300)
  assert counts.shape == (300, 7) and np.all(counts.sum(1) == 7)
  assert metrics.resample_counts(3, rng).shape == (1000, 3)   # the default: 1,000 resamples
  # Every cluster is drawn alike: each holds 1/7 of the draws (binomial sd 0.0076).
  np.testing.assert_allclose(counts.sum(0) / counts.sum(), 1 / 7, atol=0.03)
  for size, ties in ((23, False), (500, False), (300, True)):
    v = rng.normal(20, 5, size)
    v = np.round(v) if ties else v            # ties across blocks and clusters
    g = np.sort(rng.integers(0, 6, size))     # cluster 6 holds no value
    pools = [np.repeat(v, c[g]) for c in counts]
    want = [np.median(p) if p.size else np.nan for p in pools]
    np.testing.assert_allclose(metrics._weighted_medians(v, g, counts), want, rtol=1e-12)
    for statistic, fn in (('mean', np.mean), ('median', np.median)):
      s = np.array([fn(p) for p in pools if p.size])
      assert metrics.cluster_bootstrap(v, g, counts, statistic=statistic) == pytest.approx(
          tuple(np.quantile(s, [0.025, 0.975])), rel=1e-12)
  # Edge rows: nothing drawn (NaN), one value drawn, the largest value the median.
  v, g = np.array([1.0, 2.0, 3.0, 4.0, 5.0]), np.array([0, 1, 2, 3, 4])
  edge = np.array([[0, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 3], [1, 0, 0, 0, 2]])
  np.testing.assert_array_equal(metrics._weighted_medians(v, g, edge), [np.nan, 3.0, 5.0, 5.0])
  assert all(math.isnan(b) for b in metrics.cluster_bootstrap([], [], counts, statistic='mean'))
  # Values only in client 0: resamples that miss it are dropped, without a 0/0 warning; one
  # resample left gives its own value twice; none left gives NaN.
  import warnings  # pylint: disable=g-import-not-at-top
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    for statistic in ('mean', 'median'):
      one = metrics.cluster_bootstrap([3.0, 5.0], [0, 0], [[0, 2], [1, 1], [0, 2]],
                                      statistic=statistic)
      assert one == (4.0, 4.0)
      assert all(math.isnan(b) for b in metrics.cluster_bootstrap(
          [3.0, 5.0], [0, 0], [[0, 2], [0, 2]], statistic=statistic))
  # float32 values are averaged in float64 (the median of two middle values too).
  v32 = np.float32([0.1, 0.8132702, 0.91275555, 0.99])   # a float32 mean of the middle two rounds
  got = metrics.cluster_bootstrap(v32, [0, 1, 2, 3], [[1, 1, 1, 1]], statistic='median')
  assert got[0] == (float(v32[1]) + float(v32[2])) / 2 != float((v32[1] + v32[2]) / 2)
  with pytest.raises(ValueError, match="'mean' or 'median'"):
    metrics.cluster_bootstrap(v, g, counts, statistic='mode')


def test_point_metrics_reports_client_level_rates_medians_and_groups():
  rng = np.random.default_rng(5)
  x = rng.random((40, 8, 8))
  index = np.arange(24).reshape(6, 4)
  # Trials 0-3 recover everything exactly; trial 4 half exactly, half as 20 dB mixtures;
  # trial 5 nothing valid.
  recovered = x[index].reshape(6, 4, 64).copy()
  recovered[4, 2:] += 0.1
  valid = np.ones((6, 4), bool)
  valid[5] = False
  out = dict(index=index, recovered=recovered, valid=valid, label=np.zeros(6, np.int32))
  m = metrics.point_metrics(out, x, np.zeros(40, np.int32), rng=np.random.default_rng(0),
                            resamples=200)
  exact = np.array([4, 4, 4, 4, 2, 0])
  rate, lo, hi, n_eff = metrics.clustered_rate(exact, 4)
  assert (m['exact'], m['exact_ci_low'], m['exact_ci_high'], m['exact_effective_n']) == (
      pytest.approx(18 / 24), lo, hi, n_eff)
  assert (m['exact_example_ci_low'], m['exact_example_ci_high']) == stats.clopper_pearson(18, 24)
  assert m['exact_ci_high'] - m['exact_ci_low'] > (m['exact_example_ci_high']
                                                   - m['exact_example_ci_low'])
  assert m['recovered'] == pytest.approx(18 / 24) and m['all_exact'] == pytest.approx(4 / 6)
  # 18 exact pairs at 200 dB, 2 mixtures at 20 dB: the mean would say 164 dB, the median 200.
  assert (m['psnr_pairs'], m['psnr_exact_pairs'], m['psnr_rest_pairs']) == (20, 18, 2)
  assert m['psnr_median'] == 200.0 and m['psnr_exact_median'] == 200.0
  assert m['psnr_rest_mean'] == pytest.approx(20.0) and m['psnr_rest_median'] == pytest.approx(20)
  assert m['psnr_rest_mean_ci_low'] == pytest.approx(20.0)   # one trial holds both mixtures
  assert m['psnr_median_ci_low'] <= m['psnr_median'] <= m['psnr_median_ci_high']
  assert math.isnan(m['ssim_mean']) and m['ssim_window_fits'] == 0.0


def test_table_shows_client_level_and_example_intervals_medians_and_ssim_not_applicable():
  import ml_collections  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import reconstruction_figures  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(6)
  x = rng.random((8, 8, 8))
  recovered = x[:8].reshape(2, 4, 64).copy()
  recovered[1, 3] += 0.1
  out = dict(index=np.arange(8).reshape(2, 4), recovered=recovered, valid=np.ones((2, 4), bool),
             label=np.zeros(2, np.int32))
  m = metrics.point_metrics(out, x, np.zeros(8, np.int32), rng=rng, resamples=50)
  config = ml_collections.ConfigDict({'reconstruction': {'psnr_threshold': 30.0}})
  params = dict(kind='attack', attack='imprint', batch_size=4, num_batches=1, epochs=1)
  lines = reconstruction_figures.table_markdown(config, [dict(params=params, metrics=m)]).split(
      '\n')
  header = next(line for line in lines if line.startswith('| attack'))
  cells = dict(zip([c.strip() for c in header.split('|')[1:-1]],
                   [c.strip() for c in lines[lines.index(header) + 2].split('|')[1:-1]]))
  assert cells['exact'] == f'0.875 [{m["exact_ci_low"]:.3f}, {m["exact_ci_high"]:.3f}]'
  assert cells['exact, CP examples'] == '[{:.3f}, {:.3f}]'.format(*stats.clopper_pearson(7, 8))
  assert cells['PSNR median, not exact (pairs)'] == '20.0 [20.0, 20.0] (1)'
  assert cells['SSIM'] == 'n/a (< 11x11)'
