"""The LDP-audit experiment as library code: validation, the sweep's points, their metrics.

What `python -m experiments.ldp_audit` runs (Matsumoto et al., "Measuring Lower Bounds of
Local Differential Privacy via Adversary Instantiations in Federated Learning"). For each
crafter x distinguisher x epsilon (Table 1), a client holding one of two crafted gradients
runs LDP-SGD and a distinguisher guesses which (`ldp_sgd_point`); with
`ldp_audit.mechanism` = 'bitrand' / 'ome' / 'gaussian' the input mechanisms are audited
instead, on two extreme inputs with the exact likelihood-ratio test (`input_point`).
`prepare(config)` validates and loads the data; `sweep(config, state, store, key)` runs
the points the store lacks and draws the figures (`fl_privacy.pipelines.ldp_audit_figures`).
LDP-SGD's model, crafted pairs and server step are `fl_privacy.attacks.audit.ldp_sgd_setup`;
an input mechanism's realised bit probabilities and implied epsilon are its own
(`bitrand` / `ome.bit_one_probabilities`, `pair_epsilon`).

Fields: configs/_ldp_audit.py. Results: docs/experiments/ldp_audit.md.
"""

from __future__ import annotations

import functools
import math

from absl import logging
import jax.numpy as jnp
import numpy as np
from scipy import stats as scipy_stats

from fl_privacy import data as data_lib
from fl_privacy import defenses
from fl_privacy import report
from fl_privacy import validate
from fl_privacy.attacks import audit
from fl_privacy.attacks.audit import crafters
from fl_privacy.attacks.audit import game
from fl_privacy.attacks.audit import ldp_sgd_setup
from fl_privacy.eval import runner
from fl_privacy.mechanisms import bitrand
from fl_privacy.mechanisms import fixed_point
from fl_privacy.mechanisms import gaussian
from fl_privacy.mechanisms import ldp_sgd
from fl_privacy.mechanisms import ome
from fl_privacy.mechanisms import registry
from fl_privacy.pipelines import base
from fl_privacy.pipelines import ldp_audit_figures
from fl_privacy.report import summary

NAME = 'ldp_audit'
INPUT_PAIRS = crafters.INPUT_PAIRS
INPUT_DISTINGUISHER = 'likelihood_ratio'
SERVER_LR_RULES = ldp_sgd_setup.SERVER_LR_RULES

# The headline columns: logged per saved point (so the log shows eps_emp per point) and
# printed as a table at the end of a run.
_COLUMNS = (summary.param('crafter'), summary.param('distinguisher'),
            summary.param('epsilon', 'eps claimed'),
            summary.bound('eps_emp', 'eps_emp_lower', 'eps_emp [95% lower]'),
            summary.rate('acc', 'accuracy [95% CI]'),
            summary.metric('epsilon_cp', 'eps_CP at delta [lower]', digits=2),
            summary.metric('gdp_mu', 'GDP mu [lower]', digits=2))
SUMMARY = (
    summary.Table('LDP-SGD audit: empirical epsilon (Eq. 3)',
                  _COLUMNS + (summary.flag('privacy_violation', 'violation'),),
                  where={'mechanism': 'ldp_sgd'}),
    summary.Table('Input mechanism audit: empirical vs implied epsilon',
                  (summary.param('mechanism'),) + _COLUMNS + (
                      summary.metric('eps_implied', 'eps implied', digits=1),
                      summary.flag('privacy_violation', 'violation'))),
)


def _optional_positive(config, field: str) -> None:
  if config.ldp_audit[field.split('.')[-1]] is not None:
    validate.positive(config, field)


