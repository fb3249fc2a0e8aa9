"""The PASTEL pipeline (Elhattab and Bouchenak): the regulariser and the DP baselines under attack.

`python -m experiments.pastel` hands `prepare` and `sweep` to `experiments.common.main`; the
script's docstring says how to run it and what it writes.

Data. The train split is cut into K IID shards; each shard is split (seeded) into members (the
rows every defense trains on) and a held-out part (`validation_fraction`) that only PASTEL
reads, as its V batches; held-out rows are neither members nor non-members in any attack. The
test split holds the non-members.

Trainings. One training per (defense, strength, optimizer): `none`; `pastel` at each lambda;
`wdp`, `ldp`, `cdp` at each target epsilon (the registry's DP defenses, calibrated by
`dp_accounting`); and `none` and `pastel` (lambda `ablation_pastel_weight`) with
`ablation_optimizer`, which separates the regulariser from AdaGrad. Every training starts from
the same w_0 with the same client keys (common random numbers) and is recorded by
`attacks.passive.pastel.record` (segmented rounds of `defenses.pastel_training`); the arrays
go to the artifact store (`<workdir>/trained/*.npz`), so re-scoring or resuming never retrains.

Attacks and targets (`attacks.passive.pastel`): `local` (client k's uploaded model against a
disjoint 1/K share of the test split, pooled over clients) and `global` (the global model
against the test split); per target a seeded balanced half trains the white-box attack and the
other half is scored by every attack. Each (training, attack, target) is one results point.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

from absl import logging
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
from fl_privacy.eval import auditing
from fl_privacy.eval import utility
from fl_privacy.fl import optimizers as optimizers_lib
from fl_privacy.pipelines import base
from fl_privacy.pipelines import pastel_figures
from fl_privacy.report import ArtifactStore
from fl_privacy.report import atomic
from fl_privacy.report import point_key
from fl_privacy.report import summary

NAME = 'pastel'
DEFENSES = ('none', 'pastel', 'wdp', 'ldp', 'cdp')
DP_DEFENSES = ('wdp', 'ldp', 'cdp')
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
}
# The headline columns: logged per saved point and printed as a table at the end of a run.
SUMMARY = summary.Table('PASTEL (attack AUC and accuracy: 95% intervals)', (
    summary.param('defense'), summary.param('strength'), summary.param('optimizer'),
    summary.param('attack'), summary.param('target'), summary.rate('attack_auc', 'AUC'),
    summary.rate('tpr_at_fpr_1e-2', 'TPR@1%FPR'), summary.rate('accuracy', 'test acc.'),
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
  validate.positive(config, 'pastel.local_epochs', integer=True)
  validate.positive(config, 'pastel.batch_size', integer=True)
  validate.one_of(config, 'pastel.optimizer', optimizers_lib.OPTIMIZERS)
  validate.positive(config, 'pastel.learning_rate')
  validate.checked(config, 'pastel.ablation_optimizer', validate.Rule(
      f'None or one of {optimizers_lib.OPTIMIZERS}',
      lambda a: a in _NO_ABLATION or a in optimizers_lib.OPTIMIZERS))
  validate.positive(config, 'pastel.ablation_learning_rate')
  validate.in_range(config, 'pastel.ablation_pastel_weight', 0.0, math.inf)
  defenses = validate.subset_of(config, 'pastel.defenses', DEFENSES)
  validate.check_all(config, RULES)
  validate.in_range(config, 'pastel.pastel_weights', 0.0, math.inf)
  validate.one_of(config, 'pastel.pastel_representation', pastel_lib.REPRESENTATIONS)
  validate.positive(config, 'pastel.pastel_temperature')
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
  validate.positive(config, 'pastel.attack_steps', integer=True)
  validate.positive(config, 'pastel.attack_learning_rate')
  validate.positive(config, 'pastel.attack_hidden', integer=True)
  validate.positive(config, 'pastel.feature_chunk_size', integer=True)
  del defenses


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
  per_client = len(train) // k
  held = int(round(s.validation_fraction * per_client))
  validate.require(held >= 1 and per_client - held >= 2, 'pastel.num_clients',
                   f'small enough that each of the {len(train)} // K train rows keeps >= 2 '
                   'members and >= 1 held-out row', k)
  validate.require(len(test) >= 4 * k, 'pastel.num_clients',
                   f'<= {len(test) // 4} (each client needs >= 4 test non-members)', k)
  model = make_model(config, train.num_classes)
  memory.require_batch_fits('pastel.batch_size', int(s.batch_size), model, train.x.shape[1:], k)
  layers = pastel_training.regularised_layers(model, train.x.shape[1:], tuple(s.pastel_layers),
                                              s.pastel_representation, s.model)
  return dict(train=train, test=test, model=model, layers=layers,
              x_train=data_lib.to_float(train.x), x_test=data_lib.to_float(test.x))


def trainings(config) -> list[dict]:
  """Every (defense, strength, optimizer) trained, in sweep order."""
  s = _s(config)
  out = []
  for d in s.defenses:
    if d == 'none':
      out.append(dict(defense='none', strength=0.0, optimizer=s.optimizer))
    elif d == 'pastel':
      out += [dict(defense='pastel', strength=float(w), optimizer=s.optimizer)
              for w in s.pastel_weights]
    else:
      out += [dict(defense=d, strength=float(e), optimizer=s.optimizer) for e in s.epsilons]
  ablation = _ablation(config)
  if ablation is not None and ablation != s.optimizer:
    out.append(dict(defense='none', strength=0.0, optimizer=ablation))
    out.append(dict(defense='pastel', strength=float(s.ablation_pastel_weight),
                    optimizer=ablation))
  return out


def describe(tr: dict) -> str:
  return f'{tr["defense"]}({tr["strength"]:g}, {tr["optimizer"]})'


def dp_accounting(config, split: dict, defense: str, target_epsilon: float) -> dict:
  """`defenses.pastel_training.dp_accounting` of one DP baseline under this config's run."""
  s = _s(config)
  setting = pastel_training.dp_setting([len(m) for m in split['members']],
                                       batch_size=int(s.batch_size), epochs=int(s.local_epochs),
                                       rounds=int(s.num_rounds))
  return pastel_training.dp_accounting(
      defense, target_epsilon, setting, clip_norm=s.clip_norm,
      update_clip_norm=s.update_clip_norm, ldp_sampling=s.ldp_sampling,
      delta=float(s.dp_delta), experiment=NAME, prefix='pastel')


