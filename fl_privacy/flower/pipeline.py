"""The `flower_audit` experiment: auditing a real Flower deployment (Flower >= 1.42).

What `python -m experiments.flower_audit` runs (a `pipelines.base.Pipeline`; fields:
configs/_flower_audit.py; results: docs/experiments/flower_audit.md). Three parts:

1. `fedmia`: a FedAvg deployment of `num_clients` Flower ClientApps (`client.make_client_app`,
   IID shards of digits) driven by Flower's own `FedAvg` round loop on the in-process grid
   (`runner.InProcessGrid`), wrapped in `RecordingStrategy`; the FedMIA table (aligned
   scoring, `attacks.passive.evaluate.evaluate`) from the recorded uploads
   (`strategies.recording_from_uploads`), and the same table from fl_privacy's own simulation
   of the same training (`fl.recording.record_shards`: same shards, keys, initial model and
   optimizer). Points carry `deployment` = 'flower' or 'native'.
2. `dishonest`: `DishonestStrategy` (M = `dishonest.num_components`) against the trained
   deployment: one crafted round per target, every node attacked; targets from the nodes'
   shards (one member decision each at their node) and from the test split; TPR and FPR with
   Clopper-Pearson intervals (`eval.stats.rate`).
3. `dp`: Flower's DP wrappers and mods against their stated epsilon
   (`fl_privacy.flower.dp_audit`), and the figure `flower_dp_audit.png` (stated vs
   empirical epsilon, y = x).

Tables: `flower_audit.md` (the three parts; FedMIA flower vs native side by side).
"""

from __future__ import annotations

import logging as py_logging
import math
from typing import Any

from absl import logging
import jax
import numpy as np
import optax

from flwr.serverapp.strategy import FedAvg

from fl_privacy import data as data_lib
from fl_privacy import models as models_lib
from fl_privacy import validate
from fl_privacy.attacks.passive import evaluate as evaluate_lib
from fl_privacy.attacks.passive import scores as scores_lib
from fl_privacy.eval import stats
from fl_privacy.fl import recording as recording_lib
from fl_privacy.flower import bridge
from fl_privacy.flower import client as client_lib
from fl_privacy.flower import dp_audit
from fl_privacy.flower import runner
from fl_privacy.flower import strategies
from fl_privacy.pipelines import base
from fl_privacy.report import atomic
from fl_privacy.report import figures as figures_lib
from fl_privacy.report import point_key
from fl_privacy.report import summary

NAME = 'flower_audit'
PARTS = ('fedmia', 'dishonest', 'dp')
WRAPPERS = dp_audit.WRAPPERS
DEPLOYMENTS = ('flower', 'native')
MODELS = ('flower_cnn', 'mlp')
FIGURE = 'flower_dp_audit'
TABLES = 'flower_audit.md'

SUMMARY = (
    summary.Table('Flower deployment vs native simulation: FedMIA table (aligned scoring)',
                  (summary.param('attack'), summary.param('deployment'),
                   summary.rate('auc', 'AUC [95% CI]'),
                   summary.rate('tpr_at_fpr_1e-2', 'TPR@1%FPR [95% CI]')),
                  where={'part': 'fedmia'}),
    summary.Table('Dishonest server (DishonestStrategy) against the Flower deployment',
                  (summary.param('num_components', 'M'), summary.rate('tpr', 'TPR [95% CI]'),
                   summary.rate('fpr', 'FPR [95% CI]'), summary.metric('n_pos', 'members'),
                   summary.metric('n_neg', 'non-members')),
                  where={'part': 'dishonest'}),
    summary.Table('Flower DP: stated vs empirical epsilon (client-level, add/remove, one '
                  'round; lower bounds at 95%)',
                  (summary.param('setting'), summary.param('wrapper'),
                   summary.metric('stated_epsilon', 'stated eps', digits=2),
                   summary.metric('dp_epsilon', 'our RDP eps', digits=2),
                   summary.metric('dp_epsilon_exact', 'exact eps', digits=2),
                   summary.metric('epsilon_cp', 'eps CP', digits=2),
                   summary.metric('epsilon_gdp', 'eps GDP', digits=2),
                   summary.flag('privacy_violation', 'violation'),
                   summary.flag('accountant_violation', 'exact > stated')),
                  where={'part': 'dp'}),
)


