"""`python -m experiments.training_audit`: canaries inside the trainings that run, end to end.

One small run from the command line (one record-level and one client-level defense, few
canaries), read back on a resume; the refusals of each stage. What each function computes is
tested in process (test_training_audit_points.py, _runs.py, _figures.py).
"""

from __future__ import annotations

import json
import math
import os

import pytest

from fl_privacy.pipelines import training_audit as ta
from tests.experiments import cli

# Record level: 10 clients x 4 gradient canaries = 40 a training, 2 trainings a row; client
# level: 100 canary clients a training (half the participants), 2 trainings a row.
SMOKE_FIELDS = ("--config.training_audit.defenses=('dp_sgd', 'central_dp')",
                "--config.training_audit.samplings.dp_sgd=('poisson',)",
                "--config.training_audit.samplings.central_dp=('without_replacement',)",
                "--config.training_audit.record_kinds=('gradient',)",
                '--config.training_audit.record.canaries=80',
                '--config.training_audit.client.canaries=200',
                '--config.training_audit.side_channel_trials=64',
                '--config.training_audit.power_draws=2',
                '--config.training_audit.simulated_draws=2')
CANARIES = {'gradient': 80, 'client': 200, 'side_channel': 64}
WANT = {('dp_sgd', 'poisson', 'gradient', t) for t in ('all_steps', 'all_iterates',
                                                      'last_iterate')}
WANT |= {('central_dp', 'without_replacement', 'client', t) for t in ('all_iterates',
                                                                      'last_iterate')}
WANT |= {(d, x, 'side_channel', 'side_channel') for d, x in (('dp_sgd', 'poisson'),
                                                              ('central_dp',
                                                               'without_replacement'))}


def _read(workdir):
  with open(workdir / 'results.json', encoding='utf-8') as f:
    return json.load(f)


