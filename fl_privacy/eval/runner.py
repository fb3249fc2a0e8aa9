"""The security-game runner: many independent trials as jit + vmap chunks.

A game is a pure function `trial_fn(key, index, *args) -> pytree`. `run_trials`
evaluates it for trial indices `start, ..., num_trials - 1` with the per-trial key
`jax.random.fold_in(run_key, index)`, so the outcome of trial `i` depends only on
`run_key`, `i` and `args`: not on the chunk size, on the number of devices or hosts,
or on the index a run was resumed from.

Memory is bounded by the chunk, not the run: each chunk is one call of a jitted
`vmap(trial_fn)` over `chunk_size` indices (the last chunk is padded to the same
shape, so a run compiles once, and the padding is dropped). At most two chunks
are in flight: the next one is dispatched while the previous one's outcomes are
copied to the host. `args` are passed as
arguments of that jitted function, not closed over, so large arrays are not baked
into the program as constants and a new value of the same shape does not recompile.

Devices. With several local devices, the trial axis of each chunk is sharded over a
one-axis `jax.sharding.Mesh` of all local devices with `NamedSharding` (plain `jit`,
no `shard_map`, so a `jax.grad` inside a trial never sums over devices); `args` and
the run key are replicated. The chunk is rounded up to a multiple of the device
count.

Hosts. Once `jax.distributed.initialize()` has run on every host of a multi-host
GPU or TPU slice, `jax.process_count() > 1` and each process runs a contiguous
slice of the trials (the same number on every process; the last slices are padded
with repeats of the last trial and trimmed) on its own local devices. The slices
are then gathered with `jax.experimental.multihost_utils.process_allgather`, so
every process returns the full result. Run the same command on every host, e.g.::

  # on each host of the slice (same flags; the coordinator address from the
  # cluster environment, or passed to jax.distributed.initialize):
  python -m experiments.ami --config=configs/cifar10.py --workdir=gs://... \\
      --config.game.chunk_size=4096

with `jax.distributed.initialize()` called before any other JAX call (on Cloud
TPU and SLURM/Open MPI clusters it needs no arguments). Every process must call
`run_trials` with the same arguments, in the same order.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

_TRIAL_AXIS = 'trials'

# Callables `(trials done, trials in this call, seconds since the call began)` run after
# every chunk: the terminal progress of `fl_privacy.report.progress` shows trials/s from it.
_CHUNK_LISTENERS: list[Callable[[int, int, float], None]] = []


def add_chunk_listener(fn: Callable[[int, int, float], None]) -> Callable[[], None]:
  """Calls `fn(done, total, elapsed_s)` after every chunk; returns a function that removes it."""
  _CHUNK_LISTENERS.append(fn)

  def remove():
    if fn in _CHUNK_LISTENERS:
      _CHUNK_LISTENERS.remove(fn)
  return remove


def _round_up(value: int, multiple: int) -> int:
  return -(-value // multiple) * multiple


def _chunk_program(trial_fn: Callable[..., Any], num_args: int):
  """Returns `(run_key, indices, *args) -> vmapped outcomes` (not jitted)."""

  def chunk(run_key, indices, *args):
    if len(args) != num_args:
      raise TypeError(f'expected {num_args} args, got {len(args)}')

    def one(index):
      return trial_fn(jax.random.fold_in(run_key, index), index, *args)

    return jax.vmap(one)(indices)

  return chunk


@functools.lru_cache(maxsize=8)
def _compiled(trial_fn: Callable[..., Any], num_args: int,
              devices: tuple[jax.Device, ...]):
  """A jitted chunk function, cached so repeated runs of one game reuse it.

  Returns `(fn, index_sharding, replicated)`; the shardings are None on a
  single device.
  """
  program = _chunk_program(trial_fn, num_args)
  if len(devices) == 1:
    return jax.jit(program), None, None
  mesh = jax.sharding.Mesh(np.array(devices), (_TRIAL_AXIS,))
  sharded = jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec(_TRIAL_AXIS))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  fn = jax.jit(
      program,
      in_shardings=(replicated, sharded) + (replicated,) * num_args,
      out_shardings=sharded)
  return fn, sharded, replicated


def _empty_outcomes(trial_fn, run_key, args) -> Any:
  """Zero-length outcome arrays with the right trailing shapes and dtypes."""
  program = _chunk_program(trial_fn, len(args))
  shapes = jax.eval_shape(program, run_key, jnp.zeros((1,), jnp.int32), *args)
  return jax.tree.map(lambda s: np.zeros((0,) + s.shape[1:], s.dtype), shapes)


def _process_slice(start: int, num_trials: int) -> tuple[int, int]:
  """(first index, count) of this process's slice; equal counts on every host."""
  per_process = -(-(num_trials - start) // jax.process_count())
  first = start + jax.process_index() * per_process
  return first, per_process


def _run_local(fn, index_sharding, replicated, run_key, args,
               indices: np.ndarray, chunk_size: int, progress: bool,
               label: str) -> Any:
  """Runs `indices` (already padded to a multiple of chunk_size) chunk by chunk."""
  # Host arrays (a dataset, params) go to the devices once, not once per chunk.
  if replicated is not None:
    run_key = jax.device_put(run_key, replicated)
    args = tuple(jax.device_put(a, replicated) for a in args)
  else:
    run_key, args = jax.device_put((run_key, args))

  def launch(lo):
    chunk = indices[lo:lo + chunk_size]
    if index_sharding is not None:
      chunk = jax.device_put(chunk, index_sharding)
    return fn(run_key, chunk, *args)

  outputs = []
  total = len(indices)
  t_start = t_chunk = time.perf_counter()
  pending = launch(0)
  for lo in range(0, total, chunk_size):
    # Dispatch the next chunk before copying this one to the host, so the
    # device is not idle during the copy.
    following = launch(lo + chunk_size) if lo + chunk_size < total else None
    outputs.append(jax.tree.map(np.asarray, jax.device_get(pending)))
    pending = following
    for listener in tuple(_CHUNK_LISTENERS):
      listener(min(lo + chunk_size, total), total, time.perf_counter() - t_start)
    if progress:
      now = time.perf_counter()
      done = min(lo + chunk_size, total)
      logging.info('%s: %d/%d trials, %.1f trials/s (chunk), %.1f trials/s '
                   '(run)', label, done, total,
                   chunk_size / max(now - t_chunk, 1e-9),
                   done / max(now - t_start, 1e-9))
      t_chunk = now
  return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *outputs)


