"""Flower's own differential privacy (Flower 1.42), audited on the released update.

Three of Flower's DP deployments are audited by canary games that call Flower's own objects
on small in-memory messages (no copy of Flower's code):

| wrapper | Flower objects called per trial | release the adversary reads |
|---|---|---|
| `server_fixed` | `DifferentialPrivacyServerSideFixedClipping(FedAvg)`: `configure_train`, `aggregate_train` (clips each reply, averages, adds noise) | the noisy aggregate |
| `client_fixed` | `DifferentialPrivacyClientSideFixedClipping(FedAvg)` + `fixedclipping_mod` on every client's reply | the noisy aggregate |
| `local_dp` | `LocalDpMod(clipping_norm, sensitivity, epsilon, delta)` on the target's reply | the target's upload |
| `server_adaptive` | `DifferentialPrivacyServerSideAdaptiveClipping(FedAvg)` (clip at the initial norm, noisy clipped count, clip update, noise) | the noisy aggregate |
| `client_adaptive` | `DifferentialPrivacyClientSideAdaptiveClipping(FedAvg)` + `adaptiveclipping_mod` | the noisy aggregate |

The game (client-level, add/remove, no sampling amplification, one round): the model is one
float32 array w_t of length `dimension`; the target client's update is a Dirac canary of
norm `canary_norm` x C on coordinate 0 (above the clip, so Flower's clip must act); in the
out-world the target is absent (central: its reply is missing, n - 1 replies; local: the
client uploads w_t + 1e-6 C e_2, a client without data: an update of exactly 0 crashes
Flower 1.42's clip with a ZeroDivisionError). The other clients' updates are fixed
and known (`attacks.audit.dp_canary.known_contributions`: orthogonal to the canary, norms
C/2..2C). Score = the release's projection on the canary direction minus w_t's, the optimal
statistic of this Gaussian game. `fl_privacy.eval.auditing.audit_scores` (through
`attacks.audit.dp_canary.claim_metrics`, the Gaussian-curve bounds counted) turns the scores
into lower bounds of epsilon; a bound above Flower's stated epsilon is a `privacy_violation`.

What Flower states: `LocalDpMod` its `epsilon` argument (its noise std is
`sensitivity * sqrt(2 ln(1.25 / delta)) / epsilon`, calibrated to `sensitivity`, not to the
clip: `sensitivity < clipping_norm` under-noises, and the classic formula is an (eps, delta)
guarantee for eps < 1 only); the central wrappers state a noise multiplier z (noise std
z C / n on the mean of n sampled clients), whose epsilon is what Flower 1.42's
`flwr.serverapp.RdpAccountant` (add-or-remove-one, no amplification) reports for one
release. Beside it: `fl_privacy.accounting`'s RDP epsilon of the same Gaussian mechanism
(noise multiplier = noise std / sensitivity of the add/remove game) and its exact epsilon
(`dp_epsilon_exact`: one Gaussian release is (1 / z)-GDP, `eval.auditing.gdp_epsilon`);
`accountant_violation` = 1 when the exact epsilon exceeds the stated one.

Randomness: Flower draws its noise from numpy's global `np.random` state and FedAvg samples
nodes with Python's `random`. Each trial reseeds both from its own key
(`fold_in(key, index)`, split into the world's coin and a uint32 seed), and the caller's
states of both generators are restored afterwards; a trial's outcome depends only on the key
and its index. Flower's per-call INFO logs (and the warning about a missing reply) are
silenced during the games.

Adaptive clipping is audited on its first round's aggregate only: the updated clip norm
(which carries the noisy count of clipped updates, the target's bit included) is a second
release the score ignores, so its lower bounds are bounds of the aggregate alone; the stated
epsilon is that of the whole round (Gaussian at z, Andrew et al. 2021). Flower draws the
aggregate's noise with the clip norm after its update (docs/experiments/flower_audit.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging as py_logging
import math
import random
from typing import Any, Callable, Iterator

import jax
import numpy as np

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType
from flwr.app import MetricRecord
from flwr.app import RecordDict
from flwr.clientapp.mod import LocalDpMod, adaptiveclipping_mod, fixedclipping_mod
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import strategy as flwr_strategy
from flwr.supercore import differential_privacy as flwr_dp

from fl_privacy import accounting
from fl_privacy.attacks.audit import dp_canary
from fl_privacy.eval import auditing
from fl_privacy.flower import runner

WRAPPERS = ('server_fixed', 'client_fixed', 'local_dp', 'server_adaptive', 'client_adaptive')
ADAPTIVE = ('server_adaptive', 'client_adaptive')
ADVERSARY = {'server_fixed': 'aggregate', 'client_fixed': 'aggregate', 'local_dp': 'server',
             'server_adaptive': 'aggregate', 'client_adaptive': 'aggregate'}
# What the adaptive games leave out: the release of the updated clip norm (the noisy count of
# clipped updates), and every later round.
NOT_AUDITED = ('the adaptive wrappers\' clip-norm release (noisy clipped count)',
               'multi-round composition', 'client sampling')
ARRAY_NAME = 'w'
WEIGHT = 10  # every client's num-examples (FedAvg's weights, equal)
FIRST_NODE = runner.FIRST_NODE_ID


@dataclasses.dataclass(frozen=True)
class Setting:
  """One Flower DP deployment to audit.

  Attributes:
    label: How tables name it.
    wrapper: One of `WRAPPERS`.
    clipping_norm: C (every wrapper's `clipping_norm`).
    noise_multiplier: z of the central wrappers (ignored by `local_dp`).
    num_sampled_clients: n of the central wrappers: sampled (= all) clients per round.
    sensitivity: `LocalDpMod`'s `sensitivity` (ignored by the central wrappers).
    epsilon: `LocalDpMod`'s `epsilon` (ignored by the central wrappers).
    delta: `LocalDpMod`'s `delta`; for the central wrappers the delta their epsilon is
      stated at.
    target_clipped_quantile, clip_norm_lr, clipped_count_stddev: the adaptive wrappers'
      arguments (Flower's defaults 0.5, 0.2 and None = num_sampled_clients / 20); their
      `initial_clipping_norm` is `clipping_norm`.
  """
  label: str
  wrapper: str
  clipping_norm: float = 1.0
  noise_multiplier: float = 1.0
  num_sampled_clients: int = 10
  sensitivity: float = 1.0
  epsilon: float = 1.0
  delta: float = 1e-5
  target_clipped_quantile: float = 0.5
  clip_norm_lr: float = 0.2
  clipped_count_stddev: float | None = None

  def __post_init__(self):
    if self.wrapper not in WRAPPERS:
      raise ValueError(f'wrapper must be one of {WRAPPERS} (got {self.wrapper!r})')

  @property
  def central(self) -> bool:
    return self.wrapper != 'local_dp'

  def params(self) -> dict[str, Any]:
    """The flat params of a results point (only the fields the wrapper reads)."""
    p = {'setting': self.label, 'wrapper': self.wrapper,
         'clipping_norm': float(self.clipping_norm), 'delta': float(self.delta)}
    if self.central:
      p.update(noise_multiplier=float(self.noise_multiplier),
               num_sampled_clients=int(self.num_sampled_clients))
      if self.wrapper in ADAPTIVE:
        p.update(target_clipped_quantile=float(self.target_clipped_quantile),
                 clip_norm_lr=float(self.clip_norm_lr),
                 clipped_count_stddev=(None if self.clipped_count_stddev is None
                                       else float(self.clipped_count_stddev)))
    else:
      p.update(sensitivity=float(self.sensitivity), epsilon=float(self.epsilon))
    return p


def local_dp_std(sensitivity: float, epsilon: float, delta: float) -> float:
  """The noise std Flower 1.42's `LocalDpMod.__call__` adds to every parameter."""
  return float(sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon)


def adaptive_noise(setting: Setting) -> tuple[float, float]:
  """(clipped_count_stddev, the aggregate's noise multiplier z') of an adaptive wrapper:
  Flower's own `compute_adaptive_noise_params` (ValueError when z >= 2 clipped_count_stddev)."""
  return tuple(float(v) for v in flwr_dp.compute_adaptive_noise_params(
      setting.noise_multiplier, setting.num_sampled_clients, setting.clipped_count_stddev))


def noise_std(setting: Setting) -> float:
  """The std of the Gaussian noise Flower adds per coordinate of the release.

  Central: Flower's own `compute_stdv(z, C, n)` (on the weighted mean; adaptive: z' of
  `adaptive_noise` at the initial clip norm, the round's clip before its update); local:
  `local_dp_std`.
  """
  if setting.wrapper in ADAPTIVE:
    return float(flwr_dp.compute_stdv(adaptive_noise(setting)[1], setting.clipping_norm,
                                      setting.num_sampled_clients))
  if setting.central:
    return float(flwr_dp.compute_stdv(setting.noise_multiplier, setting.clipping_norm,
                                      setting.num_sampled_clients))
  return local_dp_std(setting.sensitivity, setting.epsilon, setting.delta)


def effective_noise_multiplier(setting: Setting) -> float:
  """Noise std / L2 sensitivity of the release in the add/remove game (one client of norm
  <= C added or removed): z for the central wrappers (mean of n: C / n against z C / n),
  std / C for `LocalDpMod`."""
  if setting.central:
    return noise_std(setting) * setting.num_sampled_clients / setting.clipping_norm
  return noise_std(setting) / setting.clipping_norm


def declaration(setting: Setting) -> accounting.Declaration:
  """The `fl_privacy.accounting` declaration of the audited game (one Gaussian release)."""
  return accounting.Declaration(
      f'flower_{setting.wrapper}', 'client', 'add_remove', ADVERSARY[setting.wrapper], 'none',
      1.0, 1, note=('Flower central DP, one round, no sampling amplification' if
                    setting.central else 'Flower LocalDpMod, one upload'))


def flower_rdp_epsilon(noise_multiplier: float, num_sampled_clients: int,
                       delta: float) -> float:
  """Epsilon of one release of a central wrapper by Flower 1.42's own `RdpAccountant`
  (add-or-remove-one, no amplification: the configuration the wrappers accept)."""
  from flwr.serverapp import RdpAccountant  # pylint: disable=g-import-not-at-top
  from flwr.supercore.privacy_accounting import (  # pylint: disable=g-import-not-at-top
      GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, SamplingMethod)
  n = int(num_sampled_clients)
  acc = RdpAccountant(PrivacyConfig(target_delta=float(delta), population_size=n,
                                    neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                    sampling_method=SamplingMethod.NO_AMPLIFICATION))
  acc.compose(GaussianPrivacyEvent(noise_multiplier=float(noise_multiplier), sample_size=n,
                                   population_size=n))
  return float(acc.get_epsilon(float(delta)))


def stated_epsilon(setting: Setting) -> tuple[float, str]:
  """(Flower's stated epsilon, where it comes from)."""
  if setting.wrapper in ADAPTIVE:
    # Flower's accountant takes no adaptive wrapper; Andrew et al.'s claim is that the round
    # (aggregate and clip update together) is the Gaussian mechanism of noise multiplier z.
    return (flower_rdp_epsilon(setting.noise_multiplier, setting.num_sampled_clients,
                               setting.delta), 'flwr RdpAccountant at z (Andrew et al.)')
  if setting.central:
    return (flower_rdp_epsilon(setting.noise_multiplier, setting.num_sampled_clients,
                               setting.delta), 'flwr RdpAccountant')
  return float(setting.epsilon), 'LocalDpMod epsilon argument'


def claim_metrics(setting: Setting) -> dict[str, Any]:
  """Flower's claim and our accountant's epsilons of the same mechanism (no games)."""
  decl = declaration(setting)
  z = effective_noise_multiplier(setting)
  stated, source = stated_epsilon(setting)
  m: dict[str, Any] = dict(accounting.describe(decl))
  m.update(dp_mechanism=decl.mechanism, dp_level=decl.level, dp_delta=float(setting.delta),
           stated_epsilon=stated, stated_epsilon_source=source, flower_noise_std=noise_std(setting),
           effective_noise_multiplier=z,
           dp_epsilon=accounting.epsilon(decl, z, delta=setting.delta),
           # One Gaussian release is exactly (1 / z)-GDP: its epsilon is the analytic
           # Gaussian one (Balle & Wang 2018), what PLD approximates (PLD's grid explodes
           # for the tiny z of a misconfigured LocalDpMod).
           dp_epsilon_exact=auditing.gdp_epsilon(1.0 / z, float(setting.delta)))
  m['flower_rdp_epsilon'] = stated if setting.central else float('nan')
  # The accountant's own verdict: the exact epsilon of the noise Flower really adds exceeds
  # the stated one (a claim broken analytically, whatever an audit of finite size shows).
  m['accountant_violation'] = float(m['dp_epsilon_exact'] > stated * (1 + 1e-9))
  return m


# ------------------------------------------------------------------------------ games ---


class _Nodes:
  """The part of a `Grid` that FedAvg's `configure_train` reads."""

  def __init__(self, n: int):
    self.ids = [FIRST_NODE + i for i in range(n)]

  def get_node_ids(self) -> list[int]:
    return list(self.ids)


def _record(vector: np.ndarray) -> ArrayRecord:
  return ArrayRecord({ARRAY_NAME: Array(np.asarray(vector, np.float32))})


def _vector(record: ArrayRecord) -> np.ndarray:
  return np.asarray(record[ARRAY_NAME].numpy(), np.float64)


def _reply(msg: Message, params: np.ndarray) -> Message:
  return Message(RecordDict({'arrays': _record(params),
                             'metrics': MetricRecord({'num-examples': WEIGHT})}), reply_to=msg)


def _context(node: int, n: int) -> Context:
  return Context(run_id=runner.DEFAULT_RUN_ID, node_id=node,
                 node_config={'partition-id': node - FIRST_NODE, 'num-partitions': n},
                 state=RecordDict(), run_config={})


@dataclasses.dataclass(frozen=True)
class Game:
  """The fixed parts of one setting's game.

  Attributes:
    setting: What is audited.
    w_t: float32 [d] the round's model.
    canary: float32 [d] the target's update (norm canary_norm x C on coordinate 0).
    others: float32 [n - 1, d] the other clients' known updates (central wrappers).
  """
  setting: Setting
  w_t: np.ndarray
  canary: np.ndarray
  others: np.ndarray

  def release(self, present: bool) -> np.ndarray:
    """One round through Flower's objects: the aggregate (central) or the target's upload
    (local), float64 [d]."""
    s = self.setting
    if s.wrapper == 'local_dp':
      return self._local(present)
    n = s.num_sampled_clients
    inner = flwr_strategy.FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n,
                                 min_available_nodes=n)
    if s.wrapper in ADAPTIVE:
      cls = (flwr_strategy.DifferentialPrivacyServerSideAdaptiveClipping
             if s.wrapper == 'server_adaptive' else
             flwr_strategy.DifferentialPrivacyClientSideAdaptiveClipping)
      strategy = cls(inner, s.noise_multiplier, n, initial_clipping_norm=s.clipping_norm,
                     target_clipped_quantile=s.target_clipped_quantile,
                     clip_norm_lr=s.clip_norm_lr, clipped_count_stddev=s.clipped_count_stddev)
    else:
      cls = (flwr_strategy.DifferentialPrivacyServerSideFixedClipping
             if s.wrapper == 'server_fixed' else
             flwr_strategy.DifferentialPrivacyClientSideFixedClipping)
      strategy = cls(inner, s.noise_multiplier, s.clipping_norm, n)
    mod = {'client_fixed': fixedclipping_mod,
           'client_adaptive': adaptiveclipping_mod}.get(s.wrapper)
    arrays = _record(self.w_t)
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), _Nodes(n)))
    replies = []
    for msg in messages:
      k = int(msg.metadata.dst_node_id) - FIRST_NODE
      if k == 0 and not present:
        continue  # the target is absent
      update = self.canary if k == 0 else self.others[k - 1]
      params = self.w_t.astype(np.float64) + update
      if mod is not None:
        with runner.task_identity(runner.DEFAULT_RUN_ID, FIRST_NODE + k):
          reply = mod(msg, _context(FIRST_NODE + k, n), lambda m, c, p=params: _reply(m, p))
      else:
        reply = _reply(msg, params)
      replies.append(reply)
    aggregate, _ = strategy.aggregate_train(1, replies)
    return _vector(aggregate)

  def _local(self, present: bool) -> np.ndarray:
    s = self.setting
    mod = LocalDpMod(s.clipping_norm, s.sensitivity, s.epsilon, s.delta)
    content = RecordDict({'arrays': _record(self.w_t),
                          'config': ConfigRecord({'server-round': 1})})
    msg = Message(content, FIRST_NODE, MessageType.TRAIN)
    # Out-world: a client whose update is ~0. Exactly 0 makes Flower 1.42's clip divide by
    # the update's norm (ZeroDivisionError in `clip_inputs_inplace`), so the absent client's
    # update is 1e-6 C along coordinate 1: orthogonal to the canary, so the score is the same.
    params = self.w_t.astype(np.float64) + (self.canary if present else self.idle)
    with runner.task_identity(runner.DEFAULT_RUN_ID, FIRST_NODE):
      reply = mod(msg, _context(FIRST_NODE, 1), lambda m, c: _reply(m, params))
    if reply.has_error():
      raise RuntimeError(f'LocalDpMod replied with an error: {reply.error.reason}')
    _, record = next(iter(reply.content.array_records.items()))
    return _vector(record)

  @property
  def idle(self) -> np.ndarray:
    """The update of a client that did not train (see `_local`)."""
    v = np.zeros_like(self.canary)
    v[1] = 1e-6 * float(self.setting.clipping_norm)
    return v

  def score(self, release: np.ndarray) -> float:
    """The release's projection on the canary direction, minus w_t's."""
    direction = self.canary / np.linalg.norm(self.canary)
    return float(np.dot(release - self.w_t, direction))


