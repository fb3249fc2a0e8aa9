"""Fast property tests of the one defense specification (registry.py, configured.py).

No training: every field's rule at its boundaries (the error names the field and the rule's
text), each builder's arguments (the hook factories are spied on), each defense's hooks at the
points its `hooks` tuple names, each DP declaration for a given Setting, `dp_metrics` against
`accounting.epsilon`, the threat-model check, `configure`'s params and metrics, the sweeps.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import _defense
from fl_privacy import accounting
from fl_privacy import validate
from fl_privacy.defenses import configured
from fl_privacy.defenses import data
from fl_privacy.defenses import dp
from fl_privacy.defenses import registry
from fl_privacy.defenses import update
from fl_privacy.fl import client
from fl_privacy.fl import sampling
from fl_privacy.mechanisms import ldp_sgd
from fl_privacy.mechanisms import registry as mechanism_registry

S = registry.Setting

# field -> (its rule's text, values it accepts (boundaries), values just outside it)
RULES = {
    'sigma': ('a finite number >= 0', (0, 0.0, 3.5), (-1e-9, math.inf, None, True, 'x')),
    'sparsity': ('a finite number in (0, 1] (the fraction of entries zeroed)', (1e-9, 1, 1.0),
                 (0, 0.0, 1 + 1e-9, None)),
    'sparsify_min_size': ('an integer >= 0', (0, 5), (-1, 1.0, None)),
    'bits': ('an integer in [1, 24]', (1, 24), (0, 25, 8.0)),
    'mixup_alpha': ('a finite number > 0', (1e-9, 2.0), (0, 0.0, None)),
    'mixup_public_code': ('True or False', (True, False), (0, 1, None)),
    'augment_level': ('one of (1, 2, 3, 4)', (1, 4), (0, 5, None)),
    'augment_pad': ('None or an integer >= 0', (None, 0, 3), (-1, 1.5)),
    'augment_jitter': ('a finite number in [0, 1]', (0, 1, 0.4), (-1e-9, 1 + 1e-9, None)),
    'sampling_fraction': ('a finite number in (0, 1]', (1e-9, 1.0), (0.0, 1 + 1e-9, None)),
    'clip_norm': ('a finite number > 0', (1e-9, 1.0), (0.0, -1.0, None)),
    'noise_multiplier': ('a finite number >= 0', (0.0, 2.0), (-1e-9, None)),
    'target_epsilon': ('None or a finite number > 0', (None, 1e-9, 4.0), (0.0, -1.0)),
    'delta': ('a finite number in (0, 1)', (1e-9, 1 - 1e-9), (0.0, 1.0, None)),
    'accountant': ("one of ('rdp', 'pld')", ('rdp', 'pld'), ('RDP', None)),
    'participation': ('a finite number in (0, 1]', (1e-9, 1.0), (0.0, 1 + 1e-9, None)),
    'dp_sgd_sampling': ("one of ('poisson', 'shuffle')", ('poisson', 'shuffle'),
                        ('Poisson', None)),
    'epsilon': ('a finite number > 0', (1e-9, 8.0), (0.0, None)),
    'num_classes': ('an integer >= 2', (2, 10), (1, 2.0, None)),
    'image_shape': ('None or (H, W, C)', (None, (8, 8, 1)), ((8, 8), (1, 2, 3, 4), 5)),
    'value_range': ('(low, high) with low < high', ((0.0, 1.0), (-1, 0)),
                    ((1.0, 1.0), (2, 1), (0.0,), (0, 1, 2), None)),
    'max_batch_size': ('None or an integer >= 1', (None, 1, 7), (0, 1.0)),
    'num_examples': ('None or an integer >= 1', (None, 1), (0, 2.5)),
    'batch_size': ('None or an integer >= 1', (None, 1), (0, -3)),
    'steps_per_epoch': ('None or an integer >= 1', (None, 1, 7), (0, 2.5)),
}

# field -> (default, read from the defense section)
DEFAULTS = {
    'sigma': (0.01, True), 'sparsity': (0.9, True), 'sparsify_min_size': (1000, True),
    'bits': (8, True), 'mixup_alpha': (1.0, True), 'mixup_public_code': (False, True),
    'augment_level': (2, True), 'augment_pad': (None, True), 'augment_jitter': (0.4, False),
    'sampling_fraction': (0.5, True), 'clip_norm': (1.0, True), 'noise_multiplier': (1.0, True),
    'target_epsilon': (None, True), 'delta': (1e-5, True), 'accountant': ('rdp', True),
    'participation': (1.0, True), 'dp_sgd_sampling': ('poisson', True), 'epsilon': (5.0, True),
    'num_classes': (None, False), 'image_shape': (None, False),
    'value_range': ((0.0, 1.0), False), 'max_batch_size': (None, False),
    'num_examples': (None, False), 'batch_size': (None, False),
    'steps_per_epoch': (None, False),
}


def test_every_field_has_its_rule_and_default():
  assert set(registry.FIELDS) == set(RULES) == set(DEFAULTS)
  for name, f in registry.FIELDS.items():
    assert f.rule.allowed == RULES[name][0], name
    assert (f.default, f.section) == DEFAULTS[name], name
    assert type(f.default) is type(DEFAULTS[name][0]), name
    assert f.doc, name


@pytest.mark.parametrize('name', sorted(RULES))
def test_each_rule_accepts_its_boundaries_and_rejects_just_outside(name):
  rule = registry.FIELDS[name].rule
  text, good, bad = RULES[name]
  for v in good:
    assert rule.check(f'defense.{name}', v) is v
  for v in bad:
    with pytest.raises(validate.ConfigError) as e:
      rule.check(f'defense.{name}', v)
    assert e.value.field == f'defense.{name}' and e.value.allowed == text
    assert f'defense.{name}' in str(e.value) and text in str(e.value)


def test_field_dataclass_defaults():
  f = registry.Field(validate.BOOLEAN)
  assert (f.default, f.doc, f.section) == (None, '', True)
  d = registry.Defense('x', 'none', (), {}, registry._none, 'src')
  assert (d.defaults, d.protects, d.declare, d.strength, d.passthrough) == ({}, None, None,
                                                                          None, ())


def test_setting_defaults():
  # steps_per_epoch None: the public schedule's ceil(num_examples / batch_size).
  assert tuple(S()) == (10, None, (0.0, 1.0), 1, 1, 1, None, 1, 1, None, None)
  assert S._fields == ('num_classes', 'image_shape', 'value_range', 'batch_size',
                       'num_examples', 'epochs', 'steps_per_epoch', 'rounds', 'num_clients',
                       'participants', 'max_examples')


# ----------------------------------------------------------------------------------------------
# The specification table.

SPEC = {  # name: family, hooks, params, protects, strength, passthrough, declares
    'none': ('none', (), {}, None, None, (), False),
    'update_noise': ('update', ('upload',), {'sigma': 'sigma'}, None, 'sigma', (), False),
    'sparsify': ('update', ('upload',), {'sparsity': 'sparsity', 'min_size': 'sparsify_min_size'},
                 None, 'sparsity', (), False),
    'quantize': ('update', ('upload',), {'bits': 'bits'}, None, 'bits', (), False),
    'mixup': ('data', ('batch',), {'alpha': 'mixup_alpha', 'num_classes': 'num_classes',
                                   'public_code': 'mixup_public_code'}, None, 'alpha', (), False),
    'augment': ('data', ('batch',), {'level': 'augment_level', 'pad': 'augment_pad',
                                     'image_shape': 'image_shape', 'jitter': 'augment_jitter',
                                     'value_range': 'value_range'}, None, 'level', (), False),
    'sampling': ('data', ('data',), {'fraction': 'sampling_fraction'}, None, 'fraction', (),
                 False),
    'augment_sampling': ('data', ('data', 'batch'),
                         {'level': 'augment_level', 'pad': 'augment_pad',
                          'image_shape': 'image_shape', 'jitter': 'augment_jitter',
                          'value_range': 'value_range', 'fraction': 'sampling_fraction'},
                         None, 'fraction', (), False),
    'dp_sgd': ('dp', ('grad', 'batches', 'report'),
               {'clip_norm': 'clip_norm', 'noise_multiplier': 'noise_multiplier',
                'sampling': 'dp_sgd_sampling', 'batch_size': 'batch_size',
                'num_examples': 'num_examples', 'max_batch_size': 'max_batch_size',
                'steps_per_epoch': 'steps_per_epoch'},
               'server', 'noise_multiplier', (), True),
    'update_dp': ('dp', ('upload', 'report'), {'clip_norm': 'clip_norm',
                                      'noise_multiplier': 'noise_multiplier'},
                  'server', 'noise_multiplier', (), True),
    'central_dp': ('dp', ('aggregate',), {'clip_norm': 'clip_norm',
                                          'noise_multiplier': 'noise_multiplier'},
                   'aggregate', 'noise_multiplier', (), True),
    'weak_dp': ('dp', ('aggregate',), {'clip_norm': 'clip_norm',
                                       'noise_multiplier': 'noise_multiplier'},
                'aggregate', 'noise_multiplier', (), True),
    'bitrand': ('mechanism', ('batch',), {'epsilon': 'epsilon'}, None, None,
                ('alpha', 'int_bits', 'frac_bits', 'sign_bit', 'honour_sign', 'num_features',
                 'rng_bits'), False),
    'ome': ('mechanism', ('batch',), {'epsilon': 'epsilon'}, None, None,
            ('alpha', 'int_bits', 'frac_bits', 'sign_bit', 'honour_sign', 'num_features',
             'rng_bits'), False),
    'gaussian': ('mechanism', ('batch',), {'sigma': 'sigma'}, 'server', None,
                 ('epsilon', 'delta', 'sensitivity'), True),
    'ldp_sgd': ('mechanism', ('upload', 'report'), {'epsilon': 'epsilon', 'clip_norm': 'clip_norm'},
                'server', None, (), True),
}


def test_the_specification_table():
  assert registry.NAMES == tuple(SPEC)
  assert registry.DP_DEFENSES == ('dp_sgd', 'update_dp', 'central_dp', 'weak_dp')
  for name, (family, hooks, params, protects, strength, passthrough, declares) in SPEC.items():
    d = registry.DEFENSES[name]
    assert d.name == name
    assert (d.family, d.hooks, d.params, d.protects, d.strength, d.passthrough) == (
        family, hooks, params, protects, strength, passthrough), name
    assert (d.declare is not None) == declares, name
    assert d.source and 'XX' not in d.source, name
    for p in params:
      assert d.field(p) == params[p]
  assert registry.DEFENSES['sparsify'].defaults == {'min_size': 1000}
  assert registry.DEFENSES['mixup'].defaults == {'public_code': False}
  aug = {'pad': None, 'image_shape': None, 'jitter': 0.4, 'value_range': (0.0, 1.0)}
  assert registry.DEFENSES['augment'].defaults == aug
  assert registry.DEFENSES['augment_sampling'].defaults == aug
  assert registry.DEFENSES['dp_sgd'].defaults == {'sampling': 'shuffle', 'batch_size': None,
                                                  'num_examples': None, 'max_batch_size': None,
                                                  'steps_per_epoch': None}
  assert registry.DEFENSES['gaussian'].defaults == {'sigma': None}
  assert registry.ADVERSARY == {'ami': 'server', 'dishonest_mia': 'server', 'fedmia': 'server',
                                'pastel': None, 'duplicates': None, 'ldp_audit': None,
                                'dp_audit': None, 'toy_game': None, 'flower_audit': 'server',
                                'training_audit': None, 'reconstruction': 'server',
                                'dp_bugs': None}


# Minimal params for make(name, ...).
MAKE = {
    'none': {}, 'update_noise': {'sigma': 0.1}, 'sparsify': {'sparsity': 0.5},
    'quantize': {'bits': 4}, 'mixup': {'alpha': 1.0, 'num_classes': 3},
    'augment': {'level': 1}, 'sampling': {'fraction': 0.5},
    'augment_sampling': {'level': 1, 'fraction': 0.5},
    'dp_sgd': {'clip_norm': 1.0, 'noise_multiplier': 1.0, 'sampling': 'poisson',
               'batch_size': 4, 'num_examples': 40},
    'update_dp': {'clip_norm': 1.0, 'noise_multiplier': 1.0},
    'central_dp': {'clip_norm': 1.0, 'noise_multiplier': 1.0},
    'weak_dp': {'clip_norm': 1.0, 'noise_multiplier': 1.0},
    'bitrand': {'epsilon': 1.0}, 'ome': {'epsilon': 1.0}, 'gaussian': {'sigma': 0.5},
    'ldp_sgd': {'epsilon': 1.0, 'clip_norm': 1.0},
}
POINTS = ('data', 'batch', 'grad', 'upload', 'aggregate', 'batches')


@pytest.mark.parametrize('name', list(SPEC))
def test_each_defense_hooks_at_its_points_only(name):
  hooks = registry.make(name, **MAKE[name])
  assert isinstance(hooks, client.ClientHooks)
  identity = client.IDENTITY
  for point in POINTS:
    changed = getattr(hooks, point) is not getattr(identity, point)
    assert changed == (point in registry.DEFENSES[name].hooks), (name, point)
  assert hooks.loss is identity.loss


def test_dp_sgd_shuffle_has_no_batches_hook():
  hooks = registry.make('dp_sgd', clip_norm=1.0, noise_multiplier=1.0)
  assert hooks.grad is not None and hooks.batches is None


def test_report_hooks_weigh_clients_by_public_counts():
  """`report` (the example count a client tells the server, its FedAvg weight): Poisson
  dp_sgd reports its declared N, the client-level DP defenses against the server (update_dp,
  ldp_sgd) 1 (equal weights), a client without rows 0; every other defense, shuffle dp_sgd
  included, has no hook (the real rows)."""
  n = jnp.asarray([3, 0, 40, 100])
  public = {'dp_sgd': [40, 0, 40, 40], 'update_dp': [1, 0, 1, 1], 'ldp_sgd': [1, 0, 1, 1]}
  for name in SPEC:
    hooks = registry.make(name, **MAKE[name])
    assert (hooks.report is not None) == (name in public), name
    np.testing.assert_array_equal(client.reported_sizes(hooks, n), public.get(name, n),
                                  err_msg=name)
  assert registry.make('dp_sgd', clip_norm=1.0, noise_multiplier=1.0).report is None


@pytest.fixture
def spies(monkeypatch):
  calls = {}

  def spy(module, attr):
    def fake(*args, **kwargs):
      calls[attr] = (args, kwargs)
      return ('hook', attr)
    monkeypatch.setattr(module, attr, fake)

  for attr in ('noise_hook', 'sparsify_hook', 'quantize_hook'):
    spy(update, attr)
  for attr in ('mixup_hook', 'augment_hook', 'sampling_hook'):
    spy(data, attr)
  for attr in ('dp_sgd_hook', 'update_dp_hook', 'central_dp_hook'):
    spy(dp, attr)
  spy(sampling, 'poisson_sampler')
  return calls


def test_builders_pass_their_params(spies):
  h = registry.make('update_noise', sigma=1)
  assert h.upload == ('hook', 'noise_hook') and spies['noise_hook'] == ((1.0,), {})
  assert type(spies['noise_hook'][0][0]) is float
  h = registry.make('sparsify', sparsity=0.75)
  assert h.upload == ('hook', 'sparsify_hook') and spies['sparsify_hook'] == ((0.25, 1000), {})
  registry.make('sparsify', sparsity=1, min_size=7)
  assert spies['sparsify_hook'] == ((0.0, 7), {})
  assert type(spies['sparsify_hook'][0][0]) is float
  h = registry.make('quantize', bits=3)
  assert h.upload == ('hook', 'quantize_hook') and spies['quantize_hook'] == ((3,), {})
  h = registry.make('mixup', alpha=2, num_classes=5)
  assert h.batch == ('hook', 'mixup_hook') and spies['mixup_hook'] == ((2.0, 5, False), {})
  assert type(spies['mixup_hook'][0][0]) is float
  registry.make('mixup', alpha=2.0, num_classes=5, public_code=True)
  assert spies['mixup_hook'][0][2] is True
  h = registry.make('augment', level=3, image_shape=(8, 8, 1), value_range=(-1, 2), jitter=0.2)
  assert h.batch == ('hook', 'augment_hook')
  assert spies['augment_hook'] == ((3, 1, (8, 8, 1), 0.2, (-1.0, 2.0)), {})
  assert [type(v) for v in spies['augment_hook'][0][4]] == [float, float]
  registry.make('augment', level=2, pad=0)
  assert spies['augment_hook'] == ((2, 0, None, 0.4, (0.0, 1.0)), {})
  registry.make('augment', level=2, image_shape=(32, 32, 3))
  assert spies['augment_hook'][0][1] == 4
  h = registry.make('sampling', fraction=1)
  assert h.data == ('hook', 'sampling_hook') and spies['sampling_hook'] == ((1.0,), {})
  assert type(spies['sampling_hook'][0][0]) is float
  h = registry.make('augment_sampling', level=4, fraction=0.25, image_shape=(16, 20, 3))
  assert h.data == ('hook', 'sampling_hook') and h.batch == ('hook', 'augment_hook')
  assert spies['sampling_hook'] == ((0.25,), {})
  assert spies['augment_hook'] == ((4, 1, (16, 20, 3), 0.4, (0.0, 1.0)), {})
  h = registry.make('update_dp', clip_norm=2, noise_multiplier=0.5)
  assert h.upload == ('hook', 'update_dp_hook') and spies['update_dp_hook'] == ((2.0, 0.5), {})
  assert type(spies['update_dp_hook'][0][0]) is float
  for name in ('central_dp', 'weak_dp'):
    h = registry.make(name, clip_norm=3, noise_multiplier=0.25)
    assert h.aggregate == ('hook', 'central_dp_hook')
    assert spies['central_dp_hook'] == ((3.0, 0.25), {})
    assert type(spies['central_dp_hook'][0][0]) is float


def test_dp_sgd_builder(spies):
  # Shuffled lots divide by the lot size B when the experiment gives it, else by the rows.
  h = registry.make('dp_sgd', clip_norm=2, noise_multiplier=0.5)
  assert h.grad == ('hook', 'dp_sgd_hook') and h.batches is None
  assert spies['dp_sgd_hook'] == ((2.0, 0.5, None), {})
  assert type(spies['dp_sgd_hook'][0][0]) is float
  registry.make('dp_sgd', clip_norm=2, noise_multiplier=0.5, batch_size=4)
  assert spies['dp_sgd_hook'] == ((2.0, 0.5, 4.0), {})
  assert type(spies['dp_sgd_hook'][0][2]) is float
  h = registry.make('dp_sgd', clip_norm=2, noise_multiplier=0.5, sampling='poisson',
                    batch_size=4, num_examples=40, max_batch_size=9)
  assert h.grad == ('hook', 'dp_sgd_hook') and h.batches == ('hook', 'poisson_sampler')
  assert spies['dp_sgd_hook'] == ((2.0, 0.5, 4.0), {})
  assert type(spies['dp_sgd_hook'][0][2]) is float
  # The public schedule: the declared N = 40 and B = 4, S = ceil(40 / 4) = 10 steps an epoch.
  assert spies['poisson_sampler'] == ((9,), {'num_examples': 40, 'batch_size': 4,
                                             'steps_per_epoch': 10})
  assert [type(v) for v in spies['poisson_sampler'][1].values()] == [int, int, int]
  # The client reports the public N as its FedAvg weight (0 without rows), not its rows.
  np.testing.assert_array_equal(h.report(jnp.asarray([3, 0, 40, 100])), [40, 0, 40, 40])
  registry.make('dp_sgd', clip_norm=2, noise_multiplier=0.5, sampling='poisson',
                batch_size=4, num_examples=40, max_batch_size=9, steps_per_epoch=3)
  assert spies['poisson_sampler'] == ((9,), {'num_examples': 40, 'batch_size': 4,
                                             'steps_per_epoch': 3})  # declared steps kept
  registry.make('dp_sgd', clip_norm=2, noise_multiplier=0.5, sampling='poisson',
                batch_size=10, num_examples=100)
  # One step (the hook alone; experiments pass the run's max_batch_size) at the public rate
  # q = 10 / 100: 36, not 37 for two.
  assert spies['poisson_sampler'][0] == (sampling.max_batch_size(100, 10, 1, rate=0.1),) == (
      36,)
  assert spies['poisson_sampler'][1] == {'num_examples': 100, 'batch_size': 10,
                                         'steps_per_epoch': 10}
  for missing in ({'batch_size': 4}, {'num_examples': 40}):
    with pytest.raises(validate.ConfigError) as e:
      registry.make('dp_sgd', clip_norm=2, noise_multiplier=0.5, sampling='poisson', **missing)
    assert e.value.field == 'defense.dp_sgd_sampling'
    assert e.value.allowed == ("'shuffle' where the experiment does not give the batch size "
                               'and the declared record count')
    assert e.value.got == 'poisson'


def test_input_mechanisms_flatten_and_restore(monkeypatch):
  seen = {}

  def randomizer(name, **params):
    seen['args'] = (name, params)

    def fn(key, flat):
      seen['flat'] = (flat.shape, flat.dtype)
      return flat * 2.0 + 0.25
    return fn
  monkeypatch.setattr(mechanism_registry, 'randomizer', randomizer)
  for name in ('bitrand', 'ome'):
    registry.make(name, epsilon=2.0, alpha=0.3, int_bits=3)
    assert seen['args'] == (name, {'epsilon': 2.0, 'alpha': 0.3, 'int_bits': 3})
  hooks = registry.make('gaussian', sigma=None, epsilon=1.0, delta=1e-5)
  assert seen['args'] == ('gaussian', {'sigma': None, 'epsilon': 1.0, 'delta': 1e-5})
  x = jnp.arange(2 * 3 * 2 * 1, dtype=jnp.bfloat16).reshape(2, 3, 2, 1)
  y, mask = jnp.array([0, 1]), jnp.array([1.0, 0.0])
  out, y2, m2 = hooks.batch(jax.random.PRNGKey(0), x, y, mask, None)
  assert seen['flat'] == ((2, 6), jnp.float32)
  assert out.shape == x.shape and out.dtype == x.dtype
  np.testing.assert_array_equal(np.asarray(out, np.float32),
                                np.asarray(x, np.float32) * 2 + 0.25)
  assert y2 is y and m2 is mask


def test_ldp_sgd_upload(monkeypatch):
  seen = {}

  def randomize(key, flat, epsilon, clip_norm):
    seen['r'] = (flat.shape, epsilon, clip_norm)
    seen['key'] = key
    return flat + 1.0

  def debias_scale(dim, epsilon, clip_norm):
    seen['d'] = (dim, epsilon, clip_norm)
    return 3.0
  monkeypatch.setattr(ldp_sgd, 'randomize', randomize)
  monkeypatch.setattr(ldp_sgd, 'debias_scale', debias_scale)
  delta = {'a': jnp.ones((2, 2)), 'b': jnp.zeros(3)}
  hooks = registry.make('ldp_sgd', epsilon=2, clip_norm=0.5)
  key = jax.random.PRNGKey(0)
  out = hooks.upload(key, delta, None)
  assert seen['key'] is key
  assert seen['r'] == ((7,), 2.0, 0.5) and seen['d'] == (7, 2.0, 0.5)
  assert type(seen['r'][1]) is float and type(seen['r'][2]) is float
  np.testing.assert_array_equal(out['a'], np.full((2, 2), 6.0))
  np.testing.assert_array_equal(out['b'], np.full(3, 3.0))


# ----------------------------------------------------------------------------------------------
# make: parameter checking.


def test_make_names_the_field_and_rule():
  with pytest.raises(validate.ConfigError) as e:
    registry.make('nope')
  assert e.value.field == 'defense.name' and e.value.allowed == f'one of {registry.NAMES}'
  with pytest.raises(validate.ConfigError) as e:
    registry.make('nope', field_prefix='p')
  assert e.value.field == 'p.name'
  with pytest.raises(validate.ConfigError) as e:
    registry.make(3)
  assert e.value.field == 'defense.name'
  with pytest.raises(validate.ConfigError) as e:
    registry.make('sparsify', sparsity=0.5, bits=3, field_prefix='p')
  assert e.value.field == 'p.bits' and e.value.got == 3
  assert e.value.allowed == "a parameter of sparsify: one of ('sparsity', 'min_size')"
  with pytest.raises(validate.ConfigError) as e:
    registry.make('bitrand', epsilon=1.0, foo=1)
  assert e.value.allowed == ('a parameter of bitrand: one of '
                             f"{('epsilon', 'alpha', *registry._ENCODING)}")
  with pytest.raises(validate.ConfigError) as e:
    registry.make('update_noise', field_prefix='p')
  assert (e.value.field, e.value.allowed, e.value.got) == ('p.sigma', 'given for update_noise',
                                                           None)
  with pytest.raises(validate.ConfigError) as e:
    registry.make('quantize', bits=25, field_prefix='p')
  assert (e.value.field, e.value.allowed, e.value.got) == ('p.bits', 'an integer in [1, 24]', 25)
  # None passes only where the defense's default is None.
  with pytest.raises(validate.ConfigError) as e:
    registry.make('update_noise', sigma=None)
  assert e.value.field == 'defense.sigma'
  with pytest.raises(validate.ConfigError) as e:
    registry.make('sparsify', sparsity=0.5, min_size=None)
  assert e.value.field == 'defense.min_size'
  registry.make('augment', level=1, pad=None)
  registry.make('gaussian', sigma=None, epsilon=1.0, delta=1e-5)
  registry.make('gaussian', sigma=0.0)


def test_check_param():
  d = registry.DEFENSES['augment']
  assert registry.check_param(d, 'pad', None, 'f') is None
  assert registry.check_param(d, 'pad', 2, 'f') == 2
  with pytest.raises(validate.ConfigError) as e:
    registry.check_param(d, 'level', None, 'f.x')
  assert e.value.field == 'f.x'
  with pytest.raises(validate.ConfigError):
    registry.check_param(registry.DEFENSES['sparsify'], 'sparsity', None, 'f')


def test_spec():
  assert registry.spec('quantize') is registry.DEFENSES['quantize']
  with pytest.raises(validate.ConfigError) as e:
    registry.spec('x', 'a.b')
  assert (e.value.field, e.value.allowed, e.value.got) == ('a.b', f'one of {registry.NAMES}', 'x')
  with pytest.raises(validate.ConfigError) as e:
    registry.spec('x')
  assert e.value.field == 'defense.name'


# ----------------------------------------------------------------------------------------------
# Threat model.

AGGREGATE_ONLY = ('central_dp', 'weak_dp')


@pytest.mark.parametrize('experiment', ['ami', 'dishonest_mia', 'fedmia'])
def test_aggregate_only_refused_where_the_server_reads_uploads(experiment):
  for name in registry.NAMES:
    if name in AGGREGATE_ONLY:
      with pytest.raises(validate.ConfigError) as e:
        registry.check_fits(name, experiment, 'x.name')
      assert e.value.field == 'x.name' and e.value.got == name
      assert e.value.allowed == (
          f'a defense that acts against the server of experiments.{experiment} (it reads '
          f'each upload before {name} adds its noise at aggregation, so {name} protects only '
          f"third parties who see the aggregate); not one of ('central_dp', 'weak_dp')")
      with pytest.raises(validate.ConfigError) as e:
        registry.check_fits(name, experiment)
      assert e.value.field == 'defense.name'
    else:
      assert registry.check_fits(name, experiment) is None


def test_pastel_and_unknown_experiments_accept_every_defense():
  for name in registry.NAMES:
    registry.check_fits(name, 'pastel')
    registry.check_fits(name, 'elsewhere')
  with pytest.raises(validate.ConfigError) as e:
    registry.check_fits('nope', 'pastel', 'y.name')
  assert e.value.field == 'y.name'


# ----------------------------------------------------------------------------------------------
# Declarations and metrics.


def _decl(**kw):
  return accounting.Declaration(**kw)


def test_declarations():
  s = S(batch_size=4, num_examples=40, epochs=3, steps_per_epoch=5, rounds=7, num_clients=10)
  assert registry.declaration('dp_sgd', {}, s) == accounting.dp_sgd(
      batch_size=4, num_examples=40, steps=105, epochs=21, sampling='shuffle')
  d = registry.declaration('dp_sgd', {'sampling': 'shuffle'}, s)
  assert (d.unit, d.relation, d.adversary, d.sampling, d.sensitivity, d.compositions) == (
      'record', 'replace_one', 'server', 'shuffle', 2.0, 21)
  d = registry.declaration('dp_sgd', {'sampling': 'poisson', 'max_batch_size': 11}, s)
  assert (d.unit, d.relation, d.adversary, d.sampling, d.sensitivity, d.compositions,
          d.sampling_rate, d.population, d.max_batch_size) == (
      'record', 'add_remove', 'server', 'poisson', 1.0, 105, 0.1, 40, 11)
  # steps_per_epoch None: the public schedule's ceil(40 / 4) = 10 steps an epoch, 3 x 10 x 7.
  d = registry.declaration('dp_sgd', {'sampling': 'poisson', 'max_batch_size': 11},
                           s._replace(steps_per_epoch=None))
  assert (d.compositions, d.sampling_rate) == (210, 0.1)
  d = registry.declaration('dp_sgd', {}, s._replace(steps_per_epoch=None, num_examples=42))
  assert d == accounting.dp_sgd(batch_size=4, num_examples=42, steps=3 * 11 * 7, epochs=21,
                                sampling='shuffle')
  d = registry.declaration('update_dp', {'clip_norm': 1.0}, s)
  assert d == _decl(mechanism='update_dp', unit='client', relation='replace_one',
                    adversary='server', sampling='none', sensitivity=2.0, compositions=7)
  for name, comps in (('central_dp', 7), ('weak_dp', 1)):
    d = registry.declaration(name, {}, s)
    assert (d.mechanism, d.unit, d.relation, d.adversary, d.sampling, d.sensitivity,
            d.compositions, d.sampling_rate, d.population, d.sample_size) == (
        name, 'client', 'replace_one', 'aggregate', 'none', 2.0, comps, 1.0, 10, 10)
    d = registry.declaration(name, {'participation': 0.25}, s)
    assert (d.sampling, d.sample_size, d.sampling_rate) == ('without_replacement', 2, 0.2)
    d = registry.declaration(name, {'participation': 0.35}, s)  # round(3.5) = 4
    assert d.sample_size == 4
    d = registry.declaration(name, {'participation': 0.01}, s)  # at least one
    assert d.sample_size == 1
    d = registry.declaration(name, {'participation': 0.01}, s._replace(participants=3))
    assert d.sample_size == 3
    d = registry.declaration(name, {'participation': 0.5}, s._replace(num_clients=1))
    assert d.sample_size == 1 and d.sampling == 'none'
  d = registry.declaration('ldp_sgd', {'epsilon': 3}, s)
  assert d == _decl(mechanism='ldp_sgd', unit='client', relation='replace_one',
                    adversary='server', sampling='none', sensitivity=2.0, compositions=7,
                    pure_epsilon=3.0)
  assert registry.declaration('gaussian', {'sigma': 1.0}, s) == accounting.gaussian_input()
  for name in ('none', 'sparsify', 'mixup', 'bitrand', 'ome', 'augment'):
    assert registry.declaration(name, {}, s) is None


SET = S(batch_size=5, num_examples=50, epochs=2, steps_per_epoch=10, rounds=4, num_clients=8)


@pytest.mark.parametrize('name,params', [
    ('dp_sgd', {'sampling': 'shuffle'}), ('update_dp', {}), ('central_dp', {}),
    ('central_dp', {'participation': 0.5})])
def test_dp_metrics_epsilon_is_the_declarations(name, params):
  decl = registry.declaration(name, params, SET)
  z, m = registry.dp_metrics(name, params, SET, noise_multiplier=1.3, target_epsilon=None,
                             delta=1e-4)
  assert z == 1.3
  assert m == {'dp_delta': 1e-4, **accounting.describe(decl), 'noise_multiplier': 1.3,
               'dp_epsilon': accounting.epsilon(decl, 1.3, delta=1e-4)}
  assert type(m['dp_delta']) is float


@pytest.fixture
def fake_accounting(monkeypatch):
  """accounting.epsilon / noise_multiplier_for as recorders of their arguments (no PLD runs)."""
  def epsilon(decl, z=None, *, delta, accountant='rdp'):
    return (decl.compositions * (10.0 if z is None else 1.0 / (z + 1.0)) + delta
            + (0.5 if accountant == 'pld' else 0.0))

  def noise_multiplier_for(decl, target, *, delta, accountant='rdp'):
    return 100.0 * decl.compositions + target + delta + (0.001 if accountant == 'pld' else 0.0)
  monkeypatch.setattr(accounting, 'epsilon', epsilon)
  monkeypatch.setattr(accounting, 'noise_multiplier_for', noise_multiplier_for)
  return epsilon


def test_dp_metrics_forwards_delta_and_accountant(fake_accounting):
  decl = registry.declaration('update_dp', {}, SET)
  for acc in ('rdp', 'pld'):
    _, m = registry.dp_metrics('update_dp', {}, SET, noise_multiplier=1.0, target_epsilon=None,
                               delta=0.125, accountant=acc)
    assert m['dp_epsilon'] == fake_accounting(decl, 1.0, delta=0.125, accountant=acc)
    _, m = registry.dp_metrics('weak_dp', {}, SET, noise_multiplier=1.0, target_epsilon=None,
                               delta=0.125, accountant=acc)
    wd = registry.declaration('weak_dp', {}, SET)
    assert m['dp_epsilon_per_round'] == fake_accounting(wd, 1.0, delta=0.125, accountant=acc)
    assert m['dp_epsilon'] == fake_accounting(dataclasses.replace(wd, compositions=4), 1.0,
                                              delta=0.125, accountant=acc)
  calls = []
  monkey_z = lambda decl, t, *, delta, accountant='rdp': calls.append(
      (decl, t, type(t), delta, accountant)) or 0.5
  accounting.noise_multiplier_for = monkey_z  # undone by the fixture's monkeypatch
  z, m = registry.dp_metrics('update_dp', {}, SET, noise_multiplier=1.0, target_epsilon=3,
                             delta=0.125, accountant='pld')
  assert calls == [(decl, 3.0, float, 0.125, 'pld')] and z == 0.5
  assert m['noise_multiplier'] == 0.5
  assert m['dp_epsilon'] == fake_accounting(decl, 0.5, delta=0.125, accountant='pld')


def test_dp_metrics_calibrates_for_a_target():
  decl = registry.declaration('update_dp', {}, SET)
  z, m = registry.dp_metrics('update_dp', {}, SET, noise_multiplier=0.1, target_epsilon=4,
                             delta=1e-5)
  assert z == accounting.noise_multiplier_for(decl, 4.0, delta=1e-5)
  assert m['noise_multiplier'] == z and type(m['noise_multiplier']) is float
  assert m['dp_epsilon'] <= 4.0 and m['dp_epsilon'] == accounting.epsilon(decl, z, delta=1e-5)


def test_weak_dp_per_round_and_composed():
  decl = registry.declaration('weak_dp', {}, SET)
  assert decl.compositions == 1
  composed = dataclasses.replace(decl, compositions=4)
  for acc in ('rdp',):
    z, m = registry.dp_metrics('weak_dp', {}, SET, noise_multiplier=2.0, target_epsilon=None,
                               delta=1e-5, accountant=acc)
    assert m['dp_epsilon_per_round'] == accounting.epsilon(decl, 2.0, delta=1e-5,
                                                           accountant=acc)
    assert m['dp_epsilon'] == accounting.epsilon(composed, 2.0, delta=1e-5, accountant=acc)
    assert m['dp_compositions'] == 4 and m['dp_epsilon'] > m['dp_epsilon_per_round']
  # The target calibrates the per-round epsilon.
  z, m = registry.dp_metrics('weak_dp', {}, SET, noise_multiplier=9.0, target_epsilon=2.0,
                             delta=1e-5)
  assert z == accounting.noise_multiplier_for(decl, 2.0, delta=1e-5)
  assert m['dp_epsilon_per_round'] <= 2.0 < m['dp_epsilon']


def test_dp_metrics_of_pure_and_non_dp_defenses():
  z, m = registry.dp_metrics('ldp_sgd', {'epsilon': 2.0}, SET, noise_multiplier=None,
                             target_epsilon=1.0, delta=1e-5)
  assert z is None and 'noise_multiplier' not in m
  assert m['dp_epsilon'] == 8.0 and m['dp_unit'] == 'client'
  assert registry.dp_metrics('sparsify', {}, SET, noise_multiplier=0.7, target_epsilon=1.0,
                             delta=1e-5) == (0.7, {})
  z, m = registry.dp_metrics('update_dp', {}, SET, noise_multiplier=0.0, target_epsilon=None,
                             delta=1e-5)
  assert m['dp_epsilon'] == math.inf and type(m['dp_epsilon']) is float


def test_dp_metrics_poisson_batch():
  s = S(batch_size=5, num_examples=50, epochs=2, steps_per_epoch=3, rounds=4,
        max_examples=80)
  b = registry.poisson_max_batch(s)
  p = {'sampling': 'poisson', 'max_batch_size': b}
  _, m = registry.dp_metrics('dp_sgd', p, s, noise_multiplier=1.0, target_epsilon=None,
                             delta=1e-5)
  assert m['dp_max_batch_size'] == b
  assert (m['dp_public_examples'], m['dp_steps_per_epoch']) == (50, 3)
  # Every client runs the public schedule: the declared 3 steps an epoch at q = 5 / 50, the
  # largest (80 rows) included (its batch is Binomial(80, 0.1)).
  steps = 2 * 3 * 4
  assert m['dp_overflow_probability'] == sampling.overflow_probability(80, 0.1, b, steps)
  assert 0 < m['dp_overflow_probability'] <= 1e-12
  # steps_per_epoch None: ceil(50 / 5) = 10 steps an epoch.
  s3 = s._replace(steps_per_epoch=None)
  b3 = registry.poisson_max_batch(s3)
  _, m = registry.dp_metrics('dp_sgd', {**p, 'max_batch_size': b3}, s3, noise_multiplier=1.0,
                             target_epsilon=None, delta=1e-5)
  assert (m['dp_public_examples'], m['dp_steps_per_epoch']) == (50, 10)
  assert m['dp_overflow_probability'] == sampling.overflow_probability(80, 0.1, b3, 2 * 10 * 4)
  assert m['dp_compositions'] == 2 * 10 * 4
  s2 = s._replace(steps_per_epoch=20, max_examples=None, batch_size=100)
  _, m = registry.dp_metrics('dp_sgd', {**p, 'max_batch_size': 30}, s2, noise_multiplier=1.0,
                             target_epsilon=None, delta=1e-5)
  assert m['dp_overflow_probability'] == sampling.overflow_probability(50, 1.0, 30, 2 * 20 * 4)
  _, m = registry.dp_metrics('dp_sgd', {'sampling': 'poisson'}, s, noise_multiplier=1.0,
                             target_epsilon=None, delta=1e-5)
  assert not {'dp_max_batch_size', 'dp_overflow_probability', 'dp_public_examples',
              'dp_steps_per_epoch'} & set(m)


def test_poisson_steps_per_epoch_round_a_partial_batch_up():
  # N = 28, B = 3, steps_per_epoch None: ceil(28 / 3) = 10 steps per epoch (not 9.33), 20 over
  # two rounds; the padded batch for 20 steps (20) differs from the one for 18.67 steps (19).
  s = S(batch_size=3, num_examples=28, epochs=1, steps_per_epoch=None, rounds=2)
  assert registry.steps_per_epoch(s) == 10
  assert registry.poisson_max_batch(s) == sampling.max_batch_size(28, 3, 20) == 20
  assert sampling.max_batch_size(28, 3, 2 * 28 / 3) == 19
  _, m = registry.dp_metrics('dp_sgd', {'sampling': 'poisson', 'max_batch_size': 19}, s,
                             noise_multiplier=1.0, target_epsilon=None, delta=1e-5)
  assert m['dp_overflow_probability'] == sampling.overflow_probability(28, 3 / 28, 19, 20)
  assert m['dp_steps_per_epoch'] == 10
  # A declared steps_per_epoch is the schedule's, even below ceil(N / B): 1 step an epoch.
  one = s._replace(steps_per_epoch=1)
  assert registry.steps_per_epoch(one) == 1
  assert registry.poisson_max_batch(one) == sampling.max_batch_size(28, 3, 2) < 20


def test_public_schedule_helpers():
  # steps_per_epoch: the declared count, or ceil(num_examples / batch_size).
  assert registry.steps_per_epoch(S(batch_size=5, num_examples=50)) == 10
  assert registry.steps_per_epoch(S(batch_size=5, num_examples=51)) == 11
  assert registry.steps_per_epoch(S(batch_size=100, num_examples=50)) == 1
  assert registry.steps_per_epoch(S(batch_size=5, num_examples=50, steps_per_epoch=3)) == 3
  assert type(registry.steps_per_epoch(S(batch_size=5, num_examples=50))) is int
  # poisson_rate: min(B / N, 1), of the declared N (never max_examples).
  assert registry.poisson_rate(S(batch_size=5, num_examples=50)) == 0.1
  assert registry.poisson_rate(S(batch_size=5, num_examples=50, max_examples=500)) == 0.1
  assert registry.poisson_rate(S(batch_size=100, num_examples=50)) == 1.0
  # Both are those of the sampler's public schedule.
  for s in (S(batch_size=5, num_examples=52), S(batch_size=8, num_examples=80,
                                                steps_per_epoch=4)):
    assert sampling.public_schedule(s.num_examples, s.batch_size, s.steps_per_epoch) == (
        registry.poisson_rate(s), registry.steps_per_epoch(s))


def test_dp_metrics_reports_a_non_finite_epsilon_as_inf(monkeypatch):
  # Whatever non-finite value the accountant returns (NaN here) is reported as inf, under the
  # one key `dp_epsilon`.
  decl = registry.declaration('update_dp', {}, SET)
  monkeypatch.setattr(accounting, 'epsilon', lambda *a, **k: math.nan)
  _, m = registry.dp_metrics('update_dp', {}, SET, noise_multiplier=1.0, target_epsilon=None,
                             delta=1e-5)
  assert m == {'dp_delta': 1e-5, **accounting.describe(decl), 'noise_multiplier': 1.0,
               'dp_epsilon': math.inf}

def test_poisson_max_batch():
  # The public schedule: the declared 3 steps an epoch (epochs x steps x rounds = 24 steps) at
  # q = B / N = 0.1 of the declared N, for the largest shard (max_examples, else N).
  s = S(batch_size=5, num_examples=50, epochs=2, steps_per_epoch=3, rounds=4)
  assert registry.poisson_max_batch(s) == sampling.max_batch_size(50, 5, 2 * 3 * 4, rate=0.1)
  assert registry.poisson_max_batch(s._replace(max_examples=80)) == sampling.max_batch_size(
      80, 5, 2 * 3 * 4, rate=0.1)
  # The public rate on the larger shard needs more slots than its own B / 80 would.
  assert registry.poisson_max_batch(s._replace(max_examples=80)) > sampling.max_batch_size(
      80, 5, 2 * 3 * 4)
  assert registry.poisson_max_batch(s._replace(steps_per_epoch=40)) == sampling.max_batch_size(
      50, 5, 2 * 40 * 4, rate=0.1)
  assert registry.poisson_max_batch(s._replace(num_examples=52)) == sampling.max_batch_size(
      52, 5, 2 * 3 * 4, rate=5 / 52)
  # steps_per_epoch None: ceil(N / B) steps an epoch.
  none = s._replace(steps_per_epoch=None)
  assert registry.poisson_max_batch(none) == sampling.max_batch_size(50, 5, 2 * 10 * 4)
  assert registry.poisson_max_batch(none._replace(num_examples=52)) == sampling.max_batch_size(
      52, 5, 2 * 11 * 4)
  assert registry.poisson_max_batch(none._replace(max_examples=80)) == sampling.max_batch_size(
      80, 5, 2 * 10 * 4, rate=0.1)


def test_default_pad():
  assert registry.default_pad(None) == 4
  assert registry.default_pad((16, 16, 1)) == 1
  assert registry.default_pad((16, 32, 3)) == 1
  assert registry.default_pad((32, 16, 3)) == 1
  assert registry.default_pad((17, 17, 1)) == 4
  assert registry.default_pad((8, 8)) == 1


# ----------------------------------------------------------------------------------------------
# configured.py: the defense section.


def _section(name, **fields):
  s = _defense.section('digits', False)
  s.name = name
  for k, v in fields.items():
    s[k] = v
  return s


def test_section_fields():
  assert list(configured.section_fields()) == [k for k, f in registry.FIELDS.items()
                                               if f.section]
  assert all(configured.section_fields()[k] is registry.FIELDS[k]
             for k in configured.section_fields())


def test_validate_section_checks_every_field_whatever_the_name():
  assert configured.validate_section(_section('quantize')) == 'quantize'
  for bad in ('nope', 3):
    sec = _section('none')
    with sec.unlocked():
      del sec['name']
      sec['name'] = bad
    with pytest.raises(validate.ConfigError) as e:
      configured.validate_section(sec, 'p')
    assert (e.value.field, e.value.allowed, e.value.got) == ('p.name',
                                                             f'one of {registry.NAMES}', bad)
  for field, (text, _, bad) in RULES.items():
    if not registry.FIELDS[field].section:
      continue
    value = next(v for v in bad if v is not None and not isinstance(v, (bool, str, tuple)))\
        if field not in ('accountant', 'dp_sgd_sampling', 'mixup_public_code') else bad[0]
    s = _section('none')
    with s.unlocked():
      del s[field]
      s[field] = value
    with pytest.raises(validate.ConfigError) as e:
      configured.validate_section(s, 'p')
    assert (e.value.field, e.value.allowed) == (f'p.{field}', text)
    with pytest.raises(validate.ConfigError) as e:
      configured.validate_section(s)
    assert e.value.field == f'defense.{field}'
  # A section without a field is fine (only the fields it has are checked).
  s = _section('none')
  with s.unlocked():
    del s['sigma']
  assert configured.validate_section(s) == 'none'


def test_check_honoured():
  assert configured.check_honoured(_section('none'), 'fedmia', ('none',), 'r') == 'none'
  with pytest.raises(validate.ConfigError) as e:
    configured.check_honoured(_section('mixup'), 'fedmia', ('none', 'sparsify'), 'its own',
                              'p')
  assert (e.value.field, e.value.got) == ('p.name', 'mixup')
  assert e.value.allowed == "one of ('none', 'sparsify') for experiments.fedmia (its own)"
  with pytest.raises(validate.ConfigError) as e:
    configured.check_honoured(_section('weak_dp'), 'dishonest_mia', registry.NAMES, 'r', 'p')
  assert e.value.field == 'p.name' and 'server of experiments.dishonest_mia' in e.value.allowed
  assert configured.check_honoured(_section('weak_dp'), 'pastel', registry.NAMES, 'r') == \
      'weak_dp'
  with pytest.raises(validate.ConfigError) as e:
    configured.check_honoured(_section('none', bits=0), 'x', ('none',), 'r', 'p')
  assert e.value.field == 'p.bits'
  with pytest.raises(validate.ConfigError) as e:
    configured.check_honoured(_section('mixup'), 'fedmia', ('none',), 'r')
  assert e.value.field == 'defense.name'


CSET = S(num_classes=7, image_shape=(12, 12, 1), value_range=(-1.0, 1.0), batch_size=5,
         num_examples=50, epochs=2, steps_per_epoch=10, rounds=4, num_clients=8)
# poisson_sampler's keyword arguments for CSET: its public schedule.
POISSON_CSET = {'num_examples': 50, 'batch_size': 5, 'steps_per_epoch': 10}


def test_configure_non_dp(spies):
  c = configured.configure(_section('none'), CSET, experiment='fedmia')
  assert c == configured.Configured(client.IDENTITY, {'defense': 'none'}, {}, None)
  c = configured.configure(_section('sparsify', sparsity=0.75, sparsify_min_size=3), CSET,
                           experiment='fedmia')
  assert c.params == {'defense': 'sparsify', 'defense_sparsity': 0.75,
                      'defense_sparsify_min_size': 3}
  assert c.metrics == {} and c.declaration is None and spies['sparsify_hook'] == ((0.25, 3), {})
  c = configured.configure(_section('mixup', mixup_alpha=0.5), CSET, experiment='ami')
  assert c.params == {'defense': 'mixup', 'defense_mixup_alpha': 0.5,
                      'defense_mixup_public_code': False}
  assert spies['mixup_hook'] == ((0.5, 7, False), {})
  c = configured.configure(_section('augment', augment_level=3), CSET, experiment='ami')
  assert c.params == {'defense': 'augment', 'defense_augment_level': 3,
                      'defense_augment_pad': 1}
  assert spies['augment_hook'] == ((3, 1, (12, 12, 1), 0.4, (-1.0, 1.0)), {})
  c = configured.configure(_section('augment_sampling', augment_pad=2, sampling_fraction=0.3),
                           CSET._replace(image_shape=None), experiment='ami')
  assert c.params == {'defense': 'augment_sampling', 'defense_augment_level': 2,
                      'defense_augment_pad': 2, 'defense_sampling_fraction': 0.3}
  assert spies['augment_hook'] == ((2, 2, None, 0.4, (-1.0, 1.0)), {})
  assert spies['sampling_hook'] == ((0.3,), {})
  c = configured.configure(_section('augment'), CSET._replace(image_shape=None),
                           experiment='ami')
  assert c.params['defense_augment_pad'] == 4
  with pytest.raises(validate.ConfigError) as e:
    configured.configure(_section('mixup'), CSET._replace(num_classes=1), experiment='ami',
                         prefix='p')
  assert e.value.field == 'p.num_classes'


def test_configure_refuses_aggregate_dp_against_the_server():
  for name in AGGREGATE_ONLY:
    with pytest.raises(validate.ConfigError) as e:
      configured.configure(_section(name), CSET, experiment='dishonest_mia', prefix='p')
    assert e.value.field == 'p.name' and e.value.got == name
    with pytest.raises(validate.ConfigError) as e:
      configured.configure(_section(name), CSET, experiment='ami')
    assert e.value.field == 'defense.name'


def test_configure_dp(spies):
  c = configured.configure(_section('update_dp', clip_norm=2.0, noise_multiplier=1.5,
                                    delta=1e-4), CSET, experiment='dishonest_mia')
  decl = registry.declaration('update_dp', {}, CSET)
  assert c.params == {'defense': 'update_dp', 'defense_clip_norm': 2.0,
                      'defense_noise_multiplier': 1.5, 'defense_delta': 1e-4}
  assert c.declaration == decl
  assert c.metrics == registry.dp_metrics('update_dp', {}, CSET, noise_multiplier=1.5,
                                          target_epsilon=None, delta=1e-4)[1]
  assert c.metrics['dp_epsilon'] == accounting.epsilon(decl, 1.5, delta=1e-4)
  assert spies['update_dp_hook'] == ((2.0, 1.5), {})
  # central_dp with participation: the declaration samples without replacement.
  c = configured.configure(_section('central_dp', participation=0.5, noise_multiplier=1.0),
                           CSET, experiment='pastel')
  assert c.declaration.sample_size == 4 and c.metrics['dp_sampling'] == 'without_replacement'
  assert spies['central_dp_hook'] == ((1.0, 1.0), {})
  # dp_sgd Poisson: the padded batch of the whole run.
  c = configured.configure(_section('dp_sgd'), CSET, experiment='fedmia')
  assert c.params == {'defense': 'dp_sgd', 'defense_clip_norm': 1.0,
                      'defense_noise_multiplier': 1.0, 'defense_dp_sgd_sampling': 'poisson',
                      'defense_delta': 1e-5}
  assert c.declaration.max_batch_size == registry.poisson_max_batch(CSET)
  assert c.metrics['dp_max_batch_size'] == registry.poisson_max_batch(CSET)
  assert spies['dp_sgd_hook'] == ((1.0, 1.0, 5.0), {})
  # The sampler runs the public schedule of CSET: N = 50, B = 5 and its declared 10 steps.
  assert spies['poisson_sampler'] == ((registry.poisson_max_batch(CSET),), POISSON_CSET)
  assert (c.metrics['dp_public_examples'], c.metrics['dp_steps_per_epoch']) == (50, 10)
  np.testing.assert_array_equal(c.hooks.report(jnp.asarray([7, 0])), [50, 0])
  c = configured.configure(_section('dp_sgd', dp_sgd_sampling='shuffle'), CSET,
                           experiment='fedmia')
  assert c.declaration.sampling == 'shuffle' and c.declaration.max_batch_size is None
  assert spies['dp_sgd_hook'] == ((1.0, 1.0, 5.0), {})   # CSET's lot size
  assert c.declaration.compositions == 8


def test_configure_dp_target_and_inf(spies, fake_accounting):
  c = configured.configure(_section('weak_dp', target_epsilon=2, delta=0.25,
                                    accountant='pld'), CSET, experiment='pastel')
  decl = registry.declaration('weak_dp', {}, CSET)
  z = 100.0 + 2.0 + 0.25 + 0.001
  assert c.params == {'defense': 'weak_dp', 'defense_clip_norm': 1.0,
                      'defense_target_epsilon': 2.0, 'defense_delta': 0.25}
  assert type(c.params['defense_target_epsilon']) is float
  assert spies['central_dp_hook'] == ((1.0, z), {})
  assert c.metrics['noise_multiplier'] == z
  assert c.metrics['dp_epsilon_per_round'] == fake_accounting(decl, z, delta=0.25,
                                                              accountant='pld')
  assert c.declaration == decl


def test_configure_noiseless_dp_is_inf(spies):
  c = configured.configure(_section('update_dp', noise_multiplier=0.0), CSET,
                           experiment='fedmia')
  assert c.metrics['dp_epsilon'] == math.inf
  # Exactly dp_metrics' keys: inf under `dp_epsilon` and nowhere else.
  assert c.metrics == registry.dp_metrics('update_dp', {}, CSET, noise_multiplier=0.0,
                                          target_epsilon=None, delta=1e-5)[1]


def test_configure_names_section_errors_with_its_prefix():
  for prefix, kw in (('p', {'prefix': 'p'}), ('defense', {})):
    with pytest.raises(validate.ConfigError) as e:
      configured.configure(_section('none', bits=0), CSET, experiment='fedmia', **kw)
    assert (e.value.field, e.value.got) == (f'{prefix}.bits', 0)
    sec = _section('none')
    with sec.unlocked():
      del sec['name']
      sec['name'] = 'nope'
    with pytest.raises(validate.ConfigError) as e:
      configured.configure(sec, CSET, experiment='fedmia', **kw)
    assert (e.value.field, e.value.got) == (f'{prefix}.name', 'nope')


def test_only_poisson_dp_sgd_sizes_a_padded_batch(spies, monkeypatch):
  # A shuffle dp_sgd (and any other DP defense) never sizes a Poisson batch: that sizing
  # refuses settings the shuffle accounting accepts (a smallest client without records).
  sized = []
  monkeypatch.setattr(registry, 'poisson_max_batch', lambda s: sized.append(s) or 7)
  for name, kw in (('dp_sgd', {'dp_sgd_sampling': 'shuffle'}), ('update_dp', {}),
                   ('central_dp', {})):
    configured.configure(_section(name, **kw), CSET, experiment='pastel')
    configured.sweep_point(name, 1.0, CSET, experiment='pastel', prefix='p',
                           fixed={'clip_norm': 1.0, **({'sampling': 'shuffle'}
                                                       if name == 'dp_sgd' else {})})
  assert sized == []
  c = configured.configure(_section('dp_sgd'), CSET, experiment='pastel')
  assert sized == [CSET] and c.declaration.max_batch_size == 7
  assert spies['poisson_sampler'] == ((7,), POISSON_CSET)


def test_validate_sweep():
  configured.validate_sweep({'sparsify': 0.5, 'quantize': (1, 24)}, ('sparsify', 'quantize'),
                            'p')
  with pytest.raises(validate.ConfigError) as e:
    configured.validate_sweep({'mixup': 1.0}, ('sparsify',), 'p')
  assert (e.value.field, e.value.allowed, e.value.got) == (
      'p.mixup', "a defense name, one of ('sparsify',)", 'mixup')
  with pytest.raises(validate.ConfigError) as e:
    configured.validate_sweep({'quantize': ()}, ('quantize',), 'p')
  assert (e.value.field, e.value.allowed, e.value.got) == (
      'p.quantize', 'non-empty, each an integer in [1, 24]', ())
  for bad in (25, (4, 0), [8, 2.5]):
    with pytest.raises(validate.ConfigError) as e:
      configured.validate_sweep({'quantize': bad}, ('quantize',), 'p')
    assert (e.value.field, e.value.allowed, e.value.got) == (
        'p.quantize', 'each an integer in [1, 24]', bad)
  configured.validate_sweep({'update_dp': [0.0, 2]}, ('update_dp',), 'p')
  with pytest.raises(validate.ConfigError):
    configured.validate_sweep({'sparsify': 0}, ('sparsify',), 'p')
  configured.validate_sweep({'sparsify': 1}, ('sparsify',), 'p')


def test_sweep_point_non_dp(spies):
  c = configured.sweep_point('sparsify', 0.75, CSET, experiment='fedmia', prefix='p')
  assert c == configured.Configured(client.ClientHooks(upload=('hook', 'sparsify_hook')),
                                    {'defense': 'sparsify'}, {}, None)
  assert spies['sparsify_hook'] == ((0.25, 1000), {})
  configured.sweep_point('sparsify', 0.75, CSET, experiment='fedmia', prefix='p',
                         fixed={'min_size': 0, 'sparsity': 0.1})
  assert spies['sparsify_hook'] == ((0.25, 0), {})
  configured.sweep_point('mixup', 2.0, CSET, experiment='fedmia', prefix='p')
  assert spies['mixup_hook'] == ((2.0, 7, False), {})
  configured.sweep_point('mixup', 2.0, CSET, experiment='fedmia', prefix='p',
                         fixed={'num_classes': 3})
  assert spies['mixup_hook'] == ((2.0, 3, False), {})
  configured.sweep_point('augment', 4, CSET, experiment='fedmia', prefix='p')
  assert spies['augment_hook'] == ((4, 1, (12, 12, 1), 0.4, (-1.0, 1.0)), {})
  configured.sweep_point('augment', 4, CSET._replace(image_shape=(32, 32, 3)),
                         experiment='fedmia', prefix='p', fixed={'pad': 2})
  assert spies['augment_hook'][0][1] == 2
  configured.sweep_point('augment_sampling', 0.5, CSET._replace(image_shape=None),
                         experiment='fedmia', prefix='p', fixed={'level': 1})
  assert spies['augment_hook'] == ((1, 4, None, 0.4, (-1.0, 1.0)), {})
  c = configured.sweep_point('bitrand', None, CSET, experiment='fedmia', prefix='p',
                             fixed={'epsilon': 1.0})
  assert c.params == {'defense': 'bitrand'}
  # value None keeps the fixed strength; a defense without a strength ignores the value.
  configured.sweep_point('sparsify', None, CSET, experiment='fedmia', prefix='p',
                         fixed={'sparsity': 0.5})
  assert spies['sparsify_hook'] == ((0.5, 1000), {})
  c = configured.sweep_point('bitrand', 3.0, CSET, experiment='fedmia', prefix='p',
                             fixed={'epsilon': 1.0})
  assert c.params == {'defense': 'bitrand'} and c.metrics == {}
  with pytest.raises(validate.ConfigError) as e:
    configured.sweep_point('quantize', 30, CSET, experiment='fedmia', prefix='p')
  assert e.value.field == 'p.quantize.bits'
  with pytest.raises(validate.ConfigError) as e:
    configured.sweep_point('nope', 1, CSET, experiment='fedmia', prefix='p')
  assert e.value.field == 'p.name'
  with pytest.raises(validate.ConfigError) as e:
    configured.sweep_point('central_dp', 1.0, CSET, experiment='fedmia', prefix='p',
                           fixed={'clip_norm': 1.0})
  assert e.value.field == 'p.name'


def test_sweep_point_dp(spies, fake_accounting):
  c = configured.sweep_point('central_dp', 2.0, CSET, experiment='pastel', prefix='p',
                             fixed={'clip_norm': 3.0, 'participation': 0.5}, delta=0.125,
                             accountant='pld')
  decl = registry.declaration('central_dp', {'participation': 0.5}, CSET)
  assert c.declaration == decl and c.params == {'defense': 'central_dp'}
  assert c.metrics['dp_epsilon'] == fake_accounting(decl, 2.0, delta=0.125, accountant='pld')
  assert c.metrics['dp_delta'] == 0.125
  assert spies['central_dp_hook'] == ((3.0, 2.0), {})
  assert c.hooks == client.ClientHooks(aggregate=('hook', 'central_dp_hook'))
  c = configured.sweep_point('weak_dp', 2.0, CSET, experiment='pastel', prefix='p',
                             fixed={'clip_norm': 3.0}, target_epsilon=1.5)
  assert spies['central_dp_hook'] == ((3.0, 100.0 + 1.5 + 1e-5), {})
  c = configured.sweep_point('dp_sgd', 0.5, CSET, experiment='fedmia', prefix='p',
                             fixed={'clip_norm': 1.0, 'sampling': 'poisson'})
  b = registry.poisson_max_batch(CSET)
  assert c.declaration.max_batch_size == b and c.metrics['dp_max_batch_size'] == b
  assert spies['poisson_sampler'] == ((b,), POISSON_CSET)
  assert spies['dp_sgd_hook'] == ((1.0, 0.5, 5.0), {})
  c = configured.sweep_point('dp_sgd', 0.5, CSET, experiment='fedmia', prefix='p',
                             fixed={'clip_norm': 1.0})
  assert c.declaration.sampling == 'shuffle' and spies['dp_sgd_hook'] == ((1.0, 0.5, 5.0), {})


def test_factories_called_directly(monkeypatch):
  """`_declare_server` and `_input_mechanism` run at import (building DEFENSES); called here
  too, so that mutation testing ties their mutants to a test that exercises the result."""
  s = S(rounds=6, num_clients=10)
  for per_round, name, comps in ((False, 'central_dp', 6), (True, 'weak_dp', 1)):
    d = registry._declare_server(per_round)({'participation': 0.3}, s)
    assert (d.mechanism, d.compositions, d.sample_size, d.population, d.sampling) == (
        name, comps, 3, 10, 'without_replacement')
    assert registry._declare_server(per_round)({}, s).sample_size == 10
    assert registry._declare_server(per_round)({'participation': 0.01}, s).sample_size == 1
    assert registry._declare_server(per_round)({'participation': 0.35}, s).sample_size == 4
    assert registry._declare_server(per_round)({}, s._replace(participants=2)).sample_size == 2
  hooks = registry._input_mechanism('gaussian')(sigma=0.0)
  x = jnp.arange(12, dtype=jnp.float32).reshape(2, 3, 2, 1) / 12
  y, mask = jnp.array([0, 1]), jnp.array([1.0, 1.0])
  out, y2, m2 = hooks.batch(jax.random.PRNGKey(1), x, y, mask, None)
  np.testing.assert_allclose(out, x, atol=1e-6)
  assert out.shape == x.shape and out.dtype == x.dtype and y2 is y and m2 is mask
  out16, _, _ = hooks.batch(jax.random.PRNGKey(1), x.astype(jnp.bfloat16), y, mask, None)
  assert out16.dtype == jnp.bfloat16 and out16.shape == x.shape
  hooks = registry._input_mechanism('gaussian')(sigma=100.0)
  out, _, _ = hooks.batch(jax.random.PRNGKey(1), x, y, mask, None)
  assert float(jnp.std(out - x)) > 10
  seen = []
  monkeypatch.setattr(mechanism_registry, 'randomizer',
                      lambda name, **p: lambda key, flat: seen.append(
                          (name, p, key, flat.shape, flat.dtype)) or flat)
  hooks = registry._input_mechanism('ome')(epsilon=2.0)
  key = jax.random.PRNGKey(3)
  hooks.batch(key, x.astype(jnp.bfloat16), y, mask, None)
  assert seen == [('ome', {'epsilon': 2.0}, key, (2, 6), jnp.float32)]
