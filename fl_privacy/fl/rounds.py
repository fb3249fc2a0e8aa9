"""The federated round loop: clients with hooks, uploads aggregated, observations reduced.

Round t: a fraction of the K clients is drawn (by key); every participant k trains from the
global parameters w_t with `local.client_update` and its round key `client_key(key, t, k)` (the
others do nothing); the server averages the participants' *uploads* (after the `upload` hook),
weighted by the example counts they report (their real rows, or the public count of a defense's
`report` hook), through the `aggregate` hook when there is one, and steps
w_{t+1} = w_t - mean upload. An `observe` function sees what the server sees, each
(round, client, upload), and its per-round result is folded into a running state by `reduce`
inside the loop, so T x K updates are never stacked in memory. Clients are vmapped (unequal
shards are padded, see `pad_clients`) and rounds are one `lax.scan`; to write something to
disk every few rounds, call `run` in segments with `first_round` (keys depend only on the
global round index, so a run split in pieces equals one run).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from fl_privacy.fl import aggregate
from fl_privacy.fl import client
from fl_privacy.fl import local
from fl_privacy.fl.losses import LossFn

# fold_in salts of the per-round server draws, far above any client index.
PARTICIPATION_SALT = 0x7FFF1001
SERVER_SALT = 0x7FFF1002
OBSERVE_SALT = 0x7FFF1003


class ClientData(NamedTuple):
  """K client shards stacked and padded to a common capacity N.

  Attributes:
    x: Inputs [K, N, ...].
    y: Labels [K, N].
    mask: [K, N] float32, 1 for real rows; None when every shard is full.
    aux: Per-client auxiliary pytree with leading axis K (e.g. a held-out set), or None.
  """
  x: Any
  y: Any
  mask: Any = None
  aux: Any = None

  @property
  def num_clients(self) -> int:
    return int(self.x.shape[0])

  def sizes(self) -> jnp.ndarray:
    """Real examples per client [K] (FedAvg's weights n_k)."""
    if self.mask is None:
      return jnp.full((self.x.shape[0],), self.x.shape[1], jnp.float32)
    return jnp.sum(jnp.asarray(self.mask, jnp.float32), axis=1)


def pad_clients(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], *, aux: Any = None,
                capacity: int | None = None) -> ClientData:
  """Stacks unequal shards, padding each with zero rows up to `capacity` (default: largest).

  Padding rows are zeros (finite, so masked terms are exactly 0) and carry mask 0. When all
  shards already have `capacity` rows the mask is None and training walks them exactly as
  unpadded shards (`local.batch_order`).

  Args:
    xs: K arrays [n_k, ...].
    ys: K arrays [n_k].
    aux: Optional per-client pytree already stacked on a leading K axis.
    capacity: N >= max n_k.

  Returns:
    `ClientData`.
  """
  if len(xs) != len(ys):
    raise ValueError(f'{len(xs)} input shards but {len(ys)} label shards')
  sizes = [len(x) for x in xs]
  if any(len(x) != len(y) for x, y in zip(xs, ys)):
    raise ValueError('every shard needs as many labels as inputs')
  if min(sizes) < 1:
    raise ValueError(f'every client needs at least one example (sizes {sizes})')
  capacity = max(sizes) if capacity is None else capacity
  if capacity < max(sizes):
    raise ValueError(f'capacity {capacity} is below the largest shard ({max(sizes)})')

  def pad(a, n):
    a = np.asarray(a)
    return np.concatenate([a, np.zeros((n - len(a),) + a.shape[1:], a.dtype)])

  x = np.stack([pad(a, capacity) for a in xs])
  y = np.stack([pad(a, capacity) for a in ys])
  if all(n == capacity for n in sizes):
    return ClientData(x=x, y=y, mask=None, aux=aux)
  mask = (np.arange(capacity)[None, :] < np.asarray(sizes)[:, None]).astype(np.float32)
  return ClientData(x=x, y=y, mask=mask, aux=aux)


def client_key(key, round_index, client_index):
  """Key of client k in round t: `fold_in(fold_in(key, t), k)`."""
  return jax.random.fold_in(jax.random.fold_in(key, round_index), client_index)


def _check_participation(fraction: float) -> None:
  if not 0 < fraction <= 1:
    raise ValueError(f'participation fraction must be in (0, 1] (got {fraction})')


