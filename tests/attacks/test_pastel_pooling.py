"""PASTEL's rows: the non-member pool (test split + unused train rows) and replicate pooling."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fl_privacy.attacks.passive import pastel


def test_unused_train_rows_join_the_nonmembers_and_ids_name_each_example():
  split = pastel.client_split(jax.random.key(0), 100, 30, 4, 1 / 3, per_client=12)
  used = np.concatenate(split['members'] + split['heldout'])
  assert len(used) == len(np.unique(used)) == 48
  assert all(len(h) == 4 and len(m) == 8 for m, h in zip(split['members'], split['heldout']))
  np.testing.assert_array_equal(split['unused'], np.setdiff1d(np.arange(100), used))
  # The pool: 30 test rows then the 52 unused train rows, shared out to the clients.
  pool = np.sort(np.concatenate(split['test_parts']))
  np.testing.assert_array_equal(pool, np.arange(30 + 52))
  rows = pastel.attack_rows(split['members'], split['test_parts'], 82, jax.random.key(1))
  ids = pastel.identities(rows, 100, 30, split['unused'])
  for target, r in rows.items():
    member = r['labels'] == 1
    np.testing.assert_array_equal(ids[target][member], r['example'][member])
    pool_rows = r['example'][~member]
    want = np.where(pool_rows < 30, 100 + pool_rows,
                    split['unused'][np.clip(pool_rows - 30, 0, 51)])
    np.testing.assert_array_equal(ids[target][~member], want)
    # No example is both a member and a non-member of one training.
    assert not set(ids[target][member]) & set(ids[target][~member])
  x_tr, y_tr = np.arange(100.0)[:, None], np.arange(100)
  x_te, y_te = -1.0 - np.arange(30.0)[:, None], -1 - np.arange(30)
  x_out, y_out = pastel.nonmember_pool(x_tr, y_tr, x_te, y_te, split['unused'])
  np.testing.assert_array_equal(y_out, np.r_[y_te, split['unused']])
  # Without per_client nothing is left over: the pool is the test split itself.
  whole = pastel.client_split(jax.random.key(0), 100, 30, 4, 0.25)
  assert len(whole['unused']) == 0
  assert pastel.nonmember_pool(x_tr, y_tr, x_te, y_te, whole['unused'])[0] is x_te


def _replica(seed, shift):
  """A fake recorded training: members' loss is lower by `shift`."""
  rng = np.random.default_rng(seed)
  split = pastel.client_split(jax.random.key(seed), 200, 60, 3, 0.2, per_client=40)
  rows = pastel.attack_rows(split['members'], split['test_parts'], 60 + 80,
                            jax.random.key(seed + 100))
  arrays = {}
  for target, r in rows.items():
    n = len(r['labels'])
    loss = rng.exponential(size=(n, 2, 1)) + shift * (r['labels'] == 0)[:, None, None]
    arrays[f'{target}/loss'] = loss.astype(np.float32)
    arrays[f'{target}/output'] = rng.normal(size=(n, 2, 3)).astype(np.float32)
  return dict(arrays=arrays, rows=rows, members=split['members'],
              ids=pastel.identities(rows, 200, 60, split['unused']))


def test_pooled_scores_are_each_replicate_in_turn_and_one_attack_model_for_all():
  reps = [_replica(0, 1.0), _replica(1, 1.0)]
  kw = dict(steps=30, learning_rate=1e-2, hidden=8)
  s, lab, ids = pastel.pooled_attack_scores(reps, 'loss_threshold', 'global',
                                            jax.random.key(0), **kw)
  parts = [pastel.attack_scores(r['arrays'], r['rows'], r['members'], 'loss_threshold',
                                'global', jax.random.key(0), **kw) for r in reps]
  np.testing.assert_array_equal(s, np.concatenate([p[0] for p in parts]))
  np.testing.assert_array_equal(lab, np.concatenate([p[1] for p in parts]))
  np.testing.assert_array_equal(
      ids, np.concatenate([r['ids']['global'][r['rows']['global']['eval']] for r in reps]))
  # The white-box attack scores the same rows: every replicate's evaluation half.
  ws, wl, wids = pastel.pooled_attack_scores(reps, 'nasr_whitebox', 'global',
                                             jax.random.key(0), **kw)
  np.testing.assert_array_equal(wl, lab)
  np.testing.assert_array_equal(wids, ids)
  assert np.all(np.isfinite(ws))
  m = pastel.attack_metrics(s, lab, ids)
  # Pooling doubles the scored rows; the distinct negatives are fewer where the replicates
  # share test rows.
  assert m['n_pos'] == m['n_neg'] == sum(len(r['rows']['global']['eval']) // 2 for r in reps)
  assert m['n_neg_distinct'] == len(np.unique(ids[lab == 0])) <= m['n_neg']
  assert m['attack_auc'] > 0.6  # members' losses are lower by 1 in every replicate


def test_auc_change_is_paired_on_the_same_rows():
  reps, ref = [_replica(0, 0.3)], [_replica(0, 1.0)]  # the same rows, a weaker signal
  kw = dict(steps=30, learning_rate=1e-2, hidden=8)
  s, lab, _ = pastel.pooled_attack_scores(reps, 'loss_threshold', 'global', jax.random.key(0),
                                          **kw)
  r, rl, _ = pastel.pooled_attack_scores(ref, 'loss_threshold', 'global', jax.random.key(0),
                                         **kw)
  m = pastel.auc_change(s, lab, r, rl)
  want = pastel.attack_metrics(s, lab)['attack_auc'] - pastel.attack_metrics(r, lab)['attack_auc']
  assert m['attack_auc_minus_none'] == pytest.approx(want, abs=1e-12)
  assert m['attack_auc_minus_none_ci_low'] < want < m['attack_auc_minus_none_ci_high'] < 0
  assert pastel.auc_change(r, rl, r, rl)['attack_auc_minus_none'] == 0.0
  with pytest.raises(ValueError, match='other rows'):
    pastel.auc_change(s, lab, r, 1 - rl)
