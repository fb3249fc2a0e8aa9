"""End to end: `python -m experiments.pastel` on the digits smoke config; bad input exits 2."""

from __future__ import annotations

import json
import math
import os

import pytest

from tests.experiments import cli


def _run(workdir, *overrides):
  return cli.run('pastel', workdir, *overrides, timeout=900)


@pytest.fixture(scope='module')
def smoke(tmp_path_factory):
  return cli.smoke_results(tmp_path_factory, 'pastel', 'pastel', timeout=900)


def test_results_schema_and_files(smoke):
  workdir, results = smoke
  assert results['experiment'] == 'pastel'
  points = results['points']
  trainings = {(p['params']['defense'], p['params']['strength'],
                p['params']['representation']) for p in points}
  # Both readings of PASTEL are trained and each point says which.
  assert trainings == {('none', 0.0, '-'), ('pastel', 1.0, 'activation'),
                       ('pastel', 1.0, 'gradient'), ('cdp', 4.0, '-')}
  assert len(points) == 4 * 2 * 2  # trainings x attacks x targets
  for p in points:
    assert set(p['params']) == {'defense', 'strength', 'optimizer', 'representation', 'attack',
                                'target'}
    # The DP declaration's labels are strings; every other metric is a number (NaN is
    # stored as the string 'nan').
    labels = {k: v for k, v in p['metrics'].items()
              if k in ('dp_unit', 'dp_relation', 'dp_adversary', 'dp_sampling')}
    words = {k: v for k, v in p['metrics'].items()
             if k == 'interval_method' or k.endswith(('_interval', '_verdict'))}
    lists = {k: v for k, v in p['metrics'].items() if isinstance(v, list)}
    m = {k: float(v) for k, v in p['metrics'].items()
         if k not in labels and k not in words and k not in lists}
    for name in ('attack_auc', 'accuracy', 'tpr_at_fpr_1e-2', 'tpr_at_fpr_1e-3'):
      assert m[f'{name}_ci_low'] <= m[name] <= m[f'{name}_ci_high'], name
    # One replicate (smoke): the two-way bootstrap of that training, conditional on it, is
    # the reported interval; the pooled single-sample numbers sit beside it.
    assert words['interval_method'] == 'two_way_bootstrap_conditional' and m['replicates'] == 1
    assert (m['attack_auc_ci_low'], m['attack_auc_ci_high']) == (m['attack_auc_boot_low'],
                                                                 m['attack_auc_boot_high'])
    assert lists['attack_auc_replicates'] == pytest.approx([m['attack_auc']])
    assert m['attack_auc'] == pytest.approx(m['pooled_attack_auc'])  # one replicate
    assert m['pooled_attack_auc_ci_low'] <= m['pooled_attack_auc'] <= m[
        'pooled_attack_auc_ci_high']
    assert len(lists['conditional']) == 1
    assert lists['conditional'][0]['attack_auc_ci_low'] == pytest.approx(
        m['pooled_attack_auc_ci_low'])
    assert m['n_pos'] == m['n_neg'] > 50
    assert 0 <= m['jsd_last_round'] <= math.log(2)
    # Every defended training states its paired AUC change against `none` on the same rows.
    if p['params']['defense'] == 'none':
      assert 'attack_auc_minus_none' not in m
    else:
      for name in ('attack_auc_minus_none', 'tpr_at_fpr_1e-3_minus_none',
                   'pooled_attack_auc_minus_none'):
        assert m[f'{name}_ci_low'] <= m[name] <= m[f'{name}_ci_high'], name
      assert lists['attack_auc_minus_none_replicates'] == pytest.approx(
          [m['attack_auc_minus_none']])
      assert words['attack_auc_minus_none_verdict'] in (
          'A better (interval above 0)', 'B better (interval below 0)',
          'no difference shown (interval holds 0)')
    if p['params']['defense'] == 'cdp':
      # DP-FedAvg: client level, replace-one, and only against readers of the aggregate, so
      # a row that attacks the uploads (target 'local') carries no epsilon.
      assert labels == {'dp_unit': 'client', 'dp_relation': 'replace_one',
                        'dp_adversary': 'aggregate', 'dp_sampling': 'none'}, labels
      assert m['noise_multiplier'] > 0
      assert math.isnan(m['dp_epsilon_per_round'])  # a per-round epsilon is wdp's alone
      if p['params']['target'] == 'local':
        assert math.isnan(m['dp_epsilon'])
      else:
        assert abs(m['dp_epsilon'] - 4.0) < 0.05
      assert 'attack_epsilon_cp' in m
    else:
      assert labels == {}, labels
      assert math.isnan(m['dp_epsilon'])
  for name in ('results.csv', 'table.md', 'pastel_privacy_utility.png', 'pastel_auc.png',
               'pastel_loss_hist.png'):
    assert (workdir / name).exists(), name
  assert len(list((workdir / 'trained').glob('*.npz'))) == 4
  table = (workdir / 'table.md').read_text()
  assert '| Defense | Strength |' in table and 'AUC local' in table and 'AUC global' in table
  assert 'two-way bootstrap' in table and 'DeLong' not in table


