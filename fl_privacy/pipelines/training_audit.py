"""The training audit: every DP defense audited inside the FL training that runs, in one run.

What `python -m experiments.training_audit` runs. For each DP defense of the `defense`
section, each sampling it offers and each claimed epsilon, R replicate federated trainings on
digits (`training_audit_runs`):

1. the defense is configured by the call the experiments use (`defenses.configured.configure`
   on a `defense` section with `target_epsilon` = the claim; the registry's declaration, its
   noise multiplier and epsilon), for the federation that runs (record-level DP-SGD
   cross-silo, the client-level defenses cross-device, canaries included);
2. the trainings are the experiments' round loop (`fl.rounds.run`: the client protocol,
   `local.client_update` with the defense's hooks, participation sampling, the upload and
   aggregate hooks, the reported counts) with canaries added (`attacks.audit.canaries`):
   canary clients for the client-level defenses, canary examples (white-box Dirac gradients,
   black-box mislabelled inputs) in the clients' shards for the record-level dp_sgd;
3. each threat scores the trainings' canaries: `all_steps` (DP-SGD's adversary, every noisy
   step), `all_iterates`, `last_iterate`; `side_channel` plays its own game with the same
   hooks (`attacks.audit.side_channel`); `attacks.audit.canary_statistics.audit` gives the
   counted bounds, the verdict at family-wise confidence, what a perfect attack with these
   canaries could certify (a row that cannot refute its claim says so), and the estimates.

The adversary is the declaration's own (`dp_adversary`): the server reading uploads for
dp_sgd, update_dp and ldp_sgd, a reader of the aggregate for central_dp and weak_dp.
`training_audit.plant` plants a bug between the claim and the training (the tests' knob).
Fields: configs/_training_audit.py. Results: docs/experiments/training_audit.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from absl import logging
import ml_collections
import numpy as np
from scipy import stats as sps

from fl_privacy import accounting
from fl_privacy import data as data_lib
from fl_privacy import defenses
from fl_privacy import memory
from fl_privacy import models as models_lib
from fl_privacy import validate
from fl_privacy.attacks.audit import canaries
from fl_privacy.attacks.audit import side_channel as side_lib
from fl_privacy.defenses import registry
from fl_privacy.fl import optimizers
from fl_privacy.pipelines import base
from fl_privacy.pipelines import training_audit_checks as checks
from fl_privacy.pipelines import training_audit_figures
from fl_privacy.pipelines import training_audit_poisson as poisson_lib
from fl_privacy.pipelines import training_audit_power as power_lib
from fl_privacy.pipelines import training_audit_runs as runs
from fl_privacy.report import point_key
from fl_privacy.report import summary

NAME = 'training_audit'
# Each DP defense and the samplings it offers (dp_sgd's batches; the claim's participation).
SAMPLINGS = {'dp_sgd': ('poisson', 'shuffle'), 'update_dp': ('none',),
             'central_dp': ('none', 'without_replacement'),
             'weak_dp': ('none', 'without_replacement'), 'ldp_sgd': ('none',)}
DEFENSES = tuple(SAMPLINGS)
ALL_SAMPLINGS = ('poisson', 'shuffle', 'none', 'without_replacement')
RECORD_KINDS = runs.RECORD_KINDS
THREATS = ('all_steps', 'all_iterates', 'last_iterate', 'side_channel')
PLANTS = ('none', 'half_noise', 'poisson_full_batch', 'participation_not_run',
          'clip_mismatch', 'one_composition', 'data_dependent_schedule', 'reported_rows')
AUDITED = 'fl.rounds.run + defenses.configured.configure'

SUMMARY = (
    summary.Table(
        'Training audit: claimed vs empirical epsilon, canaries inside the trainings that run '
        '(verdicts at family-wise 95%)',
        (summary.param('defense'), summary.param('sampling'), summary.param('canary'),
         summary.param('threat'), summary.param('claimed_epsilon', 'eps claimed'),
         summary.metric('dp_epsilon', 'eps audited', digits=2),
         summary.metric('certified_free', 'eps certified (assumes none)', digits=2),
         summary.metric('certified_gaussian', 'eps if Gaussian', digits=2),
         summary.metric('best_bound', 'eps best counted', digits=2),
         summary.metric('epsilon_mle_pld', 'eps MLE/PLD (assumes Poisson family)', digits=2),
         summary.metric('max_certifiable', 'eps reachable', digits=2),
         summary.metric('reach_tests', 'refutable by'),
         summary.metric('epsilon_estimate', 'eps estimate', digits=2),
         summary.metric('bounding_canaries', 'canaries (bounding)'),
         summary.metric('verdict'), summary.metric('verdict_tests', 'verdict by'),
         summary.metric('verdict_assumes', 'verdict assumes'),
         summary.metric('power_factor', 'detects noise x (95%)', digits=2))),
)


# -------------------------------------------------------------------------- validation ---


def _seq(value) -> tuple:
  return (value,) if isinstance(value, str) else tuple(value)


def validate_config(config) -> dict[str, Any]:
  """Checks every field the audit reads (nothing loaded or written)."""
  s = config.training_audit
  data_lib.validate_data_config(config.data)
  chosen = validate.subset_of(config, 'training_audit.defenses', DEFENSES)
  validate.checked(config, 'training_audit.samplings', validate.Rule(
      'a section with the samplings of each defense (' + ', '.join(
          f'{d}: {SAMPLINGS[d]}' for d in DEFENSES) + ')',
      lambda v: isinstance(v, ml_collections.ConfigDict)))
  for d in sorted(set(s.samplings.keys()) - set(DEFENSES)):
    raise validate.ConfigError(f'training_audit.samplings.{d}', f'a defense of {DEFENSES}',
                               s.samplings[d])
  for d in chosen:   # a chosen defense with none of its samplings would silently not run
    validate.require(d in s.samplings, f'training_audit.samplings.{d}',
                     f'given for a chosen defense: a non-empty subset of {SAMPLINGS[d]}', None)
    validate.subset_of(config, f'training_audit.samplings.{d}', SAMPLINGS[d])
  validate.checked(config, 'training_audit.epsilons', registry.each('epsilon'))
  validate.in_range(config, 'training_audit.epsilons', 0.0, 50.0, low_inclusive=False)
  validate.checked(config, 'training_audit.delta', registry.rule('delta'))
  validate.checked(config, 'training_audit.accountant', registry.rule('accountant'))
  validate.checked(config, 'training_audit.clip_norm', registry.rule('clip_norm'))
  validate.in_range(config, 'training_audit.confidence', 0.5, 1.0, low_inclusive=False,
                    high_inclusive=False)
  validate.subset_of(config, 'training_audit.record_kinds', RECORD_KINDS)
  validate.subset_of(config, 'training_audit.threats', THREATS)
  validate.checked(config, 'training_audit.side_channel_trials', validate.number(
      8, 1_000_000, integer=True, words='trials (at least 4 per world)'))
  validate.checked(config, 'training_audit.side_channel_others',
                   validate.number(0, 1000, integer=True))
  validate.checked(config, 'training_audit.canary_norm',
                   validate.number(1, 1e6, words='in units of the clip norm'))
  validate.checked(config, 'training_audit.direction', validate.choice(canaries.DIRECTIONS))
  validate.checked(config, 'training_audit.model', validate.choice(('mlp',)))
  validate.checked(config, 'training_audit.optimizer', validate.choice(optimizers.OPTIMIZERS))
  validate.checked(config, 'training_audit.chunk', validate.number(1, 4096, integer=True))
  for field in ('power_draws', 'simulated_draws'):
    validate.checked(config, f'training_audit.{field}', validate.number(
        0, 10_000, integer=True, words='simulations a row (20 or more for a stated power; '
        '0: none)'))
  poisson_lib.validate_settings(config)
  validate.checked(config, 'training_audit.power_factors', validate.items(
      validate.number(0, 1, low_open=True, high_open=True),
      'a non-empty sequence of noise factors in (0, 1)', scalar=False))
  validate.checked(config, 'training_audit.plant', validate.choice(PLANTS))
  for fed, fields in (('record', ('num_clients', 'per_client', 'canaries_per_client',
                                  'input_per_client', 'batch_size', 'epochs', 'num_rounds',
                                  'learning_rate', 'twins', 'hidden', 'canaries',
                                  'input_canaries')),
                      ('client', ('num_clients', 'per_client', 'participation', 'canary_share',
                                  'batch_size', 'epochs', 'num_rounds', 'learning_rate',
                                  'twins', 'hidden', 'canaries'))):
    validate.checked(config, f'training_audit.{fed}', validate.Rule(
        f'a section with the fields {fields}', lambda v: isinstance(v, ml_collections.ConfigDict)))
    sec = s[fed]
    for field in sorted(set(sec.keys()) - set(fields)):
      raise validate.ConfigError(f'training_audit.{fed}.{field}', f'one of {fields}',
                                 sec[field])
    name = lambda f, fed=fed: f'training_audit.{fed}.{f}'
    for field, high in (('num_clients', 100_000), ('per_client', 100_000),
                        ('batch_size', 100_000), ('epochs', 100), ('num_rounds', 1000)):
      validate.checked(config, name(field), validate.number(1, high, integer=True))
    validate.checked(config, name('learning_rate'), validate.number(0, 100, low_open=True))
    validate.checked(config, name('twins'), validate.number(0, 1000, integer=True))
    validate.checked(config, name('hidden'), validate.items(
        validate.number(1, 4096, integer=True), 'a sequence of widths in [1, 4096]',
        nonempty=False))
    validate.checked(config, name('canaries'), validate.number(
        4, 1_000_000, integer=True, words='canaries a row (at least 2 per world)'))
  r, c = s.record, s.client
  for field in ('canaries_per_client', 'input_per_client'):
    validate.checked(config, f'training_audit.record.{field}', validate.number(
        1, 100_000, integer=True))
  validate.checked(config, 'training_audit.record.input_canaries', validate.number(
      4, 1_000_000, integer=True, words='canaries a row (at least 2 per world)'))
  validate.checked(config, 'training_audit.client.participation', validate.number(
      0, 1, low_open=True, words='the fraction of the clients drawn each round'))
  validate.checked(config, 'training_audit.client.canary_share', validate.number(
      0, 1, low_open=True, high_open=True, words="the canaries' largest share of a round's "
      'participants (below 1)'))
  validate.checked(config, 'training_audit.record.batch_size', validate.Rule(
      f'at most record.per_client ({r.per_client}): the Poisson rate is B / N <= 1',
      lambda b: b <= r.per_client))
  # A minibatch larger than a client's rows trains on its rows alone: B would be recorded
  # while min(B, rows) ran.
  validate.checked(config, 'training_audit.client.batch_size', validate.Rule(
      f"at most client.per_client ({c.per_client}): a client's minibatch is drawn from its "
      'rows', lambda b: b <= c.per_client))
  if 'defense' in config:
    defenses.check_honoured(config.defense, NAME, ('none',), 'it audits every DP defense '
                            'itself (training_audit.defenses)')
  return {'defenses': chosen}


def unused_fields(config) -> dict[str, str]:
  """The `training_audit` fields this run does not read (`base.unused`: a command-line
  override of one is refused rather than recorded as if it ran): a federation no chosen
  defense trains, the samplings of defenses not chosen, a canary kind's counts when the kind
  is not audited, the side channel's when it is not played, the aggregate reader's clients
  when no aggregate defense is chosen."""
  s = config.training_audit
  chosen = set(_seq(s.defenses))
  threats, kinds = set(_seq(s.threats)), set(_seq(s.record_kinds))
  out: dict[str, str] = {}
  if 'dp_sgd' not in chosen:
    why = 'read only for dp_sgd, which training_audit.defenses does not choose'
    out.update({f'training_audit.record.{f}': why for f in s.record.keys()})
    out['training_audit.record_kinds'] = why
  else:
    reads = {'gradient': ('canaries_per_client', 'canaries'),
             'input': ('input_per_client', 'input_canaries')}
    for kind, fields in reads.items():
      if kind not in kinds:
        out.update({f'training_audit.record.{f}': f'read only for {kind} canaries, which '
                    'training_audit.record_kinds does not choose' for f in fields})
  if not chosen - {'dp_sgd'}:
    why = ('read only for the client-level defenses, which training_audit.defenses does not '
           'choose')
    out.update({f'training_audit.client.{f}': why for f in s.client.keys()})
    out['training_audit.direction'] = why
  out.update({f'training_audit.samplings.{d}': f'{d} is not in training_audit.defenses'
              for d in s.samplings.keys() if d not in chosen})
  if chosen == {'ldp_sgd'}:
    out['training_audit.accountant'] = ("read only by the noise defenses' accountants (ldp_sgd's "
                                        'claim is a pure epsilon: no accountant composes it)')
  out.update({f'game.{f}': 'read only by the trial runner of the other games (the audit '
              'chunks its trainings by training_audit.chunk)'
              for f in ('chunk_size', 'batch_bytes')})
  if not threats - {'side_channel'}:
    why = ("read only by the canaries' trainings, which no threat of training_audit.threats "
           'scores (the side channel plays its own game)')
    # (The canaries' share of a shard or a round still sizes the claim's federation.)
    out.update({f'training_audit.{f}': why for f in ('record_kinds', 'canary_norm', 'direction',
                                                      'chunk')})
    out.update({f'training_audit.record.{f}': why for f in ('twins', 'canaries',
                                                            'input_canaries')})
    out.update({f'training_audit.client.{f}': why for f in ('twins', 'canaries')})
    out.update({f'training_audit.{f}': why for f in ('power_draws', 'power_factors',
                                                      'simulated_draws')})
  if 'side_channel' not in threats:
    out.update({f'training_audit.{f}': "read only by the side channel, which "
                'training_audit.threats does not choose'
                for f in ('side_channel_trials', 'side_channel_others')})
  elif not chosen & {'central_dp', 'weak_dp'}:
    out['training_audit.side_channel_others'] = ('read only when the adversary reads the '
                                                 'aggregate (central_dp, weak_dp), which '
                                                 'training_audit.defenses does not choose')
  out.update(poisson_lib.unused(config, defenses=chosen, dp_sgd_samplings=_seq(
      s.samplings.dp_sgd), kinds=kinds, threats=threats))
  return out


def prepare(config) -> dict[str, Any]:
  """Validates, loads the data and checks it holds each federation's rows."""
  state = validate_config(config)
  splits = data_lib.load(config.data)
  s = config.training_audit
  train, test = splits['train'], splits['test']
  x0 = data_lib.to_float(train.x[:1]).reshape(1, -1)
  models, dims = {}, {}
  for fed in (s.record, s.client):
    widths = tuple(fed.hidden)
    models[widths] = models_lib.make('mlp', train.num_classes, hidden=widths,
                                     field='training_audit.model')
    # Shapes only: a model too large for memory is refused below, not allocated here.
    dims[widths] = memory.num_parameters(models[widths], x0.shape[1:])
  state.update(train=train, test=test, models=models, dims=dims, trainings={})
  for tr in trainings(config, state):
    dim = dims[tuple(runs.federation(config, tr).hidden)]
    fed, f = runs.federation(config, tr), 'record' if tr['defense'] == 'dp_sgd' else 'client'
    need = int(fed.num_clients) * int(fed.per_client)
    validate.require(int(fed.num_clients) <= len(train), f'training_audit.{f}.num_clients',
                     f'at most {len(train)} (clients of at least one row of the train split)',
                     fed.num_clients)
    validate.require(len(train) >= need, f'training_audit.{f}.per_client',
                     f'at most {len(train) // int(fed.num_clients)} (num_clients x per_client '
                     f'rows of the train split, which has {len(train)})', fed.per_client)
    if tr['canary'] != 'side_channel':
      checks.training_fits(config, tr, dim)
    _check_claim(config, state, tr)
    if tr['canary'] == 'side_channel':
      decl = runs.claim(config, state, tr).declaration
      checks.side_channel(config, tr, len(train), 'server' if decl is None else decl.adversary)
      continue
    m = runs.canaries_per_training(config, tr)
    if tr['canary'] == 'gradient' or (tr['canary'] == 'client'):
      validate.require(m <= dim, f'training_audit.{f}.' + (
          'canaries_per_client' if f == 'record' else 'canary_share'),
                       f'at most the model\'s {dim} parameters of canaries a training (one '
                       'coordinate or orthogonal direction each)', m)
    if tr['canary'] == 'input':
      pool = len(train) - need
      validate.require(m <= pool, 'training_audit.record.input_per_client',
                       f'at most {pool // int(fed.num_clients)} (the {pool} images no client '
                       'holds are the input canaries)', fed.input_per_client)
  return state


