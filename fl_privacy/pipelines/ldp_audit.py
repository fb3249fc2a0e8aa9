"""The LDP-audit experiment as library code: validation, the sweep's points, their metrics.

What `python -m experiments.ldp_audit` runs (Matsumoto et al., "Measuring Lower Bounds of
Local Differential Privacy via Adversary Instantiations in Federated Learning"). For each
crafter x distinguisher x epsilon (Table 1), a client holding one of two crafted gradients
runs LDP-SGD and a distinguisher guesses which (`ldp_sgd_point`); with
`ldp_audit.mechanism` = 'bitrand' / 'ome' / 'gaussian' the input mechanisms are audited
instead, on two extreme inputs with the exact likelihood-ratio test (`input_point`).
`prepare(config)` validates and loads the data; `sweep(config, state, store, key)` runs
the points the store lacks and draws the figures (`fl_privacy.pipelines.ldp_audit_figures`).

Fields: configs/_ldp_audit.py. Results: docs/experiments/ldp_audit.md.
"""

from __future__ import annotations

import math

from absl import logging
import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np
from scipy import stats as scipy_stats

from fl_privacy import data as data_lib
from fl_privacy import defenses
from fl_privacy import models
from fl_privacy import report
from fl_privacy import validate
from fl_privacy.attacks import audit
from fl_privacy.attacks.audit import crafters
from fl_privacy.attacks.audit import game
from fl_privacy.eval import runner
from fl_privacy.fl import losses
from fl_privacy.mechanisms import bitrand
from fl_privacy.mechanisms import fixed_point
from fl_privacy.mechanisms import gaussian
from fl_privacy.mechanisms import ldp_sgd
from fl_privacy.mechanisms import ome
from fl_privacy.mechanisms import registry
from fl_privacy.pipelines import ldp_audit_figures
from fl_privacy.report import progress
from fl_privacy.report import summary

NAME = 'ldp_audit'
INPUT_PAIRS = ('extreme_pair', 'one_feature_pair')
INPUT_DISTINGUISHER = 'likelihood_ratio'
SERVER_LR_RULES = ('relative', 'paper')

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


def _int_at_least(config, field: str, low: int) -> int:
  value = config.ldp_audit[field.split('.')[-1]]
  ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
  validate.require(ok, field, f'an integer >= {low}', value)
  return value


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
  validate.positive(config, 'ldp_audit.epsilons')
  validate.positive(config, 'ldp_audit.num_trials', integer=True)
  validate.positive(config, 'ldp_audit.clip_norm')
  runner.validate_options(config)
  vc = config.ldp_audit.violation_confidence
  if vc is not None:
    validate.in_range(config, 'ldp_audit.violation_confidence', 0.0, 1.0,
                      low_inclusive=False, high_inclusive=False)
  if mechanism == 'ldp_sgd':
    validate.positive(config, 'ldp_audit.pretrain_lr')
    validate.positive(config, 'ldp_audit.collusion_lr')
    validate.positive(config, 'ldp_audit.batch_size', integer=True)
    _int_at_least(config, 'ldp_audit.pretrain_steps', 0)
    _int_at_least(config, 'ldp_audit.collusion_steps', 0)
    _int_at_least(config, 'ldp_audit.candidates', 2)
    _int_at_least(config, 'ldp_audit.collusion_label', 0)
    validate.one_of(config, 'ldp_audit.target_selection',
                    ('max_grad_norm', 'random'))
    validate.one_of(config, 'ldp_audit.white_box_path', ('literal', 'projected'))
    for field in ('fgsm_alpha', 'retrogression_alpha'):
      value = config.ldp_audit[field]
      validate.require(isinstance(value, (int, float)) and math.isfinite(value),
                       f'ldp_audit.{field}', 'a finite number', value)
    _optional_positive(config, 'ldp_audit.server_lr')
    validate.one_of(config, 'ldp_audit.server_lr_rule', SERVER_LR_RULES)
    validate.in_range(config, 'ldp_audit.server_step_fraction', 0.0, 1.0,
                      low_inclusive=False)
    _optional_positive(config, 'ldp_audit.radius')
    validate.require(isinstance(config.ldp_audit.split, str), 'ldp_audit.split',
                     'a split name', config.ldp_audit.split)
    data_lib.validate_data_config(config.data)
    return mechanism
  validate.positive(config, 'ldp_audit.num_features', integer=True)
  if mechanism == 'gaussian':
    validate.in_range(config, 'ldp_audit.delta', 0.0, 1.0, low_inclusive=False,
                      high_inclusive=False)
    validate.positive(config, 'ldp_audit.sensitivity')
    return mechanism
  s = config.ldp_audit
  validate.require(isinstance(s.sign_bit, bool), 'ldp_audit.sign_bit',
                   'True or False', s.sign_bit)
  _int_at_least(config, 'ldp_audit.int_bits', 0)
  _int_at_least(config, 'ldp_audit.frac_bits', 0)
  fixed_point.check_format(s.int_bits, s.frac_bits)
  validate.one_of(config, 'ldp_audit.rng_bits', (32, 16))
  validate.one_of(config, 'ldp_audit.input_pair', INPUT_PAIRS)
  if mechanism == 'ome':
    validate.positive(config, 'ldp_audit.ome_alpha')
  return mechanism


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
  state['dataset'] = ds
  return state


