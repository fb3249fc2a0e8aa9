"""`flower.config_checks`: every rule of `flower_audit`'s DP settings and training section at its
edges, with the field, the allowed words and the value refused, and what the checks build
(written from the survivors of its mutation run; no Flower deployment, under a second)."""

from __future__ import annotations

import ml_collections
import pytest

from configs import digits
from fl_privacy import validate
from fl_privacy.flower.audits import canary_design
from fl_privacy.flower.audits import dp_setting
from fl_privacy.flower.parts import config_checks as cc


def _config(**training):
  config = digits.get_config('smoke')
  with config.ignore_type():  # a float where an integer belongs reaches the rule
    for k, v in training.items():
      config.flower_audit.training[k] = v
  return config


def _refused(fn, field, allowed, got):
  with pytest.raises(validate.ConfigError) as e:
    fn()
  assert (e.value.field, e.value.allowed, e.value.got) == (f'flower_audit.{field}', allowed,
                                                           got)


def test_training_design_holds_the_sections_values_and_sorted_settings():
  config = _config(num_canaries=10, num_real=30, num_rounds=4, dimension=18, canary_norm=1,
                   real_norm=0.5, num_null=7, confidence=0.9, directions='dirac')
  design, settings = cc.check_training(config)
  assert design == canary_design.Design(num_canaries=10, num_real=30, num_rounds=4, dimension=18,
                                        canary_norm=1.0, real_norm=0.5, num_null=7, confidence=0.9,
                                        directions='dirac')
  assert type(design.canary_norm) is float and type(design.confidence) is float
  # In WRAPPERS' order, each with the deployment's nodes as its n.
  assert [s.wrapper for s in settings] == list(dp_setting.WRAPPERS)
  assert {s.num_sampled_clients for s in settings} == {design.num_nodes} == {40}
  t = config.flower_audit.training.settings
  local = settings[dp_setting.WRAPPERS.index('local_dp')]
  assert (local.label, local.epsilon, local.sensitivity) == (
      'local_dp_eps1', float(t.local_dp_eps1.epsilon), float(t.local_dp_eps1.sensitivity))
  # Equal wrappers sort by label.
  t['a_second_server_fixed'] = ml_collections.ConfigDict(dict(t.server_fixed_z1))
  _, settings = cc.check_training(config)
  assert [s.label for s in settings if s.wrapper == 'server_fixed'] == [
      'a_second_server_fixed', 'server_fixed_z1']


@pytest.mark.parametrize('field,ok,bad,allowed', [
    ('num_canaries', 2, 1, 'an integer >= 2 (two canaries at least (one per world))'),
    ('num_canaries', 2, 0, 'an integer >= 1'),
    ('num_real', 0, -1, 'an integer >= 0'),
    ('num_real', 0, 1.5, 'an integer >= 0'),
    ('num_rounds', 1, 0, 'an integer >= 1'),
    ('num_null', 1, 0, 'an integer >= 1'),
    ('canary_norm', 1, 0.99, 'a finite number >= 1 (in units of the clip norm, >= 1)'),
    ('real_norm', 1e-9, 0.0, 'a finite number > 0'),
    ('confidence', 0.5000001, 0.5, 'a finite number in (0.5, 1)'),
    ('confidence', 0.9999999, 1.0, 'a finite number in (0.5, 1)'),
    ('confidence', 0.9999999, 1.5, 'a finite number in (0.5, 1)'),
])
def test_training_rule_edges(field, ok, bad, allowed):
  cc.check_training(_config(**{field: ok}))
  _refused(lambda: cc.check_training(_config(**{field: bad})), f'training.{field}', allowed,
           bad)


def test_dirac_canaries_need_a_dimension_above_canaries_and_null():
  config = _config(num_canaries=4, num_null=6, dimension=11)
  assert cc.check_training(config)[0].dimension == 11
  _refused(lambda: cc.check_training(_config(num_canaries=4, num_null=6, dimension=10)),
           'training.dimension', 'above num_canaries + num_null (10) with Dirac canaries', 10)
  # Random directions need no such room.
  assert cc.check_training(_config(num_canaries=4, num_null=6, dimension=3,
                                   directions='random'))[0].dimension == 3
  _refused(lambda: cc.check_training(_config(directions='gaussian')), 'training.directions',
           "one of ('dirac', 'random')", 'gaussian')


def test_training_needs_a_setting():
  config = _config()
  config.flower_audit.training.settings = ml_collections.ConfigDict()
  _refused(lambda: cc.check_training(config), 'training.settings',
           'at least one setting when parts has training', config.flower_audit.training.settings)


# --- check_setting -------------------------------------------------------------------------

_FIELDS = {
    'server_fixed': dict(clipping_norm=0.5, delta=1e-4, noise_multiplier=1.5,
                         num_sampled_clients=6),
    'server_adaptive': dict(clipping_norm=0.5, delta=1e-4, noise_multiplier=0.1,
                            num_sampled_clients=6, target_clipped_quantile=0.3,
                            clip_norm_lr=0.1, clipped_count_stddev=None),
    'local_dp': dict(clipping_norm=0.5, delta=1e-4, sensitivity=2.0, epsilon=3.0),
}


