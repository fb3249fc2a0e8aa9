"""The attacks of the PASTEL experiment (Elhattab and Bouchenak) on its recorded trainings.

Targets: `local` (client k's uploaded model w_t - Delta_k; members: k's members; non-members:
k's disjoint share of the test split) and `global` (the global model; members: every client's
members; non-members: the test split). Each target's labelled rows are split, seeded, into
balanced halves (`attack_rows`): the white-box attack (`whitebox`, Nasr et al. 2019) trains on
one and every attack scores the other, so all attacks and all defenses are compared on the same
rows. `record` trains (through `defenses.pastel_training.run_segments`) and keeps what the
attacks read: white-box features at the last snapshots, FedMIA's measurements
(`fl.queries.measure`) at every recorded round, and the training's utility diagnostics.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy import validate
from fl_privacy.attacks.passive import evaluate as evaluate_lib
from fl_privacy.attacks.passive import scores as scores_lib
from fl_privacy.attacks.passive import whitebox
from fl_privacy.defenses import dp as dp_lib
from fl_privacy.defenses import pastel as pastel_lib
from fl_privacy.defenses import pastel_training
from fl_privacy.eval import auditing
from fl_privacy.eval import metrics as metrics_lib
from fl_privacy.eval import utility
from fl_privacy.fl import losses
from fl_privacy.fl import queries
from fl_privacy.report import point_key

FEDMIA_ATTACKS = ('fedmia_i', 'fedmia_ii')
# `margin`: FedMIA-I's loss is derived from it (`scores.signed_measurement`); trainings stored
# without it are retrained (`pipelines.pastel.trained`).
_MEASUREMENTS = ('loss', 'cos', 'diff', 'grad_sq', 'margin')
# Rows the internal-gap diagnostic (jsd_last_round) reads per client (memory on big models).
_JSD_ROWS = 512


def least_per_client(validation_fraction: float) -> int:
  """The fewest train rows per client that keep >= 2 members and >= 1 held-out row."""
  # Below 0.5 / fraction no row is held out; from there (fraction <= 0.5) a few steps suffice.
  n = max(3, int(0.5 / validation_fraction))
  while not (round(validation_fraction * n) >= 1 and n - round(validation_fraction * n) >= 2):
    n += 1
  return n


def check_shards(num_train: int, num_test: int, num_clients: int, per_client: int | None,
                 validation_fraction: float, batch_size: int, prefix: str = 'pastel') -> None:
  """Raises `validate.ConfigError` unless every client keeps >= 2 members, holds out at least
  a batch (V is a batch of held-out rows redrawn every step: fewer rows than a batch would
  make V the same set at every step) and gets >= 4 test non-members."""
  k = int(num_clients)
  if per_client is not None:
    validate.require(k * int(per_client) <= num_train, f'{prefix}.per_client',
                     f'<= {num_train // k} (num_clients = {k} clients share {num_train} '
                     'train rows)', per_client)
  rows = num_train // k if per_client is None else int(per_client)
  held = int(round(validation_fraction * rows))
  validate.require(held >= 1 and rows - held >= 2, f'{prefix}.num_clients',
                   f'small enough that each of the {num_train} // K train rows keeps >= 2 '
                   'members and >= 1 held-out row', k)
  validate.require(held >= int(batch_size), f'{prefix}.validation_fraction',
                   f'large enough that each client holds out >= {prefix}.batch_size = '
                   f'{int(batch_size)} rows (validation_fraction x {rows} rows per client = '
                   f'{held})', validation_fraction)
  validate.require(num_test >= 4 * k, f'{prefix}.num_clients',
                   f'<= {num_test // 4} (each client needs >= 4 test non-members)', k)


def heldout_count(shard_size: int, validation_fraction: float) -> int:
  """Held-out rows of a shard of `shard_size`: its share, rounded, and at least one."""
  return max(1, int(round(validation_fraction * shard_size)))


def member_counts(num_train: int, num_clients: int, validation_fraction: float,
                  per_client: int | None = None) -> list[int]:
  """Members per client of `client_split`, which no key changes (the shards' sizes are
  `data.iid_partition`'s, the held-out share `heldout_count`'s)."""
  sizes = ([int(per_client)] * num_clients if per_client is not None else
           [len(a) for a in np.array_split(np.arange(num_train), num_clients)])
  return [n - heldout_count(n, validation_fraction) for n in sizes]


def client_split(key, num_train: int, num_test: int, num_clients: int,
                 validation_fraction: float, per_client: int | None = None
                 ) -> dict[str, list[np.ndarray] | np.ndarray]:
  """Client shards, members / held-out per client, and the non-member pool shared out to clients.

  Depends only on the run key (never on the defense): every training sees the same members.
  Non-members are the test split and the train rows no client holds (with `per_client`, the
  rest of the train split): rows no training reads, drawn from the same distribution. The pool
  indexes `nonmember_pool`'s concatenation: test row i is pool row i, unused train row j is
  pool row num_test + (its position in `unused`).

  Args:
    key: The replicate's key.
    num_train, num_test: Sizes of the splits.
    num_clients: K.
    validation_fraction: Share of each shard held out as PASTEL's V.
    per_client: Train rows per client (members + held-out); None shares the whole split.

  Returns:
    dict of `members`, `heldout` (train indices per client), `unused` (train indices no client
    holds, sorted) and `test_parts` (non-member pool indices per client), index arrays.
  """
  shards = data_lib.iid_partition(point_key(key, {'role': 'partition'}), num_train, num_clients,
                                  per_client=per_client)
  members, heldout = [], []
  for i, shard in enumerate(shards):
    rng = data_lib.rng_from_key(point_key(key, {'role': 'heldout', 'client': i}))
    perm = rng.permutation(np.asarray(shard))
    h = heldout_count(len(shard), validation_fraction)
    heldout.append(np.sort(perm[:h]))
    members.append(np.sort(perm[h:]))
  unused = np.setdiff1d(np.arange(num_train), np.concatenate(shards))
  rng = data_lib.rng_from_key(point_key(key, {'role': 'test_parts'}))
  num_out = num_test + len(unused)
  test_parts = [np.sort(p) for p in np.array_split(rng.permutation(num_out), num_clients)]
  return dict(members=members, heldout=heldout, unused=unused, test_parts=test_parts)


def nonmember_pool(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
                   y_test: np.ndarray, unused: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(x, y) of the non-member pool: the test split, then the unused train rows."""
  if len(unused) == 0:
    return x_test, y_test
  return (np.concatenate([x_test, x_train[unused]]), np.r_[y_test, y_train[unused]])


