"""Work ahead: the next trainings run in background threads while this one is scored.

A sweep alternates trainings (XLA: compiling a new program, then running it) with scoring
(numpy). On CPU each keeps about one core busy, so a sweep run in order leaves the other
core of a two-core machine idle most of the time. `Ahead` runs jobs i + 1 .. i + depth, each
on its own worker thread, while the caller consumes job i; results do not depend on it (every
job is a pure function of its keys and writes its artifacts atomically), only the wall time
and the memory do (up to depth + 1 results held at once).

The depth that pays depends on where the time goes, so each pipeline names its own
(`over(..., default_depth=)`) and `$FL_PRIVACY_AHEAD` overrides it for all. Measured on the
2-core machine from an empty compilation cache (2026-11-27/28, identical results in every
run): FedMIA, whose trainings are mostly compilation, 5 min 39 s to 6 min 4 s at depth 1
(three runs; 5 min 8 s to 5 min 20 s on 2026-11-28 with a shorter figure phase) and 5 min
52 s at 2 (one, before that); PASTEL, whose 18 x 10 trainings mostly run and whose
scoring waits for them, 6 min 15 s at 1 (one) and 5 min 14 s to 5 min 48 s at 2 (three). A
single worker with three jobs queued was slower for FedMIA too (6 min 43 s against 6 min 25 s,
before its compile savings).

A job's exception reaches the caller at `get`; an interrupted run leaves at most the jobs in
flight to finish (queued ones are cancelled; artifacts are written atomically, so a resumed run
reads them or redoes them).
"""

from __future__ import annotations

from concurrent import futures
import functools
import os
from typing import Any, Callable, Generic, Hashable, Sequence, TypeVar

T = TypeVar('T')
# `FL_PRIVACY_AHEAD=n`: n trainings ahead of the scoring in every pipeline (0: in order); unset,
# each pipeline's own default.
ENV = 'FL_PRIVACY_AHEAD'
_MAX_DEPTH = 64


def depth(default: int = 1) -> int:
  """Trainings run ahead: `$FL_PRIVACY_AHEAD` (an integer 0-64; 0 = in order), else `default`."""
  if ENV not in os.environ:
    return default
  value = os.environ[ENV].strip()
  if not (value.isdigit() and int(value) <= _MAX_DEPTH):
    raise ValueError(f'${ENV} must be an integer from 0 (in order) to {_MAX_DEPTH} '
                     f"(trainings ahead; unset: each pipeline's default) (got {value!r})")
  return int(value)


def enabled() -> bool:
  """False where `$FL_PRIVACY_AHEAD` is '0'."""
  return depth() > 0


class Ahead(Generic[T]):
  """`get(k)` returns job k's result and starts the `depth` jobs after k in the background.

  Args:
    jobs: (key, job) in the order the caller will `get` them; `job()` computes the result.
    enabled: False runs every job in the caller's thread when it is asked for (the sequential
      reference of `benchmarks`).
    depth: jobs run ahead of the one asked for, each on its own thread (>= 1).
  """

  def __init__(self, jobs: Sequence[tuple[Hashable, Callable[[], T]]], *, enabled: bool = True,
               depth: int = 1):
    self._order = [k for k, _ in jobs]
    self._jobs = dict(jobs)
    if len(self._jobs) != len(self._order):
      raise ValueError('job keys must be distinct')
    if depth < 1:
      raise ValueError(f'depth must be >= 1 (got {depth})')
    self._depth = depth
    self._pool = futures.ThreadPoolExecutor(depth, 'ahead') if enabled else None
    self._running: dict[Hashable, futures.Future] = {}

  def _start(self, key: Hashable) -> None:
    if self._pool is not None and key not in self._running:
      self._running[key] = self._pool.submit(self._jobs[key])

  def get(self, key: Hashable) -> T:
    """Job `key`'s result (waiting for it, or running it now); queues the next jobs first."""
    if self._pool is None:
      return self._jobs[key]()
    self._start(key)
    i = self._order.index(key)
    for after in self._order[i + 1:i + 1 + self._depth]:
      self._start(after)
    # Popped: a result is handed over once and not kept alive by this object.
    return self._running.pop(key).result()

  def close(self) -> None:
    """Waits for the job in flight, if any, cancels the queued ones and stops the worker."""
    if self._pool is not None:
      self._pool.shutdown(wait=True, cancel_futures=True)


def over(items: Sequence[Any], job: Callable[[Any], T], needed: Callable[[Any], bool], *,
         default_depth: int = 1) -> Ahead[T]:
  """`Ahead` keyed by position over the items for which `needed(item)` (a training with a
  point the store lacks), job i = `job(items[i])`; `depth(default_depth)` jobs ahead (0: in
  order)."""
  n = depth(default_depth)
  return Ahead([(i, functools.partial(job, item)) for i, item in enumerate(items)
                if needed(item)], enabled=n > 0, depth=max(n, 1))
