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
  s, lab, ids, which, attacked = pastel.pooled_attack_scores(reps, 'loss_threshold', 'global',
                                                              jax.random.key(0), **kw)
  parts = [pastel.attack_scores(r['arrays'], r['rows'], r['members'], 'loss_threshold',
                                'global', jax.random.key(0), **kw) for r in reps]
  np.testing.assert_array_equal(s, np.concatenate([p[0] for p in parts]))
  np.testing.assert_array_equal(lab, np.concatenate([p[1] for p in parts]))
  np.testing.assert_array_equal(
      ids, np.concatenate([r['ids']['global'][r['rows']['global']['eval']] for r in reps]))
  # Each entry names its replicate; every global entry attacks the one global model.
  np.testing.assert_array_equal(which, np.repeat([0, 1], [len(p[0]) for p in parts]))
  np.testing.assert_array_equal(attacked, np.zeros(len(s), np.int64))
  _, _, _, lwhich, lattacked = pastel.pooled_attack_scores(reps, 'loss_threshold', 'local',
                                                           jax.random.key(0), **kw)
  # On `local` each entry attacks its own client's upload.
  want = np.concatenate([r['rows']['local']['client'][r['rows']['local']['eval']] for r in reps])
  np.testing.assert_array_equal(lattacked, want)
  assert set(lattacked) == {0, 1, 2} and set(lwhich) == {0, 1}
  # The white-box attack scores the same rows: every replicate's evaluation half.
  ws, wl, wids, wwhich, _ = pastel.pooled_attack_scores(reps, 'nasr_whitebox', 'global',
                                                        jax.random.key(0), **kw)
  np.testing.assert_array_equal(wl, lab)
  np.testing.assert_array_equal(wids, ids)
  np.testing.assert_array_equal(wwhich, which)
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
  s, lab, *_ = pastel.pooled_attack_scores(reps, 'loss_threshold', 'global', jax.random.key(0),
                                           **kw)
  r, rl, *_ = pastel.pooled_attack_scores(ref, 'loss_threshold', 'global', jax.random.key(0),
                                          **kw)
  m = pastel.auc_change(s, lab, r, rl)
  want = pastel.attack_metrics(s, lab)['attack_auc'] - pastel.attack_metrics(r, lab)['attack_auc']
  assert m['attack_auc_minus_none'] == pytest.approx(want, abs=1e-12)
  assert m['attack_auc_minus_none_ci_low'] < want < m['attack_auc_minus_none_ci_high'] < 0
  assert pastel.auc_change(r, rl, r, rl)['attack_auc_minus_none'] == 0.0
  with pytest.raises(ValueError, match='other rows'):
    pastel.auc_change(s, lab, r, 1 - rl)


def _fedmia_recording(rep, seed, shift=1.0, num_rounds=2):
  """FedMIA's measurements of `rep`'s global rows: each client's own members lose less."""
  rng = np.random.default_rng(seed)
  g = rep['rows']['global']
  owner = np.where(g['labels'] == 1, g['client'], -1)
  k, q = len(rep['members']), len(owner)
  own = (owner[None, :] == np.arange(k)[:, None])  # [K, Q]
  loss = rng.exponential(size=(num_rounds, k, q)) + shift * ~own[None]
  cos = rng.normal(size=(num_rounds, k, q)) + shift * own[None]
  arrays = dict(rep['arrays'])
  # The margin whose cross-entropy softplus(-margin) is `loss` (FedMIA-I reads it).
  arrays.update(fm_loss=loss, fm_margin=-np.log(np.expm1(loss)), fm_cos=cos,
                fm_diff=rng.normal(size=(num_rounds, k, q)),
                fm_grad_sq=rng.exponential(size=(num_rounds, q)), fm_rounds=np.arange(num_rounds))
  return dict(rep, arrays=arrays)


