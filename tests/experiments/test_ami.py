"""End-to-end tests of `python -m experiments.ami` (smoke config, bad inputs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import jax
import pytest

from configs import digits
from fl_privacy import data as data_lib
from fl_privacy import validate
from fl_privacy.pipelines import ami as ami_pipeline
from tests.experiments import cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(workdir, *flags, config='configs/digits.py:smoke', timeout=300):
  cmd = [sys.executable, '-m', 'experiments.ami', f'--config={config}',
         f'--workdir={workdir}', *flags]
  return subprocess.run(cmd, cwd=REPO, env=cli.env(), capture_output=True, text=True,
                        timeout=timeout)


@pytest.fixture(scope='module')
def smoke_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('ami') / 'run'
  proc = _run(str(workdir))
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(workdir / 'results.json') as f:
    return workdir, json.load(f)


def test_smoke_results_schema_and_sanity(smoke_run):
  workdir, results = smoke_run
  assert results['experiment'] == 'ami'
  games = [p for p in results['points'] if p['params']['part'] == 'game']
  assert {(p['params']['mechanism'], p['params']['epsilon']) for p in games} == {
      ('none', None), ('bitrand', 2.0), ('bitrand', 9.0)}
  for p in games:
    m = p['metrics']
    assert p['n_trials'] == 400 and m['n_pos'] == m['n_neg'] == 200
    for name in ('adv', 'tpr', 'tnr', 'accuracy'):
      assert 0.0 <= m[f'{name}_ci_low'] <= m[name] <= m[f'{name}_ci_high'] <= 1.0
    assert m['adv'] == pytest.approx((m['tpr'] + m['tnr']) / 2)
    # The paper's rule is `adv`; the calibrated extension is reported beside it.
    assert m['adv_calibrated_ci_low'] <= m['adv_calibrated'] <= m['adv_calibrated_ci_high']
  none = next(p['metrics'] for p in games if p['params']['mechanism'] == 'none')
  assert none['adv'] >= 0.8 and none['tpr'] == 1.0
  high = next(p['metrics'] for p in games if p['params']['epsilon'] == 9.0)
  assert 'certified_delta_star' in high and high['certified_range'] > 0
  # q is the whole game pool (certified_samples = 0), recomputed from the config's roles.
  config = digits.get_config('smoke')
  splits = data_lib.load(config.data)
  pool = ami_pipeline.roles(jax.random.fold_in(jax.random.key(config.seed), 1), config, splits)
  assert high['certified_q'] == len(pool['pool'])
  dp = [p for p in results['points'] if p['params']['part'] == 'dp_averaging']
  assert dp and all(p['metrics']['rounds_closed_form'] >= 1 for p in dp)
  for name in ('ami_vs_epsilon', 'neuron_histograms', 'certified', 'dp_rounds'):
    assert (workdir / f'{name}.png').stat().st_size > 0
  assert (workdir / 'results.csv').exists()


def test_resume_keeps_saved_points(smoke_run):
  workdir, results = smoke_run
  t0 = time.time()
  proc = _run(str(workdir))
  assert proc.returncode == 0, proc.stderr[-2000:]
  with open(workdir / 'results.json') as f:
    again = json.load(f)
  assert again['points'] == results['points']


@pytest.mark.parametrize('flag,field', [
    ('--config.ami.mechanisms=("none","laplace")', 'ami.mechanisms'),
    ('--config.ami.batch_size=100000', 'ami.batch_size'),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, flag, field):
  workdir = tmp_path / 'never'
  proc = cli.run_forked('ami', workdir, flag)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert field in proc.stderr
  assert not workdir.exists()


def test_unavailable_dataset_fails_fast(tmp_path):
  workdir = tmp_path / 'never'
  t0 = time.time()
  proc = _run(str(workdir), config=f'configs/celeba.py:smoke,data_dir={tmp_path / "no_tfds"}',
              timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert 'celeb' in proc.stderr.lower()
  assert time.time() - t0 < 90
  assert not workdir.exists()


@pytest.mark.parametrize('field,value', [
    ('epsilons', (1.0, 0.0)), ('epsilons', (-2.0,)), ('num_neurons', 0),
    ('mechanisms', ('bitrand', 'rappor')), ('decision_path', 'slow'),
])
def test_validation_names_the_field(field, value):
  config = digits.get_config('smoke')
  config.ami[field] = value
  with pytest.raises(validate.ConfigError) as e:
    ami_pipeline.validate_config(config)
  assert e.value.field == f'ami.{field}'


def test_figures_read_on_their_own(smoke_run, monkeypatch):
  import ml_collections  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import ami_figures  # pylint: disable=g-import-not-at-top
  from tests import figure_checks  # pylint: disable=g-import-not-at-top
  workdir, results = smoke_run
  config = ml_collections.ConfigDict(results['config'])
  with figure_checks.capture(monkeypatch) as found:
    ami_figures.make_figures(results['points'], str(workdir), config)
  assert set(found) == {'ami_vs_epsilon', 'neuron_histograms', 'certified', 'dp_rounds'}
  assert {k: v for k, v in found.items() if v} == {}


def test_resume_recomputes_missing_or_corrupt_draws(smoke_run, tmp_path, monkeypatch):
  import shutil  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import ami_figures  # pylint: disable=g-import-not-at-top
  workdir, results = smoke_run
  copy = tmp_path / 'run'
  shutil.copytree(workdir, copy)
  store = ami_figures.draws_store(str(copy))
  lost = store.path(ami_figures.draw_params('bitrand', 2.0))
  broken = store.path(ami_figures.draw_params('bitrand', 9.0))
  original = {p: dict(np.load(p)) for p in (lost, broken)}
  os.remove(lost)
  with open(broken, 'wb') as f:
    f.write(b'not a zip file')
  proc = _run(str(copy))
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'is missing: recomputing' in proc.stderr
  assert 'is unreadable or holds another point' in proc.stderr
  for p in (lost, broken):  # the same values as the first run: the point's own keys
    again, _ = ami_figures.load_draws(str(copy), 'bitrand', 2.0 if p == lost else 9.0)
    np.testing.assert_allclose(again['target'], original[p]['target'], rtol=1e-6)
    np.testing.assert_allclose(again['other'], original[p]['other'], rtol=1e-6)
  with open(copy / 'results.json') as f:
    assert json.load(f)['points'] == results['points']


def test_histogram_panel_without_draws_says_so(smoke_run, tmp_path, monkeypatch):
  import shutil  # pylint: disable=g-import-not-at-top
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import ami_figures  # pylint: disable=g-import-not-at-top
  from fl_privacy.report import figures  # pylint: disable=g-import-not-at-top
  workdir, results = smoke_run
  copy = tmp_path / 'run'
  shutil.copytree(workdir, copy)
  # Another point's file in this point's place is rejected, not drawn under its name.
  store = ami_figures.draws_store(str(copy))
  shutil.copy(store.path(ami_figures.draw_params('bitrand', 9.0)),
              store.path(ami_figures.draw_params('bitrand', 2.0)))
  panels = {}

  def save(fig, workdir, name, **kw):
    del workdir, kw
    panels[name] = {ax.get_title(): (len(ax.patches), [t.get_text() for t in ax.texts])
                    for ax in fig.axes if ax.get_title()}
  monkeypatch.setattr(figures, 'save', save)
  ami_figures.make_figures(results['points'], str(copy),
                           ml_collections.ConfigDict(results['config']))
  plt.close('all')
  bars, texts = panels['neuron_histograms']['bitrand, eps = 2']
  assert bars == 0 and any("another point's draws" in t for t in texts)
  bars, texts = panels['neuron_histograms']['bitrand, eps = 9']
  assert bars > 0 and not texts


def test_gradient_path_rates_agree_with_fast_path_within_intervals():
  # The gradient path randomizes with the exact per-bit sampler, the fast path with the
  # code sampler: the same law, different draws, so rates agree within their intervals
  # (not trial by trial; `fast_path_agreement` checks the decision rule on each batch).
  import jax  # pylint: disable=g-import-not-at-top
  from fl_privacy.attacks import ami  # pylint: disable=g-import-not-at-top
  from fl_privacy.eval import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  config = digits.get_config('smoke')
  config.ami.num_trials = 2000
  state = ami_pipeline.prepare(config)
  key = jax.random.key(0)
  mechanism, epsilon = 'bitrand', 5.0
  randomize = ami.mechanism_fn(mechanism, epsilon, state['pool_x'].shape[1], state['encoding'])
  neurons, _, _, _ = ami.point.craft_targets(jax.random.fold_in(key, 0),
                                             ami_pipeline.settings(config), state, randomize,
                                             True)
  rates = {}
  for path in ('fast', 'gradient'):
    config.ami.decision_path = path
    out, extra = ami.point.play(jax.random.fold_in(key, 1), ami_pipeline.settings(config),
                                state, neurons, mechanism, epsilon, randomize)
    rates[path] = metrics_lib.tpr_tnr_adv(out['decision'], out['b'])
    if path == 'gradient':
      assert extra['fast_path_agreement'] == 1.0
  # Not a degenerate game: both paths err sometimes and are right sometimes.
  assert 0.55 < rates['fast']['adv'] < 0.99
  for name in ('tpr', 'tnr'):
    f, g = rates['fast'], rates['gradient']
    assert f[f'{name}_ci_low'] <= g[f'{name}_ci_high'] and g[f'{name}_ci_low'] <= f[
        f'{name}_ci_high'], (name, f[name], g[name])
  # Different draws: they are not the same trials.
  assert rates['fast']['tp'] != rates['gradient']['tp'] or rates['fast']['tn'] != rates[
      'gradient']['tn']
