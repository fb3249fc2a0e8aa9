"""The PASTEL pipeline (Elhattab and Bouchenak): the regulariser and the DP baselines under attack.

`python -m experiments.pastel` hands `prepare` and `sweep` to `experiments.common.main`; the
script's docstring says how to run it and what it writes.

Data. The train split is cut into K IID shards (`per_client` rows each, or all of it); each
shard is split (seeded) into members (the rows every defense trains on) and a held-out part
(`validation_fraction`, at least a batch) that only PASTEL reads, as its V batches, redrawn
every local step; held-out rows are neither members nor non-members in any attack. The
non-members are the test split and the train rows no client holds. `replicates` independent
replicates (keys fold_in(run_key, r)) redraw all of it and every training; each point reports
its attack statistics and its paired change against `none` over them, the pooled
single-sample numbers beside them (`pipelines.pastel_replicates`).

Trainings. One training per (defense, strength, optimizer, representation) and replicate:
`none`; `pastel` at each lambda and reading; `wdp`, `ldp`, `cdp` at each target epsilon
(calibrated by `dp_accounting`); `none` and `pastel` with `ablation_optimizer`. Every training of
a replicate starts from its w_0 with its client keys (common random numbers); the recorded
arrays (`attacks.passive.pastel.record`) go to `<workdir>/trained/*.npz`, so re-scoring or
resuming never retrains. Attacks and targets (`local`, `global`): `attacks.passive.pastel`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy import defenses as defenses_lib
from fl_privacy import models as models_lib
from fl_privacy import memory
from fl_privacy import validate
from fl_privacy.attacks.passive import pastel as passive_pastel
from fl_privacy.defenses import pastel as pastel_lib
from fl_privacy.defenses import registry as dp_rules
from fl_privacy.defenses import pastel_training
from fl_privacy.fl import optimizers as optimizers_lib
from fl_privacy.pipelines import ahead
from fl_privacy.pipelines import base
from fl_privacy.pipelines import pastel_dp
from fl_privacy.pipelines import pastel_figures
from fl_privacy.pipelines import pastel_replicates
from fl_privacy.pipelines.pastel_dp import check_calibrations, dp_accounting  # re-exported
from fl_privacy.report import ArtifactStore
from fl_privacy.report import atomic
from fl_privacy.report import point_key
from fl_privacy.report import summary

NAME = 'pastel'
DEFENSES = ('none', 'pastel', 'wdp', 'ldp', 'cdp')
DP_DEFENSES = pastel_dp.DP_DEFENSES
ATTACKS = ('nasr_whitebox', 'loss_threshold', 'fedmia_i', 'fedmia_ii')
FEDMIA_ATTACKS = passive_pastel.FEDMIA_ATTACKS
DP_NAMES = pastel_training.DP_NAMES  # PASTEL's DP baselines -> the registry's names
TARGETS = ('local', 'global')
TRAINED = 'trained'
TABLE = 'table.md'
_NO_ABLATION = (None, '', 'none', 'None')
# Declared rules of the fields the helpers in `validate_config` do not cover.
RULES = {
    'pastel.pastel_weights': validate.Rule('a non-empty list of lambdas >= 0',
                                           lambda w: len(tuple(w)) > 0),
    'pastel.pastel_layers': validate.items(
        validate.Rule('', lambda n: isinstance(n, str)),
        'a list of layer names (() = every Dense layer)', scalar=False, nonempty=False),
    'pastel.attack_last_layer_grad': validate.BOOLEAN,
    'pastel.attack_per_replicate': validate.BOOLEAN,
    'pastel.pastel_representations': validate.items(
        validate.Rule('', lambda r: r in pastel_lib.REPRESENTATIONS),
        f'a non-empty list of {pastel_lib.REPRESENTATIONS}', scalar=False),
    'pastel.per_client': validate.number(3, integer=True, optional=True),
    'pastel.replicates': validate.number(1, integer=True),
    **{f'pastel.{f}': validate.positive_rule(True) for f in (
        'local_epochs', 'batch_size', 'attack_steps', 'attack_hidden', 'feature_chunk_size',
        'bootstrap_resamples')},
    **{f'pastel.{f}': validate.positive_rule() for f in (
        'learning_rate', 'ablation_learning_rate', 'attack_learning_rate', 'pastel_temperature')},
}
# The headline columns: logged per saved point and printed as a table at the end of a run.
SUMMARY = summary.Table('PASTEL (attack AUC and accuracy: 95% intervals)', (
    summary.param('defense'), summary.param('strength'), summary.param('optimizer'),
    summary.param('representation'), summary.param('attack'), summary.param('target'),
    summary.rate('attack_auc', 'AUC'), summary.rate('tpr_at_fpr_1e-2', 'TPR@1%FPR'),
    summary.rate('accuracy', 'test acc.'),
    summary.metric('dp_epsilon', 'DP eps', digits=2, nan='-'), summary.seconds()))


def _s(config):
  return config.pastel


def _ablation(config) -> str | None:
  a = _s(config).ablation_optimizer
  return None if a in _NO_ABLATION else a


def validate_config(config) -> None:
  """Checks every field that does not need the data or the model (before anything loads)."""
  data_lib.validate_data_config(config.data)
  s = _s(config)
  validate.one_of(config, 'pastel.model', models_lib.MODELS)
  if s.model == 'mlp':
    validate.positive(config, 'pastel.mlp_hidden', integer=True)
  k = validate.checked(config, 'pastel.num_clients', validate.number(2, integer=True))
  t = validate.positive(config, 'pastel.num_rounds', integer=True)
  r = validate.positive(config, 'pastel.record_every', integer=True)
  validate.require(t % r == 0, 'pastel.record_every', f'a divisor of num_rounds ({t})', r)
  validate.one_of(config, 'pastel.optimizer', optimizers_lib.OPTIMIZERS)
  validate.checked(config, 'pastel.ablation_optimizer', validate.Rule(
      f'None or one of {optimizers_lib.OPTIMIZERS}',
      lambda a: a in _NO_ABLATION or a in optimizers_lib.OPTIMIZERS))
  validate.in_range(config, 'pastel.ablation_pastel_weight', 0.0, math.inf)
  validate.subset_of(config, 'pastel.defenses', DEFENSES)
  validate.check_all(config, RULES)
  validate.in_range(config, 'pastel.pastel_weights', 0.0, math.inf)
  validate.in_range(config, 'pastel.validation_fraction', 0.0, 0.5, low_inclusive=False)
  # PASTEL's DP baselines read the defense registry's one rule of each field.
  validate.check_all(config, {'pastel.epsilons': dp_rules.each('epsilon'),
                              'pastel.dp_delta': dp_rules.rule('delta'),
                              'pastel.clip_norm': dp_rules.rule('clip_norm'),
                              'pastel.update_clip_norm': dp_rules.rule('clip_norm'),
                              'pastel.ldp_sampling': dp_rules.rule('dp_sgd_sampling')})
  if 'defense' in config:
    defenses_lib.check_honoured(config.defense, NAME, ('none',), 'PASTEL sweeps its own '
                                'defenses in pastel.defenses')
  attacks = validate.subset_of(config, 'pastel.attacks', ATTACKS)
  validate.subset_of(config, 'pastel.targets', TARGETS)
  snaps = validate.positive(config, 'pastel.attack_snapshots', integer=True)
  validate.require(snaps <= t // r, 'pastel.attack_snapshots',
                   f'<= the number of recorded rounds (num_rounds / record_every = {t // r})',
                   snaps)
  if set(attacks) & set(FEDMIA_ATTACKS):
    validate.require(k >= 3, 'pastel.num_clients',
                     '>= 3 with FedMIA attacks (each needs >= 2 other clients)', k)


def make_model(config, num_classes: int):
  s = _s(config)
  kw = {'hidden': tuple(s.mlp_hidden)} if s.model == 'mlp' else {}
  return models_lib.make(s.model, num_classes, field='pastel.model', **kw)


def prepare(config) -> dict:
  """Validates the config, loads the data, and checks what depends on the data or the model."""
  validate_config(config)
  s = _s(config)
  splits = data_lib.load(config.data)
  validate.require('train' in splits and 'test' in splits, 'data.name',
                   'a dataset with train and test splits', config.data.name)
  train, test = splits['train'], splits['test']
  k = int(s.num_clients)
  data_lib.require_examples(config.data, "its 'train' split", len(train),
                            k * passive_pastel.least_per_client(float(s.validation_fraction)),
                            f'pastel.num_clients = {k} clients, each >= 2 members and >= 1 '
                            'held-out row')
  data_lib.require_examples(config.data, "its 'test' split", len(test), 4 * k,
                            f'pastel.num_clients = {k} clients x 4 test non-members')
  # Shard sizes, each client's held-out rows >= a batch, the test share per client.
  passive_pastel.check_shards(len(train), len(test), k, s.per_client,
                              float(s.validation_fraction), int(s.batch_size))
  check_calibrations(config, len(train))
  model = make_model(config, train.num_classes)
  memory.require_batch_fits('pastel.batch_size', int(s.batch_size), model, train.x.shape[1:], k)
  for rep in s.pastel_representations:
    layers = pastel_training.regularised_layers(model, train.x.shape[1:],
                                                tuple(s.pastel_layers), rep, s.model)
  return dict(train=train, test=test, model=model, layers=layers,
              x_train=data_lib.to_float(train.x), x_test=data_lib.to_float(test.x))


def trainings(config) -> list[dict]:
  """Every (defense, strength, optimizer, representation) trained, in sweep order;
  `representation` is PASTEL's reading ('-' for the trainings without the regulariser)."""
  s = _s(config)
  tr = lambda d, v, r='-', o=s.optimizer: dict(defense=d, strength=float(v), optimizer=o,
                                               representation=r)
  reps = tuple(s.pastel_representations)
  out = []
  for d in s.defenses:
    if d == 'none':
      out.append(tr('none', 0.0))
    else:
      out += ([tr('pastel', w, r) for r in reps for w in s.pastel_weights] if d == 'pastel'
              else [tr(d, e) for e in s.epsilons])
  ablation = _ablation(config)
  if ablation is not None and ablation != s.optimizer:
    out += [tr('none', 0.0, o=ablation), tr('pastel', s.ablation_pastel_weight, reps[0], ablation)]
  return out


