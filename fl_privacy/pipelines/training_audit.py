"""The training audit: every DP defense audited inside the FL training that runs, in one run.

What `python -m experiments.training_audit` runs. For each DP defense of the `defense`
section, each sampling it offers and each claimed epsilon, ONE federated training on digits:

1. the defense is configured by the call the experiments use (`defenses.configured.configure`
   on a `defense` section with `target_epsilon` = the claim; the registry's declaration, its
   noise multiplier and epsilon), for the federation that runs (the real clients plus the
   canary clients);
2. the training is the experiments' round loop (`fl.rounds.run`: the client protocol,
   `local.client_update` with the defense's hooks, participation sampling, the upload and
   aggregate hooks) with canaries added (`attacks.audit.canaries`): canary clients for the
   client-level defenses, canary examples (white-box Dirac gradients, black-box mislabelled
   inputs) in the clients' shards for the record-level dp_sgd;
3. each threat (`all_iterates`, `last_iterate`) scores the same training's canaries, and
   `canaries.audit` gives Steinke et al.'s one-run bound, its f-DP refinement and Andrew et
   al.'s estimate; `privacy_violation` at family-wise confidence.

The adversary is the declaration's own (`dp_adversary`): the server reading uploads for
dp_sgd, update_dp and ldp_sgd, a reader of the aggregate for central_dp and weak_dp.
`training_audit.plant` plants a wiring bug between the claim and the training (the tests'
knob). Fields: configs/_training_audit.py. Results: docs/experiments/training_audit.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from absl import logging
import jax
from jax import flatten_util
import numpy as np

from fl_privacy import accounting
from fl_privacy import data as data_lib
from fl_privacy import defenses
from fl_privacy import models as models_lib
from fl_privacy import validate
from fl_privacy.attacks.audit import canaries
from fl_privacy.defenses import registry
from fl_privacy.fl import optimizers
from fl_privacy.pipelines import base
from fl_privacy.pipelines import training_audit_figures
# The trainings (claim, what ran, one training with its canaries) live beside this module;
# their names are the pipeline's as well.
from fl_privacy.pipelines.training_audit_runs import claim  # pylint: disable=unused-import
from fl_privacy.pipelines.training_audit_runs import ran  # pylint: disable=unused-import
from fl_privacy.pipelines.training_audit_runs import run_training
from fl_privacy.pipelines.training_audit_runs import setting
from fl_privacy.report import point_key
from fl_privacy.report import summary

NAME = 'training_audit'
# Each DP defense and the samplings it offers (dp_sgd's batches; the server's participation).
SAMPLINGS = {'dp_sgd': ('poisson', 'shuffle'), 'update_dp': ('none',),
             'central_dp': ('none', 'without_replacement'),
             'weak_dp': ('none', 'without_replacement'), 'ldp_sgd': ('none',)}
DEFENSES = tuple(SAMPLINGS)
ALL_SAMPLINGS = ('poisson', 'shuffle', 'none', 'without_replacement')
RECORD_KINDS = ('gradient', 'input')
PLANTS = ('none', 'half_noise', 'poisson_full_batch', 'participation_not_run',
          'clip_mismatch', 'one_composition')
AUDITED = 'fl.rounds.run + defenses.configured.configure'

SUMMARY = (
    summary.Table(
        'Training audit: claimed vs empirical epsilon, canaries inside the training that runs '
        '(one run each; one-run bounds at family-wise 95%)',
        (summary.param('defense'), summary.param('sampling'), summary.param('canary'),
         summary.param('threat'), summary.param('claimed_epsilon', 'eps claimed'),
         summary.metric('dp_epsilon', 'eps audited', digits=2),
         summary.metric('epsilon_one_run', 'eps 1-run', digits=2),
         summary.metric('epsilon_one_run_fdp', 'eps 1-run f-DP', digits=2),
         summary.metric('epsilon_estimate', 'eps estimate', digits=2),
         summary.metric('num_canaries', 'canaries'),
         summary.flag('privacy_violation', 'violation'))),
)


# -------------------------------------------------------------------------- validation ---


def validate_config(config) -> dict[str, Any]:
  """Checks every field the audit reads (nothing loaded or written)."""
  s = config.training_audit
  chosen = validate.subset_of(config, 'training_audit.defenses', DEFENSES)
  samplings = validate.subset_of(config, 'training_audit.samplings', ALL_SAMPLINGS)
  for d in chosen:   # a chosen defense with none of its samplings would silently not run
    validate.require(any(x in samplings for x in SAMPLINGS[d]), 'training_audit.samplings',
                     'one a chosen defense offers for each of them (' + ', '.join(
                         f'{c}: {SAMPLINGS[c]}' for c in chosen) + ')', s.samplings)
  validate.checked(config, 'training_audit.epsilons', registry.each('epsilon'))
  validate.in_range(config, 'training_audit.epsilons', 0.0, 50.0, low_inclusive=False)
  validate.checked(config, 'training_audit.delta', registry.rule('delta'))
  validate.checked(config, 'training_audit.clip_norm', registry.rule('clip_norm'))
  validate.checked(config, 'training_audit.participation', validate.number(
      0, 1, low_open=True, high_open=True, words='the sampled fraction (below 1)'))
  validate.in_range(config, 'training_audit.confidence', 0.5, 1.0, low_inclusive=False,
                    high_inclusive=False)
  validate.subset_of(config, 'training_audit.record_kinds', RECORD_KINDS)
  validate.subset_of(config, 'training_audit.threats', canaries.THREATS)
  for field in ('num_canary_clients', 'num_canary_examples'):
    validate.checked(config, f'training_audit.{field}', validate.number(
        4, 1_000_000, integer=True, words='canaries (at least 2 per world)'))
  validate.checked(config, 'training_audit.canary_norm',
                   validate.number(1, 1e6, words='in units of the clip norm'))
  validate.checked(config, 'training_audit.direction', validate.choice(canaries.DIRECTIONS))
  validate.checked(config, 'training_audit.model', validate.choice(('mlp',)))
  validate.checked(config, 'training_audit.hidden', validate.items(
      validate.number(1, 4096, integer=True), 'a sequence of widths in [1, 4096]',
      nonempty=False))
  for field, high in (('num_clients', 1000), ('per_client', 100_000), ('batch_size', 100_000),
                      ('epochs', 100), ('num_rounds', 1000)):
    validate.checked(config, f'training_audit.{field}', validate.number(1, high, integer=True))
  validate.checked(config, 'training_audit.batch_size', validate.Rule(
      f'below per_client ({s.per_client}): Poisson sampling needs q < 1',
      lambda b: b < s.per_client))
  validate.checked(config, 'training_audit.optimizer', validate.choice(optimizers.OPTIMIZERS))
  validate.checked(config, 'training_audit.learning_rate', validate.number(0, 100, low_open=True))
  validate.checked(config, 'training_audit.plant', validate.choice(PLANTS))
  if 'defense' in config:
    defenses.check_honoured(config.defense, NAME, ('none',), 'it audits every DP defense '
                            'itself (training_audit.defenses)')
  return {'defenses': chosen}


def prepare(config) -> dict[str, Any]:
  """Validates, loads the data and checks it holds the clients' rows."""
  state = validate_config(config)
  splits = data_lib.load(config.data)
  s = config.training_audit
  train, test = splits['train'], splits['test']
  need = int(s.num_clients) * int(s.per_client)
  validate.require(len(train) >= need, 'training_audit.per_client',
                   f'at most {len(train) // int(s.num_clients)} (num_clients x per_client '
                   f'rows of the train split, which has {len(train)})', s.per_client)
  model = models_lib.make('mlp', train.num_classes, hidden=tuple(s.hidden),
                          field='training_audit.model')
  x0 = data_lib.to_float(train.x[:1]).reshape(1, -1)
  params = model.init(jax.random.key(0), x0)
  dim = int(flatten_util.ravel_pytree(params)[0].shape[0])
  if 'gradient' in _seq(s.record_kinds) and 'dp_sgd' in state['defenses']:
    validate.require(int(s.num_canary_examples) <= dim, 'training_audit.num_canary_examples',
                     f'at most the model\'s {dim} parameters (one Dirac coordinate each)',
                     s.num_canary_examples)
  if s.direction == 'dirac' and set(state['defenses']) - {'dp_sgd'}:
    validate.require(int(s.num_canary_clients) <= dim, 'training_audit.num_canary_clients',
                     f'at most the model\'s {dim} parameters with direction \'dirac\' (one '
                     'coordinate each)', s.num_canary_clients)
  if 'input' in _seq(s.record_kinds) and 'dp_sgd' in state['defenses']:
    pool = len(train) - need + len(test)
    validate.require(int(s.num_canary_examples) <= pool, 'training_audit.num_canary_examples',
                     f'at most the {pool} images no client holds (the input canaries)',
                     s.num_canary_examples)
  state.update(train=train, test=test, model=model, dim=dim, trainings={})
  return state


