"""Reconstruction trials vmapped: chunk-free outcomes, traced knobs with the constants' numbers,
one program for a learning-rate sweep and an adaptive server's grid, the public-only tuning,
the clients' draw, and the Gaussian input mechanism's epsilon label (issue 41)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sp_stats

from fl_privacy import defenses
from fl_privacy import models
from fl_privacy.attacks.reconstruction import game
from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.eval import runner
from fl_privacy.pipelines import reconstruction_defenses

_B, _BINS, _ROWS, _PUBLIC = 4, 32, 96, 40


@functools.lru_cache(maxsize=1)
def _setup():
  """A small pool of 8x8 images on the 8-bit grid, a public split, thresholds, and one
  compiled imprint trial (MLP of 16) shared by every test here."""
  rng = np.random.default_rng(0)
  x = (rng.integers(0, 256, size=(_ROWS, 8, 8, 1)) / 255.0).astype(np.float32)
  y = rng.integers(0, 10, size=_ROWS).astype(np.int32)
  cuts = jnp.asarray(imprint.thresholds(x[:_PUBLIC], _BINS), jnp.float32)
  g = game.Game('imprint', models.MLP(hidden=(16,), num_classes=10), batch_size=_B,
                num_bins=_BINS)
  return jnp.asarray(x), jnp.asarray(y), cuts, g, game.make_trial(g)


# Every run of the shared trial has this many trials in one vmapped group: one compilation.
_TRIALS = 6


def _run(trials, knobs, chunk_size=None, batch_bytes=None, key=3):
  x, y, cuts, _, trial_fn = _setup()
  # The pipeline's precision (`reconstruction_runs.simulate`), so that its runs below reuse
  # this program (the precision is part of a program's identity).
  with jax.default_matmul_precision('highest'):
    return runner.run_trials(trial_fn, jax.random.key(key), trials, chunk_size=chunk_size,
                             batch_bytes=batch_bytes, progress=False,
                             args=(x, y, cuts, jnp.int32(_B), jnp.int32(0), knobs))


def _vmapped(g, trials, key=3):
  """`(knobs) -> outcomes` of `trials` trials of game `g`, keyed as the runner keys them,
  one vmapped program (knobs None: the game's constants)."""
  x, y, cuts, _, _ = _setup()
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(key), i))(jnp.arange(trials))
  fn = jax.jit(jax.vmap(lambda k, kn: game.run(g, k, x, y, cuts, jnp.int32(_B), kn),
                        in_axes=(0, None)))
  def run(kn):
    with jax.default_matmul_precision('highest'):
      return jax.tree.map(np.asarray, fn(keys, kn))
  return run


def test_a_points_trials_do_not_depend_on_the_chunk_or_the_group_width():
  kn = game.knobs(32.0, 0.1, _ROWS)
  wide = _run(_TRIALS, kn)                                    # one vmapped group
  narrow = _run(_TRIALS, kn, chunk_size=4, batch_bytes=1)     # one at a time, two chunks
  np.testing.assert_array_equal(wide['index'], narrow['index'])
  np.testing.assert_array_equal(wide['valid'], narrow['valid'])
  np.testing.assert_allclose(wide['recovered'], narrow['recovered'], atol=1e-5)


def test_traced_knobs_give_the_numbers_of_constants_and_compile_once():
  _, _, _, g, _ = _setup()
  # The constants' program: the same game with its restore scale and rate baked in.
  baked = _vmapped(g, _TRIALS)(None)
  got = _run(_TRIALS, g.default_knobs(_ROWS))
  # Decisions and draws identical; pixels to float rounding (XLA folds the constants in
  # another order: 6e-7 measured), far inside the 1/255 of "exact".
  for name in ('index', 'valid', 'label'):
    np.testing.assert_array_equal(got[name], baked[name], name)
  np.testing.assert_allclose(got['recovered'], baked['recovered'], atol=1e-5)
  # Another restore scale and rate: no new compilation, other numbers.
  size = runner._compiled.cache_info().misses  # pylint: disable=protected-access
  other = _run(_TRIALS, game.knobs(3200.0, 0.01, _ROWS))
  assert runner._compiled.cache_info().misses == size  # pylint: disable=protected-access
  assert not np.allclose(other['recovered'], got['recovered'])


def test_clients_are_drawn_without_replacement_from_the_real_rows_only():
  keys = jax.random.split(jax.random.key(0), 400)
  idx = np.asarray(jax.vmap(lambda k: game.draw(k, 50, jnp.int32(20), 6))(keys))
  assert idx.max() < 20 and idx.min() >= 0
  assert all(len(set(row)) == 6 for row in idx)
  counts = np.bincount(idx.ravel(), minlength=20)
  # Each of the 20 rows is in a client with probability 6/20: 120 of 400 expected, sd ~9.2.
  assert counts.min() > 120 - 5 * 9.2 and counts.max() < 120 + 5 * 9.2, counts


