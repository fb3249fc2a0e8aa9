"""What a passive server can measure on query examples from one round's uploads.

FedMIA (Zhu et al., "FedMIA: An Effective Membership Inference Attack Exploiting 'All for One'
Principle in Federated Learning", CVPR 2025, arXiv:2402.06289) and the attacks it compares
against score a query (x, y) against every client's update Delta_k = w_t - w_local_k of a round
(the sign `fl.client` uses). `measure` computes, for all K updates and Q queries at once:

| name | shape | definition |
|---|---|---|
| `loss` | [K, Q] | float32 cross-entropy of (x, y) under the local model w_t - Delta_k (kept for reference: it rounds to 0 from a margin of about 14.5, so Blackbox-Loss, Loss-Series and FedMIA-I read softplus(-margin) in float64 instead, `attacks.passive.scores`) |
| `cos` | [K, Q] | cos(g, Delta_k), g = grad of the loss of (x, y) at w_t (Eq. 7; Grad-Cosine, FedMIA-II) |
| `diff` | [K, Q] | ||Delta_k||^2 - ||Delta_k - g||^2 = 2 <g, Delta_k> - ||g||^2 (Grad-Diff) |
| `grad_sq` | [Q] | ||g||^2 (Grad-Norm) |
| `margin` | [K, Q] | z_y - logsumexp_{j != y} z_j of the logits z of (x, y) under w_t - Delta_k (`losses.true_label_margin`; LiRA's phi, RMIA's probabilities, every attack's loss) |

Delta_k is what the server receives: after an `upload` defense (noise, sparsification,
quantisation) the loss is that of the defended model w_t - upload, so upload defenses reach the
loss scores too (the public code scored the undefended local models).

The per-example gradient g of each query is computed once per chunk of queries and reused for
all K updates (one [C, P] x [P, K] product), where the public code recomputes it per client;
memory is about `chunk_size` x (number of parameters) floats plus the K flattened updates.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy.fl import losses

# Smallest norm product a cosine divides by: a zero gradient or a zero update has cosine 0.
_TINY = 1e-30


class Measurements(NamedTuple):
  """One round's measurements (see the module docstring)."""
  loss: Any
  cos: Any
  diff: Any
  grad_sq: Any
  margin: Any


def flatten_stack(tree: Any) -> jnp.ndarray:
  """A pytree with leading axis K as one [K, P] matrix (leaves in tree order)."""
  leaves = jax.tree_util.tree_leaves(tree)
  k = leaves[0].shape[0]
  return jnp.concatenate([jnp.reshape(a, (k, -1)).astype(jnp.float32) for a in leaves], axis=1)


def _chunk_measurements(apply_fn, global_params, uploads, flat_updates, update_norms, x, y):
  """Measurements of one chunk of queries [C, ...] against all K updates."""
  def example_loss(params, xi, yi):
    return losses.per_example_cross_entropy(apply_fn(params, xi[None]), yi[None])[0]

  grads = jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0))(global_params, x, y)
  g = flatten_stack(grads)                                   # [C, P]
  grad_sq = jnp.sum(g * g, axis=1)                            # [C]
  dots = jnp.matmul(flat_updates, g.T, precision=jax.lax.Precision.HIGHEST)  # [K, C]
  norms = update_norms[:, None] * jnp.sqrt(grad_sq)[None, :]
  cos = dots / jnp.maximum(norms, _TINY)
  diff = 2.0 * dots - grad_sq[None, :]

  def local_loss(upload):
    local = jax.tree_util.tree_map(jnp.subtract, global_params, upload)
    logits = apply_fn(local, x)
    return (losses.per_example_cross_entropy(logits, y),
            losses.true_label_margin(logits, y))

  loss, margin = jax.vmap(local_loss)(uploads)                # [K, C] each
  return Measurements(loss=loss, cos=cos, diff=diff, grad_sq=grad_sq, margin=margin)


def _measure(apply_fn, global_params, uploads, x, y, *, chunk_size):
  q = x.shape[0]
  num_chunks = -(-q // chunk_size)
  pad = num_chunks * chunk_size - q
  # Padding rows are zeros (finite); their measurements are sliced off below.
  xp = jnp.concatenate([x, jnp.zeros((pad,) + x.shape[1:], x.dtype)])
  yp = jnp.concatenate([y, jnp.zeros((pad,) + y.shape[1:], y.dtype)])
  xp = xp.reshape((num_chunks, chunk_size) + x.shape[1:])
  yp = yp.reshape((num_chunks, chunk_size) + y.shape[1:])
  flat_updates = flatten_stack(uploads)
  update_norms = jnp.sqrt(jnp.sum(flat_updates * flat_updates, axis=1))
  out = jax.lax.map(
      lambda xy: _chunk_measurements(apply_fn, global_params, uploads, flat_updates,
                                     update_norms, xy[0], xy[1]), (xp, yp))
  k = flat_updates.shape[0]

  def per_client(a):  # [num_chunks, K, C] -> [K, Q]
    return jnp.moveaxis(a, 1, 0).reshape(k, -1)[:, :q]

  return Measurements(loss=per_client(out.loss), cos=per_client(out.cos),
                      diff=per_client(out.diff), grad_sq=out.grad_sq.reshape(-1)[:q],
                      margin=per_client(out.margin))


# Jitted by rebinding, not by a decorator: mutmut skips decorated functions.
_measure = jax.jit(_measure, static_argnames=('apply_fn', 'chunk_size'))


def measure(apply_fn: Callable[[Any, jnp.ndarray], jnp.ndarray], global_params: Any,
            uploads: Any, x, y, *, chunk_size: int) -> Measurements:
  """Loss, gradient cosine, gradient difference and gradient norm of Q queries vs K uploads.

  Eq. (7) of the FedMIA paper (Zhu et al.) for `cos`, the measurements of its baselines for
  the others (module docstring). Per-example gradients are taken at the global model w_t, the
  model FedMIA's Eq. (7) uses, of the unreduced cross-entropy of each query on its own.

  Args:
    apply_fn: `apply_fn(params, x) -> logits` (e.g. `model.apply`); must be hashable (it is
      a static argument of the jitted computation).
    global_params: w_t.
    uploads: The K updates Delta_k = w_t - w_local_k as the server received them, stacked on
      a leading axis (a pytree like `global_params` with leading axis K).
    x: Queries [Q, ...] (float inputs as the model takes them).
    y: Integer labels [Q].
    chunk_size: Queries per chunk (memory ~ chunk_size x parameters); results do not depend
      on it beyond float rounding of the per-chunk products.

  Returns:
    `Measurements(loss [K, Q], cos [K, Q], diff [K, Q], grad_sq [Q], margin [K, Q])` as jax
    arrays.
  """
  if chunk_size < 1:
    raise ValueError(f'chunk_size must be >= 1 (got {chunk_size})')
  x, y = jnp.asarray(x), jnp.asarray(y)
  if x.shape[0] != y.shape[0]:
    raise ValueError(f'{x.shape[0]} queries but {y.shape[0]} labels')
  if x.shape[0] == 0:
    raise ValueError('measure needs at least one query')
  chunk_size = int(min(chunk_size, x.shape[0]))
  return _measure(apply_fn, global_params, uploads, x, y, chunk_size=chunk_size)


def measure_numpy(*args, **kwargs) -> Measurements:
  """`measure` with its results as numpy arrays."""
  out = measure(*args, **kwargs)
  return Measurements(*(np.asarray(a) for a in out))
