"""Config validation that fails before any heavy work.

Every experiment validates its whole config before it loads data or writes a file.
A violation raises `ConfigError`, whose message names the field, what is allowed
and what was given; the experiment scaffolding turns it into exit status 2.
"""

from __future__ import annotations

import math
from typing import Any, Iterable


class MissingExtraError(ImportError):
  """An optional extra a module needs is not installed; the message names the install command.

  `experiments.common.run` turns it into one line and exit status 2; any other ImportError
  (a real bug) keeps its traceback.
  """


class ConfigError(ValueError):
  """A config field holds a value outside what the code accepts."""

  def __init__(self, field: str, allowed: str, got: Any):
    self.field = field
    self.allowed = allowed
    self.got = got
    super().__init__(f'config.{field}: must be {allowed} (got {got!r})')


def _get(config, field: str):
  node = config
  for part in field.split('.'):
    try:
      node = node[part]
    except (KeyError, TypeError) as e:
      raise ConfigError(field, 'present in the config', 'missing') from e
  return node


def require(ok: bool, field: str, allowed: str, got: Any) -> None:
  """Raises `ConfigError(field, allowed, got)` unless `ok`."""
  if not ok:
    raise ConfigError(field, allowed, got)


def one_of(config, field: str, choices: Iterable[str]) -> str:
  """The value at dotted `field`, which must be one of `choices` (`choice`)."""
  return checked(config, field, choice(choices))


def subset_of(config, field: str, choices: Iterable[str]) -> tuple:
  """A non-empty sequence at `field` whose items are all in `choices` (`subset`)."""
  choices = tuple(choices)
  value = _get(config, field)
  seq = (value,) if isinstance(value, str) else tuple(value)
  require(len(seq) > 0, field, f'a non-empty subset of {choices}', value)
  rule = subset(choices)
  require(rule.ok(seq), field, rule.allowed, value)
  return seq


def positive(config, field: str, *, integer: bool = False):
  """A value (or every value of a sequence) at `field` that is finite and > 0 (`positive_rule`)."""
  value = _get(config, field)
  return positive_rule(integer, sequence=isinstance(value, (list, tuple))).check(field, value)


def in_range(config, field: str, low: float, high: float, *,
             low_inclusive: bool = True, high_inclusive: bool = True):
  """A finite number (or every number of a sequence) at `field` within [low, high].

  Infinite and NaN values never pass, even when `high` is `math.inf`: "[0, inf]" means
  finite >= 0 (an inf weight or decay only ends in NaN scores after the training).
  """
  rule = range_rule(low, high, low_inclusive=low_inclusive, high_inclusive=high_inclusive)
  value = _get(config, field)
  if isinstance(value, (list, tuple)) and not value:
    raise ConfigError(field, f'a non-empty sequence, every item {rule.allowed}', value)
  return rule.check(field, value)


# ----------------------------------------------------------------------------------------------
# Declared rules: one object per allowed set, whose text is the error message's "allowed".


class Rule:
  """A declared rule: `allowed` (the words of the error message) and `ok(value) -> bool`.

  `rule.check(field, value)` raises `ConfigError(field, rule.allowed, value)` unless the value
  is allowed, and returns it. Rules are data, so a defense, a config section or a pipeline
  declares its fields once and every reader validates them the same way.
  """

  def __init__(self, allowed: str, ok):
    self.allowed = allowed
    self._ok = ok

  def ok(self, value) -> bool:
    try:
      return bool(self._ok(value))
    except (TypeError, ValueError):
      return False

  def check(self, field: str, value):
    require(self.ok(value), field, self.allowed, value)
    return value

  def __repr__(self):
    return f'Rule({self.allowed!r})'


def checked(config, field: str, rule: Rule):
  """`config.<field>` after `rule.check` (raises `ConfigError` naming the field); returns it."""
  return rule.check(field, _get(config, field))


