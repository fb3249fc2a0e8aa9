"""Client-side training: FedSGD and FedAvg (McMahan et al., 2017).

All functions are pure and take their key, so a batch of independent clients is
`jax.vmap` over stacked data and keys.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.flatten_util  # pylint: disable=unused-import
import jax.numpy as jnp
import optax

from fl_privacy.fl import client
from fl_privacy.fl.losses import LossFn


def fedsgd(loss_fn: LossFn, params: Any, x: jnp.ndarray,
           y: jnp.ndarray) -> Any:
  """FedSGD: the client's full-batch gradient at the global `params`."""
  return jax.grad(loss_fn)(params, x, y)


def fedsgd_step(loss_fn: LossFn, params: Any, x: jnp.ndarray, y: jnp.ndarray,
                *, key=None, learning_rate) -> Any:
  """Local params after one full-batch SGD step (FedSGD as a `local_fn`).

  Args:
    loss_fn: `loss_fn(params, x, y) -> scalar`.
    params: Global parameters.
    x: Client inputs [N, ...].
    y: Client labels [N].
    key: Unused; accepted so that this fits `rounds.run`'s `local_fn`.
    learning_rate: Step size.

  Returns:
    `params - learning_rate * fedsgd(...)`.
  """
  del key
  grads = fedsgd(loss_fn, params, x, y)
  return jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params,
                                grads)


def batch_order(key, num_examples: int, *, epochs: int, batch_size: int,
                shuffle: bool = True) -> jnp.ndarray:
  """Example indices of every local step, [epochs * J, batch_size].

  J = num_examples // batch_size minibatches per epoch; epoch e uses the
  permutation drawn with `fold_in(key, e)` (identity order when not shuffling)
  and drops its last `num_examples % batch_size` entries.

  Args:
    key: Client key.
    num_examples: N.
    epochs: E.
    batch_size: B, at most N.
    shuffle: Whether each epoch draws a fresh permutation.

  Returns:
    int32 indices [E * J, B].
  """
  if not 0 < batch_size <= num_examples:
    raise ValueError(f'batch_size must be in [1, {num_examples}] '
                     f'(got {batch_size})')
  if epochs < 1:
    raise ValueError(f'epochs must be >= 1 (got {epochs})')
  steps = num_examples // batch_size
  used = steps * batch_size

  def one_epoch(epoch):
    if shuffle:
      order = jax.random.permutation(jax.random.fold_in(key, epoch),
                                     num_examples)
    else:
      order = jnp.arange(num_examples)
    return order[:used].reshape(steps, batch_size)

  orders = jax.vmap(one_epoch)(jnp.arange(epochs))
  return orders.reshape(epochs * steps, batch_size).astype(jnp.int32)