def train(config, state, split: dict, rows: dict, tr: dict, key) -> dict[str, np.ndarray]:
  """One training (`attacks.passive.pastel.record`), with its DP info; arrays to store."""
  s = _s(config)
  model = state['model']
  lr = s.learning_rate if tr['optimizer'] == s.optimizer else s.ablation_learning_rate
  opt = pastel_training.optimizer(tr['optimizer'], float(lr))
  factory, strength, info = pastel_training.setup(
      tr['defense'], tr['strength'],
      lambda: dp_accounting(config, split, tr['defense'], tr['strength']),
      apply_fn=model.apply, layers=tuple(state['layers']),
      representation=s.pastel_representation, temperature=float(s.pastel_temperature),
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
      heldout=split['heldout'], rows=rows,
      need_fedmia=bool(set(s.attacks) & set(FEDMIA_ATTACKS)) and 'local' in s.targets,
      last_layer_grad=bool(s.attack_last_layer_grad), chunk_size=int(s.feature_chunk_size),
      layers=state['layers'], representation=s.pastel_representation,
      temperature=float(s.pastel_temperature), defense=tr['defense'], clip_norm=s.clip_norm,
      update_clip_norm=s.update_clip_norm)
  out.update(info)
  return out


def attack_plan(config) -> list[tuple[str, str]]:
  """(attack, target) pairs; FedMIA attacks score the local target only."""
  s = _s(config)
  return [(a, t) for t in s.targets for a in s.attacks
          if not (a in FEDMIA_ATTACKS and t != 'local')]


