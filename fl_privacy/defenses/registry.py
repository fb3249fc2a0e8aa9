"""The one specification of every defense: fields and their rules, hooks, accounting, adversary.

Each defense is declared once, here, as a `Defense`:

- `params`: the `make()` parameters it takes, each bound to one `Field` of `FIELDS`. A field
  has ONE rule (`validate.Rule`), whose text is the error message; the `defense` config section
  (configs/_defense.py), FedMIA's defense sweep and PASTEL's baselines all validate through it,
  so no two readers can disagree on what a field allows.
- `hooks`: the client-protocol points it acts at (`fl.client`).
- `declare(params, setting) -> accounting.Declaration` for the DP defenses: unit, neighbouring
  relation, adversary and sampling of the guarantee, turned into epsilon by
  `fl_privacy.accounting` (and nowhere else).
- `protects`: whom a formal guarantee protects against (`server`, `aggregate`), None for the
  empirical defenses (noise without clipping, sparsification, mixup, ...), which claim nothing.
- `strength`: the parameter a defense sweep varies (FedMIA's `fedmia.defenses.<name>`).

Experiments state their adversary in `fl_privacy.catalog` (`ADVERSARY` here); `check_fits(name, experiment)` refuses
(ConfigError, exit 2) a defense whose guarantee is only against readers of the aggregate in an
experiment whose adversary is the server that reads the uploads.

Adding a defense: its hooks in the family module (`update.py`, `data.py`, `dp.py`), one
`Defense(...)` entry in `DEFENSES` below, and a field in `FIELDS` if it reads a new one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
from jax import flatten_util
import jax.numpy as jnp

from fl_privacy import accounting
from fl_privacy import catalog
from fl_privacy import validate
from fl_privacy.defenses import data
from fl_privacy.defenses import dp
from fl_privacy.defenses import update
from fl_privacy.fl import client
from fl_privacy.mechanisms import ldp_sgd
from fl_privacy.mechanisms import registry as mechanism_registry

V = validate


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field: its rule, its default in the `defense` section, its documentation.

  `section` False marks a value an experiment derives from its setting (classes, image shape),
  never read from the `defense` section.
  """
  rule: validate.Rule
  default: Any = None
  doc: str = ''
  section: bool = True


_NO_DEFAULT = object()