def _check_claim(config, state, tr: dict) -> None:
  """Refuses a claim the defense's accountant does not resolve (before anything is written): a
  target so small that the calibrated noise reads an epsilon of 0 or far below it (PLD's
  discretisation) cannot be audited against. Calibrations are cached, so the sweep reuses
  them."""
  target = float(tr['claimed_epsilon'])
  got = float(_claim_metrics(config, state, tr, runs.claim(config, state, tr))[0]['dp_epsilon'])
  where = tr['defense'] + (f" ({tr['sampling']})" if tr['sampling'] else '')
  validate.require(got >= 0.5 * target, 'training_audit.epsilons',
                   'claims each defense calibrates to (its accounted epsilon at least half '
                   f'the claim; {where} accounts '
                   f'{got:.3g} at {target:g})', target)


# ------------------------------------------------------------------------------ points ---


def trainings(config, state) -> list[dict]:
  """The sweep's trainings, in run order: defense x sampling x claim x canary kind, then the
  row's side-channel game."""
  s = config.training_audit
  threats = _seq(s.threats)
  out = []
  for name in state['defenses']:
    kinds = _seq(s.record_kinds) if name == 'dp_sgd' else ('client',)
    if not any(t in threats for t in ('all_steps', 'all_iterates', 'last_iterate')):
      kinds = ()
    if 'side_channel' in threats:
      kinds = kinds + ('side_channel',)
    for sampling in (x for x in SAMPLINGS[name] if x in _seq(s.samplings[name])):
      for eps in (s.epsilons if isinstance(s.epsilons, (list, tuple)) else (s.epsilons,)):
        for kind in kinds:
          out.append(dict(defense=name, sampling=sampling, claimed_epsilon=float(eps),
                          canary=kind))
  return out