@pytest.mark.parametrize('attack', ['fedmia_i', 'fedmia_ii'])
def test_fedmia_scores_exactly_the_local_evaluation_rows(attack):
  rep = _fedmia_recording(_replica(0, 1.0), 0)
  s, lab, kept = pastel.fedmia_scores(rep['arrays'], rep['rows'], rep['members'], attack,
                                      with_rows=True)
  loc = rep['rows']['local']
  # Every local evaluation row once, with its own label; nothing else.
  assert sorted(kept.tolist()) == sorted(loc['eval'].tolist())
  np.testing.assert_array_equal(lab, loc['labels'][kept])
  s2, lab2 = pastel.fedmia_scores(rep['arrays'], rep['rows'], rep['members'], attack)
  np.testing.assert_array_equal(s, s2)
  np.testing.assert_array_equal(lab, lab2)
  assert pastel.attack_metrics(s, lab)['attack_auc'] > 0.7  # own members lose less
  # Pooled over two replicates: each replicate's rows and example ids, in turn.
  reps = [rep, _fedmia_recording(_replica(1, 1.0), 1)]
  ps, pl, pids, pwhich, pattacked = pastel.pooled_attack_scores(
      reps, attack, 'local', jax.random.key(0), steps=1, learning_rate=1e-3, hidden=4)
  parts = [pastel.fedmia_scores(r['arrays'], r['rows'], r['members'], attack, with_rows=True)
           for r in reps]
  np.testing.assert_array_equal(ps, np.concatenate([p[0] for p in parts]))
  np.testing.assert_array_equal(pl, np.concatenate([p[1] for p in parts]))
  np.testing.assert_array_equal(
      pids, np.concatenate([r['ids']['local'][p[2]] for r, p in zip(reps, parts)]))
  np.testing.assert_array_equal(pwhich, np.repeat([0, 1], [len(p[0]) for p in parts]))
  np.testing.assert_array_equal(pattacked, np.concatenate(
      [r['rows']['local']['client'][p[2]] for r, p in zip(reps, parts)]))


