"""Figures and the table of the reconstruction pipeline (`fl_privacy.pipelines.reconstruction`).

- `reconstructions.png`: per attack (at its centre batch, no defense), the client's true
  inputs above what the server recovered (each matched one-to-one; a blank square where
  nothing was recovered), from the first trial;
- `defenses.png`: per swept defense, the fraction of examples recovered above the PSNR
  threshold vs strength (weakest first, epsilon in the tick where the defense declares one),
  one line per attack with its 95% interval over clients (`metrics.clustered_rate`), and the
  utility (test accuracy, Clopper-Pearson) on the same axis;
- `batch.png`: the fraction recovered exactly vs B (one step), J and E (at the centre batch);
- `table.md`: every point.
"""

from __future__ import annotations

import math
import os

import numpy as np

from fl_privacy.attacks.reconstruction import metrics as rec_metrics
from fl_privacy.report import atomic
from fl_privacy.report import figures

IMAGES = 'images.json'
ATTACK_ORDER = ('imprint', 'analytic', 'inversion')
TABLE = 'table.md'


def label(params: dict) -> str:
  """A point's name in `images.json`."""
  parts = [params['attack'], params.get('defense', 'none')]
  if params.get('strength') is not None:
    parts.append(f'{params["strength"]:g}')
  if params.get('dp_sgd_sampling'):
    parts.append(params['dp_sgd_sampling'])
  parts += [f'B{params["batch_size"]}', f'J{params["num_batches"]}', f'E{params["epochs"]}']
  return '_'.join(str(p) for p in parts)


def example_images(out: dict, x_pool: np.ndarray, count: int, n: int) -> dict:
  """The first trial's true inputs (of n) and their matched recoveries (None: unmatched)."""
  index = np.asarray(out['index'][0])[:n]
  true = x_pool[index]
  rows = np.asarray(out['recovered'][0])[np.asarray(out['valid'][0], bool)]
  got = [None] * len(true)
  if len(rows):
    r, c = rec_metrics.match(rows, true.reshape(len(true), -1))
    for i, j in zip(r, c):
      got[j] = rows[i].reshape(true.shape[1:]).tolist()
  return dict(shape=list(true.shape[1:]), true=true[:count].tolist(), recovered=got[:count])


def _image(ax, values, shape):
  img = np.zeros(shape) if values is None else np.clip(np.asarray(values), 0, 1)
  img = img[..., 0] if img.shape[-1] == 1 else img
  ax.imshow(img, cmap='gray', vmin=0, vmax=1)
  ax.axis('off')   # pictures, not plots: no axes to label


