"""Mechanisms by config name: (init, update) pairs carry and advance their key."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy import validate
from fl_privacy.mechanisms import bitrand
from fl_privacy.mechanisms import gaussian
from fl_privacy.mechanisms import ome
from fl_privacy.mechanisms import transforms

KWARGS = {
    'none': dict(epsilon=1.0),
    'bitrand': dict(epsilon=3.0),
    'ome': dict(epsilon=3.0),
    'gaussian': dict(sigma=0.5),
}


def _x():
  return jnp.asarray(np.random.default_rng(0).uniform(-4, 4, (6, 32)), jnp.float32)


@pytest.mark.parametrize('jit', [False, True])
@pytest.mark.parametrize('name', transforms.MECHANISMS)
def test_update_splits_the_key_and_matches_randomize(jit, name):
  mech = transforms.make(name, **KWARGS[name])
  assert mech.name == name
  key = jax.random.key(0)
  state = mech.init(key)
  update = jax.jit(mech.update) if jit else mech.update
  x = _x()
  y1, state1 = update(x, state)
  y2, state2 = update(x, state1)
  assert y1.shape == x.shape and y1.dtype == x.dtype
  next_key, used = jax.random.split(key)
  np.testing.assert_array_equal(jax.random.key_data(state1.rng_key),
                                jax.random.key_data(next_key))
  np.testing.assert_allclose(y1, mech.randomize(used, x), rtol=1e-6)
  assert not np.array_equal(jax.random.key_data(state1.rng_key),
                            jax.random.key_data(state2.rng_key))
  if name == 'none':
    np.testing.assert_array_equal(y1, x)
    np.testing.assert_array_equal(y2, x)
  else:
    assert not np.array_equal(y1, y2)


def test_randomizers_match_the_mechanism_modules():
  key, x = jax.random.key(3), _x()
  leaf_key = jax.random.fold_in(key, 0)
  np.testing.assert_array_equal(
      transforms.make('bitrand', epsilon=2.0, rng_bits=16).randomize(key, x),
      bitrand.randomize(leaf_key, x, 2.0, rng_bits=16))
  np.testing.assert_array_equal(
      transforms.make('ome', epsilon=2.0, alpha=50.0).randomize(key, x),
      ome.randomize(leaf_key, x, 2.0, 50.0))
  sigma = gaussian.sigma_for(8.0, 1e-2)
  by_budget = transforms.make('gaussian', epsilon=8.0, delta=1e-2)
  np.testing.assert_array_equal(by_budget.randomize(key, x),
                                gaussian.add_noise(key, x, sigma))


def test_pytrees_use_one_key_per_leaf():
  mech = transforms.make('bitrand', epsilon=2.0)
  tree = {'a': _x(), 'b': _x()}
  out = mech.randomize(jax.random.key(1), tree)
  assert set(out) == {'a', 'b'}
  assert not np.array_equal(out['a'], out['b'])


def test_unknown_mechanism_names_the_field():
  with pytest.raises(validate.ConfigError) as e:
    transforms.make('laplace', epsilon=1.0)
  assert e.value.field == 'mechanism'
  assert 'bitrand' in str(e.value)
  # A registered gradient mechanism is not an input mechanism.
  with pytest.raises(validate.ConfigError) as e:
    transforms.make('ldp_sgd', epsilon=1.0)
  assert e.value.field == 'mechanism'


@pytest.mark.parametrize('name,kw,field', [
    ('bitrand', dict(epsilon=-1.0), 'epsilon'),
    ('ome', dict(epsilon=-1.0), 'epsilon'),
    ('ome', dict(epsilon=1.0, rng_bits=8), 'rng_bits'),
    ('gaussian', dict(epsilon=1.0), 'sigma'),
    ('gaussian', dict(sigma=-1.0), 'sigma'),
])
def test_bad_parameters_fail_when_built(name, kw, field):
  with pytest.raises(validate.ConfigError) as e:
    transforms.make(name, **kw)
  assert e.value.field == field


def test_every_parameter_reaches_the_mechanism():
  # Non-default values for every keyword, through `make` and through the registry. BitRand
  # reads r (num_features) only for its alpha bound, so r and alpha go in separate calls;
  # epsilons are large enough for r to move the probabilities well beyond sampling luck.
  from fl_privacy.mechanisms import ldp_sgd
  from fl_privacy.mechanisms import registry
  key, x = jax.random.key(5), _x()
  leaf_key = jax.random.fold_in(key, 0)
  fmt = dict(int_bits=3, frac_bits=2, sign_bit=True, honour_sign=False, rng_bits=16)
  for kw in (dict(fmt, epsilon=20.0, num_features=4), dict(fmt, epsilon=2.0, alpha=0.3),
             dict(epsilon=2.0, int_bits=3, frac_bits=2, sign_bit=False)):
    np.testing.assert_array_equal(transforms.make('bitrand', **kw).randomize(key, x),
                                  bitrand.randomize(leaf_key, x, **kw))
  for kw in (dict(fmt, epsilon=300.0, alpha=3.0, num_features=4),
             dict(epsilon=2.0, int_bits=3, frac_bits=2, sign_bit=False)):
    np.testing.assert_array_equal(transforms.make('ome', **kw).randomize(key, x),
                                  ome.randomize(leaf_key, x, **kw))
  np.testing.assert_array_equal(
      transforms.make('gaussian', epsilon=8.0, delta=1e-2, sensitivity=3.0).randomize(key, x),
      gaussian.add_noise(key, x, gaussian.sigma_for(8.0, 1e-2, 3.0)))
  # registry's bitwise randomizers and LDP-SGD's
  bits = jnp.asarray(np.random.default_rng(1).integers(0, 2, (40, 6, 5)), jnp.uint8)
  for eps, kw in ((20.0, dict(num_features=1, rng_bits=16)), (2.0, dict(alpha=0.3))):
    np.testing.assert_array_equal(registry.bit_randomizer('bitrand', eps, **kw)(key, bits),
                                  bitrand.randomize_bits(key, bits, eps, **kw))
  kw = dict(num_features=64, rng_bits=16)
  np.testing.assert_array_equal(
      registry.bit_randomizer('ome', 300.0, alpha=3.0, **kw)(key, bits),
      ome.randomize_bits(key, bits, 300.0, 3.0, **kw))
  np.testing.assert_array_equal(
      registry.bit_randomizer('ome', 2.0)(key, bits),
      ome.randomize_bits(key, bits, 2.0, ome.DEFAULT_ALPHA))
  np.testing.assert_array_equal(
      registry.randomizer('ome', epsilon=2.0)(key, x),
      ome.randomize(key, x, 2.0, ome.DEFAULT_ALPHA))
  np.testing.assert_array_equal(
      registry.randomizer('ldp_sgd', epsilon=2.0, clip_norm=0.5)(key, x),
      ldp_sgd.randomize(key, x, 2.0, 0.5))


def test_registry_defaults_names_and_checks():
  from fl_privacy.mechanisms import registry
  key, x = jax.random.key(6), _x()
  np.testing.assert_array_equal(registry.randomizer('bitrand', epsilon=2.0)(key, x),
                                bitrand.randomize(key, x, 2.0))
  np.testing.assert_array_equal(registry.randomizer('none')(key, x), x)
  with pytest.raises(validate.ConfigError) as e:
    registry.randomizer('laplace')
  assert e.value.field == 'mechanism' and e.value.got == 'laplace'
  assert e.value.allowed == f'one of {registry.NAMES}'
  # Registered but not bitwise: refused by name, not a crash on the missing build_bits.
  with pytest.raises(validate.ConfigError) as e:
    registry.bit_randomizer('gaussian', 1.0)
  assert e.value.allowed == f'one of {registry.BITWISE_MECHANISMS}'
  with pytest.raises(validate.ConfigError) as e:
    registry.spec('ldp_sgd', 'defense.mechanism', registry.INPUT_MECHANISMS)
  assert e.value.field == 'defense.mechanism'
  as_float = registry.as_float(lambda key, x: x)(key, np.arange(3))
  assert as_float.dtype == jnp.float32
  assert registry.as_float(lambda key, x: key)(key, x) is key
  with pytest.raises(validate.ConfigError) as e:
    registry.randomizer('gaussian', epsilon=1.0)
  assert (e.value.field, e.value.allowed) == ('sigma', 'given, or epsilon and delta given')
  with pytest.raises(validate.ConfigError) as e:
    registry.randomizer('gaussian', sigma=-1.0)
  assert (e.value.allowed, e.value.got) == ('a number >= 0', -1.0)
  np.testing.assert_array_equal(registry.randomizer('gaussian', epsilon=8.0, delta=1e-2)(key, x),
                                gaussian.add_noise(key, x, gaussian.sigma_for(8.0, 1e-2)))
  # sigma = 0 is allowed: no noise.
  np.testing.assert_array_equal(registry.randomizer('gaussian', sigma=0.0)(key, x), x)
