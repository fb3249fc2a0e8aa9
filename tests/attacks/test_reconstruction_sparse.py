"""Issue 49's stronger server: the sparse (one-hot) imprint layer of breaching's
`SparseImprintBlock` and the rounds an adaptive server averages."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy import models
from fl_privacy.attacks.reconstruction import game
from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.attacks.reconstruction import metrics

_BINS = 16


def _batch_in_own_bins(structure_cuts, count):
  """`count` 8x8 images on the 17-level grid, each one's mean brightness inside its own bin
  (a constant image of one level per bin, levels chosen to fall in distinct bins)."""
  levels = np.arange(17) / 16.0
  bins = np.searchsorted(structure_cuts, levels, side='right') - 1
  picked, seen = [], set()
  for lv, b in zip(levels, bins):
    if b >= 0 and b not in seen:
      seen.add(b)
      picked.append(lv)
  assert len(picked) >= count
  rng = np.random.default_rng(0)
  x = np.stack([np.full((8, 8, 1), lv, np.float32) for lv in picked[:count]])
  # Texture that keeps each mean: swap values between pixel pairs (+1/16 here, -1/16 there).
  for i in range(count):
    if 0 < picked[i] < 1:
      j = rng.permutation(64)[:8]
      flat = x[i].reshape(-1)
      flat[j[:4]] += 1 / 16
      flat[j[4:]] -= 1 / 16
  return np.clip(x, 0, 1)


def _upload(sparse, x):
  """The gradient (one SGD step's direction) of the crafted model on batch `x`."""
  cuts = imprint.thresholds(np.linspace(0, 1, 200)[:, None], _BINS)
  model = imprint.inject(models.MLP(hidden=(8,), num_classes=10), _BINS)
  params = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))['params']
  params = imprint.craft(params, cuts, jax.random.key(1), sparse=sparse)
  y = jnp.arange(len(x)) % 10
  loss = lambda p: -jnp.mean(jax.nn.log_softmax(model.apply({'params': p}, x, sparse=sparse))[
      jnp.arange(len(x)), y])
  with jax.default_matmul_precision('highest'):
    return jax.jit(jax.grad(loss))(params), cuts   # jitted: one compilation, not one per op


def test_the_sparse_imprint_recovers_each_example_exactly_from_its_own_unit():
  cuts = imprint.thresholds(np.linspace(0, 1, 200)[:, None], _BINS)
  x = jnp.asarray(_batch_in_own_bins(cuts, 5))
  grads, _ = _upload(1.0, x)
  g = grads[imprint.IMPRINT]
  # One-hot: each example's gradient reaches exactly one unit (five units in all).
  assert int(np.sum(np.abs(np.asarray(g['bias'])) > 0)) == 5
  rec, valid, _ = imprint.recover_update(grads, 5, sparse=1.0)
  s = metrics.trial_scores(np.asarray(rec), np.asarray(valid), np.asarray(x))
  assert s['exact'] == 5, s
  # Read as the paper's cumulative layer (neighbours' differences), the same upload is wrong.
  rec0, valid0, _ = imprint.recover_update(grads, 5)
  assert metrics.trial_scores(np.asarray(rec0), np.asarray(valid0), np.asarray(x))['exact'] < 5
  # And the numpy reader agrees.
  rows, _ = imprint.recover(np.asarray(g['kernel']), np.asarray(g['bias']), structure='sparse')
  assert metrics.trial_scores(rows, np.ones(len(rows), bool), np.asarray(x))['exact'] == 5


def test_the_cumulative_imprint_spreads_an_example_over_every_unit_below_its_bin():
  cuts = imprint.thresholds(np.linspace(0, 1, 200)[:, None], _BINS)
  x = jnp.asarray(_batch_in_own_bins(cuts, 5))
  grads, _ = _upload(0.0, x)
  assert int(np.sum(np.abs(np.asarray(grads[imprint.IMPRINT]['bias'])) > 0)) > 5
  rec, valid, _ = imprint.recover_update(grads, 5)
  assert metrics.trial_scores(np.asarray(rec), np.asarray(valid), np.asarray(x))['exact'] == 5


def test_a_bin_of_width_zero_gets_a_unit_that_never_fires():
  model = imprint.inject(models.MLP(hidden=(8,), num_classes=10), 4)
  params = model.init(jax.random.key(0), jnp.zeros((1, 4)))['params']
  cuts = np.array([0.1, 0.5, 0.5, 0.8], np.float32)   # tied quantiles: bin 1 is empty
  out = imprint.craft(params, cuts, jax.random.key(1), sparse=1.0)
  k, b = np.asarray(out[imprint.IMPRINT]['kernel']), np.asarray(out[imprint.IMPRINT]['bias'])
  assert np.all(k[:, 1] == 0) and b[1] < 0
  # The others ramp across their own bins: slope height / width per unit of the mean.
  np.testing.assert_allclose(k[0, [0, 2, 3]] * 4, imprint.SPARSE_HEIGHT / np.array(
      [0.4, 0.3, 0.2]), rtol=1e-5)


def test_one_round_of_the_averaging_knob_is_the_single_round():
  # rounds = 1 keeps the single round's key and divides by 1: the trial of before.
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.integers(0, 17, size=(24, 8, 8, 1)) / 16.0, jnp.float32)
  y = jnp.asarray(rng.integers(0, 10, size=24), jnp.int32)
  cuts = jnp.asarray(imprint.thresholds(np.asarray(x), 8), jnp.float32)
  g = game.Game('imprint', models.MLP(hidden=(4,), num_classes=10), batch_size=2, num_bins=8)
  # One program for both knobs (traced): one compilation, not one per op.
  run = jax.jit(lambda kn: game.run(g, jax.random.key(2), x, y, cuts, jnp.int32(2), kn))
  one = run(game.knobs(32.0, 0.1, 24))
  two = run(game.knobs(32.0, 0.1, 24, rounds=2))
  np.testing.assert_array_equal(one['index'], two['index'])
  # Without a defense every round is the same upload: its mean is that upload.
  np.testing.assert_allclose(one['recovered'], two['recovered'], atol=1e-5)
  with pytest.raises(ValueError, match='rounds'):
    game.knobs(32.0, 0.1, 24, rounds=0)