def images_figure(images: dict, names: list[str]):
  """Rows of true / recovered images, two rows per attack."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  cols = max(len(images[n]['true']) for n in names)
  fig, axes = plt.subplots(2 * len(names), cols, figsize=(1.1 * cols + 1.5, 2.3 * len(names)),
                           squeeze=False)
  for r, name in enumerate(names):
    entry = images[name]
    for c in range(cols):
      for k, key in enumerate(('true', 'recovered')):
        ax = axes[2 * r + k, c]
        if c < len(entry[key]):
          _image(ax, entry[key][c], entry['shape'])
        else:
          ax.axis('off')
      if c == 0:
        for k, text in ((0, f'{name}\ntrue'), (1, 'recovered')):
          axes[2 * r + k, 0].text(-0.15, 0.5, text, transform=axes[2 * r + k, 0].transAxes,
                                  ha='right', va='center', fontsize=7)
  fig.suptitle('True inputs (upper row) and what the server recovered (lower row), first '
               'trial; blank: nothing recovered', fontsize=9)
  return fig


def _tick(p: dict) -> str:
  eps = p['metrics'].get('dp_epsilon', p['metrics'].get('ldp_epsilon'))
  text = f'{p["params"]["strength"]:g}'
  if eps is not None:
    e = float(eps) if not isinstance(eps, str) else math.inf
    text += '\neps=' + ('inf' if not math.isfinite(e) else f'{e:.3g}')
  return text


def defense_figure(config, points: list[dict]):
  """One panel per swept defense (and DP-SGD sampling): recovery and utility vs strength."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  swept = [p for p in points if p['params'].get('kind') == 'attack' and
           p['params'].get('strength') is not None]
  groups = list(dict.fromkeys((p['params']['defense'], p['params'].get('dp_sgd_sampling'))
                              for p in swept))
  if not groups:
    return None
  ncol = min(4, len(groups))
  nrow = -(-len(groups) // ncol)
  fig, axes = plt.subplots(nrow, ncol, figsize=(5.4 * ncol, 3.4 * nrow), squeeze=False,
                           sharey=True)
  thr = float(config.reconstruction.psnr_threshold)
  for ax, (name, sampling) in zip(axes.flat, groups):
    same = lambda p: (p['params'].get('defense') == name and
                      p['params'].get('dp_sgd_sampling') == sampling)
    mine = [p for p in swept if same(p)]
    strengths = list(dict.fromkeys(p['params']['strength'] for p in mine))
    x = np.arange(len(strengths))
    for attack, server in dict.fromkeys((p['params']['attack'], server_of(p)) for p in mine):
      rows = [next(p for p in mine if p['params']['attack'] == attack and
                   server_of(p) == server and p['params']['strength'] == s)
              for s in strengths]
      m = [r['metrics'] for r in rows]
      y = np.array([v['recovered'] for v in m])
      err = np.array([[v['recovered'] - v['recovered_ci_low'] for v in m],
                      [v['recovered_ci_high'] - v['recovered'] for v in m]])
      ax.errorbar(x, y, yerr=err, marker='o', capsize=3, ls='-' if server == 'fixed' else ':',
                  label=f'{attack}, {server} server (B={rows[0]["params"]["batch_size"]})')
    util = [p for p in points if p['params'].get('kind') == 'utility' and same(p)]
    if util:
      by = {p['params']['strength']: p['metrics'] for p in util}
      u = [by.get(s) for s in strengths]
      if all(v is not None for v in u):
        ax.errorbar(x, [v['test_accuracy'] for v in u],
                    yerr=[[v['test_accuracy'] - v['test_accuracy_ci_low'] for v in u],
                          [v['test_accuracy_ci_high'] - v['test_accuracy'] for v in u]],
                    color='k', ls='--', marker='s', capsize=3, label='utility: test accuracy')
    ax.set_xticks(x)
    ax.set_xticklabels([_tick(next(p for p in mine if p['params']['strength'] == s))
                        for s in strengths], fontsize=7)
    ax.set_title(name + (f' ({sampling})' if sampling else ''), fontsize=9)
    ax.set_xlabel('strength (weakest first)')
    ax.set_ylabel(f'fraction (recovered: PSNR > {thr:g} dB)')
    figures.legend_outside(ax, fontsize=6)
  # Once, after every panel has its data: the panels share y, and limits set from the first
  # panel alone cut the others' points above its largest value.
  figures.rate_limits(axes.flat[0])
  for ax in list(axes.flat)[len(groups):]:
    ax.axis('off')
  fig.suptitle('Inputs recovered vs defense strength (95% intervals: recovery over clients, '
               'utility Clopper-Pearson)', fontsize=10)
  fig.tight_layout()
  return fig


def batch_figure(config, points: list[dict]):
  """Exact recovery vs B (J = E = 1), J and E, one line per attack, no defense."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  lr = float(config.reconstruction.learning_rate)
  base = [p for p in points if p['params'].get('kind') == 'attack' and
          p['params'].get('strength') is None and server_of(p) == 'fixed' and
          float(p['params'].get('learning_rate', lr)) == lr]
  if not base:
    return None
  fig, axes = plt.subplots(1, 3, figsize=(17, 3.6))
  for ax, field, fixed in ((axes[0], 'batch_size', {'num_batches': 1, 'epochs': 1}),
                           (axes[1], 'num_batches', {'epochs': 1}),
                           (axes[2], 'epochs', {'num_batches': 1})):
    for attack in dict.fromkeys(p['params']['attack'] for p in base):
      centre = int(config.reconstruction.center[attack])
      rows = [p for p in base if p['params']['attack'] == attack and
              all(p['params'][k] == v for k, v in fixed.items()) and
              (field == 'batch_size' or p['params']['batch_size'] == centre)]
      rows.sort(key=lambda p: p['params'][field])
      if len(rows) < 1:
        continue
      m = [p['metrics'] for p in rows]
      name = attack if field == 'batch_size' else f'{attack} (B={centre})'
      for metric, style, what in (('exact', '-', 'exact'), ('recovered', ':', 'PSNR > thr.')):
        ax.errorbar([p['params'][field] for p in rows], [v[metric] for v in m],
                    yerr=[[v[metric] - v[f'{metric}_ci_low'] for v in m],
                          [v[f'{metric}_ci_high'] - v[metric] for v in m]], marker='o',
                    capsize=3, ls=style, color=f'C{list(ATTACK_ORDER).index(attack)}',
                    label=f'{name}: {what}')
    ax.set_xscale('log', base=2)
    figures.rate_limits(ax)
    ax.set_xlabel({'batch_size': 'B (examples, one step)', 'num_batches': 'J (minibatches)',
                   'epochs': 'E (local epochs)'}[field])
    ax.set_ylabel('recovered (fraction of examples)')
    figures.legend_outside(ax, fontsize=7)
  thr = float(config.reconstruction.psnr_threshold)
  fig.suptitle(f'The client\'s examples recovered exactly (max abs error < 1/255; solid) and '
               f'above {thr:g} dB PSNR (dotted), no defense, 95% intervals over clients',
               fontsize=10)
  fig.tight_layout()
  return fig


def server_of(p: dict) -> str:
  """'fixed' (the paper's server) or 'adaptive' (`reconstruction_runs.tune`)."""
  return p['params'].get('server', 'fixed')


def _cell(m: dict, name: str, digits: int = 3) -> str:
  if name not in m:
    return '-'
  v = m[name]
  v = float(v) if not isinstance(v, str) else float('nan' if v == 'nan' else v)
  if f'{name}_ci_low' in m:
    return (f'{v:.{digits}f} [{float(m[name + "_ci_low"]):.{digits}f}, '
            f'{float(m[name + "_ci_high"]):.{digits}f}]')
  return f'{v:.{digits}g}'


def _interval(m: dict, name: str, digits: int = 3) -> str:
  if f'{name}_ci_low' not in m:
    return '-'
  return f'[{float(m[name + "_ci_low"]):.{digits}f}, {float(m[name + "_ci_high"]):.{digits}f}]'


def _ssim_cell(m: dict) -> str:
  if float(m.get('ssim_window_fits', 1.0)) == 0.0:
    return 'n/a (< 11x11)'
  return _cell(m, 'ssim_mean', 2)


def table_markdown(config, points: list[dict]) -> str:
  """Every attack point, then the utilities, as markdown."""
  thr = float(config.reconstruction.psnr_threshold)
  lines = ['# Reconstruction', '',
           f'Rates over the trials\' examples with 95% intervals that take the client (trial) '
           f'as the unit (Korn-Graubard: Clopper-Pearson at the effective sample size); '
           f'"exact, CP examples" is Clopper-Pearson over examples, which takes them as '
           f'independent. PSNR (of matched pairs, capped at 200 dB): the mean of the trials\' '
           f'means, the median over pairs, and the median over the pairs not recovered exactly '
           f'(their count), each with a 95% bootstrap over trials. SSIM: Wang et al.\'s '
           f'(Gaussian 11x11, sigma 1.5), n/a where the images are smaller than its window. '
           f'Recovered: PSNR > {thr:g} dB; exact: max abs error < 1/255; exact, grid: the same '
           f'after rounding every recovered value to the data\'s value grid (learnt from the '
           f'public split). Server: fixed is the paper\'s (the config\'s restore scale, '
           f'thresholds, width, cumulative layer, one round); adaptive chose its restore scale, '
           f'bin placement, width, structure and rounds on simulated clients of its tuning pool '
           f'under the same defense (its choice and tuning score: the last column), then '
           f'attacked the same private clients; "adaptive - fixed" is the paired difference '
           f'per client (mean, 95% Student t over clients). eps: the defense\'s for one round '
           f'(an adaptive server that averaged R rounds faces its R-round guarantee: results.json '
           f'`rounds_dp_epsilon`). Input LDP: report PSNR is the randomised input\'s own PSNR, '
           f'the baseline a reconstruction must beat. lr: the client\'s learning rate.', '',
           '| attack | server | defense | strength | eps | B | J | E | lr | trials | exact | '
           'exact, CP examples | exact, grid | recovered | adaptive - fixed: recovered | '
           'adaptive - fixed: exact, grid | all exact (trials) | PSNR mean (dB) | '
           'PSNR median | PSNR median, not exact (pairs) | report PSNR | SSIM | '
           'label acc. (B=1) | adaptive choice |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|'
           '---|---|---|---|']
  for p in points:
    q, m = p['params'], p['metrics']
    if q.get('kind') != 'attack':
      continue
    d = q.get('defense', 'none') + (f' ({q["dp_sgd_sampling"]})'
                                    if q.get('dp_sgd_sampling') else '')
    s = '-' if q.get('strength') is None else f'{q["strength"]:g}'
    eps = _cell(m, 'dp_epsilon') if 'dp_epsilon' in m else _cell(m, 'ldp_epsilon')
    choice = '-'
    if 'adaptive_restore_scale' in m:
      choice = (f'restore {float(m["adaptive_restore_scale"]):g}, {m["adaptive_placement"]}, '
                f'{m.get("adaptive_num_bins", "-")} bins, {m.get("adaptive_structure", "-")}, '
                f'{m.get("adaptive_rounds", 1)} round(s); tuning: '
                f'{float(m["adaptive_public_recovered"]):.3f} recovered of '
                f'{int(m["adaptive_public_examples"])}')
    report = '-' if 'report_psnr_mean' not in m else f'{float(m["report_psnr_mean"]):.1f}'
    lr = '-' if q.get('learning_rate') is None else f'{float(q["learning_rate"]):g}'
    lines.append(f'| {q["attack"]} | {server_of(p)} | {d} | {s} | {eps} | '
                 f'{q["batch_size"]} | {q["num_batches"]} | {q["epochs"]} | {lr} | '
                 f'{m["n_trials"]} | '
                 f'{_cell(m, "exact")} | {_interval(m, "exact_example")} | '
                 f'{_cell(m, "exact_grid")} | {_cell(m, "recovered")} | '
                 f'{_cell(m, "recovered_diff")} | {_cell(m, "exact_grid_diff")} | '
                 f'{_cell(m, "all_exact")} | '
                 f'{_cell(m, "psnr_mean", 1)} | {_cell(m, "psnr_median", 1)} | '
                 f'{_cell(m, "psnr_rest_median", 1)} ({m.get("psnr_rest_pairs", "-")}) | '
                 f'{report} | {_ssim_cell(m)} | {_cell(m, "label_acc")} | {choice} |')
  lines += ['', '## Utility (test accuracy of the honest model one client trains under the '
            'defense; the mean over the trainings, 95% interval with each training as a cluster)',
            '', '| defense | strength | eps (utility run) | trainings | test accuracy |',
            '|---|---|---|---|---|']
  for p in points:
    q, m = p['params'], p['metrics']
    if q.get('kind') == 'utility':
      d = q['defense'] + (f' ({q["dp_sgd_sampling"]})' if q.get('dp_sgd_sampling') else '')
      s = '-' if q.get('strength') is None else f'{q["strength"]:g}'
      lines.append(f'| {d} | {s} | {_cell(m, "utility_dp_epsilon")} | '
                   f'{p.get("n_trials", "-")} | {_cell(m, "test_accuracy")} |')
  return '\n'.join(lines) + '\n'


def write_all(config, points: list[dict], images: dict, workdir: str) -> None:
  """Every figure there is data for, and the table."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  atomic.atomic_write_text(os.path.join(workdir, TABLE), table_markdown(config, points))
  s = config.reconstruction
  names = []
  for attack in s.attacks:
    n = label(dict(attack=attack, defense='none', batch_size=int(s.center[attack]),
                   num_batches=int(s.center.num_batches), epochs=int(s.center.epochs)))
    if n in images:
      names.append(n)
  made = [('reconstructions', images_figure(images, names) if names else None),
          ('defenses', defense_figure(config, points)), ('batch', batch_figure(config, points))]
  for name, fig in made:
    if fig is not None:
      figures.save(fig, workdir, name)
      plt.close(fig)
