"""One point of the AMI experiment (Nguyen et al., AISTATS 2023): craft, play, certify, utility.

A point is one LDP mechanism at one epsilon ('none': no LDP). Its key k gives the crafting
(fold_in(k, 0)), the game (1), the certificate (2) and the utility (3) keys. The data of a point
(`data`, what `pipelines.ami.prepare` returns) holds `target_x` [T, d], `target_y`, the
adversary's `crafting_x` and `heldout_x`, the game `pool_x` / `pool_y`, `utility_train` /
`utility_test` ((x, y) pairs), `num_classes`, the fixed-point `encoding`, the client's batch
`defense` (hooks or None), `num_clipped` and `clipped_fraction`. Writes no files, reads no
config: the settings come as a `Settings`.
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import validate
from fl_privacy.attacks.ami import certified
from fl_privacy.attacks.ami import crafting
from fl_privacy.attacks.ami import game
from fl_privacy.eval import metrics as metrics_lib
from fl_privacy.eval import utility
from fl_privacy.mechanisms.codes import mechanism_fn


class Settings(NamedTuple):
  """The static settings of every point (configs/_ami.py documents each field)."""
  batch_size: int
  num_trials: int
  copies: int
  randomize_negatives: bool
  num_neurons: int
  hidden2: int
  learning_rate: float
  max_steps: int
  class_weights: tuple[float, float] | None  # None: balanced
  stop_when_separated: bool
  calibrated_variant: bool
  decision_path: str
  certified_samples: int  # 0: the whole pool
  certified_draws: int
  certified_delta: float
  utility_hidden: tuple[int, ...]
  utility_steps: int
  utility_learning_rate: float
  run_options: dict  # `eval.runner.run_trials` keyword arguments


def craft_targets(key, settings: Settings, data: dict, randomize, ldp: bool):
  """`crafting.craft_targets` on the point's data: (neurons, report, calibrated, predicted)."""
  s = settings
  return crafting.craft_targets(
      key, data['target_x'], data['crafting_x'], data['heldout_x'], randomize, ldp=ldp,
      copies=s.copies, randomize_negatives=s.randomize_negatives, num_neurons=s.num_neurons,
      learning_rate=s.learning_rate, max_steps=s.max_steps, class_weights=s.class_weights,
      stop_when_separated=s.stop_when_separated, calibrated_variant=s.calibrated_variant,
      batch_size=s.batch_size)


def play(key, settings: Settings, data: dict, neurons, mechanism: str, epsilon: float | None,
         randomize, calibrated=None) -> tuple[dict, dict]:
  """`game.play` on the point's data: (outcomes, extra metrics)."""
  s = settings
  return game.play(
      key, neurons, game.GameSide(x=data['target_x'], y=data['target_y']),
      game.GameSide(x=data['pool_x'], y=data['pool_y']), mechanism=mechanism,
      epsilon=epsilon, randomize=randomize, encoding=data['encoding'],
      num_trials=s.num_trials, batch_size=s.batch_size, defense=data.get('defense'),
      decision_path=s.decision_path, mlp_hidden=(s.num_neurons, s.hidden2),
      num_classes=data['num_classes'], calibrated=calibrated, run_options=s.run_options)


def certified_rows(key, settings: Settings, num_pool: int) -> np.ndarray:
  """Indices into the game pool of the certificate's q non-target samples.

  Hoeffding's inequality needs samples independent of the bounded function v: the
  pool is data that neither crafting nor calibration saw (both use only the adversary's
  part), so its rows are. `certified_samples` of them at random without
  replacement (0 = the whole pool: the most q the dataset allows).
  """
  q = int(settings.certified_samples) or num_pool
  validate.require(q <= num_pool, 'ami.certified_samples',
                   f'0 (the whole pool) or <= the game pool ({num_pool} examples)', q)
  return certified.sample_rows(key, num_pool, q)


