"""Reconstruction's first pieces: analytic and imprint recovery, PSNR / SSIM, matching."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from skimage import metrics as sk_metrics

from fl_privacy.attacks.reconstruction import analytic
from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.attacks.reconstruction import metrics
from fl_privacy.data import loading


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