# -------------------------------------------------------------------------- validation ---

_POSITIVE_INT = validate.number(1, integer=True)
_CENTRAL_FIELDS = ('noise_multiplier', 'num_sampled_clients')
_ADAPTIVE_FIELDS = _CENTRAL_FIELDS + ('target_clipped_quantile', 'clip_norm_lr')
_LOCAL_FIELDS = ('sensitivity', 'epsilon')


_POSITIVE = validate.number(0, low_open=True)
_SETTING_RULES = {
    'wrapper': validate.choice(WRAPPERS),
    'clipping_norm': _POSITIVE,
    'delta': validate.number(0, 1, low_open=True, high_open=True),
    'noise_multiplier': _POSITIVE,
    'num_sampled_clients': _POSITIVE_INT,
    'sensitivity': _POSITIVE,
    'epsilon': _POSITIVE,
    'target_clipped_quantile': validate.number(0, 1),
    'clip_norm_lr': _POSITIVE,
    'clipped_count_stddev': validate.number(0, low_open=True, optional=True),
}
_PRESENT = validate.Rule('set (the wrapper reads it; configs/_flower_audit.py)',
                         lambda v: v is not None)


def _check_setting(name: str, s) -> dp_audit.Setting:
  """One `dp.settings` entry checked by its wrapper's rules, as a `dp_audit.Setting`."""
  prefix = f'flower_audit.dp.settings.{name}'
  _PRESENT.check(f'{prefix}.wrapper', s.get('wrapper'))
  _SETTING_RULES['wrapper'].check(f'{prefix}.wrapper', s.wrapper)
  fields = ('clipping_norm', 'delta') + {'local_dp': _LOCAL_FIELDS}.get(
      s.wrapper, _ADAPTIVE_FIELDS if s.wrapper in dp_audit.ADAPTIVE else _CENTRAL_FIELDS)
  for field in fields:
    _PRESENT.check(f'{prefix}.{field}', s.get(field))
    _SETTING_RULES[field].check(f'{prefix}.{field}', s.get(field))
  kw = {f: (int(s[f]) if f == 'num_sampled_clients' else float(s[f])) for f in fields}
  if s.wrapper in dp_audit.ADAPTIVE:
    std = s.get('clipped_count_stddev')
    _SETTING_RULES['clipped_count_stddev'].check(f'{prefix}.clipped_count_stddev', std)
    kw['clipped_count_stddev'] = None if std is None else float(std)
  setting = dp_audit.Setting(name, s.wrapper, **kw)
  if s.wrapper in dp_audit.ADAPTIVE:
    # Flower refuses z >= 2 clipped_count_stddev (default num_sampled_clients / 20).
    validate.Rule('below 2 x clipped_count_stddev (default num_sampled_clients / 20), which '
                  'Flower\'s adaptive wrappers require', lambda z: _adaptive_ok(setting)).check(
                      f'{prefix}.noise_multiplier', s.noise_multiplier)
  return setting


def _adaptive_ok(setting: dp_audit.Setting) -> bool:
  try:
    dp_audit.adaptive_noise(setting)
  except ValueError:
    return False
  return True


