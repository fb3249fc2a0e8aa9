"""Privacy accounting, declared per mechanism: one function turns a declaration into epsilon.

An epsilon means nothing without four facts beside it, so every DP mechanism of fl-privacy
declares them in a `Declaration`:

- `unit`: what one neighbouring step changes, a `record` (one training example) or a whole
  `client` (its whole dataset; a client-level guarantee implies the record-level one).
- `relation`: `add_remove` (one unit added or removed) or `replace_one` (one unit replaced).
  The Gaussian mechanism's L2 sensitivity follows from it and from where the clip acts: one
  clipped contribution added or removed moves a sum by at most C, one replaced by up to 2C.
  `sensitivity` holds that factor (in units of the clip norm C).
- `adversary`: whom the guarantee holds against: `server` (the server, which reads every
  upload and picks who takes part) or `aggregate` (parties who see only the aggregate or the
  global model; the server that reads uploads before its own noise is not among them).
- `sampling`: what amplifies it: `poisson` (each unit joins each composition independently with
  probability `sampling_rate`), `without_replacement` (a fixed-size sample of `sample_size` of
  `population`), `shuffle` or `none` (no amplification: a shuffled epoch touches each record
  exactly once, so one epoch is one release of it).

`epsilon(declaration, noise_multiplier, delta=...)` and `noise_multiplier_for(declaration,
target_epsilon, delta=...)` are the only places that call dp-accounting (Google's
`dp_accounting`; RDP by default, PLD on request). The event composed is the Gaussian mechanism
with noise multiplier z / sensitivity (dp-accounting's Gaussian event has sensitivity 1),
Poisson-subsampled (truncated to the maximum batch when `max_batch_size` is set and the PLD
accountant runs; `dp_accounting.TruncatedSubsampledGaussianDpEvent`), subsampled without
replacement (RDP only, replace-one, Wang et al. 2019) or not at all, composed `compositions`
times. Mechanisms that are pure epsilon-DP per release (LDP-SGD's randomizer) declare
`pure_epsilon` instead of a noise multiplier; they compose by basic composition.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging as std_logging
import math
import threading
from typing import Any

from absl import logging
import dp_accounting

UNITS = ('record', 'client')
RELATIONS = ('add_remove', 'replace_one')
ADVERSARIES = ('server', 'aggregate')
SAMPLINGS = ('poisson', 'without_replacement', 'shuffle', 'none')
ACCOUNTANTS = ('rdp', 'pld')

_NR = dp_accounting.privacy_accountant.NeighboringRelation


@dataclasses.dataclass(frozen=True)
class Declaration:
  """What a DP mechanism guarantees, and to whom (see the module docstring).

  Attributes:
    mechanism: the defense or mechanism name (`dp_sgd`, `update_dp`, ...).
    unit: one of `UNITS`.
    relation: one of `RELATIONS`.
    adversary: one of `ADVERSARIES`.
    sampling: one of `SAMPLINGS`.
    sensitivity: L2 sensitivity in units of the clip norm under `relation` (1 or 2).
    compositions: how many releases of the unit are composed (steps, epochs or rounds).
    sampling_rate: q of `poisson` sampling (1 otherwise).
    population: N of `without_replacement` (or the dataset size behind `poisson`).
    sample_size: m of `without_replacement`.
    max_batch_size: the truncation of a Poisson batch (None: not truncated).
    pure_epsilon: per-release epsilon of a pure-DP mechanism (then no noise multiplier).
    note: how the claim is calibrated, in words (e.g. per round).
  """
  mechanism: str
  unit: str
  relation: str
  adversary: str
  sampling: str
  sensitivity: float = 1.0
  compositions: int = 1
  sampling_rate: float = 1.0
  population: int | None = None
  sample_size: int | None = None
  max_batch_size: int | None = None
  pure_epsilon: float | None = None
  note: str = ''

  def __post_init__(self):
    for field, allowed in (('unit', UNITS), ('relation', RELATIONS),
                           ('adversary', ADVERSARIES), ('sampling', SAMPLINGS)):
      if getattr(self, field) not in allowed:
        raise ValueError(f'{field} must be one of {allowed} (got {getattr(self, field)!r})')
    if not self.sensitivity > 0:
      raise ValueError(f'sensitivity must be > 0 (got {self.sensitivity})')
    if int(self.compositions) < 1:
      raise ValueError(f'compositions must be >= 1 (got {self.compositions})')
    if not 0 < self.sampling_rate <= 1:
      raise ValueError(f'sampling_rate must be in (0, 1] (got {self.sampling_rate})')
    if self.sampling == 'without_replacement':
      n, m = self.population, self.sample_size
      if not (isinstance(n, int) and isinstance(m, int) and 0 < m <= n):
        raise ValueError(f'without_replacement needs 0 < sample_size <= population (got '
                         f'{m} of {n})')
      if self.relation != 'replace_one':
        raise ValueError('sampling without replacement is accounted for replace_one only')
    if self.sampling == 'poisson' and self.relation != 'add_remove':
      raise ValueError('Poisson sampling is accounted for add_remove only')

  @property
  def level(self) -> str:
    """'record-level' or 'client-level', as tables print it."""
    return f'{self.unit}-level'


def describe(decl: Declaration) -> dict[str, Any]:
  """The flat fields a results point carries beside its `dp_epsilon`."""
  return {'dp_unit': decl.unit, 'dp_relation': decl.relation, 'dp_adversary': decl.adversary,
          'dp_sampling': decl.sampling, 'dp_compositions': int(decl.compositions),
          'dp_sampling_rate': float(decl.sampling_rate)}


# The RDP accountant logs one warning per fractional order whose series does not converge and
# drops that order (epsilon stays a valid bound): hundreds of lines per calibration. They are
# muted in the thread that accounts, by a filter on absl's logger, and nowhere else: changing
# the global verbosity and restoring it raced when two trainings were accounted at once
# (`pipelines.ahead`), and left the run's log at ERROR for good.
_MUTED = threading.local()


class _MuteAccounting(std_logging.Filter):

  def filter(self, record):
    return record.levelno >= std_logging.ERROR or not _muted()


def _muted() -> bool:
  """Whether records below ERROR logged by this thread are dropped now."""
  return getattr(_MUTED, 'depth', 0) > 0


if not any(isinstance(f, _MuteAccounting) for f in logging.get_absl_logger().filters):
  logging.get_absl_logger().addFilter(_MuteAccounting())


@contextlib.contextmanager
def _quiet():
  _MUTED.depth = getattr(_MUTED, 'depth', 0) + 1
  try:
    yield
  finally:
    _MUTED.depth -= 1


def _accountant(decl: Declaration, accountant: str) -> dp_accounting.PrivacyAccountant:
  if accountant not in ACCOUNTANTS:
    raise ValueError(f'accountant must be one of {ACCOUNTANTS} (got {accountant!r})')
  if decl.sampling == 'without_replacement':
    if accountant != 'rdp':
      raise ValueError('sampling without replacement is accounted by the rdp accountant only')
    return dp_accounting.rdp.RdpAccountant(neighboring_relation=_NR.REPLACE_ONE)
  # The sensitivity is explicit in the event, so the accountant's relation is add/remove
  # (dp-accounting's accountants disagree on what replace-one does to a Gaussian event).
  if accountant == 'rdp':
    return dp_accounting.rdp.RdpAccountant()
  return dp_accounting.pld.PLDAccountant()


def event(decl: Declaration, noise_multiplier: float, *,
          accountant: str = 'rdp') -> dp_accounting.DpEvent:
  """The dp-accounting event of `decl` at noise std = `noise_multiplier` x clip norm."""
  base = dp_accounting.GaussianDpEvent(noise_multiplier / decl.sensitivity)
  if decl.sampling == 'poisson' and decl.sampling_rate < 1:
    if decl.max_batch_size is not None and accountant == 'pld':
      if decl.population is None:
        raise ValueError('a truncated Poisson event needs the population size')
      one = dp_accounting.TruncatedSubsampledGaussianDpEvent(
          int(decl.population), float(decl.sampling_rate), int(decl.max_batch_size),
          noise_multiplier / decl.sensitivity)
    else:
      one = dp_accounting.PoissonSampledDpEvent(float(decl.sampling_rate), base)
  elif decl.sampling == 'without_replacement' and decl.sample_size < decl.population:
    one = dp_accounting.SampledWithoutReplacementDpEvent(int(decl.population),
                                                         int(decl.sample_size), base)
  else:
    one = base
  return dp_accounting.SelfComposedDpEvent(one, int(decl.compositions))


@functools.lru_cache(maxsize=64)
def _composed_cached(decl: Declaration, noise_multiplier: float,
                     accountant: str) -> dp_accounting.PrivacyAccountant:
  acc = _accountant(decl, accountant)
  with _quiet():
    acc.compose(event(decl, noise_multiplier, accountant=accountant))
  return acc


def _composed(decl: Declaration, noise_multiplier: float,
              accountant: str) -> dp_accounting.PrivacyAccountant:
  """`decl`'s event composed in a fresh accountant, kept for the next call with the same
  arguments: a sampled declaration's RDP takes up to a second to compose (sampling without
  replacement: ~0.9 s), and the pipelines ask for the same claim many times (a calibration's
  search, a claim's check, its profile). Callers only read the accountant (`get_epsilon`,
  `get_delta`), which leaves it as it is; a declaration that cannot be hashed is composed
  afresh."""
  try:
    return _composed_cached(decl, float(noise_multiplier), accountant)
  except TypeError:  # an unhashable field
    return _composed_cached.__wrapped__(decl, float(noise_multiplier), accountant)


def _check_delta(delta: float) -> float:
  delta = float(delta)
  if not 0 < delta < 1:
    raise ValueError(f'delta must be in (0, 1) (got {delta})')
  return delta


def epsilon(decl: Declaration, noise_multiplier: float | None = None, *, delta: float,
            accountant: str = 'rdp') -> float:
  """The epsilon at `delta` that `decl` spends at this noise multiplier.

  Args:
    decl: the mechanism's declaration.
    noise_multiplier: noise std / clip norm (ignored for a pure-epsilon declaration); 0 is
      no noise, infinite epsilon.
    delta: in (0, 1).
    accountant: 'rdp' (Mironov 2017; Mironov, Talwar, Zhang 2019) or 'pld' (Koskela et al.
      2020; Doroshenko et al. 2022), both dp-accounting's.

  Returns:
    epsilon (math.inf without noise).
  """
  delta = _check_delta(delta)
  if decl.pure_epsilon is not None:
    # Basic composition of pure epsilon-DP releases (exact for one release).
    return float(decl.pure_epsilon) * int(decl.compositions)
  if noise_multiplier is None or not noise_multiplier > 0:
    return math.inf
  acc = _composed(decl, noise_multiplier, accountant)
  with _quiet():
    return float(acc.get_epsilon(delta))


def delta_for(decl: Declaration, noise_multiplier: float, *, epsilon_: float,
              accountant: str = 'rdp') -> float:
  """The accountant's delta at `epsilon_`: its privacy profile delta(epsilon), to plot an
  audit's empirical profile against.

  A pure declaration claims epsilon-DP (epsilon its composed `pure_epsilon`), whose tightest
  implied profile is randomized response's: delta(e) = (e^epsilon - e^e) / (1 + e^epsilon) for
  e < epsilon, 0 above (every epsilon-DP pair's trade-off curve lies above RR's; Kairouz, Oh,
  Viswanath, ICML 2015, Theorem 2.1)."""
  if decl.pure_epsilon is not None:
    total = epsilon(decl, delta=0.5)
    if epsilon_ >= total:
      return 0.0
    return float(-math.expm1(float(epsilon_) - total) / (1.0 + math.exp(-total)))
  if not noise_multiplier > 0:
    return 1.0
  acc = _composed(decl, noise_multiplier, accountant)
  with _quiet():
    return float(acc.get_delta(float(epsilon_)))


def delta_curve(decl: Declaration, noise_multiplier: float, epsilons, *,
                accountant: str = 'rdp') -> list[float]:
  """`delta_for` at every epsilon of `epsilons`, the mechanism composed once (a sampled
  declaration's RDP takes about a second to compose; its profile is then cheap to read)."""
  epsilons = [float(e) for e in epsilons]
  if decl.pure_epsilon is not None or not noise_multiplier > 0:
    return [delta_for(decl, noise_multiplier, epsilon_=e, accountant=accountant)
            for e in epsilons]
  acc = _composed(decl, noise_multiplier, accountant)
  with _quiet():
    return [float(acc.get_delta(e)) for e in epsilons]


# The least noise multiplier the calibration searches down to (its bracket's lower end).
MIN_NOISE_MULTIPLIER = 1e-3


class UnreachableTargetError(ValueError):
  """A target epsilon at or above the epsilon of the least noise calibrated: it asks for no
  noise, and the calibration finds no bracket (`max_epsilon` is that epsilon)."""

  def __init__(self, target_epsilon: float, max_epsilon: float):
    self.target_epsilon = target_epsilon
    self.max_epsilon = max_epsilon
    super().__init__(f'target_epsilon must be below {max_epsilon:.4g}, the epsilon of noise '
                     f'multiplier {MIN_NOISE_MULTIPLIER:g} (got {target_epsilon})')


def noise_multiplier_for(decl: Declaration, target_epsilon: float, *, delta: float,
                         accountant: str = 'rdp') -> float:
  """The smallest noise multiplier whose `epsilon(decl, ...)` is at most `target_epsilon`.

  dp-accounting's `calibrate_dp_mechanism` (bisection on the accountant); cached, since a
  sweep asks for the same calibration at every point. The PLD search is bracketed by the RDP
  answer: RDP's epsilon is the larger, so its z is enough under PLD, and half of it is a
  floor the PLD accountant can discretise (near z = 0 it asks for tens of GiB).
  """
  if not (isinstance(target_epsilon, (int, float)) and math.isfinite(target_epsilon) and
          target_epsilon > 0):
    raise ValueError(f'target_epsilon must be a finite number > 0 (got {target_epsilon})')
  if decl.pure_epsilon is not None:
    raise ValueError(f'{decl.mechanism} is pure epsilon-DP: it has no noise multiplier')
  delta = _check_delta(delta)
  if accountant == 'pld':
    upper = noise_multiplier_for(decl, target_epsilon, delta=delta, accountant='rdp')
    if epsilon(decl, upper / 2, delta=delta, accountant='pld') <= target_epsilon:
      return upper  # PLD below half of RDP's z: not seen; keep the conservative answer
    bracket = dp_accounting.mechanism_calibration.ExplicitBracketInterval(upper / 2, upper)
  else:
    floor = epsilon(decl, MIN_NOISE_MULTIPLIER, delta=delta, accountant=accountant)
    if floor <= target_epsilon:
      # The search starts above its lower end and finds no noise large enough to matter: it
      # ended in dp-accounting's NoBracketIntervalFoundError after the results were opened.
      raise UnreachableTargetError(float(target_epsilon), floor)
    bracket = dp_accounting.mechanism_calibration.LowerEndpointAndGuess(
        MIN_NOISE_MULTIPLIER, 1.0)
  with _quiet():
    return float(dp_accounting.calibrate_dp_mechanism(
        lambda: _accountant(decl, accountant),
        lambda z: event(decl, z, accountant=accountant),
        float(target_epsilon), delta, bracket))


# Cached by rebinding, not by a decorator: mutmut does not mutate decorated functions.
noise_multiplier_for = functools.lru_cache(maxsize=512)(noise_multiplier_for)


# ----------------------------------------------------------------------------------------------
# The declarations of the mechanisms fl-privacy ships.


def dp_sgd(*, batch_size: int, num_examples: int, steps: int, epochs: int,
           sampling: str = 'poisson', max_batch_size: int | None = None) -> Declaration:
  """DP-SGD (Abadi et al. 2016) as the client runs it, against the server.

  - `poisson`: every step samples each record with probability q = B / N (N the declared,
    public record count: `fl.sampling.public_schedule`); one record added or
    removed moves the clipped sum by at most C (add/remove, sensitivity 1), `steps`
    compositions of the Poisson-subsampled Gaussian (truncated at `max_batch_size`).
  - `shuffle`: fixed-size batches of a shuffled epoch. No amplification is claimed (Chua et
    al., ICML 2024, arXiv:2403.17673, show Poisson accounting can understate it): each epoch
    releases each record's clipped gradient once, in one step, and replacing it moves that
    step's sum by up to 2C (replace-one, sensitivity 2); `epochs` compositions.
  """
  if sampling == 'poisson':
    return Declaration('dp_sgd', 'record', 'add_remove', 'server', 'poisson', 1.0,
                       int(steps), min(1.0, batch_size / num_examples),
                       population=int(num_examples), max_batch_size=max_batch_size)
  if sampling == 'shuffle':
    return Declaration('dp_sgd', 'record', 'replace_one', 'server', 'shuffle', 2.0,
                       int(epochs), note='one Gaussian release per epoch, no amplification')
  raise ValueError(f"dp_sgd sampling must be 'poisson' or 'shuffle' (got {sampling!r})")


def update_dp(*, rounds: int) -> Declaration:
  """Clip the update to C and add N(0, (zC)^2) before upload (FedMIA paper, App. A.2.1).

  The server reads each upload and picks who takes part, so neither participation nor
  aggregation amplifies: one client's data replaced (hence any one record) moves its clipped
  update by up to 2C. Client-level, replace-one, sensitivity 2, `rounds` compositions.
  """
  return Declaration('update_dp', 'client', 'replace_one', 'server', 'none', 2.0, int(rounds))


def server_dp(mechanism: str, *, rounds: int, num_clients: int,
              participants: int | None = None, per_round: bool = False) -> Declaration:
  """DP-FedAvg's server noise (McMahan et al. 2018): `central_dp`, `weak_dp`.

  The server clips each participant's upload to C, averages the K participants with weight
  1/K and adds N(0, (zC/K)^2). Replacing one client moves the mean by up to 2C/K (replace-one,
  sensitivity 2). It protects against readers of the aggregate only: the server has read the
  uploads before adding its noise. With K < N participants per round, drawn without
  replacement, the RDP accountant amplifies by sampling without replacement. `per_round`
  (weak_dp, PASTEL's WDP) declares one round: the claim a per-round calibration makes.
  """
  n = int(num_clients)
  m = n if participants is None else int(participants)
  sampling = 'without_replacement' if m < n else 'none'
  return Declaration(mechanism, 'client', 'replace_one', 'aggregate', sampling, 2.0,
                     1 if per_round else int(rounds), m / n, population=n, sample_size=m,
                     note='calibrated per round' if per_round else '')


def ldp_sgd(*, epsilon_per_report: float, rounds: int) -> Declaration:
  """LDP-SGD's randomizer (Algorithm 1 of the LDP-audit paper): eps-LDP per report."""
  return Declaration('ldp_sgd', 'client', 'replace_one', 'server', 'none', 2.0, int(rounds),
                     pure_epsilon=float(epsilon_per_report))


def gaussian_input() -> Declaration:
  """The Gaussian input mechanism (AMI paper, App. E): one release of each input.

  Its `sensitivity` parameter is the L2 distance between two inputs it must hide, so in
  those units replace-one has sensitivity 1.
  """
  return Declaration('gaussian', 'record', 'replace_one', 'server', 'none', 1.0, 1)