# ------------------------------------------------------------------------------ points ---


def _seq(value) -> tuple:
  return (value,) if isinstance(value, str) else tuple(value)


def trainings(config, state) -> list[dict]:
  """The sweep's trainings, in run order: defense x sampling x claim x canary kind."""
  s = config.training_audit
  out = []
  for name in state['defenses']:
    kinds = _seq(s.record_kinds) if name == 'dp_sgd' else ('client',)
    for sampling in (x for x in SAMPLINGS[name] if x in _seq(s.samplings)):
      for eps in (s.epsilons if isinstance(s.epsilons, (list, tuple)) else (s.epsilons,)):
        for kind in kinds:
          out.append(dict(defense=name, sampling=sampling, claimed_epsilon=float(eps),
                          canary=kind))
  return out


def mechanism(tr: dict) -> str:
  """The mechanism's name as `canaries.counted_bounds` reads it (defense_sampling)."""
  return tr['defense'] if tr['sampling'] == 'none' else f"{tr['defense']}_{tr['sampling']}"


def independent(config, tr: dict, threat: str, adversary: str) -> bool:
  """Whether each canary's score depends only on its own coin and noise drawn for it alone:
  canary clients read in their own uploads (server), or in the aggregate on their own Dirac
  coordinate with the other clients' contributions known (aggregate), every iterate."""
  if tr['canary'] != 'client' or threat != 'all_iterates':
    return False
  return adversary == 'server' or config.training_audit.direction == 'dirac'


