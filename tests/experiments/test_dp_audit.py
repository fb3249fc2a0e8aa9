"""`python -m experiments.dp_audit`: every DP mechanism audited against its own claim."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from tests.experiments import cli

REPO = pathlib.Path(__file__).resolve().parents[2]
SMOKE = 'configs/digits.py:smoke'


def _run(workdir, *overrides, timeout=600):
  cmd = [sys.executable, '-m', 'experiments.dp_audit', f'--config={SMOKE}',
         f'--workdir={workdir}', *overrides]
  env = cli.env(JAX_PLATFORMS='cpu')
  return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                        env=env, check=False)


def _points(workdir):
  with open(os.path.join(workdir, 'results.json'), encoding='utf-8') as f:
    results = json.load(f)
  assert results['experiment'] == 'dp_audit'
  return {(p['params']['mechanism'], p['params']['claimed_epsilon']): p
          for p in results['points']}


@pytest.fixture(scope='module')
def smoke_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('dp_audit') / 'run'
  proc = _run(workdir)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir, proc


def test_smoke_writes_results_table_and_figures(smoke_run):
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import dp_audit  # pylint: disable=g-import-not-at-top
  workdir, proc = smoke_run
  s = digits.get_config('smoke').dp_audit
  points = _points(workdir)
  assert set(points) == {(m, e) for m in dp_audit.MECHANISMS for e in s.epsilons}
  for (mech, eps), p in points.items():
    m = p['metrics']
    assert p['n_trials'] == s.num_trials
    assert m['n_in'] + m['n_out'] == s.num_trials and min(m['n_in'], m['n_out']) > 0
    for key in ('dp_unit', 'dp_relation', 'dp_adversary', 'dp_sampling', 'dp_delta',
                'noise_multiplier', 'gdp_mu', 'tightness') + dp_audit.BOUNDS:
      assert key in m, (mech, key)
    assert m['dp_delta'] == s.delta
    # The calibration spends at most the claim.
    assert float(m['dp_epsilon']) <= eps * (1 + 1e-6), (mech, m['dp_epsilon'])
    if mech == 'ldp_sgd':
      assert m['ldp_epsilon_per_report'] == eps / s.ldp_reports
    else:
      assert float(m['noise_multiplier']) > 0
      assert float(m['dp_epsilon_pld']) <= float(m['dp_epsilon']) * (1 + 1e-6)
  # The declarations, as `fl_privacy.accounting` states them.
  relation = {m: points[(m, s.epsilons[0])]['metrics']['dp_relation']
              for m in dp_audit.MECHANISMS}
  assert relation == {'dp_sgd_poisson': 'add_remove', 'dp_sgd_shuffle': 'replace_one',
                      'update_dp': 'replace_one', 'central_dp': 'replace_one',
                      'weak_dp': 'replace_one', 'gaussian': 'replace_one',
                      'ldp_sgd': 'replace_one'}
  assert points[('weak_dp', s.epsilons[0])]['metrics']['dp_compositions'] == 1
  assert points[('central_dp', s.epsilons[0])]['metrics']['dp_compositions'] == s.rounds
  for name in ('results.csv', 'fig_dp_audit_claims.png', 'fig_dp_audit_profile.png'):
    assert (workdir / name).stat().st_size > 0, name
  assert any(l.startswith('DP audit: claimed epsilon') for l in proc.stdout.splitlines())
  assert sum(l.startswith('update_dp') for l in proc.stdout.splitlines()) == len(s.epsilons)


def test_honest_mechanisms_stay_below_their_claims(smoke_run):
  from fl_privacy.attacks.audit import dp_canary  # pylint: disable=g-import-not-at-top
  workdir, proc = smoke_run
  assert 'PRIVACY VIOLATION' not in proc.stderr
  for (mech, eps), p in _points(workdir).items():
    m = p['metrics']
    assert m['privacy_violation'] == 0.0, (mech, eps)
    # The verdict's bounds (each counted bound at 1 - 0.05 / k, family-wise 95%); a bound at
    # 95% on its own may exceed the claim (update_dp at claim 1: epsilon_one_run_fdp 1.15
    # in the smoke run), which is why the verdict does not read them.
    assert m['verdict_rule'] == 'bonferroni_counted' and m['verdict_confidence'] == 0.95
    counted = dp_canary.counted_bounds(mech)
    # The non-Gaussian mechanisms are also tested against the claim's whole profile.
    profile = ('profile',) if mech in dp_canary.NON_GAUSSIAN else ()
    assert m['counted_bounds'] == ','.join(counted + profile)
    assert (m.get('profile_violation') == 0.0) if profile else ('profile_violation' not in m)
    for key in counted:
      assert 0.0 <= float(m[f'verdict_{key}']) <= eps, (mech, eps, key, m[f'verdict_{key}'])
      assert float(m[key]) >= 0.0
    assert m['best_bound'] == max(float(m[f'verdict_{k}']) for k in counted)
    assert m['one_run_delta_term'] == pytest.approx(2 * (m['n_in'] // 2 + m['n_in'] % 2 +
                                                         m['n_out'] // 2 + m['n_out'] % 2)
                                                    * m['audit_delta'])
    assert 0.0 <= m['tightness'] <= 1.0
  # The Gaussian mechanism at its own sensitivity: the GDP bound approaches the claim
  # even at smoke size (4,000 games).
  gauss = _points(workdir)[('gaussian', 4.0)]['metrics']
  assert 0.5 * 4.0 < float(gauss['epsilon_gdp']) <= 4.0


def test_resume_does_not_recompute(smoke_run):
  workdir, _ = smoke_run
  before = _points(workdir)
  proc = _run(workdir)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert _points(workdir) == before  # elapsed_s included: nothing was recomputed
  assert proc.stderr.count('skipping mechanism=') == len(before)


def test_figures_read_on_their_own(smoke_run, monkeypatch):
  from fl_privacy.pipelines import dp_audit_figures  # pylint: disable=g-import-not-at-top
  from tests import figure_checks  # pylint: disable=g-import-not-at-top
  workdir, _ = smoke_run
  with open(workdir / 'results.json', encoding='utf-8') as f:
    stored = json.load(f)['points']
  with figure_checks.capture(monkeypatch) as found:
    dp_audit_figures.draw_figures(stored, str(workdir))
  assert set(found) == {'fig_dp_audit_claims', 'fig_dp_audit_profile'}
  assert found == {'fig_dp_audit_claims': [], 'fig_dp_audit_profile': []}


def test_profile_stays_below_the_accountant(smoke_run):
  from fl_privacy import accounting  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import dp_audit_figures  # pylint: disable=g-import-not-at-top
  workdir, _ = smoke_run
  (p,) = [p for p in _points(workdir).values() if 'profile_epsilons' in p['metrics']]
  m = p['metrics']
  decl = dp_audit_figures.declaration_from_metrics(p['params']['mechanism'],
                                                   p['params']['claimed_epsilon'], m)
  assert accounting.epsilon(decl, m['noise_multiplier'], delta=m['dp_delta']) == \
      pytest.approx(m['dp_epsilon'])
  for e, low in zip(m['profile_epsilons'], m['profile_delta_lower']):
    assert 0.0 <= low <= accounting.delta_for(decl, m['noise_multiplier'], epsilon_=e)
  assert m['profile_delta_lower'][0] > 0  # the canary is seen at all


@pytest.mark.parametrize('mechanism,claim', [
    ('update_dp', 2.0), ('dp_sgd_shuffle', 2.0), ('central_dp', 2.0), ('weak_dp', 2.0),
    ('gaussian', 2.0), ('ldp_sgd', 2.0), ('dp_sgd_poisson', 4.0)])
def test_halved_noise_is_flagged_and_honest_noise_is_not(mechanism, claim):
  # A planted bug: the mechanism runs with half its calibrated noise (LDP-SGD at twice its
  # epsilon) while claiming the calibrated epsilon. Same games, same keys, one compilation.
  import jax  # pylint: disable=g-import-not-at-top
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import dp_audit  # pylint: disable=g-import-not-at-top
  config = digits.get_config('smoke')
  config.dp_audit.profile_mechanism = 'dp_sgd_poisson'
  params = {'mechanism': mechanism, 'claimed_epsilon': claim}
  fns = {}
  found = {}
  for factor in (1.0, 0.5):
    config.dp_audit.noise_scale_factor = factor
    found[factor], n = dp_audit.audit_point(config, params, jax.random.key(7), fns)
    assert n == config.dp_audit.num_trials
  assert found[1.0]['privacy_violation'] == 0.0, found[1.0]['best_bound']
  assert found[0.5]['privacy_violation'] == 1.0, found[0.5]['best_bound']
  assert found[0.5]['noise_scale_factor'] == 0.5
  # The claim (and the calibration behind it) does not move with the planted bug.
  assert found[0.5]['dp_epsilon'] == found[1.0]['dp_epsilon']


@pytest.mark.parametrize('override,field', [
    ('--config.dp_audit.epsilons=(0.0,1.0)', 'dp_audit.epsilons'),
    ('--config.dp_audit.delta=1.0', 'dp_audit.delta'),
    ("--config.dp_audit.mechanisms=('update_dp','laplace')", 'dp_audit.mechanisms'),
])
def test_bad_config_exits_2_and_writes_nothing(tmp_path, override, field):
  workdir = tmp_path / 'never'
  proc = cli.run_forked('dp_audit', workdir, override, JAX_PLATFORMS='cpu')
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert f'config.{field}' in proc.stderr
  assert 'Traceback' not in proc.stderr
  assert not workdir.exists()


@pytest.mark.parametrize('field,value', [
    ('mechanisms', ('gauss',)),
    ('mechanisms', ()),
    ('epsilons', (1.0, -2.0)),
    ('epsilons', (float('inf'),)),
    ('epsilons', (1000.0,)),
    ('delta', 0.0),
    ('delta', 1.5),
    ('confidence', 0.0),
    ('confidence', 1.0),
    ('confidence', 0.4),
    ('num_trials', 0),
    ('dimension', 1),
    ('clip_norm', 0.0),
    ('canary_norm', 0.5),
    ('batch_size', 0),
    ('batch_size', 100),
    ('epochs', 0),
    ('rounds', 0),
    ('num_clients', 0),
    ('ldp_reports', 0),
    ('noise_scale_factor', 0.0),
    ('profile_mechanism', 'laplace'),
])
def test_validation_names_the_field(field, value):
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import dp_audit  # pylint: disable=g-import-not-at-top
  from fl_privacy.validate import ConfigError  # pylint: disable=g-import-not-at-top
  config = digits.get_config('smoke')
  config.dp_audit[field] = value
  with pytest.raises(ConfigError) as err:
    dp_audit.prepare(config)
  assert err.value.field == f'dp_audit.{field}'


def test_config_lists_the_pipeline_mechanisms():
  from configs import _dp_audit  # pylint: disable=g-import-not-at-top
  from experiments import common  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import dp_audit  # pylint: disable=g-import-not-at-top
  assert _dp_audit.MECHANISMS == dp_audit.MECHANISMS
  assert common.SECTIONS['dp_audit'] == 'dp_audit'


def test_poisson_llr_is_the_gaussian_llr_without_subsampling():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fl_privacy.attacks.audit import dp_canary  # pylint: disable=g-import-not-at-top
  x = np.array([[-1.0, 0.5, 2.0]], np.float32)
  shift, sigma = 1.0, 1.5
  gauss = np.sum((x * shift - shift**2 / 2) / sigma**2, axis=-1)
  # q -> 1: log(1 - q + q e^a) -> a.
  got = dp_canary.poisson_llr(jnp.asarray(x), 1.0 - 1e-7, shift, jnp.float32(sigma))
  np.testing.assert_allclose(np.asarray(got), gauss, rtol=1e-4, atol=1e-4)
  # Small q: the mixture LLR is monotone in each step's value.
  lo = dp_canary.poisson_llr(jnp.asarray(x), 0.1, shift, jnp.float32(sigma))
  hi = dp_canary.poisson_llr(jnp.asarray(x + 0.1), 0.1, shift, jnp.float32(sigma))
  assert float(hi[0]) > float(lo[0])
  assert math.isfinite(float(lo[0]))


@pytest.mark.parametrize('mechanism', ['dp_sgd_poisson', 'dp_sgd_shuffle', 'update_dp',
                                       'central_dp', 'weak_dp', 'gaussian', 'ldp_sgd'])
def test_declarations_come_from_the_defense_registry(mechanism, monkeypatch):
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy import accounting  # pylint: disable=g-import-not-at-top
  from fl_privacy.defenses import registry  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import dp_audit  # pylint: disable=g-import-not-at-top
  config = digits.get_config()
  s = config.dp_audit
  # What the game instantiates, stated with the accounting constructors (the values the
  # pipeline's own copy gave before it read the registry).
  steps = s.epochs * (s.num_examples // s.batch_size)
  want = {
      'dp_sgd_poisson': accounting.dp_sgd(batch_size=s.batch_size, num_examples=s.num_examples,
                                          steps=steps, epochs=s.epochs, sampling='poisson'),
      'dp_sgd_shuffle': accounting.dp_sgd(batch_size=s.batch_size, num_examples=s.num_examples,
                                          steps=steps, epochs=s.epochs, sampling='shuffle'),
      'update_dp': accounting.update_dp(rounds=s.rounds),
      'central_dp': accounting.server_dp('central_dp', rounds=s.rounds,
                                         num_clients=s.num_clients),
      'weak_dp': accounting.server_dp('weak_dp', rounds=s.rounds, num_clients=s.num_clients,
                                      per_round=True),
      'gaussian': accounting.gaussian_input(),
      'ldp_sgd': accounting.ldp_sgd(epsilon_per_report=2.0 / s.ldp_reports,
                                    rounds=s.ldp_reports)}[mechanism]
  calls = []
  real = registry.declaration
  monkeypatch.setattr(registry, 'declaration',
                      lambda *a: calls.append(a) or real(*a))
  assert dp_audit.declaration(config, mechanism, 2.0) == want
  (name, params, setting), = calls
  assert name == dp_audit.DEFENSE[mechanism][0]
  assert isinstance(setting, registry.Setting)
  if name == 'dp_sgd':
    # One training: the registry composes epochs x rounds, so rounds must be 1.
    assert setting.rounds == 1 and setting.epochs == s.epochs
    assert params['sampling'] == mechanism.rsplit('_', 1)[1]


def test_dp_sgd_shuffle_composes_epochs_not_epochs_times_rounds():
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import dp_audit  # pylint: disable=g-import-not-at-top
  config = digits.get_config('smoke')
  config.dp_audit.epochs, config.dp_audit.rounds = 3, 5
  assert dp_audit.declaration(config, 'dp_sgd_shuffle', 1.0).compositions == 3
  assert dp_audit.declaration(config, 'update_dp', 1.0).compositions == 5


def test_figures_module_does_not_import_the_pipeline():
  import ast  # pylint: disable=g-import-not-at-top
  tree = ast.parse((REPO / 'fl_privacy/pipelines/dp_audit_figures.py').read_text())
  imported = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      imported |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
      imported |= {f'{node.module}.{a.name}' for a in node.names}
  assert 'fl_privacy.pipelines.dp_audit' not in imported, imported
  assert imported  # the walk saw the module's imports


def test_too_few_games_for_the_split_name_num_trials():
  import jax  # pylint: disable=g-import-not-at-top
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import dp_audit  # pylint: disable=g-import-not-at-top
  from fl_privacy.validate import ConfigError  # pylint: disable=g-import-not-at-top
  config = digits.get_config('smoke')
  config.dp_audit.num_trials = 3   # at most one game in one of the worlds
  with pytest.raises(ConfigError) as err:
    dp_audit.audit_point(config, {'mechanism': 'gaussian', 'claimed_epsilon': 1.0},
                         jax.random.key(0), {})
  assert err.value.field == 'dp_audit.num_trials'