def participant_indices(key, round_index, num_clients: int, fraction: float) -> jnp.ndarray:
  """The indices, in increasing order, of the max(1, round(fraction K)) clients that take part
  in round t, drawn uniformly without replacement with
  `fold_in(fold_in(key, t), PARTICIPATION_SALT)`, independent of the clients' own keys."""
  _check_participation(fraction)
  if fraction == 1:
    return jnp.arange(num_clients)
  count = max(1, int(round(fraction * num_clients)))
  k = jax.random.fold_in(jax.random.fold_in(key, round_index), PARTICIPATION_SALT)
  return jnp.sort(jax.random.permutation(k, num_clients)[:count])


def participants(key, round_index, num_clients: int, fraction: float) -> jnp.ndarray:
  """The clients that take part in round t as a bool [K]: `participant_indices` (all True when
  `fraction` is 1)."""
  _check_participation(fraction)
  if fraction == 1:
    return jnp.ones(num_clients, bool)
  chosen = participant_indices(key, round_index, num_clients, fraction)
  return jnp.zeros(num_clients, bool).at[chosen].set(True)


class Injected(NamedTuple):
  """Canary clients whose update the caller fixes (a training audit's canary clients).

  Injected client j (global index K + j) is a client of the round loop: it trains through
  `local.client_update` with its own round key `client_key(key, t, K + j)`, its shard being
  one row, the flattened `deltas[j]`, and its local training `local.canary_loss` (one SGD step
  at rate 1 whose update is `deltas[j]` to within the float rounding of w - (w - d), an ulp of
  w: Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning", ICLR 2024,
  arXiv:2302.03098, Sect. 3); its upload is the protocol's `upload` hook of that update, as for
  every client (the per-step hooks, which shape a real shard's training, do not act on it).
  The server weighs it by its reported `sizes[j]` (`client.reported_sizes`), its `aggregate`
  hook sees it, `observe` sees its upload.

  Attributes:
    deltas: pytree like the parameters with leading axis J.
    sizes: [J] the example counts the injected clients have (0 keeps a client out of every
      weighted mean and of DP-FedAvg's participants).
    always: False: drawn by the round's participation among all K + J clients, like the real
      ones; True: every canary takes part in every round and the participation fraction draws
      the real clients only (the server's own choice, which a declaration against the server
      allows: it picks who takes part).
  """
  deltas: Any
  sizes: Any
  always: bool = False


class RoundsLog(NamedTuple):
  """What `run` returns beside the final parameters.

  Attributes:
    observed: the final `reduce` state (None without `observe`).
    evaluations: `evaluate(w_{t+1})` per round, leading axis T (None without `evaluate`).
    participants: bool [T, K].
  """
  observed: Any
  evaluations: Any
  participants: Any


def _keep_last(state, round_index, seen, part):
  del state, round_index, part
  return seen


def _take(tree, idx):
  return jax.tree_util.tree_map(lambda a: a[idx], tree)