def certify_point(key, settings: Settings, data: dict, neurons, randomize) -> tuple[dict, dict]:
  """Theorem 1 per target (`certified.certify_targets`); metrics and target 0's draws.

  p = `certified_draws` randomized copies of the target; q = `certified_rows` pool samples
  (never seen by crafting or calibration; key fold_in(key, 2**20)), each randomized once.
  """
  enc = data['encoding']
  held = jnp.asarray(data['pool_x'][certified_rows(jax.random.fold_in(key, 1 << 20), settings,
                                                   len(data['pool_x']))])
  return certified.certify_targets(key, neurons, data['target_x'], held, randomize,
                                   enc.min_value, enc.max_value,
                                   num_draws=settings.certified_draws,
                                   delta=settings.certified_delta)


def run(key, settings: Settings, data: dict, mechanism: str,
        epsilon: float | None) -> tuple[dict[str, Any], dict | None]:
  """All metrics of one (mechanism, epsilon) point, and the certificate's draws (None without
  LDP).

  Metrics: the paper's rule (`tpr_tnr_adv`, `auc`, per-target spread), the calibrated
  variant's `*_calibrated` (scored on the very same trials), crafting diagnostics, timings
  (`craft_s`, `trials_per_s`), the certificate under LDP, and the LDP utility.
  """
  s = settings
  enc = data['encoding']
  ldp = mechanism != 'none'
  randomize = mechanism_fn(mechanism, epsilon, data['pool_x'].shape[1], enc)
  k_craft, k_game, k_cert, k_util = (jax.random.fold_in(key, i) for i in range(4))
  t0 = time.perf_counter()
  neurons, report, calibrated, predicted = craft_targets(k_craft, s, data, randomize, ldp)
  jax.block_until_ready(neurons)
  craft_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  # Our extension (the calibrated bias) is scored on the very same trials as the paper's
  # rule, so the difference is the calibration alone.
  out, extra = play(k_game, s, data, neurons, mechanism, epsilon, randomize, calibrated)
  game_s = time.perf_counter() - t0
  m = metrics_lib.tpr_tnr_adv(out['decision'], out['b'])
  m.update(extra)
  if calibrated is not None:
    m.update(game.calibrated_metrics({'b': out['b'], 'decision': out['decision_variant'],
                                      'score': out['score_variant']}))
  m['trials_per_s'] = s.num_trials / max(game_s, 1e-9)
  m['craft_s'] = craft_s
  m.update(crafting.report_metrics(report))
  m['calibrated_predicted_adv'] = (float(np.nanmean(np.asarray(predicted)))
                                   if s.calibrated_variant else math.nan)
  m.update(game.target_spread(out, neurons.w.shape[0]))
  m['num_clipped'] = data['num_clipped']
  m['clipped_fraction'] = data['clipped_fraction']
  m['auc'] = metrics_lib.roc_auc(out['score'], out['b'])
  t0 = time.perf_counter()
  draws = None
  if ldp:
    cert, draws = certify_point(k_cert, s, data, neurons, randomize)
    m.update(cert)
  cert_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  (x_tr, y_tr), (x_te, y_te) = data['utility_train'], data['utility_test']
  m.update(utility.ldp_accuracy(k_util, x_tr, y_tr, x_te, y_te, data['num_classes'],
                                randomize if ldp else None, hidden=tuple(s.utility_hidden),
                                steps=s.utility_steps, learning_rate=s.utility_learning_rate))
  logging.info('%s eps=%s: craft %.1f s, game %.1f s, certified %.1f s, utility %.1f s; '
               'Adv %.3f', mechanism, epsilon, craft_s, game_s, cert_s,
               time.perf_counter() - t0, m['adv'])
  return m, draws


def recompute_draws(key, settings: Settings, data: dict, mechanism: str,
                    epsilon: float) -> dict:
  """The certificate's draws of the LDP point keyed `key`, exactly as `run` drew them (its
  crafting and certificate keys)."""
  randomize = mechanism_fn(mechanism, epsilon, data['pool_x'].shape[1], data['encoding'])
  neurons, _, _, _ = craft_targets(jax.random.fold_in(key, 0), settings, data, randomize, True)
  _, draws = certify_point(jax.random.fold_in(key, 2), settings, data, neurons, randomize)
  return draws
