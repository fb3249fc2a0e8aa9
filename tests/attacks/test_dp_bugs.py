"""The DP-bug catalog (`attacks.audit.bug_*`) and its pipeline (`pipelines.dp_bugs`), at tiny sizes.

Sizes are chosen far from every decision: the flagged bugs' bounds are several times their
claim, the twins' bounds well below it (measured: LocalDpMod's sensitivity bug certifies ~20 at
a claim of 10 with 400 games, its twin ~5; the reused key certifies ~3 at a claim of 1, its
twin 0).
"""

from __future__ import annotations

import math
import ml_collections
import numpy as np
import pytest

from configs import _dp_bugs
from fl_privacy import validate
from fl_privacy.attacks.audit import bug_audit
from fl_privacy.attacks.audit import bug_catalog
from fl_privacy.attacks.audit import bug_entries as be
from fl_privacy.attacks.audit import bug_flower
from fl_privacy.pipelines import dp_bugs
from fl_privacy.pipelines import dp_bugs_tables


def _config(**overrides):
  c = ml_collections.ConfigDict()
  c.dp_bugs = _dp_bugs.section('digits', True)
  for k, v in overrides.items():
    c.dp_bugs[k] = v
  return c


def _audit(entry, variant, n, seed=3):
  game = entry.build(variant, entry.severity)
  present, scores = game.play(seed, n)
  return bug_audit.verdict(present, scores, entry.claim(entry.severity), game.curve,
                           confidence=0.95, event=game.event)


def _entry(name):
  return {e.name: e for e in bug_catalog.catalog()}[name]


def test_config_names_the_catalog():
  assert _dp_bugs.BUGS == bug_catalog.names()
  entries = bug_catalog.catalog()
  assert len([e for e in entries if e.build is not None]) >= 15
  assert {e.threat for e in entries} >= {'out of reach', 'Flower canary audit',
                                         'mechanism audit', 'side channel'}
  for e in entries:
    assert e.source and e.library and e.title, e.name


def test_flower_sensitivity_bug_flagged_twin_not():
  entry = _entry('flower_localdp_sensitivity')
  bug = _audit(entry, 'bug', 400)
  twin = _audit(entry, 'twin', 400)
  assert bug['verdict'] == 'violation' and bug['best_bound'] > 1.5 * 10.0
  assert twin['verdict'] == 'no violation' and twin['best_bound'] < 0.7 * 10.0


def test_flower_fast_path_is_localdpmod_bit_for_bit():
  game = bug_flower.localdp_game(1.0, 0.3, 2.0, checks=4)
  assert game.checks(11) == {'flower_path_max_abs_diff': 0.0, 'flower_path_checked': 4}


def test_reused_key_flagged_twin_not():
  entry = _entry('noise_reused_across_clients')
  bug = _audit(entry, 'bug', 400)
  twin = _audit(entry, 'twin', 400)
  assert bug['verdict'] == 'violation' and bug['certified_cp'] > 2.0
  assert twin['verdict'] == 'no violation' and twin['best_bound'] < 0.5


def _user_build(variant, ratio):
  # A user's own LocalDpMod configuration: noise calibrated to `ratio` x the clip (bug) or
  # to the clip itself (twin), through Flower's functions, at a claim of epsilon 1.
  eps_arg = bug_flower.analytic_epsilon_argument(1.0, 1e-5)
  return bug_flower.localdp_game(1.0, ratio if variant == 'bug' else 1.0, eps_arg)


USER_ENTRY = be.Entry(
    'user_localdp', 'a user-added LocalDpMod with its sensitivity a hundredth of its clip',
    'a test', 'Flower (flwr 1.42)', 'Flower canary audit',
    lambda s: be.Claim(1.0, 1e-5, 'client', 'zero_out', 'the server', 'none', 'the test'),
    _user_build, knob='sensitivity / clip', severity=0.01)


