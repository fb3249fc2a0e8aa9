"""Refuses settings whose arrays cannot fit the device's memory, before any work.

A `copies` or `batch_size` of 10^7 and more used to end, after the data was loaded and the
results files were opened, in an out-of-memory traceback. The estimates here are simple and
conservative (a lower bound on one array the setting makes the run allocate), so a setting
is refused only when it cannot fit, never on a guess.
"""

from __future__ import annotations

import math
import os
from typing import Any

from fl_privacy import validate

FLOAT_BYTES = 4  # float32, what every pipeline computes in


def device_memory() -> tuple[int | None, str]:
  """(bytes, words) of the default device: its allocator limit, or the host's RAM on CPU."""
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.local_devices()[0]
  try:
    stats = device.memory_stats() or {}
  except Exception:  # pylint: disable=broad-except  # backends without memory statistics
    stats = {}
  if stats.get('bytes_limit'):
    return int(stats['bytes_limit']), f'the {device.platform} device\'s memory'
  try:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'), 'the machine\'s memory'
  except (ValueError, OSError, AttributeError):
    return None, 'unknown'


def gib(nbytes: float) -> str:
  return f'{nbytes / 2**30:,.1f} GiB'


def require_fits(field: str, got: Any, nbytes: int, what: str) -> None:
  """Raises `ConfigError(field)` when `what` (`nbytes`) exceeds the device's memory."""
  limit, where = device_memory()
  if limit is None or nbytes <= limit:
    return
  raise validate.ConfigError(field, f'small enough for {what} to fit in memory: '
                             f'~{gib(nbytes)} > {gib(limit)} of {where}', got)


def largest_activation(model, example_shape) -> int:
  """Floats per example of the model's largest input or intermediate (shapes only).

  Training keeps the forward activations for the backward pass, so a batch of B examples
  holds at least B times this many floats in one array.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  x = jax.ShapeDtypeStruct((1,) + tuple(example_shape), jnp.float32)

  def forward(x):
    variables = model.init(jax.random.key(0), x)
    _, state = model.apply(variables, x, capture_intermediates=True, mutable=['intermediates'])
    return state

  sizes = [math.prod(example_shape)]
  try:
    state = jax.eval_shape(forward, x)
    sizes += [math.prod(leaf.shape[1:]) for leaf in jax.tree.leaves(state)
              if len(leaf.shape) >= 1 and leaf.shape[0] == 1]
  except Exception:  # pylint: disable=broad-except  # a model without a plain apply: the input
    pass
  return int(max(sizes))


def require_batch_fits(field: str, batch_size: int, model, example_shape,
                       num_clients: int = 1) -> None:
  """The clients' batches (vmapped side by side) x the largest activation must fit the device."""
  floats = largest_activation(model, example_shape)
  require_fits(field, batch_size, int(num_clients) * int(batch_size) * floats * FLOAT_BYTES,
               f'the clients\' largest activation ({num_clients} clients x {batch_size} '
               f'examples x {floats:,} floats x 4 bytes)')


def num_parameters(model, example_shape) -> int:
  """The number of parameters (floats) of `model` on inputs of `example_shape` (shapes only)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  x = jax.ShapeDtypeStruct((1,) + tuple(example_shape), jnp.float32)
  variables = jax.eval_shape(model.init, jax.random.key(0), x)
  params = variables.get('params', variables) if hasattr(variables, 'get') else variables
  return int(sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params)))


def require_query_gradients_fit(field: str, chunk: int, model, example_shape) -> None:
  """A chunk of per-query gradients (`fl.queries.measure`) must fit the device.

  The measurement takes the per-example gradient of `chunk` queries at once and flattens it
  to [chunk, P]: the gradient pytree and its flattened copy are both alive at the
  concatenation, so at least 2 x chunk x P floats (ResNet-18 on digits at a chunk of 512:
  ~43 GiB, which ran out of memory after the results files were opened).
  """
  p = num_parameters(model, example_shape)
  require_fits(field, chunk, 2 * int(chunk) * p * FLOAT_BYTES,
               f'the per-query gradients ({chunk} queries x {p:,} parameters x 4 bytes, held '
               'twice while flattened)')


def capped_chunk(chunk: int | None, bytes_per_trial: int, budget_bytes: int) -> int | None:
  """An explicit chunk of trials cut so that its trials hold at most `budget_bytes` (>= 1).

  None stays None: the runner then sizes chunks by XLA's own working-set estimate.
  """
  if chunk is None:
    return None
  return max(1, min(chunk, budget_bytes // bytes_per_trial))
