"""The dishonest-server membership inference pipeline (Pichler et al.), as library code.

`python -m experiments.dishonest_mia` runs this pipeline (`pipelines.base`: validate_config,
prepare, plan, figures);
the script's docstring says how to run it and what it writes. The attack itself (the 2M+1-ReLU
detector, the client's FedAvg round, the Delta decision of Eq. (9)) is `fl_privacy.attacks.
dishonest`; this module validates the config, runs every grid point through
`eval.runner.run_trials`, attributes each false positive to a duplicate of the target (or to
none; `fl_privacy.attacks.dishonest_attribution`), and writes `false_decisions.json`,
`deltas.json` and `table2.md` (`fl_privacy.pipelines.dishonest_mia_tables`). The figure is
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
from fl_privacy import memory
from fl_privacy import validate
from fl_privacy.attacks import dishonest
from fl_privacy.attacks import dishonest_attribution
from fl_privacy.eval import auditing
from fl_privacy.eval import metrics as metrics_lib
from fl_privacy.eval import runner
from fl_privacy.eval import stats
from fl_privacy.fl import optimizers as optimizers_lib
from fl_privacy import report
from fl_privacy.pipelines import base
from fl_privacy.pipelines import dishonest_mia_checks
from fl_privacy.pipelines import dishonest_mia_figures
from fl_privacy.pipelines import dishonest_mia_tables
from fl_privacy.report import atomic
from fl_privacy.report import summary

NAME = EXPERIMENT = 'dishonest_mia'
GRIDS = ('one_at_a_time', 'product')
SPLITS = ('train', 'test', 'validation')
TABLE = dishonest_mia_tables.TABLE
FALSE_DECISIONS = dishonest_mia_tables.FALSE_DECISIONS
label = dishonest_mia_tables.label

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
MIN_SAME_SIZE = dishonest_mia_checks.MIN_SAME_SIZE
EVEN = validate.Rule('an even number (half inside)', lambda v: v % 2 == 0)


def validate_config(config) -> None:
  """Checks every field that does not need the data (before anything is loaded)."""
  data_lib.validate_data_config(config.data)
  validate.positive(config, 'dishonest.runs', integer=True)
  validate.checked(config, 'dishonest.runs', EVEN)
  validate.checked(config, 'dishonest.runs', validate.trials())
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


def unused_fields(config) -> dict[str, str]:
  """The `dishonest` fields this run does not read (`base.unused`: a command-line override of
  one is refused rather than recorded as if it ran): `experiments.duplicates`' own fields,
  the centre under the product grid, the momentum without 'momentum'. {} for a config
  validation refuses (it names the field itself)."""
  s = config.dishonest
  why = 'read only by experiments.duplicates'
  out = {'dishonest.duplicate_splits': why, 'dishonest.near_threshold': why}
  try:
    optimizers = tuple(s.optimizers)
  except TypeError:
    return {}
  if s.grid == 'product':
    out.update({f'dishonest.center.{f}': "read only by grid 'one_at_a_time' (the grid is "
                "'product')" for f in s.center.keys()})
  if 'momentum' not in optimizers:
    out['dishonest.momentum'] = (f"read only by optimizer 'momentum' (not in {optimizers}; "
                                 "'sgd' is plain SGD, without heavy-ball momentum)")
  return out


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


feature_shape = dishonest_mia_checks.feature_shape


def prepare(config) -> dict:
  """Validates the config, loads the pool split, and checks what depends on the data."""
  validate_config(config)
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
    data_lib.require_examples(config.data, f'its {s.split!r} split', size, n + 1,
                              f'{field} x dishonest.batch_size = {p["num_batches"]} x '
                              f'{s.batch_size} and one example kept out')
    validate.require(n < size, field, f'J * batch_size < {size} (the {s.split} split keeps '
                     'one example out for the outside runs)', p['num_batches'])
  model = make_model(config, pool.num_classes)
  dishonest_mia_checks.require_features(config, model, pool, points)
  state = dict(pool=pool, splits=splits, points=points, model=model)
  for p in points:
    # Built (and cached) now, so a defense that cannot be built for a point (a target
    # epsilon no noise reaches) stops the run before the results files are opened.
    defense_for(config, state, p)
  return state


def make_optimizer(config, name: str):
  """The client's optimizer; 'momentum' (the paper's SGD) uses `dishonest.momentum` (paper:
  0.9), 'sgd' is plain SGD."""
  s = config.dishonest
  kw = {}
  if name == 'momentum':
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
  return memory.capped_chunk(runner.options(config)['chunk_size'],
                             dishonest.run_bytes(pool.x.shape[1:], num_examples),
                             _CHUNK_BUDGET_BYTES)


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
                             batch_bytes=runner.options(config)['batch_bytes'], args=(x, y),
                             unit='runs')


def attribute(config, pool, key, p: dict, run: int, outcome: dict) -> dict:
  """`attacks.dishonest_attribution.attribute` of a false positive in run `run` of point `p`."""
  s = config.dishonest
  idx = dishonest.client_indices(point_key(key, p), run, len(pool),
                                 p['num_batches'] * int(s.batch_size))
  return dishonest_attribution.attribute(
      pool, idx, outcome, run=run, delta=float(significant(outcome['delta'])),
      num_components=p['M'], near_threshold=s.near_threshold)


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


def point(config, state, store, key, p: dict, decisions: dict, deltas: dict) -> base.Point:
  """Grid point `p`; computing it also records its false decisions and Deltas."""
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

  return base.Point(point_params(config, state, p), compute, 'runs')


def plan(config, state, store, key) -> list[base.Point]:
  """Every grid point; each computed one adds its false decisions and Deltas to the files."""
  decisions = atomic.read_json(os.path.join(store.workdir, FALSE_DECISIONS), {})
  deltas = atomic.read_json(os.path.join(store.workdir, 'deltas.json'), {})
  return [point(config, state, store, key, p, decisions, deltas) for p in state['points']]


def figures(config, state, store, key) -> None:
  """table2.md and delta.png (when any point was computed with its Deltas)."""
  del state, key
  decisions = atomic.read_json(os.path.join(store.workdir, FALSE_DECISIONS), {})
  atomic.atomic_write_text(os.path.join(store.workdir, TABLE),
                           dishonest_mia_tables.table_markdown(config, store.points, decisions))
  deltas = atomic.read_json(os.path.join(store.workdir, 'deltas.json'), {})
  if deltas:
    dishonest_mia_figures.save_delta_figure(config, deltas, store.workdir)
