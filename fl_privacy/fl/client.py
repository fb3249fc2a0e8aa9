"""The client protocol: FedAvg plus hook points where defenses and mechanisms act.

A client in round t trains from the global parameters w_t on its shard and uploads its update
Delta = w_t - w_local (the sign FedAvg servers and the FedMIA paper use). A defense changes
what happens at one or more of these points, each a pure, jit-able function that receives its
own key:

| hook | when | signature | identity |
|---|---|---|---|
| `data` | once per round, on the whole shard | `(key, x, y, mask, aux) -> (x, y, mask)` | returns its inputs |
| `batch` | every local step, on the minibatch | `(key, x, y, mask, aux) -> (x, y, mask)` | returns its inputs |
| `loss` | every local step | `(key, loss_fn, params, x, y, mask, aux) -> scalar` | `loss_fn(params, x, y, mask)` |
| `grad` | every local step | `(key, per_example_grads, mask) -> grad` | None: gradient of the batch's mean loss |
| `upload` | once, after training | `(key, delta, aux) -> delta` | returns `delta` |
| `aggregate` | on the server, once per round | `(key, uploads, weights) -> mean update` | None: weighted mean |
| `batches` | once per round, after `data` | `(key, mask, *, epochs, batch_size) -> (indices [E, S, Bmax], row_masks [E, S, Bmax], step_masks [E, S])` | None: `local.masked_batch_order` (or `batch_order`) |
| `report` | on the server, once per round | `(num_examples [K]) -> reported [K]` | None: the real row counts |

`mask` marks the real rows of a padded shard or batch (1.0 real, 0.0 padding); `aux` is the
client's auxiliary pytree (for example a held-out batch a regulariser reads), or None. Labels
`y` are integer class indices [B] or, after a hook such as mixup, class distributions [B, C].

`grad` receives the per-example gradients of the step's (hooked) loss, each computed on its own
example, and turns them into the step's gradient: DP-SGD clips and noises them here. When it is
None the step differentiates the batch's mean loss directly, which is what plain FedAvg does
(and, with the other hooks at identity, reproduces `local.fedavg` without hooks bit for bit).

`batches` replaces the shuffled fixed-size minibatches by the sampler's (e.g. Poisson sampling
for DP-SGD, `sampling.poisson_sampler`). It always takes the masked path (a shard without a mask
gets an all-ones one); a step with `step_masks` 1 runs even when its row masks are all zero
(DP-SGD noises an empty batch too), a step with `step_masks` 0 is skipped.

`report` is what a client tells the server about its data beside its upload: the example count
FedAvg weighs it by (`rounds.run`). A real row count is a private number: a record-level
add/remove guarantee, or a client-level one, that the server's adversary is held to must not
reveal it, so DP-SGD's Poisson schedule and the client-level DP defenses against the server
report a public constant (`report_public`; a client with no rows still reports 0).

Keys (all from the client's round key `k_tk = fold_in(fold_in(run_key, t), k)`, see
`rounds.client_key`): minibatch j of epoch e uses `step_key(k_tk, e, j)` and gives `fold_in(., 0)` to
`batch`, `fold_in(., 1)` to `loss`, `fold_in(., 2)` to `grad`; `data` gets
`fold_in(k_tk, DATA_SALT)`, `upload` `fold_in(k_tk, UPLOAD_SALT)` and `batches`
`fold_in(k_tk, BATCHES_SALT)`. Shuffling uses
`fold_in(k_tk, epoch)` as before, and the salts are far above any epoch index, so no key is
used for two draws.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

# Salts for fold_in, chosen far above epoch indices (which also fold into the client key).
STEP_SALT = 0x7FFF0001
DATA_SALT = 0x7FFF0002
UPLOAD_SALT = 0x7FFF0003
BATCHES_SALT = 0x7FFF0004


def _identity_data(key, x, y, mask, aux):
  del key, aux
  return x, y, mask


def _identity_loss(key, loss_fn, params, x, y, mask, aux):
  del key, aux
  return loss_fn(params, x, y, mask) if mask is not None else loss_fn(params, x, y)


def _identity_upload(key, delta, aux):
  del key, aux
  return delta


class ClientHooks(NamedTuple):
  """The hook points of one client (see the module docstring for signatures).

  A NamedTuple of functions, so hooks are static under `jit` (close over parameters, or pass
  traced parameters through `aux`). Build one with `defenses.make(name, ...)` or by
  `ClientHooks(batch=...)`; combine several with `defenses.combine`.
  """
  data: Callable = _identity_data
  batch: Callable = _identity_data
  loss: Callable = _identity_loss
  grad: Callable | None = None
  upload: Callable = _identity_upload
  aggregate: Callable | None = None
  batches: Callable | None = None
  report: Callable | None = None


IDENTITY = ClientHooks()


def _report_constant(value, num_examples):
  n = jnp.asarray(num_examples)
  return jnp.where(n > 0, jnp.asarray(value, n.dtype), jnp.zeros_like(n))


def report_public(value: float) -> Callable:
  """A `report` hook: every client with rows reports `value` (a public count), one without
  rows 0. A `jax.tree_util.Partial` whose value is an operand, so a jitted training that takes
  the hooks' Partials as traced operands compiles once for every value."""
  return jax.tree_util.Partial(_report_constant, float(value))


def reported_sizes(hooks: 'ClientHooks', num_examples) -> jnp.ndarray:
  """The example counts the server weighs clients by: `hooks.report` of the real counts."""
  n = jnp.asarray(num_examples)
  return n if hooks.report is None else jnp.asarray(hooks.report(n), n.dtype)


def is_identity(hooks: ClientHooks) -> bool:
  """True when every hook is the default (plain FedAvg; a `batches` sampler is not)."""
  return hooks == IDENTITY


def step_key(client_key, epoch, step):
  """Key of minibatch `step` of local epoch `epoch`.

  `fold_in(fold_in(fold_in(client_key, STEP_SALT), epoch), step)`: keyed by (epoch, step)
  rather than a flat step count, so a client padded to more steps per epoch draws the same
  keys for its real steps as the unpadded client.
  """
  k = jax.random.fold_in(jax.random.fold_in(client_key, STEP_SALT), epoch)
  return jax.random.fold_in(k, step)


def data_key(client_key):
  """Key of the once-per-round `data` hook."""
  return jax.random.fold_in(client_key, DATA_SALT)


def upload_key(client_key):
  """Key of the `upload` hook."""
  return jax.random.fold_in(client_key, UPLOAD_SALT)


def batches_key(client_key):
  """Key of the `batches` sampler."""
  return jax.random.fold_in(client_key, BATCHES_SALT)


def update(global_params: Any, local_params: Any) -> Any:
  """The client's update Delta = w_t - w_local."""
  return jax.tree_util.tree_map(jnp.subtract, global_params, local_params)


def apply_update(global_params: Any, mean_update: Any) -> Any:
  """The server's step w_{t+1} = w_t - mean Delta (FedAvg with server learning rate 1)."""
  return jax.tree_util.tree_map(jnp.subtract, global_params, mean_update)
