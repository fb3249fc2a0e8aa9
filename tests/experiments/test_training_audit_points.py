"""`pipelines.training_audit` in process: its validation, `prepare`'s checks, the sweep, and
each point's audit on tiny real trainings.

The command-line test (test_training_audit.py) runs the pipeline in a subprocess, where a
mutation run cannot see it; these call its functions. The trainings (one module fixture, each
training's calls recorded) cover the branches of `point_metrics`: the server reading canary
clients (the midpoint test counted, a simulated optimal attack), Poisson DP-SGD read at every
step (the subsampled fit as the estimate), a sampled aggregate's reader (dependent canaries),
weak_dp's per-round claim composed over the rounds, ldp_sgd's declaration from the registry,
and a side-channel game.
"""

from __future__ import annotations

# pylint: disable=protected-access

import dataclasses
import logging
import math
import types

import chex
import jax
from jax import flatten_util
import numpy as np
import pytest
from scipy import stats as sps

from configs import _training_audit as config_section
from configs import digits
from fl_privacy import accounting
from fl_privacy import data
from fl_privacy import validate
from fl_privacy.attacks.audit import audit_power
from fl_privacy.attacks.audit import canaries
from fl_privacy.attacks.audit import canary_statistics
from fl_privacy.attacks.audit import side_channel as side_lib
from fl_privacy.defenses import registry
from fl_privacy.fl import rounds
from fl_privacy.pipelines import training_audit as ta
from fl_privacy.pipelines import training_audit_runs as runs
from fl_privacy.report import point_key
from tests.experiments import training_audit_plants as plants

KEY = jax.random.key(0)
C = 0.5            # the clip: not 1, so that C enters as a factor, never as a divisor
DELTA, CONFIDENCE = 2e-5, 0.9


_set = plants.override


def _config(**fields):
  """The tiny federations: a 64-4-10 MLP (310 parameters) cross-silo, 64-5-10 (385)
  cross-device; `fields` override `training_audit` (dotted names allowed)."""
  config = digits.get_config('smoke')
  s = config.training_audit
  s.clip_norm, s.delta, s.confidence = C, DELTA, CONFIDENCE
  s.side_channel_trials, s.chunk = 64, 32
  # Few simulations (their statistics are tested in tests/attacks/test_audit_power.py).
  s.power_draws, s.simulated_draws, s.power_factors = 2, 3, (0.3, 0.6)
  s.record.update(num_clients=4, per_client=16, canaries_per_client=6, input_per_client=2,
                  batch_size=4, epochs=1, num_rounds=2, hidden=(4,), canaries=192,
                  input_canaries=16, twins=0)
  s.client.update(num_clients=20, per_client=1, participation=0.5, canary_share=0.5,
                  batch_size=1, epochs=1, num_rounds=2, hidden=(5,), canaries=120, twins=0)
  for name, value in fields.items():
    _set(config, name, value)
  return config


def _tr(defense, sampling, canary, eps=2.0):
  return dict(defense=defense, sampling=sampling, claimed_epsilon=float(eps), canary=canary)


# --------------------------------------------------------------------------- the config ---


def test_the_config_section_and_the_pipeline_agree():
  assert config_section.DEFENSES == ta.DEFENSES
  assert config_section.PLANTS == ta.PLANTS and config_section.THREATS == ta.THREATS
  for smoke in (False, True):
    s = config_section.section('digits', smoke)
    assert tuple(s.defenses) == ta.DEFENSES and tuple(s.threats) == ta.THREATS
    assert set(s.samplings.keys()) == set(ta.DEFENSES)
    for d in ta.DEFENSES:
      assert set(s.samplings[d]) <= set(ta.SAMPLINGS[d]), d
    assert set(s.record_kinds) == set(ta.RECORD_KINDS)
  assert set(ta.ALL_SAMPLINGS) == {x for d in ta.DEFENSES for x in ta.SAMPLINGS[d]}


# (dotted field, value, the whole message); each on the valid smoke config.
_D = "('dp_sgd', 'update_dp', 'central_dp', 'weak_dp', 'ldp_sgd')"
_RECORD = ("('num_clients', 'per_client', 'canaries_per_client', 'input_per_client', "
           "'batch_size', 'epochs', 'num_rounds', 'learning_rate', 'twins', 'hidden', "
           "'canaries', 'input_canaries')")
_CLIENT = ("('num_clients', 'per_client', 'participation', 'canary_share', 'batch_size', "
           "'epochs', 'num_rounds', 'learning_rate', 'twins', 'hidden', 'canaries')")
