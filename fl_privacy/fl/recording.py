"""FedAvg training that records what a passive server measures every few rounds.

`train_recorded` runs `rounds.run` in segments, one jitted function per segment: the
`record_every - 1` plain rounds before a recorded round in one scan, then the recorded round
itself, whose K uploads (as the server saw them, after the `upload` hook) go through
`queries.measure` at that round's global model w_t, and the new global model w_{t+1} is
evaluated on the test split.
Keys depend only on the global round index, so the segmented run equals one `rounds.run`.

Recorded rounds are the `record_every`-th, 2 `record_every`-th, ..., `num_rounds`-th round
(1-based), as the FedMIA code records rounds 10, 20, ..., 300; their 0-based indices are
`recorded_rounds(...)`.

The result is a dict of numpy arrays (the FedMIA paper's I_k^t measured on every query):
`loss`, `cos`, `diff` [R, K, Q] float32, `grad_sq` [R, Q], `margin` [R, K, Q] float32 (the
logit margin z_y - logsumexp_{j != y} z_j of each query under each upload, LiRA's and RMIA's
statistic: `queries.measure`), `rounds` [R] (0-based index t of
each recorded round), `test_correct` [R] and `num_test` (correct test predictions of
w_{t+1}), `test_loss` [R], and given the members, `member_correct` and `num_member` (the
final global model's accuracy on the clients' training rows). A caller stores it (the pipeline writes one .npz per training
atomically), so re-scoring never retrains. `record_shards` is the FedMIA setting: clients
hold shards of a train split, the queries are the whole train split then the test split, and
the result adds `owner` [Q] (the client holding each query, -1 none), `client_sizes` [K] and
`train_seconds`.

Online LiRA (`in_models` > 0, `fl.shadow`): at each recorded round the server also re-runs the
protocol's local training from w_t on `in_models` shadow sets per query, each drawn from the
data it holds (`shadow_x`; `record_shards`: the test split) with the query inserted, and the
result adds `loss_in` and `margin_in` [R, M, Q] float32 (the query's loss and logit margin
under each IN model) and `shadow_size` (rows of a shadow set). Without it nothing of that is
computed and the other
arrays are the same, bit for bit.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fl_privacy import data as data_lib
from fl_privacy.fl import client
from fl_privacy.fl import losses
from fl_privacy.fl import queries
from fl_privacy.fl import rounds
from fl_privacy.fl import shadow

ARRAYS = ('loss', 'cos', 'diff', 'grad_sq', 'margin', 'rounds', 'test_correct', 'num_test',
          'test_loss')
# The per-round measurements of `queries.Measurements`, in its order.
MEASURED = ('loss', 'cos', 'diff', 'grad_sq', 'margin')


def recorded_rounds(num_rounds: int, record_every: int) -> np.ndarray:
  """0-based indices of the recorded rounds: record_every - 1, 2 record_every - 1, ..."""
  if record_every < 1 or num_rounds % record_every:
    raise ValueError(f'record_every ({record_every}) must divide num_rounds ({num_rounds})')
  return np.arange(record_every - 1, num_rounds, record_every)


_STATIC = ('apply_fn', 'optimizer', 'epochs', 'batch_size', 'hooks', 'num_plain', 'chunk_size',
           'in_models', 'shadow_size', 'masked')


def _keep_upload(key, t, k, global_params, upload):
  del key, t, k, global_params
  return upload


def _split_hooks(hooks: client.ClientHooks | None):
  """(static, traced) parts of the hooks: the fields that are `jax.tree_util.Partial`s (a
  defense whose strength is an array, e.g. `update_dp`'s noise) travel as traced operands, so
  every strength of a sweep runs the same compiled segment; the other fields stay static."""
  if hooks is None:
    return None, {}
  traced = {f: h for f, h in hooks._asdict().items() if isinstance(h, jax.tree_util.Partial)}
  return hooks._replace(**{f: None for f in traced}), traced


def _segment(params, clients, key, first, qx, qy, test_x, test_y, pool, traced_hooks, *,
             apply_fn, optimizer, epochs, batch_size, hooks, num_plain, chunk_size, in_models=0,
             shadow_size=0, masked=False):
  """Rounds first .. first + num_plain - 1 unobserved, then round t = first + num_plain whose
  uploads are measured at w_t; returns (w_{t+1}, measurements, test correct, test loss sum,
  IN (loss, margin) [M, Q] each, or None).

  `pool` is (shadow_x, shadow_y, query_pool) when `in_models` > 0 (`shadow.in_losses` at w_t
  with round t's optimizer), else None and nothing more is traced.

  One jitted function per segment, module-level and keyed on its static arguments, so every
  segment of a training and every training of the same shapes and settings compile once;
  `traced_hooks` are the hooks' traced fields (`_split_hooks`), put back before use.
  """
  if traced_hooks:
    hooks = hooks._replace(**traced_hooks)
  loss_fn = losses.make_loss_fn(apply_fn)
  kw = dict(key=key, optimizer=optimizer, epochs=epochs, batch_size=batch_size, hooks=hooks)
  if num_plain:
    params, _ = rounds.run(loss_fn, params, clients, num_rounds=num_plain, first_round=first,
                           **kw)
  zeros = jax.tree_util.tree_map(
      lambda a: jnp.zeros((clients.num_clients,) + a.shape, a.dtype), params)
  new_params, log = rounds.run(loss_fn, params, clients, num_rounds=1,
                               first_round=first + num_plain, observe=_keep_upload, init=zeros,
                               **kw)
  m = queries._measure(apply_fn, params, log.observed, qx, qy,  # pylint: disable=protected-access
                       chunk_size=chunk_size)
  loss_in = None
  if in_models:
    t = first + num_plain
    opt = optimizer if isinstance(optimizer, optax.GradientTransformation) else optimizer(t)
    loss_in = shadow.in_losses(apply_fn, params, pool[0], pool[1], qx, qy, pool[2], key=key,
                               round_index=t, num_models=in_models, size=shadow_size,
                               optimizer=opt, epochs=epochs, batch_size=batch_size, hooks=hooks,
                               masked=masked, chunk_size=chunk_size)
  if test_x is None:
    return new_params, m, jnp.int32(0), jnp.float32(jnp.nan), loss_in
  logits = apply_fn(new_params, test_x)
  correct = jnp.sum(jnp.argmax(logits, -1) == test_y)
  return (new_params, m, correct, jnp.sum(losses.per_example_cross_entropy(logits, test_y)),
          loss_in)


# Jitted by rebinding, not by a decorator: mutmut skips decorated functions.
_segment = jax.jit(_segment, static_argnames=_STATIC)


def train_recorded(apply_fn: Callable[[Any, jnp.ndarray], jnp.ndarray], params: Any,
                   clients: rounds.ClientData, query_x, query_y, *, key, num_rounds: int,
                   record_every: int, optimizer, epochs: int, batch_size: int,
                   hooks: client.ClientHooks | None = None, test_x=None, test_y=None,
                   chunk_size: int = 256, member_x=None, member_y=None,
                   progress: Callable[[int, dict], None] | None = None, in_models: int = 0,
                   shadow_x=None, shadow_y=None, query_pool=None,
                   shadow_size: int | None = None) -> dict[str, np.ndarray]:
  """Trains FedAvg for `num_rounds` rounds and measures the queries at every recorded round.

  The FedMIA paper's observation set {I_k^t} (Sect. 3.2) restricted to the recorded rounds,
  measured as `queries.measure` does (Eq. 7 and the baselines' measurements).

  Args:
    apply_fn: `apply_fn(params, x) -> logits` (hashable, e.g. `model.apply`).
    params: Initial global parameters w_0.
    clients: `rounds.ClientData` (padded unequal shards allowed).
    query_x: Query inputs [Q, ...] (float, as the model takes them).
    query_y: Query labels [Q].
    key: Run key (`rounds.run` derives every client's round key from it).
    num_rounds: T; `record_every` must divide it.
    record_every: Rounds between recordings.
    optimizer: optax transformation or `t -> optax` (per-round schedule, t the global round);
      a static argument of the jitted rounds: pass the same object to reuse compilations.
    epochs: Local epochs E.
    batch_size: B.
    hooks: The clients' `ClientHooks` (a defense), None for plain FedAvg.
    test_x, test_y: Test split for the accuracy after each recorded round (optional).
    chunk_size: Queries per `measure` chunk.
    member_x, member_y: The clients' training rows (optional): the final global model's
      accuracy on them (`member_correct`, `num_member`) gives the generalisation gap.
    progress: Optional `progress(recorded_index, {'round', 'test_accuracy'})` callback.
    in_models: M IN models per query and recorded round for online LiRA (`fl.shadow`); 0:
      none (no `loss_in`, `margin_in`).
    shadow_x, shadow_y: the server's data the shadow sets are drawn from (needed with
      `in_models`).
    query_pool: [Q] row of each query in `shadow_x`, -1 when it is not one (default: none).
    shadow_size: rows of a shadow set; default the clients' mean size, rounded (every
      client's size when the shards are equal).

  Returns:
    The dict of numpy arrays described in the module docstring.
  """
  recorded = recorded_rounds(num_rounds, record_every)
  if chunk_size < 1:
    raise ValueError(f'chunk_size must be >= 1 (got {chunk_size})')
  if in_models < 0 or (in_models and (shadow_x is None or shadow_y is None)):
    raise ValueError(f'in_models must be >= 0 and needs shadow_x, shadow_y (got {in_models})')
  if in_models and clients.aux is not None:
    # A shadow set has no client's auxiliary data for its hooks to read.
    raise ValueError('IN models cannot re-run clients with auxiliary data (clients.aux)')
  hooks, traced_hooks = _split_hooks(hooks)
  static = dict(apply_fn=apply_fn, optimizer=optimizer, epochs=int(epochs),
                batch_size=int(batch_size), hooks=hooks)
  clients = rounds.ClientData(*(None if a is None else jax.tree_util.tree_map(jnp.asarray, a)
                                for a in clients))
  qx, qy = jnp.asarray(query_x), jnp.asarray(query_y)
  tx = None if test_x is None else jnp.asarray(test_x)
  ty = None if test_y is None else jnp.asarray(test_y)
  chunk = int(min(chunk_size, qx.shape[0]))
  pool = None
  if in_models:
    if shadow_size is None:
      shadow_size = int(np.rint(np.mean(np.asarray(clients.sizes()))))
    if query_pool is None:
      query_pool = np.full(qx.shape[0], -1, np.int32)
    pool = (jnp.asarray(shadow_x), jnp.asarray(shadow_y), jnp.asarray(query_pool, jnp.int32))
    static.update(in_models=int(in_models), shadow_size=int(shadow_size),
                  masked=clients.mask is not None)
  out = {name: [] for name in MEASURED + ('test_correct', 'test_loss', 'loss_in',
                                          'margin_in')}
  done = 0
  for i, t in enumerate(recorded):
    params, m, correct, total, loss_in = _segment(
        params, clients, key, jnp.int32(done), qx, qy, tx, ty, pool, traced_hooks,
        num_plain=int(t - done), chunk_size=chunk, **static)
    for name in MEASURED:
      out[name].append(np.asarray(getattr(m, name), np.float32))
    if in_models:
      out['loss_in'].append(np.asarray(loss_in[0], np.float32))
      out['margin_in'].append(np.asarray(loss_in[1], np.float32))
    if tx is not None:
      out['test_correct'].append(int(correct))
      out['test_loss'].append(float(total) / tx.shape[0])
    done = int(t) + 1
    if progress is not None:
      acc = (out['test_correct'][-1] / tx.shape[0]) if tx is not None else float('nan')
      progress(i, {'round': int(t), 'test_accuracy': acc})
  result = {name: np.stack(out[name]) for name in MEASURED}
  result['rounds'] = recorded.astype(np.int32)
  num_test = 0 if test_x is None else len(test_x)
  result['test_correct'] = np.asarray(out['test_correct'] or [0] * len(recorded), np.int64)
  result['test_loss'] = np.asarray(out['test_loss'] or [np.nan] * len(recorded), np.float64)
  result['num_test'] = np.asarray(num_test, np.int64)
  if member_x is not None:
    logits = apply_fn(params, jnp.asarray(member_x))
    result['member_correct'] = np.asarray(
        int(jnp.sum(jnp.argmax(logits, -1) == jnp.asarray(member_y))), np.int64)
    result['num_member'] = np.asarray(len(member_x), np.int64)
  if in_models:
    result['loss_in'] = np.stack(out['loss_in'])
    result['margin_in'] = np.stack(out['margin_in'])
    result['shadow_size'] = np.asarray(shadow_size, np.int64)
  return result


def query_set(train_x, train_y, test_x, test_y, shards: list[np.ndarray]
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(x, y, owner) of every query: the train rows (owner = the client whose shard holds them,
  -1 if none) then the test rows (owner -1)."""
  owner = np.full(len(train_x) + len(test_x), -1, np.int32)
  for k, idx in enumerate(shards):
    owner[idx] = k
  x = np.concatenate([train_x, test_x])
  y = np.concatenate([train_y, test_y]).astype(np.int32)
  return x, y, owner


def record_shards(model, init_key, train, test, shards: list[np.ndarray], *,
                  label: str = 'training', **kw) -> dict[str, np.ndarray]:
  """`train_recorded` of `model` from `model.init(init_key, ...)`, client k holding
  `train[shards[k]]`, measured on `query_set` of the train and test splits.

  Args:
    model: A Flax module (`model.apply` is the jitted rounds' static `apply_fn`).
    init_key: Key of w_0.
    train, test: `data.Dataset` splits; the test split holds queries (non-members of every
      client) and gives the accuracy after each recorded round.
    shards: Each client's indices into the train split (unequal sizes are padded).
    label: Names the training in the progress log (every 10 s).
    **kw: `train_recorded`'s keyword arguments (`key`, `num_rounds`, `record_every`, ...);
      with `in_models` > 0 the shadow sets are drawn from the test split (the server-held
      population RMIA uses too; a test query is its own pool row).

  Returns:
    `train_recorded`'s arrays plus `owner` [Q], `train_seconds` and `client_sizes` [K].
  """
  xf, test_x = data_lib.to_float(train.x), data_lib.to_float(test.x)
  clients = rounds.pad_clients([xf[i] for i in shards], [train.y[i] for i in shards])
  qx, qy, owner = query_set(xf, train.y, test_x, test.y, shards)
  init = model.init(init_key, qx[:1])
  t0 = time.perf_counter()

  def progress(i, info):
    del i
    logging.log_every_n_seconds(logging.INFO, '%s: round %d, test accuracy %.3f', 10, label,
                                info['round'] + 1, info['test_accuracy'])

  members = np.concatenate([np.asarray(i) for i in shards]).astype(np.int64)
  if kw.get('in_models'):
    # query_set's order: the train rows (not pool rows), then the test rows (pool rows).
    kw.update(shadow_x=test_x, shadow_y=test.y, query_pool=np.r_[
        np.full(len(xf), -1), np.arange(len(test_x))].astype(np.int32))
  rec = train_recorded(model.apply, init, clients, qx, qy, test_x=test_x, test_y=test.y,
                       member_x=xf[members], member_y=train.y[members], progress=progress, **kw)
  rec['owner'] = owner
  rec['train_seconds'] = np.asarray(time.perf_counter() - t0)
  rec['client_sizes'] = np.asarray([len(i) for i in shards], np.int64)
  return rec
