"""The DP-bug audit's per-bug table and headline, from the stored points (`pipelines.dp_bugs`).

`headline(points, seeds)`: over the entries that ran, per seed, how many bugs were flagged
and how many twins raised a false alarm ("flags N of M; false alarms on twins F of M", N and
F as the seeds' range). `rows(points, entries)`: one line per bug with its twin's verdict and
the mildest severity the audit flagged. `write` puts both in `dp_bugs_table.md`, atomically.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

from fl_privacy.report import atomic

RAN = ('violation', 'no violation')


def _num(x) -> float:
  try:
    return float(x)
  except (TypeError, ValueError):
    return math.nan


def _fmt(x, digits=2) -> str:
  v = _num(x)
  if math.isnan(v):
    return '-'
  if math.isinf(v):
    return 'inf'
  return f'{v:.{digits}f}' if abs(v) < 1e4 else f'{v:.3g}'


def _catalog(points: Sequence[Mapping]) -> list[Mapping]:
  return [p for p in points if p['params'].get('part') == 'catalog']


def headline(points: Sequence[Mapping], seeds: int) -> dict[str, Any]:
  """N (bugs flagged) and F (twins flagged) per seed, over the M entries that ran."""
  cat = _catalog(points)
  ran = sorted({p['params']['bug'] for p in cat if p['metrics'].get('verdict') in RAN})
  flagged = {v: [0] * seeds for v in ('bug', 'twin')}
  for p in cat:
    q = p['params']
    if q['bug'] in ran and q['seed'] < seeds and p['metrics'].get('verdict') == 'violation':
      flagged[q['variant']][q['seed']] += 1
  out_of_reach = sorted({p['params']['bug'] for p in cat
                         if p['metrics'].get('verdict') == 'out of reach'})
  not_run = sorted({p['params']['bug'] for p in cat
                    if str(p['metrics'].get('verdict', '')).startswith('not run')})
  return {'m': len(ran), 'n_per_seed': flagged['bug'], 'f_per_seed': flagged['twin'],
          'out_of_reach': out_of_reach, 'not_run': not_run, 'seeds': seeds}


def _spread(values: list[int]) -> str:
  lo, hi = min(values), max(values)
  return f'{lo}' if lo == hi else f'{lo}-{hi}'


def headline_line(h: Mapping[str, Any]) -> str:
  line = (f'flags {_spread(h["n_per_seed"])} of {h["m"]}; false alarms on twins '
          f'{_spread(h["f_per_seed"])} of {h["m"]} (over {h["seeds"]} seed(s); per seed: '
          f'flagged {h["n_per_seed"]}, false alarms {h["f_per_seed"]})')
  if h['out_of_reach']:
    line += f'; out of reach: {len(h["out_of_reach"])} ({", ".join(h["out_of_reach"])})'
  if h['not_run']:
    line += f'; not run: {len(h["not_run"])} ({", ".join(h["not_run"])})'
  return line


def _mildest(points: Sequence[Mapping], entry) -> str:
  if not entry.knob:
    return '-'
  tried = {}
  for p in points:
    q = p['params']
    if q['bug'] != entry.name or q['variant'] != 'bug' or q['seed'] != 0:
      continue
    if p['metrics'].get('verdict') in RAN:
      tried[float(q['severity'])] = p['metrics']['verdict'] == 'violation'
  if not tried:
    return '-'
  hits = [s for s, f in tried.items() if f]
  values = ', '.join(f'{s:g}' for s in sorted(tried))
  if not hits:
    return f'none of {values}'
  best = max(hits) if entry.milder == 'higher' else min(hits)
  return f'{best:g} (of {values})'


def rows(points: Sequence[Mapping], entries: Mapping[str, Any]) -> list[list[str]]:
  """One row per entry: bug, threat, claim, true eps, certified CP and best bound (seed 0),
  the bug's verdicts over seeds, the twin's, the mildest severity flagged."""
  cat = _catalog(points)
  out = []
  for name, e in entries.items():
    mine = [p for p in cat if p['params']['bug'] == name]
    if not mine:
      continue
    first = next((p for p in mine if p['params']['variant'] == 'bug' and
                  p['params']['seed'] == 0), mine[0])
    m = first['metrics']

    def tally(variant):
      vs = [p['metrics'].get('verdict') for p in mine if p['params']['variant'] == variant]
      if not vs:
        return '-'
      if all(v in RAN for v in vs):
        return f'{sum(v == "violation" for v in vs)}/{len(vs)} flagged'
      return str(vs[0])
    claim = (f'{_fmt(m.get("claimed_epsilon"))} ({m.get("dp_unit")}, '
             f'{m.get("dp_relation")})')
    out.append([name, e.threat, claim, _fmt(m.get('true_epsilon')),
                _fmt(m.get('certified_cp')), _fmt(m.get('best_bound')), tally('bug'),
                tally('twin'), _mildest(points, e)])
  return out


HEADER = ['bug', 'audit', 'claim eps (unit, relation)', 'true eps', 'certified CP',
          'best bound', 'bug verdict', 'twin verdict', 'mildest severity flagged']


def markdown(points: Sequence[Mapping], entries: Mapping[str, Any], seeds: int
             ) -> tuple[str, str]:
  """(the markdown file's text, the headline line)."""
  line = headline_line(headline(points, seeds))
  table = ['| ' + ' | '.join(HEADER) + ' |', '|' + '---|' * len(HEADER)]
  table += ['| ' + ' | '.join(r) + ' |' for r in rows(points, entries)]
  sources = [f'- `{n}`: {e.source}' for n, e in entries.items()]
  text = '\n'.join([f'DP bugs: {line}', '', *table, '', 'Sources:', *sources, ''])
  return text, line


def write(points: Sequence[Mapping], entries: Mapping[str, Any], workdir: str, seeds: int
          ) -> tuple[str, str]:
  text, line = markdown(points, entries, seeds)
  atomic.atomic_write_text(os.path.join(workdir, 'dp_bugs_table.md'), text)
  return text, line
