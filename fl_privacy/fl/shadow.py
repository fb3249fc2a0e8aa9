"""IN models a FedAvg server builds by re-running the protocol's local training with a query.

Online LiRA (Carlini et al., "Membership Inference Attacks From First Principles", IEEE S&P
2022, arXiv:2112.03570, Algorithm 1 with its online lines) needs measurements of each query x
under models trained *with* x. A FedAvg server knows the global model w_t the clients start
from in round t and the protocol (optimizer and its round-t learning rate, E, B, the clients'
hooks), not the target's data. So for query q, round t and shadow index m it trains from w_t,
with the clients' own code (`local.client_update`, hooks included), a shadow set of the
clients' size drawn from data the server holds (the pool; the FedMIA pipeline's test split),
with x replacing one of its rows, and measures the cross-entropy of x and its logit margin
z_y - logsumexp_{j != y} z_j (`losses.true_label_margin`, LiRA's phi from the logits) under
w_t - upload: the model the server would have seen had the shadow set been a client's
(`queries.measure`'s `loss` and `margin` of an upload).

Keys (from the training's run key `key`; the result depends on (key, t, m, q) only, never on
how the queries are chunked):
- `shadow_key(key, t, m)` = fold_in(fold_in(fold_in(key, t), SHADOW_SALT), m) (a per-round
  server draw as `rounds.SERVER_SALT`'s, salted apart from them);
- the shadow set's rows: `shadow_rows(fold_in(k_tm, ROWS_SALT), pool_size, size)`;
- query q (its global index) gets k_tmq = fold_in(k_tm, q): `insert_position(fold_in(k_tmq,
  0), ...)` picks the row x replaces, fold_in(k_tmq, 1) is the local training's client key.
ROWS_SALT is far above any query index, so no key serves two draws.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from fl_privacy.fl import client
from fl_privacy.fl import local
from fl_privacy.fl import losses

# Beside `rounds`' per-round salts (0x7FFF1001-3), so the shadow draws are their own.
SHADOW_SALT = 0x7FFF1004
# Above any query index q, which also folds into the shadow key.
ROWS_SALT = 0x7FFF2001


def shadow_key(key, round_index, shadow_index):
  """Key of shadow set m of round t: fold_in(fold_in(fold_in(key, t), SHADOW_SALT), m)."""
  k = jax.random.fold_in(jax.random.fold_in(key, round_index), SHADOW_SALT)
  return jax.random.fold_in(k, shadow_index)


def shadow_rows(key, pool_size: int, size: int) -> jnp.ndarray:
  """Rows of the pool that form one shadow set, int32 [size].

  A uniformly random permutation of the pool, cut to `size` rows: distinct rows, as a client's
  shard. A pool smaller than a client is cycled (row i is perm[i mod pool_size]), so every
  pool row is used before any repeats.
  """
  perm = jax.random.permutation(key, pool_size)
  return perm[jnp.arange(size) % pool_size].astype(jnp.int32)


def insert_position(key, rows: jnp.ndarray, pool_index) -> jnp.ndarray:
  """The row of the shadow set that the query replaces.

  Its own row when the shadow set already holds the query (a pool row, `pool_index` >= 0),
  so that the IN set holds it once; otherwise a uniformly random row, drawn with `key`.
  """
  hit = rows == pool_index
  return jnp.where(jnp.any(hit), jnp.argmax(hit), jax.random.randint(key, (), 0, rows.shape[0]))


def in_loss(apply_fn: Callable[[Any, jnp.ndarray], jnp.ndarray], global_params: Any, x, y,
            position, query_x, query_y, *, key, optimizer: optax.GradientTransformation,
            epochs: int, batch_size: int, hooks: client.ClientHooks | None = None,
            mask=None) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Cross-entropy and logit margin of the query under one IN model: the protocol's round on
  a shadow set.

  The shadow set is `x`, `y` with row `position` replaced by the query; the client's round
  (`local.client_update` from `global_params`, the protocol's optimizer, E, B and hooks, client
  key `key`) gives an upload Delta, and the IN model is w_t - Delta, the model whose loss
  `queries.measure` records for an upload. Given a client's own shard (the query one of its
  rows, at its position), its round key and mask, this is that client's recorded loss.

  Args:
    apply_fn: `apply_fn(params, x) -> logits`.
    global_params: w_t.
    x, y: shadow set [n, ...], [n].
    position: row the query replaces.
    query_x, query_y: one query [...], [].
    key: the local training's client key.
    optimizer, epochs, batch_size, hooks: the protocol (`local.fedavg`).
    mask: None, or [n] ones for the masked path (clients with padded shards train that way).

  Returns:
    (loss, margin): scalar float32 cross-entropy and z_y - logsumexp_{j != y} z_j.
  """
  x = jnp.asarray(x).at[position].set(query_x)
  y = jnp.asarray(y).at[position].set(query_y)
  upload, _ = local.client_update(losses.make_loss_fn(apply_fn), global_params, x, y, key=key,
                                  hooks=hooks, mask=mask, optimizer=optimizer, epochs=epochs,
                                  batch_size=batch_size)
  model = jax.tree_util.tree_map(jnp.subtract, global_params, upload)
  logits, label = apply_fn(model, query_x[None]), jnp.asarray(query_y)[None]
  return (losses.per_example_cross_entropy(logits, label)[0],
          losses.true_label_margin(logits, label)[0])


