"""The DP audit as library code: every DP mechanism fl-privacy ships, against its own claim.

What `python -m experiments.dp_audit` runs. For each mechanism and claimed epsilon the
mechanism is calibrated with `fl_privacy.accounting` (its declaration: unit, relation,
adversary, sampling, compositions, built by the defense registry as the experiments build
theirs, `declaration`) and then audited by the strongest canary game its
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
as an error, `privacy_violation = 1`). The games, their scores and the choice of the bounds
that count are `fl_privacy.attacks.audit.dp_canary`; this module calibrates, runs and stores.

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
from fl_privacy.attacks.audit import dp_canary
from fl_privacy.eval import auditing
from fl_privacy.eval import runner
from fl_privacy.pipelines import base
from fl_privacy.pipelines import dp_audit_figures
from fl_privacy.report import summary


NAME = 'dp_audit'
MECHANISMS = dp_canary.MECHANISMS
# The lower bounds `audit_scores` returns, in the order the table shows them.
BOUNDS = dp_canary.BOUNDS
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


def validate_config(config) -> tuple[str, ...]:
  """Checks every field the experiment reads; returns the mechanisms to audit."""
  if 'defense' in config:
    defenses.check_honoured(config.defense, 'dp_audit', ('none',), 'it audits every DP '
                            'mechanism itself (dp_audit.mechanisms)')
  mechanisms = validate.subset_of(config, 'dp_audit.mechanisms', MECHANISMS)
  # The claims are the defense registry's fields, each read through its one rule.
  validate.check_all(config, {'dp_audit.epsilons': defenses.registry.each('epsilon'),
                              'dp_audit.delta': defenses.registry.rule('delta'),
                              'dp_audit.clip_norm': defenses.registry.rule('clip_norm')})
  validate.in_range(config, 'dp_audit.epsilons', 0.0, MAX_EPSILON, low_inclusive=False)
  # audit_scores' Clopper-Pearson and GDP bounds need a significance below 1/2.
  validate.in_range(config, 'dp_audit.confidence', 0.5, 1.0, low_inclusive=False,
                    high_inclusive=False)
  validate.checked(config, 'dp_audit.num_trials', validate.trials())
  validate.checked(config, 'dp_audit.dimension', validate.number(2, integer=True))
  s = config.dp_audit
  validate.checked(config, 'dp_audit.canary_norm',
                   validate.number(1, words='in units of the clip norm'))
  for field in ('num_examples', 'batch_size', 'epochs', 'rounds', 'num_clients',
                'ldp_reports'):
    validate.checked(config, f'dp_audit.{field}', validate.number(1, integer=True))
  validate.checked(config, 'dp_audit.batch_size', validate.Rule(
      f'below num_examples ({s.num_examples}): Poisson sampling needs q < 1',
      lambda b: b < s.num_examples))
  validate.positive(config, 'dp_audit.noise_scale_factor')
  validate.checked(config, 'dp_audit.profile_mechanism', validate.choice(MECHANISMS))
  validate.positive(config, 'dp_audit.profile_epsilon')
  runner.validate_options(config)
  return mechanisms


# The fields only some mechanisms' games and declarations read (`unused_fields`).
_READERS = {
    'num_examples': ('dp_sgd_poisson', 'dp_sgd_shuffle'),
    'batch_size': ('dp_sgd_poisson', 'dp_sgd_shuffle'),
    'epochs': ('dp_sgd_poisson', 'dp_sgd_shuffle'),
    'rounds': ('update_dp', 'central_dp', 'weak_dp'),
    'num_clients': ('central_dp', 'weak_dp'),
    'ldp_reports': ('ldp_sgd',),
}


def unused_fields(config) -> dict[str, str]:
  """The `dp_audit` fields no audited mechanism reads (`base.unused`: a command-line override of
  one is refused rather than recorded as if it ran). {} for a config validation refuses."""
  try:
    chosen = set(config.dp_audit.mechanisms)
  except TypeError:
    return {}
  return {f'dp_audit.{f}': f'read only by dp_audit.mechanisms {" or ".join(names)}, which '
                           'this run does not audit'
          for f, names in _READERS.items() if not chosen & set(names)}


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


# Each audited mechanism as the defense registry names it (`defenses.registry.DEFENSES`) and
# the registry params it is declared with; both DP-SGD samplings are the one 'dp_sgd' defense.
DEFENSE = {'dp_sgd_poisson': ('dp_sgd', {'sampling': 'poisson'}),
           'dp_sgd_shuffle': ('dp_sgd', {'sampling': 'shuffle'}),
           'update_dp': ('update_dp', {}), 'central_dp': ('central_dp', {}),
           'weak_dp': ('weak_dp', {}), 'gaussian': ('gaussian', {}),
           'ldp_sgd': ('ldp_sgd', {})}


def registry_args(config, mechanism: str, claimed_epsilon: float
                  ) -> tuple[str, dict, defenses.registry.Setting]:
  """(defense name, params, `registry.Setting`) of `mechanism` as the game instantiates it.

  The game runs one training (DP-SGD: `epochs` over `num_examples` records, batches of
  `batch_size`), so DP-SGD's Setting has rounds = 1 (the registry composes epochs x rounds);
  update_dp, central_dp and weak_dp run `rounds` rounds with all `num_clients` clients taking
  part; LDP-SGD's `ldp_reports` reports are its rounds, each at claim / reports.
  """
  s = config.dp_audit
  if mechanism not in DEFENSE:
    raise ValueError(f'unknown mechanism {mechanism!r}')
  name, params = DEFENSE[mechanism]
  params = dict(params)
  if name == 'dp_sgd':
    setting = defenses.registry.Setting(
        batch_size=int(s.batch_size), num_examples=int(s.num_examples), epochs=int(s.epochs),
        steps_per_epoch=int(s.num_examples) // int(s.batch_size), rounds=1)
  elif name == 'ldp_sgd':
    params['epsilon'] = float(claimed_epsilon) / int(s.ldp_reports)
    setting = defenses.registry.Setting(rounds=int(s.ldp_reports))
  else:
    setting = defenses.registry.Setting(rounds=int(s.rounds), num_clients=int(s.num_clients),
                                        participants=int(s.num_clients))
  return name, params, setting


def declaration(config, mechanism: str, claimed_epsilon: float) -> accounting.Declaration:
  """The mechanism's declaration as the game instantiates it: the defense registry's
  (`defenses.registry.declaration`) for the `registry_args` of the config."""
  return defenses.registry.declaration(*registry_args(config, mechanism, claimed_epsilon))


def calibrate(config, mechanism: str, claimed_epsilon: float
              ) -> tuple[accounting.Declaration, float | None, float]:
  """(declaration, noise multiplier or None for pure DP, the accountant's epsilon)."""
  s = config.dp_audit
  decl = declaration(config, mechanism, claimed_epsilon)
  if decl.pure_epsilon is not None:
    return decl, None, accounting.epsilon(decl, delta=s.delta)
  z = accounting.noise_multiplier_for(decl, float(claimed_epsilon), delta=float(s.delta))
  return decl, z, accounting.epsilon(decl, z, delta=s.delta)


# ------------------------------------------------------------------------------ games ---


def trial_fn(config, mechanism: str, extra: dict) -> Callable[..., Any]:
  """`attacks.audit.dp_canary.trial_fn` with the config's game settings.

  `extra` holds what the point calibrated for the game (`sigma` for 'gaussian').
  """
  s = config.dp_audit
  return dp_canary.trial_fn(
      mechanism, dimension=int(s.dimension), clip_norm=float(s.clip_norm),
      canary_norm=float(s.canary_norm), batch_size=int(s.batch_size),
      num_examples=int(s.num_examples), epochs=int(s.epochs), rounds=int(s.rounds),
      num_clients=int(s.num_clients), ldp_reports=int(s.ldp_reports),
      sigma=extra.get('sigma'))


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
  # The bounds choose their threshold on half of each world's games ('split').
  validate.require(auditing.split_possible(len(ins), len(outs)), 'dp_audit.num_trials',
                   'large enough for 2 games in each world', int(s.num_trials))
  # The claim's whole privacy profile (the accountant's), against which the non-Gaussian
  # mechanisms are also tested (dp_canary.claim_metrics).
  profile = lambda grid: accounting.delta_curve(decl, z, grid)
  metrics.update(dp_canary.claim_metrics(ins, outs, mech, eps, delta=float(s.delta),
                                         confidence=float(s.confidence),
                                         pld_epsilon=metrics.get('dp_epsilon_pld'),
                                         claimed_delta=profile))
  if mech == s.profile_mechanism and math.isclose(eps, float(s.profile_epsilon)):
    grid = [float(g) * eps for g in PROFILE_GRID]
    metrics['profile_epsilons'] = grid
    metrics['profile_delta_lower'] = [float(v) for v in auditing.privacy_profile(
        ins, outs, grid, confidence=float(s.confidence))]
  return metrics, int(s.num_trials)


# ------------------------------------------------------------------------------ sweep ---


def _report_violation(config, params: dict, metrics) -> None:
  if float(metrics.get('privacy_violation', 0.0)) > 0:
    logging.error(
        'PRIVACY VIOLATION: %s claims epsilon %.3g (delta %.3g) but the audit certifies '
        'more: lower bound %.3f at family-wise confidence %g%% (the largest counted bound, '
        'each at %.4g%%, rule %s); each bound at %g%%: %s', params['mechanism'],
        params['claimed_epsilon'], config.dp_audit.delta, float(metrics['best_bound']),
        # A point stored before the family-wise verdict has no verdict_* fields: NaN / 'none'.
        100 * float(metrics.get('verdict_confidence', 'nan')),
        100 * float(metrics.get('verdict_bound_confidence', 'nan')),
        metrics.get('verdict_rule', 'none'),
        100 * config.dp_audit.confidence,
        ', '.join(f'{k} {float(metrics[k]):.3f}' for k in BOUNDS if k in metrics))


def plan(config, state, store, key) -> list[base.Point]:
  """One point per (mechanism, claimed epsilon), each drawing from its own stream
  (`report.point_key`); a violation is logged whether the point is new or read back."""
  del state, store
  fns: dict = {}
  return [base.Point(p, lambda p=p, k=report.point_key(key, p): audit_point(config, p, k, fns),
                     after=lambda m, p=p: _report_violation(config, p, m))
          for p in points(config)]


def figures(config, state, store, key) -> None:
  del state, key
  dp_audit_figures.draw_figures(store.points, store.workdir, config)