# Every field a defense reads, with its one rule. Keys are the `defense` section's names.
FIELDS: dict[str, Field] = {
    'sigma': Field(V.number(0), 0.01, 'update_noise: std of N(0, sigma^2) added to every '
                   'parameter of the update (FedMIA: 0.01-0.5); gaussian: std of the noise on '
                   'the inputs'),
    'sparsity': Field(V.number(0, 1, low_open=True, words='the fraction of entries zeroed'),
                      0.9, 'sparsify: the fraction p of each tensor\'s entries zeroed (top-k '
                      'keeps int((1 - p) n)); p = 0.99 keeps the largest 1%'),
    'sparsify_min_size': Field(V.number(0, integer=True), update.FEDMIA_MIN_SIZE,
                               'sparsify: tensors with at most this many entries are sent '
                               'unsparsified (FedMIA\'s code: 1,000); 0 sparsifies every tensor'),
    'bits': Field(V.number(1, 24, integer=True), 8,
                  'quantize: levels 2^bits per tensor, min-max, stochastic rounding'),
    'mixup_alpha': Field(V.number(0, low_open=True), 1.0, 'mixup: Beta(alpha, alpha) weights'),
    'mixup_public_code': Field(V.BOOLEAN, False, 'mixup: True trains on the unmixed inputs '
                               'with mixed labels, as FedMIA\'s code does'),
    'augment_level': Field(V.choice(data.AUGMENT_LEVELS), 2, 'augment: 1 crop, 2 + h-flip, '
                           '3 + v-flip and rotation <= 45 deg, 4 + colour jitter (cumulative)'),
    'augment_pad': Field(V.number(0, integer=True, optional=True), None,
                         'augment: crop padding in px; None: 1 for images of at most 16 px '
                         'on a side (digits), else 4 (FedMIA\'s code, CIFAR)'),
    'augment_jitter': Field(V.number(0, 1), data.DEFAULT_JITTER, 'augment level 4: colour '
                            'jitter strength', section=False),
    'sampling_fraction': Field(V.number(0, 1, low_open=True), 0.5, 'sampling: the fraction '
                               'of its rows a client trains on each round'),
    'clip_norm': Field(V.number(0, low_open=True), 1.0, 'dp_sgd: per-example clip C; '
                       'update_dp, central_dp, weak_dp: update clip C; ldp_sgd: gradient clip'),
    'noise_multiplier': Field(V.number(0), 1.0, 'the DP defenses\' noise multiplier (noise '
                              'std = multiplier x clip_norm); ignored when target_epsilon is '
                              'set'),
    'target_epsilon': Field(V.number(0, low_open=True, optional=True), None,
                            'the epsilon (at delta) the DP defenses should spend, for the '
                            'adversary and unit each declares: the noise multiplier is then '
                            'found by the accountant'),
    'delta': Field(V.number(0, 1, low_open=True, high_open=True), 1e-5,
                   'delta of the DP accounting'),
    'accountant': Field(V.choice(accounting.ACCOUNTANTS), 'rdp', "'rdp' or 'pld', both "
                        'dp-accounting\'s'),
    'participation': Field(V.number(0, 1, low_open=True), 1.0, 'central_dp, weak_dp: the '
                           'fraction of clients drawn (without replacement) per round'),
    'dp_sgd_sampling': Field(V.choice(('poisson', 'shuffle')), 'poisson', "dp_sgd: 'poisson' "
                             '(each record joins each step with probability B / N, N the '
                             'declared record count, for ceil(N / B) steps an epoch: the public '
                             "schedule, accounted exactly) or 'shuffle' (fixed-size shuffled "
                             'batches, accounted without amplification)'),
    'epsilon': Field(V.number(0, low_open=True), 5.0, 'bitrand, ome, ldp_sgd: the LDP '
                     'epsilon; gaussian: epsilon of its calibration (with delta) when sigma is '
                     'None'),
    'num_classes': Field(V.number(2, integer=True), None, 'classes of the task', False),
    'image_shape': Field(V.Rule('None or (H, W, C)', lambda v: v is None or len(v) == 3),
                         None, 'an example\'s image shape', False),
    'value_range': Field(V.Rule('(low, high) with low < high',
                                lambda v: len(v) == 2 and float(v[0]) < float(v[1])),
                         (0.0, 1.0), 'the inputs\' range', False),
    'max_batch_size': Field(V.number(1, integer=True, optional=True), None,
                            'dp_sgd Poisson: the padded batch (None: chosen so that a batch '
                            'overflows with probability <= 1e-12 over the run)', False),
    'num_examples': Field(V.number(1, integer=True, optional=True), None,
                          'dp_sgd Poisson: the record count per client the experiment declares '
                          'public (the rate B / N of its public schedule)', False),
    'batch_size': Field(V.number(1, integer=True, optional=True), None,
                        'dp_sgd Poisson: the expected batch B', False),
    'steps_per_epoch': Field(V.number(1, integer=True, optional=True), None,
                             'dp_sgd Poisson: the public schedule\'s steps per local epoch '
                             '(None: ceil(N / B))', False),
}


