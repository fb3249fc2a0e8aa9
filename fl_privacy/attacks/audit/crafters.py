"""Crafters of the LDP audit: the two raw gradients a (malicious) client may hold.

Table 1 and Section 3.4 of the LDP-audit paper (Matsumoto et al., "Measuring
Lower Bounds of Local Differential Privacy via Adversary Instantiations in
Federated Learning"). A crafter returns `Crafted`: the pair (g1, g2), the global
model theta_t the server's update starts from, and the two inputs a black-box
distinguisher probes. Everything is computed once per audit point: the crafted
pair does not depend on the trial, only the client's randomization does.

Gradients and the model are flat float32 vectors (`ravel_pytree` order of the
variables dict `{'params': ...}`), so the LDP-SGD randomizer sees one vector of
dimension d = the model's parameter count, as in the paper.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from fl_privacy.mechanisms import fixed_point

CRAFTERS = ('benign', 'input_perturbation', 'parameter_retrogression',
            'gradient_flip', 'collusion', 'dummy_gradient')
# The audited input pairs of a bitwise input mechanism (`input_pair_bits`).
INPUT_PAIRS = ('extreme_pair', 'one_feature_pair')

LossFn = Callable[[Any, jax.Array, jax.Array], jax.Array]


class Crafted(NamedTuple):
  """What one crafter produces for an audit point.

  Attributes:
    g1: the first raw gradient [d] (guess 0 means "g1").
    g2: the second raw gradient [d].
    params: the flat global model theta_t [d] the server updates.
    x: the inputs (x1, x2) [2, ...] the black-box distinguisher evaluates.
    y: their labels [2].
  """
  g1: jax.Array
  g2: jax.Array
  params: jax.Array
  x: jax.Array
  y: jax.Array


def _flat_grad(loss_fn: LossFn, params: Any, x: jax.Array, y: jax.Array):
  grads = jax.grad(loss_fn)(params, x[None], jnp.asarray(y)[None])
  return flatten_util.ravel_pytree(grads)[0]


# Jitted once per loss_fn: eager op-by-op differentiation of a CNN is ~50x slower.
_flat_grad_jit = jax.jit(_flat_grad, static_argnums=0)


def flat_grad(loss_fn: LossFn, params: Any, x, y) -> jax.Array:
  """The gradient of the loss of the single example (x, y), flattened to [d]."""
  return _flat_grad_jit(loss_fn, params, jnp.asarray(x, jnp.float32),
                        jnp.asarray(y, jnp.int32))


def _flat(params: Any) -> jax.Array:
  return flatten_util.ravel_pytree(params)[0]


def _pair(a, b) -> jax.Array:
  return jnp.stack([jnp.asarray(a), jnp.asarray(b)])


def benign(loss_fn: LossFn, params: Any, x1, y1, x2, y2) -> Crafted:
  """Benign setting: g_i = grad f(x_i; theta_t) of two honest examples (Sec. 3.4)."""
  return Crafted(flat_grad(loss_fn, params, x1, y1),
                 flat_grad(loss_fn, params, x2, y2), _flat(params),
                 _pair(x1, x2), _pair(y1, y2))


def fgsm(loss_fn: LossFn, params: Any, x, y, alpha: float) -> jax.Array:
  """x + alpha * sgn(grad_x f(x; theta)) (FGSM, Goodfellow et al. 2014).

  Not clipped to the image range: the paper's alpha = 1 on [0, 1] images moves
  every pixel by a full unit, and the paper does not clip.
  """
  return _fgsm(loss_fn, params, jnp.asarray(x, jnp.float32),
               jnp.asarray(y, jnp.int32), alpha)


@functools.partial(jax.jit, static_argnums=0)
def _fgsm(loss_fn: LossFn, params: Any, x: jax.Array, y: jax.Array, alpha):
  grad_x = jax.grad(lambda xx: loss_fn(params, xx[None], y[None]))(x)
  return x + alpha * jnp.sign(grad_x)


@functools.partial(jax.jit, static_argnums=0)
def _grads(loss_fn: LossFn, params: Any, x: jax.Array, y: jax.Array):
  return jax.grad(loss_fn)(params, x[None], y[None])


def input_perturbation(loss_fn: LossFn, params: Any, x1, y1, *,
                       alpha: float = 1.0) -> Crafted:
  """Input perturbation: x2 = FGSM(x1), g_i = grad f(x_i; theta_t) (Sec. 3.4)."""
  x2 = fgsm(loss_fn, params, x1, y1, alpha)
  return Crafted(flat_grad(loss_fn, params, x1, y1),
                 flat_grad(loss_fn, params, x2, y1), _flat(params),
                 _pair(x1, x2), _pair(y1, y1))


def parameter_retrogression(loss_fn: LossFn, params: Any, x1, y1, *,
                            alpha: float = 1.0) -> Crafted:
  """Parameter retrogression (Sec. 3.4).

  theta' = theta_t + alpha * grad f(x1; theta_t); g1 = grad f(x1; theta_t),
  g2 = grad f(x1; theta'). The server still updates the benign theta_t.
  """
  grads = _grads(loss_fn, params, jnp.asarray(x1, jnp.float32),
                 jnp.asarray(y1, jnp.int32))
  retro = jax.tree_util.tree_map(lambda p, g: p + alpha * g, params, grads)
  return Crafted(_flat(grads), flat_grad(loss_fn, retro, x1, y1), _flat(params),
                 _pair(x1, x1), _pair(y1, y1))


def gradient_flip(loss_fn: LossFn, params: Any, x1, y1) -> Crafted:
  """Gradient flip: g1 = grad f(x1; theta_t), g2 = -g1 (Sec. 3.4)."""
  g1 = flat_grad(loss_fn, params, x1, y1)
  return Crafted(g1, -g1, _flat(params), _pair(x1, x1), _pair(y1, y1))


def collusion(loss_fn: LossFn, malicious_params: Any, x1, y1) -> Crafted:
  """Collusion: a gradient flip at the server's malicious model (Sec. 3.4).

  The server distributes `malicious_params` (see `malicious_model`), so that is
  also the model its update starts from. x1's label must differ from the label
  the malicious model was trained on.
  """
  return gradient_flip(loss_fn, malicious_params, x1, y1)


def dummy_gradient(params: Any, x1, y1, *, clip_norm: float) -> Crafted:
  """Dummy gradient: g1 = (lambda, ..., lambda), lambda = L / sqrt(d); g2 = -g1.

  ||g1|| = L exactly, so line 2 of Algorithm 1 never flips it (Sec. 3.4 and
  Proposition 1 of the LDP-audit paper: with the white-box distinguisher this
  attains the theoretical epsilon).
  """
  flat = _flat(params)
  g1 = jnp.full(flat.shape, clip_norm / np.sqrt(flat.size), jnp.float32)
  return Crafted(g1, -g1, flat, _pair(x1, x1), _pair(y1, y1))


def malicious_model(loss_fn: LossFn, params: Any, x: np.ndarray, y: np.ndarray,
                    *, label: int, key: jax.Array, steps: int,
                    learning_rate: float, batch_size: int) -> Any:
  """The colluding server's model: SGD on images of the single class `label`.

  A model fit to one class gives a huge loss, hence a gradient norm >= L, on an
  image of any other class, so LDP-SGD's norm projection (line 2 of Algorithm 1)
  almost never flips that image's gradient (Sec. 3.4, "Collusion").

  Args:
    loss_fn: `loss_fn(params, x, y) -> scalar`.
    params: the starting model.
    x: float32 training inputs [N, ...].
    y: int labels [N].
    label: the class the model is trained on.
    key: typed key for the minibatch draws.
    steps: SGD steps.
    learning_rate: SGD step size.
    batch_size: minibatch size.

  Returns:
    The trained params pytree.
  """
  idx = np.flatnonzero(np.asarray(y) == label)
  if idx.size == 0:
    raise ValueError(f'no training example has label {label}')
  xs, ys = jnp.asarray(x[idx]), jnp.asarray(y[idx])
  return sgd_train(loss_fn, params, xs, ys, key=key, steps=steps,
                   learning_rate=learning_rate, batch_size=batch_size)


def sgd_train(loss_fn: LossFn, params: Any, x: jax.Array, y: jax.Array, *,
              key: jax.Array, steps: int, learning_rate: float,
              batch_size: int) -> Any:
  """Plain minibatch SGD (`lax.scan`), minibatches drawn with replacement."""
  opt = optax.sgd(learning_rate)
  n = x.shape[0]

  def step(carry, index):
    p, state = carry
    batch = jax.random.randint(jax.random.fold_in(key, index), (batch_size,), 0,
                               n)
    grads = jax.grad(loss_fn)(p, x[batch], y[batch])
    updates, state = opt.update(grads, state, p)
    return (optax.apply_updates(p, updates), state), None

  (params, _), _ = jax.lax.scan(step, (params, opt.init(params)),
                                jnp.arange(steps))
  return params


def grad_norms(loss_fn: LossFn, params: Any, x: jax.Array,
               y: jax.Array) -> np.ndarray:
  """L2 norms [n] of the per-example gradients of (x[i], y[i]) at `params`."""
  return np.asarray(_grad_norms(loss_fn, params, jnp.asarray(x, jnp.float32),
                                jnp.asarray(y, jnp.int32)))


@functools.partial(jax.jit, static_argnums=0)
def _grad_norms(loss_fn: LossFn, params: Any, x: jax.Array, y: jax.Array):
  return jax.vmap(lambda xi, yi: jnp.linalg.norm(
      _flat_grad(loss_fn, params, xi, yi)))(x, y)


def select_examples(norms: np.ndarray, labels: np.ndarray, selection: str,
                    exclude_label: int | None = None) -> tuple[int, int]:
  """Positions (i1, i2) of the crafter's x1 and x2 among screened candidates.

  Args:
    norms: gradient norms of the candidates at the audited model.
    labels: their labels.
    selection: 'max_grad_norm' (x1 the largest norm, x2 the largest among the
      other labels) or 'random' (candidates are already in random order: x1 the
      first, x2 the first of another label).
    exclude_label: a label x1 must not have (the colluding server's class).

  Returns:
    `(i1, i2)`; i2 = i1 when no candidate has another label.

  Raises:
    ValueError: no candidate is allowed as x1, or an unknown `selection`.
  """
  labels = np.asarray(labels)
  order = {'max_grad_norm': np.argsort(-np.asarray(norms), kind='stable'),
           'random': np.arange(len(labels))}.get(selection)
  if order is None:
    raise ValueError(f'unknown selection {selection!r}')
  allowed = [i for i in order if exclude_label is None or
             labels[i] != exclude_label]
  if not allowed:
    raise ValueError(f'no candidate has a label other than {exclude_label}')
  i1 = int(allowed[0])
  others = [i for i in order if labels[i] != labels[i1]]
  return i1, int(others[0]) if others else i1


def input_pair_bits(pair: str, num_features: int, int_bits: int, frac_bits: int,
                    sign_bit: bool) -> np.ndarray:
  """Encodings [2, r, l] of the audited input pair of a bitwise input mechanism.

  'extreme_pair': the all-zero and the all-maximum vector (every magnitude bit
  differs); 'one_feature_pair': the all-zero vector and the one whose feature 0
  alone is the maximum (the neighbours of a per-feature guarantee).
  """
  top = fixed_point.max_value(int_bits, frac_bits)
  other = (jnp.full((num_features,), top) if pair == 'extreme_pair'
           else jnp.zeros((num_features,)).at[0].set(top))
  x = jnp.stack([jnp.zeros((num_features,)), other])
  bits, _ = fixed_point.encode(x, int_bits, frac_bits, sign_bit)
  return np.asarray(bits, np.uint8)