def threats_of(config, tr: dict) -> tuple[str, ...]:
  """The threats that read training `tr`'s canaries."""
  chosen = _seq(config.training_audit.threats)
  if tr['canary'] == 'side_channel':
    return ('side_channel',)
  own = (('all_steps',) if tr['canary'] == 'gradient' else ()) + ('all_iterates',
                                                                  'last_iterate')
  return tuple(t for t in own if t in chosen)


def mechanism(tr: dict, participation: float = 1.0) -> str:
  """The mechanism's name as `canary_statistics.counted_bounds` reads it: dp_sgd_<batches>,
  or the defense, sampled (`<defense>_without_replacement`) when its aggregate's reader sees a
  sample of the clients."""
  if tr['defense'] == 'dp_sgd':
    return f"dp_sgd_{tr['sampling']}"
  if tr['defense'] in ('central_dp', 'weak_dp') and (
      tr['sampling'] == 'without_replacement' or participation < 1):
    return f"{tr['defense']}_without_replacement"
  return tr['defense']


def independent(config, tr: dict, threat: str, adversary: str, participation: float) -> bool:
  """Whether each canary's score depends only on its own coin and randomness drawn for it
  alone: gradient canaries read at every step (their own inclusion draws and coordinate
  noise); canary clients read in their own uploads (server); or in every aggregate on their
  own direction (orthonormal or Dirac), the other clients' contributions known, when every
  client takes part (a sample without replacement couples the canaries' participations)."""
  del config
  if tr['canary'] == 'gradient' and threat == 'all_steps':
    return True
  if tr['canary'] != 'client' or threat != 'all_iterates':
    return False
  return adversary == 'server' or participation >= 1


