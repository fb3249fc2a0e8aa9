"""End to end: `python -m experiments.reconstruction` on the digits smoke config."""

from __future__ import annotations

import json

import ml_collections
import pytest

from tests.experiments import cli


@pytest.fixture(scope='module')
def smoke(tmp_path_factory):
  return cli.smoke_results(tmp_path_factory, 'reconstruction', 'reconstruction', timeout=600)


def _points(results, **where):
  return [p for p in results['points']
          if all(p['params'].get(k) == v for k, v in where.items())]


def test_every_attack_and_defense_point_is_there_with_its_intervals(smoke):
  workdir, results = smoke
  s = results['config']['reconstruction']
  attacks = _points(results, kind='attack', defense='none')
  assert {(p['params']['attack'], p['params']['batch_size']) for p in attacks} == {
      ('imprint', 1), ('imprint', 8), ('analytic', 1), ('analytic', 8), ('inversion', 1)}
  for p in _points(results, kind='attack'):
    m = p['metrics']
    assert m['n_examples'] == m['n_trials'] * p['params']['batch_size']
    for name in ('exact', 'recovered', 'all_exact'):
      assert m[f'{name}_ci_low'] <= m[name] <= m[f'{name}_ci_high']
  # One step, one example: both attacks read it exactly (the inversion only approximately).
  for attack in ('imprint', 'analytic'):
    (p,) = _points(results, kind='attack', defense='none', attack=attack, batch_size=1)
    assert p['metrics']['exact'] == 1.0 and p['metrics']['label_acc'] == 1.0
  (p,) = _points(results, kind='attack', defense='none', attack='analytic', batch_size=8)
  assert p['metrics']['exact'] == 0.0          # eight examples: a mixture, counted as failed
  # Every swept defense row carries its strength, its epsilon label and a utility beside it.
  swept = [p for p in _points(results, kind='attack') if p['params']['defense'] != 'none']
  assert {p['params']['defense'] for p in swept} == set(s['defenses'])
  for p in swept:
    assert p['params']['strength'] is not None and 'dp_epsilon' in p['metrics']
    assert _points(results, kind='utility', defense=p['params']['defense'],
                   strength=p['params']['strength'])
  (none,) = _points(results, kind='utility', defense='none')
  assert 0.0 < none['metrics']['test_accuracy'] <= 1.0
  for name in ('table.md', 'images.json', 'reconstructions.png', 'defenses.png', 'batch.png'):
    assert (workdir / name).exists(), name
  assert '| attack | server | defense | strength | eps |' in (workdir / 'table.md').read_text()


def test_every_imprint_defense_point_has_the_adaptive_servers_beside_it(smoke):
  _, results = smoke
  s = results['config']['reconstruction']
  fixed = _points(results, kind='attack', attack='imprint', server='fixed',
                  batch_size=s['center']['imprint'], num_batches=1, epochs=1)
  assert {p['params']['defense'] for p in fixed} == {'none', *s['defenses']}
  for p in fixed:
    twin = {k: v for k, v in p['params'].items() if k != 'server'}
    (a,) = _points(results, server='adaptive', **twin)
    m = a['metrics']
    # The choice is one of the grid's, scored on public clients, and run on as many private
    # clients as the fixed server's (the same ones: common keys).
    assert m['adaptive_restore_scale'] in s['adaptive']['restore_scales']
    assert m['adaptive_placement'] in s['adaptive']['placements']
    assert m['adaptive_public_examples'] == s['adaptive']['trials'] * twin['batch_size']
    assert m['n_trials'] == p['metrics']['n_trials']
    assert m['adaptive_structure'] in s['adaptive']['structures']
    assert m['adaptive_rounds'] in s['adaptive']['rounds']
    # The paired difference is the difference of the two rates (the same clients), inside its
    # interval; exactness after rounding to the grid is reported for both servers.
    for name in ('recovered', 'exact', 'exact_grid'):
      assert m[f'{name}_diff'] == pytest.approx(m[name] - p['metrics'][name], abs=1e-9)
      assert m[f'{name}_diff_ci_low'] <= m[f'{name}_diff'] <= m[f'{name}_diff_ci_high']
    for q in (p, a):
      g = q['metrics']
      assert g['exact_grid_ci_low'] <= g['exact_grid'] <= g['exact_grid_ci_high']
      assert g['exact_grid'] >= g['exact']     # digits' 17 levels: rounding keeps exactness
  # Utility over several trainings, each a cluster.
  for u in _points(results, kind='utility'):
    assert u['n_trials'] == s['utility']['trials'] >= 2
    assert 'test_accuracy_effective_n' in u['metrics']


