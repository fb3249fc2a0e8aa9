"""The FedMIA pipeline's defenses: config checks, `fl_privacy.defenses` hooks, DP epsilon.

Each defense of the paper's Sect. 4.4 / Appendix A.2 (and quantisation, which its code has) is
built by `fl_privacy.defenses.make(name, **params)` with the authors' code's
parameterisation; this module maps a config strength (`fedmia.defenses.<name>`) to those
params, validates the strengths before anything runs, and gives update_dp's epsilon.

| name | strength | what the client does |
|---|---|---|
| update_noise | sigma >= 0 | adds N(0, sigma^2) to every entry of its update, no clipping (`trainer_private.py:285-288`) |
| update_dp | z >= 0 | clips its update to L2 norm `dp_clip` = C and adds N(0, (z C)^2) (Appendix A.2.1) |
| sparsify | p in (0, 1) | zeroes all but the int((1 - p) n) largest |Delta| of every tensor with n > 1,000 entries (`main.py:166-174`) |
| quantize | bits >= 1 | per-tensor min-max quantisation of the update to 2^bits levels (`experiments/utils.py:110-117`; `fl_privacy.defenses` rounds stochastically, unbiased) |
| mixup | alpha > 0 | trains on mixup batches, lambda ~ Beta(alpha, alpha) (`mixup_public_code`: unmixed inputs, as `trainer_private.py:195`) |
| augment | level 1-4 | cumulative: random crop (pad 4, digits 1); + horizontal flip; + vertical flip and rotation <= 45 degrees; + colour jitter (`utils/datasets.py:57-68`) |
| sampling | p in (0, 1) | trains on a random fraction p of its shard each round (`fl_privacy.defenses`' `sampling`, a data hook) |
| augment_sampling | p in (0, 1) | augment at `augment_sampling_level` and sampling p |
"""

from __future__ import annotations

import math

from fl_privacy import validate

DEFENSES = ('update_noise', 'update_dp', 'sparsify', 'quantize', 'mixup', 'augment',
            'sampling', 'augment_sampling')
UPLOAD_DEFENSES = ('update_noise', 'update_dp', 'sparsify', 'quantize')

# (check, allowed) per defense strength.
_RULES = {
    'update_noise': (lambda v: v >= 0, 'sigmas >= 0'),
    'update_dp': (lambda v: v >= 0, 'noise multipliers z >= 0'),
    'sparsify': (lambda v: 0 < v < 1, 'fractions p in (0, 1)'),
    'quantize': (lambda v: v >= 1 and float(v).is_integer(), 'integer bits >= 1'),
    'mixup': (lambda v: v > 0, 'alphas > 0'),
    'augment': (lambda v: float(v).is_integer() and 1 <= v <= 4, 'levels in {1, 2, 3, 4}'),
    'sampling': (lambda v: 0 < v < 1, 'fractions p in (0, 1)'),
    'augment_sampling': (lambda v: 0 < v < 1, 'fractions p in (0, 1)'),
}


def validate_config(config) -> None:
  """Defense names and strengths (issue: p in (0, 1), bits >= 1, sigma, z >= 0, alpha > 0,
  augment level 1-4), and the fields they use."""
  s = config.fedmia
  for name in s.defenses.keys():
    validate.require(name in DEFENSES, f'fedmia.defenses.{name}',
                     f'a defense name, one of {DEFENSES}', name)
    values = s.defenses[name]
    values = (values,) if isinstance(values, (int, float)) else tuple(values)
    check, allowed = _RULES[name]
    for v in values:
      ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
      validate.require(ok and check(v), f'fedmia.defenses.{name}', allowed, s.defenses[name])
  validate.positive(config, 'fedmia.dp_clip')
  validate.in_range(config, 'fedmia.dp_delta', 0.0, 1.0, low_inclusive=False,
                    high_inclusive=False)
  level = s.augment_sampling_level
  validate.require(isinstance(level, int) and 1 <= level <= 4,
                   'fedmia.augment_sampling_level', 'a level in {1, 2, 3, 4}', level)
  validate.require(isinstance(s.mixup_public_code, bool), 'fedmia.mixup_public_code',
                   'True or False', s.mixup_public_code)


def validate_data(config, train) -> None:
  """Augmentation needs images."""
  names = set(config.fedmia.defenses.keys())
  if names & {'augment', 'augment_sampling'} and not train.is_image:
    raise validate.ConfigError('fedmia.defenses', 'no augment/augment_sampling on feature '
                               'vectors (they transform images)', sorted(names))


def _make(name: str, **params):
  from fl_privacy import defenses  # pylint: disable=g-import-not-at-top
  return defenses.make(name, field_prefix=f'fedmia.defenses.{name}', **params)


def hooks(config, name: str, value, train):
  """The `ClientHooks` of defense `name` at strength `value` (None for 'none')."""
  s = config.fedmia
  if name == 'none':
    return None
  # The code pads CIFAR crops by 4; 8x8 digits get 1 (the choice for small images).
  pad = 1 if train.is_image and min(train.x.shape[1:3]) <= 16 else 4
  if name == 'update_noise':
    return _make(name, sigma=float(value))
  if name == 'update_dp':
    return _make(name, clip_norm=float(s.dp_clip), noise_multiplier=float(value))
  if name == 'sparsify':
    return _make(name, sparsity=float(value), min_size=1000)
  if name == 'quantize':
    return _make(name, bits=int(value))
  if name == 'mixup':
    return _make(name, alpha=float(value), num_classes=int(train.num_classes),
                 public_code=bool(s.mixup_public_code))
  if name == 'augment':
    return _make(name, level=int(value), pad=pad)
  if name == 'sampling':
    return _make(name, fraction=float(value))
  if name == 'augment_sampling':
    from fl_privacy import defenses  # pylint: disable=g-import-not-at-top
    return defenses.combine(_make('augment', level=int(s.augment_sampling_level), pad=pad),
                            _make('sampling', fraction=float(value)))
  raise validate.ConfigError('fedmia.defenses', f'one of {DEFENSES}', name)


def epsilon(config, name: str, value) -> float:
  """update_dp's (epsilon, dp_delta)-DP for one example against the server, else inf.

  Each of the T rounds every client releases its update clipped to C plus N(0, (z C)^2): a
  Gaussian mechanism whose sensitivity to one example is 2C (two updates in the C-ball), so
  noise multiplier z / 2 per round, composed over T rounds with no subsampling (all clients
  take part), accounted with dp-accounting's RDP accountant (`defenses.dp.epsilon`). This is an
  example-level guarantee against the server that sees each upload, not the client-level one
  `defenses.dp` states for update_dp (sensitivity C, a whole client added or removed).
  """
  if name != 'update_dp':
    return math.inf
  from fl_privacy.defenses import dp  # pylint: disable=g-import-not-at-top
  # dp.epsilon takes noise std / sensitivity; one example moves the clipped update by <= 2C.
  return dp.epsilon(float(value) / 2.0, delta=float(config.fedmia.dp_delta),
                    steps=int(config.fedmia.num_rounds))
