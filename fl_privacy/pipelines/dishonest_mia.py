"""The dishonest-server membership inference pipeline (Pichler et al.), as library code.

`python -m experiments.dishonest_mia` hands `prepare` and `sweep` to `experiments.common.main`;
the script's docstring says how to run it and what it writes. The attack itself (the 2M+1-ReLU
detector, the client's FedAvg round, the Delta decision of Eq. (9)) is `fl_privacy.attacks.
dishonest`; this module validates the config, runs every grid point through
`eval.runner.run_trials`, attributes each false positive to a duplicate of the target (or to
none), and writes `table2.md`, `false_decisions.json` and `deltas.json`. The figure is
`fl_privacy.pipelines.dishonest_mia_figures`.
"""

from __future__ import annotations

import itertools
import json
import math
import os

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy import defenses
from fl_privacy import models
from fl_privacy import validate
from fl_privacy.attacks import dishonest
from fl_privacy.data import duplicates
from fl_privacy.eval import auditing
from fl_privacy.eval import metrics as metrics_lib
from fl_privacy.eval import runner
from fl_privacy.eval import stats
from fl_privacy.fl import optimizers as optimizers_lib
from fl_privacy import report
from fl_privacy.pipelines import dishonest_mia_figures
from fl_privacy.report import atomic
from fl_privacy.report import progress
from fl_privacy.report import run_point
from fl_privacy.report import summary

EXPERIMENT = 'dishonest_mia'
GRIDS = ('one_at_a_time', 'product')
SPLITS = ('train', 'test', 'validation')
TABLE = 'table2.md'
FALSE_DECISIONS = 'false_decisions.json'

# The headline columns: logged per saved point and printed as a table at the end of a run.
SUMMARY = summary.Table('Dishonest-server MI (FPR, FNR: 95% intervals; Delta: min inside / '
                        'max outside)', (
    summary.param('optimizer'), summary.param('M'), summary.param('num_batches', 'J'),
    summary.param('epochs', 'E'), summary.rate('fpr', 'FPR'), summary.rate('fnr', 'FNR'),
    summary.metric('acc', 'acc'), summary.metric('auc', 'AUC', digits=2),
    summary.metric('delta_in_min', 'Delta in', digits=3),
    summary.metric('delta_out_max', 'Delta out', digits=3), summary.seconds()))
# Memory for the client data and first-convolution activations that one vmapped chunk holds
# (inputs are gathered per run; the diagnostics embed all N examples at once).
_CHUNK_BUDGET_BYTES = 256 << 20
# Reported Deltas keep 4 significant digits. Runs are identical whatever the chunk size except
# for float32 rounding of the training (XLA lowers vmapped per-run convolutions differently),
# which moves a Delta by ~1e-6 relative; Adam's Deltas tie by construction (e.g. many runs at
# 185.0), and unrounded, that noise broke the ties differently (AUC 0.5075 vs 0.5087 at M = 1).
DELTA_DIGITS = 4
# False positives listed per point in table2.md (all of them are in false_decisions.json).
_LISTED = 10


def validate_static(config) -> None:
  """Checks every field that does not need the data (before anything is loaded)."""
  data_lib.validate_data_config(config.data)
  runs = validate.positive(config, 'dishonest.runs', integer=True)
  validate.require(runs % 2 == 0, 'dishonest.runs', 'an even number (half inside)', runs)
  validate.positive(config, 'dishonest.M', integer=True)
  validate.subset_of(config, 'dishonest.optimizers', optimizers_lib.OPTIMIZERS)
  validate.positive(config, 'dishonest.num_batches', integer=True)
  validate.positive(config, 'dishonest.epochs', integer=True)
  grid = validate.one_of(config, 'dishonest.grid', GRIDS)
  if grid == 'one_at_a_time':
    for field in ('M', 'num_batches', 'epochs'):
      validate.positive(config, f'dishonest.center.{field}', integer=True)
  validate.positive(config, 'dishonest.batch_size', integer=True)
  validate.positive(config, 'dishonest.epsilon')
  validate.positive(config, 'dishonest.threshold')
  validate.positive(config, 'dishonest.learning_rate')
  validate.in_range(config, 'dishonest.momentum', 0.0, 1.0, high_inclusive=False)
  validate.one_of(config, 'dishonest.padding', ('VALID', 'SAME'))
  validate.one_of(config, 'dishonest.split', SPLITS)
  validate.in_range(config, 'dishonest.near_threshold', 0.0, math.inf)
  runner.validate_options(config)
  defenses.configured.check_honoured(config.defense, EXPERIMENT, defenses.NAMES,
                                     'every defense acts on the client it attacks')


