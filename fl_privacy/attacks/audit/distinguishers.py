"""Distinguishers of the LDP audit: guess which input the client randomized.

A guess is an int32: 0 for the first input (x, g1), 1 for the second (x', g2).
Section 3.3 of the LDP-audit paper (Matsumoto et al.) defines the black-box
distinguisher, which sees only the updated model theta_{t+1} (Eqs. 4, 6, 7, one
per crafter as Table 1 assigns them), and the white-box one, which sees the
randomized report (Eq. 5). For the input mechanisms the audit adds the optimal
(Neyman-Pearson) likelihood-ratio tests where the output density is known.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

DISTINGUISHERS = ('black_box', 'white_box')

# The paper's Table 1: which black-box test each crafter is paired with.
BLACK_BOX_RULE = {
    'benign': 'loss_change',            # Eq. (6)
    'input_perturbation': 'loss_decrease',       # Eq. (4)
    'parameter_retrogression': 'loss_decrease',  # Eq. (4)
    'gradient_flip': 'loss_decrease',   # Eq. (4)
    'collusion': 'loss_decrease',       # Eq. (4)
    'dummy_gradient': 'sign_sum',       # Eq. (7)
}


def white_box(report: jax.Array, g1: jax.Array, g2: jax.Array) -> jax.Array:
  """Guess g1 iff cos(report, g1) >= cos(report, g2) (Eq. 5, LDP-audit paper)."""
  def cos(a, b):
    return jnp.vdot(a, b) / jnp.maximum(
        jnp.linalg.norm(a) * jnp.linalg.norm(b), 1e-30)
  return jnp.where(cos(report, g1) >= cos(report, g2), 0, 1).astype(jnp.int32)


def loss_decrease(loss_before: jax.Array, loss_after: jax.Array) -> jax.Array:
  """Guess g1 iff f(x1; theta_{t+1}) <= f(x1; theta_t) (Eq. 4, LDP-audit paper).

  Args:
    loss_before: losses of (x1, x2) at theta_t, [2] (only x1's is used).
    loss_after: the same at theta_{t+1}.
  """
  return jnp.where(loss_after[0] <= loss_before[0], 0, 1).astype(jnp.int32)


def loss_change(loss_before: jax.Array, loss_after: jax.Array) -> jax.Array:
  """Guess g1 iff delta(x1) >= delta(x2), delta = |f(x; theta_{t+1}) - f(x; theta_t)|.

  Eq. (6) of the LDP-audit paper (the benign crafter's black-box test).
  """
  delta = jnp.abs(loss_after - loss_before)
  return jnp.where(delta[0] >= delta[1], 0, 1).astype(jnp.int32)


def sign_sum(params_before: jax.Array, params_after: jax.Array) -> jax.Array:
  """Guess g1 iff sum_i sgn(theta_{t+1}^i - theta_t^i) <= 0 (Eq. 7, descent form).

  Eq. (7) of the LDP-audit paper prints ">= 0" for the all-positive dummy
  gradient g1, but the server descends (theta_{t+1} = theta_t - eta g_t), so an
  update built from g1 moves the parameters down. We use the inequality that
  matches descent; the printed one inverts every guess, and Eq. (3) of an
  inverted distinguisher is clipped to 0, not mirrored.
  """
  total = jnp.sum(jnp.sign(params_after - params_before))
  return jnp.where(total <= 0, 0, 1).astype(jnp.int32)


def bit_log_ratios(p0: np.ndarray, p1: np.ndarray,
                   cap: float = 1e4) -> tuple[np.ndarray, np.ndarray]:
  """Per-bit log-likelihood ratios log P(o | x') / P(o | x) for o = 1 and o = 0.

  Args:
    p0: P(output bit = 1 | x) per bit, any shape.
    p1: P(output bit = 1 | x') per bit, same shape.
    cap: |ratio| cap, so that a probability of exactly 0 or 1 (an output that one
      input can never produce) gives a decisive but finite vote.

  Returns:
    `(if_one, if_zero)` float32 arrays of the shape of `p0`.
  """
  p0 = np.asarray(p0, np.float64)
  p1 = np.asarray(p1, np.float64)
  with np.errstate(divide='ignore', invalid='ignore'):
    if_one = np.log(p1) - np.log(p0)
    if_zero = np.log1p(-p1) - np.log1p(-p0)
  if_one = np.nan_to_num(if_one, nan=0.0, posinf=cap, neginf=-cap)
  if_zero = np.nan_to_num(if_zero, nan=0.0, posinf=cap, neginf=-cap)
  return (np.clip(if_one, -cap, cap).astype(np.float32),
          np.clip(if_zero, -cap, cap).astype(np.float32))


def likelihood_ratio_bits(bits: jax.Array, if_one: jax.Array,
                          if_zero: jax.Array) -> jax.Array:
  """The optimal test between two inputs of a mechanism with independent bits.

  Bits randomized independently given the input (BitRand, OME) have the
  likelihood ratio prod_j P(o_j | x') / P(o_j | x), so the Neyman-Pearson test
  at threshold 1 guesses x' iff the sum of per-bit log-ratios is > 0.

  Args:
    bits: the observed {0, 1} output bits, any shape.
    if_one, if_zero: per-bit log-ratios from `bit_log_ratios`, same shape.
  """
  llr = jnp.sum(jnp.where(bits > 0, if_one, if_zero))
  return jnp.where(llr > 0, 1, 0).astype(jnp.int32)


def likelihood_ratio_gaussian(y: jax.Array, x0: jax.Array,
                              x1: jax.Array) -> jax.Array:
  """The optimal test between N(x0, s^2 I) and N(x1, s^2 I): the nearer mean.

  The log-ratio is linear in y: guess x1 iff <y - (x0 + x1)/2, x1 - x0> > 0.
  """
  return jnp.where(jnp.vdot(y - 0.5 * (x0 + x1), x1 - x0) > 0, 1,
                   0).astype(jnp.int32)
