"""The end-of-run summary: a compact table of each experiment's headline metrics.

An experiment declares what matters in its results as one or more `Table`s of `Column`s;
the same columns give the one-line headline logged when a point is saved (`headline`) and
the table printed when the run ends (`render`), followed by where the results went
(`outputs`). Example (the LDP audit)::

  SUMMARY = (summary.Table('LDP audit', (
      summary.param('crafter'), summary.param('distinguisher'), summary.param('epsilon'),
      summary.bound('eps_emp', 'eps_emp_lower', 'eps_emp [95% lower]'))),)

Columns read the stored point (`{'params', 'metrics', 'n_trials', 'elapsed_s'}`) as the
results store keeps it, so a table drawn after a resume shows the same numbers as
`results.json`. A metric missing from a point prints as `-`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Mapping, Sequence

Point = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Column:
  """One column: its title, how to write a point's cell, and whether log lines show it."""
  title: str
  cell: Callable[[Point], str]
  in_headline: bool = True


@dataclasses.dataclass(frozen=True)
class Table:
  """The columns of one kind of point.

  Attributes:
    title: printed above the table.
    columns: the headline columns, in order.
    where: params a point must have (equal values) to belong to this table, e.g.
      `{'part': 'game'}`, or a predicate of the params; None takes every point.
  """
  title: str
  columns: tuple[Column, ...]
  where: Mapping[str, Any] | Callable[[Mapping[str, Any]], bool] | None = None

  def matches(self, point: Point) -> bool:
    params = point.get('params', {})
    if callable(self.where):
      return bool(self.where(params))
    return all(params.get(k) == v for k, v in (self.where or {}).items())


def _number(value: Any) -> float | None:
  # The store keeps non-finite values as the strings "inf"/"-inf"/"nan".
  if isinstance(value, bool):
    return float(value)
  try:
    return float(value)
  except (TypeError, ValueError):
    return None


def _fmt(value: Any, digits: int) -> str:
  x = _number(value)
  if x is None:
    return '-' if value is None else str(value)
  if math.isnan(x):
    return 'nan'
  if math.isinf(x):
    return 'inf' if x > 0 else '-inf'
  if x == int(x) and abs(x) < 1e15 and isinstance(value, int):
    return f'{int(x):,}'
  return f'{x:.{digits}f}'


def param(name: str, title: str | None = None) -> Column:
  """A swept parameter as it was stored (None prints as `-`)."""
  def cell(p):
    v = p.get('params', {}).get(name)
    if v is None:
      return '-'
    if isinstance(v, float):
      return f'{v:g}'
    return str(v)
  return Column(title or name, cell)


def as_number(value):
  """A stored metric as a float ('nan' / 'inf' as the store keeps them) or, for a label such
  as `dp_unit`, the string itself."""
  try:
    return float(value)
  except (TypeError, ValueError):
    return value


def metric(name: str, title: str | None = None, digits: int = 3,
           nan: str = 'nan') -> Column:
  """A metric with `digits` decimals (integers keep their digits); NaN prints as `nan`.

  `nan='-'` suits a metric that is NaN by design where it does not apply (a DP epsilon of
  a defense that is not DP).
  """
  def cell(p):
    text = _fmt(p.get('metrics', {}).get(name), digits)
    return nan if text == 'nan' else text
  return Column(title or name, cell)


def rate(name: str, title: str | None = None, digits: int = 3) -> Column:
  """A rate with its interval: `0.512 [0.497, 0.527]` (from `x`, `x_ci_low`, `x_ci_high`)."""
  def cell(p):
    m = p.get('metrics', {})
    if name not in m:
      return '-'
    low, high = m.get(f'{name}_ci_low'), m.get(f'{name}_ci_high')
    text = _fmt(m[name], digits)
    if low is None or high is None:
      return text
    return f'{text} [{_fmt(low, digits)}, {_fmt(high, digits)}]'
  return Column(title or f'{name} [95% CI]', cell)


def bound(name: str, lower: str, title: str | None = None, digits: int = 2) -> Column:
  """An estimate with its one-sided lower bound: `3.91 [3.71]`."""
  def cell(p):
    m = p.get('metrics', {})
    if name not in m:
      return '-'
    return f'{_fmt(m[name], digits)} [{_fmt(m.get(lower), digits)}]'
  return Column(title or f'{name} [{lower}]', cell)


