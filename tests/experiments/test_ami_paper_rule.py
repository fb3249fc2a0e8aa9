"""The AMI defaults are the paper's attack; the calibrated bias is an extension beside it.

Also: the certificate's non-target samples come from the game pool, which crafting and
calibration never see (Hoeffding needs samples independent of the crafted neuron).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import digits
from fl_privacy.attacks import ami
from fl_privacy.pipelines import ami as pipeline


@pytest.fixture(scope='module')
def smoke():
  config = digits.get_config('smoke')
  return config, pipeline.prepare(config)


def test_defaults_are_the_papers_rule_with_the_variant_beside_it():
  section = digits.get_config().ami
  assert section.calibrated_variant is True and 'calibrate' not in section
  assert section.certified_samples == 0


def test_calibration_never_touches_the_papers_neurons(smoke):
  config, state = smoke
  d = state['pool_x'].shape[1]
  randomize = ami.mechanism_fn('bitrand', 4.0, d, state['encoding'])
  key = jax.random.key(5)
  with_variant = ami.point.craft_targets(key, pipeline.settings(config), state, randomize,
                                         True)
  config_off = digits.get_config('smoke')
  config_off.ami.calibrated_variant = False
  without = ami.point.craft_targets(key, pipeline.settings(config_off), state, randomize,
                                    True)
  paper, _, calibrated, predicted = with_variant
  paper_off, _, calibrated_off, predicted_off = without
  assert calibrated_off is None and np.all(np.isnan(np.asarray(predicted_off)))
  for a, b in zip(jax.tree.leaves(paper), jax.tree.leaves(paper_off)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The variant moves only the decision threshold: same W, b, h up to the power-of-two rescale.
  assert not np.allclose(np.asarray(paper.c), np.asarray(calibrated.c))
  assert np.all(np.isfinite(np.asarray(predicted)))


def test_calibrated_metrics_are_suffixed_with_intervals():
  out = {'decision': np.array([1, 0, 1, 1, 0, 0]), 'b': np.array([1, 0, 1, 0, 1, 0]),
         'score': np.array([3.0, -1.0, 2.0, 0.5, -0.5, -2.0])}
  m = ami.game.calibrated_metrics(out)
  for name in ('adv', 'tpr', 'tnr', 'fpr', 'fnr'):
    assert m[f'{name}_calibrated_ci_low'] <= m[f'{name}_calibrated'] <= m[
        f'{name}_calibrated_ci_high']
  assert m['adv_calibrated'] == pytest.approx((2 / 3 + 2 / 3) / 2)
  assert 'adv' not in m and 'auc_calibrated' in m


def test_certificate_samples_come_from_the_pool(smoke):
  config, state = smoke
  n_pool = len(state['pool_x'])
  assert np.array_equal(
      ami.point.certified_rows(jax.random.key(0), pipeline.settings(config), n_pool),
      np.arange(n_pool))
  config = digits.get_config('smoke')
  config.ami.certified_samples = 50
  rows = ami.point.certified_rows(jax.random.key(0), pipeline.settings(config), n_pool)
  assert len(rows) == 50 == len(np.unique(rows)) and rows.max() < n_pool
  # Disjoint from what crafting and calibration use: the pool and the adversary's rows differ.
  pool = {r.tobytes() for r in np.asarray(state['pool_x'])[rows]}
  seen = {r.tobytes() for r in np.concatenate([state['crafting_x'], state['heldout_x']])}
  assert len(pool & seen) <= len(pool) // 10  # digits has a few identical images across roles