def grid_points(config) -> list[dict]:
  """The sweep's points: {M, optimizer, num_batches, epochs}, each once, in sweep order.

  'one_at_a_time' follows the paper: for each optimizer, M varies at the centre's (J, E)
  (Table 2), then J at the centre's (M, E), then E at the centre's (M, J).
  """
  s = config.dishonest
  ms, js, es = (tuple(int(v) for v in s[f]) for f in ('M', 'num_batches', 'epochs'))
  points = []
  for opt in s.optimizers:
    if s.grid == 'product':
      combos = itertools.product(ms, js, es)
    else:
      c = s.center
      combos = ([(m, c.num_batches, c.epochs) for m in ms] +
                [(c.M, j, c.epochs) for j in js] + [(c.M, c.num_batches, e) for e in es])
    for m, j, e in combos:
      p = dict(M=int(m), optimizer=str(opt), num_batches=int(j), epochs=int(e))
      if p not in points:
        points.append(p)
  return points


def make_model(config, num_classes: int):
  return models.FlowerCNN(num_classes, padding=config.dishonest.padding)


def feature_shape(model, image_shape) -> tuple[int, int]:
  """(trunk feature dimension, width of fc1) of `model` on images of `image_shape`."""
  x = jax.ShapeDtypeStruct((1,) + tuple(image_shape), jnp.float32)
  # Shapes only: under eval_shape no random number is ever drawn from this key.
  variables = jax.eval_shape(model.init, jax.random.key(0), x)
  return variables['params']['fc1']['kernel'].shape


