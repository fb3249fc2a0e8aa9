"""The side-channel adversary (`attacks.audit.side_channel`): what a projection cannot see."""

from __future__ import annotations

import numpy as np
import pytest

import jax

from fl_privacy import accounting
from fl_privacy import models
from fl_privacy.attacks.audit import side_channel
from fl_privacy.defenses import configured
from fl_privacy.defenses import registry
from fl_privacy.fl import optimizers
from fl_privacy.pipelines import training_audit_runs

DIM_IN, CLASSES = 6, 3
N, B = 16, 8          # the target's rows: a multiple of B, so one more adds a step if data-led
TRIALS = 400
SGD = optimizers.make('sgd', 0.5)


def _pool(rows=400, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(rows, DIM_IN)).astype(np.float32),
          rng.integers(0, CLASSES, rows).astype(np.int32))


def _model():
  model = models.MLP(hidden=(4,), num_classes=CLASSES)
  return model, model.init(jax.random.key(0), np.zeros((1, DIM_IN), np.float32))


def _dp_sgd(eps=2.0):
  setting = registry.Setting(num_classes=CLASSES, batch_size=B, num_examples=N, epochs=1,
                             rounds=1, max_examples=N + 2, num_clients=1)
  return configured.sweep_point('dp_sgd', None, setting, experiment='training_audit',
                                prefix='t', fixed={'clip_norm': 1.0, 'sampling': 'poisson'},
                                target_epsilon=eps)


def _play(hooks, adversary='server', mode='add', others=0, key=1):
  model, params = _model()
  x, y = _pool()
  return side_channel.play(model.apply, params, x, y, key=jax.random.key(key), hooks=hooks,
                           adversary=adversary, mode=mode, trials=TRIALS, num_examples=N,
                           others=others, optimizer=SGD, epochs=1, batch_size=B)


def _audit(world, scores, built, eps=2.0):
  decl = built.declaration
  z = built.metrics['noise_multiplier']
  return side_channel.audit(world, scores, 'dp_sgd_poisson', eps, delta=1e-5,
                            confidence=0.95,
                            claimed_delta=lambda g: accounting.delta_curve(decl, z, g))


def test_the_neighbours_follow_the_declaration():
  assert side_channel.neighbours('record', 'add_remove') == 'add'
  assert side_channel.neighbours('record', 'replace_one') == 'replace'
  assert side_channel.neighbours('client', 'replace_one') == 'add'
  assert side_channel.statistics('server') == ('upload_norm', 'noisy_steps',
                                               'reported_examples')
  assert side_channel.statistics('aggregate') == ('aggregate_norm',)