def flag(name: str, title: str | None = None, text: str = 'YES') -> Column:
  """`text` where the metric is non-zero, blank otherwise (e.g. a privacy violation)."""
  def cell(p):
    x = _number(p.get('metrics', {}).get(name))
    return text if x else ''
  return Column(title or name, cell)


def seconds(title: str = 'time') -> Column:
  """The point's wall time."""
  return Column(title, lambda p: format_duration(float(p.get('elapsed_s', 0.0))),
                in_headline=False)


def format_duration(seconds_: float) -> str:
  """`42.0 s`, `3:05` (min:s) or `1:02:03` (h:min:s)."""
  if not math.isfinite(seconds_):
    return '?'
  if seconds_ < 60:
    return f'{seconds_:.1f} s'
  s = int(round(seconds_))
  h, rest = divmod(s, 3600)
  m, s = divmod(rest, 60)
  return f'{h}:{m:02d}:{s:02d}' if h else f'{m}:{s:02d}'


def as_tables(spec: Table | Sequence[Table] | None) -> tuple[Table, ...]:
  if spec is None:
    return ()
  if isinstance(spec, Table):
    return (spec,)
  return tuple(spec)


def table_for(spec, point: Point) -> Table | None:
  """The first table of `spec` that `point` belongs to."""
  for t in as_tables(spec):
    if t.matches(point):
      return t
  return None


def headline(spec, point: Point) -> str:
  """`title value, title value` of the point's headline metric columns (params left out).

  Params are left out because the log line that carries the headline names them already.
  """
  table = table_for(spec, point)
  if table is None:
    return ''
  params = point.get('params', {})
  cells = []
  for c in table.columns:
    if c.title in params or not c.in_headline:
      continue
    value = c.cell(point)
    if value not in ('', '-'):
      cells.append(f'{c.title} {value}')
  return ', '.join(cells)


def _grid(titles: list[str], rows: list[list[str]]) -> list[str]:
  widths = [max([len(t)] + [len(r[i]) for r in rows]) for i, t in enumerate(titles)]
  def line(cells):
    return '  '.join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
  return [line(titles), line(['-' * w for w in widths])] + [line(r) for r in rows]


def render(spec, points: Sequence[Point], *, resumed: Sequence[Point] = ()) -> str:
  """The summary tables of `points` as aligned plain text.

  Args:
    spec: a `Table` or a sequence of them.
    points: the stored points, in store order.
    resumed: points read back from an earlier run rather than computed now; their
      rows are marked `*`.

  Returns:
    The text (no trailing newline); points that no table claims are counted, not shown.
  """
  tables = as_tables(spec)
  old = [p.get('params') for p in resumed]
  blocks, claimed = [], 0
  for t in tables:
    mine = [p for p in points if table_for(tables, p) is t]
    if not mine:
      continue
    claimed += len(mine)
    titles = [''] + [c.title for c in t.columns]
    rows = [['*' if p.get('params') in old else ''] + [c.cell(p) for c in t.columns]
            for p in mine]
    if not any(r[0] for r in rows):  # no resumed rows: drop the marker column
      titles, rows = titles[1:], [r[1:] for r in rows]
    blocks.append('\n'.join([f'{t.title} ({len(mine)} point(s))'] + _grid(titles, rows)))
  if resumed and any(p.get('params') in old for p in points):
    blocks.append('* read back from an earlier run in this workdir, not recomputed')
  if claimed < len(points):
    blocks.append(f'{len(points) - claimed} other point(s): see results.csv')
  return '\n\n'.join(blocks)


def outputs(workdir: str) -> str:
  """Where a run's files are: results, figures and the other files / folders in `workdir`."""
  try:
    names = sorted(os.listdir(workdir))
  except OSError:
    return f'workdir: {workdir} (not found)'
  files = [n for n in names if os.path.isfile(os.path.join(workdir, n))]
  pngs = [n for n in files if n.endswith('.png')]
  results = [n for n in ('results.json', 'results.csv') if n in files]
  others = [n for n in files if n not in pngs and n not in results and not n.startswith('.')]
  folders = []
  for n in names:
    path = os.path.join(workdir, n)
    if os.path.isdir(path):
      folders.append(f'{n}/ ({len(os.listdir(path))} files)')
  lines = [f'workdir: {os.path.abspath(workdir)}',
           f'  results: {", ".join(results) or "(none)"}']
  if pngs:
    lines.append(f'  figures: {", ".join(pngs)}')
  if others or folders:
    lines.append(f'  also:    {", ".join(others + folders)}')
  return '\n'.join(lines)
