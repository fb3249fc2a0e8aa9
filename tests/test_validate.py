"""Config validation: messages name the field, the allowed values and what was given."""

import ml_collections
import pytest

from fl_privacy import validate


def _config():
  c = ml_collections.ConfigDict()
  c.ami = ml_collections.ConfigDict()
  c.ami.epsilons = (1.0, 2.0)
  c.ami.mechanisms = ('none', 'bitrand')
  c.ami.num_neurons = 10
  c.ami.steps = 1.0
  c.ami.p = 0.5
  return c


def test_accepts_valid_values():
  c = _config()
  assert validate.positive(c, 'ami.epsilons') == (1.0, 2.0)
  assert validate.positive(c, 'ami.num_neurons', integer=True) == 10
  assert validate.subset_of(c, 'ami.mechanisms', ('none', 'bitrand', 'ome')) == ('none', 'bitrand')
  assert validate.in_range(c, 'ami.p', 0.0, 1.0) == 0.5


@pytest.mark.parametrize('field,value,check', [
    ('ami.epsilons', (1.0, -1.0), lambda c: validate.positive(c, 'ami.epsilons')),
    ('ami.epsilons', (), lambda c: validate.positive(c, 'ami.epsilons')),
    ('ami.epsilons', (float('nan'),), lambda c: validate.positive(c, 'ami.epsilons')),
    ('ami.num_neurons', 0, lambda c: validate.positive(c, 'ami.num_neurons', integer=True)),
    ('ami.steps', 2.5, lambda c: validate.positive(c, 'ami.steps', integer=True)),
    ('ami.mechanisms', ('ldp',), lambda c: validate.subset_of(c, 'ami.mechanisms', ('none',))),
    ('ami.p', 1.5, lambda c: validate.in_range(c, 'ami.p', 0.0, 1.0)),
])
def test_rejects_with_field_in_message(field, value, check):
  c = _config()
  section, name = field.split('.')
  c[section][name] = value
  with pytest.raises(validate.ConfigError) as info:
    check(c)
  assert info.value.field == field
  assert f'config.{field}' in str(info.value)
  assert 'must be' in str(info.value)


def test_missing_field_is_named():
  with pytest.raises(validate.ConfigError, match='config.ami.nope'):
    validate.one_of(_config(), 'ami.nope', ('a',))


@pytest.mark.parametrize('value', [float('inf'), float('nan'), (1.0, float('inf')), -1.0])
def test_an_unbounded_range_still_refuses_inf_and_nan(value):
  # "[0, inf]" means a finite number >= 0: an inf weight only shows as NaN after training.
  c = _config()
  c.ami.w = value
  with pytest.raises(validate.ConfigError) as info:
    validate.in_range(c, 'ami.w', 0.0, float('inf'))
  assert str(info.value) == f'config.ami.w: must be a finite number >= 0 (got {value!r})'
  c.ami.big = (0.0, 1e300)
  assert validate.in_range(c, 'ami.big', 0.0, float('inf')) == (0.0, 1e300)


@pytest.mark.parametrize('module,field,value', [
    ('pastel', 'pastel.pastel_weights', (float('inf'),)),
    ('pastel', 'pastel.ablation_pastel_weight', float('inf')),
    ('fedmia', 'fedmia.weight_decay', float('inf')),
    ('dishonest_mia', 'dishonest.near_threshold', float('inf')),
])
def test_every_unbounded_pipeline_field_refuses_inf(module, field, value):
  import importlib  # pylint: disable=g-import-not-at-top
  from configs import digits  # pylint: disable=g-import-not-at-top
  pipeline = importlib.import_module(f'fl_privacy.pipelines.{module}')
  config = digits.get_config('smoke')
  pipeline.validate_config(config)  # the defaults pass
  section, name = field.split('.')
  config[section][name] = value
  with pytest.raises(validate.ConfigError, match='must be a finite number >= 0') as info:
    pipeline.validate_config(config)
  assert info.value.field == field


def test_checked_reads_the_field_and_applies_the_rule():
  config = ml_collections.ConfigDict({'s': {'n': 3, 'm': 0}})
  rule = validate.number(1, integer=True)
  assert validate.checked(config, 's.n', rule) == 3
  with pytest.raises(validate.ConfigError, match=r'^config\.s\.m: must be an integer >= 1 '
                                                 r'\(got 0\)$'):
    validate.checked(config, 's.m', rule)
  with pytest.raises(validate.ConfigError, match=r'^config\.s\.k: must be present in the config'):
    validate.checked(config, 's.k', rule)


def test_type_and_range_checks_are_declared_rules_everywhere():
  # One vocabulary (the house issue, item 3): a check of a field's type or range is a
  # `validate.Rule` (its text is the message), never a `require(isinstance(...) and ...)`
  # written by hand beside it. `require` stays for conditions across fields or data.
  import pathlib  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  repo = pathlib.Path(__file__).resolve().parents[1]
  pattern = re.compile(r'require\(\s*(all\()?\s*(not\s+)?(isinstance|_is_)')
  files = [p for d in ('fl_privacy', 'configs', 'experiments') for p in (repo / d).rglob('*.py')]
  assert len(files) > 50
  found = [f'{p.relative_to(repo)}:{i}' for p in files
           for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
  assert not found, f'hand-written type/range checks (declare a validate.Rule): {found}'
  # The detector itself: it must see the form it forbids.
  assert pattern.search("validate.require(isinstance(v, bool), 'x', 'True or False', v)")


def test_trials_are_bounded_by_what_the_runner_counts():
  rule = validate.trials(2)
  assert rule.ok(2) and rule.ok(2**31 - 1)
  assert not rule.ok(1) and not rule.ok(2**31) and not rule.ok(3e9) and not rule.ok(1e30)
  assert not rule.ok(True)
  with pytest.raises(validate.ConfigError, match=r'config.a.n: must be an integer in '
                     r'\[2, 2\*\*31 - 1\] \(trials are counted in int32\) \(got 3000000000\)'):
    rule.check('a.n', 3_000_000_000)


def test_an_empty_sweep_is_not_in_range():
  config = ml_collections.ConfigDict({'a': {'deltas': ()}})
  assert not validate.range_rule(0.0, 1.0).ok(())
  with pytest.raises(validate.ConfigError, match=r'config.a.deltas: must be a non-empty '
                     r'sequence, every item in \[0.0, 1.0\] \(got \(\)\)'):
    validate.in_range(config, 'a.deltas', 0.0, 1.0)