def prepare(config) -> dict:
  """Validates the config, loads the pool split, and checks what depends on the data."""
  validate_static(config)
  splits = data_lib.load(config.data)
  s = config.dishonest
  validate.require(s.split in splits, 'dishonest.split', f'one of {tuple(splits)}', s.split)
  pool = splits[s.split]
  validate.require(pool.is_image, 'data.name', 'an image dataset (the detector sits on a CNN)',
                   config.data.name)
  points = grid_points(config)
  size = len(pool)
  for p in points:
    n = p['num_batches'] * s.batch_size
    field = ('dishonest.num_batches' if p['num_batches'] in tuple(s.num_batches)
             else 'dishonest.center.num_batches')
    validate.require(n < size, field, f'J * batch_size < {size} (the {s.split} split keeps '
                     'one example out for the outside runs)', p['num_batches'])
  model = make_model(config, pool.num_classes)
  try:
    feature_dim, width = feature_shape(model, pool.x.shape[1:])
  except (ValueError, TypeError, ZeroDivisionError) as e:  # shape probe of a too-small input
    raise validate.ConfigError(
        'dishonest.padding', f"'SAME' for {pool.x.shape[1]}x{pool.x.shape[2]} images "
        f'(the VALID trunk needs at least 16x16)', s.padding) from e
  validate.require(feature_dim > 0, 'dishonest.padding',
                   f"'SAME' for {pool.x.shape[1]}x{pool.x.shape[2]} images", s.padding)
  limit = min(feature_dim, width // 2)
  for p in points:
    field = 'dishonest.M' if p['M'] in tuple(s.M) else 'dishonest.center.M'
    validate.require(p['M'] <= limit, field, f'<= {limit} (feature dimension {feature_dim}, '
                     f'2M <= {width} units of fc1)', p['M'])
  return dict(pool=pool, splits=splits, points=points, model=model)


def make_optimizer(config, name: str):
  """The client's optimizer; 'sgd' and 'momentum' use `dishonest.momentum` (paper: 0.9)."""
  s = config.dishonest
  kw = {}
  if name in ('sgd', 'momentum') and s.momentum > 0:
    kw['momentum'] = float(s.momentum)
  return optimizers_lib.make(name, float(s.learning_rate), field='dishonest.optimizers', **kw)


def chunk_size(config, pool, num_examples: int) -> int | None:
  """Runs per jitted chunk: `game.chunk_size`, or None to let the runner size it by bytes.

  The runner's group width (runs side by side under vmap) follows `game.batch_bytes`: on CPU
  one run's working set exceeds the budget, so runs go one at a time inside a chunk (a
  `lax.map`; vmapped runs that each own their kernels become grouped convolutions, slower on
  XLA's CPU backend); accelerators run them wide. An explicit chunk is capped by a memory
  budget. Chunking never changes results (each run depends only on its key).
  """
  chunk = runner.options(config)['chunk_size']
  if chunk is None:
    return None
  per_example = int(np.prod(pool.x.shape[1:])) + 6 * int(np.prod(pool.x.shape[1:3]))
  per_run = 2 * 4 * num_examples * per_example
  return max(1, min(chunk, _CHUNK_BUDGET_BYTES // per_run))


def point_key(key, p: dict):
  """`report.point_key` of (J, E) only: M and optimizers are compared on the same runs."""
  return report.point_key(key, {'num_batches': p['num_batches'], 'epochs': p['epochs']})


def defense_for(config, state, p: dict) -> defenses.Configured:
  """The `defense` section built for point `p` (one client, one round of E J steps), once."""
  cache = state.setdefault('defenses', {})
  key = tuple(sorted(p.items()))
  if key not in cache:
    cache[key] = _configure_defense(config, state, p)
  return cache[key]


def _configure_defense(config, state, p: dict) -> defenses.Configured:
  s = config.dishonest
  pool = state['pool']
  return defenses.configure(config.defense, defenses.Setting(
      num_classes=pool.num_classes, image_shape=pool.x.shape[1:], value_range=(0.0, 1.0),
      batch_size=int(s.batch_size), num_examples=p['num_batches'] * int(s.batch_size),
      epochs=p['epochs'], steps_per_epoch=p['num_batches'], rounds=1), experiment=EXPERIMENT)


def point_params(config, state, p: dict) -> dict:
  """A results point's params: the grid point and the defense with its parameters."""
  return {**p, **defense_for(config, state, p).params}


def simulate(config, state, p: dict, key) -> dict[str, np.ndarray]:
  """All runs of one point through `eval.runner.run_trials` (one trial = one run)."""
  s = config.dishonest
  pool = state['pool']
  defense = defense_for(config, state, p)
  game = dishonest.Game(model=state['model'], num_components=p['M'],
                        num_batches=p['num_batches'], epochs=p['epochs'],
                        batch_size=int(s.batch_size),
                        optimizer=make_optimizer(config, p['optimizer']),
                        epsilon=float(s.epsilon), threshold=float(s.threshold),
                        hooks=None if defense.params['defense'] == 'none' else defense.hooks)
  x = jnp.asarray(data_lib.to_float(pool.x))
  y = jnp.asarray(pool.y)
  with jax.default_matmul_precision('highest'):
    return runner.run_trials(dishonest.make_trial(game), point_key(key, p), int(s.runs),
                             chunk_size=chunk_size(config, pool, game.num_examples),
                             batch_bytes=runner.options(config)['batch_bytes'], args=(x, y))


def client_indices(key, p: dict, run: int, pool_size: int, batch_size: int) -> np.ndarray:
  """The client's pool indices in run `run` of point `p` (as `dishonest.run` drew them)."""
  run_key = jax.random.fold_in(point_key(key, p), run)
  idx, _, _ = dishonest.draw_client(jax.random.fold_in(run_key, 1), jnp.int32(run), pool_size,
                                    p['num_batches'] * batch_size)
  return np.asarray(idx)


def attribute(config, pool, key, p: dict, run: int, outcome: dict) -> dict:
  """Explains one false positive: a duplicate of the target in the client's data, or none.

  Exact duplicates are byte-identical images; near duplicates lie within
  `dishonest.near_threshold` (L2 on [0, 1] pixels, `fl_privacy.data.duplicates`).
  """
  s = config.dishonest
  target = int(outcome['target'])
  idx = client_indices(key, p, run, len(pool), int(s.batch_size))
  others = idx[idx != target]
  x_t = pool.x[target:target + 1]
  exact = duplicates.cross_matches(x_t, pool.x[others], 0.0)
  exact = [int(others[j]) for j in exact[0][1]] if exact else []
  near = []
  if s.near_threshold > 0:
    found = duplicates.cross_matches(x_t, pool.x[others], float(s.near_threshold))
    near = [int(others[j]) for j in found[0][1] if int(others[j]) not in exact] if found else []
  nearest = int(outcome['nearest'])
  # An exact duplicate has the target's detected features, so it fires the detector whenever
  # the target would; a near duplicate only explains the run if it is the example that fired.
  if exact:
    cause = f'exact duplicate of the target: example {exact[0]}'
  elif nearest in near and int(outcome['num_activating']) > 0:
    cause = f'near duplicate of the target: example {nearest}'
  elif int(outcome['num_activating']) > 0:
    held = (f' (the client also holds near duplicate(s) {near}, which did not fire)'
            if near else '')
    cause = (f'none: no duplicate fired; example {nearest} (label {int(pool.y[nearest])}) '
             f'matches the target on its {p["M"]} detected features within eps{held}')
  else:
    cause = 'none: no client example activates the detector (unexplained)'
  pixel = float(np.linalg.norm(data_lib.to_float(pool.x[nearest]) -
                               data_lib.to_float(pool.x[target])))
  return dict(run=run, target=target, target_label=int(pool.y[target]),
              delta=float(significant(outcome['delta'])), nearest=nearest,
              nearest_label=int(pool.y[nearest]),
              nearest_detector_distance=float(outcome['nearest_distance']),
              nearest_pixel_distance=pixel, num_activating=int(outcome['num_activating']),
              exact_duplicates_in_client=exact, near_duplicates_in_client=near, cause=cause)


def significant(x, digits: int = DELTA_DIGITS) -> np.ndarray:
  """`x` rounded to `digits` significant digits (0 and inf stay as they are)."""
  x = np.asarray(x, dtype=np.float64)
  finite = np.isfinite(x) & (x != 0)
  scale = 10.0 ** (digits - 1 - np.floor(np.log10(np.abs(np.where(finite, x, 1.0)))))
  return np.where(finite, np.round(x * scale) / scale, x)


def point_metrics(out: dict[str, np.ndarray]) -> dict[str, float]:
  """FPR, FNR, accuracy (95% Clopper-Pearson), AUC over Delta, and Delta's extremes.

  The decisions use the exact Delta; the AUC and the Delta statistics use Delta rounded to
  `DELTA_DIGITS` significant digits, so they do not depend on the chunk size.
  """
  member = out['member'].astype(bool)
  delta = significant(out['delta'])
  decision = out['decision'].astype(bool)
  rates = metrics_lib.tpr_tnr_adv(decision, member)
  correct = int(np.sum(decision == member))
  m = {'n_in': rates['n_pos'], 'n_out': rates['n_neg'], 'fp': rates['fp'], 'fn': rates['fn']}
  for name in ('fpr', 'fnr'):
    m.update({k: rates[k] for k in (name, f'{name}_ci_low', f'{name}_ci_high')})
  m.update(stats.rate('acc', correct, len(member)))
  finite = np.where(np.isinf(delta), np.finfo(np.float64).max, delta)
  m['auc'] = metrics_lib.roc_auc(finite, member)
  m.update(stats.rate('tpr', int(np.sum(decision & member)), int(np.sum(member))))
  for target, name in ((1e-2, 'tpr_at_fpr_1e-2'), (0.1, 'tpr_at_fpr_1e-1')):
    # TPR of the best Delta threshold with FPR <= target (over these runs: optimistic by the
    # choice of threshold; the interval is Clopper-Pearson on the inside runs above it).
    tpr = metrics_lib.tpr_at_fpr(finite, member, target)
    m.update(stats.rate(name, int(round(tpr * np.sum(member))), int(np.sum(member))))
  m['delta_in_min'] = float(delta[member].min())
  m['delta_in_median'] = float(np.median(delta[member]))
  m['delta_out_max'] = float(delta[~member].max())
  m['out_delta_nonzero'] = int(np.sum(delta[~member] != 0))
  m['out_activated'] = int(np.sum(out['num_activating'][~member] > 0))
  return m


def label(p: dict) -> str:
  return f'{p["optimizer"]}_M{p["M"]}_J{p["num_batches"]}_E{p["epochs"]}'


def _load_json(path: str, default):
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except FileNotFoundError:
    return default


def sweep_point(config, state, store, key, p: dict, decisions: dict, deltas: dict) -> None:
  """Computes one point unless stored (`report.run_point`); records its false decisions and Deltas."""
  def compute():
    out = simulate(config, state, p, key)
    m = point_metrics(out)
    m.update(defense_for(config, state, p).metrics)
    member = out['member'].astype(bool)
    decision = out['decision'].astype(bool)
    if 'dp_unit' in m:
      # The attack's own empirical epsilon beside the defense's claim (membership is a coin).
      m.update(auditing.attack_bounds(decision.astype(np.float64), member, m['dp_delta']))
    fps = [attribute(config, state['pool'], key, p, int(i), {k: v[i] for k, v in out.items()})
           for i in np.flatnonzero(decision & ~member)]
    fns = [dict(run=int(i), target=int(out['target'][i]),
                delta=float(significant(out['delta'][i])))
           for i in np.flatnonzero(~decision & member)]
    m['fp_exact_duplicate'] = sum(bool(f['exact_duplicates_in_client']) for f in fps)
    m['fp_near_duplicate'] = sum(bool(not f['exact_duplicates_in_client'] and
                                      f['near_duplicates_in_client']) for f in fps)
    m['fp_no_duplicate'] = len(fps) - m['fp_exact_duplicate'] - m['fp_near_duplicate']
    decisions[label(p)] = dict(params=p, false_positives=fps, false_negatives=fns)
    rounded = significant(out['delta'])
    deltas[label(p)] = dict(params=p, inside=rounded[member].tolist(),
                            outside=rounded[~member].tolist())
    atomic.atomic_write_text(os.path.join(store.workdir, FALSE_DECISIONS),
                             json.dumps(decisions, indent=1))
    atomic.atomic_write_text(os.path.join(store.workdir, 'deltas.json'), json.dumps(deltas))
    logging.info('%s: FPR %.4f FNR %.4f AUC %.3f, outside Delta != 0 in %d runs', label(p),
                 m['fpr'], m['fnr'], m['auc'], m['out_delta_nonzero'])
    return m, int(config.dishonest.runs)

  run_point(store, point_params(config, state, p), compute)


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


def sweep(config, state, store, key) -> None:
  """Runs every grid point (resuming from `store`), then writes table2.md and delta.png.

  Args:
    config: the validated config.
    state: what `prepare` returned.
    store: the run's `fl_privacy.report.ResultsStore`.
    key: the run's PRNG key.
  """
  decisions = _load_json(os.path.join(store.workdir, FALSE_DECISIONS), {})
  deltas = _load_json(os.path.join(store.workdir, 'deltas.json'), {})
  progress.plan(len(state['points']))
  for p in state['points']:
    sweep_point(config, state, store, key, p, decisions, deltas)
  atomic.atomic_write_text(os.path.join(store.workdir, TABLE),
                           table_markdown(config, store.points, decisions))
  if deltas:
    dishonest_mia_figures.save_delta_figure(config, deltas, store.workdir)
