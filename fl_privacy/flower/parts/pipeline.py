"""The `flower_audit` experiment: auditing a real Flower deployment (Flower >= 1.42).

What `python -m experiments.flower_audit` runs (a `pipelines.base.Pipeline`; fields:
configs/_flower_audit.py; results: docs/experiments/flower_audit.md). Four default parts (the
first two in `fedmia` and `dishonest`, tables and figure in `tables`) and one opt-in:

1. `fedmia`: a FedAvg deployment of `num_clients` Flower ClientApps (`client.make_client_app`,
   IID shards of digits) driven by Flower's own `FedAvg` round loop on the in-process grid
   (`inprocess.InProcessGrid`), wrapped in `RecordingStrategy`; the FedMIA table (aligned
   scoring, `attacks.passive.evaluate.evaluate`) from the recorded uploads
   (`recording.recording_from_uploads`), and the same table from fl_privacy's own simulation
   of the same training (`fl.recording.record_shards`: same shards, keys, initial model and
   optimizer). Points carry `deployment` = 'flower' or 'native'. `replicates` independent
   deployments (keys fold_in(run key, r), each stored under `deployments/`); each point's
   metrics over them (`pipelines.fedmia_replicates.combine`, `eval.replicated`).
2. `dishonest`: `DishonestStrategy` (M = `dishonest.num_components`) against the trained
   deployment: one crafted round per target, every node attacked; targets from the nodes'
   shards (one member decision each at their node) and from the test split; TPR and FPR with
   Clopper-Pearson intervals (`eval.stats.rate`).
3. `dp`: Flower's DP wrappers and mods against their stated epsilon
   (`fl_privacy.flower.audits.dp_games`), and the figure `flower_dp_audit.png` (stated vs
   empirical epsilon, y = x): one round per game, 4,000 games.
4. `training`: every DP wrapper over every round of one deployment with canary clients
   (`fl_privacy.flower.audits.canaries`): Steinke et al.'s one-run bounds and Andrew et al.'s
   Gaussian-fit estimate against Flower's stated epsilon over the rounds; the verdict at
   family-wise `training.confidence` (each of the k counted bounds at 1 - (1 - c) / k).
5. `reconstruction` (opt-in, not in the default `parts`; `parts.reconstruction`):
   `ReconstructionStrategy` sends the imprint-crafted model (Fowl et al. 2022) to every node of
   a deployment of `reconstruction.num_nodes` ClientApps (B = 8, E = 1 by default) and recovers
   their inputs from the replies; the same attack in fl_privacy's simulation beside it
   (`deployment` = 'flower' / 'native'); exact-recovery rates per node and pooled.

Tables: `flower_audit.md` (the parts that ran; flower vs native side by side).
"""

from __future__ import annotations

from typing import Any

from absl import logging
import jax
import numpy as np

from fl_privacy import defenses
from fl_privacy import validate
from fl_privacy.attacks.passive import scores as scores_lib
from fl_privacy.flower.audits import canaries
from fl_privacy.flower.audits import canary_design
from fl_privacy.flower.audits import dp_games
from fl_privacy.flower.audits import dp_setting
from fl_privacy.flower.engines import deployment as deployment_lib
from fl_privacy.flower.engines import dispatch
from fl_privacy.flower.parts import common
from fl_privacy.flower.parts import config_checks
from fl_privacy.flower.parts import dishonest
from fl_privacy.flower.parts import fedmia
from fl_privacy.flower.parts import reconstruction
from fl_privacy.flower.parts import tables as tables_lib
from fl_privacy.flower.parts import torch_part
from fl_privacy.pipelines import base
from fl_privacy.report import atomic
from fl_privacy.report import point_key
from fl_privacy.report import summary


NAME = 'flower_audit'
PARTS = ('fedmia', 'dishonest', 'dp', 'training', 'reconstruction', 'torch')
WRAPPERS = dp_setting.WRAPPERS
DEPLOYMENTS = ('flower', 'native')
MODELS = ('flower_cnn', 'mlp')
# The canary game's sizes a training point's params carry (a changed size is a new point).
TRAINING_PARAMS = ('num_canaries', 'num_real', 'num_rounds', 'dimension', 'canary_norm',
                   'real_norm', 'num_null', 'directions')
