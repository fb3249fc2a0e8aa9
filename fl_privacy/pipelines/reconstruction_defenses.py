"""The defense sweep of the reconstruction pipeline (`fl_privacy.pipelines.reconstruction`).

Which defenses it may sweep (those that act against the server reading uploads, with a
parameter to sweep), their validation, the sweep's points, and each defense built once for the
setting it runs in: the attacked round (one client, one round of E x J steps of B) or the
utility training (its rounds), so that the epsilon labels are those of the run they describe.
"""

from __future__ import annotations

import math

from dp_accounting.pld import privacy_loss_distribution

from fl_privacy import defenses
from fl_privacy import validate

NAME = PREFIX = 'reconstruction'

# The parameter swept for the input and report mechanisms, which declare no `strength` in the
# registry (FedMIA does not sweep them): their privacy parameter. The Gaussian input mechanism
# is swept by its nominal epsilon (sigma = sqrt(2 ln(1.25 / delta)) Delta / epsilon, the AMI
# paper's calibration) and labelled with the epsilon dp-accounting gives for that sigma.
SWEPT = {'bitrand': 'epsilon', 'ome': 'epsilon', 'gaussian': 'epsilon', 'ldp_sgd': 'epsilon'}


def swept_param(name: str) -> str:
  """The `make` parameter a sweep of defense `name` varies."""
  return defenses.DEFENSES[name].strength or SWEPT[name]


def sweepable() -> tuple[str, ...]:
  """Defenses the sweep may name: every one but `none` that acts against the server (the
  aggregate-only `central_dp` and `weak_dp` are refused) and has a parameter to sweep."""
  return tuple(n for n, d in defenses.DEFENSES.items()
               if n != 'none' and d.protects != 'aggregate' and (d.strength or n in SWEPT))


def validate_sweep(sweep) -> None:
  """Names in `sweepable()` (an aggregate-only DP defense is refused with the reason), every
  strength by the rule of the field its parameter reads."""
  for name in sweep.keys():
    field = f'{PREFIX}.defenses.{name}'
    if name in defenses.DEFENSES:
      defenses.registry.check_fits(name, NAME, field)
    validate.require(name in sweepable(), field, f'a defense name, one of {sweepable()}', name)
    values = sweep[name]
    values = (values,) if isinstance(values, (int, float)) else tuple(values)
    d = defenses.DEFENSES[name]
    param = swept_param(name)
    rule = defenses.registry.FIELDS[d.params.get(param, param)].rule
    validate.require(all(rule.ok(v) for v in values), field,
                     f'each {rule.allowed} (empty: not swept)', sweep[name])


def sweep_points(config) -> list[dict]:
  """The defense sweep: {defense, strength, dp_sgd_sampling?} in config order."""
  s = config.reconstruction
  out = []
  for name in s.defenses.keys():
    values = s.defenses[name]
    values = (values,) if isinstance(values, (int, float)) else tuple(values)
    samplings = tuple(s.dp_sgd_samplings) if name == 'dp_sgd' else (None,)
    for sampling in samplings:
      for v in values:
        d = dict(defense=name, strength=int(v) if name in ('quantize', 'augment') else float(v))
        if sampling is not None:
          d['dp_sgd_sampling'] = sampling
        out.append(d)
  return out


def _setting(state, batch_size: int, num_examples: int, epochs: int, steps: int
             ) -> defenses.Setting:
  pool = state['pool']
  return defenses.Setting(num_classes=int(pool.num_classes),
                          image_shape=pool.x.shape[1:] if pool.is_image else None,
                          batch_size=batch_size, num_examples=num_examples, epochs=epochs,
                          steps_per_epoch=steps, rounds=1)


def attack_setting(config, state, attack: str, p: dict | None = None) -> defenses.Setting:
  """One client, one round of E x J steps of B (the round the server attacks)."""
  s = config.reconstruction
  b = int(s.center[attack]) if p is None else p['batch_size']
  j = int(s.center.num_batches) if p is None else p['num_batches']
  e = int(s.center.epochs) if p is None else p['epochs']
  return _setting(state, b, b * j, e, j)