def run(loss_fn: LossFn, params: Any, clients: ClientData, *, key, num_rounds: int,
        optimizer: optax.GradientTransformation | Callable[[Any], optax.GradientTransformation],
        epochs: int, batch_size: int, shuffle: bool = True,
        hooks: client.ClientHooks | None = None, participation: float = 1.0,
        observe: Callable[..., Any] | None = None,
        reduce: Callable[[Any, Any, Any, Any], Any] | None = None, init: Any = None,
        evaluate: Callable[[Any], Any] | None = None,
        first_round: int = 0, injected: Injected | None = None,
        trace: Callable[[local.Step], Any] | None = None) -> tuple[Any, RoundsLog]:
  """Runs rounds first_round .. first_round + num_rounds - 1 of FedAvg with hooks.

  Only the clients that take part train: with `participation` < 1 the round's participants
  (`participant_indices`, a fixed count) are gathered and trained, the others neither train nor
  upload. (When canaries are drawn with the real clients, each drawn slot runs both a real
  training and a canary's, on a clipped index, and keeps the one its index names: the count
  of each kind is not static. The discarded one has no effect.) The server weighs each upload
  by the example count its client reports (`client.reported_sizes`: the real rows, or a public
  count a defense's `report` hook gives).

  Args:
    loss_fn: `loss_fn(params, x, y, mask=None) -> scalar` (see `losses.make_loss_fn`).
    params: Global parameters w_{first_round}.
    clients: `ClientData` (use `pad_clients` for unequal shards).
    key: Run key; client k of round t uses `client_key(key, t, k)`.
    num_rounds: T (static).
    optimizer: The clients' optax optimizer, or `t -> optimizer` for a per-round schedule
      (t traced), e.g. a cosine learning rate over rounds. State is fresh every round.
    epochs: Local epochs E.
    batch_size: B.
    shuffle: Reshuffle every epoch.
    hooks: `fl.client.ClientHooks` of every client (None: plain FedAvg).
    participation: Fraction of clients per round, in (0, 1].
    observe: `observe(key, t, k, global_params, upload) -> pytree` (with `trace`, also the
      client's stacked traces as a sixth argument; an injected client's are zeros), vmapped
      over the round's participants (key is `fold_in(client_key, OBSERVE_SALT)`); the [K, ...]
      result, zeros for the clients that did not take part, is passed to `reduce`.
    reduce: `reduce(state, t, seen [K, ...], participants [K]) -> state`, starting from
      `init`; default keeps the last round's observations.
    init: Initial `reduce` state (must have the shape `reduce` returns; for the default it
      must be like one round of observations, e.g. from `jax.eval_shape`).
    evaluate: `evaluate(params) -> pytree` of the new global model after every round (e.g.
      test accuracy); stacked over rounds.
    first_round: Global index of the first round, so that a run in segments equals one run.
    injected: `Injected` clients K .. K + J - 1 (a training audit's canary clients), or None.
      `observe`'s and `reduce`'s client axis and `participants` then have K + J entries.
    trace: `local.Step -> pytree`, handed to every real client's `local.fedavg` (see there);
      the stacked traces go to `observe`.

  Returns:
    (w_{first_round + T}, `RoundsLog`).
  """
  hooks = client.IDENTITY if hooks is None else hooks
  _check_participation(participation)  # here too: `participants` is called only below 1
  num_clients = clients.num_clients
  if jnp.shape(clients.y)[0] != num_clients:
    raise ValueError(f'clients.x has {num_clients} clients, clients.y '
                     f'{jnp.shape(clients.y)[0]}')
  if observe is not None and reduce is None:
    reduce = _keep_last
    if init is None:
      raise ValueError('observe without reduce needs `init` shaped like one round of '
                       'observations')
  sizes = clients.sizes()
  num_injected = 0
  canary_rows = None
  if injected is not None:
    num_injected = int(jnp.shape(injected.sizes)[0])
    sizes = jnp.concatenate([sizes, jnp.asarray(injected.sizes, sizes.dtype)])
    canary_rows = jax.vmap(lambda d: flatten_util.ravel_pytree(d)[0])(injected.deltas)[:, None]
  reported = client.reported_sizes(hooks, sizes)
  total = num_clients + num_injected
  ids = jnp.arange(total)
  per_round_optimizer = not isinstance(optimizer, optax.GradientTransformation)
  always = injected is not None and bool(injected.always)

  def real_update(global_params, opt, t, x, y, mask, aux, k):
    out = local.client_update(
        loss_fn, global_params, x, y, key=client_key(key, t, k), hooks=hooks, mask=mask,
        aux=aux, optimizer=opt, epochs=epochs, batch_size=batch_size, shuffle=shuffle,
        trace=trace)
    return (out[0], None) if trace is None else (out[0], out[2])

  # A canary's shard is its update: the per-step hooks that shape a real shard's training
  # (data, batch, loss, grad, a sampler) have nothing to act on; its upload hook and keys are
  # every client's.
  canary_hooks = client.ClientHooks(upload=hooks.upload)

  def canary_update(global_params, t, row, k):
    upload, _ = local.client_update(
        local.canary_loss, global_params, row, jnp.zeros((1,), jnp.int32),
        key=client_key(key, t, k), hooks=canary_hooks, optimizer=local.CANARY_OPTIMIZER,
        epochs=local.CANARY_EPOCHS, batch_size=local.CANARY_BATCH)
    return upload

  def real_in_axes():
    return (0, 0, None if clients.mask is None else 0, None if clients.aux is None else 0, 0)

  def all_real(global_params, opt, t):
    return jax.vmap(lambda *a: real_update(global_params, opt, t, *a),
                    in_axes=real_in_axes())(clients.x, clients.y, clients.mask, clients.aux,
                                            ids[:num_clients])

  def gathered_real(global_params, opt, t, idx):
    # idx may hold canary indices (>= K): their real training runs on a clipped index and is
    # discarded by `mixed`.
    r = jnp.minimum(idx, num_clients - 1)
    mask = None if clients.mask is None else jnp.asarray(clients.mask)[r]
    aux = None if clients.aux is None else _take(clients.aux, r)
    return jax.vmap(lambda *a: real_update(global_params, opt, t, *a),
                    in_axes=real_in_axes())(jnp.asarray(clients.x)[r], jnp.asarray(clients.y)[r],
                                            mask, aux, idx)

  def canaries_at(global_params, t, idx):
    j = jnp.clip(idx - num_clients, 0, num_injected - 1)
    return jax.vmap(lambda row, k: canary_update(global_params, t, row, k))(canary_rows[j], idx)

  def concat(a, b):
    return jax.tree_util.tree_map(lambda u, v: jnp.concatenate([u, v.astype(u.dtype)]), a, b)

  def zero_traces(traces, count):
    return jax.tree_util.tree_map(lambda a: jnp.zeros((count,) + a.shape[1:], a.dtype), traces)

  def one_round(carry, t):
    global_params, state = carry
    opt = optimizer(t) if per_round_optimizer else optimizer
    if participation == 1:
      idx = ids
      uploads, traces = all_real(global_params, opt, t)
      if injected is not None:
        uploads = concat(uploads, canaries_at(global_params, t, ids[num_clients:]))
        if trace is not None:
          traces = concat(traces, zero_traces(traces, num_injected))
    elif always:
      real_idx = participant_indices(key, t, num_clients, participation)
      idx = jnp.concatenate([real_idx, ids[num_clients:]])
      uploads, traces = gathered_real(global_params, opt, t, real_idx)
      uploads = concat(uploads, canaries_at(global_params, t, ids[num_clients:]))
      if trace is not None:
        traces = concat(traces, zero_traces(traces, num_injected))
    else:
      idx = participant_indices(key, t, total, participation)
      uploads, traces = gathered_real(global_params, opt, t, idx)
      if injected is not None:
        is_real = idx < num_clients
        mixed = canaries_at(global_params, t, idx)
        uploads = jax.tree_util.tree_map(
            lambda a, b: jnp.where(is_real.reshape((-1,) + (1,) * (a.ndim - 1)), a,
                                   b.astype(a.dtype)), uploads, mixed)
        if trace is not None:
          traces = jax.tree_util.tree_map(
              lambda a: jnp.where(is_real.reshape((-1,) + (1,) * (a.ndim - 1)), a, 0), traces)
    part = jnp.zeros(total, bool).at[idx].set(True)
    weights = reported[idx]
    if hooks.aggregate is None:
      mean_update = aggregate.weighted_mean(uploads, weights)
    else:
      server_key = jax.random.fold_in(jax.random.fold_in(key, t), SERVER_SALT)
      mean_update = hooks.aggregate(server_key, uploads, weights)
    new_params = client.apply_update(global_params, mean_update)
    if observe is not None:
      obs_keys = jax.vmap(lambda k: jax.random.fold_in(client_key(key, t, k),
                                                       OBSERVE_SALT))(idx)
      if trace is None:
        seen = jax.vmap(observe, in_axes=(0, None, 0, None, 0))(obs_keys, t, idx,
                                                                 global_params, uploads)
      else:
        seen = jax.vmap(observe, in_axes=(0, None, 0, None, 0, 0))(
            obs_keys, t, idx, global_params, uploads, traces)
      if participation != 1:
        seen = jax.tree_util.tree_map(
            lambda a: jnp.zeros((total,) + a.shape[1:], a.dtype).at[idx].set(a), seen)
      state = reduce(state, t, seen, part)
    evaluation = evaluate(new_params) if evaluate is not None else None
    return (new_params, state), (evaluation, part)

  rounds = first_round + jnp.arange(num_rounds)
  (final, state), (evaluations, parts) = jax.lax.scan(one_round, (params, init), rounds)
  return final, RoundsLog(observed=state if observe is not None else None,
                          evaluations=evaluations, participants=parts)