def test_under_update_noise_a_larger_restore_scale_recovers_more():
  # The probe: the imprint's signal is the server's choice, so noise that erases it at
  # restore_scale 32 does not at 3,200. 32 clients of 4, the same clients for both.
  noise = defenses.make('update_noise', sigma=1e-4)
  x, _, _, g, _ = _setup()
  noisy = _vmapped(game.Game('imprint', g.model, batch_size=_B, num_bins=_BINS, hooks=noise),
                   16, key=1)
  outs = [noisy(game.knobs(r, 0.1, _ROWS)) for r in (32.0, 3200.0)]
  from fl_privacy.attacks.reconstruction import metrics  # pylint: disable=g-import-not-at-top
  rec = [sum(metrics.trial_scores(o['recovered'][t], o['valid'][t],
                                  np.asarray(x)[np.asarray(o['index'][t])])['recovered']
             for t in range(16)) for o in outs]
  # Clopper-Pearson intervals over the 64 examples do not overlap (taking examples as
  # independent: clients of 4 in 32 bins rarely collide).
  lo_hi = [sp_stats.binomtest(k, 64).proportion_ci() for k in rec]
  assert lo_hi[0].high < lo_hi[1].low, rec


def test_the_adaptive_server_tunes_on_its_own_pool_only(monkeypatch):
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import reconstruction_runs as runs  # pylint: disable=g-import-not-at-top
  x, y, cuts, _, trial_fn = _setup()
  config = digits.get_config('smoke')
  s = config.reconstruction
  s.adaptive.restore_scales, s.adaptive.trials = (32.0, 3200.0), _TRIALS
  s.adaptive.structures, s.adaptive.rounds = ('cumulative', 'sparse'), (1, 2)
  s.psnr_threshold = 30.0
  s.imprint.num_bins = _BINS
  # The clients' pool and the public split (the utility's test data) are NaN: a tuning that
  # read either would score nothing. The thresholds are given (they come from the public
  # split, which the server knows); the tuning pool is real.
  nan = jnp.full_like(x, jnp.nan)
  state = dict(x=nan, y=y, x_tune=x, y_tune=y, x_public=np.asarray(nan), pool_size=_ROWS,
               tune_size=_PUBLIC, public_size=_PUBLIC, cuts=cuts, grid=None,
               cuts_by={('quantile', _BINS): cuts})
  monkeypatch.setattr(runs, 'program', lambda *a, **k: (trial_fn, _B))
  p = dict(attack='imprint', batch_size=_B, num_batches=1, epochs=1, learning_rate=0.1)
  chosen = runs.tune(config, state, p, (None,), 0, jax.random.key(0))
  # 2 restore scales x 2 structures in one round, then the best at 2 rounds.
  assert chosen['examples'] == _TRIALS * _B and len(chosen['candidates']) == 5
  assert chosen['recovered'] > 0
  assert all(c['recovered'] > 0 for c in chosen['candidates'])
  assert chosen['restore_scale'] in (32.0, 3200.0) and chosen['rounds'] in (1, 2)
  assert [c['rounds'] for c in chosen['candidates']] == [1, 1, 1, 1, 2]
  # The tuning draws come from the tuning pool's rows only and from a key stream of their own.
  out = runs.simulate(config, state, p, (None,), 0, jax.random.key(0), public=True,
                      trials=_TRIALS)
  assert np.asarray(out['index']).max() < _PUBLIC
  private = runs.simulate(config, dict(state, x=x), p, (None,), 0, jax.random.key(0),
                          trials=_TRIALS)
  assert not np.array_equal(np.asarray(out['index']), np.asarray(private['index']))


def test_the_tuning_pool_is_held_out_of_the_clients_split():
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import reconstruction  # pylint: disable=g-import-not-at-top
  config = digits.get_config()
  config.reconstruction.adaptive.pool = 300
  clients, tuning = reconstruction.tuning_split(config, 1438, True)
  assert len(tuning) == 300 and len(clients) == 1138
  assert not set(clients) & set(tuning)
  assert sorted(set(clients) | set(tuning)) == list(range(1438))
  # Seeded: the same rows again; another seed, other rows.
  np.testing.assert_array_equal(reconstruction.tuning_split(config, 1438, True)[1], tuning)
  config.seed = 1
  assert not np.array_equal(reconstruction.tuning_split(config, 1438, True)[1], tuning)
  # Without the adaptive server nothing is held out.
  clients, tuning = reconstruction.tuning_split(config, 1438, False)
  assert len(clients) == 1438 and len(tuning) == 0


