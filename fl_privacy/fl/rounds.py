"""The federated round loop: clients with hooks, uploads aggregated, observations reduced.

Round t: a fraction of the K clients is drawn (by key); every client k trains from the global
parameters w_t with `local.client_update` and its round key `client_key(key, t, k)`; the
server averages the participants' *uploads* (after the `upload` hook), weighted by their
number of real examples, through the `aggregate` hook when there is one, and steps
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


def participants(key, round_index, num_clients: int, fraction: float) -> jnp.ndarray:
  """The clients that take part in round t: exactly max(1, round(fraction K)), uniformly.

  Drawn with `fold_in(fold_in(key, t), PARTICIPATION_SALT)`, independent of the clients'
  own keys. Returns a bool [K] (all True when `fraction` is 1).
  """
  _check_participation(fraction)
  if fraction == 1:
    return jnp.ones(num_clients, bool)
  count = max(1, int(round(fraction * num_clients)))
  k = jax.random.fold_in(jax.random.fold_in(key, round_index), PARTICIPATION_SALT)
  chosen = jax.random.permutation(k, num_clients)[:count]
  return jnp.zeros(num_clients, bool).at[chosen].set(True)


class Injected(NamedTuple):
  """Clients whose raw update the caller fixes: the canary clients of a training audit.

  Injected client j (global index K + j) takes part in the round loop like any client: it is
  drawn by `participants` among all K + J clients, its update goes through the protocol's
  `upload` hook with its own key (`client.upload_key(client_key(key, t, K + j))`, aux None),
  the server weighs it by `sizes[j]` and its `aggregate` hook sees it, and `observe` sees its
  upload. Only its local training is replaced: its update before the upload hook is
  `deltas[j]`, every round (Andrew et al., "One-shot Empirical Privacy Estimation for Federated
  Learning", ICLR 2024, arXiv:2302.03098, Sect. 3: a canary client's update is a fixed
  direction).

  Attributes:
    deltas: pytree like the parameters with leading axis J.
    sizes: [J] the example counts the injected clients report (FedAvg's weights n_j; 0 keeps
      a client out of every weighted mean and of DP-FedAvg's participants).
  """
  deltas: Any
  sizes: Any


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


def run(loss_fn: LossFn, params: Any, clients: ClientData, *, key, num_rounds: int,
        optimizer: optax.GradientTransformation | Callable[[Any], optax.GradientTransformation],
        epochs: int, batch_size: int, shuffle: bool = True,
        hooks: client.ClientHooks | None = None, participation: float = 1.0,
        observe: Callable[..., Any] | None = None,
        reduce: Callable[[Any, Any, Any, Any], Any] | None = None, init: Any = None,
        evaluate: Callable[[Any], Any] | None = None,
        first_round: int = 0, injected: Injected | None = None) -> tuple[Any, RoundsLog]:
  """Runs rounds first_round .. first_round + num_rounds - 1 of FedAvg with hooks.

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
    observe: `observe(key, t, k, global_params, upload) -> pytree`, vmapped over clients (key
      is `fold_in(client_key, OBSERVE_SALT)`); its [K, ...] result is passed to `reduce`.
    reduce: `reduce(state, t, seen [K, ...], participants [K]) -> state`, starting from
      `init`; default keeps the last round's observations.
    init: Initial `reduce` state (must have the shape `reduce` returns; for the default it
      must be like one round of observations, e.g. from `jax.eval_shape`).
    evaluate: `evaluate(params) -> pytree` of the new global model after every round (e.g.
      test accuracy); stacked over rounds.
    first_round: Global index of the first round, so that a run in segments equals one run.
    injected: `Injected` clients K .. K + J - 1 (a training audit's canary clients), or None.
      `observe`'s and `reduce`'s client axis and `participants` then have K + J entries.

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
  if injected is not None:
    num_injected = int(jnp.shape(injected.sizes)[0])
    sizes = jnp.concatenate([sizes, jnp.asarray(injected.sizes, sizes.dtype)])
  total = num_clients + num_injected
  ids = jnp.arange(total)
  per_round_optimizer = not isinstance(optimizer, optax.GradientTransformation)

  def one_round(carry, t):
    global_params, state = carry
    opt = optimizer(t) if per_round_optimizer else optimizer

    def one_client(x, y, mask, aux, k):
      upload, _ = local.client_update(
          loss_fn, global_params, x, y, key=client_key(key, t, k), hooks=hooks, mask=mask,
          aux=aux, optimizer=opt, epochs=epochs, batch_size=batch_size, shuffle=shuffle)
      return upload

    in_axes = (0, 0, None if clients.mask is None else 0,
               None if clients.aux is None else 0, 0)
    uploads = jax.vmap(one_client, in_axes=in_axes)(clients.x, clients.y, clients.mask,
                                                    clients.aux, ids[:num_clients])
    if injected is not None:
      injected_uploads = jax.vmap(
          lambda d, j: hooks.upload(client.upload_key(client_key(key, t, j)), d, None))(
              injected.deltas, ids[num_clients:])
      uploads = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b.astype(a.dtype)]),
                                       uploads, injected_uploads)
    part = (participants(key, t, total, participation) if participation < 1
            else jnp.ones(total, bool))
    weights = sizes * part.astype(sizes.dtype)
    if hooks.aggregate is None:
      mean_update = aggregate.weighted_mean(uploads, weights)
    else:
      server_key = jax.random.fold_in(jax.random.fold_in(key, t), SERVER_SALT)
      mean_update = hooks.aggregate(server_key, uploads, weights)
    new_params = client.apply_update(global_params, mean_update)
    if observe is not None:
      obs_keys = jax.vmap(lambda k: jax.random.fold_in(client_key(key, t, k),
                                                       OBSERVE_SALT))(ids)
      seen = jax.vmap(observe, in_axes=(0, None, 0, None, 0))(obs_keys, t, ids,
                                                               global_params, uploads)
      state = reduce(state, t, seen, part)
    evaluation = evaluate(new_params) if evaluate is not None else None
    return (new_params, state), (evaluation, part)

  rounds = first_round + jnp.arange(num_rounds)
  (final, state), (evaluations, parts) = jax.lax.scan(one_round, (params, init), rounds)
  return final, RoundsLog(observed=state if observe is not None else None,
                          evaluations=evaluations, participants=parts)
