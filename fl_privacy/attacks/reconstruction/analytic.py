"""One example recovered exactly from the gradient of a dense layer with a bias.

For y = W x + b (kernel [d, n] as Flax stores it) and one example, dL/dW[:, i] = x dL/db[i],
so x = dL/dW[:, i] / dL/db[i] for any unit i whose bias gradient is non-zero: Phong, Aono,
Hayashi, Wang, Moriai, "Privacy-Preserving Deep Learning via Additively Homomorphic
Encryption" (IEEE TIFS 2018), Sect. 3; for any such layer, Geiping et al. (NeurIPS 2020),
Proposition D.1 (unverified). From an upload after one SGD step of rate lr the same ratio holds:
Delta = lr x gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def recover(kernel_grad: np.ndarray, bias_grad: np.ndarray, *, min_bias: float = 1e-12
            ) -> np.ndarray:
  """x [d] from dL/dkernel [d, n] and dL/dbias [n]: the ratio at the unit with the largest
  |dL/db| (the best conditioned one); ValueError when every bias gradient is ~0."""
  kernel_grad = np.asarray(kernel_grad, np.float64)
  bias_grad = np.asarray(bias_grad, np.float64)
  if kernel_grad.ndim != 2 or bias_grad.shape != (kernel_grad.shape[1],):
    raise ValueError(f'kernel gradient [d, n] and bias gradient [n] expected (got '
                     f'{kernel_grad.shape} and {bias_grad.shape})')
  i = int(np.argmax(np.abs(bias_grad)))
  if abs(bias_grad[i]) <= min_bias:
    raise ValueError('every unit\'s bias gradient is 0: nothing to divide by')
  return kernel_grad[:, i] / bias_grad[i]


def recover_update(kernel_delta, bias_delta) -> tuple[jax.Array, jax.Array]:
  """`recover` inside a trial (jit-able): (x [d], valid) from the upload of a dense layer with
  a bias on the input. Valid when some unit's bias moved. With several examples the ratio is
  their mixture sum_j g_ij x_j / sum_j g_ij, which the metrics count as a failure.

  An upload after E epochs of SGD on one example still gives x exactly: every step's kernel
  gradient is x times that step's bias gradient (Phong et al.'s ratio), and the upload sums
  the steps.
  """
  kd, bd = jnp.asarray(kernel_delta), jnp.asarray(bias_delta)
  i = jnp.argmax(jnp.abs(bd))
  valid = jnp.abs(bd[i]) > 0
  return jnp.where(valid, kd[:, i] / jnp.where(valid, bd[i], 1.0), 0.0), valid
