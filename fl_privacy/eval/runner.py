"""The security-game runner: many independent trials as jit + vmap chunks.

A game is a pure function `trial_fn(key, index, *args) -> pytree`. `run_trials`
evaluates it for trial indices `start, ..., num_trials - 1` with the per-trial key
`jax.random.fold_in(run_key, index)`, so the outcome of trial `i` depends only on
`run_key`, `i` and `args`: not on the chunk size, on the number of devices or hosts,
or on the index a run was resumed from.

Memory is bounded by the chunk, not the run: each chunk is one call of a jitted
program over `chunk_size` indices (the last chunk is padded to the same shape, so
a run compiles once, and the padding is dropped). At most two chunks are in
flight: the next one is dispatched while the previous one's outcomes are copied
to the host. `args` are passed as arguments of that jitted function, not closed
over, so large arrays are not baked into the program as constants and a new value
of the same shape does not recompile.

Width by bytes, not by count. Inside a chunk, trials run as a `lax.map` over
groups of `width` trials, each group one `vmap(trial_fn)`. The width is chosen so
that a group's working set (XLA's temporary buffers of one trial, from
`memory_analysis()` of the compiled single-trial program, times the width) stays
within `batch_bytes`: on a CPU, once one threefry draw passes a few MiB it falls
out of cache and runs about 4x slower (the AMI game at the paper's size ran 1,550
trials/s at width 4 and 290/s at width 1,000). `batch_bytes=None` takes
`default_batch_bytes()` (`DEFAULT_BATCH_BYTES[backend]`, or the environment
variable `FL_PRIVACY_BATCH_BYTES`); accelerators get a large budget because width
is what pays there. With `chunk_size=None` the chunk is `CHUNK_GROUPS` groups
(at most the run). Since every trial's key is `fold_in(run_key, index)`, neither
the chunk nor the width changes which random numbers a trial sees; decisions and
integer outcomes are bit-identical, and float outcomes agree to float rounding
(XLA may order a reduction differently at another width).

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
import os
import time
from typing import Any, Callable, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

_TRIAL_AXIS = 'trials'

# Working-set budget of one vmapped group of trials, per backend. CPU: the knee measured on
# the 2-core development machine (benchmarks/README.md: the AMI game at paper size and the
# white-box audit both run fastest with groups of 4-16 MiB of XLA temporaries and fall off
# beyond ~32 MiB, when threefry's words leave the cache). Accelerators: width pays, so the
# budget only guards memory.
DEFAULT_BATCH_BYTES = {'cpu': 8 << 20, 'gpu': 1 << 30, 'cuda': 1 << 30, 'rocm': 1 << 30,
                       'tpu': 1 << 30}
BATCH_BYTES_ENV = 'FL_PRIVACY_BATCH_BYTES'
# Groups per chunk when `chunk_size=None`: enough that Python dispatch and the host copy are
# negligible next to the work, few enough that a chunk's outcomes stay small.
CHUNK_GROUPS = 64
# Group width when XLA gives no memory analysis of the trial (some backends): a count small
# enough to stay in cache for most games, instead of a budget-sized guess.
UNKNOWN_BYTES_WIDTH = 16

# Callables `(trials done, trials in this call, seconds since the call began, unit)` run
# after every chunk: the terminal progress of `fl_privacy.report.progress` shows trials/s
# from it. The counts are this process's real trials (the padding of the last chunk is not
# counted: the results hold exactly `num_trials`); `unit` names them ('trials', 'runs').
_CHUNK_LISTENERS: list[Callable[[int, int, float, str], None]] = []


def add_chunk_listener(fn: Callable[[int, int, float, str], None]) -> Callable[[], None]:
  """Calls `fn(done, total, elapsed_s, unit)` after every chunk; returns its remover."""
  _CHUNK_LISTENERS.append(fn)

  def remove():
    if fn in _CHUNK_LISTENERS:
      _CHUNK_LISTENERS.remove(fn)
  return remove


def _round_up(value: int, multiple: int) -> int:
  return -(-value // multiple) * multiple


def default_batch_bytes(backend: str | None = None) -> int:
  """The working-set budget of one vmapped group of trials, in bytes.

  `$FL_PRIVACY_BATCH_BYTES` if set, else `DEFAULT_BATCH_BYTES[backend]` (backend defaults
  to `jax.default_backend()`; an unknown one gets the accelerator budget).
  """
  env = os.environ.get(BATCH_BYTES_ENV)
  if env:
    value = int(float(env))
    if value < 1:
      raise ValueError(f'{BATCH_BYTES_ENV} must be >= 1 (got {env!r})')
    return value
  return DEFAULT_BATCH_BYTES.get(backend or jax.default_backend(), 1 << 30)


def _one_trial(trial_fn: Callable[..., Any]):
  def one(run_key, index, *args):
    return trial_fn(jax.random.fold_in(run_key, index), index, *args)
  return one


def _chunk_program(trial_fn: Callable[..., Any], num_args: int):
  """Returns `(run_key, indices [k, w], *args) -> outcomes [k, w, ...]` (not jitted).

  The k groups run one after another (`lax.map`), the w trials of a group side by side
  (`vmap`), so the working set is one group's.
  """
  one = _one_trial(trial_fn)

  def chunk(run_key, indices, *args):
    if len(args) != num_args:
      raise TypeError(f'expected {num_args} args, got {len(args)}')
    if indices.shape[1] == 1 and indices.shape[0] > 1:
      # One trial per group: map the trial itself. A width-1 vmap would give every op a
      # batch dimension of 1, and XLA:CPU runs batched dots and convolutions on slower
      # paths than the plain ones (the dishonest-server runs went at 0.37x a loop of jitted
      # runs that way).
      single = jax.lax.map(lambda index: one(run_key, index, *args), indices[:, 0])
      return jax.tree.map(lambda x: x[:, None], single)
    group = jax.vmap(lambda index: one(run_key, index, *args))
    if indices.shape[0] == 1:  # no loop to compile when one group is the chunk
      return jax.tree.map(lambda x: x[None], group(indices[0]))
    return jax.lax.map(group, indices)

  return chunk


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
  # Indices are [groups, width]: the width (trials side by side) is split over devices.
  sharded = jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec(None, _TRIAL_AXIS))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  fn = jax.jit(
      program,
      in_shardings=(replicated, sharded) + (replicated,) * num_args,
      out_shardings=sharded)
  return fn, sharded, replicated


# Cached by rebinding, not by a decorator: mutmut skips decorated functions.
_compiled = functools.lru_cache(maxsize=8)(_compiled)


def _signature(args) -> tuple:
  leaves, treedef = jax.tree.flatten(args)
  return treedef, tuple((np.shape(a), str(jnp.result_type(a))) for a in leaves)


_TRIAL_BYTES: dict = {}


def trial_bytes(trial_fn: Callable[..., Any], run_key: jax.Array, args: Sequence[Any]) -> int:
  """XLA's working set of one trial: temporaries plus outcome bytes of the compiled trial.

  Compiles the single-trial program once per (trial_fn, argument shapes) in a process (the
  persistent compilation cache makes later processes cheap) and reads
  `Compiled.memory_analysis()`; arguments are excluded (they are shared by every trial).
  Returns 0 when the backend gives no analysis.
  """
  args = tuple(args)
  try:
    cache_key = (trial_fn, _signature((run_key, args)))
    hash(cache_key)
  except TypeError:
    cache_key = None
  if cache_key is not None and cache_key in _TRIAL_BYTES:
    return _TRIAL_BYTES[cache_key]
  compiled = jax.jit(_one_trial(trial_fn)).lower(run_key, jnp.int32(0), *args).compile()
  try:
    analysis = compiled.memory_analysis()
    value = int(analysis.temp_size_in_bytes) + int(analysis.output_size_in_bytes)
  except (AttributeError, NotImplementedError, RuntimeError, TypeError):
    value = 0
  if cache_key is not None:
    _TRIAL_BYTES[cache_key] = value
  return value


def group_width(trial_fn: Callable[..., Any], run_key: jax.Array, args: Sequence[Any],
                batch_bytes: int | None = None) -> int:
  """Trials per vmapped group (per device): max(1, batch_bytes // trial_bytes).

  Without a memory analysis (`trial_bytes` 0) the width is `UNKNOWN_BYTES_WIDTH`, capped by
  the budget in bytes.
  """
  budget = default_batch_bytes() if batch_bytes is None else int(batch_bytes)
  per_trial = trial_bytes(trial_fn, run_key, args)
  if per_trial <= 0:
    return max(1, min(UNKNOWN_BYTES_WIDTH, budget))
  return max(1, budget // per_trial)


def _layout(count: int, chunk_size: int | None, width: int,
            num_devices: int) -> tuple[int, int]:
  """(groups per chunk k, group width w) for `count` trials of this process.

  w is a multiple of the device count; k * w is the chunk.
  """
  width = min(width * num_devices, _round_up(count, num_devices))
  if chunk_size is None:
    groups = max(1, min(CHUNK_GROUPS, -(-count // width)))
    return groups, width
  chunk = min(_round_up(chunk_size, num_devices), _round_up(count, num_devices))
  groups = -(-chunk // width)
  # Equal groups that cover the requested chunk (rounded up by less than one group).
  width = _round_up(-(-chunk // groups), num_devices)
  return groups, width


def _empty_outcomes(trial_fn, run_key, args) -> Any:
  """Zero-length outcome arrays with the right trailing shapes and dtypes."""
  program = _chunk_program(trial_fn, len(args))
  shapes = jax.eval_shape(program, run_key, jnp.zeros((1, 1), jnp.int32), *args)
  return jax.tree.map(lambda s: np.zeros((0,) + s.shape[2:], s.dtype), shapes)


def _process_slice(start: int, num_trials: int) -> tuple[int, int]:
  """(first index, count) of this process's slice; equal counts on every host."""
  per_process = -(-(num_trials - start) // jax.process_count())
  first = start + jax.process_index() * per_process
  return first, per_process


def _run_local(fn, index_sharding, replicated, run_key, args,
               indices: np.ndarray, progress: bool, label: str, count: int,
               unit: str = 'trials') -> Any:
  """Runs `indices` [chunks, k, w] chunk by chunk; returns outcomes [chunks * k * w, ...].

  `count` is how many of the indices are real trials (the rest pad the last chunk): what the
  listeners and the log line count.
  """
  # Host arrays (a dataset, params) go to the devices once, not once per chunk.
  if replicated is not None:
    run_key = jax.device_put(run_key, replicated)
    args = tuple(jax.device_put(a, replicated) for a in args)
  else:
    run_key, args = jax.device_put((run_key, args))

  def launch(c):
    chunk = indices[c]
    if index_sharding is not None:
      chunk = jax.device_put(chunk, index_sharding)
    return fn(run_key, chunk, *args)

  def flat(x):
    x = np.asarray(x)
    return x.reshape((-1,) + x.shape[2:])

  outputs = []
  num_chunks, chunk_size = indices.shape[0], indices.shape[1] * indices.shape[2]
  total = count
  t_start = t_chunk = time.perf_counter()
  pending = launch(0)
  for c in range(num_chunks):
    # Dispatch the next chunk before copying this one to the host, so the
    # device is not idle during the copy.
    following = launch(c + 1) if c + 1 < num_chunks else None
    outputs.append(jax.tree.map(flat, jax.device_get(pending)))
    pending = following
    done = min((c + 1) * chunk_size, total)
    for listener in tuple(_CHUNK_LISTENERS):
      listener(done, total, time.perf_counter() - t_start, unit)
    if progress:
      now = time.perf_counter()
      logging.info('%s: %d/%d %s, %.1f %s/s (chunk), %.1f %s/s '
                   '(run)', label, done, total, unit,
                   (done - min(c * chunk_size, total)) / max(now - t_chunk, 1e-9), unit,
                   done / max(now - t_start, 1e-9), unit)
      t_chunk = now
  return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *outputs)


def plan(trial_fn: Callable[..., Any], run_key: jax.Array, num_trials: int, *,
         chunk_size: int | None = None, args: Sequence[Any] = (), start: int = 0,
         batch_bytes: int | None = None) -> dict[str, int]:
  """How `run_trials` would split this process's trials: {'chunk', 'groups', 'width'}.

  `width` counts trials side by side over all local devices; `chunk = groups * width`.
  """
  devices = jax.local_devices()
  _, count = _process_slice(int(start), int(num_trials))
  width = group_width(trial_fn, run_key, args, batch_bytes)
  groups, width = _layout(max(count, 1), chunk_size, width, len(devices))
  return {'chunk': groups * width, 'groups': groups, 'width': width}


def run_trials(trial_fn: Callable[..., Any],
               run_key: jax.Array,
               num_trials: int,
               *,
               chunk_size: int | None = None,
               args: Sequence[Any] = (),
               start: int = 0,
               progress: bool = True,
               batch_bytes: int | None = None,
               unit: str = 'trials') -> Any:
  """Runs trials `start .. num_trials - 1` of a game and stacks their outcomes.

  Args:
    trial_fn: pure, jit-able `trial_fn(key, index, *args) -> pytree` of arrays;
      `key` is `jax.random.fold_in(run_key, index)` and `index` the global trial
      index (an int32 scalar).
    run_key: the run's typed PRNG key (`jax.random.key(seed)`).
    num_trials: total number of trials of the run (exclusive end index).
    chunk_size: trials per jitted call (memory is bounded by two chunks), an
      explicit override; None (the default) takes `CHUNK_GROUPS` groups of the
      byte-sized width. Rounded up to a multiple of the group width and of the
      local device count.
    args: extra arguments of `trial_fn`, identical for every trial (datasets,
      params); passed to the jitted chunk as arguments, replicated on devices.
    start: first trial index, to resume a run that stopped part way.
    progress: log one absl INFO line per chunk with the throughput.
    batch_bytes: working-set budget of one vmapped group of trials (see the
      module docstring); None = `default_batch_bytes()`.
    unit: what one trial is, for the progress line and the log ('trials'; 'runs' for a
      game whose trial is a whole federated run).

  Returns:
    The outcome pytree with numpy leaves, each with leading axis
    `num_trials - start`; row `j` is the outcome of trial `start + j`.

  Raises:
    ValueError: for a negative `start`, `start > num_trials`, `chunk_size < 1`
      or `batch_bytes < 1`.
  """
  num_trials = int(num_trials)
  start = int(start)
  if chunk_size is not None:
    chunk_size = int(chunk_size)
    if chunk_size < 1:
      raise ValueError(f'chunk_size must be >= 1 (got {chunk_size})')
  if batch_bytes is not None and int(batch_bytes) < 1:
    raise ValueError(f'batch_bytes must be >= 1 (got {batch_bytes})')
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
  first, count = _process_slice(start, num_trials)
  width = group_width(trial_fn, run_key, args, batch_bytes)
  groups, width = _layout(count, chunk_size, width, len(devices))
  padded = _round_up(count, groups * width)
  # Padding repeats the last real trial: a valid index, so a trial_fn that
  # gathers data by index never sees an out-of-range one.
  indices = np.minimum(np.arange(first, first + padded), num_trials - 1)
  indices = indices.astype(np.int32).reshape(-1, groups, width)

  try:
    fn, index_sharding, replicated = _compiled(trial_fn, len(args), devices)
  except TypeError:  # an unhashable callable: compile without the cache
    fn, index_sharding, replicated = _compiled.__wrapped__(
        trial_fn, len(args), devices)
  label = getattr(trial_fn, '__name__', 'trial_fn')
  local = _run_local(fn, index_sharding, replicated, run_key, args, indices,
                     progress, label, count, unit)
  local = jax.tree.map(lambda x: x[:count], local)
  if jax.process_count() == 1:
    return local
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  gathered = multihost_utils.process_allgather(local, tiled=True)
  return jax.tree.map(lambda x: np.asarray(x)[:num_trials - start], gathered)


def validate_options(config) -> None:
  """Raises `ConfigError` unless `game.chunk_size` and `game.batch_bytes` are None or > 0."""
  from fl_privacy import validate  # pylint: disable=g-import-not-at-top
  for field in ('chunk_size', 'batch_bytes'):
    value = config.game.get(field)
    validate.require(value is None or (isinstance(value, int) and not isinstance(value, bool)
                                       and value >= 1),
                     f'game.{field}', 'None (automatic) or an integer >= 1', value)


def options(config) -> dict[str, int | None]:
  """`run_trials` keyword arguments from a config's `game` section (chunk_size, batch_bytes)."""
  game = config.game
  chunk = game.get('chunk_size')
  budget = game.get('batch_bytes')
  return {'chunk_size': None if chunk is None else int(chunk),
          'batch_bytes': None if budget is None else int(budget)}
