"""The rule vocabulary of fl_privacy/validate.py, exactly: texts, boundaries, what each accepts.

Every message a user sees is a rule's `allowed` text, so the texts are pinned here as well as
the accepted sets (from a mutation run of validate.py, whose survivors were untested texts and
boundaries of the rule constructors).
"""

from __future__ import annotations

import math

import ml_collections
import pytest

from fl_privacy import validate as V

INF, NAN = float('inf'), float('nan')


@pytest.mark.parametrize('kwargs,text', [
    ({}, 'a finite number'),
    ({'integer': True}, 'an integer'),
    ({'low': 0}, 'a finite number >= 0'),
    ({'low': 0, 'low_open': True}, 'a finite number > 0'),
    ({'high': 1}, 'a finite number <= 1'),
    ({'high': 1, 'high_open': True}, 'a finite number < 1'),
    ({'low': 0, 'high': 1}, 'a finite number in [0, 1]'),
    ({'low': 0, 'high': 1, 'low_open': True}, 'a finite number in (0, 1]'),
    ({'low': 0, 'high': 1, 'high_open': True}, 'a finite number in [0, 1)'),
    ({'low': 1, 'high': 24, 'integer': True}, 'an integer in [1, 24]'),
    ({'low': 0, 'words': '0 = all', 'integer': True}, 'an integer >= 0 (0 = all)'),
    ({'low': 1, 'optional': True, 'integer': True}, 'None or an integer >= 1'),
])
def test_number_texts(kwargs, text):
  assert V.number(**kwargs).allowed == text


@pytest.mark.parametrize('kwargs,good,bad', [
    ({}, (0, -3.5, 1e300), (INF, -INF, NAN, None, True, '1', (1,))),
    ({'integer': True}, (0, -3, 10**12), (1.0, 2.5, True, None, INF)),
    ({'low': 0}, (0, 0.0, 5), (-1e-12, INF)),
    ({'low': 0, 'low_open': True}, (1e-12, 3), (0, 0.0, -1)),
    ({'high': 1}, (1, -5), (1.0000001,)),
    ({'high': 1, 'high_open': True}, (0.999, -5), (1, 1.0)),
    ({'low': 0, 'high': 1}, (0, 1, 0.5), (-0.1, 1.1)),
    ({'low': 0, 'high': 1, 'low_open': True, 'high_open': True}, (0.5,), (0, 1)),
    ({'low': 1, 'optional': True, 'integer': True}, (None, 1, 7), (0, 1.5)),
])
def test_number_accepts_exactly(kwargs, good, bad):
  rule = V.number(**kwargs)
  assert all(rule.ok(v) for v in good), [v for v in good if not rule.ok(v)]
  assert not any(rule.ok(v) for v in bad), [v for v in bad if rule.ok(v)]


def test_choice():
  assert V.choice(('a', 'b')).allowed == "one of ('a', 'b')"
  assert V.choice(('a', 'b'), optional=True).allowed == "one of ('a', 'b') or None"
  plain, optional = V.choice(('a', 'b')), V.choice(('a', 'b'), optional=True)
  assert plain.ok('a') and not plain.ok(None) and not plain.ok('c')
  assert optional.ok(None) and optional.ok('b') and not optional.ok('c')
  assert V.choice((None, 1)).ok(None) is False  # None counts only when optional


def test_range_rule_texts_and_boundaries():
  assert V.range_rule(0.0, 1.0).allowed == 'in [0.0, 1.0]'
  assert V.range_rule(0.0, 1.0, low_inclusive=False).allowed == 'in (0.0, 1.0]'
  assert V.range_rule(0.0, 1.0, high_inclusive=False).allowed == 'in [0.0, 1.0)'
  assert V.range_rule(0.0, math.inf).allowed == 'a finite number >= 0'
  assert V.range_rule(0.0, math.inf, low_inclusive=False).allowed == 'a finite number > 0'
  closed = V.range_rule(0.0, 1.0)
  assert closed.ok(0.0) and closed.ok(1.0) and not closed.ok(-0.1) and not closed.ok(1.5)
  assert not closed.ok(NAN) and not closed.ok(True)
  half = V.range_rule(0.0, 1.0, low_inclusive=False, high_inclusive=False)
  assert half.ok(0.5) and not half.ok(0.0) and not half.ok(1.0)
  unbounded = V.range_rule(0.0, math.inf)
  assert unbounded.ok(1e300) and not unbounded.ok(INF)
  assert closed.ok((0.0, 1.0)) and not closed.ok((0.5, 2.0))  # every item of a sequence