def run_trials(trial_fn: Callable[..., Any],
               run_key: jax.Array,
               num_trials: int,
               *,
               chunk_size: int,
               args: Sequence[Any] = (),
               start: int = 0,
               progress: bool = True) -> Any:
  """Runs trials `start .. num_trials - 1` of a game and stacks their outcomes.

  Args:
    trial_fn: pure, jit-able `trial_fn(key, index, *args) -> pytree` of arrays;
      `key` is `jax.random.fold_in(run_key, index)` and `index` the global trial
      index (an int32 scalar).
    run_key: the run's typed PRNG key (`jax.random.key(seed)`).
    num_trials: total number of trials of the run (exclusive end index).
    chunk_size: trials per jitted call; memory is bounded by two chunks. Rounded
      up to a multiple of the local device count.
    args: extra arguments of `trial_fn`, identical for every trial (datasets,
      params); passed to the jitted chunk as arguments, replicated on devices.
    start: first trial index, to resume a run that stopped part way.
    progress: log one absl INFO line per chunk with the throughput.

  Returns:
    The outcome pytree with numpy leaves, each with leading axis
    `num_trials - start`; row `j` is the outcome of trial `start + j`.

  Raises:
    ValueError: for a negative `start`, `start > num_trials` or `chunk_size < 1`.
  """
  num_trials = int(num_trials)
  start = int(start)
  chunk_size = int(chunk_size)
  if chunk_size < 1:
    raise ValueError(f'chunk_size must be >= 1 (got {chunk_size})')
  if not 0 <= start <= num_trials:
    raise ValueError(
        f'need 0 <= start <= num_trials (got start={start}, '
        f'num_trials={num_trials})')
  if num_trials >= 2**31:
    raise ValueError(f'num_trials must fit int32 (got {num_trials})')
  args = tuple(args)
  if num_trials == start:
    return _empty_outcomes(trial_fn, run_key, args)

  devices = tuple(jax.local_devices())
  chunk_size = _round_up(chunk_size, len(devices))
  first, count = _process_slice(start, num_trials)
  chunk_size = min(chunk_size, _round_up(count, len(devices)))
  padded = _round_up(count, chunk_size)
  # Padding repeats the last real trial: a valid index, so a trial_fn that
  # gathers data by index never sees an out-of-range one.
  indices = np.minimum(np.arange(first, first + padded), num_trials - 1)
  indices = indices.astype(np.int32)

  try:
    fn, index_sharding, replicated = _compiled(trial_fn, len(args), devices)
  except TypeError:  # an unhashable callable: compile without the cache
    fn, index_sharding, replicated = _compiled.__wrapped__(
        trial_fn, len(args), devices)
  label = getattr(trial_fn, '__name__', 'trial_fn')
  local = _run_local(fn, index_sharding, replicated, run_key, args, indices,
                     chunk_size, progress, label)
  local = jax.tree.map(lambda x: x[:count], local)
  if jax.process_count() == 1:
    return local
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  gathered = multihost_utils.process_allgather(local, tiled=True)
  return jax.tree.map(lambda x: np.asarray(x)[:num_trials - start], gathered)