@pytest.fixture(scope='module')
def smoke(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('training_audit') / 'run'
  proc = cli.run('training_audit', workdir, *SMOKE_FIELDS, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir, _read(workdir), proc


def test_smoke_audits_every_expected_point_and_nothing_else(smoke):
  workdir, results, proc = smoke
  points = results['points']
  got = [(p['params']['defense'], p['params']['sampling'], p['params']['canary'],
          p['params']['threat']) for p in points]
  assert set(got) == WANT and len(got) == len(WANT)
  for p in points:
    m, q = p['metrics'], p['params']
    assert q['claimed_epsilon'] == 2.0
    assert m['audited_pipeline'] == ta.AUDITED and m['plant'] == 'none'
    # The claim is the registry's, with its labels.
    assert float(m['dp_epsilon']) == pytest.approx(q['claimed_epsilon'], rel=1e-6)
    record = q['defense'] == 'dp_sgd'
    assert m['dp_unit'] == ('record' if record else 'client')
    assert m['dp_adversary'] == ('server' if record else 'aggregate')
    assert m['dp_relation'] == ('add_remove' if record else 'replace_one')
    # As many canaries (trials) as asked: whole trainings of canaries at the federation's
    # share, both worlds drawn.
    assert m['num_canaries'] == p['n_trials'] == CANARIES[q['canary']] == m['n_in'] + m['n_out']
    assert min(m['n_in'], m['n_out']) > 0.3 * p['n_trials']
    # The verdict and what stands behind it agree.
    assert float(m['privacy_violation']) == 0.0, (q, m)
    assert (m['verdict'] == 'violation') == (float(m['privacy_violation']) == 1.0)
    assert (m['verdict'] == 'cannot refute') == (float(m['can_refute']) == 0.0)
    assert (int(m['canaries_needed']) == 0) == (float(m['can_refute']) == 1.0)
    assert 0.0 <= float(m['best_bound']) <= float(m['max_certifiable'])
    assert float(m['best_bound']) <= float(m['dp_epsilon'])
    counted = m['counted_bounds'].split(',')
    assert counted[0] == 'epsilon_one_run'
    assert ('profile' in counted) == (float(m['canaries_independent']) == 1.0)
    # Independent trials: DP-SGD's canaries read at every step, and the side channel's games
    # (the sampled aggregate couples its canaries).
    assert float(m['canaries_independent']) == float(q['threat'] in ('all_steps',
                                                                      'side_channel')), q
    if q['canary'] != 'side_channel':
      assert m['bounding_canaries'] <= m['num_canaries']
      assert m['replicates'] == 2 and m['twins'] == 2
      assert 0.0 <= m['test_accuracy'] <= 1.0 and 0.0 <= m['twin_accuracy'] <= 1.0
      # Andrew et al.'s fit always; the Poisson fit where the moments determine it.
      assert math.isfinite(float(m['epsilon_gaussian_fit']))
      if m['estimate_method'] == 'gaussian_fit':
        assert m['epsilon_estimate'] == m['epsilon_gaussian_fit']
    else:
      assert m['side_channel_rows'] == (8 * 4 if record else 1)   # B x public steps; N
  estimate = {q: m['estimate_method'] for q, m in (
      (p['params']['threat'], p['metrics']) for p in points
      if p['params']['defense'] == 'dp_sgd' and p['params']['canary'] == 'gradient')}
  assert estimate == {'all_steps': 'subsampled_gaussian_fit (pld)',
                      'all_iterates': 'gaussian_fit', 'last_iterate': 'gaussian_fit'}
  table = (workdir / 'training_audit.md').read_text()
  assert table.count('\n| ') == len(points) + 1
  assert 'audited the pipeline the experiments run' in table
  assert os.path.exists(workdir / 'fig_training_audit.png')
  assert 'PRIVACY VIOLATION' not in proc.stderr


def test_every_row_is_labelled_and_the_simulated_rows_state_their_power(smoke):
  _, results, _ = smoke
  for p in results['points']:
    m, q = p['metrics'], p['params']
    assert m['verdict_assumes'] in ('none', 'gaussian'), q
    assert m['verdict'] in ('violation', 'no violation', 'cannot refute'), q
    if q['threat'] != 'side_channel':
      assert m['certified_free'] <= m['best_bound'], q
    simulated = q['threat'] == 'all_steps' or (q['canary'] == 'client' and
                                               q['threat'] == 'all_iterates')
    assert (m['power_model'] != 'not simulated') == simulated, q
    if simulated:
      assert m['power_draws'] == 2 and m['power_curve'], q
  steps = [p['metrics'] for p in results['points'] if p['params']['threat'] == 'all_steps']
  assert steps and steps[0]['simulated_draws'] == 2


def test_resumed_run_reads_every_point_back(smoke):
  workdir, results, _ = smoke
  table = (workdir / 'training_audit.md').read_text()
  proc = cli.run('training_audit', workdir, *SMOKE_FIELDS, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert f'{len(results["points"])} point(s) already saved' in proc.stderr
  assert 'training_audit:' in proc.stderr
  again = _read(workdir)
  assert [p['params'] for p in again['points']] == [p['params'] for p in results['points']]
  assert [p['metrics'] for p in again['points']] == [p['metrics'] for p in results['points']]
  assert (workdir / 'training_audit.md').read_text() == table


# From the command line, one case per stage that refuses (a config rule, a data and model
# `prepare` check, a `defense` section it does not honour); every rule's message and edges are
# tested in process (test_training_audit_points.py).
@pytest.mark.parametrize('flags,message', [
    (("--config.training_audit.samplings.dp_sgd=('poisson', 'none')",),
     "error: config.training_audit.samplings.dp_sgd: must be a subset of ('poisson', "
     "'shuffle') (got ('poisson', 'none'))"),
    (('--config.training_audit.record.canaries_per_client=300',),
     "error: config.training_audit.record.canaries_per_client: must be at most the model's "),
    (('--config.defense.name=update_dp',),
     "error: config.defense.name: must be one of ('none',) for experiments.training_audit"),
], ids=['config rule', 'prepare check', 'defense section'])
def test_bad_input_exits_2_with_one_line(tmp_path, flags, message):
  proc = cli.run_forked('training_audit', tmp_path / 'never', *flags)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith(message), proc.stderr[-2000:]
  assert not (tmp_path / 'never').exists()


def test_figure_is_readable(smoke, monkeypatch):
  from fl_privacy.pipelines import training_audit_figures  # pylint: disable=g-import-not-at-top
  from tests import figure_checks  # pylint: disable=g-import-not-at-top
  workdir, results, _ = smoke
  with figure_checks.capture(monkeypatch) as found:
    training_audit_figures.claims_figure(results['points'], str(workdir))
  assert found == {'fig_training_audit': []}


def test_an_override_of_a_field_the_run_does_not_read_exits_2(tmp_path):
  proc = cli.run_forked('training_audit', tmp_path / 'never',
                        "--config.training_audit.defenses=('update_dp',)",
                        '--config.training_audit.record.canaries=64')
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and 'config.training_audit.record.canaries' in lines[0]
  assert 'read only for dp_sgd' in lines[0], lines[0]
  assert not (tmp_path / 'never').exists()