FIGURE = tables_lib.FIGURE
TABLES = tables_lib.TABLES

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
    summary.Table('Flower DP: stated vs empirical epsilon (client-level, one round; '
                  'exact eps of the release; lower bounds at 95%)',
                  (summary.param('setting'), summary.param('wrapper'),
                   summary.metric('stated_epsilon', 'stated eps', digits=2),
                   summary.metric('dp_epsilon', 'our RDP eps', digits=2),
                   summary.metric('dp_epsilon_exact', 'exact eps', digits=2),
                   summary.metric('epsilon_cp', 'eps CP', digits=2),
                   summary.metric('epsilon_gdp', 'eps GDP', digits=2),
                   summary.flag('privacy_violation', 'violation'),
                   summary.flag('accountant_violation', 'exact > stated')),
                  where={'part': 'dp'}),
    summary.Table('Flower DP over every round of a deployment: one-run audit with canary '
                  'clients (zero-out; all iterates; violation at family-wise 95%: one-run '
                  'bounds each at 1 - 5% / k, k counted; fit an estimate)',
                  (summary.param('setting'), summary.param('wrapper'),
                   summary.param('num_rounds', 'rounds'),
                   summary.param('num_canaries', 'canaries'),
                   summary.metric('stated_epsilon', 'stated eps', digits=2),
                   summary.metric('exact_epsilon_all_iterates', 'exact eps', digits=2),
                   summary.metric('all_iterates/epsilon_one_run', 'one-run', digits=2),
                   summary.metric('all_iterates/epsilon_one_run_fdp', 'one-run f-DP', digits=2),
                   summary.metric('all_iterates/epsilon_fit', 'Gaussian fit (estimate)',
                                  digits=2),
                   # Points stored before the family-wise verdict have none: '-'.
                   summary.metric('bound_confidence', 'bounds at', digits=4, nan='-'),
                   summary.flag('privacy_violation', 'violation'),
                   summary.flag('accountant_violation', 'exact > stated')),
                  where={'part': 'training'}),
    summary.Table('Imprint server (ReconstructionStrategy) against a Flower deployment vs '
                  'native simulation (rates over examples: 95% Clopper-Pearson)',
                  (summary.param('deployment'), summary.param('num_nodes', 'nodes'),
                   summary.param('batch_size', 'B'), summary.param('epochs', 'E'),
                   summary.rate('exact', 'exact [95% CI]'),
                   summary.rate('all_exact', 'nodes all exact'),
                   summary.metric('psnr_mean', 'PSNR', digits=1),
                   summary.metric('n_examples', 'examples')),
                  where={'part': 'reconstruction'}),
)


# -------------------------------------------------------------------------- validation ---

def validate_config(config) -> dict[str, Any]:
  """Checks every field the experiment reads (nothing loaded); returns the parts and the DP
  settings."""
  s = config.flower_audit
  parts = validate.subset_of(config, 'flower_audit.parts', PARTS)
  validate.one_of(config, 'flower_audit.engine', dispatch.ENGINES)
  # Only FedMIA needs two non-target clients; the other parts run on any deployment of >= 2.
  validate.checked(config, 'flower_audit.num_clients', validate.number(
      3, integer=True, words='FedMIA needs two non-target clients') if 'fedmia' in parts else
                   validate.number(2, integer=True))
  validate.checked(config, 'flower_audit.replicates', config_checks.POSITIVE_INT)
  validate.checked(config, 'flower_audit.replicates', validate.Rule(
      "1 unless parts has 'fedmia' (only the FedMIA part is replicated)",
      lambda r: int(r) == 1 or 'fedmia' in parts))
  for field in ('per_client', 'num_rounds', 'record_every', 'local_epochs', 'batch_size',
                'chunk_size', 'dishonest.num_components', 'dishonest.targets_in',
                'dp.num_trials', 'dp.dimension'):
    validate.checked(config, f'flower_audit.{field}', config_checks.POSITIVE_INT)
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
  settings = sorted((config_checks.check_setting(name, s.dp.settings[name])
                     for name in s.dp.settings.keys()),
                    key=lambda st: (WRAPPERS.index(st.wrapper), -st.noise_multiplier
                                    if st.central else st.epsilon, -st.sensitivity, st.label))
  validate.checked(config, 'flower_audit.dp.settings', validate.Rule(
      'at least one setting when parts has dp', lambda v: bool(settings) or 'dp' not in parts))
  reconstruction.validate_section(config)
  if 'torch' in parts:
    torch_part.validate(config)
  if 'defense' in config:
    defenses.check_honoured(config.defense, NAME, ('none',), "it deploys Flower's own DP "
                            'wrappers (flower_audit.dp.settings)')
  design, training = (config_checks.check_training(config) if 'training' in parts else
                      (None, []))
  if s.engine == 'deployment':
    _check_deployment_size(config, parts, design)
  return {'parts': tuple(parts), 'settings': settings, 'design': design, 'training': training}