def point_metrics(config, arrays: dict, rows: dict, split: dict, attack: str, target: str,
                  key, tr_defense: str = 'none', tr_strength: float = 0.0) -> dict[str, float]:
  s = _s(config)
  scores, labels = passive_pastel.attack_scores(
      arrays, rows, split['members'], attack, target, key, steps=int(s.attack_steps),
      learning_rate=float(s.attack_learning_rate), hidden=int(s.attack_hidden))
  m = passive_pastel.attack_metrics(scores, labels)
  m.update(utility.training_metrics(arrays))
  if tr_defense in DP_NAMES:
    m.update(auditing.attack_bounds(scores, labels, float(s.dp_delta)))
    decl = dp_accounting(config, split, tr_defense, tr_strength)
    for k in ('dp_unit', 'dp_relation', 'dp_adversary', 'dp_sampling'):
      m[k] = decl[k]
    if decl['dp_adversary'] == 'aggregate' and target == 'local':
      # The server reads each upload before DP-FedAvg adds its noise: no epsilon holds here.
      m['dp_epsilon'] = math.nan
      m['dp_epsilon_per_round'] = math.nan
  return m


def point_params(tr: dict, attack: str, target: str) -> dict:
  return dict(defense=tr['defense'], strength=float(tr['strength']),
              optimizer=tr['optimizer'], attack=attack, target=target)


def _shared(config, state, key) -> tuple[dict, dict]:
  """(split, rows) of the run: the same members and attack rows for every training."""
  if 'split' not in state:
    state['split'] = passive_pastel.client_split(
        key, len(state['train']), len(state['test']), int(_s(config).num_clients),
        float(_s(config).validation_fraction))
    state['rows'] = passive_pastel.attack_rows(state['split']['members'],
                                               state['split']['test_parts'],
                                               len(state['test']), key)
  return state['split'], state['rows']


def trained(config, state, store, key, tr: dict) -> dict[str, np.ndarray]:
  """Training `tr`'s arrays: read from the artifacts, else trained and saved."""
  split, rows = _shared(config, state, key)
  artifacts = ArtifactStore(store.workdir, TRAINED)
  arrays = artifacts.load(tr)
  if arrays is None:
    logging.info('pastel: training %s', describe(tr))
    arrays = train(config, state, split, rows, tr, key)
    arrays['num_test'] = len(state['test'])
    artifacts.save(tr, arrays)
  m = utility.training_metrics(arrays)
  logging.info('pastel: %s test accuracy %.4f, JSD %.4f', describe(tr), m['accuracy'],
               m['jsd_last_round'])
  return arrays


def plan(config, state, store, key) -> list[base.Point]:
  """Every (training, attack, target); a training is trained (or read) by the first of its
  points the store lacks and dropped after its last."""
  split, rows = _shared(config, state, key)
  points = []
  for tr in trainings(config):
    cache = {}

    def compute(tr, attack, target, cache=cache):
      if 'arrays' not in cache:
        cache['arrays'] = trained(config, state, store, key, tr)
      return (point_metrics(config, cache['arrays'], rows, split, attack, target, key,
                            tr['defense'], tr['strength']), len(rows[target]['eval']))

    for attack, target in attack_plan(config):
      points.append(base.Point(point_params(tr, attack, target),
                               functools.partial(compute, tr, attack, target), 'examples'))
    points[-1] = dataclasses.replace(points[-1], after=lambda _, c=cache: c.clear())
  return points


def figures(config, state, store, key) -> None:
  """table.md and the figures; the loss histograms read the undefended and PASTEL
  trainings' global-model losses."""
  _, rows = _shared(config, state, key)
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