def utility_setting(config, state) -> defenses.Setting:
  u = config.reconstruction.utility
  b = int(config.reconstruction.center.imprint)
  setting = _setting(state, b, int(u.examples), 1, -(-int(u.examples) // b))
  return setting._replace(rounds=int(u.rounds))


def base_defense(config, state, p: dict) -> defenses.Configured:
  """The `defense` section built for grid point `p`, once."""
  cache = state.setdefault('base_defenses', {})
  key = tuple(sorted(p.items()))
  if key not in cache:
    cache[key] = defenses.configure(config.defense, attack_setting(config, state, p['attack'], p),
                                    experiment=NAME)
  return cache[key]


def swept_defense(config, state, d: dict, setting: defenses.Setting) -> defenses.Configured:
  """Swept defense `d` (`sweep_points`) built for `setting`, once."""
  cache = state.setdefault('swept', {})
  key = (tuple(sorted(d.items())), setting)
  if key not in cache:
    s = config.reconstruction
    fixed = {} if defenses.DEFENSES[d['defense']].strength else {
        swept_param(d['defense']): d['strength']}
    if d['defense'] in defenses.DP_DEFENSES or d['defense'] == 'ldp_sgd':
      fixed['clip_norm'] = float(s.dp_clip)
    if d['defense'] == 'gaussian':
      fixed.update(delta=float(s.dp_delta), sensitivity=input_diameter(setting))
    if 'dp_sgd_sampling' in d:
      fixed['sampling'] = d['dp_sgd_sampling']
    conf = defenses.configured.sweep_point(
        d['defense'], d['strength'], setting, experiment=NAME, prefix=f'{PREFIX}.defenses',
        fixed=fixed, delta=float(s.dp_delta))
    if d['defense'] == 'gaussian':
      conf = conf._replace(metrics=gaussian_epsilon(d['strength'], setting, float(s.dp_delta)))
    elif swept_param(d['defense']) == 'epsilon' and not conf.metrics:
      # An input mechanism's epsilon is its guarantee per release of an example (pure LDP, no
      # accounting; LDP-SGD's per release of the client's whole upload).
      conf = conf._replace(metrics={'ldp_epsilon': float(d['strength'])})
    if 'ldp_epsilon' in conf.metrics:
      # The epsilon above is per release; the run releases each example (an input mechanism:
      # every epoch of every round) or the client's update (LDP-SGD: every round) this often,
      # so by basic composition its guarantee is at most that many times the epsilon.
      per_round = 1 if d['defense'] == 'ldp_sgd' else int(setting.epochs)
      conf = conf._replace(metrics={**conf.metrics,
                                    'ldp_releases': per_round * int(setting.rounds)})
    cache[key] = conf
  return cache[key]


def input_diameter(setting: defenses.Setting) -> float:
  """The L2 distance between the two inputs furthest apart: sqrt(d) x the value range. The
  Gaussian input mechanism's sensitivity for replace-one on any two inputs of the data's box
  (not only on inputs within distance 1 of each other)."""
  lo, hi = setting.value_range
  return math.sqrt(math.prod(setting.image_shape)) * (hi - lo)


def gaussian_epsilon(nominal: float, setting: defenses.Setting, delta: float) -> dict:
  """The Gaussian input mechanism's labels: the nominal epsilon swept and the epsilon at
  `delta` that dp-accounting's privacy-loss distribution gives for its sigma (one release of
  one example, replace-one over the input box, against the server): the nominal calibration
  is a guarantee only for epsilon < 1 (`mechanisms.gaussian.sigma_for`)."""
  from fl_privacy.mechanisms import gaussian  # pylint: disable=g-import-not-at-top
  diameter = input_diameter(setting)
  sigma = gaussian.sigma_for(float(nominal), delta, diameter)
  # The privacy loss spans about (diameter / sigma)^2: dp-accounting's default grid (1e-4)
  # over that range needs 1e6 points at nominal epsilon 100 and 1e13 (31 TiB) at 1e5. A coarser
  # grid keeps about 1e5 points; the pessimistic estimate (the default) stays an upper bound.
  interval = max(1e-4, (diameter / sigma) ** 2 / 1e5)
  pld = privacy_loss_distribution.from_gaussian_mechanism(
      standard_deviation=sigma / diameter, sensitivity=1.0,
      value_discretization_interval=interval)
  return {'ldp_epsilon': float(pld.get_epsilon_for_delta(delta)), 'ldp_delta': delta,
          'ldp_epsilon_nominal': float(nominal), 'gaussian_sigma': float(sigma)}
