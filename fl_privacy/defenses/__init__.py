"""Defenses as client hooks: any attack under any defense, chosen by name.

A layer between `fl` and `eval`: it imports only `validate`, `mechanisms` and `fl`. Every
defense is a `fl.client.ClientHooks` built by `make(name, **params)`; `combine(*hooks)` stacks
several (e.g. augmentation + sampling). One registry (`DEFENSES`) holds them all, including the
input mechanisms of `mechanisms.registry` wrapped as hooks, so an experiment's config names
any of them in `defense.name`:

| name | hook | parameters | module / source |
|---|---|---|---|
| `none` | - | - | plain FedAvg |
| `update_noise` | upload | `sigma` | `update.noise` (FedMIA code) |
| `sparsify` | upload | `sparsity` p in (0, 1], `min_size` (1,000: FedMIA's; 0: plain top-k) | `update.sparsify` |
| `quantize` | upload | `bits` >= 1 | `update.quantize` (stochastic, unbiased) |
| `mixup` | batch | `alpha` > 0, `num_classes`, `public_code` | `data.mixup` (Zhang et al. 2018) |
| `augment` | batch | `level` 1-4, `pad`, `image_shape`, `jitter`, `value_range` | `data.augment` |
| `sampling` | data | `fraction` in (0, 1] | `data.sample_rows` |
| `dp_sgd` | grad | `clip_norm` > 0, `noise_multiplier` >= 0 | `dp.private_gradient` (Abadi et al.) |
| `update_dp` | upload | `clip_norm`, `noise_multiplier` | `dp.clip_and_noise_update` |
| `central_dp` | aggregate | `clip_norm`, `noise_multiplier` | `dp.dp_fedavg` (McMahan et al. 2018) |
| `weak_dp` | aggregate | `clip_norm`, `noise_multiplier` (per-round calibration) | `dp.dp_fedavg` |
| `bitrand`, `ome`, `gaussian` | batch | the mechanism's (`epsilon`, ...; `sigma` for gaussian) | `mechanisms.registry` |
| `ldp_sgd` | upload | `epsilon`, `clip_norm` | `mechanisms.ldp_sgd` (debiased report) |

PASTEL's modules live beside them: `pastel` (the Jensen-Shannon regulariser, a `loss` hook
built by `pastel.make`, reading the held-out batch from the client's `aux`).

Bad parameters raise `validate.ConfigError` naming `<field_prefix>.<parameter>` (the config's
`defense.<field>`), before any work.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
from jax import flatten_util
import jax.numpy as jnp

from fl_privacy import validate
from fl_privacy.defenses import data
from fl_privacy.defenses import dp
from fl_privacy.defenses import update
from fl_privacy.fl import client
from fl_privacy.mechanisms import ldp_sgd
from fl_privacy.mechanisms import registry as mechanism_registry

ClientHooks = client.ClientHooks
IDENTITY = client.IDENTITY
DP_DEFENSES = ('dp_sgd', 'update_dp', 'central_dp', 'weak_dp')


class DefenseSpec(NamedTuple):
  """One registered defense.

  Attributes:
    name: the config name.
    hooks: the hook points it uses.
    params: parameter name -> default (`REQUIRED` when the caller must give it).
    build: `build(field_prefix, **params) -> ClientHooks` (validates its parameters).
    source: the paper or code it follows.
  """
  name: str
  hooks: tuple[str, ...]
  params: dict[str, Any]
  build: Callable[..., ClientHooks]
  source: str


REQUIRED = object()


def _number(field: str, value: Any, allowed: str, ok: Callable[[float], bool]) -> float:
  good = (isinstance(value, (int, float)) and not isinstance(value, bool) and
          math.isfinite(value) and ok(value))
  validate.require(good, field, allowed, value)
  return float(value)


def _int(field: str, value: Any, allowed: str, ok: Callable[[int], bool]) -> int:
  good = isinstance(value, int) and not isinstance(value, bool) and ok(value)
  validate.require(good, field, allowed, value)
  return int(value)


def _clip_and_noise(p: str, clip_norm, noise_multiplier) -> tuple[float, float]:
  c = _number(f'{p}.clip_norm', clip_norm, 'a finite number > 0', lambda v: v > 0)
  z = _number(f'{p}.noise_multiplier', noise_multiplier, 'a finite number >= 0',
              lambda v: v >= 0)
  return c, z


def _none(p):
  del p
  return IDENTITY


def _update_noise(p, sigma):
  s = _number(f'{p}.sigma', sigma, 'a finite number >= 0', lambda v: v >= 0)
  return ClientHooks(upload=update.noise_hook(s))


def _sparsify(p, sparsity, min_size):
  q = _number(f'{p}.sparsity', sparsity, 'a number in (0, 1] (the fraction zeroed)',
              lambda v: 0 < v <= 1)
  m = _int(f'{p}.min_size', min_size, 'an integer >= 0', lambda v: v >= 0)
  return ClientHooks(upload=update.sparsify_hook(1.0 - q, m))


def _quantize(p, bits):
  b = _int(f'{p}.bits', bits, 'an integer in [1, 24]', lambda v: 1 <= v <= 24)
  return ClientHooks(upload=update.quantize_hook(b))


def _mixup(p, alpha, num_classes, public_code):
  a = _number(f'{p}.alpha', alpha, 'a finite number > 0', lambda v: v > 0)
  c = _int(f'{p}.num_classes', num_classes, 'an integer >= 2', lambda v: v >= 2)
  validate.require(isinstance(public_code, bool), f'{p}.public_code', 'True or False',
                   public_code)
  return ClientHooks(batch=data.mixup_hook(a, c, public_code))


def _augment(p, level, pad, image_shape, jitter, value_range):
  lv = _int(f'{p}.level', level, f'one of {data.AUGMENT_LEVELS}',
            lambda v: v in data.AUGMENT_LEVELS)
  pd = _int(f'{p}.pad', pad, 'an integer >= 0', lambda v: v >= 0)
  j = _number(f'{p}.jitter', jitter, 'a number in [0, 1]', lambda v: 0 <= v <= 1)
  shape = None if image_shape is None else tuple(int(s) for s in image_shape)
  lo, hi = (float(v) for v in value_range)
  return ClientHooks(batch=data.augment_hook(lv, pd, shape, j, (lo, hi)))


def _sampling(p, fraction):
  f = _number(f'{p}.fraction', fraction, 'a number in (0, 1]', lambda v: 0 < v <= 1)
  return ClientHooks(data=data.sampling_hook(f))


def _dp_sgd(p, clip_norm, noise_multiplier):
  return ClientHooks(grad=dp.dp_sgd_hook(*_clip_and_noise(p, clip_norm, noise_multiplier)))


def _update_dp(p, clip_norm, noise_multiplier):
  return ClientHooks(upload=dp.update_dp_hook(*_clip_and_noise(p, clip_norm,
                                                               noise_multiplier)))


def _central_dp(p, clip_norm, noise_multiplier):
  return ClientHooks(aggregate=dp.central_dp_hook(*_clip_and_noise(p, clip_norm,
                                                                   noise_multiplier)))


def _input_mechanism(name: str):
  def build(p, **params):
    if name == 'gaussian':
      if params.get('sigma') is not None:
        _number(f'{p}.sigma', params['sigma'], 'a finite number >= 0', lambda v: v >= 0)
    else:
      _number(f'{p}.epsilon', params.get('epsilon'), 'a finite number > 0', lambda v: v > 0)
    fn = mechanism_registry.randomizer(name, **params)

    def batch(key, x, y, mask, aux):
      del aux
      # Mechanisms randomize feature vectors [B, d]; images are flattened and restored.
      flat = jnp.reshape(jnp.asarray(x, jnp.float32), (x.shape[0], -1))
      return jnp.reshape(fn(key, flat), x.shape).astype(x.dtype), y, mask
    return ClientHooks(batch=batch)
  return build


def ldp_sgd_upload(key: jax.Array, delta: Any, epsilon: float, clip_norm: float) -> Any:
  """LDP-SGD on the update: the eps-LDP unit report times the debiasing constant.

  Algorithm 1 of the LDP-audit paper applied to the flattened update (the update plays the
  gradient's role), scaled by `ldp_sgd.debias_scale` so that the server's mean of uploads is an
  unbiased estimate of the mean clipped update (Algorithm 2, line 4).
  """
  flat, unravel = flatten_util.ravel_pytree(delta)
  report = ldp_sgd.randomize(key, flat, epsilon, clip_norm)
  return unravel(report * ldp_sgd.debias_scale(flat.shape[0], epsilon, clip_norm))


def _ldp_sgd(p, epsilon, clip_norm):
  e = _number(f'{p}.epsilon', epsilon, 'a finite number > 0', lambda v: v > 0)
  c = _number(f'{p}.clip_norm', clip_norm, 'a finite number > 0', lambda v: v > 0)

  def upload(key, delta, aux):
    del aux
    return ldp_sgd_upload(key, delta, e, c)
  return ClientHooks(upload=upload)


_DP_PARAMS = {'clip_norm': REQUIRED, 'noise_multiplier': REQUIRED}
_ENCODING = {'int_bits': 5, 'frac_bits': 4, 'sign_bit': True, 'honour_sign': True,
             'num_features': None, 'rng_bits': 32}

DEFENSES: dict[str, DefenseSpec] = {s.name: s for s in (
    DefenseSpec('none', (), {}, _none, 'plain FedAvg (McMahan et al. 2017)'),
    DefenseSpec('update_noise', ('upload',), {'sigma': REQUIRED}, _update_noise,
                'FedMIA paper, Perturb; code trainer_private.py:285-288'),
    DefenseSpec('sparsify', ('upload',), {'sparsity': REQUIRED,
                                          'min_size': update.FEDMIA_MIN_SIZE}, _sparsify,
                'top-k sparsification; FedMIA code main.py:166-174'),
    DefenseSpec('quantize', ('upload',), {'bits': REQUIRED}, _quantize,
                'min-max stochastic quantisation; FedMIA code experiments/utils.py:110-117'),
    DefenseSpec('mixup', ('batch',), {'alpha': REQUIRED, 'num_classes': REQUIRED,
                                      'public_code': False}, _mixup,
                'Zhang et al. 2018; FedMIA code trainer_private.py:195'),
    DefenseSpec('augment', ('batch',), {'level': REQUIRED, 'pad': 4, 'image_shape': None,
                                        'jitter': data.DEFAULT_JITTER,
                                        'value_range': (0.0, 1.0)}, _augment,
                'FedMIA code utils/datasets.py:57-68'),
    DefenseSpec('sampling', ('data',), {'fraction': REQUIRED}, _sampling,
                'FedMIA paper, Data Sampling'),
    DefenseSpec('dp_sgd', ('grad',), dict(_DP_PARAMS), _dp_sgd,
                'Abadi et al. 2016, Algorithm 1'),
    DefenseSpec('update_dp', ('upload',), dict(_DP_PARAMS), _update_dp,
                'FedMIA paper, Appendix A.2.1 (client-level DP on the update)'),
    DefenseSpec('central_dp', ('aggregate',), dict(_DP_PARAMS), _central_dp,
                'DP-FedAvg, McMahan et al. 2018'),
    DefenseSpec('weak_dp', ('aggregate',), dict(_DP_PARAMS), _central_dp,
                'PASTEL paper Sect. 1.4 (WDP): DP-FedAvg calibrated per round'),
    DefenseSpec('bitrand', ('batch',), {'epsilon': REQUIRED, 'alpha': None, **_ENCODING},
                _input_mechanism('bitrand'), 'BitRand, Eq. (23) of the AMI paper'),
    DefenseSpec('ome', ('batch',), {'epsilon': REQUIRED, 'alpha': None, **_ENCODING},
                _input_mechanism('ome'), 'OME, Eq. (22) of the AMI paper'),
    DefenseSpec('gaussian', ('batch',), {'sigma': None, 'epsilon': None, 'delta': None,
                                         'sensitivity': 1.0},
                _input_mechanism('gaussian'), 'Gaussian mechanism, AMI paper Appendix E'),
    DefenseSpec('ldp_sgd', ('upload',), {'epsilon': REQUIRED, 'clip_norm': REQUIRED},
                _ldp_sgd, 'LDP-SGD, Algorithm 1 of the LDP-audit paper'),
)}
NAMES = tuple(DEFENSES)
# The input mechanisms come from the one mechanism registry.
assert set(mechanism_registry.NAMES) <= set(NAMES)


def spec(name: str, field: str = 'defense.name') -> DefenseSpec:
  """The spec of `name`; ConfigError naming `field` for an unknown one."""
  validate.require(isinstance(name, str) and name in DEFENSES, field, f'one of {NAMES}', name)
  return DEFENSES[name]


def make(name: str, *, field_prefix: str = 'defense', **params: Any) -> ClientHooks:
  """The hooks of defense `name` with `params` (see the table in the module docstring).

  Args:
    name: one of `NAMES`.
    field_prefix: prefix of the field names in error messages.
    **params: the defense's parameters; missing ones take their defaults.

  Raises:
    ConfigError: unknown name, unknown or missing parameter, or a value out of range.
  """
  s = spec(name, f'{field_prefix}.name')
  for k in params:
    validate.require(k in s.params, f'{field_prefix}.{k}',
                     f'a parameter of {name}: one of {tuple(s.params)}', params[k])
  full = {}
  for k, default in s.params.items():
    v = params.get(k, default)
    validate.require(v is not REQUIRED, f'{field_prefix}.{k}', f'given for {name}', None)
    full[k] = v
  return s.build(field_prefix, **full)


def _chain_data(fns):
  def run(key, x, y, mask, aux):
    for i, fn in enumerate(fns):
      x, y, mask = fn(key if i == 0 else jax.random.fold_in(key, i), x, y, mask, aux)
    return x, y, mask
  return run


def _chain_loss(fns):
  def run(key, loss_fn, params, x, y, mask, aux):
    inner = loss_fn
    for i, fn in enumerate(fns):
      k = key if i == 0 else jax.random.fold_in(key, i)

      def wrapped(p, xb, yb, mb=None, fn=fn, k=k, inner=inner):
        return fn(k, inner, p, xb, yb, mb, aux)
      inner = wrapped
    return inner(params, x, y, mask)
  return run


def _chain_upload(fns):
  def run(key, delta, aux):
    for i, fn in enumerate(fns):
      delta = fn(key if i == 0 else jax.random.fold_in(key, i), delta, aux)
    return delta
  return run


def combine(*hooks: ClientHooks) -> ClientHooks:
  """One `ClientHooks` applying each of `hooks` in order at every hook point.

  `data`, `batch` and `upload` hooks run one after the other; `loss` hooks nest (the later
  wraps the earlier); at most one `grad` and one `aggregate` hook may be given. The i-th
  non-identity hook at a point gets the point's key for i = 0 and `fold_in(key, i)` after, so
  `combine(h)` and `combine(h, IDENTITY)` equal `h` draw for draw.

  Raises:
    ValueError: two `grad` or two `aggregate` hooks.
  """
  fields = {}
  for point in ('data', 'batch', 'upload', 'loss'):
    fns = [getattr(h, point) for h in hooks
           if getattr(h, point) is not getattr(IDENTITY, point)]
    if not fns:
      continue
    if len(fns) == 1:
      fields[point] = fns[0]
    elif point == 'loss':
      fields[point] = _chain_loss(fns)
    elif point == 'upload':
      fields[point] = _chain_upload(fns)
    else:
      fields[point] = _chain_data(fns)
  for point in ('grad', 'aggregate'):
    fns = [getattr(h, point) for h in hooks if getattr(h, point) is not None]
    if len(fns) > 1:
      raise ValueError(f'at most one {point} hook can be combined (got {len(fns)})')
    if fns:
      fields[point] = fns[0]
  return ClientHooks(**fields)


from fl_privacy.defenses.configured import Configured  # pylint: disable=g-import-not-at-top,wrong-import-position
from fl_privacy.defenses.configured import configure  # pylint: disable=g-import-not-at-top,wrong-import-position
from fl_privacy.defenses.configured import validate_section  # pylint: disable=g-import-not-at-top,wrong-import-position