def test_same_rows_for_every_defense(smoke):
  """Attacks score the same evaluation rows under every defense (paired comparison)."""
  _, results = smoke
  by_target = {}
  for p in results['points']:
    by_target.setdefault(p['params']['target'], set()).add(
        (p['metrics']['n_pos'], p['metrics']['n_neg']))
  assert all(len(v) == 1 for v in by_target.values())


def test_resume_keeps_points_without_retraining(smoke):
  workdir, results = smoke
  proc = _run(workdir)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'pastel: training' not in proc.stderr  # the trained/ artifacts are reused
  again = json.loads((workdir / 'results.json').read_text())
  assert [p['metrics'] for p in again['points']] == [p['metrics'] for p in results['points']]


@pytest.mark.parametrize('field,value', [
    ('pastel_weights', (-1.0,)),
    ('pastel_layers', ('fc9',)),
    ('pastel_representations', ('logits',)),
    ('pastel_representations', ()),
    ('per_client', 2),
    ('per_client', 1000),
    ('replicates', 0),
    ('bootstrap_resamples', 0),
    ('validation_fraction', 0.1),
    ('optimizer', 'rmsprop'),
    ('ablation_optimizer', 'rmsprop'),
    ('attacks', ('shadow',)),
    ('defenses', ('dpsgd',)),
    ('targets', ('server',)),
    ('epsilons', (0.0,)),
    ('clip_norm', 0.0),
    ('update_clip_norm', -1.0),
    ('validation_fraction', 0.6),
    ('validation_fraction', 0.0),
    ('attack_snapshots', 3),
    ('record_every', 3),
    ('dp_delta', 1.0),
])
def test_bad_field_raises_config_error_naming_it(field, value):
  from configs import digits
  from fl_privacy import validate
  from fl_privacy.pipelines import pastel
  config = digits.get_config('smoke')
  config.pastel[field] = value
  with pytest.raises(validate.ConfigError) as e:
    pastel.prepare(config)
  assert str(e.value).startswith(f'config.pastel.{field}: ')


def test_unknown_layer_lists_the_available_names():
  from configs import digits
  from fl_privacy import validate
  from fl_privacy.pipelines import pastel
  config = digits.get_config('smoke')
  config.pastel.pastel_layers = ('fc9',)
  with pytest.raises(validate.ConfigError, match=r"\('fc1', 'fc2', 'fc3'\)"):
    pastel.prepare(config)


def test_fedmia_needs_three_clients():
  from configs import digits
  from fl_privacy import validate
  from fl_privacy.pipelines import pastel
  config = digits.get_config('smoke')
  config.pastel.num_clients = 2
  config.pastel.attacks = ('fedmia_i',)
  with pytest.raises(validate.ConfigError, match='pastel.num_clients.*>= 3'):
    pastel.prepare(config)


def test_heldout_rows_fewer_than_a_batch_are_refused_naming_both_fields():
  from configs import digits
  from fl_privacy import validate
  from fl_privacy.pipelines import pastel
  config = digits.get_config()  # leaky: 24 rows per client, B = 8
  config.pastel.validation_fraction = 0.25  # 6 held-out rows < B = 8
  with pytest.raises(validate.ConfigError) as e:
    pastel.prepare(config)
  assert str(e.value).startswith('config.pastel.validation_fraction: ')
  assert 'pastel.batch_size = 8' in str(e.value) and '= 6)' in str(e.value)
  config.pastel.batch_size = 6
  pastel.validate_config(config)
  assert pastel.prepare(config)['layers'] == ('fc1', 'fc2', 'fc3')


def test_both_readings_at_every_lambda_and_replicates_in_both_settings():
  from configs import digits
  from fl_privacy.pipelines import pastel
  for setting in ('leaky', 'well_generalising'):
    config = digits.get_config(f'setting={setting}')
    s = config.pastel
    assert max(s.pastel_weights) >= 100 and s.replicates >= 1
    got = [(t['strength'], t['representation']) for t in pastel.trainings(config)
           if t['defense'] == 'pastel' and t['optimizer'] == s.optimizer]
    assert got == [(float(w), r) for r in ('activation', 'gradient') for w in s.pastel_weights]
    if setting == 'leaky':
      # Little data per client: 16 members + 8 held-out (one batch) each; the other train rows
      # join the non-members.
      assert (s.num_clients, s.per_client, s.batch_size) == (10, 24, 8)
      assert round(s.validation_fraction * s.per_client) == s.batch_size
    else:
      assert (s.num_clients, s.per_client) == (5, None)