class Setting(NamedTuple):
  """What an experiment tells a defense about its run (accounting and shape-dependent hooks).

  Everything here is public configuration, which the accounting may take as fixed. num_examples
  is the record count per client the experiment declares public: DP-SGD's Poisson schedule runs
  at rate B / num_examples for steps_per_epoch steps a local epoch (None: ceil(num_examples /
  B)) on every client, whatever its real row count (`fl.sampling.public_schedule`); an
  experiment declares its smallest client's count, the largest rate. max_examples is the largest
  shard the padded Poisson batch must hold (None: num_examples).
  """
  num_classes: int = 10
  image_shape: tuple | None = None
  value_range: tuple[float, float] = (0.0, 1.0)
  batch_size: int = 1
  num_examples: int = 1
  epochs: int = 1
  steps_per_epoch: int | None = None
  rounds: int = 1
  num_clients: int = 1
  participants: int | None = None
  max_examples: int | None = None


def steps_per_epoch(setting: Setting) -> int:
  """The public schedule's steps per local epoch: the setting's, or ceil(num_examples / B)."""
  if setting.steps_per_epoch is not None:
    return int(setting.steps_per_epoch)
  return -(-int(setting.num_examples) // int(setting.batch_size))


def poisson_rate(setting: Setting) -> float:
  """The public schedule's rate q = min(B / num_examples, 1)."""
  return min(float(setting.batch_size) / float(setting.num_examples), 1.0)


def poisson_max_batch(setting: Setting) -> int:
  """The padded Poisson batch of dp_sgd: overflow probability <= 1e-12 over every step of the
  run at the public rate, for the largest shard (`max_examples`)."""
  from fl_privacy.fl import sampling as sampling_lib  # pylint: disable=g-import-not-at-top
  n = int(setting.max_examples or setting.num_examples)
  steps = int(setting.epochs) * steps_per_epoch(setting) * int(setting.rounds)
  return sampling_lib.max_batch_size(n, int(setting.batch_size), steps,
                                     rate=poisson_rate(setting))


@dataclasses.dataclass(frozen=True)
class Defense:
  """One defense, declared once (see the module docstring)."""
  name: str
  family: str
  hooks: tuple[str, ...]
  params: dict[str, str]
  build: Callable[..., client.ClientHooks]
  source: str
  defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
  protects: str | None = None
  declare: Callable[[dict, Setting], accounting.Declaration] | None = None
  strength: str | None = None
  passthrough: tuple[str, ...] = ()

  def field(self, param: str) -> str:
    return self.params[param]


REQUIRED = object()

# ----------------------------------------------------------------------------------------------
# Builders: validated params -> hooks.


def _none(**unused):
  return client.IDENTITY


def _update_noise(sigma):
  return client.ClientHooks(upload=update.noise_hook(float(sigma)))


def _sparsify(sparsity, min_size):
  return client.ClientHooks(upload=update.sparsify_hook(1.0 - float(sparsity), int(min_size)))


def _quantize(bits):
  return client.ClientHooks(upload=update.quantize_hook(int(bits)))


def _mixup(alpha, num_classes, public_code):
  return client.ClientHooks(batch=data.mixup_hook(float(alpha), int(num_classes), public_code))


def default_pad(image_shape) -> int:
  """Augmentation's crop padding: 1 for images of at most 16 px on a side, else 4."""
  small = image_shape is not None and min(image_shape[0], image_shape[1]) <= 16
  return 1 if small else 4


def _augment(level, pad, image_shape, jitter, value_range):
  shape = None if image_shape is None else tuple(int(s) for s in image_shape)
  pad = default_pad(shape) if pad is None else int(pad)
  lo, hi = (float(v) for v in value_range)
  return client.ClientHooks(batch=data.augment_hook(int(level), pad, shape, float(jitter),
                                                    (lo, hi)))


def _sampling(fraction):
  return client.ClientHooks(data=data.sampling_hook(float(fraction)))


def _augment_sampling(level, pad, image_shape, jitter, value_range, fraction):
  a = _augment(level, pad, image_shape, jitter, value_range)
  return client.ClientHooks(data=_sampling(fraction).data, batch=a.batch)


def _dp_sgd(clip_norm, noise_multiplier, sampling='shuffle', batch_size=None,
            num_examples=None, max_batch_size=None, steps_per_epoch=None):
  if sampling != 'poisson':
    # Shuffled lots divide by the lot size B (Abadi et al.'s L), so an epoch's partial last
    # batch is down-weighted, not its noise amplified; without B, by the batch's rows.
    return client.ClientHooks(grad=dp.dp_sgd_hook(
        float(clip_norm), noise_multiplier, None if batch_size is None else float(batch_size)))
  validate.require(batch_size is not None and num_examples is not None,
                   'defense.dp_sgd_sampling', "'shuffle' where the experiment does not give "
                   'the batch size and the declared record count', sampling)
  from fl_privacy.fl import sampling as sampling_lib  # pylint: disable=g-import-not-at-top
  schedule = sampling_lib.public_schedule(int(num_examples), int(batch_size), steps_per_epoch)
  if max_batch_size is None:
    max_batch_size = sampling_lib.max_batch_size(int(num_examples), int(batch_size), 1,
                                                 rate=schedule.rate)
  # Poisson batches divide by the expected batch size: the realised one is not public. The
  # schedule (rate, steps) and the reported count are public too (`fl.sampling`).
  return client.ClientHooks(
      grad=dp.dp_sgd_hook(float(clip_norm), noise_multiplier, float(batch_size)),
      batches=sampling_lib.poisson_sampler(int(max_batch_size), num_examples=int(num_examples),
                                           batch_size=int(batch_size),
                                           steps_per_epoch=schedule.steps_per_epoch),
      report=client.report_public(float(num_examples)))


# Client-level guarantees against the server: the client's size is part of what is protected,
# so it reports one unit (equal FedAvg weights, as DP-FedAvg's fixed weights), not its rows.
_EQUAL_WEIGHTS = client.report_public(1.0)


def _update_dp(clip_norm, noise_multiplier):
  return client.ClientHooks(upload=dp.update_dp_hook(float(clip_norm), noise_multiplier),
                            report=_EQUAL_WEIGHTS)


def _central_dp(clip_norm, noise_multiplier):
  return client.ClientHooks(aggregate=dp.central_dp_hook(float(clip_norm), noise_multiplier))


def _input_mechanism(name: str):
  def build(**params):
    fn = mechanism_registry.randomizer(name, **params)

    def batch(key, x, y, mask, aux):
      del aux
      # Mechanisms randomize feature vectors [B, d]; images are flattened and restored.
      flat = jnp.reshape(jnp.asarray(x, jnp.float32), (x.shape[0], -1))
      return jnp.reshape(fn(key, flat), x.shape).astype(x.dtype), y, mask
    return client.ClientHooks(batch=batch)
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


def _ldp_sgd(epsilon, clip_norm):
  e, c = float(epsilon), float(clip_norm)

  def upload(key, delta, aux):
    del aux
    return ldp_sgd_upload(key, delta, e, c)
  return client.ClientHooks(upload=upload, report=_EQUAL_WEIGHTS)


# ----------------------------------------------------------------------------------------------
# Accounting declarations (fl_privacy.accounting).


def _declare_dp_sgd(p: dict, s: Setting) -> accounting.Declaration:
  steps = int(s.epochs) * steps_per_epoch(s) * int(s.rounds)
  return accounting.dp_sgd(batch_size=int(s.batch_size), num_examples=int(s.num_examples),
                           steps=steps, epochs=int(s.epochs) * int(s.rounds),
                           sampling=p.get('sampling', 'shuffle'),
                           max_batch_size=p.get('max_batch_size'))


def _declare_update_dp(p: dict, s: Setting) -> accounting.Declaration:
  del p
  return accounting.update_dp(rounds=int(s.rounds))


def _declare_server(per_round: bool):
  def declare(p: dict, s: Setting) -> accounting.Declaration:
    participants = s.participants
    if participants is None:
      participants = max(1, round(float(p.get('participation', 1.0)) * int(s.num_clients)))
    return accounting.server_dp('weak_dp' if per_round else 'central_dp',
                                rounds=int(s.rounds), num_clients=int(s.num_clients),
                                participants=int(participants), per_round=per_round)
  return declare


def _declare_ldp_sgd(p: dict, s: Setting) -> accounting.Declaration:
  return accounting.ldp_sgd(epsilon_per_report=float(p['epsilon']), rounds=int(s.rounds))


def _declare_gaussian(p: dict, s: Setting) -> accounting.Declaration:
  del p, s
  return accounting.gaussian_input()


_DP = {'clip_norm': 'clip_norm', 'noise_multiplier': 'noise_multiplier'}
_ENCODING = {'int_bits': 5, 'frac_bits': 4, 'sign_bit': True, 'honour_sign': True,
             'num_features': None, 'rng_bits': 32}
_AUGMENT = {'level': 'augment_level', 'pad': 'augment_pad', 'image_shape': 'image_shape',
            'jitter': 'augment_jitter', 'value_range': 'value_range'}

DEFENSES: dict[str, Defense] = {d.name: d for d in (
    Defense('none', 'none', (), {}, _none, 'plain FedAvg (McMahan et al. 2017)'),
    Defense('update_noise', 'update', ('upload',), {'sigma': 'sigma'}, _update_noise,
            'FedMIA paper, Perturb; code trainer_private.py:285-288', strength='sigma'),
    Defense('sparsify', 'update', ('upload',),
            {'sparsity': 'sparsity', 'min_size': 'sparsify_min_size'}, _sparsify,
            'top-k sparsification; FedMIA code main.py:166-174', strength='sparsity',
            defaults={'min_size': update.FEDMIA_MIN_SIZE}),
    Defense('quantize', 'update', ('upload',), {'bits': 'bits'}, _quantize,
            'min-max stochastic quantisation; FedMIA code experiments/utils.py:110-117',
            strength='bits'),
    Defense('mixup', 'data', ('batch',), {'alpha': 'mixup_alpha', 'num_classes': 'num_classes',
                                          'public_code': 'mixup_public_code'}, _mixup,
            'Zhang et al. 2018; FedMIA code trainer_private.py:195', strength='alpha',
            defaults={'public_code': False}),
    Defense('augment', 'data', ('batch',), _AUGMENT, _augment,
            'FedMIA code utils/datasets.py:57-68', strength='level',
            defaults={'pad': None, 'image_shape': None, 'jitter': data.DEFAULT_JITTER,
                      'value_range': (0.0, 1.0)}),
    Defense('sampling', 'data', ('data',), {'fraction': 'sampling_fraction'}, _sampling,
            'FedMIA paper, Data Sampling', strength='fraction'),
    Defense('augment_sampling', 'data', ('data', 'batch'),
            {**_AUGMENT, 'fraction': 'sampling_fraction'}, _augment_sampling,
            'FedMIA paper, augmentation + sampling', strength='fraction',
            defaults={'pad': None, 'image_shape': None, 'jitter': data.DEFAULT_JITTER,
                      'value_range': (0.0, 1.0)}),
    Defense('dp_sgd', 'dp', ('grad', 'batches', 'report'),
            {**_DP, 'sampling': 'dp_sgd_sampling', 'batch_size': 'batch_size',
             'num_examples': 'num_examples', 'max_batch_size': 'max_batch_size',
             'steps_per_epoch': 'steps_per_epoch'}, _dp_sgd,
            'Abadi et al. 2016, Algorithm 1', protects='server', declare=_declare_dp_sgd,
            strength='noise_multiplier',
            defaults={'sampling': 'shuffle', 'batch_size': None, 'num_examples': None,
                      'max_batch_size': None, 'steps_per_epoch': None}),
    Defense('update_dp', 'dp', ('upload', 'report'), dict(_DP), _update_dp,
            'FedMIA paper, Appendix A.2.1 (DP on the update, before upload)', protects='server',
            declare=_declare_update_dp, strength='noise_multiplier'),
    Defense('central_dp', 'dp', ('aggregate',), dict(_DP), _central_dp,
            'DP-FedAvg, McMahan et al. 2018', protects='aggregate',
            declare=_declare_server(False), strength='noise_multiplier'),
    Defense('weak_dp', 'dp', ('aggregate',), dict(_DP), _central_dp,
            'PASTEL paper Sect. 1.4 (WDP): DP-FedAvg calibrated per round', protects='aggregate',
            declare=_declare_server(True), strength='noise_multiplier'),
    Defense('bitrand', 'mechanism', ('batch',), {'epsilon': 'epsilon'},
            _input_mechanism('bitrand'), 'BitRand, Eq. (23) of the AMI paper',
            passthrough=('alpha', *_ENCODING)),
    Defense('ome', 'mechanism', ('batch',), {'epsilon': 'epsilon'}, _input_mechanism('ome'),
            'OME, Eq. (22) of the AMI paper', passthrough=('alpha', *_ENCODING)),
    Defense('gaussian', 'mechanism', ('batch',), {'sigma': 'sigma'},
            _input_mechanism('gaussian'), 'Gaussian mechanism, AMI paper Appendix E',
            defaults={'sigma': None}, passthrough=('epsilon', 'delta', 'sensitivity'),
            protects='server', declare=_declare_gaussian),
    Defense('ldp_sgd', 'mechanism', ('upload', 'report'),
            {'epsilon': 'epsilon', 'clip_norm': 'clip_norm'},
            _ldp_sgd, 'LDP-SGD, Algorithm 1 of the LDP-audit paper', protects='server',
            declare=_declare_ldp_sgd),
)}
NAMES = tuple(DEFENSES)
DP_DEFENSES = tuple(n for n, d in DEFENSES.items() if d.family == 'dp')
assert set(mechanism_registry.NAMES) <= set(NAMES)

# Each experiment's adversary: whom a defense must protect against there (declared with the
# experiment in `fl_privacy.catalog`; PASTEL's is None: it labels each row itself).
ADVERSARY = {name: e.adversary for name, e in catalog.EXPERIMENTS.items()}


def rule(field: str) -> validate.Rule:
  """The one rule of defense field `field`, for an experiment's own name of it (`fedmia.dp_clip`
  is `clip_norm`, `pastel.dp_delta` is `delta`): `validate.checked(config, name, rule(field))`."""
  return FIELDS[field].rule


def each(field: str) -> validate.Rule:
  """A non-empty sequence (or one value) whose every item passes `rule(field)` (a sweep)."""
  r = FIELDS[field].rule
  return validate.items(r, f'non-empty, every item {r.allowed}')


def spec(name: str, field: str = 'defense.name') -> Defense:
  """The declaration of `name`; ConfigError naming `field` for an unknown one."""
  validate.choice(NAMES).check(field, name)
  return DEFENSES[name]


def check_param(d: Defense, param: str, value: Any, field: str) -> Any:
  """`value` checked by the rule of the field that `param` of `d` reads."""
  rule = FIELDS[d.params[param]].rule
  if value is None and param in d.defaults and d.defaults[param] is None:
    return value  # optional for this defense (augment's pad, gaussian's sigma, ...)
  return rule.check(field, value)


def make(name: str, *, field_prefix: str = 'defense', **params: Any) -> client.ClientHooks:
  """The hooks of defense `name` with `params`, each checked by its field's rule.

  Raises:
    ConfigError: unknown name, unknown or missing parameter, or a value out of range, naming
      `<field_prefix>.<parameter>`.
  """
  d = spec(name, f'{field_prefix}.name')
  allowed = tuple(d.params) + d.passthrough
  for k in params:
    validate.require(k in allowed, f'{field_prefix}.{k}',
                     f'a parameter of {name}: one of {allowed}', params[k])
  full = {}
  for k in d.params:
    v = params.get(k, d.defaults.get(k, REQUIRED))
    validate.require(v is not REQUIRED, f'{field_prefix}.{k}', f'given for {name}', None)
    full[k] = check_param(d, k, v, f'{field_prefix}.{k}')
  for k in d.passthrough:
    if k in params:
      full[k] = params[k]
  return d.build(**full)


def check_fits(name: str, experiment: str, field: str = 'defense.name') -> None:
  """Refuses a defense whose guarantee does not hold against `experiment`'s adversary."""
  d = spec(name, field)
  adversary = ADVERSARY.get(experiment)
  if d.protects == 'aggregate' and adversary == 'server':
    raise validate.ConfigError(
        field, f'a defense that acts against the server of experiments.{experiment} (it reads '
        f'each upload before {name} adds its noise at aggregation, so {name} protects only '
        'third parties who see the aggregate); not one of '
        f'{tuple(n for n, x in DEFENSES.items() if x.protects == "aggregate")}', name)


def declaration(name: str, params: dict, setting: Setting) -> accounting.Declaration | None:
  """The accounting declaration of DP defense `name` (None for the others)."""
  d = spec(name)
  return None if d.declare is None else d.declare(params, setting)


def dp_metrics(name: str, params: dict, setting: Setting, *, noise_multiplier: float | None,
               target_epsilon: float | None, delta: float, accountant: str = 'rdp'
               ) -> tuple[float | None, dict[str, Any]]:
  """(noise multiplier, metrics) of a DP defense: calibrated or given, and its epsilon.

  The metrics carry `dp_epsilon` (for the declared unit, relation and adversary), `dp_delta`,
  `noise_multiplier` and `accounting.describe` of the declaration; weak_dp also carries
  `dp_epsilon_per_round` (its calibration) beside the composed `dp_epsilon`.
  """
  decl = declaration(name, params, setting)
  if decl is None:
    return noise_multiplier, {}
  if decl.pure_epsilon is None and target_epsilon is not None:
    noise_multiplier = accounting.noise_multiplier_for(decl, float(target_epsilon),
                                                       delta=delta, accountant=accountant)
  metrics: dict[str, Any] = {'dp_delta': float(delta), **accounting.describe(decl)}
  if decl.pure_epsilon is None:
    metrics['noise_multiplier'] = float(noise_multiplier)
  if name == 'weak_dp':
    metrics['dp_epsilon_per_round'] = accounting.epsilon(decl, noise_multiplier, delta=delta,
                                                         accountant=accountant)
    composed = dataclasses.replace(decl, compositions=int(setting.rounds))
    metrics['dp_epsilon'] = accounting.epsilon(composed, noise_multiplier, delta=delta,
                                               accountant=accountant)
    metrics['dp_compositions'] = int(setting.rounds)
  else:
    metrics['dp_epsilon'] = accounting.epsilon(decl, noise_multiplier, delta=delta,
                                               accountant=accountant)
  if decl.sampling == 'poisson' and decl.max_batch_size is not None:
    from fl_privacy.fl import sampling as sampling_lib  # pylint: disable=g-import-not-at-top
    metrics['dp_max_batch_size'] = int(decl.max_batch_size)
    metrics['dp_public_examples'] = int(setting.num_examples)
    metrics['dp_steps_per_epoch'] = steps_per_epoch(setting)
    n = int(setting.max_examples or setting.num_examples)
    metrics['dp_overflow_probability'] = sampling_lib.overflow_probability(
        n, poisson_rate(setting), int(decl.max_batch_size),
        int(setting.epochs) * steps_per_epoch(setting) * int(setting.rounds))
  if not math.isfinite(metrics['dp_epsilon']):
    metrics['dp_epsilon'] = math.inf
  return noise_multiplier, metrics
