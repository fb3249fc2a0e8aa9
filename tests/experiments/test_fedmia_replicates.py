"""`pipelines.fedmia_replicates`: one point's metrics over replicated trainings, and their keys."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fl_privacy.attacks.passive import evaluate
from fl_privacy.eval import replicated
from fl_privacy.pipelines import fedmia_replicates


def _entries(rng, shift, num_clients=4, num_queries=50):
  owner = rng.integers(0, num_clients, num_queries)
  target = np.repeat(np.arange(num_clients), num_queries)
  groups = np.tile(np.arange(num_queries), num_clients)
  labels = (owner[groups] == target).astype(np.int8)
  scores = rng.normal(size=labels.size) + shift * labels
  return dict(scores=scores, labels=labels, target=target, groups=groups)


def _replicate(rng, shift, test_correct):
  e = _entries(rng, shift)
  m = evaluate.score_metrics(e['scores'], e['labels'], e['target'], e['groups'])
  m.update(test_accuracy=test_correct / 100, test_accuracy_ci_low=0.0,
           test_accuracy_ci_high=1.0, train_accuracy=float('nan'), dp_epsilon=float('inf'),
           dp_unit='client', train_seconds=2.0 * shift)
  return m, e


def test_combine_reports_the_replicated_statistics_under_the_usual_names():
  rng = np.random.default_rng(0)
  per = [_replicate(rng, s, c) for s, c in ((0.5, 80), (1.0, 90), (1.5, 85))]
  out = fedmia_replicates.combine(per, rng=np.random.default_rng(1), num_resamples=20)
  want = replicated.metrics([e for _, e in per], rng=np.random.default_rng(1),
                            num_resamples=20)
  assert out['replicates'] == 3 and out['interval_method'] == 't'
  for name in fedmia_replicates.ATTACK:
    assert out[name] == pytest.approx(want[name])
    assert (out[f'{name}_ci_low'], out[f'{name}_ci_high']) == (want[f'{name}_low'],
                                                                 want[f'{name}_high'])
    assert out[f'{name}_replicates'] == pytest.approx([m[name] for m, _ in per])
  # Counts add up over the trainings; other numbers are their mean.
  for name in ('n_pos', 'n_neg', 'n_neg_distinct'):
    assert out[name] == sum(m[name] for m, _ in per)
  assert out['log_auc'] == pytest.approx(np.mean([m['log_auc'] for m, _ in per]))
  assert out['train_seconds'] == pytest.approx(2.0)
  assert out['dp_unit'] == 'client' and out['dp_epsilon'] == float('inf')
  # Utility: the mean with the t-interval over the replicates, not one training's interval.
  assert out['test_accuracy'] == pytest.approx(0.85)
  mean, low, high = replicated.t_interval([0.8, 0.9, 0.85], bounds=(0.0, 1.0))
  assert (out['test_accuracy_ci_low'], out['test_accuracy_ci_high']) == pytest.approx(
      (low, high))
  assert out['test_accuracy_replicates'] == pytest.approx([0.8, 0.9, 0.85])
  assert np.isnan(out['train_accuracy']) and 'train_accuracy_ci_low' not in out
  # Each training's own intervals are kept beside, not reported.
  assert len(out['conditional']) == 3
  assert out['conditional'][2]['auc_ci_low'] == per[2][0]['auc_ci_low']


def test_one_replicate_keeps_its_utility_interval():
  rng = np.random.default_rng(2)
  per = [_replicate(rng, 1.0, 90)]
  out = fedmia_replicates.combine(per, rng=np.random.default_rng(3), num_resamples=20)
  assert out['replicates'] == 1
  assert out['interval_method'] == 'two_way_bootstrap_conditional'
  assert (out['test_accuracy_ci_low'], out['test_accuracy_ci_high']) == (0.0, 1.0)


def test_replicate_keys_are_fold_ins_and_differ():
  key = jax.random.key(5)
  assert jax.random.key_data(fedmia_replicates.key(key, 2)).tolist() == jax.random.key_data(
      jax.random.fold_in(key, 2)).tolist()
  assert (jax.random.key_data(fedmia_replicates.key(key, 0)).tolist() !=
          jax.random.key_data(fedmia_replicates.key(key, 1)).tolist())
