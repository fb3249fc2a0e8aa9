"""Reconstruction: analytic and imprint recovery (alone and through the client's real round),
the inversion's labels, PSNR / SSIM against scikit-image, matching, a DP defense's effect."""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from skimage import metrics as sk_metrics

from fl_privacy import defenses
from fl_privacy import models
from fl_privacy.attacks.reconstruction import analytic
from fl_privacy.attacks.reconstruction import game
from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.attacks.reconstruction import metrics
from fl_privacy.data import loading
from fl_privacy.eval import stats
from fl_privacy.fl import local


def _digits():
  train = loading.load({'name': 'digits', 'data_dir': None, 'path': None, 'attribute': None,
                        'image_size': None, 'max_examples': None})['train']
  return (np.asarray(train.x, np.float32) / 255.0).reshape(len(train), -1), train.y


def test_one_example_is_recovered_exactly_through_a_dense_layer_with_a_bias():
  x = jax.random.uniform(jax.random.key(0), (1, 12))
  layer = nn.Dense(5)
  params = layer.init(jax.random.key(1), x)
  grads = jax.grad(lambda p: jnp.sum(jnp.tanh(layer.apply(p, x)) ** 2))(params)['params']
  got = analytic.recover(grads['kernel'], grads['bias'])
  np.testing.assert_allclose(got, np.asarray(x[0]), rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match='bias gradient is 0'):
    analytic.recover(np.ones((12, 5)), np.zeros(5))
  with pytest.raises(ValueError, match=r'kernel gradient \[d, n\]'):
    analytic.recover(np.ones((12, 5)), np.zeros(4))


def test_imprint_recovers_every_example_alone_in_its_bin_after_one_sgd_step():
  x, y = _digits()
  public, batch, labels = x[200:], x[:8], y[:8]
  cuts = imprint.thresholds(public, 64)
  kernel, bias = imprint.layer(x.shape[1], cuts)
  # The crafted model gives every imprint unit the same outgoing weights (Fowl et al.,
  # Sect. 3), so dL/dh_i is one number per example for every unit it activates.
  head = np.tile(np.asarray(jax.random.normal(jax.random.key(2), (1, 10))) * 0.1,
                 (len(cuts), 1))

  def loss(p):
    h = jax.nn.relu(jnp.asarray(batch) @ p['k'] + p['b'])
    return jnp.mean(-jax.nn.log_softmax(h @ head)[jnp.arange(8), labels])

  params = {'k': jnp.asarray(kernel), 'b': jnp.asarray(bias)}
  lr = 0.1
  g = jax.grad(loss)(params)
  upload = {k: lr * v for k, v in g.items()}          # Delta = w_t - w_local, one SGD step
  got, bins = imprint.recover(upload['k'], upload['b'])
  stat = batch.mean(axis=1)
  which = np.searchsorted(cuts, stat, side='right')   # 0: below every threshold
  alone = [i for i in range(8) if which[i] > 0 and np.sum(which == which[i]) == 1]
  assert len(alone) >= 5
  rows, cols = metrics.match(got, batch)
  paired = dict(zip(cols, rows))
  for i in alone:
    assert i in paired
    assert np.max(np.abs(got[paired[i]] - batch[i])) < metrics.EXACT, i
  assert np.all(np.diff(bins) > 0)
  with pytest.raises(ValueError, match="statistic must be one of \\('mean',\\)"):
    imprint.thresholds(public, 8, statistic='variance')
  with pytest.raises(ValueError, match='num_bins must be >= 1'):
    imprint.thresholds(public, 0)


def test_psnr_and_ssim_agree_with_scikit_image():
  rng = np.random.default_rng(0)
  for shape in ((8, 8), (16, 12, 3)):
    a = rng.random(shape)
    b = np.clip(a + rng.normal(0, 0.1, shape), 0, 1)
    assert metrics.psnr(b, a) == pytest.approx(
        sk_metrics.peak_signal_noise_ratio(a, b, data_range=1.0), rel=1e-10)
    channel = -1 if len(shape) == 3 else None
    assert metrics.ssim(b, a) == pytest.approx(sk_metrics.structural_similarity(
        a, b, data_range=1.0, channel_axis=channel), rel=1e-6)
  assert metrics.psnr(a, a) == math.inf and metrics.ssim(a, a) == pytest.approx(1.0)


