"""From a `defense` config section (configs/_defense.py) to hooks, point params and metrics.

`validate_section` checks every field by its one rule in `registry.FIELDS` before any work
(ConfigError naming `defense.<field>`); `configure` refuses a defense that does not act
against the experiment's adversary (`registry.check_fits`), builds the named defense's hooks,
the flat params a results point carries (`defense` and `defense_<field>` for each field the
defense uses) and its metrics: for the DP defenses the noise multiplier (given, or found by
the accountant for `target_epsilon`), the epsilon it spends and the declaration behind it
(`dp_unit`, `dp_relation`, `dp_adversary`, `dp_sampling`, ...; `fl_privacy.accounting`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from fl_privacy import accounting
from fl_privacy import validate
from fl_privacy.defenses import registry
from fl_privacy.fl import client

Setting = registry.Setting


class Configured(NamedTuple):
  """A configured defense.

  Attributes:
    hooks: the `fl.client.ClientHooks`.
    params: flat dict for a results point: `defense` and `defense_<field>`.
    metrics: flat dict: the DP defenses' `noise_multiplier`, `dp_epsilon`, `dp_delta` and
      declaration (`dp_epsilon_per_round` for weak_dp), else empty.
    declaration: the `accounting.Declaration` of a DP defense, else None.
  """
  hooks: client.ClientHooks
  params: dict[str, Any]
  metrics: dict[str, Any]
  declaration: Any = None


def section_fields() -> dict[str, registry.Field]:
  """The fields a `defense` section carries (every `registry.FIELDS` entry read from it)."""
  return {k: f for k, f in registry.FIELDS.items() if f.section}


def validate_section(section, prefix: str = 'defense') -> str:
  """Checks every field of the section (whatever the name); returns the defense's name."""
  name = section.name
  validate.choice(registry.NAMES).check(f'{prefix}.name', name)
  for field, f in section_fields().items():
    if field in section:
      f.rule.check(f'{prefix}.{field}', section[field])
  return name


def check_honoured(section, experiment: str, honoured: tuple[str, ...], reason: str,
                   prefix: str = 'defense') -> str:
  """Refuses a defense `experiment` does not apply (named with `reason`), or that does not
  act against its adversary; returns the name."""
  name = validate_section(section, prefix)
  validate.require(name in honoured, f'{prefix}.name',
                   f'one of {honoured} for experiments.{experiment} ({reason})', name)
  registry.check_fits(name, experiment, f'{prefix}.name')
  return name


def _build_dp(name: str, kwargs: dict[str, Any], setting: Setting, noise_multiplier,
              target_epsilon, delta: float, accountant: str,
              target_field: str = 'defense.target_epsilon'):
  """(hooks, metrics, declaration) of DP defense `name`: the Poisson batch sized for the run,
  the noise multiplier given or calibrated, the epsilon of its declaration. Every field is
  already checked; the builder gets the accountant's z. A target epsilon no noise multiplier
  reaches raises `ConfigError(target_field)`."""
  if name == 'dp_sgd' and kwargs.get('sampling') == 'poisson':
    kwargs['max_batch_size'] = registry.poisson_max_batch(setting)
  try:
    z, metrics = registry.dp_metrics(name, kwargs, setting, noise_multiplier=noise_multiplier,
                                     target_epsilon=target_epsilon, delta=delta,
                                     accountant=accountant)
  except accounting.UnreachableTargetError as e:
    raise validate.ConfigError(
        target_field, f'None or below {e.max_epsilon:.4g} for {name} here (the epsilon of '
        f'the least noise calibrated, multiplier {accounting.MIN_NOISE_MULTIPLIER:g}; a larger '
        'target asks for no noise)', e.target_epsilon) from e
  decl = registry.declaration(name, kwargs, setting)
  kwargs['noise_multiplier'] = z
  kwargs.pop('participation', None)
  return registry.DEFENSES[name].build(**kwargs), metrics, decl


