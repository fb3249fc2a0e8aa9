"""The reconstruction experiment's size and swept-value checks in process, at their edges.

The bad-input rows (test_bad_inputs) reach these checks only through a subprocess, which a
mutation run does not tie to the module; these tests call them directly (written from
reconstruction_checks.py's mutation run, issue 41).
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from configs import digits
from fl_privacy import memory
from fl_privacy import validate
from fl_privacy.attacks.reconstruction import metrics as rec_metrics
from fl_privacy.pipelines import reconstruction_checks as checks


def _config():
  # max_examples: analytic 64, imprint 64, inversion 4; center: analytic 1, imprint 8,
  # inversion 1, num_batches 1; multi-step: imprint, analytic.
  return digits.get_config()


def _refused(config) -> validate.ConfigError:
  with pytest.raises(validate.ConfigError) as e:
    checks.check_swept_values(config)
  return e.value


def test_the_default_passes():
  checks.check_swept_values(_config())


def test_a_batch_size_above_every_max_examples_is_refused_at_the_largest_plus_one():
  config = _config()
  s = config.reconstruction
  s.max_examples.analytic = 32
  s.batch_sizes = (1, 64)     # 64 = imprint's max, the largest: runs
  checks.check_swept_values(config)
  s.batch_sizes = (1, 65)
  e = _refused(config)
  assert e.field == 'reconstruction.batch_sizes' and e.got == (1, 65)
  assert e.allowed == ('sizes some attack runs: each at most the largest max_examples (64; a '
                       'larger client runs at no point)')


def test_batch_sizes_the_chosen_attacks_run_none_of_are_refused():
  config = _config()
  s = config.reconstruction
  s.attacks = ('inversion',)
  s.batch_sizes = (4, 8)     # 4 = inversion's max_examples
  checks.check_swept_values(config)
  s.batch_sizes = (5, 8)
  e = _refused(config)
  assert e.field == 'reconstruction.batch_sizes' and e.got == (5, 8)
  assert e.allowed == ('sizes the chosen attacks run (at least one <= 4, the largest '
                       'max_examples of reconstruction.attacks; else no batch-size point runs)')
  s.attacks = ('inversion', 'analytic')   # the largest of the chosen: 64
  checks.check_swept_values(config)


def test_a_j_no_multi_step_attack_runs_is_refused():
  config = _config()
  s = config.reconstruction
  s.num_batches = (1, 8)       # imprint: 8 x 8 = 64 <= 64
  checks.check_swept_values(config)
  s.multi_step_attacks = ('imprint',)
  s.num_batches = (9,)        # imprint: 72 > 64 (analytic, 1 x 9, is not multi-step here)
  e = _refused(config)
  assert e.field == 'reconstruction.num_batches' and e.got == (9,)
  assert e.allowed == ('J some multi-step attack runs: J x center.<attack> at most '
                       'max_examples.<attack> for one of imprint (8 x J <= 64)')
  s.multi_step_attacks = ('imprint', 'analytic')   # analytic: 1 x 9 <= 64
  checks.check_swept_values(config)
  s.center.analytic = 8
  s.max_examples.analytic = 71    # 8 x 9 = 72: one above
  e = _refused(config)
  assert e.field == 'reconstruction.num_batches'
  assert e.allowed.endswith('for one of imprint (8 x J <= 64), analytic (8 x J <= 71)')


def test_multi_step_attacks_without_a_max_examples_entry_check_no_j():
  config = _config()
  s = config.reconstruction
  s.multi_step_attacks = ('nonexistent',)    # no max_examples entry: not a multi-step attack
  s.num_batches = (1000,)
  s.center.num_batches = 1000
  checks.check_swept_values(config)


def test_a_centre_j_the_e_sweep_runs_for_no_attack_is_refused():
  config = _config()
  s = config.reconstruction
  s.center.num_batches = 9       # imprint 72 > 64, but analytic 9 <= 64
  checks.check_swept_values(config)
  s.multi_step_attacks = ('imprint',)
  s.center.num_batches = 8       # imprint: 8 x 8 = 64
  checks.check_swept_values(config)
  s.center.num_batches = 9
  e = _refused(config)
  assert e.field == 'reconstruction.center.num_batches' and e.got == 9
  assert e.allowed == ('a J the E sweep runs: center.num_batches x center.<attack> at most '
                       'max_examples.<attack> for one of the multi-step attacks')


def test_grid_images_above_the_largest_max_examples_are_refused():
  config = _config()
  s = config.reconstruction
  s.grid_images = 64
  checks.check_swept_values(config)
  s.grid_images = 65
  e = _refused(config)
  assert e.field == 'reconstruction.grid_images' and e.got == 65
  assert e.allowed == 'at most 64, the largest max_examples (a point shows at most its own inputs)'


def test_a_psnr_threshold_at_the_cap_is_refused():
  config = _config()
  s = config.reconstruction
  s.psnr_threshold = float(np.nextafter(rec_metrics.PSNR_CAP, 0.0))
  checks.check_swept_values(config)
  s.psnr_threshold = float(rec_metrics.PSNR_CAP)
  e = _refused(config)
  assert e.field == 'reconstruction.psnr_threshold' and e.got == rec_metrics.PSNR_CAP
  assert e.allowed == (f'below {rec_metrics.PSNR_CAP:g} dB (PSNRs are capped there: exact '
                       'copies score the cap, so no input would count as recovered)')


def _recorded(monkeypatch, config, points, shape=(8, 8, 1)):
  """The (field, got, bytes, what) of every memory check check_sizes makes."""
  calls = []
  monkeypatch.setattr(memory, 'require_fits',
                      lambda field, got, nbytes, what: calls.append((field, got, nbytes, what)))
  model = object()
  monkeypatch.setattr(memory, 'num_parameters', lambda m, example_shape: (
      1000 if m is model and example_shape == shape else -1))
  pool = types.SimpleNamespace(x=np.zeros((3,) + shape, np.float32))
  checks.check_sizes(config, pool, points, model)
  return calls


def _points():
  return [{'attack': 'imprint', 'batch_size': 8, 'num_batches': 1},
          {'attack': 'imprint', 'batch_size': 16, 'num_batches': 2},
          {'attack': 'analytic', 'batch_size': 4, 'num_batches': 1}]


def test_check_sizes_bounds_every_array_by_its_field(monkeypatch):
  config = _config()
  s = config.reconstruction
  s.trials, s.inversion_trials, s.bootstrap_resamples = 1000, 500, 100
  calls = _recorded(monkeypatch, config, _points())
  d = 64   # 8 x 8 x 1 inputs
  assert calls == [
      ('reconstruction.hidden', (64,), 1000 * 4, 'the honest model (1,000 parameters x 4 bytes)'),
      ('reconstruction.imprint.num_bins', 256, d * 256 * 4,
       'the crafted layer (64 inputs x 256 bins x 4 bytes)'),
      # imprint first; it reads one row per bin; its largest point has 16 x 2 examples
      ('reconstruction.trials', 1000, 1000 * 256 * d * 4,
       "a point's recovered rows (1,000 trials x 256 rows of imprint x 64 inputs x 4 bytes)"),
      ('reconstruction.bootstrap_resamples', 100, 100 * 1000 * 32 * 8,
       "the bootstrap's indices (100 resamples x 1,000 trials x 32 examples of imprint x 8 "
       'bytes)'),
      ('reconstruction.trials', 1000, 1000 * 4 * d * 4,
       "a point's recovered rows (1,000 trials x 4 rows of analytic x 64 inputs x 4 bytes)"),
      ('reconstruction.bootstrap_resamples', 100, 100 * 1000 * 4 * 8,
       "the bootstrap's indices (100 resamples x 1,000 trials x 4 examples of analytic x 8 "
       'bytes)'),
      # inversion has no point here: its centre size, 1
      ('reconstruction.inversion_trials', 500, 500 * 1 * d * 4,
       "a point's recovered rows (500 trials x 1 rows of inversion x 64 inputs x 4 bytes)"),
      ('reconstruction.bootstrap_resamples', 100, 100 * 500 * 1 * 8,
       "the bootstrap's indices (100 resamples x 500 trials x 1 examples of inversion x 8 "
       'bytes)'),
  ]


def test_check_sizes_reads_the_defense_attacks_only_when_a_defense_is_swept(monkeypatch):
  config = _config()
  s = config.reconstruction
  s.attacks = ('analytic',)
  s.defense_attacks = ('imprint',)
  s.model = 'flower_cnn'
  for name in s.defenses.keys():
    s.defenses[name] = ()
  s.defenses.quantize = (8,)
  fields = [(c[0], c[3]) for c in _recorded(monkeypatch, config, _points())]
  assert fields[0] == ('reconstruction.model', 'the honest model (1,000 parameters x 4 bytes)')
  assert [f for f, _ in fields].count('reconstruction.imprint.num_bins') == 1
  assert any('of imprint' in w for _, w in fields)
  s.defenses.quantize = ()
  fields = [(c[0], c[3]) for c in _recorded(monkeypatch, config, _points())]
  assert [f for f, _ in fields] == ['reconstruction.model', 'reconstruction.trials',
                                    'reconstruction.bootstrap_resamples']
  assert not any('imprint' in w for _, w in fields)


def test_check_sizes_refuses_through_the_memory_limit(monkeypatch):
  config = _config()
  config.reconstruction.attacks = ('imprint',)
  monkeypatch.setattr(memory, 'num_parameters', lambda model, example_shape: 10)
  monkeypatch.setattr(memory, 'device_memory', lambda: (64 * 256 * 4 - 1, 'the test limit'))
  pool = types.SimpleNamespace(x=np.zeros((3, 8, 8, 1), np.float32))
  with pytest.raises(validate.ConfigError) as e:
    checks.check_sizes(config, pool, _points(), model=None)
  assert e.value.field == 'reconstruction.imprint.num_bins'