_ROW = 'an integer in [4, 1e+06] (canaries a row (at least 2 per world))'
_BAD = [
    ('defenses', ('dp_sgd', 'gaussian'), f"a subset of {_D} (got ('dp_sgd', 'gaussian'))"),
    ('defenses', (), f'a non-empty subset of {_D} (got ())'),
    ('samplings.dp_sgd', ('poisson', 'none'),
     "a subset of ('poisson', 'shuffle') (got ('poisson', 'none'))"),
    ('samplings.dp_sgd', (), "a non-empty subset of ('poisson', 'shuffle') (got ())"),
    ('samplings.update_dp', ('without_replacement',),
     "a subset of ('none',) (got ('without_replacement',))"),
    ('samplings.central_dp', ('poisson',),
     "a subset of ('none', 'without_replacement') (got ('poisson',))"),
    ('samplings.gaussian', ('none',), f"a defense of {_D} (got ('none',))"),
    ('epsilons', (0.0,), 'non-empty, every item a finite number > 0 (got (0.0,))'),
    ('epsilons', (2.0, 50.5), 'in (0.0, 50.0] (got (2.0, 50.5))'),
    ('epsilons', (math.inf,), 'non-empty, every item a finite number > 0 (got (inf,))'),
    ('epsilons', (), 'non-empty, every item a finite number > 0 (got ())'),
    ('delta', 1.0, 'a finite number in (0, 1) (got 1.0)'),
    ('delta', 0.0, 'a finite number in (0, 1) (got 0.0)'),
    ('accountant', 'gdp', "one of ('rdp', 'pld') (got 'gdp')"),
    ('clip_norm', 0.0, 'a finite number > 0 (got 0.0)'),
    ('confidence', 0.5, 'in (0.5, 1.0) (got 0.5)'),
    ('confidence', 1.0, 'in (0.5, 1.0) (got 1.0)'),
    ('record_kinds', ('dirac',), "a subset of ('gradient', 'input') (got ('dirac',))"),
    ('power_draws', -1, 'an integer in [0, 10000] (simulations a row (20 or more for a '
     'stated power; 0: none)) (got -1)'),
    ('simulated_draws', 2.5, 'an integer in [0, 10000] (simulations a row (20 or more for a '
     'stated power; 0: none)) (got 2.5)'),
    ('power_factors', (0.5, 1.0), 'a non-empty sequence of noise factors in (0, 1) (got '
     '(0.5, 1.0))'),
    ('power_factors', 0.5, 'a non-empty sequence of noise factors in (0, 1) (got 0.5)'),
    ('threats', ('every_iterate',), "a subset of ('all_steps', 'all_iterates', "
     "'last_iterate', 'side_channel') (got ('every_iterate',))"),
    ('record.twins', -1, 'an integer in [0, 1000] (got -1)'),
    ('client.twins', 1001, 'an integer in [0, 1000] (got 1001)'),
    ('side_channel_trials', 7,
     'an integer in [8, 1e+06] (trials (at least 4 per world)) (got 7)'),
    ('side_channel_trials', 1_000_001,
     'an integer in [8, 1e+06] (trials (at least 4 per world)) (got 1000001)'),
    ('side_channel_others', -1, 'an integer in [0, 1000] (got -1)'),
    ('side_channel_others', 1001, 'an integer in [0, 1000] (got 1001)'),
    ('canary_norm', 0.9,
     'a finite number in [1, 1e+06] (in units of the clip norm) (got 0.9)'),
    ('canary_norm', 1_000_000.5,
     'a finite number in [1, 1e+06] (in units of the clip norm) (got 1000000.5)'),
    ('direction', 'gauss', "one of ('random', 'dirac') (got 'gauss')"),
    ('model', 'cnn', "one of ('mlp',) (got 'cnn')"),
    ('optimizer', 'lbfgs', "one of ('sgd', 'momentum', 'adam', 'adagrad') (got 'lbfgs')"),
    ('chunk', 0, 'an integer in [1, 4096] (got 0)'),
    ('chunk', 4097, 'an integer in [1, 4096] (got 4097)'),
    ('plant', 'quarter_noise', "one of ('none', 'half_noise', 'poisson_full_batch', "
     "'participation_not_run', 'clip_mismatch', 'one_composition', "
     "'data_dependent_schedule', 'reported_rows') (got 'quarter_noise')"),
    # The federations: each section's own fields, and no other.
    ('record.participation', 0.5, f'one of {_RECORD} (got 0.5)'),
    ('client.input_per_client', 2, f'one of {_CLIENT} (got 2)'),
    ('record.num_clients', 0, 'an integer in [1, 100000] (got 0)'),
    ('client.num_clients', 100_001, 'an integer in [1, 100000] (got 100001)'),
    ('record.per_client', 100_001, 'an integer in [1, 100000] (got 100001)'),
    ('client.per_client', 0, 'an integer in [1, 100000] (got 0)'),
    ('client.batch_size', 0, 'an integer in [1, 100000] (got 0)'),
    ('record.epochs', 101, 'an integer in [1, 100] (got 101)'),
    ('client.epochs', 0, 'an integer in [1, 100] (got 0)'),
    ('client.num_rounds', 1001, 'an integer in [1, 1000] (got 1001)'),
    ('record.learning_rate', 0.0, 'a finite number in (0, 100] (got 0.0)'),
    ('client.learning_rate', 100.5, 'a finite number in (0, 100] (got 100.5)'),
    ('record.hidden', (0,), 'a sequence of widths in [1, 4096] (got (0,))'),
    ('client.hidden', (2.5,), 'a sequence of widths in [1, 4096] (got (2.5,))'),
    ('record.hidden', (4097,), 'a sequence of widths in [1, 4096] (got (4097,))'),
    ('record.canaries', 3, f'{_ROW} (got 3)'),
    ('client.canaries', 3, f'{_ROW} (got 3)'),
    ('client.canaries', 1_000_001, f'{_ROW} (got 1000001)'),
    ('record.input_canaries', 3, f'{_ROW} (got 3)'),
    ('record.canaries_per_client', 0, 'an integer in [1, 100000] (got 0)'),
    ('record.input_per_client', 0, 'an integer in [1, 100000] (got 0)'),
    ('record.input_per_client', 100_001, 'an integer in [1, 100000] (got 100001)'),
    ('client.participation', 0.0, 'a finite number in (0, 1] (the fraction of the clients '
     'drawn each round) (got 0.0)'),
    ('client.participation', 1.001, 'a finite number in (0, 1] (the fraction of the clients '
     'drawn each round) (got 1.001)'),
    ('client.canary_share', 0.0, "a finite number in (0, 1) (the canaries' largest share of "
     "a round's participants (below 1)) (got 0.0)"),
    ('client.canary_share', 1.0, "a finite number in (0, 1) (the canaries' largest share of "
     "a round's participants (below 1)) (got 1.0)"),
    ('record.batch_size', 33, 'at most record.per_client (32): the Poisson rate is B / N <= 1 '
     '(got 33)'),
]


@pytest.mark.parametrize('field, value, allowed', _BAD, ids=[f'{f}={v}' for f, v, _ in _BAD])
def test_each_field_is_refused_outside_its_range_with_one_whole_message(field, value, allowed):
  config = digits.get_config('smoke')
  _set(config, field, value)
  with pytest.raises(validate.ConfigError) as e:
    ta.validate_config(config)
  assert str(e.value) == f'config.training_audit.{field}: must be {allowed}'


@pytest.mark.parametrize('field', ['record.num_clients', 'record.per_client',
                                   'record.canaries_per_client', 'record.input_per_client',
                                   'record.input_canaries', 'client.batch_size',
                                   'client.epochs', 'client.num_rounds', 'client.canaries',
                                   'record.twins', 'side_channel_trials', 'chunk'])
def test_a_count_that_is_not_an_integer_is_refused(field):
  # A config file may hold a float where the default is an int (the command line cannot).
  config = digits.get_config('smoke')
  _set(config, field, 8.0)
  with pytest.raises(validate.ConfigError, match=rf'^config\.training_audit\.{field}: must be '
                     r'an integer in \[\d, [\d+e]+\]'):
    ta.validate_config(config)


def test_the_edges_of_each_range_are_accepted():
  config = digits.get_config('smoke')
  s = config.training_audit
  s.epsilons, s.confidence, s.canary_norm = (50.0, 1e-3), 0.999, 1.0
  s.side_channel_trials, s.side_channel_others, s.chunk = 8, 0, 1
  s.record.twins = s.client.twins = 0
  s.record.update(num_clients=100_000, per_client=32, batch_size=32, canaries=4,
                  input_canaries=4, canaries_per_client=1, input_per_client=1, epochs=100,
                  num_rounds=1000, learning_rate=100.0, hidden=(4096, 1))
  s.client.update(participation=1.0, canary_share=0.999, canaries=1_000_000, hidden=())
  assert ta.validate_config(config) == {'defenses': ta.DEFENSES}
  s.client.canary_share, s.canary_norm, s.chunk = 1e-6, 1e6, 4096
  s.record.twins = s.client.twins = 1000
  s.side_channel_trials = 1_000_000
  ta.validate_config(config)


def test_the_samplings_section_is_checked_for_the_chosen_defenses_only():
  config = digits.get_config('smoke')
  s = config.training_audit
  with s.ignore_type():
    s.samplings = ('poisson',)   # the pre-section form
  with pytest.raises(validate.ConfigError) as e:
    ta.validate_config(config)
  assert str(e.value) == (
      "config.training_audit.samplings: must be a section with the samplings of each defense "
      "(dp_sgd: ('poisson', 'shuffle'), update_dp: ('none',), central_dp: ('none', "
      "'without_replacement'), weak_dp: ('none', 'without_replacement'), ldp_sgd: ('none',)) "
      "(got ('poisson',))")
  # A chosen defense without its samplings would silently not run.
  config = digits.get_config('smoke')
  del config.training_audit.samplings['weak_dp']
  with pytest.raises(validate.ConfigError) as e:
    ta.validate_config(config)
  assert str(e.value) == (
      "config.training_audit.samplings.weak_dp: must be given for a chosen defense: a "
      "non-empty subset of ('none', 'without_replacement') (got None)")
  config.training_audit.defenses = ('dp_sgd', 'ldp_sgd')
  assert ta.validate_config(config) == {'defenses': ('dp_sgd', 'ldp_sgd')}
  # One defense as a plain string.
  _set(config, 'defenses', 'central_dp')
  _set(config, 'samplings.central_dp', 'none')
  assert ta.validate_config(config) == {'defenses': ('central_dp',)}


def test_a_federation_that_is_not_a_section_and_a_defense_section_are_refused():
  config = digits.get_config('smoke')
  del config.training_audit['record']
  with pytest.raises(validate.ConfigError) as e:
    ta.validate_config(config)
  assert str(e.value) == ("config.training_audit.record: must be present in the config (got "
                          "'missing')")
  config = digits.get_config('smoke')
  with config.training_audit.ignore_type():
    config.training_audit.client = 5
  with pytest.raises(validate.ConfigError) as e:
    ta.validate_config(config)
  assert str(e.value) == (f'config.training_audit.client: must be a section with the fields '
                          f'{_CLIENT} (got 5)')
  config = digits.get_config('smoke')
  config.defense.name = 'update_dp'
  with pytest.raises(validate.ConfigError) as e:
    ta.validate_config(config)
  assert str(e.value) == (
      "config.defense.name: must be one of ('none',) for experiments.training_audit (it audits "
      "every DP defense itself (training_audit.defenses)) (got 'update_dp')")


