"""Flower's own differential privacy (Flower 1.42), audited on one round's released update.

Five of Flower's DP deployments are audited by canary games that call Flower's own objects
on small in-memory messages (no copy of Flower's code):

| wrapper | Flower objects called per trial | release the adversary reads |
|---|---|---|
| `server_fixed` | `DifferentialPrivacyServerSideFixedClipping(FedAvg)`: `configure_train`, `aggregate_train` (clips each reply, averages, adds noise) | the noisy aggregate |
| `client_fixed` | `DifferentialPrivacyClientSideFixedClipping(FedAvg)` + `fixedclipping_mod` on every client's reply | the noisy aggregate |
| `local_dp` | `LocalDpMod(clipping_norm, sensitivity, epsilon, delta)` on the target's reply | the target's upload |
| `server_adaptive` | `DifferentialPrivacyServerSideAdaptiveClipping(FedAvg)` (clip at the initial norm, noisy clipped count, clip update, noise) | the noisy aggregate |
| `client_adaptive` | `DifferentialPrivacyClientSideAdaptiveClipping(FedAvg)` + `adaptiveclipping_mod` | the noisy aggregate |

The game (client-level, no sampling amplification, one round): the model is one float32
array w_t of length `dimension`; the target client's update is a Dirac canary of norm
`canary_norm` x C on coordinate 0 (above the clip, so Flower's clip must act). The
neighbouring relation, per row (`game_relation`): central wrappers, add/remove: in the
out-world the target's reply is missing and FedAvg renormalises over the n - 1 replies, so
the whole mean moves (not only by C/n on the canary: up to 2C/n, the zero-out figure C/n
holding only with a fixed denominator); LocalDpMod, zero-out: the same client uploads
w_t + 1e-6 C e_2, a client without data (an update of exactly 0 crashes Flower 1.42's clip
with a ZeroDivisionError); its replace-one reading (any other client's upload, sensitivity
2C) is a column (`dp_epsilon_exact_replace_one`). The other clients' updates are fixed and
known (`attacks.audit.dp_canary.known_contributions`: orthogonal to the canary, norms
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
release. Beside it: `fl_privacy.accounting`'s RDP epsilon at Flower's nominal noise
multiplier (they agree to 1e-9) and the exact epsilon of the game's release
(`dp_epsilon_exact`: the whole vector, both worlds' means and noise stds,
`gaussian_pair_epsilon`; `dp_epsilon_exact_projection` is the score's alone);
`accountant_violation` = 1 when the exact epsilon exceeds the stated one. See
`claim_metrics`.

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
aggregate's noise with the clip norm AFTER its update (flwr 1.42
`serverapp/strategy/dp_adaptive_clipping.py` lines 213-223 and 319-322; line 93 reads the
updated `self.clipping_norm`), and that clip differs between the worlds (its count has one
bit more in the in-world, over one reply more): `world_noise_stds`. Every round of a
deployment: `fl_privacy.flower.audits.canaries`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging as py_logging
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
from fl_privacy.flower.audits import dp_setting
from fl_privacy.flower.engines import inprocess


# ------------------------------------------------------------------------------ games ---


class _Nodes:
  """The part of a `Grid` that FedAvg's `configure_train` reads."""

  def __init__(self, n: int):
    self.ids = [dp_setting.FIRST_NODE + i for i in range(n)]

  def get_node_ids(self) -> list[int]:
    return list(self.ids)


def _record(vector: np.ndarray) -> ArrayRecord:
  return ArrayRecord({dp_setting.ARRAY_NAME: Array(np.asarray(vector, np.float32))})


def _vector(record: ArrayRecord) -> np.ndarray:
  return np.asarray(record[dp_setting.ARRAY_NAME].numpy(), np.float64)


def _reply(msg: Message, params: np.ndarray) -> Message:
  return Message(RecordDict({'arrays': _record(params),
                             'metrics': MetricRecord({'num-examples': dp_setting.WEIGHT})}),
                 reply_to=msg)


