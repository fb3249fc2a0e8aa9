"""Work one step ahead: the next training runs in a background thread while this one is scored.

A sweep alternates trainings (XLA: compiling a new program, then running it) with scoring
(numpy). On CPU each keeps about one core busy, so a sweep run in order leaves the other
core of a two-core machine idle most of the time. `Ahead` runs job i + 1 in one worker thread
while the caller consumes job i; results do not depend on it (every job is a pure function of
its keys and writes its artifacts atomically), only the wall time does.

The worker is a `concurrent.futures.ThreadPoolExecutor` of one thread: a job's exception
reaches the caller at `get`, and an interrupted run leaves at most the job in flight to finish
(its artifact is written atomically, so a resumed run reads it or redoes it).
"""

from __future__ import annotations

from concurrent import futures
import functools
import os
from typing import Any, Callable, Generic, Hashable, Sequence, TypeVar

T = TypeVar('T')
# `FL_PRIVACY_AHEAD=0` runs every sweep in order (one thread).
ENV = 'FL_PRIVACY_AHEAD'


def enabled() -> bool:
  """False where `$FL_PRIVACY_AHEAD` is '0'."""
  value = os.environ.get(ENV, '1').strip()
  if value not in ('0', '1'):
    raise ValueError(f'${ENV} must be 0 or 1 (got {value!r})')
  return value == '1'


class Ahead(Generic[T]):
  """`get(k)` returns job k's result and starts the job after k in the background.

  Args:
    jobs: (key, job) in the order the caller will `get` them; `job()` computes the result.
    enabled: False runs every job in the caller's thread when it is asked for (the sequential
      reference of `benchmarks`).
  """

  def __init__(self, jobs: Sequence[tuple[Hashable, Callable[[], T]]], *, enabled: bool = True):
    self._order = [k for k, _ in jobs]
    self._jobs = dict(jobs)
    if len(self._jobs) != len(self._order):
      raise ValueError('job keys must be distinct')
    self._pool = futures.ThreadPoolExecutor(1, 'ahead') if enabled else None
    self._running: dict[Hashable, futures.Future] = {}

  def _start(self, key: Hashable) -> None:
    if self._pool is not None and key not in self._running:
      self._running[key] = self._pool.submit(self._jobs[key])

  def get(self, key: Hashable) -> T:
    """Job `key`'s result (waiting for it, or running it now); starts the next job first."""
    if self._pool is None:
      return self._jobs[key]()
    self._start(key)
    i = self._order.index(key)
    if i + 1 < len(self._order):
      self._start(self._order[i + 1])
    # Popped: a result is handed over once and not kept alive by this object.
    return self._running.pop(key).result()

  def close(self) -> None:
    """Waits for the job in flight, if any, and stops the worker."""
    if self._pool is not None:
      self._pool.shutdown(wait=True, cancel_futures=True)


def over(items: Sequence[Any], job: Callable[[Any], T], needed: Callable[[Any], bool]
         ) -> Ahead[T]:
  """`Ahead` keyed by position over the items for which `needed(item)` (a training with a
  point the store lacks), job i = `job(items[i])`; `enabled()` decides whether it runs ahead."""
  return Ahead([(i, functools.partial(job, item)) for i, item in enumerate(items)
                if needed(item)], enabled=enabled())