def validate_config(config) -> dict[str, Any]:
  """Checks every field the experiment reads (nothing loaded); returns the parts and the DP
  settings."""
  s = config.flower_audit
  parts = validate.subset_of(config, 'flower_audit.parts', PARTS)
  validate.checked(config, 'flower_audit.num_clients', validate.number(
      3, integer=True, words='FedMIA needs two non-target clients'))
  for field in ('per_client', 'num_rounds', 'record_every', 'local_epochs', 'batch_size',
                'chunk_size', 'dishonest.num_components', 'dishonest.targets_in',
                'dp.num_trials', 'dp.dimension'):
    validate.checked(config, f'flower_audit.{field}', _POSITIVE_INT)
  validate.checked(config, 'flower_audit.dishonest.targets_out',
                   validate.number(0, integer=True))
  validate.checked(config, 'flower_audit.record_every', validate.Rule(
      f'a divisor of num_rounds ({s.num_rounds})', lambda r: int(s.num_rounds) % int(r) == 0))
  validate.checked(config, 'flower_audit.per_client', validate.Rule(
      f'a multiple of batch_size ({s.batch_size})', lambda n: int(n) % int(s.batch_size) == 0))
  validate.one_of(config, 'flower_audit.model', MODELS)
  if s.model == 'mlp':
    validate.checked(config, 'flower_audit.hidden', validate.items(
        validate.number(1, integer=True), 'two hidden widths >= 1', scalar=False))
    validate.checked(config, 'flower_audit.hidden', validate.Rule(
        'two hidden widths (the dense layers fc1, fc2, fc3)', lambda h: len(h) == 2))
  validate.checked(config, 'flower_audit.learning_rate', validate.number(0, low_open=True))
  validate.checked(config, 'flower_audit.momentum', validate.number(0, 1, high_open=True))
  validate.subset_of(config, 'flower_audit.attacks', scores_lib.ATTACKS)
  validate.one_of(config, 'flower_audit.outlier_filter', ('leave_one_out', 'paper', 'none'))
  validate.checked(config, 'flower_audit.dishonest.epsilon', validate.number(0, low_open=True))
  validate.checked(config, 'flower_audit.dishonest.threshold', validate.number(0, low_open=True))
  validate.checked(config, 'flower_audit.dp.dimension', validate.number(2, integer=True))
  validate.checked(config, 'flower_audit.dp.canary_norm',
                   validate.number(1, words='in units of the clip norm, >= 1'))
  validate.checked(config, 'flower_audit.dp.confidence',
                   validate.number(0.5, 1, low_open=True, high_open=True))
  settings = sorted((_check_setting(name, s.dp.settings[name]) for name in s.dp.settings.keys()),
                    key=lambda st: (WRAPPERS.index(st.wrapper), -st.noise_multiplier
                                    if st.central else st.epsilon, -st.sensitivity, st.label))
  validate.checked(config, 'flower_audit.dp.settings', validate.Rule(
      'at least one setting when parts has dp', lambda v: bool(settings) or 'dp' not in parts))
  return {'parts': tuple(parts), 'settings': settings}


def prepare(config) -> dict[str, Any]:
  """Validates the config and loads the data (digits); writes nothing."""
  state = validate_config(config)
  splits = data_lib.load(config.data)
  validate.require('train' in splits and 'test' in splits, 'data.name',
                   'a dataset with train and test splits', config.data.name)
  train, test = splits['train'], splits['test']
  s = config.flower_audit
  need = int(s.num_clients) * int(s.per_client)
  validate.require(need <= len(train), 'flower_audit.per_client',
                   f'num_clients x per_client <= {len(train)} training examples',
                   int(s.per_client))
  model = make_model(config, train)
  # The dishonest detector's room: M <= trunk features, 2M <= units of fc1.
  template = jax.eval_shape(model.init, jax.random.key(0),
                            jax.ShapeDtypeStruct((1,) + train.x.shape[1:], np.float32))
  features, width = template['params']['fc1']['kernel'].shape
  validate.checked(config, 'flower_audit.dishonest.num_components', validate.Rule(
      f'at most {min(features, width // 2)} (M <= {features} trunk features, 2M <= {width} '
      'units of fc1)', lambda m: int(m) <= features and 2 * int(m) <= width))
  state.update(train=train, test=test, cache={}, model=model)
  return state