# ------------------------------------------------------------------------------ prepare ---


def _refused(config) -> str:
  with pytest.raises(validate.ConfigError) as e:
    ta.prepare(config)
  return str(e.value)


def test_prepare_builds_each_federations_model():
  state = ta.prepare(_config())
  assert state['dims'] == {(4,): 64 * 4 + 4 + 4 * 10 + 10, (5,): 64 * 5 + 5 + 5 * 10 + 10}
  assert set(state['models']) == {(4,), (5,)} and state['trainings'] == {}
  assert state['defenses'] == ta.DEFENSES
  assert len(state['train']) > len(state['test']) > 0
  assert state['train'].num_classes == 10


def test_prepare_bounds_each_federation_by_the_train_split():
  n_train = len(ta.prepare(_config())['train'])
  # Record level: 4 clients; every train row held is allowed (no input canaries then).
  assert _refused(_config(**{'record.per_client': n_train // 4 + 1})) == (
      f'config.training_audit.record.per_client: must be at most {n_train // 4} (num_clients '
      f'x per_client rows of the train split, which has {n_train}) (got {n_train // 4 + 1})')
  ta.prepare(_config(record_kinds=('gradient',), **{'record.per_client': n_train // 4}))
  # Client level: 20 clients.
  assert _refused(_config(**{'client.per_client': n_train // 20 + 1})) == (
      f'config.training_audit.client.per_client: must be at most {n_train // 20} (num_clients '
      f'x per_client rows of the train split, which has {n_train}) (got {n_train // 20 + 1})')
  ta.prepare(_config(**{'client.per_client': n_train // 20}))
  # Checked for the federations that run only.
  ta.prepare(_config(defenses=('dp_sgd',), **{'client.per_client': n_train}))


def test_prepare_bounds_the_canaries_a_training_by_the_model_and_the_pool():
  state = ta.prepare(_config())
  n_train = len(state['train'])
  # 4 clients x 78 gradient canaries = 312 coordinates of 310; 77 (308) fit.
  assert _refused(_config(**{'record.canaries_per_client': 78})) == (
      "config.training_audit.record.canaries_per_client: must be at most the model's 310 "
      'parameters of canaries a training (one coordinate or orthogonal direction each) '
      '(got 312)')
  ta.prepare(_config(**{'record.canaries_per_client': 77}))
  ta.prepare(_config(record_kinds=('input',), **{'record.canaries_per_client': 78}))
  ta.prepare(_config(threats=('side_channel',), **{'record.canaries_per_client': 78}))
  # Canary clients: 400 of 20 real ones (share 400 / 420) need 400 directions of 385.
  big = {'client.num_clients': 20, 'client.canary_share': 400 / 420 + 1e-6}
  assert _refused(_config(defenses=('central_dp',), **big)) == (
      "config.training_audit.client.canary_share: must be at most the model's 385 parameters "
      'of canaries a training (one coordinate or orthogonal direction each) (got 400)')
  ta.prepare(_config(defenses=('central_dp',), threats=('side_channel',), **big))
  ta.prepare(_config(defenses=('dp_sgd',), **big))
  # Input canaries come from the train rows no client holds.
  pool = n_train - 4 * 16
  assert _refused(_config(**{'record.input_per_client': pool // 4 + 1})) == (
      f'config.training_audit.record.input_per_client: must be at most {pool // 4} (the '
      f'{pool} images no client holds are the input canaries) (got {pool // 4 + 1})')
  ta.prepare(_config(**{'record.input_per_client': pool // 4}))


# ------------------------------------------------------------------------------- sweep ---


def test_the_sweep_is_defenses_by_samplings_by_claims_by_kinds_then_the_side_channel():
  config = _config(epsilons=(2.0, 8.0), record_kinds=('input', 'gradient'),
                   **{'samplings.dp_sgd': ('shuffle', 'poisson'),
                      'samplings.weak_dp': ('without_replacement', 'none')})
  state = {'defenses': ('dp_sgd', 'weak_dp', 'ldp_sgd')}
  got = [(t['defense'], t['sampling'], t['claimed_epsilon'], t['canary'])
         for t in ta.trainings(config, state)]
  # Samplings in the order the pipeline offers them; kinds in the config's order.
  want = [('dp_sgd', x, e, k) for x in ('poisson', 'shuffle') for e in (2.0, 8.0)
          for k in ('input', 'gradient', 'side_channel')]
  want += [('weak_dp', x, e, k) for x in ('none', 'without_replacement') for e in (2.0, 8.0)
           for k in ('client', 'side_channel')]
  want += [('ldp_sgd', 'none', e, k) for e in (2.0, 8.0) for k in ('client', 'side_channel')]
  assert got == want
  # Without the side channel no game; with it alone, only the games.
  config.training_audit.threats = ('all_iterates',)
  assert {t['canary'] for t in ta.trainings(config, state)} == {'input', 'gradient', 'client'}
  config.training_audit.threats = ('side_channel',)
  assert {t['canary'] for t in ta.trainings(config, state)} == {'side_channel'}
  assert len(ta.trainings(config, state)) == 2 * 2 + 2 * 2 + 2
  # One epsilon, one kind, one sampling as plain values.
  plain = types.SimpleNamespace(training_audit=types.SimpleNamespace(
      epsilons=3, record_kinds='gradient', threats='all_iterates',
      samplings={'dp_sgd': 'poisson', 'central_dp': 'none'}))
  assert ta.trainings(plain, {'defenses': ('dp_sgd', 'central_dp')}) == [
      _tr('dp_sgd', 'poisson', 'gradient', 3.0), _tr('central_dp', 'none', 'client', 3.0)]
  assert isinstance(ta.trainings(plain, {'defenses': ('dp_sgd',)})[0]['claimed_epsilon'],
                    float)


def test_each_canary_kind_is_read_by_its_own_threats():
  config = _config()
  assert ta.threats_of(config, _tr('dp_sgd', 'poisson', 'gradient')) == (
      'all_steps', 'all_iterates', 'last_iterate')
  for kind in ('input', 'client'):
    assert ta.threats_of(config, _tr('update_dp', 'none', kind)) == (
        'all_iterates', 'last_iterate')
  assert ta.threats_of(config, _tr('update_dp', 'none', 'side_channel')) == ('side_channel',)
  config.training_audit.threats = ('last_iterate', 'all_steps')
  assert ta.threats_of(config, _tr('dp_sgd', 'shuffle', 'gradient')) == (
      'all_steps', 'last_iterate')
  assert ta.threats_of(config, _tr('central_dp', 'none', 'client')) == ('last_iterate',)
  _set(config, 'threats', 'all_steps')
  assert ta.threats_of(config, _tr('dp_sgd', 'poisson', 'input')) == ()


def test_mechanism_names_by_hand():
  m = lambda d, x, p=1.0: ta.mechanism({'defense': d, 'sampling': x}, p)
  assert m('dp_sgd', 'poisson') == 'dp_sgd_poisson' and m('dp_sgd', 'shuffle') == (
      'dp_sgd_shuffle')
  for d in ('central_dp', 'weak_dp'):
    # The aggregate's reader sees a sample of the clients when the claim says so or when the
    # federation draws one.
    assert m(d, 'none') == d and m(d, 'none', 0.5) == f'{d}_without_replacement'
    assert m(d, 'without_replacement') == m(d, 'without_replacement', 0.5) == (
        f'{d}_without_replacement')
  for d in ('update_dp', 'ldp_sgd'):   # the server: it picks who takes part
    assert m(d, 'none') == m(d, 'none', 0.5) == d
  assert m('dp_sgd', 'poisson', 0.5) == 'dp_sgd_poisson'
  assert ta.mechanism({'defense': 'update_dp', 'sampling': 'none'}) == 'update_dp'


@pytest.mark.parametrize('kind', ['gradient', 'input', 'client', 'side_channel'])
@pytest.mark.parametrize('threat', ['all_steps', 'all_iterates', 'last_iterate'])
@pytest.mark.parametrize('adversary', ['server', 'aggregate'])
@pytest.mark.parametrize('part', [0.5, 1.0])
def test_independence_truth_table(kind, threat, adversary, part):
  # Gradient canaries read at every step, and canary clients read in every round by the
  # server or, when every client takes part, on their own direction of the aggregate.
  want = ((kind == 'gradient' and threat == 'all_steps') or
          (kind == 'client' and threat == 'all_iterates' and
           (adversary == 'server' or part == 1.0)))
  assert ta.independent(None, {'canary': kind}, threat, adversary, part) == want


def test_the_aggregate_readers_shift_and_noise():
  config = _config()
  done = {'claimed': types.SimpleNamespace(metrics={'noise_multiplier': 1.5})}
  assert ta._adversary_stats(config, done) == {'shift': C, 'sigma': 1.5 * C, 'known': True}
  done['claimed'].metrics = {}
  assert math.isnan(ta._adversary_stats(config, done)['sigma'])


def test_replicate_intervals():
  mean, lo, hi = ta._t_interval(np.array([1.0, 2.0, 3.0]))
  half = sps.t.ppf(0.975, 2) / math.sqrt(3)   # sample std 1
  assert (mean, lo, hi) == pytest.approx((2.0, 2.0 - half, 2.0 + half))
  assert 4.3 < sps.t.ppf(0.975, 2) < 4.31
  # One value, or all equal: the mean without an interval; none: nothing.
  for values, want in (([0.5], 0.5), ([0.25, 0.25, 0.25], 0.25)):
    mean, lo, hi = ta._t_interval(np.array(values))
    assert mean == want and math.isnan(lo) and math.isnan(hi)
  assert all(math.isnan(v) for v in ta._t_interval(np.array([])))


def test_plan_trains_once_per_training_and_reports_violations(monkeypatch, caplog):
  config = _config(defenses=('dp_sgd', 'weak_dp'), record_kinds=('gradient',),
                   **{'samplings.dp_sgd': ('poisson',), 'samplings.weak_dp': ('none',)})
  state = {'defenses': ('dp_sgd', 'weak_dp'), 'trainings': {}}
  ran, scored = [], []

  def fake(label):
    def run(config_, state_, tr, key):
      assert config_ is config and state_ is state
      ran.append((label, tr['canary'], tr['defense'], key))
      return {'tr': tr}
    return run

  def point_metrics(config_, state_, tr, threat, done):
    assert config_ is config and state_ is state and done['tr'] == tr
    scored.append((tr['defense'], tr['canary'], threat, len(state_['trainings'])))
    return {'privacy_violation': float(tr['defense'] == 'weak_dp'), 'dp_epsilon': 2.0,
            'best_bound': 3.5}, 40

  monkeypatch.setattr(runs, 'run_training', fake('train'))
  monkeypatch.setattr(runs, 'side_channel', fake('side'))
  monkeypatch.setattr(ta, 'point_metrics', point_metrics)
  key = jax.random.key(4)
  points = ta.plan(config, state, None, key)
  trs = ta.trainings(config, state)
  assert [p.params for p in points] == [{**tr, 'threat': t} for tr in trs
                                        for t in ta.threats_of(config, tr)]
  assert len(points) == 3 + 1 + 2 + 1
  assert [p.unit for p in points] == ['canaries'] * 3 + ['trials'] + ['canaries'] * 2 + [
      'trials']
  with caplog.at_level(logging.ERROR):
    for p in points:
      p.after(p.compute()[0])
  # Each training ran once, with its own key, for its first threat (a side-channel row by
  # the game); one training held at a time.
  assert [(label, kind, d) for label, kind, d, _ in ran] == [
      ('train', 'gradient', 'dp_sgd'), ('side', 'side_channel', 'dp_sgd'),
      ('train', 'client', 'weak_dp'), ('side', 'side_channel', 'weak_dp')]
  for (*_, got), tr in zip(ran, trs):
    np.testing.assert_array_equal(jax.random.key_data(got),
                                  jax.random.key_data(point_key(key, tr)))
  assert [(d, k, t) for d, k, t, _ in scored] == [
      (p.params['defense'], p.params['canary'], p.params['threat']) for p in points]
  assert {held for *_, held in scored} == {1}
  errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
  assert len(errors) == 3  # weak_dp's points only
  assert errors[0] == ('PRIVACY VIOLATION: weak_dp (none, client canaries, all_iterates) '
                       'claims epsilon 2 but the training audit certifies more: 3.500 at '
                       'family-wise 90%')
  # A point without a verdict (or with none) logs nothing.
  caplog.clear()
  with caplog.at_level(logging.ERROR):
    ta._report_violation(config, points[0].params, {})
    ta._report_violation(config, points[0].params, {'privacy_violation': 0.0})
  assert not caplog.records


# ---------------------------------------------------------------------- real trainings ---


TRAININGS = {
    'update_dp': _tr('update_dp', 'none', 'client'),
    'dp_sgd': _tr('dp_sgd', 'poisson', 'gradient'),
    'central_dp': _tr('central_dp', 'without_replacement', 'client'),
    'weak_dp': _tr('weak_dp', 'none', 'client'),
    'ldp_sgd': _tr('ldp_sgd', 'none', 'client', 8.0),
    'side': _tr('update_dp', 'none', 'side_channel'),
}
# Twin trainings for one row only (their own compiled program).
TWINS = {'update_dp': 2}


def _recorder(calls, name, label, real):
  def call(*a, **kw):
    calls[name][label] = (a, kw)
    return real(*a, **kw)
  return call


@pytest.fixture(scope='module')
def trained():
  """Each training of `TRAININGS` through `run_training` / `side_channel`, with the calls it
  made to `canaries.train`, `canaries.accuracy` and `side_channel.play`."""
  state = ta.prepare(_config())
  out, calls, configs = {}, {}, {}
  with pytest.MonkeyPatch.context() as mp:
    for module, label in ((canaries, 'train'), (canaries, 'accuracy'), (side_lib, 'play')):
      real = getattr(module, label)
      mp.setattr(module, label, lambda *a, _l=label, _r=real, **kw: _recorder(
          calls, calls['now'], _l, _r)(*a, **kw))
    for name, tr in TRAININGS.items():
      calls[name] = {}
      calls['now'] = name
      configs[name] = _config(**{'record.twins': TWINS.get(name, 0),
                                 'client.twins': TWINS.get(name, 0)})
      k = point_key(KEY, tr)
      out[name] = (runs.side_channel(configs[name], state, tr, k) if name == 'side' else
                   runs.run_training(configs[name], state, tr, k))
  return state, configs, out, calls


@pytest.fixture(scope='module')
def scored(trained):
  """Every (training, threat) point's metrics, with the calls `point_metrics` made."""
  state, configs, done, _ = trained
  out = {}
  with pytest.MonkeyPatch.context() as mp:
    seen = {}
    for module, label in ((canaries, 'threat_scores'), (canaries, 'audit'),
                          (audit_power, 'optimum'), (audit_power, 'detectable_factor'),
                          (side_lib, 'audit')):
      real = getattr(module, label)
      key = f'side_{label}' if module is side_lib else label
      mp.setattr(module, label, lambda *a, _k=key, _r=real, **kw: (
          seen.__setitem__(_k, (a, kw)), _r(*a, **kw))[1])
    for name, tr in TRAININGS.items():
      for threat in ta.threats_of(configs[name], tr):
        seen.clear()
        metrics, n = ta.point_metrics(configs[name], state, tr, threat, done[name])
        out[name, threat] = (metrics, n, dict(seen))
  return out


def _replicate_keys(tr, r):
  return [jax.random.fold_in(point_key(KEY, tr), i) for i in range(r)]


def test_run_training_pools_replicates_keyed_by_fold_in(trained):
  # First in the file among the trained tests: a mutation run ties the module fixture's
  # calls to the first test that uses it.
  state, configs, done, calls = trained
  test = state['test']
  test_x = np.asarray(data.to_float(test.x)).reshape(len(test), -1)
  for name in ('update_dp', 'dp_sgd', 'central_dp'):
    tr, config, d = TRAININGS[name], configs[name], done[name]
    s = config.training_audit
    fed = runs.federation(config, tr)
    (apply_fn, params, clients), kw = calls[name]['train']
    m, r = runs.canaries_per_training(config, tr), runs.replicates(config, tr)
    assert (d['replicates'], d['per_training']) == (r, m)
    assert (m, r) == {'update_dp': (10, 12), 'dp_sgd': (24, 8), 'central_dp': (20, 6)}[name]
    keys = _replicate_keys(tr, r)
    # Replicate i: its own key fold_in(key, i); its training key, w_0, shards and coins
    # folded from it.
    np.testing.assert_array_equal(
        jax.random.key_data(kw['keys']),
        np.stack([jax.random.key_data(jax.random.fold_in(k, 5)) for k in keys]))
    model = state['models'][tuple(fed.hidden)]
    assert apply_fn == model.apply
    for i in (0, r - 1):
      chex.assert_trees_all_equal(
          jax.tree_util.tree_map(lambda a, i=i: a[i], params),
          model.init(jax.random.fold_in(keys[i], 2), np.zeros((1, 64), np.float32)))
    rows = data.iid_partition(jax.random.fold_in(keys[1], 1), len(state['train']),
                              int(fed.num_clients), per_client=int(fed.per_client))
    flat_train = np.asarray(data.to_float(state['train'].x)).reshape(len(state['train']), -1)
    np.testing.assert_array_equal(np.asarray(clients.x)[1, :, :int(fed.per_client)],
                                  flat_train[np.stack(rows)])
    world = np.concatenate([canaries.coins(jax.random.fold_in(k, 3), m) for k in keys])
    np.testing.assert_array_equal(d['world'], world)
    assert len({w.tobytes() for w in world.reshape(r, m)}) > 1   # not one draw repeated
    assert d['dim'] == state['dims'][tuple(fed.hidden)]
    # The claim's hooks and participation, the federation's settings, the test split.
    assert kw['hooks'] is d['claimed'].hooks
    assert d['participation'] == kw['participation'] == runs.participation(config, tr)
    assert kw['always'] == (name == 'update_dp')   # the server keeps its canaries in
    assert (kw['kind'], kw['clip_norm'], kw['canary_norm']) == (tr['canary'], C, 2.0 * C)
    assert (kw['num_rounds'], kw['epochs'], kw['batch_size']) == (
        int(fed.num_rounds), int(fed.epochs), int(fed.batch_size))
    assert kw['optimizer'] is runs.optimizer(s.optimizer, float(fed.learning_rate))
    assert kw['chunk'] == 32 and kw['num_classes'] == 10
    np.testing.assert_array_equal(kw['test_x'], test_x)
    np.testing.assert_array_equal(kw['test_y'], test.y)
    planted = kw['planted']
    np.testing.assert_array_equal(np.asarray(planted.world).reshape(-1), world)
    flat, unravel = flatten_util.ravel_pytree(model.init(KEY, np.zeros((1, 64), np.float32)))
    sc = d['scores']
    assert sc.uploads.shape == (r * m,) and sc.test_accuracy.shape == (r,)
    assert np.all((sc.test_accuracy >= 0) & (sc.test_accuracy <= 1))
    if tr['canary'] == 'client':
      assert kw['owner'] is None and kw['reading'] is None
      relation = d['claimed'].declaration.relation
      assert d['relation'] == relation == 'replace_one'
      i = r - 1
      dirs = canaries.directions(jax.random.fold_in(keys[i], 4), m, flat.shape[0], 'random')
      np.testing.assert_array_equal(np.asarray(planted.directions)[i], dirs)
      want = canaries.injected_clients(dirs, world[i * m:(i + 1) * m], unravel, norm=2.0 * C,
                                       relation=relation, size=float(fed.per_client))
      chex.assert_trees_all_close(jax.tree_util.tree_map(lambda a: a[i], planted.injected),
                                  (want.deltas, want.sizes))
    else:
      assert d['relation'] == 'add_remove'
      assert kw['reading'] == runs.step_reading(config, tr, d['claimed'])
      np.testing.assert_array_equal(kw['owner'], np.arange(m) % int(fed.num_clients))
      for i in (0, r - 1):
        np.testing.assert_array_equal(
            np.asarray(planted.coordinates)[i],
            canaries.dirac_coordinates(jax.random.fold_in(keys[i], 4), m, flat.shape[0]))
      np.testing.assert_array_equal(np.asarray(planted.code_sign), np.ones((r, m)))
      # Add/remove: an OUT canary's row is padding; the real rows all count.
      mask = np.asarray(clients.mask)
      n = int(fed.per_client)
      np.testing.assert_array_equal(mask[:, :, :n], np.ones((r, int(fed.num_clients), n)))
      assert mask[:, :, n:].sum() == world.sum()
    if name == 'central_dp':
      # The clip and the noise act on the aggregate: the server would read each canary's own
      # update (+-canary_norm x C on its direction) in each round the round loop drew it for.
      total = int(fed.num_clients) + m
      took = np.stack([np.stack([np.asarray(rounds.participants(
          jax.random.fold_in(k, 5), t, total, 0.5))[-m:] for t in range(2)]).sum(0)
                       for k in keys]).reshape(-1)
      assert 0 < took.mean() < 2
      want = 2.0 * C * canaries.signs('replace_one', world) * took
      np.testing.assert_allclose(sc.uploads, want, rtol=1e-4, atol=1e-5)
      np.testing.assert_array_equal(sc.participants, np.full((2, r * m), total // 2))
  # Twins: the first `twins` replicates again, the same keys, shards and w_0, no canaries.
  (apply_fn, params, clients), kw = calls['update_dp']['accuracy']
  (_, cparams, cclients), ckw = calls['update_dp']['train']
  np.testing.assert_array_equal(jax.random.key_data(kw['keys']),
                                jax.random.key_data(ckw['keys'][:2]))
  chex.assert_trees_all_equal(params, jax.tree_util.tree_map(lambda a: a[:2], cparams))
  np.testing.assert_array_equal(clients.x, np.asarray(cclients.x)[:2])
  assert kw['hooks'] is ckw['hooks'] and kw['participation'] == ckw['participation']
  assert done['update_dp']['twin_accuracy'].shape == (2,)
  for name in ('dp_sgd', 'central_dp', 'weak_dp', 'ldp_sgd'):
    assert 'accuracy' not in calls[name] and done[name]['twin_accuracy'].shape == (0,)


def test_shards_are_the_clients_disjoint_rows_and_the_pool_what_no_client_holds():
  config = _config()
  state = ta.prepare(config)
  key = jax.random.key(3)
  train = state['train']
  flat = np.asarray(data.to_float(train.x)).reshape(len(train), -1)
  for tr in (_tr('dp_sgd', 'poisson', 'gradient'), _tr('central_dp', 'none', 'client')):
    fed = runs.federation(config, tr)
    k, n = int(fed.num_clients), int(fed.per_client)
    clients, pool_x, pool_y = runs._shards(config, tr, state, key)
    assert clients.x.shape == (k, n, 64) and clients.y.shape == (k, n)
    parts = data.iid_partition(jax.random.fold_in(key, 1), len(train), k, per_client=n)
    assert len(np.unique(np.concatenate(parts))) == k * n   # disjoint
    for c, rows in enumerate(parts):
      np.testing.assert_array_equal(clients.x[c], flat[rows])
      np.testing.assert_array_equal(clients.y[c], train.y[rows])
    unused = np.setdiff1d(np.arange(len(train)), np.concatenate(parts))
    assert len(unused) == len(train) - k * n > 0
    np.testing.assert_array_equal(pool_x, flat[unused])   # never the test split
    np.testing.assert_array_equal(pool_y, train.y[unused])
    assert pool_y.dtype == np.int32 and clients.y.dtype == np.int32


def test_replicates_input_canaries_are_mislabelled_images_no_client_holds():
  config = _config()
  state = ta.prepare(config)
  fed = config.training_audit.record
  m = runs.canaries_per_training(config, _tr('dp_sgd', 'shuffle', 'input'))
  assert m == 8
  key = jax.random.key(7)
  for relation in ('replace_one', 'add_remove'):
    rep = runs._replicate(config, state, _tr('dp_sgd', 'shuffle', 'input'), key, relation)
    _, pool_x, pool_y = runs._shards(config, _tr('dp_sgd', 'shuffle', 'input'), state, key)
    rng = data.rng_from_key(jax.random.fold_in(key, 4))
    pick = rng.choice(len(pool_y), m, replace=False)
    wrong = (pool_y[pick] + rng.integers(1, 10, m)) % 10
    assert np.all(wrong != pool_y[pick])
    planted = rep['planted']
    np.testing.assert_array_equal(planted.x, pool_x[pick])
    np.testing.assert_array_equal(planted.y, wrong)
    world = canaries.coins(jax.random.fold_in(key, 3), m)
    np.testing.assert_array_equal(planted.world, world)
    # Canary i sits after the real rows of client i mod K; under replace-one an OUT canary
    # keeps its true label and stays a row; under add/remove it is padding.
    n, k = int(fed.per_client), int(fed.num_clients)
    x, y, mask = (np.asarray(a) for a in (rep['clients'].x, rep['clients'].y,
                                          rep['clients'].mask))
    owner, slot = np.arange(m) % k, np.arange(m) // k
    np.testing.assert_array_equal(x[owner, n + slot], pool_x[pick])
    if relation == 'replace_one':
      np.testing.assert_array_equal(y[owner, n + slot], np.where(world, wrong, pool_y[pick]))
      np.testing.assert_array_equal(mask[owner, n + slot], np.ones(m))
    else:
      np.testing.assert_array_equal(y[owner, n + slot], wrong)
      np.testing.assert_array_equal(mask[owner, n + slot], world.astype(np.float32))
    # The pool is the train rows no client holds; the twin walks the real rows, masked.
    train = state['train']
    assert len(pool_y) == len(train) - k * n
    np.testing.assert_array_equal(rep['twin'].mask, np.ones((k, n)))
    np.testing.assert_array_equal(rep['twin'].x, x[:, :n])


def _consistent(m):
  """The verdict fields agree with each other."""
  violation, refute = float(m['privacy_violation']) == 1.0, float(m['can_refute']) == 1.0
  assert (m['verdict'] == 'violation') == violation, m['verdict']
  assert (m['verdict'] == 'cannot refute') == (not refute and not violation), m['verdict']
  assert (int(m['canaries_needed']) == 0) == refute
  assert m['verdict'] in canary_statistics.VERDICTS
  assert 0.0 <= float(m['best_bound']) <= float(m['max_certifiable'])


def test_every_point_records_its_claim_the_training_and_a_consistent_verdict(trained, scored):
  state, configs, done, _ = trained
  assert {n for n, _ in scored} == set(TRAININGS)
  intervals = 0
  for (name, threat), (m, n, _) in scored.items():
    tr, d = TRAININGS[name], done[name]
    _consistent(m)
    assert m['privacy_violation'] == 0.0, (name, threat)
    assert m['audited_pipeline'] == ta.AUDITED and m['plant'] == 'none'
    assert m['dp_adversary'] == ('aggregate' if tr['defense'] in ('central_dp', 'weak_dp')
                                 else 'server')
    assert n == m['num_canaries'] == m['n_in'] + m['n_out'] == len(d['world'])
    if name == 'side':
      assert n == 64
      continue
    assert n == d['replicates'] * d['per_training']
    assert (m['replicates'], m['canaries_per_training']) == (d['replicates'],
                                                             d['per_training'])
    assert m['model_parameters'] == d['dim'] == state['dims'][tuple(
        runs.federation(configs[name], tr).hidden)]
    assert m['canary_relation'] == d['relation'] and m['participation_run'] == (
        d['participation'])
    # The claim is the registry's (the registry's own metrics, kept).
    if tr['defense'] != 'ldp_sgd':
      for k, v in d['claimed'].metrics.items():
        assert m[k] == v, (name, k)
    if tr['defense'] != 'weak_dp':   # (weak_dp's claim is per round)
      assert m['dp_epsilon'] == pytest.approx(tr['claimed_epsilon'], rel=1e-6)
    assert m['dp_unit'] == ('record' if tr['defense'] == 'dp_sgd' else 'client')
    # Accuracy: the replicates' mean with a Student-t interval, beside the twins'.
    acc = d['scores'].test_accuracy
    assert m['test_accuracy'] == pytest.approx(np.mean(acc))
    np.testing.assert_allclose([m['test_accuracy_ci_low'], m['test_accuracy_ci_high']],
                               ta._t_interval(acc)[1:])
    if np.std(acc) > 0:
      intervals += 1
      assert m['test_accuracy_ci_low'] < m['test_accuracy'] < m['test_accuracy_ci_high']
    assert m['twins'] == len(d['twin_accuracy'])
    if name == 'update_dp':
      change = acc[:2] - d['twin_accuracy']
      assert m['twin_accuracy'] == pytest.approx(np.mean(d['twin_accuracy']))
      assert m['accuracy_change'] == pytest.approx(np.mean(change))
      assert m['twins'] == 2
    else:
      assert math.isnan(m['twin_accuracy']) and math.isnan(m['accuracy_change'])
  assert intervals > 0


def test_the_server_row_counts_the_midpoint_test_and_simulates_its_optimal_attack(trained,
                                                                                 scored):
  _, configs, done, _ = trained
  d = done['update_dp']
  m, _, seen = scored['update_dp', 'all_iterates']
  (sc, threat, adversary), kw = seen['threat_scores']
  assert sc is d['scores'] and (threat, adversary) == ('all_iterates', 'server')
  assert kw == {'participation': 0.5}
  (scores, world, mechanism, claimed), kw = seen['audit']
  np.testing.assert_array_equal(scores, d['scores'].uploads)
  assert world is d['world'] and mechanism == 'update_dp' and claimed == m['dp_epsilon']
  assert (kw['delta'], kw['confidence']) == (DELTA, CONFIDENCE)
  # Independent replace-one canaries: 0 is the midpoint fixed before the data.
  assert kw['independent'] is True and kw['midpoint'] == 0.0
  assert m['counted_bounds'] == ('epsilon_one_run,epsilon_one_run_fdp,epsilon_cp,epsilon_gdp,'
                                 'epsilon_gdp_midpoint,profile')
  assert m['estimate_method'] == 'gaussian_fit'
  assert m['epsilon_gaussian_fit'] == m['epsilon_estimate']
  # The claimed profile of the declaration that ran.
  decl, z = d['claimed'].declaration, float(d['claimed'].metrics['noise_multiplier'])
  grid = np.array([0.5, 1.0, 3.0])
  np.testing.assert_array_equal(kw['claimed_delta'](grid), accounting.delta_curve(
      decl, z, grid, accountant='rdp'))
  # The optimal attack simulated on the claimed curve: T rounds of noise z, +-1 clip; the
  # row's design (canaries, claim, tests) and the configured draws; the power on the same.
  (curve, design), skw = seen['optimum']
  assert curve == canary_statistics.Curve(steps=decl.compositions, noise=z,
                                          relation='replace_one')
  assert design == audit_power.Design(
      n_in=m['n_in'], n_out=m['n_out'], mechanism='update_dp', claimed_epsilon=m['dp_epsilon'],
      delta=DELTA, confidence=CONFIDENCE, independent=True,
      claimed_delta=seen['audit'][1]['claimed_delta'], midpoint=0.0)
  assert skw['draws'] == 3 and skw['observed'] == m['best_bound']
  # Three draws give a median but no distribution-free 95% interval (NaN; 6 is the fewest).
  assert m['simulated_draws'] == 3 and math.isnan(m['simulated_bound_ci_low'])
  (pcurve, pdesign), pkw = seen['detectable_factor']
  assert (pcurve, pdesign) == (curve, design)
  assert pkw['draws'] == 2 and tuple(pkw['factors']) == (0.3, 0.6)
  assert pkw['seed'] != skw['seed']
  assert m['power_draws'] == 2 and m['power_model'].startswith("the row's statistic")
  if math.isfinite(m['power_factor']):
    assert m['power_planted_epsilon'] == pytest.approx(accounting.epsilon(
        decl, z * m['power_factor'], delta=DELTA, accountant='rdp'))
    assert m['power_planted_epsilon'] > m['dp_epsilon']
  assert m['simulated_bound'] >= 0
  if m['simulated_bound'] > 0:
    assert m['attainable_ratio'] == pytest.approx(m['best_bound'] / m['simulated_bound'])
  else:
    assert math.isnan(m['attainable_ratio'])
  # The last iterate: not independent trials, no midpoint, no simulated curve.
  last, _, seen = scored['update_dp', 'last_iterate']
  assert seen['audit'][1]['independent'] is False and seen['audit'][1]['midpoint'] is None
  np.testing.assert_array_equal(seen['audit'][0][0], d['scores'].last)
  assert last['counted_bounds'] == 'epsilon_one_run,epsilon_one_run_fdp'
  assert 'optimum' not in seen and 'simulated_bound' not in last
  assert last['power_model'] == 'not simulated' and 'power_factor' not in last
  del configs


def test_poisson_all_steps_takes_the_subsampled_fit_as_its_estimate(trained, scored):
  _, _, done, _ = trained
  d = done['dp_sgd']
  m, _, seen = scored['dp_sgd', 'all_steps']
  decl, z = d['claimed'].declaration, float(d['claimed'].metrics['noise_multiplier'])
  (scores, world, mechanism, _), kw = seen['audit']
  np.testing.assert_array_equal(scores, d['scores'].steps)
  assert mechanism == 'dp_sgd_poisson' and kw['independent'] is True
  assert kw['midpoint'] is None    # add/remove: no symmetric threshold
  # The scores' three tests, and the MLE / PLD test on the trainings' per-step readings.
  assert m['counted_bounds'] == 'epsilon_one_run,epsilon_cp,profile,epsilon_mle_pld'
  mom = d['scores'].step_moments
  fit = canary_statistics.subsampled_fit_epsilon(mom[world], mom[~world],
                                                 steps=decl.compositions, delta=DELTA)
  assert m['estimate_method'] == 'subsampled_gaussian_fit (pld)'
  for k in ('fit_epsilon', 'fit_rate', 'fit_noise_multiplier'):
    np.testing.assert_equal(m[k], fit[k])
  np.testing.assert_equal(m['epsilon_estimate'], fit['fit_epsilon'])
  _, gauss = canary_statistics.gaussian_fit_epsilon(scores[world], scores[~world], DELTA)
  assert m['epsilon_gaussian_fit'] == gauss != m['epsilon_estimate']
  (curve, design), _ = seen['optimum']
  assert curve == canary_statistics.Curve(steps=decl.compositions, noise=z,
                                          rate=decl.sampling_rate)
  assert design.midpoint is None and 'attainable_ratio' in m
  assert design.mechanism == 'dp_sgd_poisson' and design.independent
  # The headline is assumption-free; Poisson counts no Gaussian test.
  assert m['certified_free'] == m['best_bound'] and m['best_bound_assumes'] == 'none'
  assert m['certified_gaussian_test'] == 'none'
  assert m['estimate_assumes'] == 'poisson_subsampled_gaussian'
  # The trainings keep the per-step readings: the MLE / PLD test runs on every step each
  # canary saw (2 rounds here), and joins the verdict's family (`training_audit_poisson`).
  reads = d['scores'].step_readings
  assert reads.shape == (len(world), int(mom[0, 2])) and np.isfinite(reads).all()
  np.testing.assert_array_equal(mom[:, 2], reads.shape[1])
  np.testing.assert_allclose(np.sum(reads, axis=1), mom[:, 0], rtol=1e-4, atol=1e-3)
  assert kw['extra_tests'] == 1 and m['mle_pld_model'].startswith('per-step readings')
  assert m['mle_steps_seen'] == reads.shape[1] and math.isfinite(m['epsilon_mle_pld'])
  assert m['certified_family_test'] == 'epsilon_mle_pld'
  # At smoke size the power simulation leaves the MLE test out, and says so.
  assert m['power_model'].endswith('(training_audit.mle_power off)')
  assert design.mle_steps is None
  for threat in ('all_iterates', 'last_iterate'):
    other, _, seen = scored['dp_sgd', threat]
    assert seen['audit'][1]['independent'] is False
    assert other['estimate_method'] == 'gaussian_fit' and 'fit_epsilon' not in other
    assert other['counted_bounds'] == 'epsilon_one_run'
    assert 'simulated_bound' not in other and other['power_model'] == 'not simulated'


def test_a_sampled_aggregates_reader_scores_dependent_canaries(trained, scored):
  _, _, done, _ = trained
  d = done['central_dp']
  m, _, seen = scored['central_dp', 'all_iterates']
  z = float(d['claimed'].metrics['noise_multiplier'])
  (sc, threat, adversary), kw = seen['threat_scores']
  assert sc is d['scores'] and (threat, adversary) == ('all_iterates', 'aggregate')
  # The white-box reader of the aggregate: k_t x aggregate minus the known contributions,
  # shift C and noise z C a round, scored by the mixture of the round's sample.
  assert set(kw) == {'participation', 'shift', 'sigma', 'known'} and kw['known'] is True
  assert (kw['participation'], kw['shift']) == (0.5, C)
  assert kw['sigma'] == pytest.approx(z * C)
  (_, _, mechanism, _), kw = seen['audit']
  assert mechanism == 'central_dp_without_replacement'
  assert kw['independent'] is False and kw['midpoint'] is None
  assert m['counted_bounds'] == 'epsilon_one_run'   # not Gaussian, not independent
  assert 'simulated_bound' not in m and m['canaries_independent'] == 0.0
  # Its power: the subsampled mixture of T rounds at the round's rate, one-run tests only,
  # the canaries drawn independently (the run couples them).
  (curve, design), _ = seen['detectable_factor']
  assert curve == canary_statistics.Curve(steps=2, noise=z, rate=0.5, relation='replace_one')
  assert design.independent is False and design.mechanism == mechanism
  assert 'independently' in m['power_model'] and 'optimum' not in seen


def test_weak_dp_is_audited_composed_with_its_per_round_claim_beside(trained, scored):
  _, configs, done, _ = trained
  d = done['weak_dp']
  rounds_ = int(configs['weak_dp'].training_audit.client.num_rounds)
  decl, z = d['claimed'].declaration, float(d['claimed'].metrics['noise_multiplier'])
  for threat in ('all_iterates', 'last_iterate'):
    m, _, seen = scored['weak_dp', threat]
    # The claim is per round (2.0); the audit is of its composition over the rounds that ran.
    assert m['dp_epsilon_per_round'] == pytest.approx(2.0, rel=1e-6)
    assert m['dp_epsilon'] > 1.2 * m['dp_epsilon_per_round']
    assert m['dp_epsilon'] == d['claimed'].metrics['dp_epsilon']
    assert seen['audit'][0][3] == m['dp_epsilon']
    assert m['exceeds_per_round'] == float(m['best_bound'] > m['dp_epsilon_per_round'])
    grid = np.array([0.5, 1.0, 3.0])
    composed = dataclasses.replace(decl, compositions=rounds_)
    profile = seen['audit'][1]['claimed_delta'](grid)
    np.testing.assert_array_equal(profile, accounting.delta_curve(composed, z, grid))
    assert np.all(profile > accounting.delta_curve(decl, z, grid))
    # The federation draws half the clients a round: the sampled curve.
    assert seen['audit'][0][2] == 'weak_dp_without_replacement'
    # The planted bug's epsilon is the composed declaration's at the detected noise.
    if threat == 'all_iterates' and math.isfinite(m['power_factor']):
      assert m['power_planted_epsilon'] == pytest.approx(accounting.epsilon(
          composed, z * m['power_factor'], delta=DELTA, accountant='rdp'))
  for name in ('update_dp', 'central_dp'):
    assert 'exceeds_per_round' not in scored[name, 'all_iterates'][0]


def test_ldp_sgds_declaration_comes_from_the_registry(trained, scored):
  state, configs, done, _ = trained
  config, d = configs['ldp_sgd'], done['ldp_sgd']
  assert d['claimed'].declaration is None
  per_report = 8.0 / int(config.training_audit.client.num_rounds)
  decl = registry.declaration('ldp_sgd', {'epsilon': per_report},
                              runs.setting(config, state, TRAININGS['ldp_sgd']))
  for threat in ('all_iterates', 'last_iterate'):
    m, _, seen = scored['ldp_sgd', threat]
    assert m['dp_epsilon'] == accounting.epsilon(decl, delta=DELTA)
    assert m['dp_epsilon'] == pytest.approx(8.0, rel=1e-6)   # 4 a report, 2 reports
    assert m['dp_delta'] == DELTA
    for k, v in accounting.describe(decl).items():
      assert m[k] == v, k
    grid = np.array([0.5, 1.0, 3.0])
    np.testing.assert_array_equal(seen['audit'][1]['claimed_delta'](grid),
                                  accounting.delta_curve(decl, None, grid))
    assert seen['audit'][0][2] == 'ldp_sgd'
    # Randomized response's curve: no Gaussian estimate, no midpoint test.
    assert math.isnan(m['epsilon_estimate']) and seen['audit'][1]['midpoint'] is None
  assert scored['ldp_sgd', 'all_iterates'][2]['audit'][1]['independent'] is True


def test_the_side_channel_row_plays_the_game_with_the_claimed_hooks(trained, scored):
  state, configs, done, calls = trained
  tr, config, d = TRAININGS['side'], configs['side'], done['side']
  m, n, seen = scored['side', 'side_channel']
  (apply_fn, _, pool_x, pool_y), kw = calls['side']['play']
  assert kw['hooks'] is d['claimed'].hooks and kw['adversary'] == 'server'
  assert kw['mode'] == 'add' and kw['trials'] == 64 and kw['others'] == 0
  assert kw['num_examples'] == runs.side_rows(config, tr) == 1
  np.testing.assert_array_equal(jax.random.key_data(kw['key']), jax.random.key_data(
      jax.random.fold_in(point_key(KEY, tr), 7)))
  assert len(pool_y) == len(state['train']) and pool_x.shape == (len(pool_y), 64)
  assert apply_fn == state['models'][(5,)].apply
  (world, stats, mechanism, claimed), kw = seen['side_audit']
  assert world is d['world'] and mechanism == 'update_dp' and claimed == m['dp_epsilon']
  assert set(stats) == set(side_lib.SERVER_STATISTICS)
  assert (kw['delta'], kw['confidence']) == (DELTA, CONFIDENCE)
  assert n == 64 and m['side_channel_rows'] == 1 and m['side_channel_neighbours'] == 'add'
  assert m['threat_reads'] == 'upload_norm, noisy_steps, reported_examples'
  assert m['side_channel_family'] == 6 and m['dp_adversary'] == 'server'
  # The claimed hooks report a public count: the count the server reads never moves.
  assert m['side_reported_examples_in_mean'] == m['side_reported_examples_out_mean']
  assert 'threat_scores' not in seen and 'test_accuracy' not in m


# ----------------------------------------------------------------------- unused fields ---


def test_the_fields_a_run_does_not_read_are_named_with_why():
  config = digits.get_config('')
  # The default reads every field of its own section; the game runner's chunking is the other
  # games' (the audit chunks its trainings by training_audit.chunk).
  assert set(ta.unused_fields(config)) == {'game.chunk_size', 'game.batch_bytes'}
  s = config.training_audit
  s.defenses = ('update_dp',)
  s.threats = ('all_iterates', 'last_iterate')
  got = ta.unused_fields(config)
  want = {f'training_audit.record.{f}' for f in s.record.keys()} | {
      'training_audit.record_kinds', 'training_audit.side_channel_trials',
      'training_audit.side_channel_others'} | {
          f'training_audit.samplings.{d}' for d in ('dp_sgd', 'central_dp', 'weak_dp',
                                                    'ldp_sgd')} | {
              'game.chunk_size', 'game.batch_bytes', 'training_audit.mle_test',
              'training_audit.mle_power'}
  assert set(got) == want
  assert got['training_audit.mle_test'].startswith('read only by Poisson DP-SGD rows')
  assert got['training_audit.record.canaries'] == (
      'read only for dp_sgd, which training_audit.defenses does not choose')
  assert got['training_audit.samplings.ldp_sgd'] == 'ldp_sgd is not in training_audit.defenses'
  # dp_sgd alone, gradient canaries only, the side channel played: the client federation, the
  # directions, the input canaries' counts and the aggregate reader's clients are unread.
  s.defenses, s.record_kinds = ('dp_sgd',), ('gradient',)
  s.threats = ('all_steps', 'side_channel')
  got = ta.unused_fields(config)
  assert {'training_audit.record.input_per_client', 'training_audit.record.input_canaries',
          'training_audit.direction', 'training_audit.side_channel_others',
          'training_audit.client.canary_share'} <= set(got)
  assert not {'training_audit.record.canaries', 'training_audit.side_channel_trials',
              'training_audit.record_kinds'} & set(got)
  assert got['training_audit.record.input_canaries'] == (
      'read only for input canaries, which training_audit.record_kinds does not choose')
  s.defenses = ('dp_sgd', 'weak_dp')
  assert 'training_audit.side_channel_others' not in ta.unused_fields(config)


def test_the_headline_column_is_the_assumption_free_bound_and_the_verdict_says_by_what():
  cols = {c.title: c.cell for c in ta.SUMMARY[0].columns}
  point = {'params': {}, 'metrics': dict(certified_free=0.83, certified_gaussian=7.14,
                                         best_bound=7.14, verdict='no violation',
                                         verdict_tests='epsilon_gdp_midpoint',
                                         verdict_assumes='gaussian', power_factor=0.9,
                                         reach_tests='epsilon_gdp,profile')}
  assert cols['eps certified (assumes none)'](point) == '0.83'
  assert cols['eps if Gaussian'](point) == '7.14'
  assert cols['verdict assumes'](point) == 'gaussian'
  assert cols['verdict by'](point) == 'epsilon_gdp_midpoint'
  assert cols['refutable by'](point) == 'epsilon_gdp,profile'
  assert cols['detects noise x (95%)'](point) == '0.90'