def test_match_picks_the_best_one_to_one_pairing():
  true = np.stack([np.zeros((8, 8)), np.ones((8, 8)), np.full((8, 8), 0.5)])
  # Recovered in another order, one of them a little off; a greedy first-come pairing of
  # recovered[0] would take true[2] (its closest), leaving recovered[2] far from its own.
  recovered = np.stack([np.full((8, 8), 0.7), np.zeros((8, 8)), np.full((8, 8), 0.9)])
  rows, cols = metrics.match(recovered, true)
  assert dict(zip(rows, cols)) == {0: 2, 1: 0, 2: 1}
  m = metrics.batch_metrics(recovered, true, psnr_threshold=30.0)
  assert m['exact_fraction'] == pytest.approx(1 / 3)
  assert m['recovered_fraction'] == pytest.approx(1 / 3)
  assert 'ssim_mean' in m


_TRIALS, _B, _BINS = 16, 8, 256


def _images():
  splits = loading.load({'name': 'digits', 'data_dir': None, 'path': None, 'attribute': None,
                         'image_size': None, 'max_examples': None})
  f = lambda d: np.asarray(d.x, np.float32) / 255.0
  return f(splits['train']), splits['train'].y, f(splits['test'])


@functools.lru_cache(maxsize=1)
def _imprint_uploads():
  """16 clients of B = 8 digits, one SGD step each on the crafted model: (x, pool indices,
  crafted params, uploads), the uploads stacked over clients."""
  x, y, public = _images()
  cuts = jnp.asarray(imprint.thresholds(public, _BINS), jnp.float32)
  g = game.Game('imprint', models.MLP(hidden=(16,), num_classes=10), batch_size=_B,
                num_bins=_BINS)
  xs, ys = jnp.asarray(x), jnp.asarray(y)

  def one(key):
    idx = jax.random.permutation(jax.random.fold_in(key, 1), xs.shape[0])[:_B]
    params = game.server_params(g, jax.random.fold_in(key, 0), xs[idx[0]], cuts)
    upload, _ = local.client_update(game.loss_fn_for(game.sent_model(g)), params, xs[idx],
                                    ys[idx], key=jax.random.fold_in(key, 2),
                                    optimizer=optax.sgd(0.1), epochs=1, batch_size=_B)
    return idx, params, upload

  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(7), i))(jnp.arange(_TRIALS))
  # One client after another (`lax.map`): on CPU it compiles about twice as fast as a vmap.
  idx, params, uploads = jax.jit(lambda ks: jax.lax.map(one, ks))(keys)
  return x, np.asarray(idx), params, uploads


def _trial(tree, t):
  return jax.tree.map(lambda a: a[t], tree)


def test_the_imprint_block_recovers_every_example_alone_in_its_bin_from_one_client_step():
  x, idx, params, uploads = _imprint_uploads()
  checked = 0
  for t in range(_TRIALS):
    batch = x[idx[t]].reshape(_B, -1)
    layer = {k: np.asarray(v[t]) for k, v in params[imprint.IMPRINT].items()}
    # The bin is what the crafted units compute: the number of units an example activates.
    # An example within float rounding of a unit's threshold could fall on either side in the
    # jitted forward pass; `imprint.thresholds` keeps every threshold half a grid step from
    # the digits' means, so every unit decides every example beyond 4x the float32 error bound
    # of its pre-activation (d eps (|x| . |k| + |b|)). The check stays general: the claim is
    # made for decided examples alone in their bin with no undecided neighbour.
    pre = batch @ layer['kernel'] + layer['bias']
    err = batch.shape[1] * np.finfo(np.float32).eps * (
        np.abs(batch) @ np.abs(layer['kernel']) + np.abs(layer['bias']))
    active = np.sum(pre > 0, axis=1)
    decided = np.all(np.abs(pre) > 4 * err, axis=1)
    assert decided.all(), (t, np.flatnonzero(~decided))
    up = {k: np.asarray(v[t]) for k, v in uploads[imprint.IMPRINT].items()}
    got, _ = imprint.recover(up['kernel'], up['bias'])
    alone = [i for i in range(_B) if active[i] > 0 and decided[i] and
             np.sum(active == active[i]) == 1 and
             not np.any(~decided & (np.abs(active - active[i]) <= 1))]
    checked += len(alone)
    rows, cols = metrics.match(got, batch)
    paired = dict(zip(cols, rows))
    for i in alone:
      assert np.max(np.abs(got[paired[i]] - batch[i])) < metrics.EXACT, (t, i)
  assert checked >= _TRIALS * _B // 2