def _is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_integer(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False, integer: bool = False, optional: bool = False,
           words: str | None = None) -> Rule:
  """A finite number (an integer when `integer`) in the interval; None too when `optional`.

  Infinite and NaN values never pass, whatever the interval: "[0, inf)" means finite >= 0.
  """
  kind = 'an integer' if integer else 'a finite number'
  if low is not None and high is not None:
    lb, rb = '(' if low_open else '[', ')' if high_open else ']'
    text = f'{kind} in {lb}{low:g}, {high:g}{rb}'
  elif low is not None:
    text = f'{kind} {">" if low_open else ">="} {low:g}'
  elif high is not None:
    text = f'{kind} {"<" if high_open else "<="} {high:g}'
  else:
    text = kind
  if words:
    text = f'{text} ({words})'
  if optional:
    text = f'None or {text}'

  def ok(v):
    if v is None:
      return optional
    if not (_is_integer(v) if integer else _is_number(v)):
      return False
    if low is not None and not (v > low if low_open else v >= low):
      return False
    return high is None or (v < high if high_open else v <= high)
  return Rule(text, ok)


def choice(options, *, optional: bool = False) -> Rule:
  """One of `options` (None too when `optional`)."""
  options = tuple(options)
  text = f'one of {options}' + (' or None' if optional else '')
  return Rule(text, lambda v: (v is None and optional) or (v is not None and v in options))


BOOLEAN = Rule('True or False', lambda v: isinstance(v, bool))


def items(rule: Rule, allowed: str, *, scalar: bool = True, nonempty: bool = True) -> Rule:
  """A sequence (non-empty when `nonempty`) whose every item passes `rule`; a bare item too
  when `scalar`. `allowed` is the whole message text (it names the sequence, not one item).
  """
  def ok(v):
    if isinstance(v, (list, tuple)):
      return (len(v) > 0 or not nonempty) and all(rule.ok(x) for x in v)
    return scalar and not isinstance(v, str) and rule.ok(v)
  return Rule(allowed, ok)


def where(rule: Rule, condition, allowed: str) -> Rule:
  """`rule` and `condition(value)`, with the message text `allowed` (a rule that depends on
  another field, e.g. 'a divisor of num_rounds = 30')."""
  return Rule(allowed, lambda v: rule.ok(v) and condition(v))


def check_all(config, rules: dict[str, Rule]) -> None:
  """`checked` for every (dotted field, rule) of a pipeline's declared table."""
  for field, rule in rules.items():
    checked(config, field, rule)


def subset(choices) -> Rule:
  """A sequence whose every item is one of `choices` (emptiness is the caller's rule)."""
  choices = tuple(choices)
  return Rule(f'a subset of {choices}', lambda v: all(x in choices for x in v))


def positive_rule(integer: bool = False, *, sequence: bool = False) -> Rule:
  """A finite number > 0 (a positive integer when `integer`); with `sequence` a non-empty
  sequence of them (every item)."""
  kind = 'a positive integer' if integer else 'a finite number > 0'

  def one(v):
    ok = _is_number(v) and v > 0
    return ok and (not integer or float(v).is_integer())
  if not sequence:
    return Rule(kind, one)
  return Rule('non-empty, every item ' + kind,
              lambda v: len(v) > 0 and all(one(x) for x in v))


# The most trials (games, runs, draws) one point may ask for: the runner counts them in int32
# (`eval.runner.run_trials`), so a larger count passed validation and failed after the results
# files were opened.
MAX_TRIALS = 2**31 - 1


def trials(low: int = 1) -> Rule:
  """A count of trials: an integer in [low, MAX_TRIALS] (what `eval.runner` can count)."""
  return Rule(f'an integer in [{low}, 2**31 - 1] (trials are counted in int32)',
              lambda v: _is_integer(v) and low <= v <= MAX_TRIALS)


def range_rule(low: float, high: float, *, low_inclusive: bool = True,
               high_inclusive: bool = True) -> Rule:
  """A finite number (or a non-empty sequence of them, every item) in the interval;
  `in_range`'s text. An empty sequence fails: a sweep of no values ran nothing (an empty
  `ami.dp_deltas` ended in an IndexError after the results files were opened)."""
  lb = '[' if low_inclusive else '('
  rb = ']' if high_inclusive else ')'
  if math.isinf(high):
    allowed = f'a finite number {">=" if low_inclusive else ">"} {low:g}'
  else:
    allowed = f'in {lb}{low}, {high}{rb}'

  def one(v):
    ok = _is_number(v) and (v >= low if low_inclusive else v > low)
    return ok and (v <= high if high_inclusive else v < high)
  return Rule(allowed, lambda v: len(v) > 0 and all(one(x) for x in v)
              if isinstance(v, (list, tuple)) else one(v))