def _stream(key: jax.Array, name: str) -> jax.Array:
  """An independent key for a named purpose (`report.point_key` of {'stream': name})."""
  return report.point_key(key, {'stream': name})


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
  x = data_lib.to_float(dataset.x)
  y = dataset.y.astype(np.int32)
  model = models.make('audit_cnn', dataset.num_classes, padding='SAME')
  variables = jax.jit(model.init)(_stream(key, 'init'), jnp.asarray(x[:1]))
  loss_fn = losses.make_loss_fn(model.apply)
  xj, yj = jnp.asarray(x), jnp.asarray(y)
  theta = crafters.sgd_train(loss_fn, variables, xj, yj,
                             key=_stream(key, 'pretrain'),
                             steps=s.pretrain_steps,
                             learning_rate=s.pretrain_lr,
                             batch_size=s.batch_size)
  rng = data_lib.rng_from_key(_stream(key, 'candidates'))
  cand = rng.choice(len(y), size=min(s.candidates, len(y)), replace=False)
  cx, cy = jnp.asarray(x[cand]), y[cand]
  norms = crafters.grad_norms(loss_fn, theta, cx, jnp.asarray(cy))
  i1, i2 = crafters.select_examples(norms, cy, s.target_selection)
  x1, y1, x2, y2 = cx[i1], int(cy[i1]), cx[i2], int(cy[i2])
  logging.info('audit model: %d parameters; x1 = example %d (label %d, '
               '||g|| %.3f), x2 = example %d (label %d, ||g|| %.3f)',
               models.param_count(theta), cand[i1], y1, norms[i1], cand[i2],
               y2, norms[i2])
  crafted = {}
  wanted = set(points_crafters(config))
  if 'benign' in wanted:
    crafted['benign'] = crafters.benign(loss_fn, theta, x1, y1, x2, y2)
  if 'input_perturbation' in wanted:
    crafted['input_perturbation'] = crafters.input_perturbation(
        loss_fn, theta, x1, y1, alpha=s.fgsm_alpha)
  if 'parameter_retrogression' in wanted:
    crafted['parameter_retrogression'] = crafters.parameter_retrogression(
        loss_fn, theta, x1, y1, alpha=s.retrogression_alpha)
  if 'gradient_flip' in wanted:
    crafted['gradient_flip'] = crafters.gradient_flip(loss_fn, theta, x1, y1)
  if 'dummy_gradient' in wanted:
    crafted['dummy_gradient'] = crafters.dummy_gradient(
        theta, x1, y1, clip_norm=s.clip_norm)
  if 'collusion' in wanted:
    bad = crafters.malicious_model(
        loss_fn, theta, x, y, label=s.collusion_label,
        key=_stream(key, 'collusion'), steps=s.collusion_steps,
        learning_rate=s.collusion_lr, batch_size=s.batch_size)
    bad_norms = crafters.grad_norms(loss_fn, bad, cx, jnp.asarray(cy))
    j1, _ = crafters.select_examples(bad_norms, cy, s.target_selection,
                                     exclude_label=s.collusion_label)
    crafted['collusion'] = crafters.collusion(loss_fn, bad, cx[j1],
                                              int(cy[j1]))
  _, unravel = flatten_util.ravel_pytree(theta)

  def per_example_loss(params, xs, ys):
    return losses.per_example_cross_entropy(model.apply(params, xs), ys)

  return {'crafted': crafted, 'unravel': unravel,
          'per_example_loss': per_example_loss, 'trial_fns': {}}