def masked_batch_order(key, mask: jnp.ndarray, *, epochs: int, batch_size: int,
                       shuffle: bool = True) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Example indices and row masks of every local step of a padded shard.

  The real rows (mask 1) of the shard are walked in a fresh random order each epoch, in
  ceil(capacity / B) minibatches of B slots; the last real minibatch may be partial (it trains,
  as PyTorch's DataLoader does by default) and later ones are empty (the step is skipped). The
  order of real rows depends only on the real rows: row i gets the sort key
  `bits(fold_in(fold_in(key, epoch), rank_i))`, so a shard padded to any capacity yields the same
  minibatches of real rows as the unpadded shard, and the same (epoch, step) positions.
  (Sort keys are indexed by a row's rank among the real rows, so padding may sit anywhere.)

  Args:
    key: Client key.
    mask: [capacity] 1.0 for real rows, 0.0 for padding (real rows need not come first).
    epochs: E.
    batch_size: B.
    shuffle: Fresh order each epoch; False walks the real rows in index order.

  Returns:
    (indices int32 [E, S, B], row masks float32 [E, S, B]) with S = ceil(capacity / B).
  """
  if batch_size < 1:
    raise ValueError(f'batch_size must be >= 1 (got {batch_size})')
  if epochs < 1:
    raise ValueError(f'epochs must be >= 1 (got {epochs})')
  capacity = mask.shape[0]
  steps = -(-capacity // batch_size)
  slots = steps * batch_size
  real = mask > 0
  num_real = jnp.sum(real.astype(jnp.int32))
  rows = jnp.arange(capacity, dtype=jnp.int32)
  # A real row's rank among the real rows: the same whether and where padding sits.
  rank = jnp.cumsum(real.astype(jnp.int32)) - 1

  def one_epoch(epoch):
    if shuffle:
      epoch_key = jax.random.fold_in(key, epoch)
      u = jax.vmap(lambda i: jax.random.bits(jax.random.fold_in(epoch_key, i), (),
                                             jnp.uint32))(rank)
    else:
      u = rank.astype(jnp.uint32)
    # Real rows first (padding flag 0), in the order of their keys; ties broken by index.
    _, _, order = jax.lax.sort((jnp.where(real, 0, 1).astype(jnp.int32), u, rows),
                               num_keys=3)
    order = jnp.concatenate([order, jnp.zeros(slots - capacity, jnp.int32)])
    valid = (jnp.arange(slots) < num_real).astype(jnp.float32)
    return order.reshape(steps, batch_size), valid.reshape(steps, batch_size)

  return jax.vmap(one_epoch)(jnp.arange(epochs))


def _select(flag, new, old):
  return jax.tree_util.tree_map(lambda a, b: jnp.where(flag, a, b), new, old)


class Step(NamedTuple):
  """What a `trace` function sees of one local step (`fedavg`): an instrument for audits that
  read every noisy step (the white-box adversary of DP-SGD, Nasr et al. 2023) and for side
  channels (how many steps ran).

  Attributes:
    key: the step's key (`client.step_key`).
    params: the parameters the step starts from.
    indices: [W] the shard rows of the step's batch (W = B, or the sampler's slots).
    row_mask: [W] 1.0 for the batch's real rows (after the `batch` hook).
    per_example: per-example gradients [W, ...] the `grad` hook received (None without one).
    grad: the step's gradient (the `grad` hook's output, e.g. DP-SGD's noisy mean).
    live: 1.0 when the step ran (changed the parameters), 0.0 for a skipped padding step.
  """
  key: Any
  params: Any
  indices: Any
  row_mask: Any
  per_example: Any
  grad: Any
  live: Any


def fedavg(loss_fn: LossFn, params: Any, x: jnp.ndarray, y: jnp.ndarray, *,
           key, optimizer: optax.GradientTransformation, epochs: int,
           batch_size: int, shuffle: bool = True,
           hooks: client.ClientHooks | None = None, mask: jnp.ndarray | None = None,
           aux: Any = None, trace: Callable[[Step], Any] | None = None) -> Any:
  """FedAvg client update: E epochs of minibatch training from `params`.

  Algorithm 1 (ClientUpdate) of McMahan et al. (2017), with any optax
  optimizer: each epoch splits the N examples into J = N // B minibatches of
  size B (see `batch_order`), one optimizer step per minibatch, E * J steps in
  one `lax.scan`. The optimizer state starts fresh on each call, as a client
  re-creates its optimizer every round in the seed papers' code. Vmappable over
  clients (stack `x`, `y` and keys).

  With `mask` (a padded shard, see `masked_batch_order`) every real row trains, the last
  minibatch of an epoch may be partial, and empty minibatches leave the parameters and the
  optimizer state untouched; without it the shard is walked as `batch_order` says (the last
  N mod B rows of each epoch's permutation sit out), exactly as before hooks existed.

  A `batches` hook (e.g. `sampling.poisson_sampler`) replaces `masked_batch_order` after the
  `data` hook (a shard without `mask` gets an all-ones one); its real steps (`step_masks` 1)
  run even when no row is selected, the others are skipped; `shuffle` does not apply.

  `hooks` (see `fl.client`) act at the `data`, `batch`, `loss` and `grad` points; the
  `upload` and `aggregate` points belong to `client_update` and the round loop. With identity
  hooks the result is bit for bit that of plain FedAvg.

  Args:
    loss_fn: `loss_fn(params, x, y[, mask]) -> scalar` (a mean over the batch; the mask
      argument is needed with `mask` or hooks, as `losses.make_loss_fn` provides).
    params: Global parameters the client starts from.
    x: Client inputs [N, ...].
    y: Client labels [N].
    key: Client key (shuffling and hooks).
    optimizer: optax transformation, e.g. from `optimizers.make`.
    epochs: E (static).
    batch_size: B (static).
    shuffle: Fresh permutation each epoch; False walks the data in order.
    hooks: `fl.client.ClientHooks`; None is plain FedAvg.
    mask: Optional [N] float mask of real rows.
    aux: The client's auxiliary pytree, handed to the hooks.
    trace: Optional `trace(Step) -> pytree`, called at every local step (padding steps
      included, with `live` 0); its results are stacked over the E x S steps. It observes and
      changes nothing.

  Returns:
    The client's local parameters after training; with `trace`, (parameters, traces).
  """
  hooks = client.IDENTITY if hooks is None else hooks
  x, y = jnp.asarray(x), jnp.asarray(y)
  mask = None if mask is None else jnp.asarray(mask, jnp.float32)
  if client.is_identity(hooks) and mask is None and trace is None:
    order = batch_order(key, x.shape[0], epochs=epochs, batch_size=batch_size,
                        shuffle=shuffle)
    grad_fn = jax.grad(loss_fn)

    def step(carry, idx):
      p, state = carry
      updates, state = optimizer.update(grad_fn(p, x[idx], y[idx]), state, p)
      return (optax.apply_updates(p, updates), state), None

    (params, _), _ = jax.lax.scan(step, (params, optimizer.init(params)), order)
    return params

  if hooks.data is not client.IDENTITY.data:
    mask = jnp.ones(x.shape[0], jnp.float32) if mask is None else mask
    x, y, mask = hooks.data(client.data_key(key), x, y, mask, aux)
  step_masks = None
  if hooks.batches is not None:
    # The sampler's minibatches always take the masked path.
    mask = jnp.ones(x.shape[0], jnp.float32) if mask is None else mask
    order, row_masks, step_masks = hooks.batches(client.batches_key(key), mask,
                                                 epochs=epochs, batch_size=batch_size)
    steps = order.shape[1]
  elif mask is None:
    # Unpadded shard: the plain order, every step real.
    order = batch_order(key, x.shape[0], epochs=epochs, batch_size=batch_size,
                        shuffle=shuffle)
    steps = order.shape[0] // epochs
    order = order.reshape(epochs, steps, batch_size)
    row_masks = None
  else:
    order, row_masks = masked_batch_order(key, mask, epochs=epochs,
                                          batch_size=batch_size, shuffle=shuffle)
    steps = order.shape[1]
  positions = jnp.stack(jnp.meshgrid(jnp.arange(epochs), jnp.arange(steps),
                                     indexing='ij'), axis=-1).reshape(-1, 2)
  width = order.shape[-1]  # B, or the sampler's slot count
  order = order.reshape(epochs * steps, width)
  if row_masks is not None:
    row_masks = row_masks.reshape(epochs * steps, width)

  def batch_loss(p, k, xb, yb, mb):
    return hooks.loss(k, loss_fn, p, xb, yb, mb, aux)

  def step_grad(p, k, xb, yb, mb):
    """(the step's gradient, the per-example gradients the `grad` hook saw or None)."""
    k_loss, k_grad = jax.random.fold_in(k, 1), jax.random.fold_in(k, 2)
    if hooks.grad is None:
      return jax.grad(batch_loss)(p, k_loss, xb, yb, mb), None
    mb_rows = jnp.ones(xb.shape[0], jnp.float32) if mb is None else mb

    def one(xi, yi, mi):
      return jax.grad(batch_loss)(p, k_loss, xi[None], yi[None], mi[None])

    per_example = jax.vmap(one)(xb, yb, mb_rows)
    return hooks.grad(k_grad, per_example, mb_rows), per_example

  def step(carry, inputs):
    p, state = carry
    if row_masks is None:
      idx, pos = inputs
      mb = None
    elif step_masks is None:
      idx, pos, mb = inputs
    else:
      idx, pos, mb, live = inputs
    k = client.step_key(key, pos[0], pos[1])
    xb, yb, mb = hooks.batch(jax.random.fold_in(k, 0), x[idx], y[idx], mb, aux)
    g, per_example = step_grad(p, k, xb, yb, mb)
    updates, new_state = optimizer.update(g, state, p)
    new_p = optax.apply_updates(p, updates)
    real = jnp.asarray(True)
    if mb is not None:
      # A sampler's real step runs even on an empty batch (DP-SGD still adds its noise).
      real = jnp.any(mb > 0) if step_masks is None else live > 0
      new_p, new_state = _select(real, new_p, p), _select(real, new_state, state)
    seen = None
    if trace is not None:
      rows = jnp.ones(idx.shape[0], jnp.float32) if mb is None else mb
      seen = trace(Step(key=k, params=p, indices=idx, row_mask=rows, per_example=per_example,
                        grad=g, live=real.astype(jnp.float32)))
    return (new_p, new_state), seen

  if row_masks is None:
    xs = (order, positions)
  elif step_masks is None:
    xs = (order, positions, row_masks)
  else:
    xs = (order, positions, row_masks, step_masks.reshape(epochs * steps))
  (params, _), traces = jax.lax.scan(step, (params, optimizer.init(params)), xs)
  return params if trace is None else (params, traces)


def client_update(loss_fn: LossFn, params: Any, x: jnp.ndarray, y: jnp.ndarray, *,
                  key, hooks: client.ClientHooks | None = None,
                  mask: jnp.ndarray | None = None, aux: Any = None,
                  trace: Callable[[Step], Any] | None = None, **fedavg_kw) -> tuple:
  """One client's round: `fedavg` with hooks, then the `upload` hook on Delta.

  Args:
    loss_fn, params, x, y, key, hooks, mask, aux, trace: as in `fedavg`.
    **fedavg_kw: `optimizer`, `epochs`, `batch_size`, `shuffle`.

  Returns:
    (upload, local_params): the (possibly transformed) update Delta = w_t - w_local the
    server receives, and the client's trained parameters; with `trace`, (upload,
    local_params, traces).
  """
  hooks = client.IDENTITY if hooks is None else hooks
  trained = fedavg(loss_fn, params, x, y, key=key, hooks=hooks, mask=mask, aux=aux,
                   trace=trace, **fedavg_kw)
  local, traces = (trained, None) if trace is None else trained
  delta = client.update(params, local)
  upload = hooks.upload(client.upload_key(key), delta, aux)
  return (upload, local) if trace is None else (upload, local, traces)


def canary_loss(params: Any, x: jnp.ndarray, y: jnp.ndarray, mask: jnp.ndarray | None = None
                ) -> jnp.ndarray:
  """A canary client's local loss: <d, w> for the flattened parameters w and the canary's
  update d, handed in as its one input row (x [1, P]). Its gradient is d whatever w, so one
  step of SGD at rate 1 (`CANARY_OPTIMIZER`, `CANARY_EPOCHS`, `CANARY_BATCH`) gives the update
  Delta = w - (w - d) = d, to within the float rounding of w - d (an ulp of w): a canary
  client trains through `client_update` like any client and its upload is the defense's
  `upload` hook of that update (Andrew et al., ICLR 2024, arXiv:2302.03098, Sect. 3: a canary
  client's update is a fixed direction)."""
  del y, mask
  flat = jax.flatten_util.ravel_pytree(params)[0]
  return jnp.vdot(x[0].astype(flat.dtype), flat)


CANARY_OPTIMIZER = optax.sgd(1.0)
CANARY_EPOCHS = 1
CANARY_BATCH = 1