def make_model(config, train):
  """The clients' model: Flower's tutorial CNN ('SAME' convolutions on 8x8 digits) or an MLP
  with two hidden layers."""
  s = config.flower_audit
  if s.model == 'flower_cnn':
    validate.require(train.is_image, 'flower_audit.model', 'mlp on feature vectors',
                     s.model)
    return models_lib.FlowerCNN(train.num_classes, padding='SAME')
  return models_lib.make('mlp', train.num_classes, field='flower_audit.model',
                         hidden=tuple(int(h) for h in s.hidden))


# ------------------------------------------------------------------------ deployment ---


def optimizer(config):
  s = config.flower_audit
  return optax.sgd(float(s.learning_rate), momentum=float(s.momentum) or None)


def shards(config, state, key) -> list[np.ndarray]:
  s = config.flower_audit
  return data_lib.beta_partition(point_key(key, {'partition': 1}), state['train'].y,
                                 int(s.num_clients), math.inf, int(s.per_client))


def _keys(key):
  return point_key(key, {'init': 1}), point_key(key, {'train': 1})


def _fedavg(k: int) -> FedAvg:
  """FedAvg over all k nodes, no federated evaluation (its warning about that silenced)."""
  with dp_audit.quiet_flower():
    return FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=k,
                  min_available_nodes=k)


def _queries(state, parts):
  train, test = state['train'], state['test']
  return recording_lib.query_set(data_lib.to_float(train.x), train.y,
                                 data_lib.to_float(test.x), test.y, parts)


def flower_deployment(config, state, key) -> dict[str, Any]:
  """Trains the Flower deployment once (cached in `state`): the recording of the recorded
  rounds, the final model, the grid and the shards."""
  cache = state['cache']
  if 'flower' in cache:
    return cache['flower']
  s = config.flower_audit
  model, k = state['model'], int(s.num_clients)
  parts = shards(config, state, key)
  qx, qy, owner = _queries(state, parts)
  init_key, train_key = _keys(key)
  init = model.init(init_key, qx[:1])
  app = client_lib.make_client_app(
      model, client_lib.shards_from_dataset(state['train'], parts), key=train_key,
      optimizer=optimizer(config), epochs=int(s.local_epochs), batch_size=int(s.batch_size))
  grid = runner.InProcessGrid([app] * k)
  every = int(s.record_every)
  log = strategies.UploadLog()
  kept = lambda r: log(r) if r.server_round % every == 0 else None  # noqa: E731
  strategy = strategies.RecordingStrategy(_fedavg(k), init, observer=kept)
  logging.info('flower_audit: Flower FedAvg, %d ClientApps, %d rounds', k, int(s.num_rounds))
  with dp_audit.quiet_flower(py_logging.WARNING):
    result = runner.run(strategy, grid, bridge.to_array_record(init),
                        num_rounds=int(s.num_rounds))
  rec = strategies.recording_from_uploads(model.apply, log.rounds, qx, qy,
                                          chunk_size=int(s.chunk_size),
                                          node_ids=grid.get_node_ids())
  cache['flower'] = dict(recording=rec, owner=owner, final=result.arrays, grid=grid,
                         parts=parts, init=init)
  return cache['flower']


def native_training(config, state, key) -> dict[str, Any]:
  """The same training in fl_privacy's simulation (`fl.recording.record_shards`), cached."""
  cache = state['cache']
  if 'native' in cache:
    return cache['native']
  s = config.flower_audit
  parts = shards(config, state, key)
  init_key, train_key = _keys(key)
  rec = recording_lib.record_shards(
      state['model'], init_key, state['train'], state['test'], parts, label='native',
      key=train_key, num_rounds=int(s.num_rounds), record_every=int(s.record_every),
      optimizer=optimizer(config), epochs=int(s.local_epochs), batch_size=int(s.batch_size),
      chunk_size=int(s.chunk_size))
  cache['native'] = dict(recording=rec, owner=rec['owner'])
  return cache['native']