def _adversary_stats(config, done: dict) -> dict[str, Any]:
  """The aggregate reader's per-round shift and noise of k_t x aggregate minus the known
  contributions on a canary's direction (C and z C), for the mixture score."""
  z = float(done['claimed'].metrics.get('noise_multiplier', math.nan))
  c = float(config.training_audit.clip_norm)
  return {'shift': c, 'sigma': z * c, 'known': True}


def _claim_metrics(config, state, tr: dict, claimed) -> tuple[dict, Any, Any]:
  """(metrics, declaration, the claim's privacy profile) of a configured defense."""
  s = config.training_audit
  decl = claimed.declaration
  if decl is None:   # ldp_sgd: a mechanism-family defense; its declaration by the registry
    decl = registry.declaration(
        tr['defense'], {'epsilon': float(claimed.params['defense_epsilon'])},
        runs.setting(config, state, tr))
    eps = accounting.epsilon(decl, delta=float(s.delta))
    metrics: dict[str, Any] = {'dp_epsilon': eps, **accounting.describe(decl),
                               'dp_delta': float(s.delta)}
  else:
    metrics = dict(claimed.metrics)
  z = metrics.get('noise_multiplier')
  composed = decl if tr['defense'] != 'weak_dp' else dataclasses.replace(
      decl, compositions=int(runs.federation(config, tr).num_rounds))
  profile = lambda grid: accounting.delta_curve(composed, z, grid, accountant=s.accountant)
  return metrics, decl, profile


