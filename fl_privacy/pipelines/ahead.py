"""Work ahead: the next trainings run in a background thread while this one is scored.

A sweep alternates trainings (XLA: compiling a new program, then running it) with scoring
(numpy). On CPU each keeps about one core busy, so a sweep run in order leaves the other
core of a two-core machine idle most of the time. `Ahead` runs jobs i + 1 .. i + depth, one
after the other, in one worker thread while the caller consumes job i; results do not depend
on it (every job is a pure function of its keys and writes its artifacts atomically), only the
wall time and the memory do (up to depth + 1 results held at once). More than one job ahead
helps where the scoring of some trainings is slow and that of others fast (the worker would
otherwise wait during the slow stretch and the caller during the fast one), not where the
trainings are the longer work throughout: FedMIA's cold default took 6 min 25 s one ahead and
6 min 43 s three ahead (one run each, 2026-11-27), so the default stays 1.

The worker is a `concurrent.futures.ThreadPoolExecutor` of one thread: a job's exception
reaches the caller at `get`, and an interrupted run leaves at most the job in flight to finish
(queued ones are cancelled; artifacts are written atomically, so a resumed run reads them or
redoes them).
"""

from __future__ import annotations

from concurrent import futures
import functools
import os
from typing import Any, Callable, Generic, Hashable, Sequence, TypeVar

T = TypeVar('T')
# `FL_PRIVACY_AHEAD=n`: up to n trainings ahead of the scoring; 0 runs every sweep in order.
ENV = 'FL_PRIVACY_AHEAD'
DEFAULT_DEPTH = 1
_MAX_DEPTH = 64


def depth() -> int:
  """Trainings run ahead: `$FL_PRIVACY_AHEAD` (an integer 0-64; 0 = in order), default 1."""
  value = os.environ.get(ENV, str(DEFAULT_DEPTH)).strip()
  if not (value.isdigit() and int(value) <= _MAX_DEPTH):
    raise ValueError(f'${ENV} must be an integer from 0 (in order) to {_MAX_DEPTH} '
                     f'(trainings ahead; default {DEFAULT_DEPTH}) (got {value!r})')
  return int(value)


def enabled() -> bool:
  """False where `$FL_PRIVACY_AHEAD` is '0'."""
  return depth() > 0


class Ahead(Generic[T]):
  """`get(k)` returns job k's result and queues the `depth` jobs after k in the background.

  Args:
    jobs: (key, job) in the order the caller will `get` them; `job()` computes the result.
    enabled: False runs every job in the caller's thread when it is asked for (the sequential
      reference of `benchmarks`).
    depth: jobs queued ahead of the one asked for (>= 1).
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
    self._pool = futures.ThreadPoolExecutor(1, 'ahead') if enabled else None
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


def over(items: Sequence[Any], job: Callable[[Any], T], needed: Callable[[Any], bool]
         ) -> Ahead[T]:
  """`Ahead` keyed by position over the items for which `needed(item)` (a training with a
  point the store lacks), job i = `job(items[i])`; `depth()` jobs ahead (0: in order)."""
  n = depth()
  return Ahead([(i, functools.partial(job, item)) for i, item in enumerate(items)
                if needed(item)], enabled=n > 0, depth=max(n, 1))
