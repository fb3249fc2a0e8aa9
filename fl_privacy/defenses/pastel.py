"""PASTEL (Elhattab and Bouchenak): a Jensen-Shannon regulariser between member and held-out data.

Each client adds to its cross-entropy the Jensen-Shannon divergence between what a member
minibatch X and a held-out minibatch V look like at selected layers, and trains with AdaGrad
(Sect. 2, Eqs. 1-5, Algorithm 1 of "Mitigating Membership Inference Attacks in Federated
Learning"). The paper never says exactly which distributions it compares, so this module fixes
one reading and keeps the other configurable (docs/experiments/pastel.md, "The reading we fixed", says why):

- `activation` (default): h_l(x) is layer l's output (a Dense layer's pre-activation output; a
  convolution's or a residual block's output averaged over space), p_l(x) = softmax(h_l(x) /
  tau) over the layer's units, and P_l(X) = the mean of p_l over the real rows of X. On the
  classifier layer with tau = 1 this is the batch's mean predicted class distribution, the
  "sum over classes" of Eq. 4; on hidden layers it is the "internal" distribution of Sect. 2.1
  and Sect. 3 ("similar outputs for member and non-member inputs").
- `gradient` (Sect. 2.1, "gradients of the layer"): P_l(X) = |dCE(X)/dW_l| normalised to sum
  to one, W_l all kernels of layer l. Training through it is second order.

The loss (Eq. 5 with a weight; the paper's Eq. 5 is lambda = 1):

  L(X, V) = CE(X) + lambda * mean_l JS(P_l(X) || P_l(V)),

with JS in nats (Eqs. 1-3; Eq. 3's "min over i" is read as the objective being minimised, and
the layers are averaged so that lambda means the same whatever their number). V is drawn afresh
at every local step from the client's held-out rows (Algorithm 1 pairs each B_i with a V_i);
the held-out rows reach the hook through the round loop's per-client `aux`
(`{'x', 'y', 'mask'}`, see `heldout_aux`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy.fl import client

REPRESENTATIONS = ('activation', 'gradient')
# Floor inside the logarithms: keeps the gradient of p log p finite at p = 0 (a dead unit's
# zero gradient in the `gradient` representation) without changing any value (0 * finite = 0).
_TINY = 1e-30


def kl_divergence(p: jnp.ndarray, q: jnp.ndarray, axis: int = -1) -> jnp.ndarray:
  """KL(p || q) = sum_c p_c log(p_c / q_c) in nats (Eq. 4), with 0 log 0 = 0.

  Args:
    p: Distributions along `axis` (non-negative, summing to one).
    q: Distributions of the same shape, positive wherever p is.
    axis: The category axis.

  Returns:
    KL over `axis`.
  """
  log_ratio = jnp.log(jnp.maximum(p, _TINY)) - jnp.log(jnp.maximum(q, _TINY))
  return jnp.sum(jnp.where(p > 0, p * log_ratio, 0.0), axis=axis)


def js_divergence(p: jnp.ndarray, q: jnp.ndarray, axis: int = -1) -> jnp.ndarray:
  """JS(p || q) = (KL(p || m) + KL(q || m)) / 2, m = (p + q) / 2, in nats (Eqs. 1-3).

  Symmetric, 0 iff p = q, at most ln 2; equals the square of
  `scipy.spatial.distance.jensenshannon(p, q)` (natural log).

  Args:
    p: Distributions along `axis`.
    q: Distributions of the same shape.
    axis: The category axis.

  Returns:
    JS over `axis`.
  """
  m = (p + q) / 2
  return (kl_divergence(p, m, axis) + kl_divergence(q, m, axis)) / 2


def _masked_batch_mean(values: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
  """Mean over the real rows (axis 0) of `values` [B, d]."""
  if mask is None:
    return jnp.mean(values, axis=0)
  w = mask.astype(values.dtype)
  return jnp.sum(values * w[:, None], axis=0) / jnp.maximum(jnp.sum(w), 1.0)


def _top_level_filter(layers: Sequence[str]) -> Callable[[nn.Module, str], bool]:
  names = frozenset(layers)

  def keep(mdl: nn.Module, method_name: str) -> bool:
    path = mdl.scope.path if mdl.scope is not None else ()
    return method_name == '__call__' and len(path) == 1 and path[0] in names
  return keep


def layer_outputs(apply_fn: Callable, variables: Any, x: jnp.ndarray,
                  layers: Sequence[str]) -> dict[str, jnp.ndarray]:
  """h_l(x) [B, units] of each top-level submodule `l` in `layers`, spatial axes averaged.

  Args:
    apply_fn: A Flax module's `apply`.
    variables: `{'params': ...}`.
    x: Inputs [B, ...].
    layers: Names of top-level submodules (e.g. 'fc1', 'block8').

  Returns:
    {layer: [B, units]}.
  """
  _, state = apply_fn(variables, x, capture_intermediates=_top_level_filter(layers),
                      mutable=['intermediates'])
  out = {}
  for name in layers:
    h = state['intermediates'][name]['__call__'][0]
    if h.ndim > 2:  # conv / block outputs [B, H, W, C]: average over space
      h = jnp.mean(h, axis=tuple(range(1, h.ndim - 1)))
    out[name] = h
  return out


def activation_distributions(apply_fn: Callable, variables: Any, x: jnp.ndarray,
                             mask: jnp.ndarray | None, layers: Sequence[str],
                             temperature: float) -> dict[str, jnp.ndarray]:
  """P_l(X) = real-row mean of softmax(h_l(x) / tau) (the `activation` reading of Eq. 4).

  Args:
    apply_fn: A Flax module's `apply`.
    variables: `{'params': ...}`.
    x: Batch [B, ...].
    mask: [B] real rows, or None.
    layers: Layer names.
    temperature: tau > 0.

  Returns:
    {layer: distribution over the layer's units}.
  """
  hs = layer_outputs(apply_fn, variables, x, layers)
  return {name: _masked_batch_mean(jax.nn.softmax(h / temperature, axis=-1), mask)
          for name, h in hs.items()}


def gradient_distributions(loss_fn: Callable, variables: Any, x: jnp.ndarray,
                           y: jnp.ndarray, mask: jnp.ndarray | None,
                           layers: Sequence[str]) -> dict[str, jnp.ndarray]:
  """P_l(X) = |dCE(X)/dW_l| / sum |dCE(X)/dW_l| (the `gradient` reading of Sect. 2.1).

  W_l is every kernel (weight tensor named 'kernel') inside layer l, flattened and concatenated;
  biases and normalisation scales are left out. An all-zero gradient gives the uniform
  distribution.

  Args:
    loss_fn: `loss_fn(variables, x, y, mask) -> mean CE`.
    variables: `{'params': ...}`.
    x: Batch [B, ...].
    y: Labels [B].
    mask: [B] real rows, or None.
    layers: Layer names (top-level entries of `variables['params']`).

  Returns:
    {layer: distribution over the layer's kernel entries}.
  """
  grads = jax.grad(lambda v: loss_fn(v, x, y, mask))(variables)
  out = {}
  for name in layers:
    leaves = [leaf for path, leaf in
              jax.tree_util.tree_flatten_with_path(grads['params'][name])[0]
              if getattr(path[-1], 'key', None) == 'kernel']
    a = jnp.abs(jnp.concatenate([leaf.reshape(-1) for leaf in leaves]))
    total = jnp.sum(a)
    # Double where: the untaken branch a / total must have a finite gradient too, or the
    # zero cotangent times d(a / t)/dt = -a / t^2 (0 / 0 once t^2 underflows) is NaN, and a
    # batch the model fits exactly (zero CE gradient) would turn the whole update into NaN.
    safe = jnp.where(total > 0, total, 1.0)
    out[name] = jnp.where(total > 0, a / safe, 1.0 / a.size)
  return out


def draw_heldout(key, aux: dict, batch_size: int) -> tuple[jnp.ndarray, jnp.ndarray,
                                                            jnp.ndarray]:
  """V: min(batch_size, H) held-out rows drawn uniformly without replacement from the real rows.

  Args:
    key: The step's key.
    aux: `{'x': [H, ...], 'y': [H], 'mask': [H]}` of one client.
    batch_size: |V| wanted.

  Returns:
    (x [b], y [b], mask [b]) with b = min(batch_size, H); mask 0 marks slots left empty when
    the client has fewer than b real held-out rows.
  """
  h = aux['y'].shape[0]
  b = min(int(batch_size), h)
  mask = jnp.asarray(aux['mask'], jnp.float32)
  u = jax.random.uniform(key, (h,))
  order = jnp.argsort(jnp.where(mask > 0, u, 2.0))[:b]
  return aux['x'][order], aux['y'][order], mask[order]


def regulariser(key, apply_fn: Callable, loss_fn: Callable, variables: Any, x, y, mask, aux,
                *, layers: Sequence[str], representation: str = 'activation',
                temperature: float = 1.0, heldout_batch_size: int | None = None
                ) -> jnp.ndarray:
  """mean_l JS(P_l(X) || P_l(V)), V drawn from `aux` with `key` (the JSD term of Eq. 5).

  Args:
    key: Draws V.
    apply_fn: The model's `apply`.
    loss_fn: `loss_fn(variables, x, y, mask)` (used by the `gradient` representation).
    variables: `{'params': ...}`.
    x, y, mask: The member minibatch X (mask None = all real).
    aux: The client's held-out rows `{'x', 'y', 'mask'}`.
    layers: Layer names.
    representation: 'activation' or 'gradient'.
    temperature: tau of the `activation` representation.
    heldout_batch_size: |V| (default |X|).

  Returns:
    The mean JS over layers, in nats.
  """
  vx, vy, vmask = draw_heldout(key, aux, heldout_batch_size or x.shape[0])
  if representation == 'activation':
    p = activation_distributions(apply_fn, variables, x, mask, layers, temperature)
    q = activation_distributions(apply_fn, variables, vx, vmask, layers, temperature)
  elif representation == 'gradient':
    p = gradient_distributions(loss_fn, variables, x, y, mask, layers)
    q = gradient_distributions(loss_fn, variables, vx, vy, vmask, layers)
  else:
    raise ValueError(f'representation must be one of {REPRESENTATIONS} (got {representation!r})')
  return jnp.mean(jnp.stack([js_divergence(p[name], q[name]) for name in layers]))


def make(apply_fn: Callable, *, weight: float, layers: Sequence[str],
         representation: str = 'activation', temperature: float = 1.0,
         heldout_batch_size: int | None = None) -> client.ClientHooks:
  """PASTEL as a `loss` hook: CE(X) + weight * mean_l JS(P_l(X) || P_l(V)) (Eq. 5).

  With weight 0 the hook returns `loss_fn` unchanged, so training is bit for bit that of no
  hook. Pair it with `fl.optimizers.make('adagrad', lr)` (the paper's optimizer; `fedavg`
  starts its state fresh each round, Algorithm 1 line 1).

  Args:
    apply_fn: The model's `apply`.
    weight: lambda >= 0 (the paper's Eq. 5 is 1); a Python number, or a traced scalar so
      that one compiled training serves every lambda.
    layers: Layer names (top-level submodules), non-empty.
    representation: One of `REPRESENTATIONS`.
    temperature: tau > 0 of the `activation` representation.
    heldout_batch_size: |V| (default: the minibatch size).

  Returns:
    `ClientHooks` whose `loss` reads the held-out rows from the client's `aux`.
  """
  static_weight = isinstance(weight, (int, float))
  if static_weight and weight < 0:
    raise ValueError(f'weight must be >= 0 (got {weight})')
  if representation not in REPRESENTATIONS:
    raise ValueError(f'representation must be one of {REPRESENTATIONS} (got {representation!r})')
  if not layers:
    raise ValueError('layers must name at least one layer')
  if temperature <= 0:
    raise ValueError(f'temperature must be > 0 (got {temperature})')
  layers = tuple(layers)
  # A traced weight (one compiled program for every lambda) always computes the term.
  skip = static_weight and float(weight) == 0.0

  def loss(key, loss_fn, params, x, y, mask, aux):
    ce = loss_fn(params, x, y, mask) if mask is not None else loss_fn(params, x, y)
    if skip:
      return ce
    reg = regulariser(key, apply_fn, loss_fn, params, x, y, mask, aux, layers=layers,
                      representation=representation, temperature=temperature,
                      heldout_batch_size=heldout_batch_size)
    return ce + weight * reg

  return client.ClientHooks(loss=loss)


def heldout_aux(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
  """Stacks K clients' held-out rows into the round loop's `aux` (padded, with a mask).

  Args:
    xs: K arrays [h_k, ...] (each h_k >= 1).
    ys: K label arrays [h_k].

  Returns:
    `{'x': [K, H, ...], 'y': [K, H], 'mask': [K, H]}`, H = max h_k.
  """
  h = max(len(a) for a in xs)
  if min(len(a) for a in xs) < 1:
    raise ValueError('every client needs at least one held-out row')

  def pad(a):
    a = np.asarray(a)
    return np.concatenate([a, np.zeros((h - len(a),) + a.shape[1:], a.dtype)])

  return {'x': np.stack([pad(a) for a in xs]), 'y': np.stack([pad(a) for a in ys]),
          'mask': np.stack([(np.arange(h) < len(a)).astype(np.float32) for a in xs])}


def available_layers(apply_fn: Callable, variables: Any, x: jnp.ndarray) -> tuple[str, ...]:
  """Names of the top-level submodules whose outputs `layer_outputs` can read (shapes only)."""
  def run(v, xb):
    _, state = apply_fn(v, xb, capture_intermediates=True, mutable=['intermediates'])
    return state['intermediates']
  shapes = jax.eval_shape(run, variables, x)
  return tuple(name for name in shapes if name != '__call__')


def dense_layers(variables: Any) -> tuple[str, ...]:
  """Top-level layers with a 2-D `kernel` (Dense), in parameter order (the default layers)."""
  return tuple(name for name, sub in variables['params'].items()
               if hasattr(sub, 'keys') and 'kernel' in sub and len(sub['kernel'].shape) == 2)


def mean_jsd(apply_fn: Callable, loss_fn: Callable, variables: Any, x, y, vx, vy, *,
             layers: Sequence[str], representation: str = 'activation',
             temperature: float = 1.0) -> float:
  """mean_l JS(P_l(X) || P_l(V)) between two whole sets (diagnostic: the internal gap).

  Args:
    apply_fn, loss_fn, variables: As in `regulariser`.
    x, y: Members.
    vx, vy: Held-out or non-member rows.
    layers, representation, temperature: As in `make`.

  Returns:
    The mean JS over layers in nats.
  """
  if representation == 'activation':
    p = activation_distributions(apply_fn, variables, x, None, layers, temperature)
    q = activation_distributions(apply_fn, variables, vx, None, layers, temperature)
  else:
    p = gradient_distributions(loss_fn, variables, x, y, None, layers)
    q = gradient_distributions(loss_fn, variables, vx, vy, None, layers)
  return float(jnp.mean(jnp.stack([js_divergence(p[n], q[n]) for n in layers])))


__all__ = ['REPRESENTATIONS', 'kl_divergence', 'js_divergence', 'layer_outputs',
           'activation_distributions', 'gradient_distributions', 'draw_heldout', 'regulariser',
           'make', 'heldout_aux', 'available_layers', 'dense_layers', 'mean_jsd']
