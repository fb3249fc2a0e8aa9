"""`python -m experiments.flower_audit` end to end (smoke) and its bad inputs."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from configs import digits
from fl_privacy import validate
from fl_privacy.flower.audits import dp_setting
from fl_privacy.flower.parts import fedmia
from fl_privacy.flower.parts import pipeline
from fl_privacy.flower.parts import tables
from fl_privacy.pipelines import base
from tests import figure_checks
from tests.experiments import cli


@pytest.fixture(scope='module')
def smoke(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('flower_audit') / 'run'
  proc = subprocess.run(
      [sys.executable, '-m', 'experiments.flower_audit', f'--config={cli.SMOKE}',
       f'--workdir={workdir}', '--quiet'],
      cwd=cli.REPO, env=cli.env(FLWR_TELEMETRY_ENABLED='0'), capture_output=True, text=True,
      timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(workdir / 'results.json', encoding='utf-8') as f:
    return workdir, json.load(f)


def _points(results, part):
  return [p for p in results['points'] if p['params']['part'] == part]


def test_smoke_run_writes_the_four_parts_the_tables_and_the_figure(smoke):
  workdir, results = smoke
  assert results['experiment'] == 'flower_audit'
  assert {p['params']['part'] for p in results['points']} == {'fedmia', 'dishonest', 'dp',
                                                              'training'}
  assert (workdir / 'flower_dp_audit.png').is_file()
  tables = (workdir / 'flower_audit.md').read_text()
  assert 'Flower deployment vs native simulation' in tables and 'Not audited' in tables
  assert 'Flower DP over every round of a deployment' in tables


def test_training_part_audits_every_wrapper_over_every_round(smoke):
  _, results = smoke
  points = {p['params']['setting']: p for p in _points(results, 'training')}
  assert {p['params']['wrapper'] for p in points.values()} == set(dp_setting.WRAPPERS)
  for name, p in points.items():
    m, q = p['metrics'], p['params']
    # The smoke deployment: 12 canaries + 10 real nodes (fits a local Deployment Engine here).
    assert q['num_rounds'] == 3 and q['num_canaries'] == 12, name
    assert m['num_nodes'] == 22 and m['game_relation'] == 'zero_out'
    for threat in ('all_iterates', 'last_iterate'):
      assert m[f'{threat}/n_in'] + m[f'{threat}/n_out'] == 12
      assert m[f'{threat}/epsilon_one_run'] <= m['stated_epsilon']
    assert m['privacy_violation'] == 0.0, name
  fixed = points['server_fixed_z1']['metrics']
  assert fixed['stated_epsilon_source'] == 'flwr RdpAccountant (privacy_spent)'
  assert math.isclose(fixed['stated_epsilon'], dp_setting.flower_rdp_epsilon(1.0, 22, 1e-5, 3),
                      rel_tol=1e-9)
  for name in ('server_adaptive_z1', 'client_adaptive_z1'):
    clips = points[name]['metrics']['clips']
    assert len(clips) == 4 and clips[-1] < clips[0] == 0.1  # the clip moved every round


def test_flower_and_native_fedmia_tables_agree_within_their_intervals(smoke):
  _, results = smoke
  fed = _points(results, 'fedmia')
  by = {(p['params']['attack'], p['params']['deployment']): p['metrics'] for p in fed}
  attacks = {a for a, _ in by}
  assert attacks and all((a, d) in by for a in attacks for d in ('flower', 'native'))
  for a in attacks:
    f, n = by[(a, 'flower')], by[(a, 'native')]
    assert n['auc_ci_low'] <= f['auc'] <= n['auc_ci_high'], a
    assert abs(f['auc'] - n['auc']) < 0.01, a  # the same training, up to float rounding
    for m in (f, n):
      # One deployment (the default): its two-way bootstrap, conditional on it, with the
      # single-training intervals kept per replicate.
      assert m['replicates'] == 1 and m['interval_method'] == 'two_way_bootstrap_conditional'
      assert (m['auc_ci_low'], m['auc_ci_high']) == (m['auc_boot_low'], m['auc_boot_high'])
      assert m['auc_replicates'] == [m['auc']] and len(m['conditional']) == 1
  workdir = smoke[0]
  assert len(list((workdir / 'deployments').glob('*.npz'))) == 2  # flower and native, r = 0


def test_dishonest_rates_have_counts_and_intervals(smoke):
  _, results = smoke
  (p,) = _points(results, 'dishonest')
  m = p['metrics']
  assert p['params']['num_components'] == 4
  assert m['n_pos'] == 2 and m['n_neg'] == 2 * 3 + 1 * 4  # 4 nodes, 2 + 1 targets
  for rate in ('tpr', 'fpr'):
    assert m[f'{rate}_ci_low'] <= m[rate] <= m[f'{rate}_ci_high']


def test_misconfigured_local_dp_is_flagged_and_the_others_are_not(smoke):
  _, results = smoke
  dp = {p['params']['setting']: p['metrics'] for p in _points(results, 'dp')}
  assert set(dp) == {'server_fixed_z1', 'client_fixed_z1', 'local_dp_eps1',
                     'local_dp_misconfigured'}
  for name, m in dp.items():
    assert m['privacy_violation'] == (1.0 if name == 'local_dp_misconfigured' else 0.0), name
    assert m['dp_unit'] == 'client' and m['dp_relation'] == 'add_remove'
    assert m['game_relation'] == ('zero_out' if name.startswith('local') else 'add_remove')
    assert m['n_in'] + m['n_out'] == 600
  assert dp['server_fixed_z1']['dp_adversary'] == 'aggregate'
  assert dp['local_dp_eps1']['dp_adversary'] == 'server'
  assert math.isclose(dp['server_fixed_z1']['stated_epsilon'],
                      dp['server_fixed_z1']['dp_epsilon'], rel_tol=1e-9)


def test_dp_figure_is_readable(smoke, monkeypatch, tmp_path):
  _, results = smoke
  with figure_checks.capture(monkeypatch) as found:
    tables.dp_figure(results['points'], str(tmp_path))
  assert found == {pipeline.FIGURE: []}


def test_pipeline_interface_and_wrapper_names_agree():
  from configs import _flower_audit  # pylint: disable=import-outside-toplevel
  assert isinstance(base.load('flower_audit'), base.Pipeline)
  assert _flower_audit.WRAPPERS == dp_setting.WRAPPERS == pipeline.WRAPPERS
  assert _flower_audit.PARTS == pipeline.PARTS
  # The reconstruction part is opt-in: the default run does what it did before it existed.
  assert 'reconstruction' not in digits.get_config().flower_audit.parts


def test_reconstruction_part_needs_data_for_every_node():
  config = _config(**{'parts': ('reconstruction',), 'reconstruction.num_nodes': 10**4})
  with pytest.raises(validate.ConfigError, match=r'flower_audit\.reconstruction\.num_nodes'):
    pipeline.prepare(config)


def _config(**overrides):
  config = digits.get_config('smoke')
  for dotted, value in overrides.items():
    section = config.flower_audit
    *path, field = dotted.split('.')
    for name in path:
      section = section[name]
    section[field] = value
  return config


@pytest.mark.parametrize('overrides, field', [
    ({'num_clients': 2}, 'flower_audit.num_clients'),
    ({'dp.settings.local_dp_eps1.wrapper': 'adaptive'},
     'flower_audit.dp.settings.local_dp_eps1.wrapper'),
    ({'dp.settings.server_fixed_z1.noise_multiplier': 0.0},
     'flower_audit.dp.settings.server_fixed_z1.noise_multiplier'),
    ({'record_every': 3, 'num_rounds': 4}, 'flower_audit.record_every'),
    ({'dp.settings.server_fixed_z1.wrapper': 'server_adaptive'},
     'flower_audit.dp.settings.server_fixed_z1.target_clipped_quantile'),
    ({'parts': ('fedmia', 'nope')}, 'flower_audit.parts'),
    ({'training.num_canaries': 1}, 'flower_audit.training.num_canaries'),
    ({'training.dimension': 100}, 'flower_audit.training.dimension'),
    ({'training.directions': 'gaussian'}, 'flower_audit.training.directions'),
    ({'training.settings.local_dp_eps1.epsilon': None},
     'flower_audit.training.settings.local_dp_eps1.epsilon'),
    ({'reconstruction.num_bins': 4}, 'flower_audit.reconstruction.num_bins'),
    ({'reconstruction.statistic': 'median'}, 'flower_audit.reconstruction.statistic'),
    ({'reconstruction.batch_size': 0}, 'flower_audit.reconstruction.batch_size'),
    ({'replicates': 0}, 'flower_audit.replicates'),
    ({'replicates': 2, 'parts': ('dp',)}, 'flower_audit.replicates'),
])
def test_validate_config_names_the_field(overrides, field):
  with pytest.raises(validate.ConfigError, match=field.replace('.', r'\.')):
    pipeline.validate_config(_config(**overrides))


def test_two_nodes_refused_only_where_fedmia_runs():
  # FedMIA needs two non-target clients; the DP, dishonest and training parts do not.
  assert pipeline.validate_config(_config(num_clients=2, parts=('dp', 'dishonest')))
  with pytest.raises(validate.ConfigError, match='flower_audit.num_clients'):
    pipeline.validate_config(_config(num_clients=1, parts=('dp',)))


def test_deployment_size_refusal_names_every_process_of_a_node(monkeypatch):
  # `engines.sizes` counts a node as its SuperNode, the superexec the SuperNode starts and one
  # ClientApp process: the refusal lists the same three and their NODE_BYTES.
  from fl_privacy.flower.engines import deployment  # pylint: disable=import-outside-toplevel
  from fl_privacy.flower.engines import sizes  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(deployment, 'max_deployment_nodes', lambda: 3)
  config = _config(engine='deployment', num_clients=4, parts=('fedmia',))
  with pytest.raises(validate.ConfigError) as e:
    pipeline.validate_config(config)
  assert 'flower_audit.num_clients' in str(e.value) and 'at most 3 (' in str(e.value)
  assert (f'a SuperNode, its superexec and a ClientApp process, '
          f'~{sizes.NODE_BYTES / 1e9:.1f} GB a node' in str(e.value))
  assert pipeline.validate_config(_config(engine='deployment', num_clients=3,
                                          parts=('fedmia',)))


def test_prepare_refuses_a_dataset_without_a_test_split(monkeypatch):
  # `base.train_test`: the train and test splits, or one line naming data.name.
  from fl_privacy import data as data_lib  # pylint: disable=import-outside-toplevel
  config = _config(parts=('dp',))
  monkeypatch.setattr(data_lib, 'load', lambda section: {'train': 'tr', 'other': 'o'})
  with pytest.raises(validate.ConfigError, match=r'data\.name.*train and test splits'):
    pipeline.prepare(config)
  monkeypatch.setattr(data_lib, 'load', lambda section: {'test': 'te', 'train': 'tr'})
  assert base.train_test(config) == ('tr', 'te')


def test_two_replicates_each_stored_and_reported_over_both(tmp_path, monkeypatch):
  """Unit level (the end-to-end run with replicates=2 took 92 s under load): the native
  deployment of the MLP (the CNN's per-example measurements cost 13-21 s of CPU a training),
  two replicates of the FedMIA part."""
  import jax  # pylint: disable=import-outside-toplevel
  from fl_privacy.eval import replicated  # pylint: disable=import-outside-toplevel
  config = _config(replicates=2, parts=('fedmia',), model='mlp')
  state, key = pipeline.prepare(config), jax.random.key(0)
  seen, keys = [], fedmia._keys  # pylint: disable=protected-access
  monkeypatch.setattr(fedmia, '_keys', lambda k: seen.append(k) or keys(k))
  m, n = fedmia.fedmia_point(config, state, key, 'native', 'fedmia_i', str(tmp_path))
  # Replicate r trains with key fold_in(run key, r).
  assert [jax.random.key_data(k).tolist() for k in seen] == [
      jax.random.key_data(jax.random.fold_in(key, r)).tolist() for r in (0, 1)]
  assert len(list((tmp_path / fedmia.RECORDINGS).glob('*.npz'))) == 2
  assert m['replicates'] == 2 and m['interval_method'] == 't' and len(m['conditional']) == 2
  aucs = m['auc_replicates']
  assert len(aucs) == 2 and aucs[0] != aucs[1]  # independent deployments
  assert (m['auc'], m['auc_ci_low'], m['auc_ci_high']) == pytest.approx(
      replicated.t_interval(aucs, bounds=(0.0, 1.0)))
  assert n == m['n_pos'] + m['n_neg'] == m['num_entries']
  # Resumed from the stored recordings, with no training at all.
  def no_training(*args, **kwargs):
    raise AssertionError('trained again')
  monkeypatch.setattr(fedmia, 'native_training', no_training)
  resumed, _ = fedmia.fedmia_point(config, dict(state, cache={}), key, 'native',
                                   'fedmia_i', str(tmp_path))
  assert resumed['auc_replicates'] == aucs


@pytest.mark.parametrize('override, field', [
    ('--config.flower_audit.num_clients=2', 'flower_audit.num_clients'),
    ('--config.flower_audit.dp.settings.local_dp_eps1.wrapper=adaptive',
     'flower_audit.dp.settings.local_dp_eps1.wrapper'),
    ('--config.flower_audit.reconstruction.num_bins=4', 'flower_audit.reconstruction.num_bins'),
])
def test_bad_input_exits_2_writing_nothing(tmp_path, override, field):
  workdir = tmp_path / 'run'
  proc = cli.run_forked('flower_audit', workdir, override, FLWR_TELEMETRY_ENABLED='0')
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert field in proc.stderr
  assert not workdir.exists()


_WITHOUT_FLWR = """
import runpy, sys
sys.modules['flwr'] = None  # what an uninstalled package looks like to `import flwr`
sys.argv = ['flower_audit', '--config=configs/digits.py:smoke', '--workdir=' + sys.argv[1]]
runpy.run_module('experiments.flower_audit', run_name='__main__')
"""


def test_without_flower_the_experiment_exits_2_naming_the_extra(tmp_path):
  workdir = tmp_path / 'run'
  proc = subprocess.run([sys.executable, '-c', _WITHOUT_FLWR, str(workdir)], cwd=cli.REPO,
                        env=cli.env(FLWR_TELEMETRY_ENABLED='0'), capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1, proc.stderr
  assert "pip install -e '.[flower]'" in lines[0]
  assert not workdir.exists()