def test_positive_rule():
  assert V.positive_rule().allowed == 'a finite number > 0'
  assert V.positive_rule(True).allowed == 'a positive integer'
  assert V.positive_rule(sequence=True).allowed == 'non-empty, every item a finite number > 0'
  assert V.positive_rule(True, sequence=True).allowed == 'non-empty, every item a positive integer'
  assert V.positive_rule().ok(0.5) and not V.positive_rule().ok(0) and not V.positive_rule().ok(INF)
  assert V.positive_rule(True).ok(3) and V.positive_rule(True).ok(3.0)  # integral floats count
  assert not V.positive_rule(True).ok(2.5) and not V.positive_rule(True).ok(True)
  seq = V.positive_rule(sequence=True)
  assert seq.ok((1, 2.5)) and not seq.ok(()) and not seq.ok((1, 0))


def test_items_where_subset():
  even = V.items(V.number(0, integer=True), 'naturals')
  assert even.allowed == 'naturals'
  assert even.ok(3) and even.ok((1, 2)) and not even.ok(()) and not even.ok((1, -2))
  assert not even.ok('12')  # a string is not a sequence of items
  assert V.items(V.number(), 'x', nonempty=False).ok(())
  assert not V.items(V.number(), 'x', scalar=False).ok(1.0)
  w = V.where(V.number(1, integer=True), lambda v: v % 5 == 0, 'a multiple of 5')
  assert w.allowed == 'a multiple of 5'
  assert w.ok(10) and not w.ok(7) and not w.ok(-5) and not w.ok(0)
  s = V.subset(('a', 'b'))
  assert s.allowed == "a subset of ('a', 'b')"
  assert s.ok(('a',)) and s.ok(()) and not s.ok(('a', 'c'))


def _config(**fields):
  return ml_collections.ConfigDict({'s': fields})


def test_helpers_raise_with_field_allowed_and_the_value_given():
  config = _config(xs=['a', 'c'], empty=[], one='a', n=0, r=2.0, seq=(1.0, 0.0))
  with pytest.raises(V.ConfigError) as e:
    V.subset_of(config, 's.xs', ('a', 'b'))
  assert (e.value.field, e.value.allowed, e.value.got) == ('s.xs', "a subset of ('a', 'b')",
                                                           ['a', 'c'])
  with pytest.raises(V.ConfigError) as e:
    V.subset_of(config, 's.empty', ('a', 'b'))
  assert (e.value.field, e.value.allowed, e.value.got) == (
      's.empty', "a non-empty subset of ('a', 'b')", [])
  assert V.subset_of(config, 's.one', ('a', 'b')) == ('a',)  # a bare string is one item
  with pytest.raises(V.ConfigError) as e:
    V.positive(config, 's.n', integer=True)
  assert (e.value.allowed, e.value.got) == ('a positive integer', 0)
  with pytest.raises(V.ConfigError) as e:
    V.positive(config, 's.seq')
  assert e.value.allowed == 'non-empty, every item a finite number > 0'
  with pytest.raises(V.ConfigError) as e:
    V.in_range(config, 's.r', 0.0, 2.0, high_inclusive=False)
  assert (e.value.allowed, e.value.got) == ('in [0.0, 2.0)', 2.0)
  assert V.in_range(config, 's.r', 0.0, 2.0) == 2.0
  with pytest.raises(V.ConfigError) as e:
    V.in_range(config, 's.r', 2.0, 3.0, low_inclusive=False)
  assert e.value.allowed == 'in (2.0, 3.0]'


def test_a_missing_field_and_the_message():
  config = _config(a=1)
  with pytest.raises(V.ConfigError) as e:
    V.checked(config, 's.b', V.number())
  assert (e.value.field, e.value.allowed, e.value.got) == ('s.b', 'present in the config',
                                                           'missing')
  assert str(e.value) == "config.s.b: must be present in the config (got 'missing')"
  assert V.checked(config, 's.a', V.number()) == 1


def test_rule_ok_is_false_when_the_check_itself_fails():
  rule = V.Rule('x', lambda v: v > 0)
  assert rule.ok(1) and not rule.ok('a') and not rule.ok(None)
  assert repr(rule) == "Rule('x')"


def test_plain_nested_dicts_are_read_by_dotted_field_and_a_bare_string_is_one_item():
  plain = {'s': {'a': 1, 'name': 'ab'}}
  assert V.checked(plain, 's.a', V.number()) == 1
  assert V.subset_of(plain, 's.name', ('ab', 'cd')) == ('ab',)
  with pytest.raises(V.ConfigError) as e:
    V.checked(plain, 's.z', V.number())
  assert e.value.field == 's.z' and e.value.got == 'missing'
