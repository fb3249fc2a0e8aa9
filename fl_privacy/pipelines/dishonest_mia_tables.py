"""Markdown tables of the dishonest-server MI pipeline (`fl_privacy.pipelines.dishonest_mia`).

`table2.md`: Table 2 of the paper (M at the centre) and the J and E sweeps, then every point's
false positives with their causes (`attacks.dishonest_attribution`) and false negatives.
"""

from __future__ import annotations

from fl_privacy.report import summary

TABLE = 'table2.md'
FALSE_DECISIONS = 'false_decisions.json'
# False positives listed per point in table2.md (all of them are in false_decisions.json).
_LISTED = 10


def label(p: dict) -> str:
  """A point's name in false_decisions.json, deltas.json and the figure."""
  return f'{p["optimizer"]}_M{p["M"]}_J{p["num_batches"]}_E{p["epochs"]}'


def _pct(metrics: dict, name: str) -> str:
  return f'{100 * metrics[name]:.2f}'


def table_markdown(config, points: list[dict], decisions: dict) -> str:
  """Table 2 of the paper (M at the centre) and the J and E sweeps, as Markdown."""
  s = config.dishonest
  by = {label(pt['params']): pt for pt in points}
  lines = [f'# Dishonest-server MI on {config.dataset} ({s.runs} runs per row, half inside)',
           '', f'B = {s.batch_size}, eps = {s.epsilon}, xi = {s.threshold}, '
           f'lr = {s.learning_rate}. Rates in %, [95% Clopper-Pearson interval]; '
           'Delta: min over inside runs, max over outside runs.',
           f'Defense: {config.defense.name} (configs/_defense.py).', '']

  def table(title, rows):
    out = [f'## {title}', '',
           '| Opt. | M | J | E | FPR | FNR | Acc. | AUC | min Delta in | max Delta out '
           '| FP: exact dup. / near dup. / none |',
           '|---|---|---|---|---|---|---|---|---|---|---|']
    for p in rows:
      pt = by.get(label(p))
      if pt is None:
        continue
      m = {k: summary.as_number(v) for k, v in pt['metrics'].items()}
      cell = lambda n: (f'{_pct(m, n)} [{_pct(m, n + "_ci_low")}, '
                        f'{_pct(m, n + "_ci_high")}]')
      out.append(f'| {p["optimizer"]} | {p["M"]} | {p["num_batches"]} | {p["epochs"]} | '
                 f'{cell("fpr")} | {cell("fnr")} | {cell("acc")} | {m["auc"]:.2f} | '
                 f'{m["delta_in_min"]:.3g} | {m["delta_out_max"]:.3g} | '
                 f'{int(m["fp_exact_duplicate"])} / {int(m["fp_near_duplicate"])} / '
                 f'{int(m["fp_no_duplicate"])} |')
    return out + ['']

  params = [pt['params'] for pt in points]
  if s.grid == 'one_at_a_time':
    c = s.center
    opts = list(s.optimizers)

    def rows(f):
      keep = [p for p in params if all(p[k] == c[k] for k in ('M', 'num_batches', 'epochs')
                                       if k != f)]
      return sorted(keep, key=lambda p: (opts.index(p['optimizer']) if p['optimizer'] in opts
                                         else len(opts), p[f]))

    lines += table(f'Table 2: varying M (J = {c.num_batches}, E = {c.epochs})', rows('M'))
    lines += table(f'Varying J (M = {c.M}, E = {c.epochs})', rows('num_batches'))
    lines += table(f'Varying E (M = {c.M}, J = {c.num_batches})', rows('epochs'))
  else:
    lines += table('All points', params)
  lines += ['## False positives and their causes', '']
  any_fp = False
  for name, d in decisions.items():
    fps = d['false_positives']
    if not fps:
      continue
    any_fp = True
    dup = sum(bool(f['exact_duplicates_in_client'] or f['near_duplicates_in_client'])
              for f in fps)
    lines.append(f'### {name}: {len(fps)} false positives, {dup} caused by a duplicate of the '
                 f'target in the client data, {len(fps) - dup} by none')
    for f in fps[:_LISTED]:
      lines.append(f'- run {f["run"]}: target {f["target"]} (label {f["target_label"]}), '
                   f'Delta = {f["delta"]:.3g}; {f["cause"]}')
    if len(fps) > _LISTED:
      lines.append(f'- ... {len(fps) - _LISTED} more in {FALSE_DECISIONS}')
    lines.append('')
  if not any_fp:
    lines.append('None.')
  fns = [(name, f) for name, d in decisions.items() for f in d['false_negatives']]
  lines += ['', '## False negatives', '']
  lines += [f'- {name}, run {f["run"]}: target {f["target"]}, Delta = {f["delta"]:.3g} < xi'
            for name, f in fns] or ['None.']
  return '\n'.join(lines) + '\n'
