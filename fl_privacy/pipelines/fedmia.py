"""The FedMIA pipeline (Zhu et al., CVPR 2025, arXiv:2402.06289), as library code.

`python -m experiments.fedmia` hands `prepare` and `sweep` to `experiments.common.main`; the
script's docstring says how to run it and what it writes. One *training* is a FedAvg run of
`fedmia.num_rounds` rounds under one setting (model, Dirichlet beta, K, E, defense and
strength); `fl.recording.record_shards` measures every query (train + test split) against
every client's upload at the recorded rounds and the arrays go to the artifact store
(`<workdir>/recorded/*.npz`, atomic), so re-scoring or resuming never retrains. The attacks
(`fl_privacy.attacks.passive`) score the recording; each (attack, scoring) is one point, params
`attack, defense, defense_param, beta, num_clients, local_epochs, model, nonmember_scoring`.
Trainings: the main setting (IID, K = num_clients, E = local_epochs, no defense) scored with
`attacks` and `nonmember_scoring`; the non-IID (betas), clients (client_counts), local-epochs
(epoch_counts) and defense sweeps (one change each) with `sweep_attacks` and `sweep_scoring`.

Keys: the partition depends on (beta, K) only and the clients' training keys on (beta, K, E)
only (`report.point_key` of those params), and every model starts from the same w_0, so a
defense is compared with the undefended run on the same data, shuffles and initialisation
(common random numbers). The public-code permutations and the bootstrap resamples come from a
Generator keyed by the point's params.
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
from fl_privacy import defenses
from fl_privacy import models as models_lib
from fl_privacy import memory
from fl_privacy import validate
from fl_privacy.attacks import passive
from fl_privacy.attacks.passive import evaluate as evaluate_lib
from fl_privacy.attacks.passive import scores as scores_lib
from fl_privacy.fl import optimizers as optimizers_lib
from fl_privacy.fl import recording as recording_lib
from fl_privacy.pipelines import ahead
from fl_privacy.pipelines import base
from fl_privacy.pipelines import fedmia_defenses
from fl_privacy.pipelines import fedmia_figures
from fl_privacy.pipelines import fedmia_online
from fl_privacy.pipelines import fedmia_replicates
from fl_privacy.pipelines import fedmia_tables
from fl_privacy.report import ArtifactStore
from fl_privacy.report import atomic
from fl_privacy.report import point_key
from fl_privacy.report import summary

NAME = 'fedmia'
DEFENSES = fedmia_defenses.DEFENSES
defense_for = fedmia_defenses.defense_for
LR_SCHEDULES = optimizers_lib.LR_SCHEDULES
# The headline columns: logged per saved point and printed as a table at the end of a run.
SUMMARY = summary.Table('FedMIA (TPR at 0.1% FPR and AUC: 95% intervals)', (
    summary.param('model'), summary.param('attack'), summary.param('nonmember_scoring', 'scoring'),
    summary.param('defense'), summary.param('defense_param', 'strength'),
    summary.param('beta'), summary.param('num_clients', 'K'),
    summary.param('local_epochs', 'E'), summary.rate('tpr_at_fpr_1e-3', 'TPR@0.1%FPR'),
    summary.metric('auc', 'AUC'), summary.metric('test_accuracy', 'test acc.'),
    summary.metric('generalisation_gap', 'gap'), summary.seconds()))
RECORDED = 'recorded'
CLIENT_COUNT = validate.items(validate.number(3, integer=True), 'integers >= 3 (FedMIA needs two '
                              'non-target clients)', nonempty=False)
BETAS = validate.items(validate.Rule('', lambda b: not isinstance(b, bool) and b > 0),
                       'non-empty, numbers > 0 (inf = IID)', scalar=False)
ROUNDS_JSON = 'rounds.json'


def _attack_names(config, field: str) -> tuple[str, ...]:
  names = config.fedmia[field.split('.')[-1]]
  names = (names,) if isinstance(names, str) else tuple(names)
  allowed = (f'a subset of {passive.ATTACKS} (FedMIA optionally @' +
             '|'.join(passive.FILTERS) + ')')
  validate.require(len(names) > 0, field, allowed, names)
  for n in names:
    try:
      scores_lib.parse(n)
    except ValueError:
      raise validate.ConfigError(field, allowed, n) from None
  return names


def validate_config(config) -> None:
  """Checks every field that does not need the data (before anything is loaded or written)."""
  data_lib.validate_data_config(config.data)
  s = config.fedmia
  validate.subset_of(config, 'fedmia.models', models_lib.MODELS)
  if len(s.hidden):
    validate.positive(config, 'fedmia.hidden', integer=True)
  validate.check_all(config, {'fedmia.num_clients': CLIENT_COUNT,
                              'fedmia.client_counts': CLIENT_COUNT, 'fedmia.betas': BETAS,
                              'fedmia.rmia_gamma': validate.number(0.0, low_open=True),
                              'fedmia.rmia_a': validate.number(0.0, 1.0),
                              'fedmia.bootstrap_resamples': validate.number(1, integer=True)})
  if s.per_client is not None:
    validate.positive(config, 'fedmia.per_client', integer=True)
  t = validate.positive(config, 'fedmia.num_rounds', integer=True)
  every = validate.positive(config, 'fedmia.record_every', integer=True)
  validate.require(t % every == 0, 'fedmia.record_every', f'a divisor of num_rounds = {t}', every)
  validate.checked(config, 'fedmia.single_round', validate.where(
      validate.number(every, t, integer=True), lambda v: v % every == 0,
      f'a recorded round (a multiple of {every} in [{every}, {t}])'))
  validate.positive(config, 'fedmia.local_epochs', integer=True)
  if len(s.epoch_counts):
    validate.positive(config, 'fedmia.epoch_counts', integer=True)
  validate.positive(config, 'fedmia.batch_size', integer=True)
  validate.one_of(config, 'fedmia.optimizer', optimizers_lib.OPTIMIZERS)
  validate.positive(config, 'fedmia.learning_rate')
  validate.in_range(config, 'fedmia.momentum', 0.0, 1.0, high_inclusive=False)
  validate.in_range(config, 'fedmia.weight_decay', 0.0, math.inf)
  validate.one_of(config, 'fedmia.lr_schedule', LR_SCHEDULES)
  validate.in_range(config, 'fedmia.lr_decay', 0.0, 1.0, low_inclusive=False)
  _attack_names(config, 'fedmia.attacks')
  _attack_names(config, 'fedmia.sweep_attacks')
  fedmia_online.validate_config(config)
  validate.one_of(config, 'fedmia.outlier_filter', passive.FILTERS)
  validate.subset_of(config, 'fedmia.nonmember_scoring', passive.SCORINGS)
  validate.subset_of(config, 'fedmia.sweep_scoring', passive.SCORINGS)
  fedmia_defenses.validate_config(config)
  validate.positive(config, 'fedmia.replicates', integer=True)
  validate.positive(config, 'fedmia.chunk_size', integer=True)


def trainings(config) -> list[dict]:
  """Every training of the sweep, main setting first, each once.

  Each is a dict with the training params (`model, beta, num_clients, local_epochs, defense,
  defense_param`) plus `sweep` (which sweep it belongs to; the main setting is 'main').
  """
  s = config.fedmia
  out = []

  def add(sweep, **kw):
    base = dict(model=None, beta=math.inf, num_clients=int(s.num_clients),
                local_epochs=int(s.local_epochs), defense='none', defense_param=None)
    base.update(kw)
    if all(base != training_params(o) for o in out):
      out.append(dict(base, sweep=sweep))

  for model in s.models:
    add('main', model=model)
    for beta in s.betas:
      add('noniid', model=model, beta=float(beta))
    for k in s.client_counts:
      add('clients', model=model, num_clients=int(k))
    for e in s.epoch_counts:
      add('epochs', model=model, local_epochs=int(e))
    for name, values in s.defenses.items():
      for v in values:
        add('defenses', model=model, defense=str(name), defense_param=float(v))
  return out


def training_params(tr: dict) -> dict:
  return {k: tr[k] for k in ('model', 'beta', 'num_clients', 'local_epochs', 'defense',
                             'defense_param')}


def make_model(config, name: str, num_classes: int):
  kw = {'hidden': tuple(config.fedmia.hidden)} if name == 'mlp' else {}
  return models_lib.make(name, num_classes, field='fedmia.models', **kw)


def make_optimizer(config):
  """`t -> optax`: the paper's SGD (momentum 0.9, weight decay 5e-4) with the lr schedule.
  `fedmia.momentum` is read by `optimizer='momentum'` alone: 'sgd' is plain SGD (an override
  of the momentum with another optimizer is refused, `unused_fields`)."""
  s = config.fedmia
  momentum = float(s.momentum) if s.optimizer == 'momentum' else 0.0
  return optimizers_lib.per_round(
      s.optimizer, float(s.learning_rate), num_rounds=int(s.num_rounds),
      schedule=s.lr_schedule, decay=float(s.lr_decay), momentum=momentum,
      weight_decay=float(s.weight_decay), field='fedmia.optimizer')


def unused_fields(config) -> dict[str, str]:
  """The `fedmia` fields this run does not read (`base.unused`: a command-line override of one
  is refused rather than recorded as if it ran): online LiRA's IN models without an online
  attack, RMIA's gamma and a without RMIA, the momentum of an optimizer other than
  'momentum', the exponential schedule's decay under another schedule, the MLP's widths
  without the MLP, and the sweeps' attacks and scorings when no sweep trains. {} for a config
  validation refuses (it names the field itself)."""
  s = config.fedmia
  try:
    sweeps = any(tr['sweep'] != 'main' for tr in trainings(config))
    names = list(_attack_names(config, 'fedmia.attacks'))
    if sweeps:
      names += _attack_names(config, 'fedmia.sweep_attacks')
    kinds = {scores_lib.parse(n)[0] for n in names}
  except (validate.ConfigError, TypeError, ValueError, KeyError):
    return {}
  out: dict[str, str] = {}
  if not fedmia_online.online(names):
    out['fedmia.lira_in_models'] = (f'read only by online LiRA ({", ".join(scores_lib.ONLINE)}),'
                                    ' which the attacks scored do not include')
  if 'rmia' not in kinds:
    for f in ('rmia_gamma', 'rmia_a'):
      out[f'fedmia.{f}'] = "read only by 'rmia', which the attacks scored do not include"
  if s.optimizer != 'momentum':
    out['fedmia.momentum'] = (f"read only by optimizer='momentum' ({s.optimizer!r} has no "
                              'heavy-ball momentum)')
  if s.lr_schedule != 'exponential':
    out['fedmia.lr_decay'] = (f"read only by lr_schedule='exponential' (not "
                              f'{s.lr_schedule!r})')
  if 'mlp' not in tuple(s.models):
    out['fedmia.hidden'] = "read only by the 'mlp' model, which fedmia.models does not include"
  if not sweeps:
    for f in ('sweep_attacks', 'sweep_scoring'):
      out[f'fedmia.{f}'] = ('read only by the sweeps (betas, client_counts, epoch_counts, '
                            'defenses), which are all empty')
  return out


def prepare(config) -> dict:
  """Validates the config and loads the data; writes nothing."""
  validate_config(config)
  splits = data_lib.load(config.data)
  validate.require('train' in splits and 'test' in splits, 'data.name',
                   'a dataset with train and test splits', config.data.name)
  train, test = splits['train'], splits['test']
  s = config.fedmia
  counts = (int(s.num_clients),) + tuple(int(k) for k in s.client_counts)
  for k in counts:
    need = k * (int(s.per_client) if s.per_client is not None else 1)
    data_lib.require_examples(config.data, "its 'train' split", len(train), need,
                              f'fedmia.num_clients = {k} clients x per_client = '
                              f'{s.per_client or 1}')
    validate.require(need <= len(train), 'fedmia.per_client' if s.per_client else
                     'fedmia.num_clients', f'K x per_client <= {len(train)} training examples',
                     s.per_client if s.per_client else k)
  # Equal shards train plain FedAvg on full minibatches (B <= the shard); unequal shards pad
  # every minibatch to B slots, so a B beyond the data only allocates empty rows (a batch of
  # 100,000 on digits ran out of memory after the results files were opened).
  if s.per_client is not None:
    validate.require(int(s.batch_size) <= int(s.per_client), 'fedmia.batch_size',
                     f'<= fedmia.per_client = {s.per_client} (each client\'s shard; local '
                     'training draws full minibatches from it)', s.batch_size)
  validate.require(int(s.batch_size) <= len(train), 'fedmia.batch_size',
                   f'<= {len(train)}, the training examples the clients share (a larger '
                   'batch only pads every minibatch with empty rows)', s.batch_size)
  for name in s.models:
    memory.require_batch_fits('fedmia.batch_size', int(s.batch_size),
                              make_model(config, name, train.num_classes), train.x.shape[1:],
                              max(counts))
  names = set(config.fedmia.defenses.keys())
  if names & {'augment', 'augment_sampling'} and not train.is_image:
    raise validate.ConfigError('fedmia.defenses', 'no augment/augment_sampling on feature '
                               'vectors (they transform images)', sorted(names))
  models = {name: make_model(config, name, train.num_classes) for name in s.models}
  for name, model in models.items():
    try:
      jax.eval_shape(model.init, jax.random.key(0),
                     jax.ShapeDtypeStruct((1,) + train.x.shape[1:], jnp.float32))
    except Exception as e:  # pylint: disable=broad-except
      raise validate.ConfigError('fedmia.models', f'a model that takes {train.x.shape[1:]} '
                                 'inputs', name) from e
  queries = min(int(s.chunk_size), len(train) + len(test))
  for name, model in models.items():
    memory.require_query_gradients_fit('fedmia.chunk_size', queries, model, train.x.shape[1:])
  return dict(train=train, test=test, models=models, trainings=trainings(config),
              optimizer=make_optimizer(config), scored=fedmia_replicates.Scored())


def partition(config, state, key, beta: float, num_clients: int) -> list[np.ndarray]:
  """Client shards (indices into the train split): IID for beta = inf, else Dirichlet."""
  per_client = config.fedmia.per_client
  return data_lib.beta_partition(
      point_key(key, {'partition': 1, 'beta': beta, 'num_clients': num_clients}),
      state['train'].y, num_clients, beta, None if per_client is None else int(per_client))


def record(config, state, key, tr: dict, in_models: int = 0) -> dict[str, np.ndarray]:
  """Trains one setting and returns its recording (`fl.recording.record_shards`); `key` is
  the replicate's key (`fedmia_replicates.key`)."""
  s = config.fedmia
  beta, num_clients, epochs = tr['beta'], tr['num_clients'], tr['local_epochs']
  return recording_lib.record_shards(
      state['models'][tr['model']], point_key(key, {'init': 1, 'model': tr['model']}),
      state['train'], state['test'], partition(config, state, key, beta, num_clients),
      label=describe(tr), key=point_key(key, {'train': 1, 'beta': beta,
                                              'num_clients': num_clients,
                                              'local_epochs': epochs}),
      num_rounds=int(s.num_rounds), record_every=int(s.record_every),
      optimizer=state['optimizer'], epochs=int(epochs), batch_size=int(s.batch_size),
      hooks=None if tr['defense'] == 'none' else defense_for(config, state, tr).hooks,
      chunk_size=int(s.chunk_size), in_models=in_models)


