"""The tables (`flower_audit.md`) and the figure (`flower_dp_audit.png`) of `flower_audit`.

Read from the stored points (`results.json`), so a resumed run redraws them unchanged.
"""

from __future__ import annotations

import math

import numpy as np

from fl_privacy.flower.audits import dp_setting
from fl_privacy.pipelines import fedmia_replicates
from fl_privacy.report import figures as figures_lib


FIGURE = 'flower_dp_audit'
TABLES = 'flower_audit.md'
WRAPPERS = dp_setting.WRAPPERS

def _finite(v) -> float:
  try:
    v = float(v)
  except (TypeError, ValueError):
    return float('nan')
  return v if math.isfinite(v) else float('nan')


def dp_figure(points: list[dict], workdir: str) -> str | None:
  """Stated vs empirical epsilon per wrapper: the best counted lower bound (marker) with a
  bar down to the Clopper-Pearson bound, y = x drawn; an empirical bound beyond the axis
  (1.5 x the largest stated epsilon) is an arrow to the top edge labelled with its value."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  pts = [p for p in points if p['params'].get('part') == 'dp']
  if not pts:
    return None
  stated = [_finite(p['metrics']['stated_epsilon']) for p in pts]
  top = max(v for v in stated if not math.isnan(v)) * 1.5
  fig, ax = plt.subplots(figsize=(6.0, 4.2))
  ax.plot([0, top], [0, top], 'k--', lw=1, label='empirical = stated (y = x)')
  markers = {'server_fixed': 'o', 'client_fixed': 's', 'local_dp': 'D',
             'server_adaptive': '^', 'client_adaptive': 'v'}
  for i, wrapper in enumerate(WRAPPERS):
    sel = [p for p in pts if p['params']['wrapper'] == wrapper]
    if not sel:
      continue
    x = np.asarray([_finite(p['metrics']['stated_epsilon']) for p in sel])
    best = np.asarray([_finite(p['metrics']['best_bound']) for p in sel])
    cp = np.asarray([_finite(p['metrics']['epsilon_cp']) for p in sel])
    shown = np.minimum(best, top)
    lower = np.clip(shown - np.minimum(cp, shown), 0, None)
    # Wrappers at the same stated epsilon (server_fixed, client_fixed) with near-equal bounds
    # would hide each other: each wrapper is dodged sideways by a fixed 1.2% of the axis.
    dodge = (i - (len(WRAPPERS) - 1) / 2) * 0.012 * top
    ax.errorbar(x + dodge, shown, yerr=[lower, np.zeros_like(lower)], fmt=markers[wrapper],
                color=f'C{i}', capsize=3, lw=1,
                label=f'{wrapper}: best lower bound (family-wise 95%; bar: down to the 95% '
                'CP bound)')
    for xi, b, p in zip(x, best, sel):
      if b > top:  # off the axis: an arrow on the top edge, with its value
        ax.annotate(f'{p["params"]["setting"]}: {b:.1f}', xy=(xi, top), xytext=(xi, top * 0.85),
                    ha='center', fontsize=7, color=f'C{i}',
                    arrowprops=dict(arrowstyle='->', color=f'C{i}'))
  ax.set_xlim(0, top)
  ax.set_ylim(0, top)
  ax.set_xlabel("Flower's stated epsilon (nats; wrappers dodged sideways)")
  ax.set_ylabel('empirical epsilon, lower bound (nats)')
  ax.set_title('Flower DP audit: above y = x is a privacy violation', fontsize=10)
  fig.tight_layout()
  figures_lib.legend_outside(ax)
  path = figures_lib.save(fig, workdir, FIGURE)
  plt.close(fig)
  return path


def _fmt(v, digits=3) -> str:
  v = _finite(v)
  return 'nan' if math.isnan(v) else f'{v:.{digits}f}'


def _rate(m, name) -> str:
  return f'{_fmt(m.get(name))} [{_fmt(m.get(name + "_ci_low"))}, {_fmt(m.get(name + "_ci_high"))}]'


def tables_markdown(points: list[dict]) -> str:
  """Every part that ran as markdown tables."""
  lines = ['# Flower deployment audit', '']
  fed = [p for p in points if p['params'].get('part') == 'fedmia']
  if fed:
    m0 = fed[0]['metrics']
    method = m0.get('interval_method', 'two_way_bootstrap_conditional')
    lines += ['## FedMIA table: Flower deployment vs native simulation (aligned scoring)', '',
              f'Over {m0.get("replicates", 1)} replicated deployment(s) (keys fold_in(run key, '
              'r)): the mean over them with a 95% interval '
              f'({fedmia_replicates.METHODS.get(method, method)}); TPR: the union of it and '
              'Clopper-Pearson on the pooled counts.', '',
              '| attack | Flower AUC [95% CI] | native AUC [95% CI] | Flower TPR@1%FPR | '
              'native TPR@1%FPR | AUCs within each other\'s CI |', '|---|---|---|---|---|---|']
    by = {(p['params']['attack'], p['params']['deployment']): p['metrics'] for p in fed}
    for attack in dict.fromkeys(p['params']['attack'] for p in fed):
      f, n = by.get((attack, 'flower')), by.get((attack, 'native'))
      if f is None or n is None:
        continue
      agree = (_finite(n['auc_ci_low']) <= _finite(f['auc']) <= _finite(n['auc_ci_high']) and
               _finite(f['auc_ci_low']) <= _finite(n['auc']) <= _finite(f['auc_ci_high']))
      lines.append(f'| {attack} | {_rate(f, "auc")} | {_rate(n, "auc")} | '
                   f'{_rate(f, "tpr_at_fpr_1e-2")} | {_rate(n, "tpr_at_fpr_1e-2")} | '
                   f'{"yes" if agree else "NO"} |')
    lines.append('')
  dis = [p for p in points if p['params'].get('part') == 'dishonest']
  for p in dis:
    m = p['metrics']
    lines += ['## Dishonest server (DishonestStrategy) against the Flower deployment', '',
              f'M = {p["params"]["num_components"]}; {m["targets_in"]} targets from the nodes\' '
              f'shards, {m["targets_out"]} from the test split; every node attacked.', '',
              '| TPR [95% CI] | FPR [95% CI] | FPR on test-split targets | member decisions | '
              'non-member decisions |', '|---|---|---|---|---|',
              f'| {_rate(m, "tpr")} | {_rate(m, "fpr")} | {_rate(m, "fpr_out_targets")} | '
              f'{m["n_pos"]} | {m["n_neg"]} |', '']
  dps = [p for p in points if p['params'].get('part') == 'dp']
  if dps:
    lines += ['## Flower DP wrappers: stated vs empirical epsilon', '',
              'Client-level, one round, no sampling amplification; relation per row '
              '(add_remove: the target\'s reply missing, FedAvg renormalising over n - 1; '
              'zero_out: the target against a client that did not train); adversary: '
              'readers of the aggregate (server_fixed, client_fixed, server_adaptive, '
              'client_adaptive) or the server reading uploads (local_dp). Exact eps: of the '
              'release (the whole vector, each world\'s noise std); eps (proj.): of the score '
              'alone. Empirical epsilons are 95% lower bounds.', '',
              '| setting | wrapper | relation | C | z / (sensitivity, eps) | delta | noise std '
              '(in / out) | stated eps | source | our RDP eps | exact eps | exact eps (proj.) '
              '| exact eps worst add/remove, or replace-one (local) | eps CP | eps GDP | '
              'trials (in/out) | violation | exact > stated |', '|' + '---|' * 18]
    for p in dps:
      q, m = p['params'], p['metrics']
      arg = (f'z={q["noise_multiplier"]:g}, n={q["num_sampled_clients"]}'
             if q['wrapper'] != 'local_dp' else
             f's={q["sensitivity"]:g}, eps={q["epsilon"]:g}')
      std_in = _finite(m['flower_noise_std'])
      std_out = _finite(m.get('flower_noise_std_out', std_in))
      std = f'{std_in:.3g}' if std_in == std_out else f'{std_in:.3g} / {std_out:.3g}'
      other = _finite(m.get('dp_epsilon_exact_replace_one'))
      other = (f'{other:.4g} (replace-one' + (', > stated)' if other > _finite(
          m['stated_epsilon']) else ')') if not math.isnan(other) else
               f'{_finite(m.get("dp_epsilon_exact_worst")):.4g}')
      lines.append(
          f'| {q["setting"]} | {q["wrapper"]} | {m.get("game_relation", "add_remove")} | '
          f'{q["clipping_norm"]:g} | {arg} | {q["delta"]:g} | {std} | '
          f'{_fmt(m["stated_epsilon"], 2)} | {m["stated_epsilon_source"]} | '
          f'{_finite(m["dp_epsilon"]):.4g} | {_finite(m["dp_epsilon_exact"]):.4g} | '
          f'{_finite(m.get("dp_epsilon_exact_projection")):.4g} | {other} | '
          f'{_fmt(m["epsilon_cp"], 2)} | {_fmt(m["epsilon_gdp"], 2)} | '
          f'{m["n_in"]}/{m["n_out"]} | '
          f'{"YES" if _finite(m["privacy_violation"]) > 0 else "no"} | '
          f'{"YES" if _finite(m["accountant_violation"]) > 0 else "no"} |')
    lines += ['', 'Adaptive wrappers: the aggregate of the first round only, its noise drawn '
              'at the clip after the round\'s update (in / out worlds). Not audited here: ' +
              ', '.join(dp_setting.NOT_AUDITED) + ' (the `training` part audits every round).',
              '']
  lines += training_markdown([p for p in points if p['params'].get('part') == 'training'])
  lines += reconstruction_markdown(
      [p for p in points if p['params'].get('part') == 'reconstruction'])
  return '\n'.join(lines)


def _psnr(v) -> str:
  v = _finite(v)
  return 'nan' if math.isnan(v) else f'{v:.1f}'


def reconstruction_markdown(points: list[dict]) -> list[str]:
  """The `reconstruction` part: pooled rates per deployment, then per node side by side."""
  by = {p['params']['deployment']: p for p in points}
  if not by:
    return []
  q = next(iter(by.values()))['params']
  lines = ['## Imprint server (ReconstructionStrategy): Flower deployment vs native simulation',
           '', f'{q["num_nodes"]} nodes of {q["per_client"]} digits, B = {q["batch_size"]}, '
           f'E = {q["epochs"]}, {q["num_bins"]} bins; each node gets a model crafted with its '
           'own key. Exact: max abs error < 1/255 (one-to-one matching); rates over examples '
           'with 95% intervals that take the node as the unit (Korn-Graubard; '
           'Clopper-Pearson over examples in results.json); PSNR: mean over nodes, '
           'bootstrap 95%; SSIM: Wang et al.\'s 11x11 window, NaN on images under 11x11.', '',
           '| deployment | exact [95% CI] | PSNR > thr [95% CI] | nodes all exact [95% CI] | '
           'PSNR dB [95% CI] | SSIM | examples | max abs flower - native |',
           '|---|---|---|---|---|---|---|---|']
  for dep, p in by.items():
    m = p['metrics']
    lines.append(f'| {dep} | {_rate(m, "exact")} | {_rate(m, "recovered")} | '
                 f'{_rate(m, "all_exact")} | {_psnr(m["psnr_mean"])} '
                 f'[{_psnr(m["psnr_mean_ci_low"])}, {_psnr(m["psnr_mean_ci_high"])}] | '
                 f'{_fmt(m.get("ssim_mean"))} | {m["n_examples"]} | '
                 f'{_finite(m["max_abs_diff_flower_native"]):.3g} |')
  deps = list(by)
  lines += ['', '| node | ' + ' | '.join(f'{d} exact [95% CI] | {d} PSNR dB' for d in deps)
            + ' |', '|---|' + '---|---|' * len(deps)]
  first = by[deps[0]]['metrics']
  for i, node in enumerate(first['node_ids']):
    cells = []
    for d in deps:
      m = by[d]['metrics']
      cells.append(f'{m["node_exact"][i]}/{m["node_examples"][i]} '
                   f'[{_fmt(m["node_exact_ci_low"][i], 2)}, {_fmt(m["node_exact_ci_high"][i], 2)}]'
                   f' | {_psnr(m["node_psnr"][i])}')
    lines.append(f'| {node} | ' + ' | '.join(cells) + ' |')
  return lines + ['']


def _bounds_at(m: dict) -> str:
  """The level the point's one-run bounds were computed at: `bound_confidence` (the
  Bonferroni share of the family-wise verdict), or, for a point stored before the verdict
  was family-wise, its `confidence` marked "per bound"."""
  if 'bound_confidence' in m:
    return f'{100 * _finite(m["bound_confidence"]):.4g}%'
  return f'{100 * _finite(m.get("confidence", 0.95)):g}% per bound'


def training_markdown(points: list[dict]) -> list[str]:
  """The `training` part: per setting and threat model, Flower's stated epsilon over the
  rounds, the exact epsilon of what ran, the one-run lower bounds (at the level each was
  computed at, `_bounds_at`) and the Gaussian-fit estimate, with the canaries behind each;
  then the adaptive clips' trajectories. The verdict's family-wise confidence is read from
  the points, so points stored before it (per-bound bounds) are labelled as such."""
  if not points:
    return []
  family = sorted({_finite(p['metrics']['verdict_confidence']) for p in points
                   if 'verdict_confidence' in p['metrics']})
  verdict = ('violation: the largest counted one-run bound (`counted_bounds`) above the '
             'stated epsilon, at family-wise ' + ', '.join(f'{100 * c:g}%' for c in family) +
             ' (each of the k counted bounds at 1 - (1 - c) / k: "bounds at")'
             if family else '')
  if any('verdict_confidence' not in p['metrics'] for p in points):
    verdict += ('; ' if verdict else '') + (
        'rows "per bound" were stored before the family-wise verdict: their bounds are each '
        'at that confidence and their violation, the largest of them, holds only at 1 - k '
        '(1 - c)')
  lines = ['## Flower DP over every round of a deployment (canary clients, one run)', '',
           'Zero-out (an excluded canary is present and replies a 1e-6 C update); each canary '
           'a fair coin; all iterates: every aggregate (LocalDpMod: every upload of the '
           'canary); last iterate: the final model. One-run: Steinke et al. 2023 lower bounds; '
           f'{verdict}; fit: Andrew et al. 2024 Gaussian-fit ESTIMATE against never-inserted '
           'directions.', '',
           '| setting | wrapper | rounds | nodes | threat | stated eps (delta) | source | '
           'exact eps | one-run | one-run f-DP | bounds at | fit eps [95% CI] (mu) | '
           'canaries in/out, null | violation | exact > stated |', '|' + '---|' * 15]
  for p in points:
    q, m = p['params'], p['metrics']
    for threat in ('all_iterates', 'last_iterate'):
      if f'{threat}/epsilon_one_run' not in m:
        continue
      t = lambda k, th=threat: m[f'{th}/{k}']  # noqa: E731
      lines.append(
          f'| {q["setting"]} | {q["wrapper"]} | {q["num_rounds"]} | {m["num_nodes"]} | '
          f'{threat} | {_fmt(m["stated_epsilon"], 2)} ({m["stated_delta"]:g}) | '
          f'{m["stated_epsilon_source"]} | {_fmt(m[f"exact_epsilon_{threat}"], 2)} | '
          f'{_fmt(t("epsilon_one_run"), 2)} | {_fmt(t("epsilon_one_run_fdp"), 2)} | '
          f'{_bounds_at(m)} | {_fmt(t("epsilon_fit"), 2)} '
          f'[{_fmt(m.get(f"{threat}/epsilon_fit_ci_low"), 2)}, '
          f'{_fmt(m.get(f"{threat}/epsilon_fit_ci_high"), 2)}] ({_fmt(t("fit_mu"), 2)}) | '
          f'{t("n_in")}/{t("n_out")}, {t("n_null")} | '
          f'{"YES" if _finite(m["privacy_violation"]) > 0 else "no"} | '
          f'{"YES" if _finite(m["accountant_violation"]) > 0 else "no"} |')
  adaptive = [p for p in points if 'clips' in p['metrics'] and
              p['params']['wrapper'] in dp_setting.ADAPTIVE]
  if adaptive:
    lines += ['', 'Adaptive clipping, the clip after each round (Flower 1.42), and the exact '
              'epsilon of the aggregates at z (as claimed), as run, and with the noisy counts:',
              '', '| setting | clip C_0 .. C_T | exact eps as claimed | as run | with counts |',
              '|---|---|---|---|---|']
    for p in adaptive:
      m = p['metrics']
      lines.append(f'| {p["params"]["setting"]} | '
                   f'{", ".join(f"{c:.4g}" for c in m["clips"])} | '
                   f'{_fmt(m["exact_epsilon_as_claimed"], 2)} | '
                   f'{_fmt(m["exact_epsilon_all_iterates"], 2)} | '
                   f'{_fmt(m["exact_epsilon_with_counts"], 2)} |')
  return lines + ['']