def _t_interval(values: np.ndarray) -> tuple[float, float, float]:
  """(mean, 95% Student-t interval) of replicate values; the interval is NaN (not
  estimable) for fewer than 2 values or when they are all equal: a zero-width interval from a
  few replicates would claim a certainty the replicates cannot show."""
  v = np.asarray(values, np.float64)
  if v.size == 0:
    return math.nan, math.nan, math.nan
  mean = float(np.mean(v))
  if v.size < 2 or not np.std(v) > 0:
    return mean, math.nan, math.nan
  half = float(sps.t.ppf(0.975, v.size - 1) * np.std(v, ddof=1) / math.sqrt(v.size))
  return mean, mean - half, mean + half


def point_metrics(config, state, tr: dict, threat: str, done: dict) -> tuple[dict, int]:
  """One (training, threat) point: the declaration's labels, the claim, the audit."""
  s = config.training_audit
  metrics, decl, profile = _claim_metrics(config, state, tr, done['claimed'])
  adversary = decl.adversary
  audited = float(metrics['dp_epsilon'])
  kw = dict(delta=float(s.delta), confidence=float(s.confidence), claimed_delta=profile)
  if threat == 'side_channel':
    mech = mechanism(tr, runs.participation(config, tr))
    metrics.update(side_lib.audit(done['world'], done['side_scores'], mech, audited, **kw))
    metrics.update(power_model=power_lib.NOT_SIMULATED)
    metrics.update(dp_adversary=adversary, side_channel_neighbours=side_lib.neighbours(
        decl.unit, decl.relation), side_channel_rows=runs.side_rows(config, tr),
                   audited_pipeline=AUDITED, plant=str(s.plant), threat_reads=', '.join(
                       side_lib.statistics(adversary)))
    return metrics, int(len(done['world']))
  part = float(done['participation'])
  mech = mechanism(tr, part)
  extra = _adversary_stats(config, done) if adversary == 'aggregate' else {}
  sc = canaries.threat_scores(done['scores'], threat, adversary, participation=part, **extra)
  ind = independent(config, tr, threat, adversary, part)
  world = done['world']
  # A replace-one canary's score is symmetric about 0 between its worlds (+ / - its own
  # clipped contribution plus noise): 0 is a threshold fixed before the data.
  mid = 0.0 if (ind and done['relation'] == 'replace_one' and threat != 'last_iterate' and
                tr['defense'] != 'ldp_sgd') else None
  mle_on, mle_power = poisson_lib.settings(config)
  # The MLE / PLD test joins the family.
  extra = poisson_lib.extra_tests(tr, threat, done, enabled=mle_on)
  metrics.update(canaries.audit(sc, world, mech, audited, independent=ind, midpoint=mid,
                                extra_tests=extra, **kw))
  # Estimates are not bounds; each assumes the family it fits.
  metrics.update(estimate_method='gaussian_fit', estimate_assumes='gaussian',
                 epsilon_gaussian_fit=float(metrics['epsilon_estimate']))
  metrics.update(poisson_lib.row_fits(tr, threat, done, world, metrics,
                                      steps=int(decl.compositions), delta=float(s.delta),
                                      enabled=mle_on))
  metrics.update(power_lib.row_power(
      config, tr, threat, metrics, decl, mechanism=mech,
      mle_steps=int(decl.compositions) if extra and mle_power else None,
      independent=ind, midpoint=mid, participation=part, kw=kw))
  if extra and not mle_power:
    metrics['power_model'] = poisson_lib.power_without_mle(metrics['power_model'])
  acc = np.asarray(done['scores'].test_accuracy, np.float64)
  mean, lo, hi = _t_interval(acc)
  twin = np.asarray(done['twin_accuracy'], np.float64)
  dmean, dlo, dhi = _t_interval(acc[:len(twin)] - twin) if len(twin) else (math.nan,) * 3
  metrics.update(test_accuracy=mean, test_accuracy_ci_low=lo, test_accuracy_ci_high=hi,
                 twin_accuracy=float(np.mean(twin)) if len(twin) else math.nan,
                 accuracy_change=dmean, accuracy_change_ci_low=dlo,
                 accuracy_change_ci_high=dhi, twins=int(len(twin)))
  if tr['defense'] == 'weak_dp':
    per_round = float(metrics['dp_epsilon_per_round'])
    metrics['exceeds_per_round'] = float(float(metrics['best_bound']) > per_round)
  metrics.update(dp_adversary=adversary, canary_relation=done['relation'],
                 participation_run=part, replicates=int(done['replicates']),
                 canaries_per_training=int(done['per_training']),
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
  """One point per (training, threat); a row's trainings run once, for the first point that
  needs them, and are dropped when its last threat is scored."""
  del store
  points = []
  for tr in trainings(config, state):
    k = point_key(key, tr)
    for threat in threats_of(config, tr):
      def compute(tr=tr, threat=threat, k=k):
        cache = state['trainings']
        tkey = tuple(sorted(tr.items()))
        if tkey not in cache:
          cache.clear()
          cache[tkey] = (runs.side_channel(config, state, tr, k) if tr['canary'] ==
                         'side_channel' else runs.run_training(config, state, tr, k))
        return point_metrics(config, state, tr, threat, cache[tkey])
      params = {**tr, 'threat': threat}
      points.append(base.Point(params, compute, unit='canaries' if threat != 'side_channel'
                               else 'trials',
                               after=lambda m, p=params: _report_violation(config, p, m)))
  return points


def figures(config, state, store, key) -> None:
  del state, key
  training_audit_figures.write(store.points, store.workdir, config)
