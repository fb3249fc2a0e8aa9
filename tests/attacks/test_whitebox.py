"""Nasr et al. white-box attack: features are what they claim, halves are balanced, it learns."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from fl_privacy import models
from fl_privacy.attacks.passive import whitebox
from fl_privacy.fl import losses


def test_features_match_direct_computation():
  model = models.MLP(hidden=(8,), num_classes=4)
  key = jax.random.key(0)
  x = jax.random.normal(key, (5, 6))
  y = jnp.array([0, 1, 2, 3, 1])
  v = model.init(jax.random.fold_in(key, 1), x[:1])
  assert whitebox.last_layer_name(v) == 'fc2'
  fn = whitebox.make_feature_fn(model.apply, last_layer='fc2')
  f = whitebox.features(fn, v, np.asarray(x), np.asarray(y), chunk_size=2)
  assert f['output'].shape == (5, 4) and f['label'].shape == (5, 4)
  assert f['grad_norms'].shape == (5, 4) and f['last_layer_grad'].shape == (5, 8 * 4 + 4)
  for i in range(5):
    loss_fn = lambda p: losses.cross_entropy(model.apply(p, x[i:i + 1]), y[i:i + 1])
    g = jax.grad(loss_fn)(v)
    np.testing.assert_allclose(f['loss'][i, 0], loss_fn(v), rtol=1e-5)
    norms = [np.linalg.norm(np.asarray(leaf)) for leaf in jax.tree_util.tree_leaves(g)]
    np.testing.assert_allclose(f['grad_norms'][i], norms, rtol=1e-4)
    last = np.concatenate([np.asarray(g['params']['fc2']['bias']).ravel(),
                           np.asarray(g['params']['fc2']['kernel']).ravel()])
    np.testing.assert_allclose(f['last_layer_grad'][i], last, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(f['label'][i], np.eye(4)[int(y[i])])


def test_balanced_halves_are_disjoint_and_balanced():
  rng = np.random.default_rng(0)
  tp, tn, ep, en = whitebox.balanced_halves(rng, 50, 31)
  assert len(tp) == len(tn) == 15 and len(ep) == len(en) == 16
  assert not set(tp) & set(ep) and not set(tn) & set(en)
  assert max(np.r_[tp, ep]) < 50 and max(np.r_[tn, en]) < 31


def _synthetic(rng, n, signal):
  labels = np.r_[np.ones(n), np.zeros(n)]
  loss = rng.exponential(1.0, 2 * n) * np.where(labels == 1, 1.0 - signal, 1.0)
  feats = {'loss': loss[:, None, None], 'grad_norms': rng.normal(size=(2 * n, 2, 3)),
           'output': rng.dirichlet(np.ones(4), 2 * n)[:, None, :]}
  return feats, labels


def test_attack_learns_a_signal_and_not_noise():
  rng = np.random.default_rng(1)
  # Bayes AUC with signal 0.8: P[Exp(5) < Exp(1)] = 5 / 6; ten noise features cost ~0.08
  # (the attack MLP overfits 300 rows a little), so 0.7 is a loose floor.
  for signal, check in ((0.8, lambda auc: auc > 0.7), (0.0, lambda auc: abs(auc - 0.5) < 0.1)):
    feats, labels = _synthetic(rng, 300, signal)
    order = rng.permutation(600)
    tr, ev = order[:300], order[300:]
    scores = whitebox.train_and_score(jax.random.key(0), {k: v[tr] for k, v in feats.items()},
                                      labels[tr], {k: v[ev] for k, v in feats.items()},
                                      steps=300, learning_rate=3e-3)
    assert check(roc_auc_score(labels[ev], scores)), signal
  # The loss threshold reads the last snapshot's loss.
  f = {'loss': np.array([[[3.0], [1.0]], [[0.0], [2.0]]])}
  np.testing.assert_array_equal(whitebox.loss_scores(f), [-1.0, -2.0])


def test_last_layer_is_the_last_dense_of_three():
  model = models.MLP(hidden=(8, 5), num_classes=3)
  v = model.init(jax.random.key(2), jnp.zeros((1, 4)))
  assert list(v['params']) == ['fc1', 'fc2', 'fc3']
  assert whitebox.last_layer_name(v) == 'fc3'
  with pytest.raises(ValueError, match='no Dense layer'):
    whitebox.last_layer_name({'params': {'norm': {'scale': jnp.ones(3)}}})


def test_one_example_and_two_of_each_class_are_enough():
  model = models.MLP(hidden=(4,), num_classes=2)
  v = model.init(jax.random.key(3), jnp.zeros((1, 3)))
  fn = whitebox.make_feature_fn(model.apply)
  f = whitebox.features(fn, v, np.ones((1, 3), np.float32), np.array([1]))
  assert f['loss'].shape == (1, 1) and f['output'].dtype == np.float32
  tp, tn, ep, en = whitebox.balanced_halves(np.random.default_rng(0), 2, 2)
  assert (len(tp), len(tn), len(ep), len(en)) == (1, 1, 1, 1)


def test_standardise_by_hand():
  standardise = whitebox._standardise  # pylint: disable=protected-access
  train = np.array([[1.0, 5.0, 2.0], [3.0, 5.0, 4.0], [5.0, 5.0, 9.0]])
  other = np.array([[2.0, 6.0, 0.0]])
  a, b = standardise(train, other)
  mean, std = train.mean(0), train.std(0)
  std[1] = 1.0  # a constant column is only centred
  np.testing.assert_allclose(a, (train - mean) / std)
  np.testing.assert_allclose(b, [[(2 - 3) / std[0], 1.0, (0 - 5) / std[2]]])
  # A spread above 1e-6 is scaled; one of exactly 1e-6 is only centred.
  np.testing.assert_allclose(standardise(np.array([[0.0], [4e-6]]), np.zeros((1, 1)))[0],
                             [[-1.0], [1.0]])
  np.testing.assert_allclose(standardise(np.array([[0.0], [2e-6]]), np.zeros((1, 1)))[0],
                             [[-1e-6], [1e-6]], rtol=1e-6)


def test_loss_scores_read_the_last_snapshot():
  feats = {'loss': np.array([[[0.1], [0.5], [0.9]], [[0.2], [0.3], [0.4]]])}
  np.testing.assert_allclose(whitebox.loss_scores(feats), [-0.9, -0.4])