def unused_fields(config) -> dict[str, str]:
  """The `pastel` fields this run does not read (`base.unused`: a command-line override of one
  is refused rather than recorded as if it ran), read from the trainings it runs
  (`trainings`): the MLP's widths under another model, the ablation's settings without it,
  PASTEL's weights without a PASTEL training, the softmax temperature without the
  'activation' reading, the DP baselines' fields without those baselines, the white-box
  attack model's training without that attack.
  {} for a config validation refuses (it names the field itself)."""
  s = _s(config)
  try:
    trs = trainings(config)
    attacks = set(s.attacks)
  except (TypeError, KeyError, IndexError, ValueError):
    return {}
  defended = {t['defense'] for t in trs}
  readings = {t['representation'] for t in trs}
  ablation = any(t['optimizer'] != s.optimizer for t in trs)
  out: dict[str, str] = {}
  def unused(fields, why):
    out.update({f'pastel.{f}': why for f in fields})
  if s.model != 'mlp':
    unused(('mlp_hidden',), f"read only by model 'mlp' (the model is {s.model!r})")
  if not ablation:
    unused(('ablation_learning_rate', 'ablation_pastel_weight'), 'read only by the ablation, '
           "which does not train (ablation_optimizer 'none' or the clients' own)")
  # The layers, the first reading and its temperature also feed every training's JS-gap
  # diagnostic (`record`), so they are read without a PASTEL training.
  if 'pastel' not in tuple(s.defenses):
    unused(('pastel_weights',), "read only by the 'pastel' defense, which pastel.defenses "
           'does not include (the ablation trains at ablation_pastel_weight)')
  if 'activation' not in readings | {tuple(s.pastel_representations)[0]}:
    unused(('pastel_temperature',), "read only by PASTEL's 'activation' reading, which no "
           'training or diagnostic uses')
  if not defended & {'wdp', 'ldp', 'cdp'}:
    unused(('epsilons', 'dp_delta'), 'read only by the DP baselines (wdp, ldp, cdp), which '
           'pastel.defenses does not include')
  if 'ldp' not in defended:
    unused(('clip_norm', 'ldp_sampling'), "read only by 'ldp', which pastel.defenses does "
           'not include')
  if not defended & {'wdp', 'cdp'}:
    unused(('update_clip_norm',), "read only by 'wdp' and 'cdp', which pastel.defenses does "
           'not include')
  if 'nasr_whitebox' not in attacks:
    unused(('attack_per_replicate', 'attack_steps', 'attack_learning_rate', 'attack_hidden'),
           "read only by 'nasr_whitebox', which pastel.attacks does not include")
  return out