def test_the_figures_read_on_their_own(smoke, monkeypatch):
  from fl_privacy.pipelines import reconstruction_figures  # pylint: disable=g-import-not-at-top
  from tests import figure_checks  # pylint: disable=g-import-not-at-top
  workdir, results = smoke
  images = json.loads((workdir / 'images.json').read_text())
  config = ml_collections.ConfigDict(results['config'])
  with figure_checks.capture(monkeypatch) as found:
    reconstruction_figures.write_all(config, results['points'], images, str(workdir))
  assert set(found) == {'reconstructions', 'defenses', 'batch'}
  assert found == {name: [] for name in found}, found


def test_unused_fields_follow_the_attacks_model_and_swept_defenses():
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import reconstruction  # pylint: disable=g-import-not-at-top
  config = digits.get_config()
  s = config.reconstruction
  assert set(reconstruction.unused_fields(config)) == {'reconstruction.padding'}
  s.model = 'flower_cnn'
  s.attacks = ('imprint',)
  s.defense_attacks = ('imprint',)
  s.multi_step_attacks = ('analytic',)
  for name in s.defenses.keys():
    if name not in ('sparsify', 'quantize'):
      s.defenses[name] = ()
  unused = reconstruction.unused_fields(config)
  assert "'mlp'" in unused['reconstruction.hidden'] and 'reconstruction.padding' not in unused
  for f in ('inversion.steps', 'inversion.restarts', 'inversion_trials', 'center.inversion',
            'max_examples.analytic', 'num_batches', 'epochs', 'dp_sgd_samplings', 'dp_clip',
            'dp_delta'):
    assert f'reconstruction.{f}' in unused, f
  for f in ('imprint.num_bins', 'center.imprint', 'defense_attacks'):
    assert f'reconstruction.{f}' not in unused, f
  # An attack run only by the defense sweep reads its fields; with no defense swept, it does not.
  s.defense_attacks = ('imprint', 'inversion')
  assert 'reconstruction.inversion.steps' not in reconstruction.unused_fields(config)
  s.defenses.sparsify, s.defenses.quantize = (), ()
  unused = reconstruction.unused_fields(config)
  assert {'reconstruction.inversion.steps', 'reconstruction.defense_attacks'} <= set(unused)
  s.defenses.update_dp = (1e-5,)
  unused = reconstruction.unused_fields(config)
  assert 'reconstruction.dp_clip' not in unused and 'reconstruction.dp_sgd_samplings' in unused


def test_unused_fields_name_the_adaptive_server_and_the_learning_rates_where_nothing_reads_them():
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import reconstruction  # pylint: disable=g-import-not-at-top
  config = digits.get_config()
  s = config.reconstruction
  assert not {'reconstruction.adaptive.trials', 'reconstruction.learning_rates'} & set(
      reconstruction.unused_fields(config))
  s.adaptive.restore_scales = ()
  unused = reconstruction.unused_fields(config)
  assert {'reconstruction.adaptive.trials', 'reconstruction.adaptive.placements'} <= set(unused)
  assert 'reconstruction.adaptive.restore_scales' not in unused
  s.num_batches, s.epochs = (1,), (1,)
  assert 'reconstruction.learning_rates' in reconstruction.unused_fields(config)
  s.attacks, s.defense_attacks = ('analytic',), ('analytic',)
  unused = reconstruction.unused_fields(config)
  assert "'imprint' runs at no point" in unused['reconstruction.adaptive.restore_scales']
