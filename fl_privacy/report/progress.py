"""Terminal progress of a sweep: point k of N, elapsed time, ETA, trials/s within a point.

One `Progress` follows a run. `fl_privacy.report.run_point` reports every point to the
active one (`active()`), the game runner reports every chunk (through
`fl_privacy.eval.runner.add_chunk_listener`), and a sweep says how many points it plans
with `plan(n)` (without it the line shows `point k` and no ETA). On a terminal the state is
one status line on stderr, redrawn in place and kept below absl's log lines::

  ami  point 4/21 (bitrand, 3)  6,500/10,000 trials, 1,020 trials/s  elapsed 1:12  ETA ~2:40

When stderr is not a terminal (a log file, CI) or the run is quiet, nothing is drawn: the
log lines already say what happened. The ETA is the mean wall time of the points computed
so far in this run times the points left (points read back on resume cost nothing), so it
is rough while the first points compile.

`experiments/common.py` activates one per run; a notebook can do the same::

  with progress.activate(progress.Progress('ami', enabled=True)):
    pipeline.sweep(config, state, store, key)
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from typing import Any, Callable, Iterator, Mapping, TextIO

from fl_privacy.eval import runner
from fl_privacy.report import summary as summary_lib

_CLEAR = '\r\x1b[2K'  # carriage return + erase the line
_MIN_REDRAW_S = 0.1

_ACTIVE: 'Progress | None' = None


def _params_text(params: Mapping[str, Any]) -> str:
  return ', '.join('-' if v is None else (f'{v:g}' if isinstance(v, float) else str(v))
                   for v in params.values())


class Progress:
  """The progress of one run, drawn as a status line when `enabled`.

  Args:
    name: the experiment's name (first word of the line).
    enabled: draw the status line (callers pass "stderr is a TTY and not --quiet").
    stream: where to draw (default stderr).
    clock: seconds, monotonic (tests pass a fake one).
    summary: the experiment's `summary.Table`s; their columns make the headline that
      `run_point` logs for each saved point.
  """

  def __init__(self, name: str, *, enabled: bool, stream: TextIO | None = None,
               clock: Callable[[], float] = time.monotonic, summary=None):
    self.name = name
    self.enabled = bool(enabled)
    self.stream = stream if stream is not None else sys.stderr
    self.clock = clock
    self.summary = summary
    self.total: int | None = None
    self.finished = 0          # points done in this run: computed or read back
    self.computed: list[float] = []  # wall times of the points computed in this run
    self.resumed: list[dict] = []    # points read back from an earlier run
    self.current: Mapping[str, Any] | None = None
    self.trials: tuple[int, int, float, str] | None = None  # (done, total, per s, unit)
    self.t_start = clock()
    self._shown = False
    self._last_draw = -1e9
    self._lock = threading.Lock()

  # ------------------------------------------------------------------ events

  def plan(self, total: int) -> None:
    """Sets the number of points the sweep will visit (computed or read back)."""
    self.total = int(total)
    self.draw(force=True)

  def point_started(self, params: Mapping[str, Any]) -> None:
    self.current = dict(params)
    self.trials = None
    self.draw(force=True)

  def point_finished(self, point: Mapping[str, Any], *, computed: bool) -> None:
    """Counts a point; `computed` False for one read back from the store."""
    self.finished += 1
    if computed:
      self.computed.append(float(point.get('elapsed_s', 0.0)))
    else:
      self.resumed.append(dict(point))
    self.current = None
    self.trials = None
    self.draw(force=True)

  def chunk(self, done: int, total: int, elapsed_s: float, unit: str = 'trials') -> None:
    """A chunk of the game runner finished: `done` of `total` `unit` after `elapsed_s`."""
    self.trials = (int(done), int(total), done / max(elapsed_s, 1e-9), unit)
    self.draw()

  # --------------------------------------------------------------- drawing

  def eta_s(self) -> float | None:
    """Seconds left: mean computed-point time x points left (None when unknown)."""
    if self.total is None or not self.computed:
      return None
    left = max(self.total - self.finished, 0)
    in_point = 0.0
    mean = sum(self.computed) / len(self.computed)
    if self.current is not None and self.trials is not None and self.trials[1]:
      in_point = mean * self.trials[0] / self.trials[1]
    return max(mean * left - in_point, 0.0)

  def line(self) -> str:
    """The status line's text."""
    k = self.finished + (1 if self.current is not None else 0)
    where = f'point {max(k, 1)}' + (f'/{self.total}' if self.total is not None else '')
    parts = [self.name, where + (f' ({_params_text(self.current)})' if self.current else '')]
    if self.trials is not None:
      done, total, per_s, unit = self.trials
      parts.append(f'{done:,}/{total:,} {unit}, {per_s:,.0f} {unit}/s')
    parts.append(f'elapsed {summary_lib.format_duration(self.clock() - self.t_start)}')
    eta = self.eta_s()
    if eta is not None:
      parts.append(f'ETA ~{summary_lib.format_duration(eta)}')
    return '  '.join(parts)

  def draw(self, force: bool = False) -> None:
    if not self.enabled:
      return
    now = self.clock()
    if not force and now - self._last_draw < _MIN_REDRAW_S:
      return
    with self._lock:
      self._last_draw = now
      self.stream.write(_CLEAR + self.line())
      self.stream.flush()
      self._shown = True

  def clear(self) -> None:
    """Erases the status line (before a log line or the final summary)."""
    if not (self.enabled and self._shown):
      return
    with self._lock:
      self.stream.write(_CLEAR)
      self.stream.flush()
      self._shown = False

  def headline(self, point: Mapping[str, Any]) -> str:
    return summary_lib.headline(self.summary, point)


def active() -> Progress | None:
  """The progress of the running experiment, or None outside `activate`."""
  return _ACTIVE


def plan(total: int) -> None:
  """Tells the active progress how many points the sweep will visit (no-op without one)."""
  if _ACTIVE is not None:
    _ACTIVE.plan(total)


def _wrap_handlers(p: Progress) -> Callable[[], None]:
  """Clears the status line before each log record on a stream handler and redraws it after."""
  # `handle`, not `emit`: absl's handler forwards `handle` to an inner handler.
  restore = []
  for handler in list(logging.getLogger().handlers):
    handle = handler.handle

    def wrapped(record, handle=handle):
      p.clear()
      try:
        return handle(record)
      finally:
        p.draw(force=True)

    handler.handle = wrapped
    restore.append((handler, handle))

  def undo():
    for handler, handle in restore:
      handler.handle = handle
  return undo


@contextlib.contextmanager
def activate(p: Progress) -> Iterator[Progress]:
  """Makes `p` the active progress: run_point and the runner's chunks report to it."""
  global _ACTIVE
  previous = _ACTIVE
  _ACTIVE = p
  remove = runner.add_chunk_listener(p.chunk)
  unwrap = _wrap_handlers(p) if p.enabled else (lambda: None)
  try:
    yield p
  finally:
    p.clear()
    unwrap()
    remove()
    _ACTIVE = previous
