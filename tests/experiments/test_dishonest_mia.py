"""End to end: `python -m experiments.dishonest_mia` on the digits smoke config."""

from __future__ import annotations

import json
import os

import pytest

from tests.experiments import cli


def _run(workdir, *overrides):
  return cli.run('dishonest_mia', workdir, *overrides, timeout=600)


@pytest.fixture(scope='module')
def smoke(tmp_path_factory):
  return cli.smoke_results(tmp_path_factory, 'dishonest_mia', 'dishonest', timeout=600)


def test_results_schema(smoke):
  workdir, results = smoke
  assert results['experiment'] == 'dishonest_mia'
  runs = results['config']['dishonest']['runs']
  points = results['points']
  assert {(p['params']['M'], p['params']['optimizer']) for p in points} == {
      (1, 'momentum'), (4, 'momentum'), (1, 'adam'), (4, 'adam')}
  for p in points:
    assert set(p['params']) == {'M', 'optimizer', 'num_batches', 'epochs', 'defense'}
    assert p['params']['defense'] == 'none'
    assert p['n_trials'] == runs
    m = p['metrics']
    assert m['n_in'] == m['n_out'] == runs // 2
    for name in ('fpr', 'fnr', 'acc'):
      assert m[f'{name}_ci_low'] <= m[name] <= m[f'{name}_ci_high']
    assert 0.0 <= m['auc'] <= 1.0
    assert m['fp'] == m['fp_exact_duplicate'] + m['fp_near_duplicate'] + m['fp_no_duplicate']
  for name in ('results.csv', 'table2.md', 'false_decisions.json', 'delta.png'):
    assert (workdir / name).exists(), name


def test_numbers_are_sane(smoke):
  workdir, results = smoke
  for p in results['points']:
    m = p['metrics']
    # Lemma 2.1: an outside run moves the detector only if a client example activates it.
    assert m['out_delta_nonzero'] == m['out_activated']
    if p['params']['M'] == 4:
      assert m['fp'] == 0 and m['fn'] == 0 and m['acc'] == 1.0 and m['auc'] == 1.0
      assert float(m['delta_out_max']) == 0.0
  decisions = json.loads((workdir / 'false_decisions.json').read_text())
  for d in decisions.values():
    for fp in d['false_positives']:
      assert fp['cause'] and fp['num_activating'] >= 1
  table = (workdir / 'table2.md').read_text()
  assert '| Opt. | M |' in table and 'False positives and their causes' in table


def test_resume_keeps_points(smoke, tmp_path):
  workdir, results = smoke
  proc = _run(workdir)
  assert proc.returncode == 0, proc.stderr[-2000:]
  again = json.loads((workdir / 'results.json').read_text())
  assert [p['metrics'] for p in again['points']] == [p['metrics'] for p in results['points']]


@pytest.mark.parametrize('override,field', [
    ('--config.dishonest.M=(100,)', 'dishonest.M'),
    ('--config.dishonest.num_batches=(64,)', 'dishonest.num_batches'),
    ("--config.dishonest.optimizers=('rmsprop',)", 'dishonest.optimizers'),
])
def test_bad_input_exits_2_naming_the_field(tmp_path, override, field):
  workdir = tmp_path / 'never'
  proc = cli.run_forked('dishonest_mia', workdir, override)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert f'config.{field}' in proc.stderr
  assert not os.path.exists(workdir)


def test_attribution_finds_the_duplicate_in_the_client_data():
  """A false positive whose target has a copy in the client's data is attributed to it."""
  import dataclasses

  import jax
  import numpy as np

  from configs import digits
  from fl_privacy import data as data_lib
  from fl_privacy.attacks import dishonest
  from fl_privacy.pipelines import dishonest_mia

  config = digits.get_config()
  pool = data_lib.load(config.data)['train']
  p = dict(M=2, optimizer='sgd', num_batches=4, epochs=1)
  key = jax.random.key(3)
  run = 7  # odd: the target is outside
  client = dishonest.client_indices(dishonest_mia.point_key(key, p), run, len(pool), 4 * 32)
  assert len(set(client.tolist())) == 128
  target = int(np.setdiff1d(np.arange(len(pool)), client)[0])
  x = pool.x.copy()
  x[target] = x[client[5]]
  copied = dataclasses.replace(pool, x=x)
  outcome = dict(target=target, nearest=int(client[5]), nearest_distance=0.0,
                 num_activating=1, delta=1.0)
  record = dishonest_mia.attribute(config, copied, key, p, run, outcome)
  assert record['exact_duplicates_in_client'] == [int(client[5])]
  assert record['cause'].startswith('exact duplicate')
  # Without the copy (digits has no duplicate of this target): the features matched by chance.
  record = dishonest_mia.attribute(config, pool, key, p, run, outcome)
  assert not record['exact_duplicates_in_client'] and not record['near_duplicates_in_client']
  assert record['cause'].startswith('none')


def test_delta_figure_reads_on_its_own(smoke, monkeypatch):
  import ml_collections  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import dishonest_mia_figures  # pylint: disable=g-import-not-at-top
  from tests import figure_checks  # pylint: disable=g-import-not-at-top
  workdir, results = smoke
  with open(workdir / 'deltas.json', encoding='utf-8') as f:
    deltas = json.load(f)
  with figure_checks.capture(monkeypatch) as found:
    dishonest_mia_figures.save_delta_figure(ml_collections.ConfigDict(results['config']),
                                            deltas, str(workdir))
  assert found == {'delta': []}


def test_a_near_duplicate_that_did_not_fire_is_not_blamed():
  import dataclasses

  import jax
  import numpy as np

  from configs import digits
  from fl_privacy import data as data_lib
  from fl_privacy.attacks import dishonest
  from fl_privacy.pipelines import dishonest_mia

  config = digits.get_config()
  pool = data_lib.load(config.data)['train']
  p = dict(M=2, optimizer='sgd', num_batches=4, epochs=1)
  key = jax.random.key(3)
  run = 7
  client = dishonest.client_indices(dishonest_mia.point_key(key, p), run, len(pool), 4 * 32)
  target = int(np.setdiff1d(np.arange(len(pool)), client)[0])
  x = pool.x.copy()
  near_copy = x[target].copy()
  near_copy.flat[0] = min(int(near_copy.flat[0]) + 1, 16)  # one grey level: a near duplicate
  x[client[5]] = near_copy
  pool2 = dataclasses.replace(pool, x=x)
  config.dishonest.near_threshold = 0.2
  fired_elsewhere = dict(target=target, nearest=int(client[9]), nearest_distance=0.0,
                         num_activating=1, delta=1.0)
  record = dishonest_mia.attribute(config, pool2, key, p, run, fired_elsewhere)
  assert record['near_duplicates_in_client'] == [int(client[5])]
  assert record['cause'].startswith('none: no duplicate fired')
  fired_by_copy = dict(fired_elsewhere, nearest=int(client[5]))
  record = dishonest_mia.attribute(config, pool2, key, p, run, fired_by_copy)
  assert record['cause'] == f'near duplicate of the target: example {int(client[5])}'