def fedmia_point(config, state, key, deployment: str, attack: str) -> tuple[dict, int]:
  s = config.flower_audit
  run = (flower_deployment if deployment == 'flower' else native_training)(config, state, key)
  rec = run['recording']
  # The same numpy stream for both deployments (common random numbers).
  rng = data_lib.rng_from_key(point_key(key, {'part': 'fedmia', 'attack': attack}))
  metrics = evaluate_lib.evaluate(rec, run['owner'], attack, scoring='aligned',
                                  single_index=-1, default_filter=s.outlier_filter, rng=rng)
  metrics.update(recorded_rounds=[int(r) + 1 for r in np.asarray(rec['rounds'])],
                 num_clients=int(s.num_clients))
  return metrics, int(metrics.get('n_pos', 0)) + int(metrics.get('n_neg', 0))


def dishonest_point(config, state, key) -> tuple[dict, int]:
  """DishonestStrategy against the trained deployment, one crafted round per target."""
  s, d = config.flower_audit, config.flower_audit.dishonest
  run = flower_deployment(config, state, key)
  grid, parts, model = run['grid'], run['parts'], state['model']
  nodes = grid.get_node_ids()
  rng = data_lib.rng_from_key(point_key(key, {'part': 'dishonest', 'targets': 1}))
  train, test = state['train'], state['test']
  xf, test_x = data_lib.to_float(train.x), data_lib.to_float(test.x)
  targets = []  # (x, y, owner node index or -1)
  owners = rng.integers(0, len(parts), int(d.targets_in))
  for k in owners:
    i = int(rng.choice(parts[int(k)]))
    targets.append((xf[i], int(train.y[i]), int(k)))
  for i in rng.choice(len(test_x), int(d.targets_out), replace=False):
    targets.append((test_x[int(i)], int(test.y[int(i)]), -1))
  member, decided, in_target = [], [], []
  deltas = []
  for x, y, owner in targets:
    strategy = strategies.DishonestStrategy(
        _fedavg(len(nodes)), model, (x, y), nodes=nodes, num_components=int(d.num_components),
        optimizer=optimizer(config), batch_size=int(s.batch_size), epsilon=float(d.epsilon),
        threshold=float(d.threshold), aggregate_targets=True, template=run['init'])
    with dp_audit.quiet_flower(py_logging.WARNING):
      runner.run(strategy, grid, run['final'], num_rounds=1)
    for dec in strategy.decisions:
      k = nodes.index(dec.node_id)
      member.append(k == owner)
      decided.append(bool(dec.member))
      in_target.append(owner >= 0)
      deltas.append(float(dec.delta))
  member, decided = np.asarray(member), np.asarray(decided)
  in_target = np.asarray(in_target)
  n_pos, n_neg = int(member.sum()), int((~member).sum())
  metrics = {}
  metrics.update(stats.rate('tpr', int((decided & member).sum()), n_pos))
  metrics.update(stats.rate('fpr', int((decided & ~member).sum()), n_neg))
  out_neg = ~member & ~in_target
  metrics.update(stats.rate('fpr_out_targets', int((decided & out_neg).sum()),
                            int(out_neg.sum())))
  metrics.update(n_pos=n_pos, n_neg=n_neg, n_out_target_decisions=int(out_neg.sum()),
                 targets_in=int(d.targets_in), targets_out=int(d.targets_out),
                 nan_decisions=int(np.isnan(deltas).sum()),
                 delta_member_mean=float(np.nanmean(np.asarray(deltas)[member]))
                 if n_pos else float('nan'),
                 delta_nonmember_mean=float(np.nanmean(np.asarray(deltas)[~member]))
                 if n_neg else float('nan'))
  return metrics, n_pos + n_neg


def dp_point(config, setting: dp_audit.Setting, key) -> tuple[dict, int]:
  d = config.flower_audit.dp
  metrics = dp_audit.audit(setting, key, int(d.num_trials), dimension=int(d.dimension),
                           canary_norm=float(d.canary_norm), confidence=float(d.confidence))
  return metrics, int(d.num_trials)