def _context(node: int, n: int) -> Context:
  return Context(run_id=inprocess.DEFAULT_RUN_ID, node_id=node,
                 node_config={'partition-id': node - dp_setting.FIRST_NODE, 'num-partitions': n},
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
  setting: dp_setting.Setting
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
    if s.wrapper in dp_setting.ADAPTIVE:
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
      k = int(msg.metadata.dst_node_id) - dp_setting.FIRST_NODE
      if k == 0 and not present:
        continue  # the target is absent
      update = self.canary if k == 0 else self.others[k - 1]
      params = self.w_t.astype(np.float64) + update
      if mod is not None:
        node = dp_setting.FIRST_NODE + k
        with inprocess.task_identity(inprocess.DEFAULT_RUN_ID, node):
          reply = mod(msg, _context(node, n), lambda m, c, p=params: _reply(m, p))
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
    msg = Message(content, dp_setting.FIRST_NODE, MessageType.TRAIN)
    # Out-world: a client whose update is ~0. Exactly 0 makes Flower 1.42's clip divide by
    # the update's norm (ZeroDivisionError in `clip_inputs_inplace`), so the absent client's
    # update is 1e-6 C along coordinate 1: orthogonal to the canary, so the score is the same.
    params = self.w_t.astype(np.float64) + (self.canary if present else self.idle)
    with inprocess.task_identity(inprocess.DEFAULT_RUN_ID, dp_setting.FIRST_NODE):
      reply = mod(msg, _context(dp_setting.FIRST_NODE, 1), lambda m, c: _reply(m, params))
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

  def updates(self, present: bool) -> list[np.ndarray]:
    """The updates the server receives (w_t subtracted), the target's first when present:
    central, the n (in) or n - 1 (out) replies; local, the target's own."""
    if not self.setting.central:
      return [self.canary if present else self.idle]
    return ([self.canary] if present else []) + list(self.others)

  def clip_after(self, present: bool) -> float:
    """Adaptive wrappers: the clip after this round's update (count noise at its mean)."""
    c0 = self.setting.clipping_norm
    ups = self.updates(present)
    return dp_setting.clip_after(self.setting, sum(float(np.linalg.norm(u)) > c0 for u in ups),
                                 len(ups))

  def score(self, release: np.ndarray) -> float:
    """The release's projection on the canary direction, minus w_t's."""
    direction = self.canary / np.linalg.norm(self.canary)
    return float(np.dot(release - self.w_t, direction))


def release_means(game: Game) -> tuple[np.ndarray, np.ndarray]:
  """The noiseless release minus w_t in each world (in, out): central, FedAvg's equal-weight
  mean of the clipped replies (n in the in-world, n - 1 in the out-world); local, the
  target's clipped update. Adaptive wrappers clip at the round's clip C_0."""
  c = game.setting.clipping_norm
  return tuple(np.mean([dp_setting.clip(u, c) for u in game.updates(p)], axis=0)
               for p in (True, False))


def world_noise_stds(game: Game) -> tuple[float, float]:
  """The noise std Flower draws in each world (in, out): the nominal `noise_std`, except the
  adaptive wrappers', drawn at the clip after its update (`Game.clip_after`): z' C_1 / n."""
  s = game.setting
  if s.wrapper not in dp_setting.ADAPTIVE:
    return dp_setting.noise_std(s), dp_setting.noise_std(s)
  z_prime = dp_setting.adaptive_noise(s)[1]
  return tuple(float(flwr_dp.compute_stdv(z_prime, game.clip_after(p), s.num_sampled_clients))
               for p in (True, False))


def claim_metrics(setting: dp_setting.Setting, *, dimension: int = 8, canary_norm: float = 2.0
                  ) -> dict[str, Any]:
  """Flower's claim and the epsilons of the mechanism the game releases (no games).

  - `dp_epsilon`: our RDP accountant at Flower's nominal noise multiplier
    (`effective_noise_multiplier`: the sensitivity Flower's claim assumes), the number
    Flower's own RdpAccountant gives (they agree to 1e-9).
  - `dp_epsilon_exact`: the exact epsilon of the game's RELEASE (the whole vector, not its
    projection): the two worlds' release means (`release_means`) at distance
    `release_sensitivity`, with the noise std Flower draws in each world
    (`world_noise_stds`; adaptive: at the clip after its update, which differs between the
    worlds), `gaussian_pair_epsilon`. Central: the target's reply is missing in the
    out-world and FedAvg renormalises over the n - 1 replies, so the other clients' mean
    moves too (`game_relation` = 'add_remove'); local: the target against a client that did
    not train (`game_relation` = 'zero_out').
  - `dp_epsilon_exact_projection`: the exact epsilon of the score alone (the release's
    projection on the canary), what earlier versions reported as exact.
  - `dp_epsilon_exact_worst` (fixed central wrappers): add/remove with FedAvg's
    renormalisation moves the mean by up to 2C/n (the others' mean pointing away from the
    target's update): the Gaussian at z / 2.
  - `dp_epsilon_exact_replace_one` (LocalDpMod): the usual local-DP relation, one client's
    upload against any other's (sensitivity 2C); `replace_one_violation` = it exceeds the
    stated epsilon.
  """
  decl = dp_setting.declaration(setting)
  z = dp_setting.effective_noise_multiplier(setting)
  stated, source = dp_setting.stated_epsilon(setting)
  game = make_game(setting, dimension=dimension, canary_norm=canary_norm)
  mean_in, mean_out = release_means(game)
  distance = float(np.linalg.norm(mean_in - mean_out))
  std_in, std_out = world_noise_stds(game)
  projection = float(np.dot(mean_in - mean_out, game.canary) / np.linalg.norm(game.canary))
  nan = float('nan')
  m: dict[str, Any] = dict(accounting.describe(decl))
  m.update(dp_mechanism=decl.mechanism, dp_level=decl.level, dp_delta=float(setting.delta),
           stated_epsilon=stated, stated_epsilon_source=source, flower_noise_std=std_in,
           flower_noise_std_out=std_out, flower_noise_std_nominal=dp_setting.noise_std(setting),
           effective_noise_multiplier=z,
           game_relation='add_remove' if setting.central else 'zero_out',
           release_sensitivity=distance,
           dp_epsilon=accounting.epsilon(decl, z, delta=setting.delta),
           dp_epsilon_exact=dp_setting.gaussian_pair_epsilon(distance, std_in, std_out,
                                                             int(dimension), float(setting.delta)),
           # Of the score alone (std of the in-world): no more than the release's.
           dp_epsilon_exact_projection=auditing.gdp_epsilon(projection / std_in,
                                                            float(setting.delta)),
           dp_epsilon_exact_worst=(auditing.gdp_epsilon(2.0 / z, float(setting.delta))
                                   if setting.wrapper in ('server_fixed', 'client_fixed')
                                   else nan),
           dp_epsilon_exact_replace_one=(
               nan if setting.central else
               auditing.gdp_epsilon(2.0 * setting.clipping_norm / std_in, float(setting.delta))))
  if setting.wrapper in dp_setting.ADAPTIVE:
    m.update(clip_after_in=game.clip_after(True), clip_after_out=game.clip_after(False))
  m['flower_rdp_epsilon'] = stated if setting.central else nan
  # The accountant's own verdict: the exact epsilon of the noise Flower really adds exceeds
  # the stated one (a claim broken analytically, whatever an audit of finite size shows).
  m['accountant_violation'] = float(m['dp_epsilon_exact'] > stated * (1 + 1e-9))
  m['replace_one_violation'] = (nan if setting.central else float(
      m['dp_epsilon_exact_replace_one'] > stated * (1 + 1e-9)))
  return m


def make_game(setting: dp_setting.Setting, *, dimension: int = 8, canary_norm: float = 2.0) -> Game:
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
  with _saved_global_generators(), quiet_flower(), inprocess.task_identity(
      inprocess.DEFAULT_RUN_ID, SUPERLINK_NODE_ID):
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


def audit(setting: dp_setting.Setting, key: jax.Array, num_trials: int, *, dimension: int = 8,
          canary_norm: float = 2.0, confidence: float = 0.95) -> dict[str, Any]:
  """The audit of one setting: `claim_metrics`, then the games' lower bounds of epsilon
  (`dp_canary.claim_metrics` against the stated epsilon, Gaussian curves counted), with
  `privacy_violation` (1: a lower bound above Flower's stated epsilon) and the games'
  settings."""
  metrics = claim_metrics(setting, dimension=dimension, canary_norm=canary_norm)
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
