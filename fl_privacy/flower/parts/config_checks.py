"""The `flower_audit` section's DP settings and canary-game sizes, checked by their rules.

`check_setting(name, s, section, nodes)`: one `dp.settings` / `training.settings` entry checked
by its wrapper's fields and turned into a `dp_setting.Setting`; `check_training(config)`: the
`training` section's canary design (client sampling and trained real nodes included) and
settings. Split out of `flower.pipeline` (whose
`validate_config` calls them) to keep the pipeline within its 350 lines.
"""

from __future__ import annotations

from fl_privacy import validate
from fl_privacy.flower.audits import canary_design
from fl_privacy.flower.audits import dp_setting


WRAPPERS = dp_setting.WRAPPERS

POSITIVE_INT = validate.number(1, integer=True)
_CENTRAL_FIELDS = ('noise_multiplier', 'num_sampled_clients')
_ADAPTIVE_FIELDS = _CENTRAL_FIELDS + ('target_clipped_quantile', 'clip_norm_lr')
_LOCAL_FIELDS = ('sensitivity', 'epsilon')


_POSITIVE = validate.number(0, low_open=True)
_SETTING_RULES = {
    'wrapper': validate.choice(WRAPPERS),
    'clipping_norm': _POSITIVE,
    'delta': validate.number(0, 1, low_open=True, high_open=True),
    'noise_multiplier': _POSITIVE,
    'num_sampled_clients': POSITIVE_INT,
    'sensitivity': _POSITIVE,
    'epsilon': _POSITIVE,
    'target_clipped_quantile': validate.number(0, 1),
    'clip_norm_lr': _POSITIVE,
    'clipped_count_stddev': validate.number(0, low_open=True, optional=True),
}
_PRESENT = validate.Rule('set (the wrapper reads it; configs/_flower_audit.py)',
                         lambda v: v is not None)


def check_setting(name: str, s, section: str = 'dp', nodes: int = 0) -> dp_setting.Setting:
  """One `<section>.settings` entry checked by its wrapper's rules, as a `dp_setting.Setting`
  (`training`: no `num_sampled_clients`, which is `nodes`, the nodes FedAvg samples a
  round)."""
  prefix = f'flower_audit.{section}.settings.{name}'
  _PRESENT.check(f'{prefix}.wrapper', s.get('wrapper'))
  _SETTING_RULES['wrapper'].check(f'{prefix}.wrapper', s.wrapper)
  fields = ('clipping_norm', 'delta') + {'local_dp': _LOCAL_FIELDS}.get(
      s.wrapper, _ADAPTIVE_FIELDS if s.wrapper in dp_setting.ADAPTIVE else _CENTRAL_FIELDS)
  if section == 'training':
    fields = tuple(f for f in fields if f != 'num_sampled_clients')
  for field in fields:
    _PRESENT.check(f'{prefix}.{field}', s.get(field))
    _SETTING_RULES[field].check(f'{prefix}.{field}', s.get(field))
  kw = {f: (int(s[f]) if f == 'num_sampled_clients' else float(s[f])) for f in fields}
  if section == 'training':
    kw['num_sampled_clients'] = int(nodes)
  if s.wrapper in dp_setting.ADAPTIVE:
    std = s.get('clipped_count_stddev')
    _SETTING_RULES['clipped_count_stddev'].check(f'{prefix}.clipped_count_stddev', std)
    kw['clipped_count_stddev'] = None if std is None else float(std)
  setting = dp_setting.Setting(name, s.wrapper, **kw)
  if s.wrapper in dp_setting.ADAPTIVE:
    # Flower refuses z >= 2 clipped_count_stddev (default num_sampled_clients / 20).
    validate.Rule('below 2 x clipped_count_stddev (default num_sampled_clients / 20), which '
                  'Flower\'s adaptive wrappers require', lambda z: adaptive_ok(setting)).check(
                      f'{prefix}.noise_multiplier', s.noise_multiplier)
  return setting


def adaptive_ok(setting: dp_setting.Setting) -> bool:
  try:
    dp_setting.adaptive_noise(setting)
  except ValueError:
    return False
  return True


def check_training(config) -> tuple[canary_design.Design, list[dp_setting.Setting]]:
  """The `training` section: the canary game's sizes and its settings."""
  t = config.flower_audit.training
  for field in ('num_canaries', 'num_rounds', 'dimension', 'num_null'):
    validate.checked(config, f'flower_audit.training.{field}', POSITIVE_INT)
  validate.checked(config, 'flower_audit.training.num_canaries', validate.number(
      2, integer=True, words='two canaries at least (one per world)'))
  validate.checked(config, 'flower_audit.training.num_real', validate.number(0, integer=True))
  validate.checked(config, 'flower_audit.training.canary_norm',
                   validate.number(1, words='in units of the clip norm, >= 1'))
  validate.checked(config, 'flower_audit.training.real_norm', _POSITIVE)
  validate.checked(config, 'flower_audit.training.confidence',
                   validate.number(0.5, 1, low_open=True, high_open=True))
  validate.one_of(config, 'flower_audit.training.directions', canary_design.DIRECTIONS)
  if t.directions == 'dirac':
    validate.checked(config, 'flower_audit.training.dimension', validate.Rule(
        f'above num_canaries + num_null ({int(t.num_canaries) + int(t.num_null)}) with '
        'Dirac canaries', lambda d: int(d) > int(t.num_canaries) + int(t.num_null)))
  nodes = int(t.num_canaries) + int(t.num_real)
  validate.checked(config, 'flower_audit.training.fraction_train',
                   validate.number(0, 1, low_open=True))
  validate.checked(config, 'flower_audit.training.fraction_train', validate.Rule(
      f'at least one node a round: int({nodes} nodes x fraction_train) >= 1',
      lambda q: int(nodes * float(q)) >= 1))
  validate.one_of(config, 'flower_audit.training.real_clients', canary_design.REAL_CLIENTS)
  if t.real_clients == 'trained':
    validate.checked(config, 'flower_audit.training.dimension', validate.Rule(
        f'at least {canary_design.MIN_TRAINED_DIMENSION} with trained real clients (the digits '
        'MLP 64 -> h -> 10 with h >= 1)',
        lambda d: int(d) >= canary_design.MIN_TRAINED_DIMENSION))
  design = canary_design.Design(
      num_canaries=int(t.num_canaries), num_real=int(t.num_real), num_rounds=int(t.num_rounds),
      dimension=int(t.dimension), canary_norm=float(t.canary_norm),
      real_norm=float(t.real_norm), num_null=int(t.num_null),
      confidence=float(t.confidence), directions=str(t.directions),
      fraction_train=float(t.fraction_train), real_clients=str(t.real_clients))
  # Every wrapper's num_sampled_clients is the nodes FedAvg samples a round (k = n at q = 1).
  settings = [check_setting(name, t.settings[name], 'training', design.sample_size)
              for name in t.settings.keys()]
  settings.sort(key=lambda st: (WRAPPERS.index(st.wrapper), st.label))
  validate.checked(config, 'flower_audit.training.settings', validate.Rule(
      'at least one setting when parts has training', lambda v: bool(settings)))
  return design, settings