def describe(tr: dict) -> str:
  rep = '' if tr['representation'] == '-' else f', {tr["representation"]}'
  return f'{tr["defense"]}({tr["strength"]:g}, {tr["optimizer"]}{rep})'


def train(config, state, data: dict, tr: dict, key) -> dict[str, np.ndarray]:
  """One training of one replicate (`data`, key `key`; `attacks.passive.pastel.record`),
  with its DP info; arrays to store."""
  s = _s(config)
  model, split = state['model'], data['split']
  # The JS gap diagnostic's reading: the training's (the first for the unregularised ones).
  reading = s.pastel_representations[0] if tr['representation'] == '-' else tr['representation']
  lr = s.learning_rate if tr['optimizer'] == s.optimizer else s.ablation_learning_rate
  opt = pastel_training.optimizer(tr['optimizer'], float(lr))
  factory, strength, info = pastel_training.setup(
      tr['defense'], tr['strength'],
      lambda: dp_accounting(config, split, tr['defense'], tr['strength']),
      apply_fn=model.apply, layers=tuple(state['layers']),
      representation=reading, temperature=float(s.pastel_temperature),
      batch_size=int(s.batch_size), clip_norm=float(s.clip_norm),
      update_clip_norm=float(s.update_clip_norm))
  x_train, y_train = state['x_train'], state['train'].y
  clients = pastel_training.client_data(x_train, y_train, split['members'], split['heldout'])
  params = model.init(point_key(key, {'role': 'init'}), jnp.asarray(x_train[:1]))
  out = passive_pastel.record(
      model.apply, params, clients, point_key(key, {'role': 'training'}), strength,
      factory=factory, optimizer=opt, epochs=int(s.local_epochs), batch_size=int(s.batch_size),
      num_rounds=int(s.num_rounds), record_every=int(s.record_every),
      attack_snapshots=int(s.attack_snapshots), x_train=x_train, y_train=y_train,
      x_test=state['x_test'], y_test=state['test'].y, members=split['members'],
      heldout=split['heldout'], rows=data['rows'],
      need_fedmia=bool(set(s.attacks) & set(FEDMIA_ATTACKS)) and 'local' in s.targets,
      last_layer_grad=bool(s.attack_last_layer_grad), chunk_size=int(s.feature_chunk_size),
      layers=state['layers'], representation=reading,
      temperature=float(s.pastel_temperature), defense=tr['defense'], clip_norm=s.clip_norm,
      update_clip_norm=s.update_clip_norm, x_out=data['x_out'], y_out=data['y_out'])
  out.update(info)
  return out


