"""Defenses on the client's update Delta = w_t - w_local, as `upload` hooks.

What the server receives (and aggregates, and observes) is the transformed update:

- `noise`: Delta + N(0, sigma^2) on every parameter, no clipping (the FedMIA paper's
  "perturbation" defense, Zhu et al.'s DLG noise; FedMIA code `trainer_private.py:285-288`).
  Not a calibrated DP mechanism: for that see `dp.update_dp`.
- `sparsify`: per tensor, keep the k largest |Delta| entries and zero the rest (Aji & Heafield
  2017; Lin et al. 2018's top-k). The FedMIA code's parameterisation (`main.py:166-174`) is
  sparsity p with `min_size=1000`: tensors with more than 1,000 entries keep their
  int((1 - p) n) largest entries, smaller tensors are sent as they are; `min_size=0` is plain
  top-k on every tensor.
- `quantize`: per-tensor min-max quantisation to 2^b levels with stochastic rounding
  (QSGD-style, Alistarh et al. 2017; FedMIA code `experiments/utils.py:110-117` rounds to 2^b
  bins between the tensor's min and max). Stochastic rounding makes it unbiased:
  E[Q(x)] = x.

Each function is pure and jit-able; `*_hook` builds the `upload` hook.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fl_privacy.mechanisms import gaussian

# FedMIA's code sparsifies only tensors with more than this many entries (main.py:166-174).
FEDMIA_MIN_SIZE = 1000


def noise(key: jax.Array, delta: Any, sigma: float) -> Any:
  """Delta + N(0, sigma^2 I) on every parameter (FedMIA `trainer_private.py:285-288`)."""
  return gaussian.add_noise(key, delta, sigma)


def keep_count(size: int, keep_fraction: float) -> int:
  """k = int(keep_fraction * size), floored in float64 as the FedMIA code's int((1 - p) n)."""
  return int(keep_fraction * size)


def top_k_leaf(x: jax.Array, k: int) -> jax.Array:
  """`x` with all but its k largest-|x| entries set to 0 (exactly k kept; ties by index)."""
  n = x.size
  if k >= n:
    return x
  flat = jnp.reshape(x, (-1,))
  if k <= 0:
    return jnp.zeros_like(x)
  _, idx = jax.lax.top_k(jnp.abs(flat), k)
  kept = jnp.zeros_like(flat).at[idx].set(flat[idx])
  return jnp.reshape(kept, x.shape)


def sparsify(delta: Any, keep_fraction: float, *, min_size: int = 0) -> Any:
  """Per tensor with more than `min_size` entries: keep its int(keep_fraction n) largest |Delta|.

  Tensors with at most `min_size` entries are left as they are (FedMIA's code uses 1,000;
  0 sparsifies every tensor).
  """
  return jax.tree_util.tree_map(
      lambda x: x if x.size <= min_size else top_k_leaf(x, keep_count(x.size, keep_fraction)),
      delta)


def quantize_leaf(key: jax.Array, x: jax.Array, bits: int) -> jax.Array:
  """Min-max stochastic quantisation of one tensor to 2^bits levels (unbiased).

  Levels lo + (hi - lo) i / (2^bits - 1), i = 0 .. 2^bits - 1, with lo, hi the tensor's min
  and max; x between two levels goes up with probability equal to its fractional position,
  so E[Q(x)] = x. A constant tensor is returned as it is.
  """
  levels = 2 ** bits - 1
  lo, hi = jnp.min(x), jnp.max(x)
  span = hi - lo
  safe = jnp.where(span > 0, span, 1.0)
  scaled = (x - lo) / safe * levels
  low = jnp.floor(scaled)
  up = jax.random.uniform(key, x.shape, x.dtype) < (scaled - low)
  index = jnp.clip(low + up.astype(x.dtype), 0, levels)
  return jnp.where(span > 0, lo + index * (safe / levels), x).astype(x.dtype)


def quantize(key: jax.Array, delta: Any, bits: int) -> Any:
  """`quantize_leaf` on every tensor of Delta, tensor i with `fold_in(key, i)`."""
  leaves, tree = jax.tree_util.tree_flatten(delta)
  out = [quantize_leaf(jax.random.fold_in(key, i), x, bits) for i, x in enumerate(leaves)]
  return jax.tree_util.tree_unflatten(tree, out)


def _noise_upload(sigma, key, delta, aux):
  del aux
  return noise(key, delta, sigma)


def noise_hook(sigma: float):
  """`upload` hook of `noise`: a `jax.tree_util.Partial` whose sigma is an array (weakly typed,
  as the float it was), so a jitted training that takes the hook as an operand
  (`fl.recording`) compiles once for every sigma of a sweep."""
  return jax.tree_util.Partial(_noise_upload, jnp.asarray(float(sigma)))


def sparsify_hook(keep_fraction: float, min_size: int):
  """`upload` hook of `sparsify` (deterministic: the key is unused)."""
  def upload(key, delta, aux):
    del key, aux
    return sparsify(delta, keep_fraction, min_size=min_size)
  return upload


def _quantize_upload(bits, key, delta, aux):
  del aux
  return quantize(key, delta, bits)


def quantize_hook(bits: int):
  """`upload` hook of `quantize`: a `Partial` over the bits as an array, like `noise_hook`
  (2^bits - 1 is exact in float32 for the bits allowed)."""
  return jax.tree_util.Partial(_quantize_upload, jnp.asarray(int(bits)))