def _entry(wrapper, **kw):
  fields = dict(_FIELDS.get(wrapper, _FIELDS['server_fixed' if 'fixed' in wrapper else
                                              'server_adaptive']))
  fields.update(kw)
  return ml_collections.ConfigDict(dict(wrapper=wrapper, **fields))


@pytest.mark.parametrize('wrapper', dp_setting.WRAPPERS)
def test_setting_is_built_from_exactly_its_wrappers_fields(wrapper):
  s = cc.check_setting('x', _entry(wrapper))
  want = dict(_FIELDS.get(wrapper, _FIELDS['server_fixed' if 'fixed' in wrapper else
                                           'server_adaptive']))
  assert s == dp_setting.Setting('x', wrapper, **want)
  assert type(s.clipping_norm) is float
  if s.central:
    assert type(s.num_sampled_clients) is int
  # In the training section n is the deployment's nodes, whatever the entry says.
  t = cc.check_setting('x', _entry(wrapper), 'training', nodes=9)
  assert t.num_sampled_clients == 9 and type(t.num_sampled_clients) is int
  assert t == dp_setting.Setting('x', wrapper, **{**want, 'num_sampled_clients': 9})


@pytest.mark.parametrize('wrapper,field,ok,bad,allowed', [
    ('server_fixed', 'clipping_norm', 1e-9, 0.0, 'a finite number > 0'),
    ('server_fixed', 'delta', 0.999, 1.0, 'a finite number in (0, 1)'),
    ('server_fixed', 'delta', 1e-12, 0.0, 'a finite number in (0, 1)'),
    ('server_fixed', 'noise_multiplier', 1e-9, 0.0, 'a finite number > 0'),
    ('server_fixed', 'num_sampled_clients', 1, 0, 'an integer >= 1'),
    ('local_dp', 'sensitivity', 1e-9, 0.0, 'a finite number > 0'),
    ('local_dp', 'epsilon', 1e-9, 0.0, 'a finite number > 0'),
    ('client_adaptive', 'target_clipped_quantile', 1.0, 1.01, 'a finite number in [0, 1]'),
    ('client_adaptive', 'target_clipped_quantile', 0.0, -0.01, 'a finite number in [0, 1]'),
    ('client_adaptive', 'clip_norm_lr', 1e-9, 0.0, 'a finite number > 0'),
    ('client_adaptive', 'clipped_count_stddev', 1.0, 0.0, 'None or a finite number > 0'),
])
def test_setting_rule_edges(wrapper, field, ok, bad, allowed):
  cc.check_setting('x', _entry(wrapper, **{field: ok}))
  _refused(lambda: cc.check_setting('x', _entry(wrapper, **{field: bad})),
           f'dp.settings.x.{field}', allowed, bad)
  if field == 'num_sampled_clients':  # the training section's n is its nodes: not read there
    assert cc.check_setting('x', _entry(wrapper, **{field: bad}), 'training',
                            4).num_sampled_clients == 4
    return
  _refused(lambda: cc.check_setting('x', _entry(wrapper, **{field: bad}), 'training', 4),
           f'training.settings.x.{field}', allowed, bad)


@pytest.mark.parametrize('wrapper,field', [('server_fixed', 'noise_multiplier'),
                                           ('local_dp', 'epsilon'),
                                           ('server_adaptive', 'clip_norm_lr'),
                                           ('client_fixed', 'clipping_norm')])
def test_a_field_the_wrapper_reads_must_be_set(wrapper, field):
  _refused(lambda: cc.check_setting('x', _entry(wrapper, **{field: None})),
           f'dp.settings.x.{field}', 'set (the wrapper reads it; configs/_flower_audit.py)',
           None)


def test_setting_wrapper_is_required_and_one_of_flowers():
  entry = _entry('server_fixed')
  del entry['wrapper']
  _refused(lambda: cc.check_setting('x', entry), 'dp.settings.x.wrapper',
           'set (the wrapper reads it; configs/_flower_audit.py)', None)
  _refused(lambda: cc.check_setting('x', _entry('adaptive')), 'dp.settings.x.wrapper',
           f'one of {dp_setting.WRAPPERS}', 'adaptive')


def test_adaptive_noise_multiplier_below_twice_the_count_noise():
  # Flower's adaptive wrappers refuse z >= 2 sigma_b (sigma_b defaults to n / 20).
  assert cc.adaptive_ok(dp_setting.Setting('x', 'server_adaptive', noise_multiplier=0.5,
                                           num_sampled_clients=10))
  assert not cc.adaptive_ok(dp_setting.Setting('x', 'server_adaptive', noise_multiplier=1.0,
                                               num_sampled_clients=10))
  cc.check_setting('x', _entry('server_adaptive', noise_multiplier=0.59, num_sampled_clients=6))
  _refused(lambda: cc.check_setting('x', _entry('server_adaptive', noise_multiplier=0.6,
                                                num_sampled_clients=6)),
           'dp.settings.x.noise_multiplier',
           "below 2 x clipped_count_stddev (default num_sampled_clients / 20), which Flower's "
           'adaptive wrappers require', 0.6)
  # A larger count noise admits a larger z.
  s = cc.check_setting('x', _entry('server_adaptive', noise_multiplier=0.6,
                                   num_sampled_clients=6, clipped_count_stddev=1))
  assert s.clipped_count_stddev == 1.0 and type(s.clipped_count_stddev) is float
