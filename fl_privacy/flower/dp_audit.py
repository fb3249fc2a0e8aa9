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
deployment: `fl_privacy.flower.canaries`.
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
  """Flower's nominal noise std per coordinate: the central wrappers' `compute_stdv(z, C, n)`
  (adaptive: z' of `adaptive_noise` at the initial clip C_0), `local_dp_std` for LocalDpMod.

  The adaptive wrappers draw their noise AFTER updating the clip (flwr 1.42
  `serverapp/strategy/dp_adaptive_clipping.py` lines 213-223 server-side, 319-322
  client-side; `_add_noise_to_aggregated_arrays` line 93 reads `self.clipping_norm`), so the
  std they really add is `world_noise_stds`'s, not this one.
  """
  if setting.wrapper in ADAPTIVE:
    return float(flwr_dp.compute_stdv(adaptive_noise(setting)[1], setting.clipping_norm,
                                      setting.num_sampled_clients))
  if setting.central:
    return float(flwr_dp.compute_stdv(setting.noise_multiplier, setting.clipping_norm,
                                      setting.num_sampled_clients))
  return local_dp_std(setting.sensitivity, setting.epsilon, setting.delta)


def effective_noise_multiplier(setting: Setting) -> float:
  """Nominal noise std / the sensitivity Flower's claim assumes (C / n on the mean of n:
  a fixed denominator, i.e. zero-out; C for LocalDpMod's upload): z for the fixed central
  wrappers, z' for the adaptive ones, std / C for `LocalDpMod`."""
  if setting.central:
    return noise_std(setting) * setting.num_sampled_clients / setting.clipping_norm
  return noise_std(setting) / setting.clipping_norm


def clip(update: np.ndarray, norm: float) -> np.ndarray:
  """Flower's flat clip (`clip_inputs_inplace`, `supercore/differential_privacy.py` 50-58)."""
  return update * min(1.0, float(norm) / float(np.linalg.norm(update)))


def clip_after(setting: Setting, clipped: int, replies: int, clip_norm: float | None = None
               ) -> float:
  """The clip norm an adaptive wrapper holds after one round with `clipped` of `replies`
  updates clipped, the count's noise at its mean (its median: the update is monotone).

  Flower 1.42 `dp_adaptive_clipping.py` 105-111: fraction = (count + N(0, sigma_b)) /
  len(replies), C <- C exp(-lr (fraction - target_clipped_quantile)).
  """
  c = setting.clipping_norm if clip_norm is None else clip_norm
  return float(c * math.exp(-setting.clip_norm_lr * (clipped / replies
                                                     - setting.target_clipped_quantile)))


def gaussian_pair_epsilon(distance: float, std_p: float, std_q: float, dimension: int,
                          delta: float) -> float:
  """Exact epsilon at `delta` between N(mu_P, std_p^2 I_d) and N(mu_Q, std_q^2 I_d) with
  |mu_P - mu_Q| = distance (both orders; the hockey-stick divergence integrated exactly
  over the chi-square of the d - 1 orthogonal coordinates, numerically along the mean
  shift). Equal stds: the analytic Gaussian epsilon of mu = distance / std (Balle & Wang
  2018), `eval.auditing.gdp_epsilon`.
  """
  if math.isclose(std_p, std_q, rel_tol=1e-12):
    return auditing.gdp_epsilon(distance / std_p, delta)
  from scipy import stats as sps  # pylint: disable=g-import-not-at-top
  dof = int(dimension) - 1
  # R / s^2 ~ chi-square(d - 1): midpoint quantiles (R = 0 when d = 1).
  u = (sps.chi2.ppf((np.arange(4000) + 0.5) / 4000, dof) if dof else np.zeros(1))

  def tail(eps, s_p, s_q, under_p):
    # Pr[L > eps], L = log p / q = B x1^2 + c1 x1 + c0 + B R with x1 the coordinate along
    # the shift (mu_Q = 0, mu_P = distance) and R = |x_perp|^2: exact in x1 (the roots of
    # the quadratic, normal CDFs), averaged over the chi-square quantiles of R.
    s, mean = (s_p, distance) if under_p else (s_q, 0.0)
    b = 0.5 * (1.0 / s_q ** 2 - 1.0 / s_p ** 2)
    c1 = distance / s_p ** 2
    k = (dimension * math.log(s_q / s_p) - distance ** 2 / (2 * s_p ** 2) + b * s ** 2 * u
         - eps)
    cdf = lambda x: sps.norm.cdf((x - mean) / s)  # noqa: E731
    if abs(b) * s ** 2 < 1e-12:
      return float(np.mean(1.0 - cdf(-k / c1)))
    disc = c1 ** 2 - 4 * b * k
    root = np.sqrt(np.maximum(disc, 0.0))
    q = -0.5 * (c1 + root)
    r1, r2 = np.minimum(q / b, k / np.where(q == 0, 1e-300, q)), np.maximum(
        q / b, k / np.where(q == 0, 1e-300, q))
    if b > 0:
      p = np.where(disc < 0, 1.0, cdf(r1) + 1.0 - cdf(r2))
    else:
      p = np.where(disc < 0, 0.0, cdf(r2) - cdf(r1))
    return float(np.mean(p))

  def hockey(eps):
    d1 = tail(eps, std_p, std_q, True) - math.exp(eps) * tail(eps, std_p, std_q, False)
    d2 = tail(eps, std_q, std_p, True) - math.exp(eps) * tail(eps, std_q, std_p, False)
    return max(d1, d2)

  lo, hi = 0.0, 1.0
  while hockey(hi) > delta and hi < 1e4:
    lo, hi = hi, 2 * hi
  if hockey(lo) <= delta:
    return lo
  for _ in range(60):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if hockey(mid) > delta else (lo, mid)
  return hi