def _check_deployment_size(config, parts, design) -> None:
  """On the Deployment Engine every node is a SuperNode process with the superexec it starts,
  and each of its messages a ClientApp process, a round's all at once (`engines.sizes`):
  refuse node counts this machine's memory cannot hold (`engines.max_deployment_nodes`)."""
  bound = deployment_lib.max_deployment_nodes()
  reason = (f"engine 'deployment' runs at most {bound} nodes on this machine: a SuperNode, its "
            f'superexec and a ClientApp process, ~{deployment_lib.NODE_BYTES / 1e9:.1f} GB a '
            "node, all at once; engine 'simulation' runs more")
  if set(parts) & {'fedmia', 'dishonest'}:
    validate.checked(config, 'flower_audit.num_clients', validate.Rule(
        f'at most {bound} ({reason})', lambda n: int(n) <= bound))
  if 'training' in parts:
    real = design.num_nodes - design.num_canaries
    validate.checked(config, 'flower_audit.training.num_canaries', validate.Rule(
        f'such that num_canaries + num_real ({real}) <= {bound} ({reason})',
        lambda n: int(n) + real <= bound))
  if 'reconstruction' in parts:
    validate.checked(config, 'flower_audit.reconstruction.num_nodes', validate.Rule(
        f'at most {bound} ({reason})', lambda n: int(n) <= bound))


def unused_fields(config) -> dict[str, str]:
  """The `flower_audit` fields this run does not read (`base.unused`: a command-line override of
  one is refused rather than recorded as if it ran): the sub-sections of the parts not run,
  FedMIA's attacks and filter without the FedMIA part, the MLP's widths under another model.
  {} for a config validation refuses (it names the field itself)."""
  s = config.flower_audit
  try:
    parts = set(s.parts)
  except TypeError:
    return {}
  out: dict[str, str] = {}
  for part in ('dishonest', 'dp', 'training', 'reconstruction', 'torch'):
    if part not in parts and part in s:
      out.update({f: f"read only by the {part!r} part, which flower_audit.parts does not run"
                  for f in base.leaf_fields(s[part], f'flower_audit.{part}')})
  if 'fedmia' not in parts:
    out.update({f'flower_audit.{f}': "read only by the 'fedmia' part, which "
                'flower_audit.parts does not run' for f in ('attacks', 'outlier_filter')})
  if s.model != 'mlp':
    out['flower_audit.hidden'] = f"read only by model 'mlp' (the model is {s.model!r})"
  if 'training' in parts and s.training.get('real_clients', 'fixed') == 'trained':
    out['flower_audit.training.real_norm'] = ("read only by real_clients 'fixed' (trained real "
                                              "nodes reply their trained model)")
  if not parts & {'fedmia', 'dishonest', 'training', 'reconstruction', 'torch'}:
    out['flower_audit.engine'] = ("read only by the parts that deploy Flower (fedmia, "
                                  "dishonest, training, reconstruction); the dp part's games "
                                  "call Flower's wrappers directly")
  return out


def prepare(config) -> dict[str, Any]:
  """Validates the config and loads the data (digits); writes nothing."""
  state = validate_config(config)
  train, test = base.train_test(config)
  s = config.flower_audit
  need = int(s.num_clients) * int(s.per_client)
  validate.require(need <= len(train), 'flower_audit.per_client',
                   f'num_clients x per_client <= {len(train)} training examples',
                   int(s.per_client))
  state.update(train=train, test=test, cache={})
  if 'reconstruction' in state['parts']:
    reconstruction.prepare(config, state)
  model = common.make_model(config, train)
  # The dishonest detector's room: M <= trunk features, 2M <= units of fc1.
  template = jax.eval_shape(model.init, jax.random.key(0),
                            jax.ShapeDtypeStruct((1,) + train.x.shape[1:], np.float32))
  features, width = template['params']['fc1']['kernel'].shape
  validate.checked(config, 'flower_audit.dishonest.num_components', validate.Rule(
      f'at most {min(features, width // 2)} (M <= {features} trunk features, 2M <= {width} '
      'units of fc1)', lambda m: int(m) <= features and 2 * int(m) <= width))
  state['model'] = model
  return state


def dp_point(config, setting: dp_setting.Setting, key) -> tuple[dict, int]:
  d = config.flower_audit.dp
  metrics = dp_games.audit(setting, key, int(d.num_trials), dimension=int(d.dimension),
                           canary_norm=float(d.canary_norm), confidence=float(d.confidence))
  return metrics, int(d.num_trials)