def describe(tr: dict) -> str:
  return (f'{tr["model"]} beta={tr["beta"]} K={tr["num_clients"]} E={tr["local_epochs"]} '
          f'{tr["defense"]}' + ('' if tr['defense_param'] is None else
                                f'={tr["defense_param"]:g}'))


def point_params(tr: dict, attack: str, scoring: str) -> dict:
  return dict(attack=attack, defense=tr['defense'], defense_param=tr['defense_param'],
              beta=tr['beta'], num_clients=tr['num_clients'], local_epochs=tr['local_epochs'],
              model=tr['model'], nonmember_scoring=scoring)


def attack_plan(config, tr: dict) -> list[tuple[str, str]]:
  s = config.fedmia
  attacks, scorings = ((s.attacks, s.nonmember_scoring) if tr['sweep'] == 'main' else
                       (s.sweep_attacks, s.sweep_scoring))  # RMIA, online LiRA: aligned only
  return [(a, sc) for sc in scorings for a in attacks if scores_lib.supports(a, sc)]


def point_metrics(config, key, rec: dict, tr: dict, attack: str, scoring: str,
                  dp_metrics: dict | None = None, replicate: int = 0) -> dict:
  """The metrics of one (training, attack, scoring) on one replicate's recording, and its
  scored entries (`evaluate.recording_metrics(..., entries=True)`)."""
  s = config.fedmia
  params = point_params(tr, attack, scoring)
  return evaluate_lib.recording_metrics(
      rec, attack, scoring=scoring, single_round=int(s.single_round),
      default_filter=s.outlier_filter, dp_metrics=dp_metrics, dp_delta=float(s.dp_delta),
      rng=data_lib.rng_from_key(point_key(key, dict(params, replicate=int(replicate)))),
      # Replicated: the query-cluster bootstrap of one training is not what is reported, and
      # at about 0.4 s a replicate it was a third of the scoring.
      num_resamples=int(s.bootstrap_resamples) if int(s.replicates) == 1 else 0, entries=True,
      **fedmia_figures.attack_options(config))