def declaration(setting: Setting) -> accounting.Declaration:
  """The `fl_privacy.accounting` declaration of the audited game (one Gaussian release)."""
  return accounting.Declaration(
      f'flower_{setting.wrapper}', 'client', 'add_remove', ADVERSARY[setting.wrapper], 'none',
      1.0, 1, note=('Flower central DP, one round, no sampling amplification' if
                    setting.central else 'Flower LocalDpMod, one upload'))


def flower_rdp_epsilon(noise_multiplier: float, num_sampled_clients: int,
                       delta: float, rounds: int = 1) -> float:
  """Epsilon of `rounds` releases of a central wrapper by Flower 1.42's own `RdpAccountant`
  (add-or-remove-one, no amplification: the configuration the wrappers accept)."""
  from flwr.serverapp import RdpAccountant  # pylint: disable=g-import-not-at-top
  from flwr.supercore.privacy_accounting import (  # pylint: disable=g-import-not-at-top
      GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, SamplingMethod)
  n = int(num_sampled_clients)
  acc = RdpAccountant(PrivacyConfig(target_delta=float(delta), population_size=n,
                                    neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                    sampling_method=SamplingMethod.NO_AMPLIFICATION))
  for _ in range(int(rounds)):
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


def claim_metrics(setting: Setting, *, dimension: int = 8, canary_norm: float = 2.0
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
  decl = declaration(setting)
  z = effective_noise_multiplier(setting)
  stated, source = stated_epsilon(setting)
  game = make_game(setting, dimension=dimension, canary_norm=canary_norm)
  mean_in, mean_out = release_means(game)
  distance = float(np.linalg.norm(mean_in - mean_out))
  std_in, std_out = world_noise_stds(game)
  projection = float(np.dot(mean_in - mean_out, game.canary) / np.linalg.norm(game.canary))
  nan = float('nan')
  m: dict[str, Any] = dict(accounting.describe(decl))
  m.update(dp_mechanism=decl.mechanism, dp_level=decl.level, dp_delta=float(setting.delta),
           stated_epsilon=stated, stated_epsilon_source=source, flower_noise_std=std_in,
           flower_noise_std_out=std_out, flower_noise_std_nominal=noise_std(setting),
           effective_noise_multiplier=z,
           game_relation='add_remove' if setting.central else 'zero_out',
           release_sensitivity=distance,
           dp_epsilon=accounting.epsilon(decl, z, delta=setting.delta),
           dp_epsilon_exact=gaussian_pair_epsilon(distance, std_in, std_out,
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
  if setting.wrapper in ADAPTIVE:
    m.update(clip_after_in=game.clip_after(True), clip_after_out=game.clip_after(False))
  m['flower_rdp_epsilon'] = stated if setting.central else nan
  # The accountant's own verdict: the exact epsilon of the noise Flower really adds exceeds
  # the stated one (a claim broken analytically, whatever an audit of finite size shows).
  m['accountant_violation'] = float(m['dp_epsilon_exact'] > stated * (1 + 1e-9))
  m['replace_one_violation'] = (nan if setting.central else float(
      m['dp_epsilon_exact_replace_one'] > stated * (1 + 1e-9)))
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
    return clip_after(self.setting, sum(float(np.linalg.norm(u)) > c0 for u in ups), len(ups))

  def score(self, release: np.ndarray) -> float:
    """The release's projection on the canary direction, minus w_t's."""
    direction = self.canary / np.linalg.norm(self.canary)
    return float(np.dot(release - self.w_t, direction))


def release_means(game: Game) -> tuple[np.ndarray, np.ndarray]:
  """The noiseless release minus w_t in each world (in, out): central, FedAvg's equal-weight
  mean of the clipped replies (n in the in-world, n - 1 in the out-world); local, the
  target's clipped update. Adaptive wrappers clip at the round's clip C_0."""
  c = game.setting.clipping_norm
  return tuple(np.mean([clip(u, c) for u in game.updates(p)], axis=0) for p in (True, False))


def world_noise_stds(game: Game) -> tuple[float, float]:
  """The noise std Flower draws in each world (in, out): the nominal `noise_std`, except the
  adaptive wrappers', drawn at the clip after its update (`Game.clip_after`): z' C_1 / n."""
  s = game.setting
  if s.wrapper not in ADAPTIVE:
    return noise_std(s), noise_std(s)
  z_prime = adaptive_noise(s)[1]
  return tuple(float(flwr_dp.compute_stdv(z_prime, game.clip_after(p), s.num_sampled_clients))
               for p in (True, False))


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