def _adversary_stats(config, done: dict) -> dict[str, Any]:
  """The aggregate reader's per-round shift and noise of k_t x aggregate minus the known
  contributions on a canary's coordinate (C and z C), for the mixture score."""
  z = float(done['claimed'].metrics.get('noise_multiplier', math.nan))
  c = float(config.training_audit.clip_norm)
  return {'shift': c, 'sigma': z * c, 'known': True}


def point_metrics(config, state, tr: dict, threat: str, done: dict) -> tuple[dict, int]:
  """One (training, threat) point: the declaration's labels, the claim, the audit."""
  s = config.training_audit
  claimed = done['claimed']
  decl = claimed.declaration
  if decl is None:   # ldp_sgd: a mechanism-family defense; its declaration by the registry
    decl = registry.declaration(
        tr['defense'], {'epsilon': float(claimed.params['defense_epsilon'])},
        setting(config, state, tr, np.full(int(s.num_clients), int(s.per_client))))
    eps = accounting.epsilon(decl, delta=float(s.delta))
    metrics: dict[str, Any] = {'dp_epsilon': eps, **accounting.describe(decl),
                               'dp_delta': float(s.delta)}
  else:
    metrics = dict(claimed.metrics)
  adversary = decl.adversary
  extra = _adversary_stats(config, done) if adversary == 'aggregate' else {}
  sc = canaries.threat_scores(done['scores'], threat, adversary,
                              participation=done['participation'], **extra)
  audited = float(metrics['dp_epsilon'])
  z = metrics.get('noise_multiplier')
  composed = decl if tr['defense'] != 'weak_dp' else dataclasses.replace(
      decl, compositions=int(s.num_rounds))
  profile = lambda grid: accounting.delta_curve(composed, z, grid)
  metrics.update(canaries.audit(sc, done['world'], mechanism(tr), audited,
                                delta=float(s.delta), confidence=float(s.confidence),
                                independent=independent(config, tr, threat, adversary),
                                claimed_delta=profile))
  metrics.update(dp_adversary=adversary, canary_relation=done['relation'],
                 participation_run=float(done['participation']),
                 test_accuracy=float(done['scores'].test_accuracy),
                 audited_pipeline=AUDITED, plant=str(s.plant), model_parameters=done['dim'])
  return metrics, int(metrics['num_canaries'])


def _report_violation(config, params: dict, metrics) -> None:
  if float(metrics.get('privacy_violation', 0.0)) > 0:
    logging.error('PRIVACY VIOLATION: %s (%s, %s canaries, %s) claims epsilon %.3g but the '
                  'training audit certifies more: %.3f at family-wise %.0f%%',
                  params['defense'], params['sampling'], params['canary'], params['threat'],
                  float(metrics['dp_epsilon']), float(metrics['best_bound']),
                  100 * float(config.training_audit.confidence))


def plan(config, state, store, key) -> list[base.Point]:
  """One point per (training, threat); a training runs once, for the first point that needs
  it, and is dropped when its last threat is scored."""
  del store
  threats = _seq(config.training_audit.threats)
  points = []
  for tr in trainings(config, state):
    k = point_key(key, tr)
    for threat in threats:
      def compute(tr=tr, threat=threat, k=k):
        cache = state['trainings']
        tkey = tuple(sorted(tr.items()))
        if tkey not in cache:
          cache.clear()
          cache[tkey] = run_training(config, state, tr, k)
        return point_metrics(config, state, tr, threat, cache[tkey])
      params = {**tr, 'threat': threat}
      points.append(base.Point(params, compute, unit='canaries',
                               after=lambda m, p=params: _report_violation(config, p, m)))
  return points


def figures(config, state, store, key) -> None:
  del state, key
  training_audit_figures.write(store.points, store.workdir, config)