def _trial_fn(setup: dict, distinguisher: str, crafter: str):
  rule = (audit.BLACK_BOX_RULE[crafter] if distinguisher == 'black_box'
          else None)
  cache = setup['trial_fns']
  if (distinguisher, rule) not in cache:
    cache[(distinguisher, rule)] = game.ldp_sgd_trial_fn(
        distinguisher, rule, setup['per_example_loss'], setup['unravel'])
  return cache[(distinguisher, rule)]


def _antipodal_accuracy(g_norm: float, epsilon: float, clip_norm: float):
  # Exact white-box accuracy for g2 = -g1: keep x pole agreement.
  pk = 1.0 / (1.0 + math.exp(-epsilon))
  pz = 0.5 + min(g_norm, clip_norm) / (2.0 * clip_norm)
  return pk * pz + (1.0 - pk) * (1.0 - pz)


def server_learning_rate(s, radius: float, dim: int, eps: float) -> float:
  """The server's eta_t: `server_lr` if set, else by `server_lr_rule`.

  'relative' (default): the step is `server_step_fraction` of ||C||
  (`ldp_sgd.relative_learning_rate`, whose docstring derives it); 'paper': the
  eta_t of Algorithm 2 (`ldp_sgd.paper_learning_rate`, n = 1 client), whose step
  with the unbiased constant is about 1.25 ||C||.
  """
  if s.server_lr is not None:
    return float(s.server_lr)
  if s.server_lr_rule == 'paper':
    return float(ldp_sgd.paper_learning_rate(radius, 1, dim, eps, s.clip_norm))
  return float(ldp_sgd.relative_learning_rate(radius, dim, eps, s.clip_norm,
                                              float(s.server_step_fraction)))


def ldp_sgd_point(config, setup: dict, params: dict, key,
                  violation_confidence: float):
  """Metrics of one (crafter, distinguisher, epsilon) point on LDP-SGD."""
  s = config.ldp_audit
  c = setup['crafted'][params['crafter']]
  eps = params['epsilon']
  dim = int(c.g1.size)
  radius = (float(s.radius) if s.radius is not None
            else float(jnp.linalg.norm(c.params)))
  lr = server_learning_rate(s, radius, dim, eps)
  if params['distinguisher'] == 'white_box' and s.white_box_path == 'projected':
    fn = setup['trial_fns'].setdefault(
        'projected', game.ldp_sgd_projected_white_box_trial_fn())
    coef = game.subspace_coefficients(np.stack([c.g1, c.g2]))
    args = (jnp.asarray(coef), jnp.float32(eps), jnp.float32(s.clip_norm),
            jnp.float32(dim))
  else:
    fn = _trial_fn(setup, params['distinguisher'], params['crafter'])
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
    metrics['acc_white_box_exact'] = _antipodal_accuracy(g1n, eps,
                                                         s.clip_norm)
  return metrics, s.num_trials


# ------------------------------------------------------ input mechanisms ---


def _pair_bits(s) -> np.ndarray:
  """Encodings [2, r, l] of the audited input pair of a bitwise mechanism.

  'extreme_pair': the all-zero and the all-maximum vector (every magnitude bit
  differs); 'one_feature_pair': the all-zero vector and the one whose feature 0
  alone is the maximum (the neighbours of a per-feature guarantee).
  """
  top = fixed_point.max_value(s.int_bits, s.frac_bits)
  other = (jnp.full((s.num_features,), top) if s.input_pair == 'extreme_pair'
           else jnp.zeros((s.num_features,)).at[0].set(top))
  x = jnp.stack([jnp.zeros((s.num_features,)), other])
  bits, _ = fixed_point.encode(x, s.int_bits, s.frac_bits, s.sign_bit)
  return np.asarray(bits, np.uint8)