def test_the_learning_rate_sweep_repeats_only_multi_step_points():
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import reconstruction  # pylint: disable=g-import-not-at-top
  config = digits.get_config()
  s = config.reconstruction
  s.attacks, s.multi_step_attacks = ('imprint',), ('imprint',)
  s.batch_sizes, s.num_batches, s.epochs = (8,), (1, 2), (1, 2)
  s.learning_rates = (0.01, 0.1)
  got = [(p['num_batches'], p['epochs'], p['learning_rate'])
         for p in reconstruction.grid(config)]
  assert got == [(1, 1, 0.1), (2, 1, 0.1), (1, 2, 0.1), (2, 1, 0.01), (1, 2, 0.01)]


def test_the_gaussian_input_mechanisms_epsilon_is_its_exact_guarantee():
  # Cross-check of dp-accounting's epsilon with the Gaussian mechanism's exact privacy profile
  # (Balle & Wang 2018, Theorem 8): delta(eps) = Phi(D / 2s - eps s / D) - e^eps Phi(-D / 2s -
  # eps s / D).
  setting = defenses.Setting(num_classes=10, image_shape=(8, 8, 1), batch_size=8,
                             num_examples=8, epochs=1, steps_per_epoch=1, rounds=1)
  assert reconstruction_defenses.input_diameter(setting) == pytest.approx(8.0)
  for nominal in (8.0, 1.0, 0.5):
    m = reconstruction_defenses.gaussian_epsilon(nominal, setting, 1e-5)
    d, s, e = 8.0, m['gaussian_sigma'], m['ldp_epsilon']
    delta = (sp_stats.norm.cdf(d / (2 * s) - e * s / d) -
             math.exp(e) * sp_stats.norm.cdf(-d / (2 * s) - e * s / d))
    assert delta == pytest.approx(1e-5, rel=0.05), (nominal, m)
    # The nominal calibration is loose: the exact epsilon is below it.
    assert e < nominal


def test_the_adaptive_grid_tries_the_fixed_setting_first_and_only_widths_that_fit():
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import reconstruction_runs as runs  # pylint: disable=g-import-not-at-top
  config = digits.get_config()
  a = config.reconstruction.adaptive
  a.restore_scales, a.placements, a.num_bins = (3200.0, 32.0), ('uniform', 'quantile'), (64, 4)
  a.structures = ('sparse', 'cumulative')
  got = runs.candidates(config, 8)
  # A tie keeps the paper's server: its setting is tried first.
  assert got[0] == (32.0, 'quantile', 256, 'cumulative') == runs.fixed_setting(config)
  assert len(got) == len(set(got)) == 2 * 2 * 2 * 2      # 4 bins cannot hold 8 examples
  assert {c[2] for c in got} == {256, 64} and {c[3] for c in got} == {'sparse', 'cumulative'}


def test_an_ldp_epsilon_states_how_often_the_run_releases_each_example():
  from configs import digits  # pylint: disable=g-import-not-at-top
  config = digits.get_config()
  ten_rounds = defenses.Setting(image_shape=(8, 8, 1), batch_size=8, num_examples=256, epochs=2,
                                steps_per_epoch=32, rounds=10)
  for name, releases in (('bitrand', 20), ('ldp_sgd', 10)):
    conf = reconstruction_defenses.swept_defense(config, {}, dict(defense=name, strength=1.0),
                                                 ten_rounds)
    assert conf.metrics == {'ldp_epsilon': 1.0, 'ldp_releases': releases}, name


def test_the_adaptive_server_joins_the_multi_step_grid_only_when_asked():
  from configs import digits  # pylint: disable=g-import-not-at-top
  from fl_privacy.pipelines import reconstruction  # pylint: disable=g-import-not-at-top
  config = digits.get_config()
  points = reconstruction.grid(config)
  at = lambda: [p for p in points if reconstruction.adaptive_at(config, p)]
  assert at() == [reconstruction.center_point(config, 'imprint')]
  config.reconstruction.adaptive.multi_step = True
  got = at()
  assert reconstruction.center_point(config, 'imprint') in got
  assert all(p['attack'] == 'imprint' for p in got)
  assert {(p['num_batches'], p['epochs']) for p in got} == {(1, 1), (2, 1), (4, 1), (8, 1),
                                                            (1, 2), (1, 4)}
  assert len(got) == 1 + 5 * 4      # the centre, and 5 multi-step points at 4 learning rates
  config.reconstruction.adaptive.restore_scales = ()
  assert not at()
