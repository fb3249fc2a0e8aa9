"""End to end: `python -m experiments.fedmia` on the digits smoke config; bad input."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from tests.experiments import cli

PARAMS = {'attack', 'defense', 'defense_param', 'beta', 'num_clients', 'local_epochs', 'model',
          'nonmember_scoring'}


def _run(workdir, *overrides):
  return cli.run('fedmia', workdir, *overrides, timeout=600)


@pytest.fixture(scope='module')
def smoke(tmp_path_factory):
  return cli.smoke_results(tmp_path_factory, 'fedmia', 'fedmia', timeout=600)


def test_results_schema_and_files(smoke):
  workdir, results = smoke
  assert results['experiment'] == 'fedmia'
  points = results['points']
  s = results['config']['fedmia']
  main = [p for p in points if p['params']['defense'] == 'none' and
          p['params']['beta'] == 'inf']
  # Every (attack, scoring) of the main setting but RMIA and online LiRA under public_code
  # (aligned only).
  assert {(p['params']['attack'], p['params']['nonmember_scoring']) for p in main} == {
      (a, sc) for a in s['attacks'] for sc in s['nonmember_scoring']} - {
          ('rmia', 'public_code'), ('lira_online', 'public_code'),
          ('lira_online_fixed', 'public_code')}
  assert {'lira_offline', 'lira_offline_fixed', 'lira_online', 'lira_online_fixed',
          'rmia'} <= set(s['attacks'])
  # Only the main training scores online LiRA, so only it records IN models.
  for path in (workdir / 'recorded').glob('*.npz'):
    with np.load(path) as f:
      main = 'beta-inf_defense-none' in path.name
      assert ('loss_in' in f.files) == main, path.name
      if main:
        assert f['loss_in'].shape == (3, s['lira_in_models'], f['loss'].shape[2])
  defended = {(p['params']['defense'], p['params']['defense_param']) for p in points}
  for name, values in s['defenses'].items():
    for v in values:
      assert (name, v) in defended
  for p in points:
    assert set(p['params']) == PARAMS
    m = p['metrics']
    for name in ('auc', 'tpr_at_fpr_1e-2', 'tpr_at_fpr_1e-3', 'test_accuracy'):
      assert float(m[f'{name}_ci_low']) <= float(m[name]) <= float(m[f'{name}_ci_high'])
    assert m['n_pos'] + m['n_neg'] == p['n_trials']
    assert m['test_error'] == pytest.approx(1 - m['test_accuracy'])
    for name in ('log_auc', 'filter_removed_fraction', 'dp_epsilon'):
      assert name in m
    # Honest low-FPR statistics on every point: distinct queries behind the threshold (summed
    # over the replicates' trainings), and intervals over the replicated trainings.
    assert 0 < m['n_neg_distinct'] <= m['n_neg']
    assert m['replicates'] == s['replicates'] == 2 and m['interval_method'] == 't'
    for name in ('auc', 'tpr_at_fpr_1e-2', 'tpr_at_fpr_1e-3'):
      assert len(m[f'{name}_replicates']) == 2
      assert float(m[name]) == pytest.approx(np.mean(m[f'{name}_replicates']))
      assert len(m['conditional']) == 2 and name in m['conditional'][1]
    for name in ('tpr_at_fpr_1e-2', 'tpr_at_fpr_1e-3'):
      assert 0 <= m[f'{name}_distinct_negatives'] <= m['n_neg_distinct']
      # The union of the t-interval and Clopper-Pearson on the pooled counts is reported.
      assert float(m[f'{name}_ci_low']) <= float(m[f'{name}_cp_low'])
      assert float(m[f'{name}_ci_high']) >= float(m[f'{name}_cp_high'])
  for name in ('results.csv', 'table1.md', 'table2.md', 'rounds.json', 'fedmia_roc.png',
               'fedmia_noniid.png', 'fedmia_rounds.png', 'fedmia_clients_epochs.png',
               'fedmia_defenses.png'):
    assert (workdir / name).exists(), name
  assert len(list((workdir / 'recorded').glob('*.npz'))) == s['replicates'] * (
      1 + len(s['betas']) - 1 + sum(len(v) for v in s['defenses'].values()))
  table = (workdir / 'table1.md').read_text()
  assert '| Attack | TPR@0.1% FPR (aligned)' in table and "paper's ordering" in table
  for row in ('| FedMIA-II (leave-one-out filter) |', '| LiRA (offline) |',
              '| LiRA (offline, fixed variance) |', '| LiRA (online) |',
              '| LiRA (online, fixed variance) |', '| RMIA (offline) |'):
    assert row in table, row
  assert 'public code minus aligned, TPR@0.1% (points)' in table and 'distinct negatives' in table
  assert 'inflation' not in table.lower()
  table2 = (workdir / 'table2.md').read_text()
  assert 'Hypervolume' in table2
  # Each defense against the undefended run of the same replicates, paired.
  assert '### AUC minus the undefended run (paired over the replicates, t 95%)' in table2
  assert '| update_noise | 0.1 | ' in table2.split('AUC minus the undefended run')[1]
  # The paired claims are over the replicated trainings, and say which interval they report.
  rows = next(iter(json.loads((workdir / 'claims.json').read_text()).values()))
  assert rows and all(r['num_trainings'] == 2 and r['interval_method'] == 't' for r in rows)
  assert all(len(r['auc_diff_replicates']) == 2 for r in rows)
  assert "Student's t over the per-replicate values" in table


def test_resume_neither_retrains_nor_rescores(smoke):
  workdir, results = smoke
  artifacts = {p: p.stat().st_mtime_ns for p in (workdir / 'recorded').glob('*.npz')}
  proc = _run(workdir)
  assert proc.returncode == 0, proc.stderr[-2000:]
  again = json.loads((workdir / 'results.json').read_text())
  assert [p['metrics'] for p in again['points']] == [p['metrics'] for p in results['points']]
  assert {p: p.stat().st_mtime_ns for p in (workdir / 'recorded').glob('*.npz')} == artifacts


def test_replicates_are_independent_trainings_stored_on_their_own(smoke):
  workdir, results = smoke
  by_replicate = {}
  for path in (workdir / 'recorded').glob('*defense-none*.npz'):
    if 'beta-inf' in path.name:
      with np.load(path) as f:
        by_replicate[path.name] = (f['loss'].copy(), f['owner'].copy())
  assert len(by_replicate) == 2, sorted(by_replicate)
  (loss_a, owner_a), (loss_b, owner_b) = by_replicate.values()
  # Replicate keys fold_in(run key, r): other shards and other trainings.
  assert not np.array_equal(owner_a, owner_b) and not np.allclose(loss_a, loss_b)
  # Per-replicate values differ, so the t-interval has a width.
  main = next(p['metrics'] for p in results['points'] if p['params']['attack'] == 'fedmia_ii'
              and p['params']['defense'] == 'none' and p['params']['beta'] == 'inf'
              and p['params']['nonmember_scoring'] == 'aligned')
  assert main['auc_replicates'][0] != main['auc_replicates'][1]
  assert float(main['auc_ci_low']) < float(main['auc']) < float(main['auc_ci_high'])


@pytest.mark.parametrize('override,field', [
    ('--config.fedmia.record_every=2', 'fedmia.record_every'),
    ('--config.fedmia.defenses.update_noise=(-0.1,)', 'fedmia.defenses.update_noise'),
    ('--config.fedmia.num_clients=2', 'fedmia.num_clients'),
    ('--config.fedmia.lira_in_models=0', 'fedmia.lira_in_models'),
    ('--config.fedmia.lira_in_models=1.5', 'fedmia.lira_in_models'),
    ('--config.fedmia.lira_in_models=x', 'fedmia.lira_in_models'),
    ('--config.fedmia.lira_in_models=1', 'fedmia.lira_in_models'),  # IN variances need 2
])
def test_bad_input_exits_2_naming_the_field(tmp_path, override, field):
  workdir = tmp_path / 'never'
  proc = cli.run_forked('fedmia', workdir, override)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert f'config.{field}' in proc.stderr
  assert not os.path.exists(workdir)


def test_figures_read_on_their_own(smoke, monkeypatch):
  import ml_collections  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import fedmia_figures  # pylint: disable=g-import-not-at-top
  from tests import figure_checks  # pylint: disable=g-import-not-at-top
  workdir, results = smoke
  config = ml_collections.ConfigDict(results['config'])
  curves = json.loads((workdir / 'rounds.json').read_text())
  with figure_checks.capture(monkeypatch) as found:  # the ROC needs the recordings: not here
    fedmia_figures.save_all(config, None, results['points'], {}, curves, str(workdir))
  assert set(found) == {'fedmia_noniid', 'fedmia_rounds', 'fedmia_clients_epochs',
                        'fedmia_defenses'}
  assert {k: v for k, v in found.items() if v} == {}


def test_a_stored_recording_without_in_models_is_retrained_for_online_lira(tmp_path,
                                                                           monkeypatch):
  """A cached recording that lacks `margin_in` (or has another number of IN models) is never
  scored by online LiRA, and one without `margin` never by LiRA or RMIA: `recorded` trains
  again; with margins and without online attacks it is read."""
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import fedmia  # pylint: disable=g-import-not-at-top
  from fl_privacy.report import ArtifactStore  # pylint: disable=g-import-not-at-top
  config = digits.get_config('smoke')
  tr = dict(model='mlp', beta=float('inf'), num_clients=4, local_epochs=1, defense='none',
            defense_param=None, sweep='main')
  artifacts = ArtifactStore(tmp_path, fedmia.RECORDED)
  key = jax.random.key(0)  # replicate 0's key is fold_in(key, 0)
  params = dict(fedmia.training_params(tr), replicate=0)
  artifacts.save(params, {'loss': np.zeros((3, 4, 5), np.float32),
                          'margin': np.zeros((3, 4, 5), np.float32)})
  calls = []

  def fake_record(config, state, key, tr, in_models=0):
    calls.append(in_models)
    return {'loss': np.ones((3, 4, 5), np.float32), 'margin': np.ones((3, 4, 5), np.float32),
            'loss_in': np.ones((3, in_models, 5), np.float32),
            'margin_in': np.ones((3, in_models, 5), np.float32)}

  monkeypatch.setattr(fedmia, 'record', fake_record)
  rec = fedmia.recorded(config, {}, key, artifacts, tr)
  assert calls == [4] and rec['margin_in'].shape == (3, 4, 5)
  # Now stored with its IN models: read, not trained.
  assert fedmia.recorded(config, {}, key, artifacts, tr)['margin_in'].shape == (3, 4, 5)
  assert calls == [4]
  config.fedmia.lira_in_models = 6  # another number of IN models: trained again
  fedmia.recorded(config, {}, key, artifacts, tr)
  assert calls == [4, 6]
  # IN losses without IN margins (recorded before margins): trained again.
  artifacts.save(params, {'loss': np.zeros((3, 4, 5), np.float32),
                          'margin': np.zeros((3, 4, 5), np.float32),
                          'loss_in': np.zeros((3, 6, 5), np.float32)})
  fedmia.recorded(config, {}, key, artifacts, tr)
  assert calls == [4, 6, 6]
  config.fedmia.attacks = ('fedmia_ii',)  # no online attack: what is stored with margins is read
  artifacts.save(params, {'loss': np.zeros((3, 4, 5), np.float32),
                          'margin': np.zeros((3, 4, 5), np.float32)})
  assert 'loss_in' not in fedmia.recorded(config, {}, key, artifacts, tr)
  assert calls == [4, 6, 6]
  # A recording without margins (made before LiRA and RMIA read them) is trained again.
  artifacts.save(params, {'loss': np.zeros((3, 4, 5), np.float32)})
  assert 'margin' in fedmia.recorded(config, {}, key, artifacts, tr)
  assert calls == [4, 6, 6, 0]
