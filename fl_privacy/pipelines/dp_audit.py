"""The DP audit as library code: every DP mechanism fl-privacy ships, against its own claim.

What `python -m experiments.dp_audit` runs. For each mechanism and claimed epsilon the
mechanism is calibrated with `fl_privacy.accounting` (its declaration: unit, relation,
adversary, sampling, compositions) and then audited by the strongest canary game its
declared adversary may play: white-box, as in Nasr et al., "Tight Auditing of Differentially
Private Machine Learning" (USENIX Security 2023, arXiv:2302.07956). The adversary reads every
release the declaration composes; the canary is a Dirac gradient / update / input of norm
`canary_norm` x C along coordinate 0 (above the clip, so the real clip must act), and every
other contribution is known to the adversary (here: fixed vectors on coordinates 1..d-1,
clipped by the mechanism like the canary). In-world vs out-world follows the declared
relation: add/remove (canary present vs absent) or replace-one (+canary vs -canary).

Every trial calls the library's real mechanism, so a bug in a clip or a noise scale shows:

| mechanism | mechanism function | releases the adversary reads | score |
|---|---|---|---|
| dp_sgd_poisson | `dp.private_gradient` | every step's noisy sum (T steps) | Poisson mixture log-LR |
| dp_sgd_shuffle | `dp.private_gradient` | the canary's step of every epoch | sum of coordinate 0 |
| update_dp | `dp.clip_and_noise_update` | the upload of every round | sum of coordinate 0 |
| central_dp | `dp.dp_fedavg` | the noisy aggregate of every round | sum of coordinate 0 |
| weak_dp | `dp.dp_fedavg` | one round's aggregate (its per-round claim) | coordinate 0 |
| gaussian | `registry.randomizer('gaussian')` | the randomized input | coordinate 0 |
| ldp_sgd | `ldp_sgd.randomize` | every report | sum of sign(coordinate 0) |

The scores are the optimal (likelihood-ratio) statistics of each game: for Gaussian
compositions the sum of the canary coordinate; for Poisson-subsampled steps
sum_t log(1 - q + q exp((x_t D - D^2 / 2) / s^2)) with D = C and s = z C; for LDP-SGD the
report's sign along the canary. `fl_privacy.eval.auditing.audit_scores` turns the in/out
scores into lower bounds of epsilon; a bound above the claim is a privacy violation (logged
as an error, `privacy_violation = 1`).

Fields: configs/_dp_audit.py. Results: docs/experiments/dp_audit.md.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import accounting
from fl_privacy import defenses
from fl_privacy import report
from fl_privacy import validate
from fl_privacy.defenses import dp
from fl_privacy.eval import auditing
from fl_privacy.eval import runner
from fl_privacy.mechanisms import ldp_sgd
from fl_privacy.mechanisms import registry
from fl_privacy.pipelines import dp_audit_figures
from fl_privacy.report import progress
from fl_privacy.report import summary


NAME = 'dp_audit'
MECHANISMS = ('dp_sgd_poisson', 'dp_sgd_shuffle', 'update_dp', 'central_dp', 'weak_dp',
              'gaussian', 'ldp_sgd')
# The lower bounds `audit_scores` returns, in the order the table shows them.
BOUNDS = ('epsilon_cp', 'epsilon_gdp', 'epsilon_one_run', 'epsilon_one_run_fdp')
# Mechanisms whose trade-off curve is not Gaussian (see `counted_bounds`).
NON_GAUSSIAN = ('dp_sgd_poisson', 'ldp_sgd')
MAX_EPSILON = 50.0
# The empirical profile's epsilon grid, as multiples of the claim.
PROFILE_GRID = tuple(np.round(np.linspace(0.0, 1.5, 16), 3))

SUMMARY = (
    summary.Table(
        'DP audit: claimed epsilon vs empirical lower bounds (white-box canary games)',
        (summary.param('mechanism'), summary.param('claimed_epsilon', 'eps claimed'),
         summary.metric('noise_multiplier', 'z', digits=3),
         summary.metric('epsilon_cp', 'eps CP', digits=2),
         summary.metric('epsilon_gdp_if_gaussian', 'eps GDP', digits=2),
         summary.metric('epsilon_one_run', 'eps 1-run', digits=2),
         summary.metric('best_bound', 'best', digits=2),
         summary.metric('tightness', 'best/claim', digits=2),
         summary.flag('privacy_violation', 'violation'))),
)


# -------------------------------------------------------------------------- validation ---


def _int_at_least(config, field: str, low: int) -> int:
  value = config.dp_audit[field.split('.')[-1]]
  ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
  validate.require(ok, field, f'an integer >= {low}', value)
  return value


def validate_config(config) -> tuple[str, ...]:
  """Checks every field the experiment reads; returns the mechanisms to audit."""
  if 'defense' in config:
    defenses.check_honoured(config.defense, 'dp_audit', ('none',), 'it audits every DP '
                            'mechanism itself (dp_audit.mechanisms)')
  mechanisms = validate.subset_of(config, 'dp_audit.mechanisms', MECHANISMS)
  validate.positive(config, 'dp_audit.epsilons')
  validate.in_range(config, 'dp_audit.epsilons', 0.0, MAX_EPSILON, low_inclusive=False)
  validate.in_range(config, 'dp_audit.delta', 0.0, 1.0, low_inclusive=False,
                    high_inclusive=False)
  # audit_scores' Clopper-Pearson and GDP bounds need a significance below 1/2.
  validate.in_range(config, 'dp_audit.confidence', 0.5, 1.0, low_inclusive=False,
                    high_inclusive=False)
  _int_at_least(config, 'dp_audit.num_trials', 1)
  _int_at_least(config, 'dp_audit.dimension', 2)
  validate.positive(config, 'dp_audit.clip_norm')
  s = config.dp_audit
  validate.require(isinstance(s.canary_norm, (int, float)) and not isinstance(
      s.canary_norm, bool) and math.isfinite(s.canary_norm) and s.canary_norm >= 1.0,
                   'dp_audit.canary_norm', 'a finite number >= 1 (in units of the clip norm)',
                   s.canary_norm)
  for field in ('num_examples', 'batch_size', 'epochs', 'rounds', 'num_clients',
                'ldp_reports'):
    _int_at_least(config, f'dp_audit.{field}', 1)
  validate.require(s.batch_size < s.num_examples, 'dp_audit.batch_size',
                   f'below num_examples ({s.num_examples}): Poisson sampling needs q < 1',
                   s.batch_size)
  validate.positive(config, 'dp_audit.noise_scale_factor')
  validate.require(isinstance(s.profile_mechanism, str) and s.profile_mechanism in MECHANISMS,
                   'dp_audit.profile_mechanism', f'one of {MECHANISMS}', s.profile_mechanism)
  validate.positive(config, 'dp_audit.profile_epsilon')
  runner.validate_options(config)
  return mechanisms


def prepare(config) -> dict:
  """Validates the config (nothing to load: the audit's releases are small vectors)."""
  return {'mechanisms': validate_config(config)}


def _epsilons(config) -> tuple[float, ...]:
  eps = config.dp_audit.epsilons
  return tuple(float(e) for e in (eps if isinstance(eps, (list, tuple)) else (eps,)))


def points(config) -> list[dict]:
  """The sweep's params, in run order."""
  mechs = validate.subset_of(config, 'dp_audit.mechanisms', MECHANISMS)
  return [dict(mechanism=m, claimed_epsilon=e) for m in mechs for e in _epsilons(config)]


# ------------------------------------------------------------------------ declarations ---


def declaration(config, mechanism: str, claimed_epsilon: float) -> accounting.Declaration:
  """The mechanism's declaration as the game instantiates it (`fl_privacy.accounting`)."""
  s = config.dp_audit
  steps = s.epochs * (s.num_examples // s.batch_size)
  if mechanism == 'dp_sgd_poisson':
    return accounting.dp_sgd(batch_size=s.batch_size, num_examples=s.num_examples,
                             steps=steps, epochs=s.epochs, sampling='poisson')
  if mechanism == 'dp_sgd_shuffle':
    return accounting.dp_sgd(batch_size=s.batch_size, num_examples=s.num_examples,
                             steps=steps, epochs=s.epochs, sampling='shuffle')
  if mechanism == 'update_dp':
    return accounting.update_dp(rounds=s.rounds)
  if mechanism == 'central_dp':
    return accounting.server_dp('central_dp', rounds=s.rounds, num_clients=s.num_clients)
  if mechanism == 'weak_dp':
    return accounting.server_dp('weak_dp', rounds=s.rounds, num_clients=s.num_clients,
                                per_round=True)
  if mechanism == 'gaussian':
    return accounting.gaussian_input()
  if mechanism == 'ldp_sgd':
    return accounting.ldp_sgd(epsilon_per_report=claimed_epsilon / s.ldp_reports,
                              rounds=s.ldp_reports)
  raise ValueError(f'unknown mechanism {mechanism!r}')


def calibrate(config, mechanism: str, claimed_epsilon: float
              ) -> tuple[accounting.Declaration, float | None, float]:
  """(declaration, noise multiplier or None for pure DP, the accountant's epsilon)."""
  s = config.dp_audit
  decl = declaration(config, mechanism, claimed_epsilon)
  if decl.pure_epsilon is not None:
    return decl, None, accounting.epsilon(decl, delta=s.delta)
  z = accounting.noise_multiplier_for(decl, float(claimed_epsilon), delta=float(s.delta))
  return decl, z, accounting.epsilon(decl, z, delta=s.delta)


def declaration_from_metrics(mechanism: str, claimed_epsilon: float,
                             metrics: dict) -> accounting.Declaration:
  """The declaration a stored point was audited against (from its `dp_*` metrics)."""
  del mechanism
  pure = metrics.get('ldp_epsilon_per_report')
  return accounting.Declaration(
      metrics['dp_mechanism'], metrics['dp_unit'], metrics['dp_relation'],
      metrics['dp_adversary'], metrics['dp_sampling'], float(metrics['dp_sensitivity']),
      int(metrics['dp_compositions']), float(metrics['dp_sampling_rate']),
      population=metrics.get('dp_population'), sample_size=metrics.get('dp_sample_size'),
      pure_epsilon=None if pure is None else float(pure),
      note=f'as audited at claimed epsilon {claimed_epsilon:g}')


# ------------------------------------------------------------------------------ games ---


def known_contributions(count: int, dim: int, clip_norm: float) -> np.ndarray:
  """The other rows the adversary knows: fixed vectors on coordinates 1..d-1.

  Norms spread from C/2 to 2C, so the mechanism's clip acts on some of them as well; they
  are orthogonal to the canary, so the canary coordinate carries only the canary and noise.
  """
  if count == 0:
    return np.zeros((0, dim), np.float32)
  rng = np.random.default_rng(12345)
  g = rng.normal(size=(count, dim))
  g[:, 0] = 0.0
  g /= np.linalg.norm(g, axis=1, keepdims=True)
  g *= clip_norm * np.linspace(0.5, 2.0, count)[:, None]
  return g.astype(np.float32)


def canary_vector(dim: int, norm: float, sign: float = 1.0) -> jax.Array:
  """sign x norm x e_1 (the Dirac canary)."""
  return jnp.zeros((dim,), jnp.float32).at[0].set(sign * norm)


def poisson_llr(x: jax.Array, q: float, shift: float, sigma: jax.Array) -> jax.Array:
  """sum_t log(1 - q + q exp((x_t D - D^2 / 2) / s^2)): the log-likelihood ratio of T
  Poisson-subsampled Gaussian steps (canary in with probability q, shift D, noise s) vs
  no canary; the optimal statistic of the add/remove game."""
  a = (x * shift - 0.5 * shift**2) / sigma**2
  return jnp.sum(jnp.logaddexp(jnp.log1p(-q), jnp.log(q) + a), axis=-1)


def _fair_coin(world: Callable[..., jax.Array]):
  """A trial function: one game whose world (in or out) is a fair coin of the trial's key.

  Independent fair coins are what the one-run bounds of `auditing.audit_scores` assume
  (fixed numbers of in and out games would break them); n_in + n_out = trials.
  """
  def trial(key, index, *args):
    del index
    k_coin, k_game = jax.random.split(key)
    present = jax.random.bernoulli(k_coin)
    return {'present': present, 'score': world(k_game, present, *args)}
  return trial


def trial_fn(config, mechanism: str, extra: dict) -> Callable[..., Any]:
  """The mechanism's `trial_fn(key, index, strength) -> {'present': bool, 'score': float}`.

  `strength` is the traced noise multiplier actually run (calibrated z x noise_scale_factor)
  or, for ldp_sgd, the epsilon per report actually run; one compilation per mechanism.
  """
  s = config.dp_audit
  d, c = int(s.dimension), float(s.clip_norm)
  canary = float(s.canary_norm) * c
  if mechanism in ('dp_sgd_poisson', 'dp_sgd_shuffle'):
    b = int(s.batch_size)
    others = jnp.asarray(known_contributions(b - 1, d, c))
    poisson = mechanism == 'dp_sgd_poisson'
    steps = s.epochs * (s.num_examples // s.batch_size) if poisson else int(s.epochs)
    q = float(s.batch_size) / float(s.num_examples)

    def world(key, present, z):
      def step(t):
        k_sample, k_noise = jax.random.split(jax.random.fold_in(key, t))
        if poisson:   # add/remove: the canary joins each step with probability q
          row = canary_vector(d, canary)
          used = jnp.logical_and(present, jax.random.bernoulli(k_sample, q))
        else:         # replace-one: the canary's step holds +canary or -canary
          row = canary_vector(d, canary, 1.0) * jnp.where(present, 1.0, -1.0)
          used = jnp.asarray(True)
        batch = jnp.concatenate([row[None], others])
        mask = jnp.concatenate([used[None].astype(jnp.float32), jnp.ones((b - 1,))])
        # Poisson batches divide by the expected batch size, as the dp_sgd defense does;
        # times b, the step's noisy sum.
        g = dp.private_gradient(k_noise, batch, mask, c, z, denominator=float(b))
        return g[0] * b
      x = jax.vmap(step)(jnp.arange(steps))
      if poisson:
        return poisson_llr(x, q, c, z * c)
      return jnp.sum(x)
    return _fair_coin(world)

  if mechanism == 'update_dp':
    rounds = int(s.rounds)

    def world(key, present, z):
      delta = canary_vector(d, canary) * jnp.where(present, 1.0, -1.0)
      ups = jax.vmap(lambda t: dp.clip_and_noise_update(jax.random.fold_in(key, t), delta,
                                                        c, z))(jnp.arange(rounds))
      return jnp.sum(ups[:, 0])
    return _fair_coin(world)

  if mechanism in ('central_dp', 'weak_dp'):
    k = int(s.num_clients)
    rounds = int(s.rounds) if mechanism == 'central_dp' else 1
    others = jnp.asarray(known_contributions(k - 1, d, c))
    weights = jnp.asarray(np.linspace(1.0, 2.0, k), jnp.float32)  # sizes; DP-FedAvg ignores

    def world(key, present, z):
      row = canary_vector(d, canary) * jnp.where(present, 1.0, -1.0)
      uploads = jnp.concatenate([row[None], others])
      agg = jax.vmap(lambda t: dp.dp_fedavg(jax.random.fold_in(key, t), uploads, weights,
                                            c, z))(jnp.arange(rounds))
      return jnp.sum(agg[:, 0]) * k   # K x the mean: the noisy sum of clipped uploads
    return _fair_coin(world)

  if mechanism == 'gaussian':
    randomize = registry.randomizer('gaussian', sigma=float(extra['sigma']))

    def world(key, present, z):
      del z  # sigma is the randomizer's own (built from the calibrated z)
      x = canary_vector(d, c) * jnp.where(present, 1.0, 0.0)
      return randomize(key, x)[0]
    return _fair_coin(world)

  if mechanism == 'ldp_sgd':
    reports = int(s.ldp_reports)

    def world(key, present, eps):
      g = canary_vector(d, canary) * jnp.where(present, 1.0, -1.0)
      r = jax.vmap(lambda t: ldp_sgd.randomize(jax.random.fold_in(key, t), g, eps, c))(
          jnp.arange(reports))
      return jnp.sum(jnp.sign(r[:, 0]))
    return _fair_coin(world)
  raise ValueError(f'unknown mechanism {mechanism!r}')


# ----------------------------------------------------------------------------- bounds ---


def counted_bounds(mechanism: str) -> tuple[str, ...]:
  """The bounds of `BOUNDS` that are lower bounds of this mechanism's epsilon.

  `epsilon_gdp` and `epsilon_one_run_fdp` test Gaussian trade-off curves
  (`fl_privacy.eval.auditing`): lower bounds for the Gaussian compositions only. The
  Poisson-subsampled Gaussian and LDP-SGD's randomized response have other curves, on which
  they may exceed the true epsilon, so they are reported there but not counted.
  """
  if mechanism in NON_GAUSSIAN:
    return ('epsilon_cp', 'epsilon_one_run')
  return BOUNDS


def audit_bounds(in_scores, out_scores, *, delta: float, confidence: float) -> dict:
  """`auditing.audit_scores` (lower bounds of epsilon) as flat metrics."""
  found = auditing.audit_scores(in_scores, out_scores, delta=delta, confidence=confidence)
  return {k: (int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else
              float(v) if isinstance(v, (float, np.floating)) else v)
          for k, v in found.items()}


def best_bound(metrics: dict, mechanism: str) -> float:
  """The largest finite counted lower bound of epsilon (0 when none is)."""
  vals = [float(metrics[k]) for k in counted_bounds(mechanism) if k in metrics]
  vals = [v for v in vals if math.isfinite(v)]
  return max(vals + [0.0])


# ------------------------------------------------------------------------------ point ---


def audit_point(config, params: dict, key: jax.Array, fns: dict
                ) -> tuple[dict[str, Any], int]:
  """Calibrates one mechanism to its claim, plays the games, returns (metrics, trials)."""
  s = config.dp_audit
  mech, eps = params['mechanism'], float(params['claimed_epsilon'])
  decl, z, eps_acc = calibrate(config, mech, eps)
  factor = float(s.noise_scale_factor)
  metrics: dict[str, Any] = dict(accounting.describe(decl))
  metrics.update(dp_mechanism=decl.mechanism, dp_sensitivity=float(decl.sensitivity),
                 dp_population=decl.population, dp_sample_size=decl.sample_size)
  metrics.update(dp_delta=float(s.delta), dp_epsilon=eps_acc,
                 noise_multiplier=float('nan') if z is None else z,
                 noise_scale_factor=factor, canary_norm=float(s.canary_norm) * float(s.clip_norm),
                 clip_norm=float(s.clip_norm), dimension=int(s.dimension))
  extra = {}
  if z is not None:
    # The same claim under the PLD accountant: how much of the audit's gap to the claim
    # is the RDP accountant's own slack.
    metrics['dp_epsilon_pld'] = accounting.epsilon(decl, z, delta=float(s.delta),
                                                   accountant='pld')
  if z is None:  # pure DP: the randomizer runs at epsilon per report / factor
    strength = decl.pure_epsilon / factor
    metrics['ldp_epsilon_per_report'] = float(decl.pure_epsilon)
  else:
    strength = z * factor
    if mech == 'gaussian':
      # Inputs 0 and C e_1: sensitivity C, so sigma = z C.
      extra['sigma'] = strength * float(s.clip_norm)
      metrics['sigma'] = extra['sigma']
  if mech == 'gaussian':
    fn = trial_fn(config, mech, extra)   # sigma is baked into the randomizer
  else:
    fn = fns.setdefault(mech, trial_fn(config, mech, extra))
  out = runner.run_trials(fn, key, int(s.num_trials), args=(jnp.float32(strength),),
                          progress=False, **runner.options(config))
  present = np.asarray(out['present'], bool)
  scores = np.asarray(out['score'], np.float64)
  ins, outs = scores[present], scores[~present]
  validate.require(len(ins) > 0 and len(outs) > 0, 'dp_audit.num_trials',
                   'large enough for games in both worlds', int(s.num_trials))
  bounds = audit_bounds(ins, outs, delta=float(s.delta), confidence=float(s.confidence))
  metrics.update(bounds)
  best = best_bound(bounds, mech)
  if 'dp_epsilon_pld' in metrics:
    # Against the mechanism's (near) exact epsilon: the audit's own slack, without the RDP
    # accountant's.
    metrics['tightness_pld'] = best / float(metrics['dp_epsilon_pld'])
  metrics.update(best_bound=best, tightness=best / eps,
                 privacy_violation=float(best > eps),
                 counted_bounds=','.join(counted_bounds(mech)),
                 # The table's GDP column: only where it is a bound (Gaussian curves).
                 epsilon_gdp_if_gaussian=(bounds['epsilon_gdp'] if mech not in NON_GAUSSIAN
                                          else float('nan')),
                 confidence=float(s.confidence),
                 score_in_mean=float(np.mean(ins)), score_out_mean=float(np.mean(outs)))
  if mech == s.profile_mechanism and math.isclose(eps, float(s.profile_epsilon)):
    grid = [float(g) * eps for g in PROFILE_GRID]
    metrics['profile_epsilons'] = grid
    metrics['profile_delta_lower'] = [float(v) for v in auditing.privacy_profile(
        ins, outs, grid, confidence=float(s.confidence))]
  return metrics, int(s.num_trials)


# ------------------------------------------------------------------------------ sweep ---


def sweep(config, state, store, key) -> None:
  """Runs every point the store lacks, then draws the figures.

  Args:
    config: the validated config (see `prepare`).
    state: what `prepare(config)` returned.
    store: the run's `fl_privacy.report.ResultsStore`.
    key: the run's PRNG key; every point draws from its own stream (`report.point_key`).
  """
  del state
  todo = points(config)
  progress.plan(len(todo))
  fns: dict = {}
  for params in todo:
    point_key = report.point_key(key, params)
    metrics = report.run_point(
        store, params, lambda p=params, k=point_key: audit_point(config, p, k, fns))
    if float(metrics.get('privacy_violation', 0.0)) > 0:
      logging.error(
          'PRIVACY VIOLATION: %s claims epsilon %.3g (delta %.3g) but the audit certifies '
          'more: best %.0f%% lower bound %.3f (%s)', params['mechanism'],
          params['claimed_epsilon'], config.dp_audit.delta, 100 * config.dp_audit.confidence,
          float(metrics['best_bound']),
          ', '.join(f'{k} {float(metrics[k]):.3f}' for k in BOUNDS if k in metrics))
  dp_audit_figures.draw_figures(store.points, store.workdir, config)