@pytest.mark.parametrize('override,field', [
    ('--config.pastel.validation_fraction=0.25', 'pastel.validation_fraction'),
    ('--config.pastel.pastel_weights=(-1.0,)', 'pastel.pastel_weights'),
    ("--config.pastel.pastel_layers=('fc9',)", 'pastel.pastel_layers'),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, override, field):
  workdir = tmp_path / 'never'
  proc = cli.run_forked('pastel', workdir, override)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert f'config.{field}' in proc.stderr
  assert len(proc.stderr.strip().splitlines()[-1]) > 0
  assert not os.path.exists(workdir)


def test_dp_accounting_equals_dp_accounting_called_directly():
  import dp_accounting
  from dp_accounting import rdp
  from configs import digits
  from fl_privacy.pipelines import pastel

  config = digits.get_config()
  split = {'members': [list(range(230)), list(range(229))]}
  s = config.pastel

  def direct(event):
    acc = rdp.RdpAccountant()
    acc.compose(event)
    return acc.get_epsilon(s.dp_delta)

  info = pastel.dp_accounting(config, split, 'ldp', 4.0)
  steps = s.local_epochs * math.ceil(229 / s.batch_size) * s.num_rounds
  assert info['dp_steps'] == steps and info['dp_sampling_rate'] == s.batch_size / 229
  want = direct(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
      s.batch_size / 229, dp_accounting.GaussianDpEvent(info['noise_multiplier'])), steps))
  assert info['dp_epsilon'] == pytest.approx(want, rel=1e-9)
  assert 3.9 < info['dp_epsilon'] <= 4.0 + 1e-6
  assert (info['dp_unit'], info['dp_relation'], info['dp_adversary']) == (
      'record', 'add_remove', 'server')
  # DP-FedAvg divides by the actual participants: replacing one client moves the mean by
  # 2 C / K, so the Gaussian event's noise multiplier is z / 2 (client level, aggregate only).
  info = pastel.dp_accounting(config, split, 'cdp', 1.0)
  assert (info['dp_unit'], info['dp_relation'], info['dp_adversary']) == (
      'client', 'replace_one', 'aggregate')
  gauss = dp_accounting.GaussianDpEvent(info['noise_multiplier'] / 2)
  assert info['dp_epsilon'] == pytest.approx(
      direct(dp_accounting.SelfComposedDpEvent(gauss, s.num_rounds)), rel=1e-9)
  assert info['dp_epsilon'] == pytest.approx(1.0, abs=0.01)
  info = pastel.dp_accounting(config, split, 'wdp', 1.0)
  gauss = dp_accounting.GaussianDpEvent(info['noise_multiplier'] / 2)
  assert info['dp_epsilon_per_round'] == pytest.approx(
      direct(dp_accounting.SelfComposedDpEvent(gauss, 1)), rel=1e-9)
  assert info['dp_epsilon_per_round'] == pytest.approx(1.0, abs=0.01)
  # Weak DP composes: T rounds of a 1-DP round spend far more than 1.
  assert info['dp_epsilon'] == pytest.approx(
      direct(dp_accounting.SelfComposedDpEvent(gauss, s.num_rounds)), rel=1e-9)
  assert info['dp_epsilon'] > 5


def test_figures_read_on_their_own(smoke, monkeypatch):
  import ml_collections  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import pastel_figures  # pylint: disable=g-import-not-at-top
  from tests import figure_checks  # pylint: disable=g-import-not-at-top
  workdir, results = smoke
  config = ml_collections.ConfigDict(results['config'])
  rng = np.random.default_rng(0)
  losses = {f'{p["defense"]} {p["strength"]}': dict(params=p, member=rng.lognormal(size=50),
                                                   nonmember=rng.lognormal(size=50))
            for p in (pt['params'] for pt in results['points'])}
  with figure_checks.capture(monkeypatch) as found:
    pastel_figures.save_figures(config, results['points'], losses, str(workdir))
  assert set(found) == {'pastel_privacy_utility', 'pastel_auc', 'pastel_loss_hist'}
  assert {k: v for k, v in found.items() if v} == {}


def test_a_training_stored_without_logit_margins_is_trained_again(tmp_path, monkeypatch):
  # FedMIA-I reads its loss from the margins (`scores.signed_measurement`): a training stored
  # before PASTEL recorded them is retrained, one stored with them is read back.
  from types import SimpleNamespace  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  import jax  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  import numpy as np  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from fl_privacy.pipelines import pastel  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from fl_privacy.report import ArtifactStore  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  tr = dict(defense='none', strength=0.0, optimizer='sgd', representation='-')
  trained_again = []

  def fake_train(config, state, data, tr, key):
    trained_again.append(tr)
    return {'fm_loss': np.ones(2), 'fm_margin': np.ones(2), 'test_correct': 1,
            'jsd_last_round': 0.0}

  monkeypatch.setattr(pastel, 'train', fake_train)
  monkeypatch.setattr(pastel, '_replicates', lambda *a: [None])
  state, store = {'test': [0, 1]}, SimpleNamespace(workdir=str(tmp_path))
  artifacts = ArtifactStore(tmp_path, pastel.TRAINED)
  artifacts.save(dict(tr, replicate=0), {'fm_loss': np.ones(2)})
  key = jax.random.key(0)
  arrays = pastel.trained(None, state, store, key, tr, 0)
  assert len(trained_again) == 1 and 'fm_margin' in arrays
  assert 'fm_margin' in pastel.trained(None, state, store, key, tr, 0)
  assert len(trained_again) == 1  # stored with margins now: read back