def training_point(config, setting: dp_setting.Setting, design: canary_design.Design, key,
                   workdir: str | None = None) -> tuple[dict, int]:
  engine = common.engine(config)
  return (canaries.audit(setting, design, key, engine=engine, workdir=common.job_workdir(
      workdir, f'training_{setting.label}')), int(design.num_canaries))


def engine_param(config, deployment: str) -> dict[str, str]:
  """{'engine': flower_audit.engine} for a point a Flower engine runs ('flower'
  deployments), {} for fl_privacy's own simulation ('native') and the DP games (no
  deployment: they call Flower's wrappers on one round's updates)."""
  return {'engine': common.engine(config)} if deployment == 'flower' else {}


def _report_violation(params, metrics) -> None:
  if params['part'] == 'training' and float(metrics.get('privacy_violation', 0.0)) > 0:
    logging.error('PRIVACY VIOLATION: Flower %s (%s) states epsilon %.3g over %d rounds but '
                  'the one-run audit certifies %.3f at family-wise confidence %g%% (the '
                  'largest of the counted bounds %s, each at %.4g%%)', params['wrapper'],
                  params['setting'], float(metrics['stated_epsilon']),
                  int(params['num_rounds']), float(metrics['best_bound']),
                  # A point stored before the family-wise verdict has none: NaN / 'none'.
                  100 * float(metrics.get('verdict_confidence', 'nan')),
                  metrics.get('counted_bounds', 'none'),
                  100 * float(metrics.get('bound_confidence', 'nan')))
  elif float(metrics.get('privacy_violation', 0.0)) > 0:
    logging.error('PRIVACY VIOLATION: Flower %s (%s) states epsilon %.3g but the audit '
                  'certifies more: lower bounds CP %.3f, GDP %.3f', params['wrapper'],
                  params['setting'], float(metrics['stated_epsilon']),
                  float(metrics['epsilon_cp']), float(metrics['epsilon_gdp']))


def plan(config, state, store, key) -> list[base.Point]:
  """fedmia (attacks x deployments), dishonest, dp and training (one point per setting)."""
  s = config.flower_audit
  points = []
  if 'fedmia' in state['parts']:
    for attack in s.attacks:
      for dep in DEPLOYMENTS:
        params = {'part': 'fedmia', 'deployment': dep, 'attack': attack,
                  **engine_param(config, dep)}
        points.append(base.Point(
            params, lambda dep=dep, a=attack: fedmia.fedmia_point(config, state, key, dep, a,
                                                                  store.workdir),
            unit='scores'))
  if 'dishonest' in state['parts']:
    params = {'part': 'dishonest', 'deployment': 'flower',
              'num_components': int(s.dishonest.num_components),
              **engine_param(config, 'flower')}
    points.append(base.Point(params, lambda: dishonest.dishonest_point(config, state, key,
                                                                       store.workdir),
                             unit='decisions'))
  if 'dp' in state['parts']:
    for setting in state['settings']:
      params = dict(part='dp', **setting.params())
      points.append(base.Point(
          params, lambda st=setting, k=point_key(key, params): dp_point(config, st, k),
          after=lambda m, p=params: _report_violation(p, m)))
  if 'training' in state['parts']:
    design = state['design']
    for setting in state['training']:
      params = dict(part='training', **{k: v for k, v in setting.params().items()
                                        if k != 'num_sampled_clients'},
                    **{f: getattr(design, f) for f in TRAINING_PARAMS})
      # The engine is a param (another engine's stored point is not reused) but not in the
      # key: the same canaries and coins on every engine.
      k = point_key(key, params)
      # Sampling and trained real nodes (off their defaults) likewise: the same canaries and
      # coins as the default point, so the settings stay paired.
      params = {**params, **design.point_params(), **engine_param(config, 'flower')}
      points.append(base.Point(
          params, lambda st=setting, k=k: training_point(config, st, design, k, store.workdir),
          unit='canaries', after=lambda m, p=params: _report_violation(p, m)))
  if 'reconstruction' in state['parts']:
    for dep in DEPLOYMENTS:
      params = {**reconstruction.point_params(config, dep), **engine_param(config, dep)}
      points.append(base.Point(
          params, lambda dep=dep: reconstruction.point(config, state, key, dep,
                                                       store.workdir),
          unit='examples'))
  if 'torch' in state['parts']:
    points += torch_part.plan_points(config, key, store.workdir)
  return points


def figures(config, state, store, key) -> None:
  del config, state, key
  atomic.atomic_write_text(f'{store.workdir}/{TABLES}', tables_lib.tables_markdown(store.points))
  tables_lib.dp_figure(store.points, store.workdir)
