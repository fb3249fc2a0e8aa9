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