def test_imprint_thresholds_sit_between_distinct_public_values_with_their_shares():
  rng = np.random.default_rng(0)
  # Means on a grid of 1/1024 with ties (digits-like), and a continuous statistic.
  grid = rng.integers(0, 300, size=(500, 1)).astype(np.float64) / 1024
  for public in (grid, rng.normal(size=(500, 3))):
    s = public.mean(axis=1)
    values = np.unique(s)
    step = np.min(np.diff(values))
    for n in (1, 7, 64):
      t = imprint.thresholds(public, n)
      q = np.quantile(s, np.arange(n) / n)
      assert t.shape == (n,) and np.all(np.diff(t) >= 0)
      # Half the smallest gap below a distinct public value: never within rounding of one.
      dist = np.min(np.abs(s[:, None] - t[None, :]), axis=0)
      np.testing.assert_allclose(dist, step / 2, rtol=1e-9)
      # The same public values on each side as the quantile's (its share of the data).
      np.testing.assert_array_equal((s[:, None] >= t).sum(0), (s[:, None] >= q).sum(0))
  assert np.min(np.abs(np.arange(0, 300)[:, None] / 1024 - imprint.thresholds(grid, 64))) == (
      pytest.approx(1 / 2048))
  # Three values, a third each: quantiles 0, 0, 1, 2 go below their values; two share a gap.
  three = np.repeat([0.0, 1.0, 2.0], 10)[:, None]
  np.testing.assert_allclose(imprint.thresholds(three, 4), [-0.5, -0.5, 0.5, 1.5])
  # Values 1e-5 apart are one value on a scale of 255 (1e-6 relative), not on a scale of 1.
  noisy = (np.repeat(np.arange(40.0), 3) + np.tile([0.0, 1e-5, 2e-5], 40))[:, None]
  t = imprint.thresholds(noisy, 8)
  assert np.min(np.abs(noisy - t[None, :])) > 0.49   # half the gap between merged values


def test_imprint_recovers_at_least_90_percent_of_8_examples_exactly_in_one_step():
  x, idx, _, uploads = _imprint_uploads()
  recovered, valid, _ = jax.vmap(lambda u: imprint.recover_update(u, _B))(uploads)
  out = dict(index=idx, recovered=np.asarray(recovered), valid=np.asarray(valid),
             label=np.zeros(_TRIALS, np.int32))
  m = metrics.point_metrics(out, x, np.zeros(len(x), np.int32), rng=np.random.default_rng(0),
                            resamples=200)
  # The claim is the point estimate over 128 examples; the interval excludes a collapse. Misses
  # are examples sharing a bin with another of their client's, which keep it from 100%.
  assert m['exact'] >= 0.9 and m['exact_ci_low'] >= 0.8, m
  assert m['n_examples'] == _TRIALS * _B


def test_recovery_degrades_monotonically_in_update_dp_noise():
  x, idx, _, uploads = _imprint_uploads()
  rates = []
  for z in (0.0, 3e-7, 1e-6, 1e-5):
    hook = defenses.make('update_dp', clip_norm=1.0, noise_multiplier=z).upload
    keys = jax.random.split(jax.random.key(3), _TRIALS)
    rec, valid, _ = jax.jit(lambda ks, us: jax.lax.map(
        lambda a: imprint.recover_update(hook(a[0], a[1], None), _B), (ks, us)))(keys, uploads)
    # Above 30 dB PSNR rather than exact: exactness goes at the first noise, PSNR by degrees.
    k = sum(metrics.trial_scores(np.asarray(rec[t]), np.asarray(valid[t]),
                                 x[idx[t]])['recovered'] for t in range(_TRIALS))
    rates.append(stats.clopper_pearson(k, _TRIALS * _B) + (k / (_TRIALS * _B),))
  for (lo, _, _), (_, hi, _) in zip(rates[1:], rates[:-1]):
    assert lo <= hi, rates     # never significantly better with more noise
  assert rates[-1][1] < rates[0][0], rates    # and the strongest noise destroys recovery


def test_analytic_recovery_through_the_client_round_is_exact_over_several_epochs():
  x, y, _ = _images()
  g = game.Game('analytic', models.MLP(hidden=(16,), num_classes=10), batch_size=1, epochs=3)
  out = jax.jit(lambda k: game.run(g, k, jnp.asarray(x), jnp.asarray(y), jnp.zeros(1),
                                   jnp.int32(1)))(jax.random.key(0))
  true = x[int(out['index'][0])].reshape(-1)
  assert bool(out['valid'][0])
  np.testing.assert_allclose(np.asarray(out['recovered'][0]), true, atol=1e-4)
  assert int(out['label']) == int(y[int(out['index'][0])])   # iDLG