def _report_violation(params, metrics) -> None:
  if float(metrics.get('privacy_violation', 0.0)) > 0:
    logging.error('PRIVACY VIOLATION: Flower %s (%s) states epsilon %.3g but the audit '
                  'certifies more: lower bounds CP %.3f, GDP %.3f', params['wrapper'],
                  params['setting'], float(metrics['stated_epsilon']),
                  float(metrics['epsilon_cp']), float(metrics['epsilon_gdp']))


def plan(config, state, store, key) -> list[base.Point]:
  """fedmia (attacks x deployments), dishonest, dp (one point per setting)."""
  del store
  s = config.flower_audit
  points = []
  if 'fedmia' in state['parts']:
    for attack in s.attacks:
      for dep in DEPLOYMENTS:
        params = {'part': 'fedmia', 'deployment': dep, 'attack': attack}
        points.append(base.Point(
            params, lambda dep=dep, a=attack: fedmia_point(config, state, key, dep, a),
            unit='scores'))
  if 'dishonest' in state['parts']:
    params = {'part': 'dishonest', 'deployment': 'flower',
              'num_components': int(s.dishonest.num_components)}
    points.append(base.Point(params, lambda: dishonest_point(config, state, key),
                             unit='decisions'))
  if 'dp' in state['parts']:
    for setting in state['settings']:
      params = dict(part='dp', **setting.params())
      points.append(base.Point(
          params, lambda st=setting, k=point_key(key, params): dp_point(config, st, k),
          after=lambda m, p=params: _report_violation(p, m)))
  return points


# ---------------------------------------------------------------------- tables, figure ---


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
  """The three parts as markdown tables."""
  lines = ['# Flower deployment audit', '']
  fed = [p for p in points if p['params'].get('part') == 'fedmia']
  if fed:
    lines += ['## FedMIA table: Flower deployment vs native simulation (aligned scoring)', '',
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
              'Client-level, add/remove, one round, no sampling amplification; adversary: '
              'readers of the aggregate (server_fixed, client_fixed, server_adaptive, '
              'client_adaptive) or the server reading uploads (local_dp). Empirical epsilons '
              'are 95% lower bounds.', '',
              '| setting | wrapper | C | z / (sensitivity, eps) | delta | noise std | stated eps '
              '| source | our RDP eps | exact eps | eps CP | eps GDP | trials (in/out) | '
              'violation | exact > stated |', '|' + '---|' * 15]
    for p in dps:
      q, m = p['params'], p['metrics']
      arg = (f'z={q["noise_multiplier"]:g}, n={q["num_sampled_clients"]}'
             if q['wrapper'] != 'local_dp' else
             f's={q["sensitivity"]:g}, eps={q["epsilon"]:g}')
      lines.append(
          f'| {q["setting"]} | {q["wrapper"]} | {q["clipping_norm"]:g} | {arg} | '
          f'{q["delta"]:g} | {_finite(m["flower_noise_std"]):.3g} | {_fmt(m["stated_epsilon"], 2)} '
          f'| {m["stated_epsilon_source"]} | {_finite(m["dp_epsilon"]):.4g} | '
          f'{_finite(m["dp_epsilon_exact"]):.4g} | {_fmt(m["epsilon_cp"], 2)} | '
          f'{_fmt(m["epsilon_gdp"], 2)} | {m["n_in"]}/{m["n_out"]} | '
          f'{"YES" if _finite(m["privacy_violation"]) > 0 else "no"} | '
          f'{"YES" if _finite(m["accountant_violation"]) > 0 else "no"} |')
    lines += ['', 'Adaptive wrappers: the aggregate of the first round only (noise std at the '
              'initial clip shown; Flower draws it with the updated clip). Not audited: ' +
              ', '.join(dp_audit.NOT_AUDITED) + '.', '']
  return '\n'.join(lines)


def figures(config, state, store, key) -> None:
  del config, state, key
  atomic.atomic_write_text(f'{store.workdir}/{TABLES}', tables_markdown(store.points))
  dp_figure(store.points, store.workdir)
