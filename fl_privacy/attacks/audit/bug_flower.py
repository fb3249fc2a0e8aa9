"""DP bugs of Flower (flwr 1.42), reproduced through Flower's own DP functions.

Flower's `LocalDpMod` (flwr/clientapp/mod/localdp_mod.py) does, on each reply: clip the update
with `compute_clip_model_update(params, original, clipping_norm)` and add noise with
`add_gaussian_noise_inplace(params, std)`, std = `sensitivity * sqrt(2 ln(1.25 / delta)) /
epsilon` (flwr 1.42 `LocalDpMod.__call__`). Its message layer (serialising every array into
a Message and back) costs about 4 ms a call on our CPUs, so the games call those two Flower
functions directly on the update's numpy arrays (the fast path), and every point checks the
fast path against the whole `LocalDpMod.__call__` on the same numpy seeds (`checks`:
`flower_path_max_abs_diff`, 0 when they agree bit for bit).

The game (client level, one client's uploads, the server reads them): the model w_t is a
float32 vector of length 2; the target's update is a Dirac canary 2C e_1 (above the clip, so
Flower's clip acts) in the in-world and a client that did not train in the out-world (1e-6 C
e_2: an update of exactly 0 makes Flower's clip divide by zero). Score: the upload's
coordinate 0 minus w_t's, summed over the uploads the adversary reads (the optimal statistic
of a Gaussian shift). Relation: zero-out (sensitivity C), as `fl_privacy.flower.audits.dp_games`
audits LocalDpMod.

Flower draws its noise from numpy's global generator: each trial seeds it from its own
generator, and the caller's global state is restored after a game.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from typing import Iterator

import numpy as np

from fl_privacy.attacks.audit import bug_entries as be

DELTA = 1e-5
CANARY = 2.0   # x C
W_T = np.array([0.1, 0.2], np.float32)
ADVERSARY = 'the server, reading every upload'
LIBRARY = 'Flower (flwr 1.42.0), LocalDpMod: compute_clip_model_update + add_gaussian_noise_inplace'


def classic_std(sensitivity: float, epsilon: float, delta: float) -> float:
  """The std `LocalDpMod.__call__` adds (flwr 1.42): the classic Gaussian formula, valid as
  an (epsilon, delta) guarantee for epsilon < 1 only (Dwork & Roth 2014, Theorem A.1)."""
  return float(sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon)


def analytic_epsilon_argument(target: float, delta: float, rounds: int = 1) -> float:
  """The `epsilon` argument that makes LocalDpMod's classic std (sensitivity C) the analytic
  Gaussian std whose `rounds`-fold composition is exactly (target, delta)-DP: the twins'
  configuration of LocalDpMod."""
  std = math.sqrt(rounds) / be.gaussian_mu(float(target), float(delta))
  return classic_std(1.0, 1.0, delta) / std


@contextlib.contextmanager
def _numpy_global_state() -> Iterator[None]:
  state = np.random.get_state()
  try:
    yield
  finally:
    np.random.set_state(state)


def _update(present: bool, clip: float) -> np.ndarray:
  v = np.zeros(2, np.float64)
  if present:
    v[0] = CANARY * clip
  else:
    v[1] = 1e-6 * clip
  return v


def _flower_calls():
  """Flower's own DP functions, called from `fl_privacy.flower.audits.localdp_calls` (Flower
  code lives in fl_privacy/flower, the optional extra; this catalog loads it by name)."""
  return importlib.import_module('fl_privacy.flower.audits.localdp_calls')


def localdp_upload(rng: np.random.Generator, update: np.ndarray, clip: float,
                   sensitivity: float, epsilon: float, delta: float) -> np.ndarray:
  """One reply through LocalDpMod's two Flower functions (module docstring), numpy's global
  generator seeded from `rng`."""
  return _flower_calls().clip_and_noise(rng, W_T, update, clip,
                                        classic_std(sensitivity, epsilon, delta))


def localdp_mod_upload(rng: np.random.Generator, update: np.ndarray, clip: float,
                       sensitivity: float, epsilon: float, delta: float) -> np.ndarray:
  """The same reply through the whole `LocalDpMod.__call__` (Flower's Message layer)."""
  return _flower_calls().through_mod(rng, W_T, update, clip, sensitivity, epsilon, delta)


def localdp_game(clip: float, sensitivity: float, epsilon: float, rounds: int = 1,
                 delta: float = DELTA, checks: int = 20) -> be.Game:
  """The zero-out game of `rounds` LocalDpMod uploads (module docstring)."""
  def world(rng, present):
    u = _update(present, clip)
    return sum(float(localdp_upload(rng, u, clip, sensitivity, epsilon, delta)[0] - W_T[0])
               for _ in range(int(rounds)))

  def check(seed):
    worst = 0.0
    with _numpy_global_state():
      for i in range(int(checks)):
        u = _update(i % 2 == 0, clip)
        a = localdp_upload(np.random.default_rng([seed, i]), u, clip, sensitivity, epsilon,
                           delta)
        b = localdp_mod_upload(np.random.default_rng([seed, i]), u, clip, sensitivity,
                               epsilon, delta)
        worst = max(worst, float(np.max(np.abs(a - b))))
    return {'flower_path_max_abs_diff': worst, 'flower_path_checked': int(checks)}

  game = be.numpy_game(world, 'gaussian', check)

  def play(seed, n):
    with _numpy_global_state():
      return game.play(seed, n)
  return be.Game(play, 'gaussian', check)


def _claim(epsilon: float, stated_by: str) -> be.Claim:
  return be.Claim(float(epsilon), DELTA, 'client', 'zero_out', ADVERSARY, 'none', stated_by)


# ----------------------------------------------------------------------- entries ---


def _sensitivity_build(variant, ratio):
  if variant == 'bug':
    return localdp_game(1.0, float(ratio), 10.0)
  return localdp_game(1.0, 1.0, analytic_epsilon_argument(10.0, DELTA))


def _classic_build(variant, stated):
  if variant == 'bug':
    return localdp_game(1.0, 1.0, float(stated))
  return localdp_game(1.0, 1.0, analytic_epsilon_argument(float(stated), DELTA))


def _rounds_build(variant, rounds):
  t = int(rounds)
  if variant == 'bug':
    return localdp_game(1.0, 1.0, 1.0, rounds=t)
  return localdp_game(1.0, 1.0, analytic_epsilon_argument(1.0, DELTA, t), rounds=t)


def entries() -> tuple[be.Entry, ...]:
  """The Flower entries of the catalog."""
  mu = lambda std: 1.0 / std  # noqa: E731  zero-out sensitivity C = 1
  return (
      be.Entry(
          'flower_localdp_sensitivity',
          'LocalDpMod calibrates its noise to a `sensitivity` argument decoupled from '
          '`clipping_norm` (1e-4 beside a clip of 1.0: noise std 4.8e-5)',
          'a Flower deployment configured LocalDpMod(clipping_norm=1.0, sensitivity=1e-4, '
          'epsilon=10, delta=1e-5) (issue 50 of this project; the argument is documented in '
          'flwr 1.42 localdp_mod.py); docs/experiments/flower_audit.md',
          LIBRARY, 'Flower canary audit',
          lambda s: _claim(10.0, 'LocalDpMod epsilon argument'),
          _sensitivity_build,
          lambda r: be.gaussian_epsilon(mu(classic_std(r, 10.0, DELTA)), DELTA),
          knob='sensitivity / clipping_norm', severity=1e-4,
          severities=(1e-4, 1e-2, 0.3, 0.6, 0.8), milder='higher', trials=2000,
          needs=('flower',), verified='flwr 1.42 LocalDpMod source read (localdp_mod.py)'),
      be.Entry(
          'flower_localdp_classic_formula',
          'LocalDpMod uses the classic Gaussian formula sqrt(2 ln(1.25/delta)) / epsilon '
          'beyond epsilon 1, where it does not give (epsilon, delta)-DP (a stated 10 is 10.39)',
          'flwr 1.42 localdp_mod.py (the std formula); Dwork and Roth, "The Algorithmic '
          'Foundations of Differential Privacy", 2014, Theorem A.1 (epsilon < 1); Balle and '
          'Wang, "Improving the Gaussian Mechanism for Differential Privacy", ICML 2018, '
          'arXiv:1805.06530',
          LIBRARY, 'Flower canary audit',
          lambda e: _claim(float(e), 'LocalDpMod epsilon argument'),
          _classic_build,
          lambda e: be.gaussian_epsilon(mu(classic_std(1.0, e, DELTA)), DELTA),
          knob='stated epsilon', severity=10.0, severities=(10.0, 15.0, 20.0, 30.0),
          milder='lower', trials=8000, needs=('flower',),
          verified='flwr 1.42 LocalDpMod source read'),
      be.Entry(
          'flower_localdp_no_composition',
          'LocalDpMod states its per-upload epsilon and composes nothing over rounds: a '
          'deployment reporting it for the whole training undercounts T rounds',
          'flwr 1.42 LocalDpMod (no accountant); Flower issue #605 (a DP tracking issue whose '
          '2024 comment says the since-removed dp-sgd example summed epsilon and delta over '
          'clients by basic composition)',
          LIBRARY, 'Flower canary audit',
          lambda t: _claim(1.0, 'LocalDpMod epsilon argument, reported for all rounds'),
          _rounds_build,
          lambda t: be.gaussian_epsilon(math.sqrt(t) * mu(classic_std(1.0, 1.0, DELTA)), DELTA),
          knob='rounds', severity=10, severities=(2, 4, 10, 30), milder='lower', trials=4000,
          needs=('flower',),
          verified='issue #605 thread read through the search tool (title "Differential '
                   'Privacy"); the example it names was not read'),
  )