def recorded(config, state, key, artifacts: ArtifactStore, tr: dict,
             replicate: int = 0) -> dict[str, np.ndarray]:
  """Replicate `replicate` of training `tr`: read from the artifacts, else trained (key
  `fedmia_replicates.key(key, replicate)`) and saved on its own, so an interrupted run
  resumes at the first replicate not stored."""
  params = dict(training_params(tr), replicate=int(replicate))
  rec = artifacts.load(params)
  n_in = fedmia_online.in_models(config, attack_plan(config, tr))
  if rec is None or fedmia_online.stale(rec, n_in):  # e.g. stored without online LiRA's IN
    logging.info('training %s, replicate %d', describe(tr), replicate)
    rec = record(config, state, fedmia_replicates.key(key, replicate), tr, n_in)
    artifacts.save(params, rec)
  return rec


def plan(config, state, store, key) -> list[base.Point]:
  """Every (training, attack, scoring) point, `fedmia_replicates.combine` of the replicated
  trainings'; those of a training with a point to compute are read or trained one training
  ahead of its scoring (`ahead`) and dropped after its last point."""
  artifacts, points, reps = ArtifactStore(store.workdir, RECORDED), [], config.fedmia.replicates
  runs = ahead.over(state['trainings'], lambda tr: [
      recorded(config, state, key, artifacts, tr, r) for r in range(int(reps))],
                    lambda tr: any(store.get(point_params(tr, a, sc)) is None
                                   for a, sc in attack_plan(config, tr)))
  for i, tr in enumerate(state['trainings']):
    cache = {}

    def compute(tr=tr, a='', sc='', cache=cache, i=i):
      if 'recs' not in cache:
        cache['recs'] = runs.get(i)
      dp = defense_for(config, state, tr).metrics
      per = [point_metrics(config, key, rec, tr, a, sc, dp, r)
             for r, rec in enumerate(cache['recs'])]
      state['scored'].keep(tr, a, sc, per)
      m = fedmia_replicates.combine(
          per, rng=data_lib.rng_from_key(point_key(key, dict(point_params(tr, a, sc),
                                                            replicated=1))),
          num_resamples=int(config.fedmia.bootstrap_resamples))
      # n counts the loss scores the attack ranked (examples x recorded rounds x replicates).
      return m, int(sum(len(r['owner']) * r['loss'].shape[1] for r in cache['recs']))

    mine = [base.Point(point_params(tr, a, sc), functools.partial(compute, tr, a, sc), 'scores')
            for a, sc in attack_plan(config, tr)]
    points += mine[:-1] + [dataclasses.replace(p, after=lambda _, c=cache: c.clear())
                           for p in mine[-1:]]
  return points


def figures(config, state, store, key) -> None:
  """`rounds.json`, table1.md (with the paired claims over the replicates), claims.json,
  table2.md and the figures, from the stored points and the main trainings' recordings (ROC
  and rounds curves: replicate 0's) or the aligned scores point scoring kept (`Scored`)."""
  artifacts = ArtifactStore(store.workdir, RECORDED)
  main = {tr['model']: [recorded(config, state, key, artifacts, tr, r)
                        for r in range(int(config.fedmia.replicates))]
          for tr in state['trainings'] if tr['sweep'] == 'main'}
  first = {model: recs[0] for model, recs in main.items()}
  curves = fedmia_figures.round_curves(config, key, first, scored := state.get('scored'))
  atomic.atomic_write_text(os.path.join(store.workdir, ROUNDS_JSON), fedmia_tables.dumps(curves))
  fedmia_tables.write(config, store.points, store.workdir, main, key, scored)
  fedmia_figures.save_all(config, key, store.points, first, curves, store.workdir, scored)
