"""From a `defense` config section (configs/_defense.py) to hooks, point params and metrics.

`validate_section` checks every field before any work (ConfigError naming `defense.<field>`);
`configure` builds the named defense's hooks, the flat params a results point carries
(`defense` and `defense_<field>` for each field the defense uses), and its metrics: for the DP
defenses the noise multiplier (given, or found by the accountant for `target_epsilon`) and the
epsilon it spends, accounted with dp-accounting (`dp.epsilon`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

from fl_privacy import validate
from fl_privacy.defenses import dp
from fl_privacy.fl import client

# Which section fields each defense reads (beyond `name`), and the make() parameter they feed.
FIELDS: dict[str, dict[str, str]] = {
    'none': {},
    'update_noise': {'sigma': 'sigma'},
    'sparsify': {'sparsity': 'sparsity', 'sparsify_min_size': 'min_size'},
    'quantize': {'bits': 'bits'},
    'mixup': {'mixup_alpha': 'alpha', 'mixup_public_code': 'public_code'},
    'augment': {'augment_level': 'level', 'augment_pad': 'pad'},
    'sampling': {'sampling_fraction': 'fraction'},
    'dp_sgd': {'clip_norm': 'clip_norm', 'noise_multiplier': 'noise_multiplier'},
    'update_dp': {'clip_norm': 'clip_norm', 'noise_multiplier': 'noise_multiplier'},
    'central_dp': {'clip_norm': 'clip_norm', 'noise_multiplier': 'noise_multiplier'},
    'weak_dp': {'clip_norm': 'clip_norm', 'noise_multiplier': 'noise_multiplier'},
    'bitrand': {'epsilon': 'epsilon'},
    'ome': {'epsilon': 'epsilon'},
    'gaussian': {'sigma': 'sigma'},
    'ldp_sgd': {'epsilon': 'epsilon', 'clip_norm': 'clip_norm'},
}


class Configured(NamedTuple):
  """A configured defense.

  Attributes:
    hooks: the `fl.client.ClientHooks`.
    params: flat dict for a results point: `defense` and `defense_<field>`.
    metrics: flat dict: `noise_multiplier`, `dp_epsilon`, `dp_delta` (DP defenses;
      `dp_epsilon_per_round` for weak_dp), else empty.
  """
  hooks: client.ClientHooks
  params: dict[str, Any]
  metrics: dict[str, float]


def _is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate_section(section, prefix: str = 'defense') -> str:
  """Checks every field of the section (whatever the name); returns the defense's name."""
  from fl_privacy import defenses  # pylint: disable=g-import-not-at-top
  name = section.name
  validate.require(isinstance(name, str) and name in defenses.NAMES, f'{prefix}.name',
                   f'one of {defenses.NAMES}', name)

  def number(field, allowed, ok):
    v = section[field]
    validate.require(_is_number(v) and ok(v), f'{prefix}.{field}', allowed, v)

  def integer(field, allowed, ok, optional=False):
    v = section[field]
    if optional and v is None:
      return
    validate.require(isinstance(v, int) and not isinstance(v, bool) and ok(v),
                     f'{prefix}.{field}', allowed, v)

  number('sigma', 'a finite number >= 0', lambda v: v >= 0)
  number('sparsity', 'a number in (0, 1] (the fraction of entries zeroed)',
         lambda v: 0 < v <= 1)
  integer('sparsify_min_size', 'an integer >= 0', lambda v: v >= 0)
  integer('bits', 'an integer in [1, 24]', lambda v: 1 <= v <= 24)
  number('mixup_alpha', 'a finite number > 0', lambda v: v > 0)
  validate.require(isinstance(section.mixup_public_code, bool), f'{prefix}.mixup_public_code',
                   'True or False', section.mixup_public_code)
  integer('augment_level', 'one of (1, 2, 3, 4)', lambda v: v in (1, 2, 3, 4))
  integer('augment_pad', 'None or an integer >= 0', lambda v: v >= 0, optional=True)
  number('sampling_fraction', 'a number in (0, 1]', lambda v: 0 < v <= 1)
  number('clip_norm', 'a finite number > 0', lambda v: v > 0)
  number('noise_multiplier', 'a finite number >= 0', lambda v: v >= 0)
  if section.target_epsilon is not None:
    number('target_epsilon', 'None or a finite number > 0', lambda v: v > 0)
  number('delta', 'a number in (0, 1)', lambda v: 0 < v < 1)
  validate.require(section.accountant in dp.ACCOUNTANTS, f'{prefix}.accountant',
                   f'one of {dp.ACCOUNTANTS}', section.accountant)
  number('participation', 'a number in (0, 1]', lambda v: 0 < v <= 1)
  number('epsilon', 'a finite number > 0', lambda v: v > 0)
  return name