def in_losses(apply_fn: Callable[[Any, jnp.ndarray], jnp.ndarray], global_params: Any,
              pool_x, pool_y, query_x, query_y, query_pool, *, key, round_index,
              num_models: int, size: int, optimizer: optax.GradientTransformation,
              epochs: int, batch_size: int, hooks: client.ClientHooks | None, masked: bool,
              chunk_size: int) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Losses and logit margins of every query under its `num_models` IN models of round t.

  For shadow index m the rows `shadow_rows` of the pool (keys: module docstring) are the
  shadow set of every query; query q replaces row `insert_position` and trains with its own
  key (`in_loss`). Queries are vmapped in chunks of `chunk_size` (memory ~ chunk x (size x
  example + parameters)), shadow indices and chunks run one after the other (`lax.map`).

  Args:
    apply_fn: `apply_fn(params, x) -> logits`.
    global_params: w_t.
    pool_x, pool_y: the server's data [P, ...], [P].
    query_x, query_y: queries [Q, ...], [Q].
    query_pool: [Q] int32 row of each query in the pool, -1 when it is not a pool row.
    key: the training's run key.
    round_index: t (0-based, may be traced).
    num_models: M (static).
    size: rows of a shadow set (the clients' size; static).
    optimizer, epochs, batch_size, hooks: the protocol of round t.
    masked: train on the masked path (as clients whose shards are padded do).
    chunk_size: queries per vmapped chunk.

  Returns:
    (loss [M, Q], margin [M, Q]) float32 (`in_loss`).
  """
  pool_x, pool_y = jnp.asarray(pool_x), jnp.asarray(pool_y)
  q = query_x.shape[0]
  chunk = int(min(chunk_size, q))
  num_chunks = -(-q // chunk)
  pad = num_chunks * chunk - q

  def padded(a, fill):
    a = jnp.asarray(a)
    tail = jnp.full((pad,) + a.shape[1:], fill, a.dtype)
    return jnp.concatenate([a, tail]).reshape((num_chunks, chunk) + a.shape[1:])

  # Padding rows are zeros (finite) outside the pool; their losses are sliced off below.
  chunks = (padded(jnp.arange(q, dtype=jnp.int32), 0), padded(query_x, 0),
            padded(query_y, 0), padded(jnp.asarray(query_pool, jnp.int32), -1))
  mask = jnp.ones(size, jnp.float32) if masked else None

  def one_model(m):
    k_tm = shadow_key(key, round_index, m)
    rows = shadow_rows(jax.random.fold_in(k_tm, ROWS_SALT), pool_x.shape[0], size)
    sx, sy = pool_x[rows], pool_y[rows]

    def one_query(qid, qx, qy, qpool):
      k = jax.random.fold_in(k_tm, qid)
      position = insert_position(jax.random.fold_in(k, 0), rows, qpool)
      return in_loss(apply_fn, global_params, sx, sy, position, qx, qy,
                     key=jax.random.fold_in(k, 1), optimizer=optimizer, epochs=epochs,
                     batch_size=batch_size, hooks=hooks, mask=mask)

    loss, margin = jax.lax.map(lambda c: jax.vmap(one_query)(*c), chunks)
    return loss.reshape(-1)[:q], margin.reshape(-1)[:q]

  return jax.lax.map(one_model, jnp.arange(num_models))