def test_user_entry_audited_like_the_catalogs():
  config = _config(bugs=('floating_point_sampler',), extra=f'{__name__}:USER_ENTRY',
                   trial_scale=0.1)
  entries = dp_bugs.validate_config(config)
  assert list(entries) == ['floating_point_sampler', 'user_localdp']
  rows = {(p['bug'], p['variant']): p for p in dp_bugs.points(config, entries)}
  assert set(rows) == {('floating_point_sampler', 'bug'), ('user_localdp', 'bug'),
                       ('user_localdp', 'twin')}
  import jax  # pylint: disable=g-import-not-at-top
  key = jax.random.key(0)
  m_bug, n = dp_bugs.audit_point(config, USER_ENTRY, rows[('user_localdp', 'bug')], key)
  m_twin, _ = dp_bugs.audit_point(config, USER_ENTRY, rows[('user_localdp', 'twin')], key)
  assert n == dp_bugs.trials(config, USER_ENTRY) == 400
  assert m_bug['verdict'] == 'violation' and m_bug['privacy_violation'] == 1.0
  assert m_twin['verdict'] == 'no violation' and m_twin['privacy_violation'] == 0.0
  assert m_bug['dp_relation'] == 'zero_out' and m_bug['dp_unit'] == 'client'
  out, n = dp_bugs.audit_point(config, entries['floating_point_sampler'],
                               rows[('floating_point_sampler', 'bug')], key)
  assert out['verdict'] == 'out of reach' and n == 0 and math.isnan(out['privacy_violation'])


def test_missing_torch_extra_is_a_row_not_a_drop(monkeypatch):
  real = bug_catalog.importlib.import_module

  def fake(name, *a, **k):
    if name in ('torch', 'opacus'):
      raise ImportError(name)
    return real(name, *a, **k)
  monkeypatch.setattr(bug_catalog.importlib, 'import_module', fake)
  config = _config(bugs=('opacus_571', 'opacus_batchnorm'))
  entries = dp_bugs.validate_config(config)
  params = dp_bugs.points(config, entries)
  assert [(p['bug'], p['variant']) for p in params] == [
      ('opacus_571', 'bug'), ('opacus_571', 'twin'), ('opacus_batchnorm', 'bug'),
      ('opacus_batchnorm', 'twin')]
  for p in params:
    m, n = dp_bugs.audit_point(config, entries[p['bug']], p, None)
    assert n == 0 and m['verdict'] == 'not run: needs the torch extra'


@pytest.mark.parametrize('field, value', [('seeds', 0), ('trial_scale', -1.0),
                                          ('confidence', 0.4), ('bugs', ('nope',)),
                                          ('extra', 'no_such_module:x'),
                                          ('extra', f'{__name__}:_user_build'),
                                          ('extra', 'no_colon')])
def test_bad_fields_are_refused(field, value):
  with pytest.raises(validate.ConfigError, match=f'dp_bugs.{field}'):
    dp_bugs.validate_config(_config(**{field: value}))


def test_bad_extra_exits_2_with_one_line(tmp_path):
  # In a fork of the test process's preloaded interpreter (tests/experiments/cli.py).
  from tests.experiments import cli  # pylint: disable=g-import-not-at-top
  proc = cli.run_forked('dp_bugs', tmp_path / 'run', '--config.dp_bugs.extra=no_such_module:entry')
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and 'dp_bugs.extra' in lines[0], proc.stderr[-2000:]
  assert not (tmp_path / 'run' / 'results.json').exists()


def test_headline_counts_per_seed():
  def pt(bug, variant, seed, verdict):
    return {'params': {'part': 'catalog', 'bug': bug, 'variant': variant, 'seed': seed,
                       'severity': None}, 'metrics': {'verdict': verdict}}
  points = [pt('a', 'bug', 0, 'violation'), pt('a', 'bug', 1, 'no violation'),
            pt('a', 'twin', 0, 'no violation'), pt('a', 'twin', 1, 'violation'),
            pt('b', 'bug', 0, 'violation'), pt('b', 'bug', 1, 'violation'),
            pt('b', 'twin', 0, 'no violation'), pt('b', 'twin', 1, 'no violation'),
            pt('c', 'bug', 0, 'out of reach')]
  h = dp_bugs_tables.headline(points, 2)
  assert h['m'] == 2 and h['n_per_seed'] == [2, 1] and h['f_per_seed'] == [0, 1]
  assert dp_bugs_tables.headline_line(h).startswith(
      'flags 1-2 of 2; false alarms on twins 0-1 of 2')
  assert h['out_of_reach'] == ['c']


def test_gaussian_mu_inverts_the_epsilon():
  for eps in (1.0, 10.0):
    mu = be.gaussian_mu(eps, 1e-5)
    assert math.isclose(be.gaussian_epsilon(mu, 1e-5), eps, rel_tol=1e-6)
  # LocalDpMod's classic formula at a stated 10: 10.39 (the number).
  assert round(be.gaussian_epsilon(1.0 / bug_flower.classic_std(1.0, 10.0, 1e-5), 1e-5),
               2) == 10.39
  np.testing.assert_allclose(
      bug_flower.classic_std(1.0, bug_flower.analytic_epsilon_argument(10.0, 1e-5), 1e-5),
      1.0 / be.gaussian_mu(10.0, 1e-5))
