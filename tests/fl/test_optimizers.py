"""Optimizers by name: the right update rules and config errors."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fl_privacy.fl import optimizers
from fl_privacy.validate import ConfigError


def _two_steps(opt, params, grad):
  state = opt.init(params)
  out = []
  for _ in range(2):
    updates, state = opt.update(grad, state, params)
    params = optax.apply_updates(params, updates)
    out.append(updates)
  return out


@pytest.mark.parametrize('name', optimizers.OPTIMIZERS)
def test_every_name_builds_and_descends(name):
  opt = optimizers.make(name, 0.1)
  params = {'w': jnp.array([1.0, -2.0])}
  grad = {'w': jnp.array([0.5, -0.5])}
  first, _ = _two_steps(opt, params, grad)
  # Every optimizer's first step moves against the gradient.
  assert np.all(np.sign(first['w']) == -np.sign(grad['w']))


def test_sgd_and_default_momentum():
  params, grad = {'w': jnp.zeros(2)}, {'w': jnp.array([1.0, 2.0])}
  s1, s2 = _two_steps(optimizers.make('sgd', 0.1), params, grad)
  np.testing.assert_allclose(s1['w'], -0.1 * grad['w'], rtol=1e-6)
  np.testing.assert_allclose(s2['w'], -0.1 * grad['w'], rtol=1e-6)
  m1, m2 = _two_steps(optimizers.make('momentum', 0.1), params, grad)
  np.testing.assert_allclose(m1['w'], -0.1 * grad['w'], rtol=1e-6)
  np.testing.assert_allclose(m2['w'], -0.1 * 1.9 * grad['w'], rtol=1e-6)
  _, m2 = _two_steps(optimizers.make('momentum', 0.1, momentum=0.5), params,
                     grad)
  np.testing.assert_allclose(m2['w'], -0.1 * 1.5 * grad['w'], rtol=1e-6)


def test_adam_first_step_is_lr_times_sign():
  params, grad = {'w': jnp.zeros(3)}, {'w': jnp.array([1e-3, -2.0, 5.0])}
  s1, _ = _two_steps(optimizers.make('adam', 0.01), params, grad)
  np.testing.assert_allclose(s1['w'], -0.01 * np.sign(grad['w']), rtol=1e-3)


def test_coupled_weight_decay():
  params, grad = {'w': jnp.array([2.0, -4.0])}, {'w': jnp.array([1.0, 1.0])}
  s1, _ = _two_steps(optimizers.make('sgd', 0.1, weight_decay=0.5), params,
                     grad)
  np.testing.assert_allclose(s1['w'], -0.1 * (grad['w'] + 0.5 * params['w']),
                             rtol=1e-6)


def test_unknown_name_is_config_error():
  with pytest.raises(ConfigError) as err:
    optimizers.make('rmsprop', 0.1)
  assert err.value.field == 'optimizer'
  assert err.value.got == 'rmsprop'


@pytest.mark.parametrize('name,kw,want', [
    ('sgd', {'momentum': 0.5, 'nesterov': True}, optax.sgd(0.1, momentum=0.5, nesterov=True)),
    ('momentum', {'nesterov': True}, optax.sgd(0.1, momentum=0.9, nesterov=True)),
    ('adam', {'b1': 0.5, 'b2': 0.9, 'eps': 1e-2}, optax.adam(0.1, b1=0.5, b2=0.9, eps=1e-2)),
    ('adagrad', {'initial_accumulator_value': 2.0, 'eps': 1e-3},
     optax.adagrad(0.1, initial_accumulator_value=2.0, eps=1e-3)),
    ('adagrad', {}, optax.adagrad(0.1)),
])
def test_options_reach_the_optax_constructor(name, kw, want):
  params = {'w': jnp.array([1.0, -2.0, 0.5])}
  grads = [{'w': jnp.array([0.5, -0.25, 2.0])}, {'w': jnp.array([-1.0, 0.3, 0.1])}]
  got_state, want_state = optimizers.make(name, 0.1, **kw).init(params), want.init(params)
  for g in grads:
    got, got_state = optimizers.make(name, 0.1, **kw).update(g, got_state, params)
    ref, want_state = want.update(g, want_state, params)
    np.testing.assert_allclose(got['w'], ref['w'], rtol=1e-6)
  # ... and differ from the defaults, so a dropped option would show.
  if kw:
    plain = optimizers.make(name, 0.1)
    state = plain.init(params)
    for g in grads:
      base, state = plain.update(g, state, params)
    assert not np.allclose(base['w'], ref['w'])


def test_unknown_name_error_names_the_field_and_the_choices():
  with pytest.raises(ConfigError) as err:
    optimizers.make('nadam', 0.1, field='fedmia.optimizer')
  assert err.value.field == 'fedmia.optimizer'
  assert err.value.allowed == "one of ('sgd', 'momentum', 'adam', 'adagrad')"
  assert err.value.got == 'nadam'