def validate_config(config) -> str:
  """Checks every field the experiment reads; returns the mechanism."""
  if 'defense' in config:
    defenses.check_honoured(config.defense, NAME, ('none',), 'it audits the mechanism named in '
                            'ldp_audit.mechanism; nothing trains under a defense')
  mechanism = validate.one_of(config, 'ldp_audit.mechanism', audit.MECHANISMS)
  validate.subset_of(config, 'ldp_audit.crafters', audit.CRAFTERS)
  validate.subset_of(config, 'ldp_audit.distinguishers', audit.DISTINGUISHERS)
  validate.checked(config, 'ldp_audit.epsilons', defenses.registry.each('epsilon'))
  validate.positive(config, 'ldp_audit.num_trials', integer=True)
  validate.checked(config, 'ldp_audit.num_trials', validate.trials())
  validate.checked(config, 'ldp_audit.clip_norm', defenses.registry.rule('clip_norm'))
  runner.validate_options(config)
  # The flag says the claim is violated; below 95% it flagged points whose 95% lower bound
  # (the one reported beside it) is below the claim.
  validate.checked(config, 'ldp_audit.violation_confidence', validate.number(
      0.95, 1.0, high_open=True, optional=True,
      words='None = 95% family-wise over the sweep; a violation is not claimed at less'))
  if mechanism == 'ldp_sgd':
    validate.positive(config, 'ldp_audit.pretrain_lr')
    validate.positive(config, 'ldp_audit.collusion_lr')
    validate.positive(config, 'ldp_audit.batch_size', integer=True)
    validate.checked(config, 'ldp_audit.pretrain_steps', validate.number(0, integer=True))
    validate.checked(config, 'ldp_audit.collusion_steps', validate.number(0, integer=True))
    validate.checked(config, 'ldp_audit.candidates', validate.number(2, integer=True))
    validate.checked(config, 'ldp_audit.collusion_label', validate.number(0, integer=True))
    validate.one_of(config, 'ldp_audit.target_selection',
                    ('max_grad_norm', 'random'))
    validate.one_of(config, 'ldp_audit.white_box_path', ('literal', 'projected'))
    validate.check_all(config, {'ldp_audit.fgsm_alpha': validate.number(),
                                'ldp_audit.retrogression_alpha': validate.number()})
    _optional_positive(config, 'ldp_audit.server_lr')
    validate.one_of(config, 'ldp_audit.server_lr_rule', SERVER_LR_RULES)
    validate.in_range(config, 'ldp_audit.server_step_fraction', 0.0, 1.0,
                      low_inclusive=False)
    _optional_positive(config, 'ldp_audit.radius')
    validate.checked(config, 'ldp_audit.split', validate.Rule('a split name',
                                                              lambda v: isinstance(v, str)))
    data_lib.validate_data_config(config.data)
    return mechanism
  validate.positive(config, 'ldp_audit.num_features', integer=True)
  if mechanism == 'gaussian':
    validate.checked(config, 'ldp_audit.delta', defenses.registry.rule('delta'))
    validate.positive(config, 'ldp_audit.sensitivity')
    return mechanism
  s = config.ldp_audit
  validate.checked(config, 'ldp_audit.sign_bit', validate.BOOLEAN)
  validate.checked(config, 'ldp_audit.int_bits', validate.number(0, integer=True))
  validate.checked(config, 'ldp_audit.frac_bits', validate.number(0, integer=True))
  fixed_point.check_format(s.int_bits, s.frac_bits, section='ldp_audit')
  validate.one_of(config, 'ldp_audit.rng_bits', (32, 16))
  validate.one_of(config, 'ldp_audit.input_pair', INPUT_PAIRS)
  if mechanism == 'ome':
    validate.positive(config, 'ldp_audit.ome_alpha')
  return mechanism


# The fields only some mechanisms read (`unused_fields`); the rest (epsilons, num_trials,
# delta, violation_confidence) every mechanism reads.
LDP_SGD_FIELDS = ('crafters', 'distinguishers', 'clip_norm', 'pretrain_steps', 'pretrain_lr',
                  'batch_size', 'split', 'candidates', 'target_selection', 'white_box_path',
                  'fgsm_alpha', 'retrogression_alpha', 'collusion_label', 'collusion_steps',
                  'collusion_lr', 'server_lr', 'server_lr_rule', 'server_step_fraction',
                  'radius')
INPUT_FIELDS = {  # field -> the input mechanisms that read it
    'num_features': ('bitrand', 'ome', 'gaussian'), 'int_bits': ('bitrand', 'ome'),
    'frac_bits': ('bitrand', 'ome'), 'sign_bit': ('bitrand', 'ome'),
    'rng_bits': ('bitrand', 'ome'), 'input_pair': ('bitrand', 'ome'), 'ome_alpha': ('ome',),
    'sensitivity': ('gaussian',),
}


def unused_fields(config) -> dict[str, str]:
  """The `ldp_audit` fields the configured mechanism does not read (`base.unused`)."""
  mechanism = config.ldp_audit.mechanism
  readers = {f: ('ldp_sgd',) for f in LDP_SGD_FIELDS}
  readers.update(INPUT_FIELDS)
  return {f'ldp_audit.{field}': f'read only by ldp_audit.mechanism {" or ".join(names)}; '
                                f'this run audits {mechanism!r}'
          for field, names in readers.items() if mechanism not in names}