def attack_plan(config) -> list[tuple[str, str]]:
  """(attack, target) pairs; FedMIA attacks score the local target only."""
  s = _s(config)
  return [(a, t) for t in s.targets for a in s.attacks
          if not (a in FEDMIA_ATTACKS and t != 'local')]


def point_metrics(config, replicas: list[dict], attack: str, target: str, key,
                  tr_defense: str = 'none', tr_strength: float = 0.0,
                  reference: tuple | None = None, params: dict | None = None) -> dict:
  """One point's metrics over the replicates (`replicas`: each `{'arrays', 'rows', 'members',
  'ids', 'split'}`; `pipelines.pastel_replicates`); with `reference` (the undefended
  trainings' `pooled_attack_scores` of the same attack) also the paired AUC change. The
  bootstrap's Generator is keyed by the point (`params`)."""
  s = _s(config)
  scored = passive_pastel.pooled_attack_scores(replicas, attack, target, key,
                                               **pastel_replicates.attack_options(config))
  rng = lambda role: data_lib.rng_from_key(point_key(key, dict(params or {}, role=role)))
  boot = int(s.bootstrap_resamples)
  m = pastel_replicates.point(scored, rng=rng('replicated'), num_resamples=boot)
  m.update(pastel_replicates.utility([r['arrays'] for r in replicas]))
  if reference is not None:
    m.update(pastel_replicates.change(scored, reference, rng=rng('change'), num_resamples=boot))
  if tr_defense in DP_NAMES:
    m.update(passive_pastel.dp_metrics(
        *scored[:2], dp_accounting(config, replicas[0]['split'], tr_defense, tr_strength),
        target, float(s.dp_delta)))
  return m


def point_params(tr: dict, attack: str, target: str) -> dict:
  return dict(defense=tr['defense'], strength=float(tr['strength']),
              optimizer=tr['optimizer'], representation=tr['representation'], attack=attack,
              target=target)