def test_attack_rows_label_every_row_by_its_owner_and_split_balanced_halves():
  split = pastel.client_split(jax.random.key(2), 120, 25, 3, 0.25, per_client=20)
  n_out = 25 + 60
  rows = pastel.attack_rows(split['members'], split['test_parts'], n_out, jax.random.key(3))
  g, loc = rows['global'], rows['local']
  # Global: every member (owner = its client), then the whole pool (owner -1).
  np.testing.assert_array_equal(g['labels'], np.r_[np.ones(45), np.zeros(n_out)])
  np.testing.assert_array_equal(g['example'], np.r_[np.concatenate(split['members']),
                                                    np.arange(n_out)])
  np.testing.assert_array_equal(g['client'], np.r_[np.repeat([0, 1, 2], 15), np.full(n_out, -1)])
  # Local: client k's members, then its pool share, in client order.
  want = np.concatenate([np.r_[m, t] for m, t in zip(split['members'], split['test_parts'])])
  np.testing.assert_array_equal(loc['example'], want)
  np.testing.assert_array_equal(loc['client'], np.repeat([0, 1, 2], [15 + len(t) for t in
                                                                     split['test_parts']]))
  np.testing.assert_array_equal(loc['labels'], np.concatenate(
      [np.r_[np.ones(15), np.zeros(len(t))] for t in split['test_parts']]))
  for target, r in rows.items():
    train, ev = r['train'], r['eval']
    assert not set(train) & set(ev) and len(set(ev)) == len(ev)
    for half in (train, ev):
      assert np.sum(r['labels'][half] == 1) == np.sum(r['labels'][half] == 0)
    n = 45 if target == 'global' else 15  # min(members, non-members), per client for local
    per = 1 if target == 'global' else 3
    assert len(train) == 2 * per * (n // 2) and len(ev) == 2 * per * (n - n // 2)
  # Local halves stay inside each client's block.
  for k in range(3):
    block = np.flatnonzero(loc['client'] == k)
    mine = np.r_[loc['train'], loc['eval']]
    assert np.sum(np.isin(mine, block)) == 2 * 15


def test_one_replicate_is_the_per_training_attack_with_its_own_key():
  from fl_privacy.attacks.passive import whitebox  # pylint: disable=g-import-not-at-top
  from fl_privacy.report import point_key  # pylint: disable=g-import-not-at-top
  rep = _replica(0, 1.0)
  kw = dict(steps=20, learning_rate=1e-2, hidden=8)
  s, lab = pastel.attack_scores(rep['arrays'], rep['rows'], rep['members'], 'nasr_whitebox',
                                'global', jax.random.key(5), **kw)
  ps, pl, *_ = pastel.pooled_attack_scores([rep], 'nasr_whitebox', 'global',
                                           jax.random.key(5), **kw)
  r = rep['rows']['global']
  feats = {k[len('global/'):]: v for k, v in rep['arrays'].items() if k.startswith('global/')}
  want = whitebox.train_and_score(
      point_key(jax.random.key(5), {'role': 'attack', 'target': 'global'}),
      {g: v[r['train']] for g, v in feats.items()}, r['labels'][r['train']],
      {g: v[r['eval']] for g, v in feats.items()}, **kw)
  np.testing.assert_array_equal(s, want)
  np.testing.assert_array_equal(ps, want)
  np.testing.assert_array_equal(lab, r['labels'][r['eval']])
  np.testing.assert_array_equal(pl, lab)


def test_a_held_out_row_at_least_even_when_the_fraction_rounds_to_none():
  split = pastel.client_split(jax.random.key(0), 100, 30, 2, 0.01)
  assert [len(h) for h in split['heldout']] == [1, 1]
  assert [len(m) for m in split['members']] == [49, 49]


def test_attack_scores_of_one_training_reads_its_members_for_fedmia():
  rep = _fedmia_recording(_replica(0, 1.0), 0)
  s, lab = pastel.attack_scores(rep['arrays'], rep['rows'], rep['members'], 'fedmia_ii',
                                'local', jax.random.key(0), steps=1, learning_rate=1e-3,
                                hidden=4)
  want = pastel.fedmia_scores(rep['arrays'], rep['rows'], rep['members'], 'fedmia_ii')
  np.testing.assert_array_equal(s, want[0])
  np.testing.assert_array_equal(lab, want[1])


def test_per_replicate_white_box_trains_each_replicate_on_its_own_half():
  from fl_privacy.attacks.passive import whitebox  # pylint: disable=g-import-not-at-top
  from fl_privacy.report import point_key  # pylint: disable=g-import-not-at-top
  reps = [_replica(0, 1.0), _replica(1, 1.0)]
  kw = dict(steps=20, learning_rate=1e-2, hidden=8)
  shared = pastel.pooled_attack_scores(reps, 'nasr_whitebox', 'local', jax.random.key(5), **kw)
  own = pastel.pooled_attack_scores(reps, 'nasr_whitebox', 'local', jax.random.key(5),
                                    per_replicate=True, **kw)
  for i, rep in enumerate(reps):
    r = rep['rows']['local']
    feats = {k[len('local/'):]: v for k, v in rep['arrays'].items() if k.startswith('local/')}
    want = whitebox.train_and_score(
        point_key(jax.random.key(5), {'role': 'attack', 'target': 'local', 'replicate': i}),
        {g: v[r['train']] for g, v in feats.items()}, r['labels'][r['train']],
        {g: v[r['eval']] for g, v in feats.items()}, **kw)
    np.testing.assert_array_equal(own[0][own[3] == i], want)
  for a, b in zip(shared[1:], own[1:]):  # the same entries, other scores
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(shared[0], own[0])


@pytest.mark.parametrize('num_train,num_clients,fraction,per_client', [
    (1438, 10, 0.2, None), (1437, 7, 0.33, None), (1438, 10, 0.2, 24), (50, 3, 0.01, 12)])
def test_member_counts_are_client_splits_for_every_key(num_train, num_clients, fraction,
                                                       per_client):
  # The DP baselines are calibrated from these counts before any training (no key yet).
  want = pastel.member_counts(num_train, num_clients, fraction, per_client)
  for seed in (0, 1, 7):
    split = pastel.client_split(jax.random.key(seed), num_train, 40, num_clients,
                                        fraction, per_client)
    assert [len(m) for m in split['members']] == want
