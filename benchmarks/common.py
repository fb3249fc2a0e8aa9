"""Shared helpers of the benchmarks: timing, peak memory, the report format.

Every benchmark prints a readable table and, as its LAST line, one JSON object
`{"name", "items_per_s", "reference_items_per_s", "ratio", "peak_rss_mb"}`, where
the reference is the same work done by a straightforward sequential numpy loop
and `ratio = items_per_s / reference_items_per_s`.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import jax


def time_median(fn: Callable[[], Any], *, warmup: int = 1,
                repeats: int = 5) -> float:
  """Median wall time of `fn()` in seconds, after `warmup` untimed calls.

  JAX results are waited for (`jax.block_until_ready`), so asynchronous dispatch
  does not hide work.
  """
  if repeats < 1:
    raise ValueError(f'repeats must be >= 1 (got {repeats})')
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def peak_rss_mb() -> float:
  """Peak resident memory of this process so far, in MiB.

  On Linux this is `VmHWM` of /proc/self/status: `ru_maxrss` survives `execve`,
  so a subprocess started by a large parent would report the parent's peak.
  Elsewhere `resource.getrusage(RUSAGE_SELF).ru_maxrss`.
  """
  try:
    with open('/proc/self/status', encoding='ascii') as f:
      for line in f:
        if line.startswith('VmHWM:'):
          return int(line.split()[1]) / 1024
  except OSError:
    pass
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  # Linux reports KiB, macOS bytes.
  return peak / (1024 * 1024) if sys.platform == 'darwin' else peak / 1024


def _fmt(value: Any) -> str:
  if isinstance(value, float):
    return f'{value:,.3g}' if abs(value) < 100 else f'{value:,.0f}'
  return str(value)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
  """Rows (dicts with the same keys) as an aligned text table."""
  if not rows:
    return ''
  cols = list(rows[0])
  cells = [[_fmt(r.get(c, '')) for c in cols] for r in rows]
  widths = [max(len(c), *(len(row[i]) for row in cells))
            for i, c in enumerate(cols)]
  line = lambda vals: '  '.join(v.rjust(w) for v, w in zip(vals, widths))
  return '\n'.join([line(cols), line(['-' * w for w in widths])] +
                   [line(row) for row in cells])


def report(name: str, rows: Sequence[Mapping[str, Any]], items_per_s: float,
           reference_items_per_s: float, peak_rss_mb: float) -> dict:
  """Prints the table, then the one-line JSON summary (last line); returns it."""
  summary = {
      'name': name,
      'items_per_s': float(items_per_s),
      'reference_items_per_s': float(reference_items_per_s),
      'ratio': float(items_per_s) / float(reference_items_per_s),
      'peak_rss_mb': float(peak_rss_mb),
  }
  print(f'== {name} ==')
  print(format_table(rows))
  print(json.dumps(summary), flush=True)
  return summary