def identities(rows: dict, num_train: int, num_test: int,
               unused: np.ndarray) -> dict[str, np.ndarray]:
  """Each row's example, the same in every replicate: train row j -> j, test row i ->
  num_train + i (a pool row is its test or unused train row).

  The same digit scored under two replicate trainings is one example: what the distinct
  negatives behind a low-FPR TPR count.
  """
  out = {}
  for target, r in rows.items():
    ex, member = np.asarray(r['example'], np.int64), r['labels'] == 1
    ids = ex.copy()
    pool = ex[~member]
    in_test = pool < num_test
    ids[~member] = num_train + pool  # test rows
    ids[np.flatnonzero(~member)[~in_test]] = np.asarray(unused, np.int64)[
        pool[~in_test] - num_test]
    out[target] = ids
  return out


def attack_rows(members: Sequence[np.ndarray], test_parts: Sequence[np.ndarray], num_test: int,
                key) -> dict:
  """Rows of each target and their seeded balanced halves (the same for every training).

  Global rows: every client's members (client order), then the whole non-member pool
  (`num_test` rows: the test split and the unused train rows, `client_split`). Local rows:
  for each client k, k's members then its pool share. Each row's `example` indexes the train
  split (members) or the pool (non-members).

  Returns:
    {target: {'labels', 'client', 'example', 'train' (row indices), 'eval' (row indices)}}.
  """
  k = len(members)
  n_test = num_test
  out = {}
  g_labels = np.r_[np.ones(sum(len(m) for m in members), np.int8), np.zeros(n_test, np.int8)]
  g_client = np.r_[np.concatenate([np.full(len(m), i) for i, m in enumerate(members)]),
                   np.full(n_test, -1)]
  g_example = np.r_[np.concatenate(members), np.arange(n_test)]
  rng = data_lib.rng_from_key(point_key(key, {'role': 'halves', 'target': 'global'}))
  pos, neg = np.flatnonzero(g_labels == 1), np.flatnonzero(g_labels == 0)
  tp, tn, ep, en = whitebox.balanced_halves(rng, len(pos), len(neg))
  out['global'] = dict(labels=g_labels, client=g_client, example=g_example,
                       train=np.r_[pos[tp], neg[tn]], eval=np.r_[pos[ep], neg[en]])
  labels, client, example, train_rows, eval_rows = [], [], [], [], []
  offset = 0
  for i in range(k):
    m, t = members[i], test_parts[i]
    labels.append(np.r_[np.ones(len(m), np.int8), np.zeros(len(t), np.int8)])
    client.append(np.full(len(m) + len(t), i))
    example.append(np.r_[m, t])
    rng = data_lib.rng_from_key(point_key(key, {'role': 'halves', 'target': 'local',
                                                'client': i}))
    tp, tn, ep, en = whitebox.balanced_halves(rng, len(m), len(t))
    train_rows.append(offset + np.r_[tp, len(m) + tn])
    eval_rows.append(offset + np.r_[ep, len(m) + en])
    offset += len(m) + len(t)
  out['local'] = dict(labels=np.concatenate(labels), client=np.concatenate(client),
                      example=np.concatenate(example), train=np.concatenate(train_rows),
                      eval=np.concatenate(eval_rows))
  return out