def _bit_probabilities(mechanism: str, s, eps: float, bits: np.ndarray):
  """P(output bit = 1 | input) [2, r, l] as the integer-threshold draw realises."""
  r, l = bits.shape[-2], bits.shape[-1]
  if mechanism == 'bitrand':
    q = bitrand.effective_probabilities(
        np.asarray(bitrand.flip_probabilities(eps, r, l), np.float64),
        s.rng_bits)
    return np.where(bits == 1, 1.0 - q, q)
  p = bitrand.effective_probabilities(
      np.asarray(ome.output_probabilities(eps, r * l, s.ome_alpha), np.float64),
      s.rng_bits)
  odd = ome.odd_positions(r, l).astype(int)
  return p[odd[None], bits.astype(int)]


def _implied_epsilon(mechanism: str, s, eps: float, bits: np.ndarray) -> float:
  """The LDP epsilon the bit probabilities imply for the audited pair.

  Bits are independent, so it is the sum of the per-bit epsilons over the bits
  in which the pair differs (tight for that pair).
  """
  r, l = bits.shape[-2], bits.shape[-1]
  if mechanism == 'bitrand':
    per_bit = np.broadcast_to(bitrand.per_bit_epsilon(
        eps, r, l, rng_bits=s.rng_bits), (r, l))
  else:
    per_bit = ome.per_bit_epsilon(eps, r, l, s.ome_alpha, rng_bits=s.rng_bits)
  return float(np.sum(np.where(bits[0] != bits[1], per_bit, 0.0)))


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
  bits = _pair_bits(s)
  probs = _bit_probabilities(mechanism, s, eps, bits)
  if_one, if_zero = audit.distinguishers.bit_log_ratios(probs[0], probs[1])
  extra = {'alpha': s.ome_alpha} if mechanism == 'ome' else {}
  fn = game.bits_trial_fn(registry.bit_randomizer(mechanism, eps, rng_bits=s.rng_bits,
                                                  **extra))
  metrics = game.run_point(fn, key, s.num_trials, **opts,
                           args=(jnp.asarray(bits), jnp.asarray(if_one),
                                 jnp.asarray(if_zero)),
                           claimed_epsilon=eps,
                           violation_confidence=violation_confidence,
                           audit_delta=float(s.delta))
  metrics['eps_implied'] = _implied_epsilon(mechanism, s, eps, bits)
  return metrics, s.num_trials


# ------------------------------------------------------------------ sweep ---


def sweep(config, state, store, key) -> None:
  """Runs every point the store lacks, then draws the figures.

  Args:
    config: the validated config (see `prepare`).
    state: what `prepare(config)` returned.
    store: the run's `fl_privacy.report.ResultsStore`.
    key: the run's PRNG key; every point draws from its own stream of it.
  """
  mechanism = state['mechanism']
  todo = points(config, mechanism)
  vc = config.ldp_audit.violation_confidence
  vc = float(vc) if vc is not None else 1.0 - 0.05 / len(todo)
  progress.plan(len(todo))
  setup = {}
  for params in todo:
    point_key = report.point_key(key, params)

    def compute(params=params, point_key=point_key):
      if mechanism != 'ldp_sgd':
        return input_point(config, mechanism, params, point_key, vc)
      if not setup:
        setup.update(build_ldp_sgd_setup(config, state['dataset'],
                                         _stream(key, 'setup')))
      return ldp_sgd_point(config, setup, params, point_key, vc)

    metrics = report.run_point(store, params, compute)
    if float(metrics.get('privacy_violation', 0.0)) > 0:
      logging.error(
          'PRIVACY VIOLATION: %s claims epsilon %.3g but the audit certifies '
          'more (95%% lower bound %s; flagged at one-sided level %.4g, '
          'family-wise over the sweep) at %s', mechanism, params['epsilon'],
          metrics['eps_emp_lower'], vc, params)
  ldp_audit_figures.draw_figures(store.points, store.workdir)
