"""The federated round loop, recording what the server sees.

Round t: every client k starts from the global parameters w_t, runs `local_fn`
with key `fold_in(fold_in(key, t), k)`, the server observes each client's
result, and aggregates the local parameters into w_{t+1}. Clients are vmapped,
rounds are one `lax.scan`, so memory holds the observations of all rounds: pick
an `observe` that keeps only what an attack needs when models are large.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from fl_privacy.fl import aggregate
from fl_privacy.fl.losses import LossFn


def observe_update(global_params: Any, local_params: Any, round_index) -> Any:
  """The client's update Delta = w_t - w_local (what FedAvg uploads)."""
  del round_index
  return jax.tree_util.tree_map(jnp.subtract, global_params, local_params)


def client_key(key, round_index, client_index):
  """Key of client k in round t: `fold_in(fold_in(key, t), k)`."""
  return jax.random.fold_in(jax.random.fold_in(key, round_index), client_index)


def run(loss_fn: LossFn, params: Any, client_x: jnp.ndarray,
        client_y: jnp.ndarray, *, key, num_rounds: int,
        local_fn: Callable[..., Any],
        aggregate_fn: Callable[[Any], Any] = aggregate.mean,
        observe: Callable[[Any, Any, Any], Any] = observe_update,
        round_kwargs: Callable[[Any], dict] | None = None,
        first_round: int = 0) -> tuple[Any, Any]:
  """Runs `num_rounds` FL rounds in which every client participates.

  Args:
    loss_fn: `loss_fn(params, x, y) -> scalar`.
    params: Initial global parameters w_0.
    client_x: Client inputs stacked [K, N, ...].
    client_y: Client labels [K, N].
    key: Run key; client k of round t trains with `client_key(key, t, k)`.
    num_rounds: T (static).
    local_fn: `local_fn(loss_fn, params, x, y, *, key, **round_kwargs(t))
      -> local params`, e.g. `functools.partial(local.fedavg,
      optimizer=..., epochs=1, batch_size=32)`.
    aggregate_fn: Stacked local params [K, ...] -> new global params, e.g.
      `functools.partial(aggregate.weighted_mean, weights=sizes)`.
    observe: `observe(global_params, local_params, t) -> pytree`, per client
      (vmapped); default the update w_t - w_local.
    round_kwargs: Optional `t -> dict` of extra keyword arguments for
      `local_fn` in round t (t is traced), e.g. a per-round learning rate:
      `lambda t: {'optimizer': optimizers.make('momentum', cosine(t))}`.
    first_round: Index of the first round, so that a run split in pieces draws
      the same keys as one run.

  Returns:
    `(final_params, observations)`: observations have leading axes
    [num_rounds, K, ...].
  """
  num_clients = client_x.shape[0]
  if client_y.shape[0] != num_clients:
    raise ValueError(f'client_x has {num_clients} clients, client_y '
                     f'{client_y.shape[0]}')
  clients = jnp.arange(num_clients)

  def one_round(global_params, round_index):
    extra = round_kwargs(round_index) if round_kwargs is not None else {}

    def one_client(x, y, k):
      local_params = local_fn(loss_fn, global_params, x, y,
                              key=client_key(key, round_index, k), **extra)
      return local_params, observe(global_params, local_params, round_index)

    local_params, seen = jax.vmap(one_client)(client_x, client_y, clients)
    return aggregate_fn(local_params), seen

  rounds = first_round + jnp.arange(num_rounds)
  return jax.lax.scan(one_round, params, rounds)