def test_the_public_schedule_shows_nothing_and_the_data_led_one_is_flagged():
  built = _dp_sgd()
  world, scores = _play(built.hooks)
  assert world.dtype == bool and 0.4 < world.mean() < 0.6
  # The public schedule: the same S noisy steps and the same reported count in both worlds.
  np.testing.assert_array_equal(scores['noisy_steps'], N // B)
  np.testing.assert_array_equal(scores['reported_examples'], N)
  clean = _audit(world, scores, built)
  assert clean['privacy_violation'] == 0 and clean['side_channel_family'] == 6
  # Each of the 6 (statistic, direction) audits at 1 - 0.05 / 6, each of its k tests at a
  # further k-th of that.
  k = len(clean['counted_bounds'].split(','))
  assert clean['bound_confidence'] == pytest.approx(1 - 0.05 / 6 / k)
  # The plant: rate and steps from the shard's rows; one record more adds a noisy step.
  sampler = training_audit_runs.data_dependent_batches(int(built.metrics['dp_max_batch_size']))
  world_p, planted = _play(built.hooks._replace(batches=sampler))
  np.testing.assert_array_equal(world_p, world)       # the same trials, keyed alike
  np.testing.assert_array_equal(planted['noisy_steps'], np.where(world, N // B + 1, N // B))
  flagged = _audit(world_p, planted, built)
  assert flagged['privacy_violation'] == 1 and flagged['verdict'] == 'violation'
  assert flagged['side_channel_statistic'].startswith(('noisy_steps', 'upload_norm'))
  assert flagged['side_upload_norm_in_mean'] > flagged['side_upload_norm_out_mean']


def test_reported_row_counts_are_flagged_and_the_public_count_is_not():
  built = _dp_sgd()
  world, scores = _play(built.hooks._replace(report=None))
  np.testing.assert_array_equal(scores['reported_examples'], np.where(world, N + 1, N))
  assert _audit(world, scores, built)['privacy_violation'] == 1


def test_replace_one_keeps_the_count_and_the_aggregate_reader_reads_the_aggregate():
  setting = registry.Setting(num_classes=CLASSES, batch_size=B, num_examples=N, epochs=1,
                             rounds=1, num_clients=4)
  built = configured.sweep_point('central_dp', 1.0, setting, experiment='training_audit',
                                 prefix='t', fixed={'clip_norm': 1.0})
  world, scores = _play(built.hooks, adversary='aggregate', mode='replace', others=3)
  assert set(scores) == {'aggregate_norm'}
  assert np.all(scores['aggregate_norm'] > 0)
  with pytest.raises(ValueError, match='mode must be'):
    _play(built.hooks, mode='swap')


def _gdp_profile(mu):
  from scipy import stats as sps  # pylint: disable=g-import-not-at-top
  return lambda eps: (sps.norm.cdf(-np.asarray(eps) / mu + mu / 2) -
                      np.exp(eps) * sps.norm.cdf(-np.asarray(eps) / mu - mu / 2))


def test_audit_tests_each_statistic_both_ways_at_the_family_level():
  from fl_privacy.attacks.audit import canary_statistics as cs  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  n = 600
  world = np.arange(n) % 2 == 0
  # 'up' is larger in the IN world, 'down' much smaller (the stronger, read downwards), 'flat'
  # shows nothing.
  scores = {'up': rng.normal(size=n) + 1.0 * world, 'down': rng.normal(size=n) - 3.0 * world,
            'flat': rng.normal(size=n)}
  prof = _gdp_profile(1.0)
  kw = dict(delta=1e-5, confidence=0.9, claimed_delta=prof)
  got = side_channel.audit(world, {k: v.astype(np.float32) for k, v in scores.items()},
                           'update_dp', 1.0, **kw)
  level = 1 - 0.1 / 6
  ref = {(name, sign): cs.audit(sign * np.asarray(s, np.float32).astype(np.float64), world,
                                'update_dp', 1.0, delta=1e-5, confidence=level,
                                independent=True, claimed_delta=prof, reach=True,
                                report_all=False)
         for name, s in scores.items() for sign in (1.0, -1.0)}
  for name in scores:
    assert got[f'side_{name}_best'] == pytest.approx(
        max(ref[name, 1.0]['best_bound'], ref[name, -1.0]['best_bound']), rel=1e-12)
    assert got[f'side_{name}_in_mean'] == pytest.approx(float(np.mean(
        np.float32(scores[name])[world])), rel=1e-6)
    assert got[f'side_{name}_out_mean'] == pytest.approx(float(np.mean(
        np.float32(scores[name])[~world])), rel=1e-6)
  assert got['side_channel_statistic'] == 'down (lower)'
  assert got['best_bound'] == pytest.approx(ref['down', -1.0]['best_bound'], rel=1e-12)
  assert got['bound_confidence'] == pytest.approx(ref['down', -1.0]['bound_confidence'])
  assert got['side_channel_family'] == 6 and got['verdict_confidence'] == 0.9
  assert got['privacy_violation'] == 1.0 and got['verdict'] == 'violation'
  assert got['can_refute'] == 1.0 and got['canaries_needed'] == 0
  # Read upwards only, the strongest statistic names no direction.
  up = side_channel.audit(world, {'up': scores['up']}, 'update_dp', 1.0, **kw)
  assert up['side_channel_statistic'] == 'up' and up['side_channel_family'] == 2
  # Nothing shown: no violation where the canaries could refute, 'cannot refute' where not.
  flat = side_channel.audit(world, {'flat': scores['flat']}, 'update_dp', 1.0, **kw)
  assert flat['privacy_violation'] == 0.0 and flat['verdict'] == 'no violation'
  assert flat['can_refute'] == 1.0
  few = side_channel.audit(world[:12], {'flat': scores['flat'][:12]}, 'update_dp', 8.0,
                           delta=1e-5, confidence=0.9, claimed_delta=None)
  assert few['verdict'] == 'cannot refute' and few['can_refute'] == 0.0
  assert few['canaries_needed'] > 12


def test_audit_passes_the_mechanism_to_the_counted_tests():
  from fl_privacy.attacks.audit import canary_statistics as cs  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(6)
  world = np.arange(1000) % 2 == 0
  s = rng.normal(size=1000) + 1.5 * world
  got = side_channel.audit(world, {'up': s}, 'dp_sgd_poisson', 2.0, delta=1e-5,
                           confidence=0.95, claimed_delta=None)
  want = cs.audit(s, world, 'dp_sgd_poisson', 2.0, delta=1e-5, confidence=1 - 0.05 / 2,
                  independent=True, reach=True, report_all=False)
  assert got['best_bound'] == pytest.approx(want['best_bound'], rel=1e-12)
  assert got['counted_bounds'] == want['counted_bounds'] == 'epsilon_one_run,epsilon_cp'