def configure(section, setting: Setting, *, experiment: str,
              prefix: str = 'defense') -> Configured:
  """The defense named in `section`, built for an experiment's setting.

  Args:
    section: the `defense` ConfigDict.
    setting: `registry.Setting` of the experiment (classes, image shape, batch size, the
      smallest client's records, epochs, steps per epoch, rounds, clients).
    experiment: the experiment's name (`registry.ADVERSARY` says whom it must protect from).
    prefix: field prefix in error messages.

  Returns:
    `Configured`.
  """
  name = validate_section(section, prefix)
  registry.check_fits(name, experiment, f'{prefix}.name')
  d = registry.DEFENSES[name]
  params: dict[str, Any] = {'defense': name}
  kwargs: dict[str, Any] = {}
  for param, field in d.params.items():
    if registry.FIELDS[field].section:
      kwargs[param] = section[field]
      params[f'defense_{field}'] = section[field]
    elif field in setting._fields:
      kwargs[param] = getattr(setting, field)
  if 'pad' in kwargs and kwargs['pad'] is None:
    kwargs['pad'] = registry.default_pad(setting.image_shape)
    params['defense_augment_pad'] = kwargs['pad']
  metrics: dict[str, Any] = {}
  decl = None
  if name in registry.DP_DEFENSES:
    delta, acc = float(section.delta), section.accountant
    kwargs['participation'] = float(section.participation)
    target = section.target_epsilon
    hooks, metrics, decl = _build_dp(name, kwargs, setting,
                                     float(section.noise_multiplier), target, delta, acc,
                                     target_field=f'{prefix}.target_epsilon')
    if target is not None:
      del params['defense_noise_multiplier']
      params['defense_target_epsilon'] = float(target)
    params['defense_delta'] = delta
  else:
    hooks = registry.make(name, field_prefix=prefix, **kwargs)
  return Configured(hooks=hooks, params=params, metrics=metrics, declaration=decl)


def validate_sweep(sweep, allowed: tuple[str, ...], prefix: str) -> None:
  """A defense sweep `{name: strengths}` (FedMIA's): names in `allowed`, every strength
  checked by the rule of the field its defense sweeps (`registry.Defense.strength`)."""
  for name in sweep.keys():
    validate.require(name in allowed, f'{prefix}.{name}', f'a defense name, one of {allowed}',
                     name)
    d = registry.DEFENSES[name]
    values = sweep[name]
    values = (values,) if isinstance(values, (int, float)) else tuple(values)
    rule = registry.FIELDS[d.params[d.strength]].rule
    validate.require(len(values) > 0, f'{prefix}.{name}', f'non-empty, each {rule.allowed}',
                     sweep[name])
    for v in values:
      validate.require(rule.ok(v), f'{prefix}.{name}', f'each {rule.allowed}', sweep[name])


def sweep_point(name: str, value: Any, setting: Setting, *, experiment: str, prefix: str,
                fixed: dict[str, Any] | None = None, delta: float = 1e-5,
                accountant: str = 'rdp', target_epsilon: float | None = None) -> Configured:
  """Defense `name` at strength `value` (its `strength` parameter) for one sweep point.

  `fixed` holds the other parameters the sweep sets (e.g. the clip norm); the rest come from
  `setting` or the defense's defaults. A DP defense's metrics are those `configure` gives;
  with `target_epsilon` its noise multiplier is calibrated instead of taken from `value`.
  """
  d = registry.spec(name, f'{prefix}.name')
  registry.check_fits(name, experiment, f'{prefix}.name')
  kwargs: dict[str, Any] = dict(fixed or {})
  if value is not None and d.strength is not None:
    kwargs[d.strength] = value
  for param, field in d.params.items():
    if param not in kwargs and not registry.FIELDS[field].section and field in setting._fields:
      kwargs[param] = getattr(setting, field)
  if 'pad' in d.params and kwargs.get('pad') is None:
    kwargs['pad'] = registry.default_pad(setting.image_shape)
  params: dict[str, Any] = {'defense': name}
  metrics: dict[str, Any] = {}
  decl = None
  if name in registry.DP_DEFENSES:
    hooks, metrics, decl = _build_dp(name, kwargs, setting, kwargs.get('noise_multiplier'),
                                     target_epsilon, delta, accountant)
  else:
    hooks = registry.make(name, field_prefix=f'{prefix}.{name}', **kwargs)
  return Configured(hooks=hooks, params=params, metrics=metrics, declaration=decl)
