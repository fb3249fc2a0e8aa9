"""`pipelines.dp_audit`'s config rules at their edges, in process, with the whole message
(written from the survivors of its mutation run; the command-line cases in test_dp_audit.py
run in forks, which mutmut does not see)."""

from __future__ import annotations

import pytest

from configs import digits
from fl_privacy import accounting
from fl_privacy.pipelines import dp_audit
from fl_privacy.validate import ConfigError


def _config(**fields):
  config = digits.get_config('smoke')
  with config.ignore_type():  # a float where an integer belongs reaches the rule
    for k, v in fields.items():
      config.dp_audit[k] = v
  return config


def _message(config):
  with pytest.raises(ConfigError) as err:
    dp_audit.prepare(config)
  return str(err.value)


@pytest.mark.parametrize('field,ok,bad,allowed', [
    ('confidence', 0.50001, 0.5, 'in (0.5, 1.0)'),
    ('confidence', 0.99999, 1.0, 'in (0.5, 1.0)'),
    ('dimension', 2, 1, 'an integer >= 2'),
    ('dimension', 2, 2.5, 'an integer >= 2'),
    ('canary_norm', 1, 0.99, 'a finite number >= 1 (in units of the clip norm)'),
    ('epochs', 1, 1.5, 'an integer >= 1'),
    ('rounds', 1, 0, 'an integer >= 1'),
    ('ldp_reports', 1, 1.5, 'an integer >= 1'),
    ('profile_epsilon', 1e-9, 0.0, 'a finite number > 0'),
    ('profile_mechanism', 'gaussian', 'laplace', f'one of {dp_audit.MECHANISMS}'),
])
def test_rule_edges_with_the_whole_message(field, ok, bad, allowed):
  assert dp_audit.prepare(_config(**{field: ok})) == {
      'mechanisms': tuple(digits.get_config('smoke').dp_audit.mechanisms)}
  assert _message(_config(**{field: bad})) == (
      f'config.dp_audit.{field}: must be {allowed} (got {bad!r})')


def test_poisson_batch_below_the_examples():
  dp_audit.prepare(_config(num_examples=10, batch_size=9))
  assert _message(_config(num_examples=10, batch_size=10)) == (
      'config.dp_audit.batch_size: must be below num_examples (10): Poisson sampling needs '
      'q < 1 (got 10)')


def test_a_defense_section_other_than_none_is_refused():
  config = _config()
  config.defense.name = 'update_dp'
  assert _message(config) == (
      "config.defense.name: must be one of ('none',) for experiments.dp_audit (it audits "
      "every DP mechanism itself (dp_audit.mechanisms)) (got 'update_dp')")


def test_the_runner_options_are_checked():
  config = _config()
  config.game.chunk_size = -3
  assert _message(config) == (
      'config.game.chunk_size: must be None (automatic) or an integer >= 1 (got -3)')


@pytest.mark.parametrize('mechanism', ['update_dp', 'gaussian', 'dp_sgd_poisson'])
def test_calibrate_reports_the_accountants_epsilon_at_the_noise_it_calibrated(mechanism):
  config = _config()
  decl, z, eps = dp_audit.calibrate(config, mechanism, 3.0)
  assert decl == dp_audit.declaration(config, mechanism, 3.0)
  assert z == pytest.approx(accounting.noise_multiplier_for(decl, 3.0, delta=1e-5))
  assert eps == pytest.approx(accounting.epsilon(decl, z, delta=1e-5)) == pytest.approx(
      3.0, rel=1e-3)


# --- The sweep, its violation log and its figures hook (run only in a subprocess elsewhere) ---


def test_points_and_plan_run_every_mechanism_and_claim_in_order(monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  from fl_privacy import report  # pylint: disable=g-import-not-at-top
  config = _config(mechanisms=('update_dp', 'gaussian'), epsilons=(1.0, 4.0))
  want = [dict(mechanism=m, claimed_epsilon=e) for m in ('update_dp', 'gaussian')
          for e in (1.0, 4.0)]
  assert dp_audit.points(config) == want
  with config.ignore_type():
    config.dp_audit.epsilons = 2  # a bare number is one claim
  assert dp_audit.points(config) == [dict(mechanism='update_dp', claimed_epsilon=2.0),
                                     dict(mechanism='gaussian', claimed_epsilon=2.0)]
  with config.ignore_type():
    config.dp_audit.epsilons = (1.0, 4.0)
  calls, logged = [], []
  monkeypatch.setattr(dp_audit, 'audit_point',
                      lambda c, p, k, fns: calls.append((c, p, k, fns)) or ({'m': 1}, 7))
  monkeypatch.setattr(dp_audit, '_report_violation',
                      lambda c, p, m: logged.append((c, p, m)))
  key = jax.random.key(9)
  plan = dp_audit.plan(config, None, None, key)
  assert [p.params for p in plan] == want and {p.unit for p in plan} == {'trials'}
  for p in plan:
    assert p.compute() == ({'m': 1}, 7)
    p.after({'privacy_violation': 1.0})
  for (c, p, k, fns), point in zip(calls, want):
    assert c is config and p == point and fns is calls[0][3]
    assert (jax.random.key_data(k) == jax.random.key_data(report.point_key(key, point))).all()
  assert [(c, p, m) for c, p, m in logged] == [(config, p, {'privacy_violation': 1.0})
                                               for p in want]


def test_a_violation_is_logged_with_its_bounds_and_levels(monkeypatch):
  config = _config(delta=1e-5, confidence=0.95)
  lines = []
  monkeypatch.setattr(dp_audit.logging, 'error', lambda fmt, *a: lines.append(fmt % a))
  params = dict(mechanism='gaussian', claimed_epsilon=2.0)
  bounds = {k: 0.5 + i for i, k in enumerate(dp_audit.BOUNDS)}
  for quiet in ({}, {'privacy_violation': 0.0}):
    dp_audit._report_violation(config, params, quiet)
  assert not lines
  dp_audit._report_violation(config, params, {
      'privacy_violation': 1.0, 'best_bound': 3.25, 'verdict_confidence': 0.95,
      'verdict_bound_confidence': 0.9875, 'verdict_rule': 'bonferroni', **bounds})
  listed = ', '.join(f'{k} {v:.3f}' for k, v in bounds.items())
  assert lines == [
      'PRIVACY VIOLATION: gaussian claims epsilon 2 (delta 1e-05) but the audit certifies '
      'more: lower bound 3.250 at family-wise confidence 95% (the largest counted bound, each '
      f'at 98.75%, rule bonferroni); each bound at 95%: {listed}']
  # A point stored before the family-wise verdict: NaN levels, rule 'none', the bounds it has.
  first = dp_audit.BOUNDS[0]
  dp_audit._report_violation(config, params, {'privacy_violation': 2.0, 'best_bound': 3.0,
                                              first: 3.0})
  assert lines[-1].endswith(
      'at family-wise confidence nan% (the largest counted bound, each at nan%, rule none); '
      f'each bound at 95%: {first} 3.000')


def test_figures_hook_draws_the_stores_points(monkeypatch):
  import types  # pylint: disable=g-import-not-at-top
  seen = []
  monkeypatch.setattr(dp_audit.dp_audit_figures, 'draw_figures',
                      lambda points, workdir, config: seen.append((points, workdir, config)))
  store = types.SimpleNamespace(points=[{'a': 1}], workdir='/w')
  config = _config()
  dp_audit.figures(config, None, store, None)
  assert seen == [([{'a': 1}], '/w', config)]
