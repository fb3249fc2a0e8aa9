"""The parts of a DP-bug catalog entry: its claim, its game and the entry itself.

A catalog entry (`Entry`) is one documented DP bug of an FL stack, reproduced through the code
it lives in, beside its CORRECT TWIN (the same claim, honestly met). What an entry holds:

- `claim(severity) -> Claim`: what the buggy stack states: epsilon, delta, unit (record or
  client), neighbouring relation, adversary, sampling, and (where an accountant states it) the
  dp-accounting event whose privacy profile is the claim's whole curve.
- `build(variant, severity) -> Game`: the buggy mechanism (`variant='bug'`) or its twin
  (`'twin'`) as a canary game: `Game.play(seed, n)` plays n independent games, each with its
  own fair coin (canary in or out, as the one-run bounds assume), and returns the coins and
  the adversary's scores (higher = canary in).
- `true_epsilon(severity)`: the epsilon of the buggy mechanism that really runs, where
  dp-accounting can compute it (None where it cannot, inf where nothing is random between
  the worlds).
- `knob`, `severity`, `severities`: where the bug has a strength (a sensitivity ratio, a
  number of rounds, a batch size), the documented value and the values the severity sweep
  tries; `milder` says which direction is the milder bug.

Games are written against two helpers: `numpy_game` (one Python call per trial, for code
that is numpy: Flower's DP functions, Opacus) and `jax_game` (a pure trial vmapped by
`eval.runner`, for our own defenses). Every trial's randomness is derived from the point's
seed and the trial index (`np.random.SeedSequence([seed, i])`, `fold_in(key(seed), i)`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Sequence

import numpy as np

VARIANTS = ('bug', 'twin')
THREATS = ('mechanism audit', 'training audit', 'Flower canary audit', 'side channel',
           'out of reach')
CURVES = ('gaussian', 'other')
UNITS = ('record', 'client')
RELATIONS = ('add_remove', 'replace_one', 'zero_out')


@dataclasses.dataclass(frozen=True)
class Claim:
  """What a stack states about its mechanism.

  Attributes:
    epsilon, delta: the stated (epsilon, delta).
    unit: 'record' or 'client'.
    relation: 'add_remove', 'replace_one' or 'zero_out' (a client that did not train).
    adversary: who reads what, in words (e.g. 'the server, every upload').
    sampling: 'poisson', 'shuffle', 'without_replacement' or 'none'.
    stated_by: where the number comes from (an accountant, an argument, a formula).
    event: the dp-accounting event the stated accountant composes, whose privacy profile is
      the claim's whole curve (None where the claim is a single (epsilon, delta) point).
  """
  epsilon: float
  delta: float
  unit: str
  relation: str
  adversary: str
  sampling: str
  stated_by: str
  event: Any = None

  def __post_init__(self):
    if self.unit not in UNITS:
      raise ValueError(f'unit must be one of {UNITS} (got {self.unit!r})')
    if self.relation not in RELATIONS:
      raise ValueError(f'relation must be one of {RELATIONS} (got {self.relation!r})')
    if not (self.epsilon > 0 and 0 < self.delta < 1):
      raise ValueError(f'a claim needs epsilon > 0 and delta in (0, 1) (got '
                       f'{self.epsilon}, {self.delta})')

  def profile(self, epsilons: Sequence[float]) -> list[float] | None:
    """The claimed delta(epsilon) on `epsilons` (PLD accountant), None without an event."""
    if self.event is None:
      return None
    import dp_accounting  # pylint: disable=g-import-not-at-top
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(self.event)
    return [float(acc.get_delta(float(e))) for e in epsilons]


@dataclasses.dataclass(frozen=True)
class Game:
  """A mechanism as a canary game.

  Attributes:
    play: `(seed, n) -> (present bool [n], scores float [n])`, n independent games.
    curve: 'gaussian' when the released mechanism's trade-off curve is Gaussian (one Gaussian
      shift, or a composition of them), so the GDP bound counts; 'other' otherwise (only the
      Clopper-Pearson and one-run bounds, and the claimed profile, count).
    checks: `(seed) -> {name: value}`, optional: how the game's fast path agrees with the
      library's whole code path (e.g. Flower's `LocalDpMod.__call__` on the same seeds).
    event: the dp-accounting event this variant's own accountant states, when it is not the
      claim's (a twin accounted correctly states its own curve, which meets the stated
      (epsilon, delta) but need not lie under the buggy accountant's curve elsewhere).
  """
  play: Callable[[int, int], tuple[np.ndarray, np.ndarray]]
  curve: str = 'gaussian'
  checks: Callable[[int], dict] | None = None
  event: Any = None

  def __post_init__(self):
    if self.curve not in CURVES:
      raise ValueError(f'curve must be one of {CURVES} (got {self.curve!r})')


@dataclasses.dataclass(frozen=True)
class Entry:
  """One documented DP bug and its correct twin (module docstring).

  Attributes:
    name: a short identifier (the `bug` param of its results rows).
    title: one line: what is wrong.
    source: where it is documented (issue / PR number or paper: authors, title, venue, arXiv).
    library: the library (and version) it lives in, and the code path reproduced.
    threat: one of `THREATS`: the audit that fits.
    claim: `(severity) -> Claim` (what the buggy stack states).
    build: `(variant, severity) -> Game`; None for an entry out of this audit's reach.
    true_epsilon: `(severity) -> float | None` at the claim's delta.
    knob, severity, severities, milder: the bug's strength (see the module docstring);
      `milder` is 'higher' or 'lower' (which direction of the knob is the milder bug).
    needs: optional extras the builder imports ('torch' for Opacus).
    trials: the games a point plays by default (scaled by the config's `trial_scale`).
    reach: why an out-of-reach entry is out of reach, or what the game leaves out.
    verified: what of the source was read (e.g. 'issue text read'), or why it was not.
  """
  name: str
  title: str
  source: str
  library: str
  threat: str
  claim: Callable[[float | None], Claim]
  build: Callable[[str, float | None], Game] | None
  true_epsilon: Callable[[float | None], float | None] = lambda s: None
  knob: str | None = None
  severity: float | None = None
  severities: tuple[float, ...] = ()
  milder: str = 'higher'
  needs: tuple[str, ...] = ()
  trials: int = 4000
  reach: str = ''
  verified: str = ''

  def __post_init__(self):
    if self.threat not in THREATS:
      raise ValueError(f'{self.name}: threat must be one of {THREATS} (got {self.threat!r})')
    if (self.build is None) != (self.threat == 'out of reach'):
      raise ValueError(f'{self.name}: exactly the out-of-reach entries have no builder')
    if self.milder not in ('higher', 'lower'):
      raise ValueError(f'{self.name}: milder must be higher or lower (got {self.milder!r})')
    if self.severities and self.knob is None:
      raise ValueError(f'{self.name}: severities need a knob')


# --------------------------------------------------------------------------- games ---


def numpy_game(world: Callable[[np.random.Generator, bool], float], curve: str = 'gaussian',
               checks=None) -> Game:
  """A `Game` from `world(rng, present) -> score`, one Python call per trial; trial i's
  generator is `default_rng(SeedSequence([seed, i]))`, its coin the generator's first draw."""
  def play(seed: int, n: int):
    present = np.zeros(n, bool)
    scores = np.zeros(n, np.float64)
    for i in range(int(n)):
      rng = np.random.default_rng(np.random.SeedSequence([int(seed), i]))
      present[i] = rng.random() < 0.5
      scores[i] = float(world(rng, bool(present[i])))
    return present, scores
  return Game(play, curve, checks)


def jax_game(world: Callable[..., Any], theta: Sequence[float], curve: str = 'gaussian',
             event: Any = None) -> Game:
  """A `Game` from a pure `world(key, present, theta) -> score`, vmapped by `eval.runner`
  (trial i's key `fold_in(key(seed), i)`, its coin a fair Bernoulli of that key).

  `theta` (the mechanism's numbers, a float32 array) is an argument of the compiled program,
  so one compilation serves every severity; `world` should be a module-level function (the
  runner caches its compilation by identity)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fl_privacy.eval import runner  # pylint: disable=g-import-not-at-top
  trial = _fair_coin(world)
  args = (jnp.asarray(np.asarray(theta, np.float32)),)

  def play(seed: int, n: int):
    out = runner.run_trials(trial, jax.random.key(int(seed)), int(n), args=args,
                            progress=False)
    return np.asarray(out['present'], bool), np.asarray(out['score'], np.float64)
  return Game(play, curve, event=event)


@functools.lru_cache(maxsize=None)
def _fair_coin(world):
  # One trial function per world (cached: the runner caches compilations by identity).
  from fl_privacy.attacks.audit import dp_canary  # pylint: disable=g-import-not-at-top
  return dp_canary.fair_coin(world)


# ---------------------------------------------------------------------- Gaussians ---


def gaussian_epsilon(mu: float, delta: float) -> float:
  """Epsilon at `delta` of the Gaussian mechanism of mu = sensitivity / std (dp-accounting's
  analytic formula, Balle & Wang 2018); inf for mu = inf."""
  if math.isinf(mu):
    return math.inf
  from fl_privacy.eval import auditing  # pylint: disable=g-import-not-at-top
  return auditing.gdp_epsilon(float(mu), float(delta))


@functools.lru_cache(maxsize=None)
def gaussian_mu(epsilon: float, delta: float) -> float:
  """The mu = sensitivity / std whose Gaussian mechanism is exactly (epsilon, delta)-DP."""
  lo, hi = 1e-4, 1.0
  while gaussian_epsilon(hi, delta) < epsilon:
    lo, hi = hi, 2 * hi
  for _ in range(80):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if gaussian_epsilon(mid, delta) < epsilon else (lo, mid)
  return lo


def gaussian_event(mu: float, compositions: int = 1):
  """The dp-accounting event of `compositions` Gaussian releases of mu each."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  one = dp_accounting.GaussianDpEvent(1.0 / float(mu))
  return one if compositions == 1 else dp_accounting.SelfComposedDpEvent(one, compositions)


def event_epsilon(event, delta: float) -> float:
  """Epsilon at `delta` of a dp-accounting event (PLD accountant)."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  acc = dp_accounting.pld.PLDAccountant()
  acc.compose(event)
  return float(acc.get_epsilon(float(delta)))
