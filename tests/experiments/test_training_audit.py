"""`python -m experiments.training_audit`: canaries inside the trainings that run."""

from __future__ import annotations

import math
import os

import pytest

from configs import digits
from fl_privacy.pipelines import training_audit as ta
from tests.experiments import cli

SMOKE_FIELDS = ("--config.training_audit.defenses=('dp_sgd', 'central_dp')",
                "--config.training_audit.samplings=('poisson', 'without_replacement')",
                "--config.training_audit.record_kinds=('gradient',)")


@pytest.fixture(scope='module')
def smoke(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('training_audit') / 'run'
  proc = cli.run('training_audit', workdir, *SMOKE_FIELDS, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  import json  # pylint: disable=g-import-not-at-top
  with open(workdir / 'results.json', encoding='utf-8') as f:
    return workdir, json.load(f), proc


def test_smoke_audits_every_training_under_both_threats(smoke):
  workdir, results, proc = smoke
  s = digits.get_config('smoke').training_audit
  got = {(p['params']['defense'], p['params']['sampling'], p['params']['canary'],
          p['params']['threat']) for p in results['points']}
  want = {(d, x, k, t) for d, x, k in (
      ('dp_sgd', 'poisson', 'gradient'),
      ('central_dp', 'without_replacement', 'client')) for t in s.threats}
  assert got == want
  for p in results['points']:
    m, q = p['metrics'], p['params']
    assert m['audited_pipeline'] == ta.AUDITED and m['plant'] == 'none'
    per = s.num_canary_clients if q['canary'] == 'client' else s.num_canary_examples
    assert m['num_canaries'] == per == p['n_trials'] == m['n_in'] + m['n_out']
    assert min(m['n_in'], m['n_out']) > 0.3 * per
    assert float(m['privacy_violation']) == 0.0, (q, m)
    # The claim is the registry's, with its labels.
    assert float(m['dp_epsilon']) == pytest.approx(q['claimed_epsilon'], rel=1e-6)
    assert m['dp_unit'] == ('record' if q['defense'] == 'dp_sgd' else 'client')
    assert m['dp_adversary'] == {'central_dp': 'aggregate'}.get(q['defense'], 'server')
    assert 0.0 <= float(m['best_bound']) <= float(m['dp_epsilon'])
    assert math.isfinite(float(m['epsilon_estimate']))
    counted = m['counted_bounds'].split(',')
    assert counted[0] == 'epsilon_one_run'
    assert ('profile' in counted) == (float(m['canaries_independent']) == 1.0)
  table = (workdir / 'training_audit.md').read_text()
  assert table.count('\n| ') == len(results['points']) + 1
  assert 'audited the pipeline the experiments run' in table
  assert os.path.exists(workdir / 'fig_training_audit.png')
  assert 'PRIVACY VIOLATION' not in proc.stderr


def test_independence_is_claimed_only_where_each_score_has_its_own_noise(smoke):
  _, results, _ = smoke
  for p in results['points']:
    q, m = p['params'], p['metrics']
    own = q['canary'] == 'client' and q['threat'] == 'all_iterates'
    assert float(m['canaries_independent']) == float(own), q


def test_resumed_run_reads_every_point_back(smoke, tmp_path):
  workdir, results, _ = smoke
  proc = cli.run('training_audit', workdir, *SMOKE_FIELDS, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert f'{len(results["points"])} point(s) already saved' in proc.stderr
  del tmp_path


# From the command line, one case per stage that refuses (the config's rules, the data and
# model `prepare` checks, a `defense` section it does not honour); every rule's message and
# edges are tested in process (test_training_audit_points.py).
@pytest.mark.parametrize('flags,needle', [
    (("--config.training_audit.samplings=('poisson',)",
      "--config.training_audit.defenses=('dp_sgd', 'update_dp')"),
     "config.training_audit.samplings: must be one a chosen defense offers for each"),
    (('--config.training_audit.num_canary_clients=100000',),
     "config.training_audit.num_canary_clients: must be at most the model's"),
    (('--config.defense.name=update_dp',), 'config.defense.name: must be'),
])
def test_bad_input_exits_2_with_one_line(tmp_path, flags, needle):
  proc = cli.run_forked('training_audit', tmp_path / 'never', *flags)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and needle in lines[0], proc.stderr[-2000:]
  assert not (tmp_path / 'never').exists()


def test_figure_is_readable(smoke, monkeypatch):
  from fl_privacy.pipelines import training_audit_figures  # pylint: disable=g-import-not-at-top
  from tests import figure_checks  # pylint: disable=g-import-not-at-top
  workdir, results, _ = smoke
  with figure_checks.capture(monkeypatch) as found:
    training_audit_figures.claims_figure(results['points'], str(workdir))
  assert found == {'fig_training_audit': []}