def replicate(key, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
              y_test: np.ndarray, num_clients: int, validation_fraction: float,
              per_client: int | None = None) -> dict:
  """One replicate's data, shared by every training of it: `client_split`, `attack_rows` on
  the non-member pool, the rows' `identities`, and the pool's `x_out`, `y_out`.

  Args:
    key: The replicate's key (`jax.random.fold_in(run_key, r)`).
    x_train, y_train, x_test, y_test: The splits (float inputs).
    num_clients, validation_fraction, per_client: As in `client_split`.
  """
  n_train, n_test = len(y_train), len(y_test)
  split = client_split(key, n_train, n_test, num_clients, validation_fraction, per_client)
  x_out, y_out = nonmember_pool(x_train, y_train, x_test, y_test, split['unused'])
  rows = attack_rows(split['members'], split['test_parts'], len(y_out), key)
  return dict(split=split, rows=rows, x_out=x_out, y_out=y_out,
              ids=identities(rows, n_train, n_test, split['unused']))


@functools.lru_cache(maxsize=None)
def feature_fn(apply_fn, last_layer):
  """`whitebox.make_feature_fn`, cached: one jitted program per model, shared by trainings."""
  return whitebox.make_feature_fn(apply_fn, last_layer=last_layer)


def _stack_snapshots(snaps: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {g: np.stack([s[g] for s in snaps], axis=1) for g in snaps[0]}


def record(apply_fn, params, clients, key, strength: float, *, factory, optimizer, epochs: int,
           batch_size: int, num_rounds: int, record_every: int, attack_snapshots: int,
           x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
           members: Sequence[np.ndarray], heldout: Sequence[np.ndarray], rows: dict,
           need_fedmia: bool, last_layer_grad: bool, chunk_size: int, layers: tuple,
           representation: str, temperature: float, defense: str, clip_norm: float,
           update_clip_norm: float, x_out: np.ndarray | None = None,
           y_out: np.ndarray | None = None) -> dict[str, Any]:
  """One training from `params` (w_0): rounds in segments; what the attacks read, recorded.

  Args:
    apply_fn, params, clients, key, strength, factory, optimizer, epochs, batch_size: the
      training (`defenses.pastel_training.segment`; `key` the rounds' key).
    num_rounds, record_every: T and the recording period (rounds every-1, 2 every-1, ...).
    attack_snapshots: white-box features at the last this many recorded rounds.
    members, heldout: per client, indices into the train split; `rows`: `attack_rows`.
    need_fedmia: record FedMIA's measurements (queries: the global rows).
    last_layer_grad: add the white-box group `last_layer_grad`.
    layers, representation, temperature: PASTEL's JS gap measured at the end (diagnostic).
    defense, clip_norm, update_clip_norm: which clipping `clip_fraction` reports.
    x_out, y_out: the non-member pool (`nonmember_pool`; default the test split, which alone
      gives the test accuracy).

  Returns:
    Arrays for the artifact store: white-box features `global/<group>` and `local/<group>`
    [rows, S, d]; FedMIA's `fm_loss`, `fm_cos`, `fm_diff`, `fm_margin` [R, K, Q],
    `fm_grad_sq` [R, Q],
    `fm_rounds`; `test_accuracy_rounds` [R]; the final model's test, member and per-client
    local counts; the internal gap `jsd_last_round`; `clip_fraction`, `upload_norm_median`.
  """
  x_out, y_out = (x_test, y_test) if x_out is None else (x_out, y_out)
  static = dict(apply_fn=apply_fn, optimizer=optimizer, epochs=int(epochs),
                batch_size=int(batch_size), hook_factory=factory)
  recorded = pastel_training.recorded_rounds(int(num_rounds), int(record_every))
  attacked = recorded[-int(attack_snapshots):]
  fn = feature_fn(apply_fn, whitebox.last_layer_name(params) if last_layer_grad else None)
  chunk = int(chunk_size)
  g_rows, l_rows = rows['global'], rows['local']
  last_locals = []
  all_members = np.concatenate(members)
  gx = np.concatenate([x_train[all_members], x_out])
  gy = np.r_[y_train[all_members], y_out]
  g_snaps, l_snaps, fm, acc_rounds, upload_norms = [], [], [], [], []
  for r, new_params, params, uploads in pastel_training.run_segments(
      params, clients, key, strength, recorded, **static):
    norms = jax.vmap(dp_lib.global_norm)(uploads)
    upload_norms.append(np.asarray(norms))
    acc_rounds.append(utility.count_correct(apply_fn, new_params, x_test, y_test) / len(y_test))
    if need_fedmia:
      meas = queries.measure(apply_fn, params, uploads, jnp.asarray(gx), jnp.asarray(gy),
                             chunk_size=chunk)
      fm.append({n: np.asarray(getattr(meas, n)) for n in _MEASUREMENTS})
    if r in attacked:
      g_snaps.append(whitebox.features(fn, new_params, gx, gy, chunk_size=chunk))
      parts = []
      for i in range(len(members)):
        local = pastel_training.local_model(params, uploads, i)
        sel = l_rows['client'] == i
        ex = l_rows['example'][sel]
        is_member = l_rows['labels'][sel] == 1
        xs = np.concatenate([x_train[ex[is_member]], x_out[ex[~is_member]]])
        ys = np.r_[y_train[ex[is_member]], y_out[ex[~is_member]]]
        parts.append(whitebox.features(fn, local, xs, ys, chunk_size=chunk))
      l_snaps.append({g: np.concatenate([p[g] for p in parts]) for g in parts[0]})
    if r == recorded[-1]:
      last_locals = [pastel_training.local_model(params, uploads, i)
                     for i in range(len(members))]
    params = new_params
  out = {f'global/{g}': v for g, v in _stack_snapshots(g_snaps).items()}
  out.update({f'local/{g}': v for g, v in _stack_snapshots(l_snaps).items()})
  if fm:
    for n in _MEASUREMENTS:
      out[f'fm_{n}'] = np.stack([m[n] for m in fm])
    out['fm_rounds'] = np.asarray(recorded)
  out['test_accuracy_rounds'] = np.asarray(acc_rounds)
  out['test_correct'] = utility.count_correct(apply_fn, params, x_test, y_test)
  out['member_correct'] = utility.count_correct(apply_fn, params, x_train[all_members],
                                                y_train[all_members])
  out['num_members'] = len(all_members)
  out['local_test_correct'] = np.asarray([utility.count_correct(apply_fn, p, x_test, y_test)
                                          for p in last_locals])
  loss_fn = losses.make_loss_fn(apply_fn)
  jsd = []
  for m, h in zip(members, heldout):
    m, h = m[:_JSD_ROWS], h[:_JSD_ROWS]
    jsd.append(pastel_lib.mean_jsd(apply_fn, loss_fn, params, jnp.asarray(x_train[m]),
                                   jnp.asarray(y_train[m]), jnp.asarray(x_train[h]),
                                   jnp.asarray(y_train[h]), layers=layers,
                                   representation=representation, temperature=temperature))
  out['jsd_last_round'] = float(np.mean(jsd))
  # Clipping: DP-SGD's per-example gradients at the final global model (members), or the
  # server's clip of the recorded rounds' uploads.
  if defense == 'ldp':
    g = out['global/grad_norms'][:, -1][g_rows['labels'] == 1]
    out['clip_fraction'] = float(np.mean(np.sqrt(np.sum(g.astype(np.float64) ** 2, -1)) >
                                         clip_norm))
  elif defense in ('cdp', 'wdp'):
    out['clip_fraction'] = float(np.mean(np.concatenate(upload_norms) > update_clip_norm))
  else:
    out['clip_fraction'] = math.nan
  out['upload_norm_median'] = float(np.median(np.concatenate(upload_norms)))
  return out


def fedmia_scores(arrays: dict, rows: dict, members: Sequence[np.ndarray],
                  attack: str, with_rows: bool = False) -> tuple[np.ndarray, ...]:
  """FedMIA-I / -II (aligned, leave-one-out filter) on the local target's evaluation rows.

  Queries are the global rows (members of every client, then the test split); for target k,
  `scores.pooled_round_scores` ranks k's members against every other query; only k's
  evaluation-half members and test share are kept, so FedMIA scores the same rows as the
  other attacks. With `with_rows`, also each score's local row (index into `rows['local']`).
  """
  # A training stored before margins were recorded has no `fm_margin`: FedMIA-I refuses it
  # (`lira.phi`), FedMIA-II does not read it.
  recording = {n: arrays[f'fm_{n}'] for n in _MEASUREMENTS if f'fm_{n}' in arrays}
  recording['rounds'] = arrays['fm_rounds']
  g = rows['global']
  owner = np.where(g['labels'] == 1, g['client'], -1)
  # Named explicitly: `scores`' default is now the paper's filter; PASTEL's documented numbers
  # were measured with the leave-one-out one (a switch needs a re-measured PASTEL run).
  pooled = scores_lib.pooled_round_scores(recording, owner, attack,
                                          default_filter='leave_one_out')
  final = scores_lib.combine_rounds(pooled['scores'], attack)
  # Entry order of pooled_round_scores: per target k, its members then every other query.
  query_ids, target_ids = [], []
  for k in range(len(members)):
    mine, others = scores_lib.target_views(owner, k)
    query_ids.append(np.r_[mine, others])
    target_ids.append(np.full(len(mine) + len(others), k))
  query_ids, target_ids = np.concatenate(query_ids), np.concatenate(target_ids)
  loc = rows['local']
  n_members = len(np.concatenate(members))
  # Global query index of each local evaluation row.
  wanted = {}
  for r in loc['eval']:
    k = int(loc['client'][r])
    ex = int(loc['example'][r])
    if loc['labels'][r] == 1:
      q = int(np.flatnonzero((g['client'] == k) & (g['example'] == ex) & (g['labels'] == 1))[0])
    else:
      q = n_members + ex
    wanted[(k, q)] = int(r)
  keep = np.array([(int(k), int(q)) in wanted for k, q in zip(target_ids, query_ids)])
  kept_rows = np.array([wanted[(int(k), int(q))] for k, q in zip(target_ids[keep],
                                                                 query_ids[keep])], np.int64)
  labels = loc['labels'][kept_rows].astype(np.int64)
  assert np.array_equal(labels, pooled['labels'][keep])
  return (final[keep], labels, kept_rows) if with_rows else (final[keep], labels)


def attack_scores(arrays: dict, rows: dict, members: Sequence[np.ndarray], attack: str,
                  target: str, key, *, steps: int, learning_rate: float,
                  hidden: int) -> tuple[np.ndarray, np.ndarray]:
  """(scores, labels) of `attack` on `target`'s evaluation half (one training).

  `steps`, `learning_rate`, `hidden`: the white-box attack's training (`nasr_whitebox`).
  """
  replica = dict(arrays=arrays, rows=rows, members=members,
                 ids={target: np.arange(len(rows[target]['labels']))})
  scores, labels, *_ = pooled_attack_scores([replica], attack, target, key, steps=steps,
                                            learning_rate=learning_rate, hidden=hidden)
  return scores, labels


def pooled_attack_scores(replicas: Sequence[dict], attack: str, target: str, key, *,
                         steps: int, learning_rate: float, hidden: int,
                         per_replicate: bool = False) -> tuple[np.ndarray, ...]:
  """(scores, labels, example ids, replicate, attacked) of `attack` on `target`, pooled over
  replicate trainings.

  Each replica is one training of the same defense under its own replicate key: `{'arrays',
  'rows' (`attack_rows`), 'members', 'ids' (`identities`)}`. `replicate` [N] is each entry's
  index in `replicas`; `attacked` [N] the model it scores (the client whose upload is
  attacked on `local`, 0 for the one global model), so `eval.replicated` can resample
  replicates, then attacked models, then examples. The loss threshold and FedMIA score each
  replica's evaluation half; the white-box attack is ONE model trained on the training halves
  of every replica (the attacker's known pairs: as many as the scored pairs, and no (training,
  row) it scores) and scores every evaluation half. With one replica this is the per-training
  attack of Nasr et al.'s supervised setting. Because that model is shared, its own training
  randomness is common to all replicates: an interval over replicates does not cover it.
  With `per_replicate`, each replica gets its own white-box model, trained on its own
  training half only (key fold_in-derived per replica: the replicates' attacks independent,
  each on a tenth of the pairs at 10 replicates).
  """
  scores, labels, ids, which, attacked = [], [], [], [], []
  train_feats, train_labels, eval_feats = [], [], []
  prefix = f'{target}/'
  for i, rep in enumerate(replicas):
    r = rep['rows'][target]
    if attack in FEDMIA_ATTACKS:
      s, lab, kept = fedmia_scores(rep['arrays'], rep['rows'], rep['members'], attack,
                                   with_rows=True)
      scores.append(s)
      labels.append(lab)
      ids.append(rep['ids'][target][kept])
      which.append(np.full(len(kept), i))
      attacked.append(np.asarray(r['client'])[kept])
      continue
    feats = {k[len(prefix):]: v for k, v in rep['arrays'].items() if k.startswith(prefix)}
    labels.append(r['labels'][r['eval']])
    ids.append(rep['ids'][target][r['eval']])
    which.append(np.full(len(r['eval']), i))
    # Global non-members carry client -1: every global entry attacks the one global model.
    attacked.append(np.asarray(r['client'])[r['eval']] if target == 'local'
                    else np.zeros(len(r['eval']), np.int64))
    if attack == 'loss_threshold':
      scores.append(whitebox.loss_scores({'loss': feats['loss'][r['eval']]}))
    else:
      train_feats.append({g: v[r['train']] for g, v in feats.items()})
      train_labels.append(r['labels'][r['train']])
      eval_feats.append({g: v[r['eval']] for g, v in feats.items()})
  if attack == 'nasr_whitebox':
    cat = lambda parts: {g: np.concatenate([p[g] for p in parts]) for g in parts[0]}
    fit = lambda k, tf, tl, ef: whitebox.train_and_score(
        k, tf, tl, ef, steps=int(steps), learning_rate=float(learning_rate), hidden=int(hidden))
    if per_replicate:
      scores = [fit(point_key(key, {'role': 'attack', 'target': target, 'replicate': i}),
                    tf, tl, ef)
                for i, (tf, tl, ef) in enumerate(zip(train_feats, train_labels, eval_feats))]
    else:
      scores = [fit(point_key(key, {'role': 'attack', 'target': target}), cat(train_feats),
                    np.concatenate(train_labels), cat(eval_feats))]
  return (np.concatenate(scores), np.concatenate(labels), np.concatenate(ids),
          np.concatenate(which), np.concatenate(attacked).astype(np.int64))


def auc_change(scores: np.ndarray, labels: np.ndarray, reference: np.ndarray,
               reference_labels: np.ndarray) -> dict[str, float]:
  """`attack_auc_minus_none` [95% paired DeLong interval]: the AUC of `scores` minus that of
  `reference`, the same attack's scores of the same rows under the undefended trainings
  (`eval.metrics.auc_difference_interval`). Every training of a replicate scores the same rows
  in the same order (`pooled_attack_scores`), so the comparison is paired; DeLong takes the
  rows as independent, so on rows pooled over replicates it is conditional on the trainings
  (the pipeline reports it as `pooled_attack_auc_minus_none`)."""
  if not np.array_equal(np.asarray(labels), np.asarray(reference_labels)):
    raise ValueError('the reference scores other rows')
  d, low, high = metrics_lib.auc_difference_interval(scores, reference, labels)
  return {'attack_auc_minus_none': d, 'attack_auc_minus_none_ci_low': low,
          'attack_auc_minus_none_ci_high': high}


def dp_metrics(scores: np.ndarray, labels: np.ndarray, declaration: dict, target: str,
               delta: float) -> dict:
  """A DP baseline's point: the attack's epsilon-unit estimates (`auditing.attack_bounds`) and the
  declaration's labels; on the `local` target an aggregate-only claim holds no epsilon (the
  server reads each upload before DP-FedAvg adds its noise)."""
  m = auditing.attack_bounds(scores, labels, float(delta))
  for k in ('dp_unit', 'dp_relation', 'dp_adversary', 'dp_sampling'):
    m[k] = declaration[k]
  if declaration['dp_adversary'] == 'aggregate' and target == 'local':
    m['dp_epsilon'] = math.nan
    m['dp_epsilon_per_round'] = math.nan
  return m


def attack_metrics(scores: np.ndarray, labels: np.ndarray,
                   groups: np.ndarray | None = None) -> dict[str, float]:
  """`evaluate.score_metrics` under PASTEL's names: `attack_auc` (+ DeLong interval),
  `log_auc`, `tpr_at_fpr_1e-2` / `1e-3` (+ Clopper-Pearson) with the distinct negatives behind
  each threshold (`groups`: each row's example, `identities`; None = every scored row its own
  example), `n_pos`, `n_neg`, `n_neg_distinct`."""
  labels = np.asarray(labels)
  groups = np.arange(labels.size) if groups is None else np.asarray(groups)
  base = evaluate_lib.score_metrics(scores, labels, groups=groups)
  m = {'attack_auc': base['auc'], 'attack_auc_ci_low': base['auc_ci_low'],
       'attack_auc_ci_high': base['auc_ci_high'], 'log_auc': base['log_auc']}
  for name in ('tpr_at_fpr_1e-2', 'tpr_at_fpr_1e-3'):
    for suffix in ('', '_ci_low', '_ci_high', '_distinct_negatives'):
      m[name + suffix] = base[name + suffix]
  m['n_pos'], m['n_neg'] = base['n_pos'], base['n_neg']
  m['n_neg_distinct'] = base['n_neg_distinct']
  return m