def _replicates(config, state, key) -> list[dict]:
  """Replicate r's data (`attacks.passive.pastel.replicate`, key fold_in(key, r)), shared."""
  if 'replicates' not in state:
    s = _s(config)
    state['replicates'] = [passive_pastel.replicate(
        jax.random.fold_in(key, r), state['x_train'], state['train'].y, state['x_test'],
        state['test'].y, int(s.num_clients), float(s.validation_fraction),
        None if s.per_client is None else int(s.per_client)) for r in range(int(s.replicates))]
  return state['replicates']


def trained(config, state, store, key, tr: dict, r: int = 0) -> dict[str, np.ndarray]:
  """Replicate r of training `tr`: read from the artifacts, else trained and saved."""
  data = _replicates(config, state, key)[r]
  artifacts = ArtifactStore(store.workdir, TRAINED)
  arrays = artifacts.load(dict(tr, replicate=r))
  if arrays is not None and 'fm_loss' in arrays and 'fm_margin' not in arrays:
    # Stored before FedMIA-I read the loss from the logit margins: record them by training again.
    logging.info('pastel: %s replicate %d was stored without logit margins; training it again',
                 describe(tr), r)
    arrays = None
  if arrays is None:
    logging.info('pastel: training %s, replicate %d', describe(tr), r)
    arrays = train(config, state, data, tr, jax.random.fold_in(key, r))
    arrays['num_test'] = len(state['test'])
    artifacts.save(dict(tr, replicate=r), arrays)
    logging.info('pastel: %s replicate %d test accuracy %.4f, JSD %.4f', describe(tr), r,
                 int(arrays['test_correct']) / len(state['test']), arrays['jsd_last_round'])
  return arrays


def plan(config, state, store, key) -> list[base.Point]:
  """Every (training, attack, target); the replicates of a training with a point to compute
  are read or trained two trainings ahead of its scoring, two at a time (`ahead`), and dropped
  after its last point; `none`'s scores are kept."""
  s, kw = _s(config), pastel_replicates.attack_options(config)
  reps = _replicates(config, state, key)
  points, ref_scores = [], {}  # (optimizer, attack, target) -> `none`'s pooled scores
  load = lambda t, arrays=None: [dict(d, members=d['split']['members'], arrays=trained(
      config, state, store, key, t, r) if arrays is None else arrays[r])
                                 for r, d in enumerate(reps)]
  runs = ahead.over(trainings(config), lambda t: [a['arrays'] for a in load(t)], lambda t: any(
      store.get(point_params(t, a, tg)) is None for a, tg in attack_plan(config)), default_depth=2)
  for i, tr in enumerate(trainings(config)):
    cache = {}
    ref = dict(defense='none', strength=0.0, optimizer=tr['optimizer'], representation='-')
    ref = ref if tr != ref and 'none' in s.defenses else None

    def compute(tr, attack, target, ref=ref, cache=cache, i=i):
      if 'replicas' not in cache:
        cache['replicas'] = load(tr, runs.get(i))
      name = None if ref is None else (ref['optimizer'], attack, target)
      if name is not None and name not in ref_scores:
        ref_scores[name] = passive_pastel.pooled_attack_scores(load(ref), attack, target, key,
                                                               **kw)
      return (point_metrics(config, cache['replicas'], attack, target, key, tr['defense'],
                            tr['strength'], ref_scores.get(name),
                            point_params(tr, attack, target)),
              sum(len(d['rows'][target]['eval']) for d in reps))

    for attack, target in attack_plan(config):
      points.append(base.Point(point_params(tr, attack, target),
                               functools.partial(compute, tr, attack, target), 'examples'))
    points[-1] = dataclasses.replace(points[-1], after=lambda _, c=cache: c.clear())
  return points


def figures(config, state, store, key) -> None:
  """table.md and the figures (loss histograms: replicate 0's none and PASTEL global models)."""
  rows = _replicates(config, state, key)[0]['rows']
  losses = {}
  for tr in trainings(config):
    if tr['defense'] in ('none', 'pastel'):
      arrays = trained(config, state, store, key, tr)
      if 'global/loss' in arrays:
        g = rows['global']
        losses[describe(tr)] = dict(
            params=tr, member=arrays['global/loss'][g['labels'] == 1, -1, 0],
            nonmember=arrays['global/loss'][g['labels'] == 0, -1, 0])
  atomic.atomic_write_text(os.path.join(store.workdir, TABLE),
                           pastel_figures.table_markdown(config, store.points))
  pastel_figures.save_figures(config, store.points, losses, store.workdir)