def make_game(setting: Setting, *, dimension: int = 8, canary_norm: float = 2.0) -> Game:
  """The game of `setting`: w_t fixed (0.1, 0.2, ...), canary canary_norm x C e_1."""
  d = int(dimension)
  if d < 2:
    raise ValueError(f'dimension must be >= 2 (got {d})')
  c = float(setting.clipping_norm)
  w_t = np.linspace(0.1, 0.1 * d, d).astype(np.float32)
  canary = np.zeros(d)
  canary[0] = float(canary_norm) * c
  others = dp_canary.known_contributions(
      setting.num_sampled_clients - 1 if setting.central else 0, d, c).astype(np.float64)
  return Game(setting, w_t, canary, others)


@contextlib.contextmanager
def quiet_flower(level: int = py_logging.ERROR) -> Iterator[None]:
  """Flower's logger at `level` inside the block (its per-call INFO lines off)."""
  logger = py_logging.getLogger('flwr')
  saved = logger.level
  logger.setLevel(level)
  try:
    yield
  finally:
    logger.setLevel(saved)


@contextlib.contextmanager
def _saved_global_generators() -> Iterator[None]:
  np_state, py_state = np.random.get_state(), random.getstate()
  try:
    yield
  finally:
    np.random.set_state(np_state)
    random.setstate(py_state)