def prepare(config) -> dict:
  """Validates the config, then loads the data LDP-SGD's crafters need."""
  mechanism = validate_config(config)
  state = {'mechanism': mechanism}
  if mechanism != 'ldp_sgd':
    return state
  splits = data_lib.load(config.data)
  split = config.ldp_audit.split
  validate.require(split in splits, 'ldp_audit.split',
                   f'one of {tuple(splits)}', split)
  ds = splits[split]
  validate.require(ds.is_image, 'data.name',
                   'an image dataset (the audit model is a CNN)', config.data.name)
  label = config.ldp_audit.collusion_label
  if 'collusion' in config.ldp_audit.crafters:
    validate.require(label < ds.num_classes and np.any(ds.y == label),
                     'ldp_audit.collusion_label',
                     f'a label present in the {split} split', label)
  # The crafter screens `candidates` examples of the split: more than it holds was cut to
  # the split without a word and recorded as asked.
  validate.require(int(config.ldp_audit.candidates) <= len(ds), 'ldp_audit.candidates',
                   f'<= {len(ds)}, the examples of the {split!r} split it screens',
                   config.ldp_audit.candidates)
  state['dataset'] = ds
  return state


def _epsilons(config) -> tuple[float, ...]:
  eps = config.ldp_audit.epsilons
  return tuple(float(e) for e in (eps if isinstance(eps, (list, tuple))
                                  else (eps,)))


def points_crafters(config) -> tuple[str, ...]:
  c = config.ldp_audit.crafters
  return (c,) if isinstance(c, str) else tuple(c)


def points(config, mechanism: str) -> list[dict]:
  """The sweep's params, in run order."""
  s = config.ldp_audit
  if mechanism != 'ldp_sgd':
    crafter = s.input_pair if mechanism != 'gaussian' else 'sensitivity_pair'
    return [dict(mechanism=mechanism, crafter=crafter,
                 distinguisher=INPUT_DISTINGUISHER, epsilon=e)
            for e in _epsilons(config)]
  dist_list = ((s.distinguishers,) if isinstance(s.distinguishers, str)
               else s.distinguishers)
  return [dict(mechanism=mechanism, crafter=c, distinguisher=d, epsilon=e)
          for c in points_crafters(config) for d in dist_list
          for e in _epsilons(config)]


# ---------------------------------------------------------------- LDP-SGD ---


def build_ldp_sgd_setup(config, dataset, key) -> dict:
  """Trains theta_t (and the colluding model) and crafts every crafter's pair."""
  s = config.ldp_audit
  return ldp_sgd_setup.build(
      dataset, key, points_crafters(config), pretrain_steps=s.pretrain_steps,
      pretrain_lr=s.pretrain_lr, batch_size=s.batch_size, candidates=s.candidates,
      target_selection=s.target_selection, fgsm_alpha=s.fgsm_alpha,
      retrogression_alpha=s.retrogression_alpha, clip_norm=s.clip_norm,
      collusion_label=s.collusion_label, collusion_steps=s.collusion_steps,
      collusion_lr=s.collusion_lr)


def ldp_sgd_point(config, setup: dict, params: dict, key,
                  violation_confidence: float):
  """Metrics of one (crafter, distinguisher, epsilon) point on LDP-SGD."""
  s = config.ldp_audit
  c = setup['crafted'][params['crafter']]
  eps = params['epsilon']
  dim = int(c.g1.size)
  radius = (float(s.radius) if s.radius is not None
            else float(jnp.linalg.norm(c.params)))
  lr = ldp_sgd_setup.server_learning_rate(s.server_lr, s.server_lr_rule, radius, dim, eps,
                                          s.clip_norm, s.server_step_fraction)
  if params['distinguisher'] == 'white_box' and s.white_box_path == 'projected':
    fn = setup['trial_fns'].setdefault(
        'projected', game.ldp_sgd_projected_white_box_trial_fn())
    coef = game.subspace_coefficients(np.stack([c.g1, c.g2]))
    args = (jnp.asarray(coef), jnp.float32(eps), jnp.float32(s.clip_norm),
            jnp.float32(dim))
  else:
    fn = ldp_sgd_setup.trial_fn(setup, params['distinguisher'], params['crafter'])
    args = (jnp.stack([c.g1, c.g2]), c.params, c.x, c.y, jnp.float32(eps),
            jnp.float32(s.clip_norm), jnp.float32(lr), jnp.float32(radius))
  metrics = game.run_point(fn, key, s.num_trials,
                           **runner.options(config), args=args,
                           claimed_epsilon=eps,
                           violation_confidence=violation_confidence,
                           audit_delta=float(s.delta))
  g1n, g2n = float(jnp.linalg.norm(c.g1)), float(jnp.linalg.norm(c.g2))
  cos = float(jnp.vdot(c.g1, c.g2) / max(g1n * g2n, 1e-30))
  # One client's estimate has norm debias_scale exactly, so this is the step's norm.
  step = lr * float(ldp_sgd.debias_scale(dim, eps, s.clip_norm))
  metrics.update(dim=dim, g1_norm=g1n, g2_norm=g2n, cos_g1_g2=cos,
                 server_lr=lr, radius=radius, server_step_norm=step,
                 server_step_relative=step / radius)
  if cos < -0.999999:
    metrics['acc_white_box_exact'] = ldp_sgd_setup.antipodal_accuracy(g1n, eps, s.clip_norm)
  return metrics, s.num_trials