def configure(section, *, num_classes: int, image_shape: Sequence[int] | None = None,
              value_range: tuple[float, float] = (0.0, 1.0), batch_size: int,
              num_examples: int, local_steps: int, rounds: int = 1,
              prefix: str = 'defense') -> Configured:
  """The defense named in `section`, built for an experiment's setting.

  Args:
    section: the `defense` ConfigDict.
    num_classes: classes of the task (mixup's soft labels).
    image_shape: (H, W, C) of an example (augment reshapes flat features to it), or None.
    value_range: the inputs' range (colour jitter clips to it).
    batch_size: B (record-level sampling rate B / n).
    num_examples: n, a client's examples.
    local_steps: local steps per round (E J), for record-level accounting.
    rounds: T.
    prefix: field prefix in error messages.

  Returns:
    `Configured`.
  """
  from fl_privacy import defenses  # pylint: disable=g-import-not-at-top
  name = validate_section(section, prefix)
  params: dict[str, Any] = {'defense': name}
  kwargs: dict[str, Any] = {}
  for field, param in FIELDS[name].items():
    kwargs[param] = section[field]
    params[f'defense_{field}'] = section[field]
  metrics: dict[str, float] = {}
  if name == 'mixup':
    kwargs['num_classes'] = int(num_classes)
  if name == 'augment':
    kwargs['image_shape'] = None if image_shape is None else tuple(image_shape)
    kwargs['value_range'] = tuple(value_range)
    if section.augment_pad is None:
      small = image_shape is not None and max(image_shape[0], image_shape[1]) <= 8
      kwargs['pad'] = 1 if small else 4
      params['defense_augment_pad'] = kwargs['pad']
  if name in defenses.DP_DEFENSES:
    delta, acc = float(section.delta), section.accountant
    if name == 'dp_sgd':
      q, steps = min(1.0, batch_size / num_examples), int(local_steps) * int(rounds)
    elif name == 'weak_dp':
      q, steps = 1.0, 1  # calibrated per round, not composed (PASTEL's WDP)
    else:
      q, steps = float(section.participation), int(rounds)
    if section.target_epsilon is not None:
      z = dp.noise_multiplier_for(float(section.target_epsilon), delta=delta, sampling_rate=q,
                                  steps=steps, accountant=acc)
      kwargs['noise_multiplier'] = z
      del params['defense_noise_multiplier']
      params['defense_target_epsilon'] = float(section.target_epsilon)
    z = float(kwargs['noise_multiplier'])
    params['defense_delta'] = delta
    metrics['noise_multiplier'] = z
    metrics['dp_delta'] = delta
    if name == 'weak_dp':
      metrics.update(dp.weak_dp_epsilons(z, delta=delta, rounds=int(rounds),
                                         participation=float(section.participation),
                                         accountant=acc))
    else:
      metrics['dp_epsilon'] = dp.epsilon(z, delta=delta, sampling_rate=q, steps=steps,
                                         accountant=acc)
  hooks = defenses.make(name, field_prefix=prefix, **kwargs)
  return Configured(hooks=hooks, params=params, metrics=metrics)