def trial_keys(key: jax.Array, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
  """(present bool [m], seed uint32 [m]) of trials start..stop-1: `fold_in(key, index)`
  split into the world's fair coin and the seed of Flower's global generators."""
  def one(i):
    k_coin, k_game = jax.random.split(jax.random.fold_in(key, i))
    return jax.random.bernoulli(k_coin), jax.random.bits(k_game, dtype=np.uint32)
  present, seeds = jax.jit(jax.vmap(one))(np.arange(start, stop, dtype=np.int32))
  return np.asarray(present, bool), np.asarray(seeds, np.uint32)


def play(game: Game, key: jax.Array, num_trials: int, *, start: int = 0,
         listener: Callable[[int], None] | None = None) -> dict[str, np.ndarray]:
  """Trials start..num_trials-1 of the game: {'present' bool [m], 'score' float64 [m]}."""
  present, seeds = trial_keys(key, start, num_trials)
  scores = np.empty(len(present))
  with _saved_global_generators(), quiet_flower(), runner.task_identity(
      runner.DEFAULT_RUN_ID, SUPERLINK_NODE_ID):
    for i, (p, seed) in enumerate(zip(present, seeds)):
      # Flower's wrappers and mods draw their noise from numpy's (and Python's) global
      # generators and take no Generator: each trial seeds them from its own fold_in key, and
      # `_saved_global_generators` gives the caller's states back afterwards.
      np.random.seed(int(seed))
      random.seed(int(seed))
      scores[i] = game.score(game.release(bool(p)))
      if listener is not None and (i + 1) % 1000 == 0:
        listener(i + 1)
  return {'present': present, 'score': scores}


def audit(setting: Setting, key: jax.Array, num_trials: int, *, dimension: int = 8,
          canary_norm: float = 2.0, confidence: float = 0.95) -> dict[str, Any]:
  """The audit of one setting: `claim_metrics`, then the games' lower bounds of epsilon
  (`dp_canary.claim_metrics` against the stated epsilon, Gaussian curves counted), with
  `privacy_violation` (1: a lower bound above Flower's stated epsilon) and the games'
  settings."""
  metrics = claim_metrics(setting)
  game = make_game(setting, dimension=dimension, canary_norm=canary_norm)
  out = play(game, key, int(num_trials))
  ins, outs = out['score'][out['present']], out['score'][~out['present']]
  if not (len(ins) and len(outs)):
    raise ValueError(f'{num_trials} trials gave no game in one of the worlds')
  metrics.update(dp_canary.claim_metrics(
      ins, outs, 'gaussian', metrics['stated_epsilon'], delta=float(setting.delta),
      confidence=float(confidence), pld_epsilon=metrics['dp_epsilon_exact']))
  metrics.update(canary_norm=float(canary_norm) * float(setting.clipping_norm),
                 dimension=int(dimension), num_trials=int(num_trials))
  return metrics