# ------------------------------------------------------ input mechanisms ---


def input_point(config, mechanism: str, params: dict, key,
                violation_confidence: float):
  """Metrics of one epsilon of an input mechanism (BitRand, OME, Gaussian)."""
  s = config.ldp_audit
  eps = params['epsilon']
  opts = runner.options(config)
  if mechanism == 'gaussian':
    sigma = float(gaussian.sigma_for(eps, s.delta, s.sensitivity))
    pair = jnp.zeros((2, s.num_features)).at[1, 0].set(s.sensitivity)
    fn = game.gaussian_trial_fn(gaussian.add_noise)
    metrics = game.run_point(fn, key, s.num_trials, **opts,
                             args=(pair, jnp.float32(sigma)),
                             claimed_epsilon=eps, delta=s.delta,
                             violation_confidence=violation_confidence,
                             audit_delta=float(s.delta))
    # The optimal test's exact error FP = FN = Phi(-s / (2 sigma)) and the
    # epsilon it implies at this delta: what the audit should find.
    tail = float(scipy_stats.norm.cdf(-s.sensitivity / (2.0 * sigma)))
    metrics.update(sigma=sigma, fp_exact=tail,
                   eps_test_exact=max(0.0, math.log((1 - s.delta - tail) / tail)))
    return metrics, s.num_trials
  bits = crafters.input_pair_bits(s.input_pair, s.num_features, s.int_bits, s.frac_bits,
                                  s.sign_bit)
  # The probabilities and epsilon the integer-threshold draw realises, from the mechanism.
  mech = {'bitrand': bitrand, 'ome': ome}[mechanism]
  extra = {'alpha': s.ome_alpha} if mechanism == 'ome' else {}
  probs = mech.bit_one_probabilities(bits, eps, rng_bits=s.rng_bits, **extra)
  if_one, if_zero = audit.distinguishers.bit_log_ratios(probs[0], probs[1])
  fn = game.bits_trial_fn(registry.bit_randomizer(mechanism, eps, rng_bits=s.rng_bits,
                                                  **extra))
  metrics = game.run_point(fn, key, s.num_trials, **opts,
                           args=(jnp.asarray(bits), jnp.asarray(if_one),
                                 jnp.asarray(if_zero)),
                           claimed_epsilon=eps,
                           violation_confidence=violation_confidence,
                           audit_delta=float(s.delta))
  metrics['eps_implied'] = mech.pair_epsilon(bits[0], bits[1], eps, rng_bits=s.rng_bits,
                                             **extra)
  return metrics, s.num_trials


# ------------------------------------------------------------------ sweep ---


def plan(config, state, store, key) -> list[base.Point]:
  """One point per (crafter, distinguisher, epsilon), each drawing from its own stream of
  `key`; LDP-SGD's shared setup (pretraining, target) is built by the first point computed."""
  del store
  mechanism = state['mechanism']
  todo = points(config, mechanism)
  vc = config.ldp_audit.violation_confidence
  vc = float(vc) if vc is not None else 1.0 - 0.05 / len(todo)
  setup = {}

  def compute(params, point_key):
    if mechanism != 'ldp_sgd':
      return input_point(config, mechanism, params, point_key, vc)
    if not setup:
      setup.update(build_ldp_sgd_setup(config, state['dataset'],
                                       ldp_sgd_setup.stream(key, 'setup')))
    return ldp_sgd_point(config, setup, params, point_key, vc)

  def report_violation(metrics, params):
    if float(metrics.get('privacy_violation', 0.0)) > 0:
      logging.error(
          'PRIVACY VIOLATION: %s claims epsilon %.3g but the audit certifies '
          'more (95%% lower bound %s; flagged at one-sided level %.4g, '
          'family-wise over the sweep) at %s', mechanism, params['epsilon'],
          metrics['eps_emp_lower'], vc, params)

  return [base.Point(p, functools.partial(compute, p, report.point_key(key, p)),
                     after=functools.partial(report_violation, params=p)) for p in todo]


def figures(config, state, store, key) -> None:
  del config, state, key
  ldp_audit_figures.draw_figures(store.points, store.workdir)
