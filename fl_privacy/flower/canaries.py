"""Flower's DP audited over every round of a real deployment, in one run (canary clients).

The `training` part of `flower_audit`. One Flower deployment per setting on the in-process
grid (`runner.InProcessGrid`): Flower's own `FedAvg` round loop (`Strategy.start`) over
`num_rounds` rounds, wrapped in the setting's DP wrapper, every node's `ClientApp` carrying
the setting's mod (all five of `dp_audit.WRAPPERS`:
`DifferentialPrivacyServerSideFixedClipping`, `DifferentialPrivacyClientSideFixedClipping` +
`fixedclipping_mod`, `LocalDpMod` on every node, `DifferentialPrivacyServerSideAdaptiveClipping`,
`DifferentialPrivacyClientSideAdaptiveClipping` + `adaptiveclipping_mod`). Nothing of Flower
is re-implemented: the noise, the clipping and the adaptive clip's rounds are Flower's.

Nodes. `num_real` ordinary clients, then `num_canaries` canary clients. The model is one
float32 vector of length `dimension` (4096 by default: independent random directions are
near-orthogonal, |cos| ~ 1 / sqrt(d)). The ordinary nodes (`real_clients`) are either
- 'fixed' (the default): their updates are known, fixed random vectors (fresh direction per
  node and round, norms spread `real_norm` x 0.5..2, orthogonal to the Dirac canaries; they
  stand for training clients and keep the run fast: no model, no data, about 1 ms per node
  and round), or
- 'trained': they train a real model on the offline digits (`fl_privacy.data.load`, the
  train split): a one-hidden-layer ReLU MLP 64 -> h -> 10 (`fl_privacy.models.mlp.MLP`), h
  the widest whose P = 75 h + 10 parameters fit in `dimension` (h = 54, P = 4060 of 4096 by
  default), laid on the vector's first P coordinates in `jax.flatten_util.ravel_pytree`
  order (fc1 bias, fc1 kernel, fc2 bias, fc2 kernel), the d - P coordinates after them
  padding no node trains (zero from the start). The global model starts at the MLP's
  initialisation (`fold_in(key, 6)`; 'fixed' starts at zero). Each round a sampled real node
  runs `TRAINED_EPOCHS` epoch of plain SGD (`TRAINED_LEARNING_RATE`, batches of
  `TRAINED_BATCH`) with `fl.local.client_update` from the round's global model on its
  `TRAINED_PER_CLIENT` examples, key fold_in(fold_in(fold_in(key, 5), round), partition),
  and replies the trained parameters (the padding unchanged). Node k's examples are
  positions k x 16 .. k x 16 + 15 (mod N) of a permutation of the 1,438 training digits
  (`fold_in(key, 7)`): disjoint while num_real x 16 <= 1,438, each digit on about
  num_real x 16 / 1,438 nodes beyond (5.6 at 500 nodes). The Dirac canaries (and the
  null's coordinates) are then MLP weights that the real updates move too: the projections
  carry the real updates' cross-talk, the same for both worlds of a canary
  (docs/experiments/flower_audit_sampling.md measures what it costs).

Canaries. Canary i has a fixed random unit direction v_i (from `fold_in(key, i)`) and a fair
coin b_i (also from `fold_in(key, i)`, Steinke et al.'s inclusion with probability 1/2).
Every round, an included canary replies w_t + `canary_norm` x C x v_i (above the clip: C =
the fixed clip, or the adaptive wrappers' initial clip, so Flower's clip must act); an
excluded one is the zero-out neighbour: the same node, present and replying, with an update
of norm 1e-6 C along v_i (a client that did not train: an update of exactly zero crashes
Flower 1.42's clip with a ZeroDivisionError, see `docs/experiments/flower_audit.md`). By
default (`fraction_train` 1) every node replies every round, so FedAvg's denominator
n = num_real + num_canaries is the same in both worlds and Flower's `num_sampled_clients` is
n: the relation is zero-out, the per-round sensitivity C / n of Flower's claim.

Client sampling (`fraction_train` q < 1). Flower's own FedAvg samples the nodes each round:
`FedAvg(fraction_train=q, min_train_nodes=k, min_available_nodes=n)` draws k = int(n q)
nodes without replacement with Python's `random.sample` (flwr 1.42
`serverapp/strategy/fedavg.py` line 170, `strategy_utils.sample_nodes`), seeded by
`jobs.serve` from the job's seed. Every DP wrapper gets `num_sampled_clients` = k (its noise
std z C / k on the mean of the k replies, the adaptive wrappers' default count std k / 20),
so a sampled canary's round is the same Gaussian mechanism as at q = 1 with n -> k (zero-out
among the k sampled: the denominator k does not depend on the coin). Flower's accountant
is built with `SamplingMethod.NO_AMPLIFICATION` (the only one its fixed wrappers accept), so
`privacy_spent()` states the same epsilon at q < 1 as at q = 1: T releases at z, no
amplification by sampling claimed. The adversary audited is the server, which knows whom
it sampled (`adversary` 'server_knows_the_sample'; `sampling`
'fixed_size_without_replacement'): for it there is no amplification by sampling, and its
statistic for canary i uses only the rounds S_i in which it sampled canary i (T_i = |S_i|
rounds, different per canary; `rounds_per_canary_*` records their spread). Each statistic is
then standardised by its null std (the all-iterates sum over S_i divided by the root of its
rounds' noise variances, the last iterate by the root of all T rounds'), so that canaries
sampled in different numbers of rounds share one null N(0, 1) and one threshold; a canary
never sampled scores 0 (it carries no signal; the one-run guess abstains on it) and is left
out of the Gaussian fit (whose null is the never-inserted directions scored over every
round, or, for LocalDpMod's all-iterates adversary, the excluded canaries sampled at least
once). The m canaries stay the one-run bounds' trials. What ran is mu_i-GDP for canary i
with mu_i = sqrt(T_i) / z over all iterates (T_i / (z sqrt(T)) for the last iterate), so the
exact epsilon reported (`exact_epsilon_*`) is that of the canary sampled most (max_i mu_i:
DP is a guarantee for every client, and Steinke et al.'s bound tests the epsilon that holds
for every canary); `exact_epsilon_all_iterates_median_canary` is the median canary's, and
`<threat>/fit_mu_expected` the mean mu_i over the included canaries the fit reads (what the
fit estimates). At q = 1 every T_i = T: the standardisation is one positive factor common to
every score, which changes neither the one-run bounds (ranks) nor the fit (scale-free), and
the code keeps the unstandardised sums there (the defaults' numbers are those of before).

Adversaries (`THREATS`) and scores (projections on v_i):
- `all_iterates`: central wrappers, every aggregate the server (or anyone reading the
  global model) sees, sum_t w_t <aggregate_t - model_(t-1), v_i> with inverse-variance
  weights w_t = C_(t-1) / sigma_t^2 (the round's clip over Flower's noise variance; 1 for
  fixed clipping); LocalDpMod: the server reading every upload of canary i,
  sum_t <upload_(i,t) - model_(t-1), v_i>.
- `last_iterate`: the final model only, <model_T - model_0, v_i>.
The central wrappers' all-iterates sum with equal weights telescopes to the last iterate, so
the two coincide for fixed clipping at q = 1 (with fixed or trained real nodes alike); at
q < 1 the all-iterates statistic sums only the rounds the canary was sampled in.

Statistics per threat model: Steinke, Nasr, Jagielski, "Privacy Auditing with One (1)
Training Run" (NeurIPS 2023, arXiv:2305.08846): `epsilon_one_run` and its f-DP refinement
`epsilon_one_run_fdp` from `fl_privacy.eval.auditing.audit_scores`, the m canaries as the
trials (LOWER bounds, each at `bound_confidence`, see the verdict below). Andrew, Kairouz, Oh,
Oprea, McMahan, Suriyakumar, "One-shot Empirical Privacy Estimation for Federated Learning"
(ICLR 2024, arXiv:2302.03098): a Gaussian fitted to the included canaries' statistic against
the null of `num_null` never-inserted directions scored the same way, mu = (mean_in -
mean_null) / std_null, `epsilon_fit` = `auditing.gdp_epsilon(mu, delta)`: an ESTIMATE, not a bound
(with a bootstrap interval at `confidence`). Beside them Flower's stated epsilon over the
rounds that ran (fixed wrappers: Flower's own `RdpAccountant` passed to the wrapper,
`privacy_spent()`; adaptive: the same accountant composed at z over the rounds, Andrew et
al.'s claim, which Flower does not state itself; LocalDpMod: its `epsilon` argument composed
over the rounds, T eps at T delta) and the exact epsilon of the mechanism Flower ran
(`exact_epsilon`).

The verdict (`privacy_violation`, `best_bound`) takes the largest of the k counted bounds
(`counted_bounds`: both one-run bounds of every threat model the run has a statistic for), so
each is computed at confidence 1 - (1 - c) / k, c = `Design.confidence` (Bonferroni over the
counted bounds, fixed by the wrapper and the threats present before any score is seen): the
verdict then holds at family-wise confidence c. The maximum of k bounds each at c is
guaranteed only at 1 - k (1 - c) (0.80 for four 95% bounds). The f-DP bound tests Gaussian
trade-off curves; it counts for every wrapper here, as in `dp_audit.audit`: each adds Gaussian
noise to clipped updates (the adaptive ones at a clip their noisy count moves), and the claims
it is tested against are Gaussian (Flower's RdpAccountant at z, Andrew et al.'s claim for the
adaptive ones; LocalDpMod's Gaussian calibration). k = 4 (two threats x two bounds) for
every wrapper as deployed; 2 for LocalDpMod without recorded uploads (last iterate only).

Randomness: Flower's noise comes from numpy's global generator (FedAvg samples with Python's
`random`), seeded from the run's key and restored afterwards; directions, coins, the fixed
real updates, the trained model's initialisation, the real nodes' examples and their local
SGD from `fold_in` keys. A setting's results depend only on its key.
"""

from __future__ import annotations

import dataclasses
import functools
import logging as py_logging
import math
import time
from typing import Any

import jax
import jax.flatten_util  # pylint: disable=unused-import
import numpy as np
import optax

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import LocalDpMod, adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp import RdpAccountant
from flwr.serverapp import strategy as flwr_strategy
from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig
from flwr.supercore.privacy_accounting import SamplingMethod

from fl_privacy import data as data_lib
from fl_privacy.eval import auditing
from fl_privacy.fl import local
from fl_privacy.fl import losses
from fl_privacy.flower import client as client_lib
from fl_privacy.flower import dp_audit
from fl_privacy.flower import jobs
from fl_privacy.models import mlp

THREATS = ('all_iterates', 'last_iterate')
# The one-run lower bounds `audit` reports per threat model, all counted in the verdict: the
# f-DP one tests Gaussian trade-off curves, and every wrapper audited here is a Gaussian
# mechanism under a Gaussian claim (`dp_audit.audit` counts the Gaussian-curve bounds for all
# five wrappers likewise; the training audit's `NON_GAUSSIAN`, in `attacks.audit`, lists
# LDP-SGD and subsampled mechanisms, none of which runs here).
BOUNDS = ('epsilon_one_run', 'epsilon_one_run_fdp')
DIRECTIONS = ('dirac', 'random')
REAL_CLIENTS = ('fixed', 'trained')
ARRAY_NAME = 'w'
IDLE = 1e-6  # the excluded canary's update norm, in units of C
# What the metrics say of the sampling and of the adversary's knowledge of it.
SAMPLING_NONE = 'none'  # every node every round (fraction_train 1)
SAMPLING_FIXED_SIZE = 'fixed_size_without_replacement'  # FedAvg's random.sample of k of n
ADVERSARY = 'server_knows_the_sample'  # scores a canary on its sampled rounds: no amplification
# The trained real nodes' local training (real_clients 'trained'): one epoch of plain SGD on
# 16 digits in batches of 8, two steps a round (code constants, like the MLP's shape).
TRAINED_PER_CLIENT = 16
TRAINED_BATCH = 8
TRAINED_EPOCHS = 1
TRAINED_LEARNING_RATE = 0.1
DIGITS_FEATURES, DIGITS_CLASSES = 64, 10  # 8 x 8 grey digits


@dataclasses.dataclass(frozen=True)
class Design:
  """The canary game's sizes.

  Attributes:
    num_canaries: m canary nodes (each included with probability 1/2).
    num_real: ordinary nodes (known fixed updates, or trained: `real_clients`).
    num_rounds: FedAvg rounds T (every one audited).
    dimension: d, the model vector's length.
    canary_norm: an included canary's update norm in units of C (the initial clip for the
      adaptive wrappers), >= 1.
    real_norm: the fixed real updates' norms are real_norm x 0.5..2 (absolute; not read
      with trained real nodes).
    num_null: never-inserted directions for the Gaussian fit's null.
    confidence: the family-wise confidence c of the verdict (`privacy_violation`): each of
      the k counted one-run bounds is computed at 1 - (1 - c) / k (`audit`); also the level
      of the Gaussian fit's bootstrap interval.
    directions: 'dirac' (canary i on coordinate i, the null on coordinates m..m+num_null-1:
      exactly orthogonal, no canary cross-talk, the fixed real updates on the remaining
      coordinates; needs d > m + num_null) or 'random'
      (independent random unit vectors; the included canaries' cross-talk adds variance
      T m / (2 d) in units of the per-round noise when z = 1, which lowers the fit).
    fraction_train: q in (0, 1], FedAvg's `fraction_train`: k = int(n q) >= 1 nodes sampled
      without replacement each round (`sample_size`); 1 (every node every round) by default.
    real_clients: 'fixed' (known random updates) or 'trained' (an MLP trained on the
      digits; needs d >= `MIN_TRAINED_DIMENSION`), see the module docstring.
  """
  num_canaries: int = 256
  num_real: int = 256
  num_rounds: int = 5
  dimension: int = 4096
  canary_norm: float = 2.0
  real_norm: float = 1.0
  num_null: int = 1000
  confidence: float = 0.95
  directions: str = 'dirac'
  fraction_train: float = 1.0
  real_clients: str = 'fixed'

  def __post_init__(self):
    if self.directions not in DIRECTIONS:
      raise ValueError(f'directions must be one of {DIRECTIONS} (got {self.directions!r})')
    if self.directions == 'dirac' and self.dimension <= self.num_canaries + self.num_null:
      raise ValueError(f'dirac canaries need dimension > num_canaries + num_null '
                       f'({self.num_canaries} + {self.num_null}), got {self.dimension}')
    if not 0 < float(self.fraction_train) <= 1 or self.sample_size < 1:
      raise ValueError(f'fraction_train must be in (0, 1] with int(n x fraction_train) >= 1 '
                       f'(n = {self.num_nodes}), got {self.fraction_train}')
    if self.real_clients not in REAL_CLIENTS:
      raise ValueError(f'real_clients must be one of {REAL_CLIENTS} (got '
                       f'{self.real_clients!r})')
    if self.real_clients == 'trained' and self.dimension < MIN_TRAINED_DIMENSION:
      raise ValueError(f'trained real clients need dimension >= {MIN_TRAINED_DIMENSION} (an '
                       f'MLP with one hidden unit), got {self.dimension}')

  @property
  def num_nodes(self) -> int:
    return int(self.num_canaries) + int(self.num_real)

  @property
  def sample_size(self) -> int:
    """k, the nodes FedAvg trains each round: Flower's own `int(n * fraction_train)` (flwr
    1.42 `serverapp/strategy/fedavg.py` line 170; `min_train_nodes` is k, so the max it takes
    with it changes nothing)."""
    return int(self.num_nodes * float(self.fraction_train))

  @property
  def sampled(self) -> bool:
    return float(self.fraction_train) < 1.0

  def point_params(self) -> dict[str, Any]:
    """The fields a results point must carry beyond the sizes it always has: the ones off
    their default only (`fraction_train`, `real_clients`), so that a default point's params,
    and the key drawn from them, stay those of before these fields existed."""
    out: dict[str, Any] = {}
    if self.sampled:
      out['fraction_train'] = float(self.fraction_train)
    if self.real_clients != 'fixed':
      out['real_clients'] = str(self.real_clients)
    return out


def mlp_hidden(dimension: int) -> int:
  """h, the widest hidden layer of a 64 -> h -> 10 MLP whose 75 h + 10 parameters fit in
  `dimension` (0 below `MIN_TRAINED_DIMENSION`)."""
  return max((int(dimension) - DIGITS_CLASSES) // (DIGITS_FEATURES + 1 + DIGITS_CLASSES), 0)


MIN_TRAINED_DIMENSION = DIGITS_FEATURES + 1 + 2 * DIGITS_CLASSES  # h = 1: 85 parameters


def _unit_rows(key: jax.Array, rows: int, dimension: int) -> np.ndarray:
  g = np.asarray(jax.random.normal(key, (rows, dimension)), np.float64)
  return g / np.linalg.norm(g, axis=1, keepdims=True)


def canary_draws(key: jax.Array, design: Design) -> tuple[np.ndarray, np.ndarray]:
  """(included bool [m], directions float64 [m, d] unit rows): canary i's fair coin and
  direction from `fold_in(key, i)`."""
  def one(i):
    k_coin, k_dir = jax.random.split(jax.random.fold_in(key, i))
    v = jax.random.normal(k_dir, (int(design.dimension),))
    return jax.random.bernoulli(k_coin), v / jax.numpy.linalg.norm(v)
  coins, dirs = jax.jit(jax.vmap(one))(np.arange(int(design.num_canaries), dtype=np.int32))
  if design.directions == 'dirac':
    dirs = np.eye(int(design.num_canaries), int(design.dimension))
  return np.asarray(coins, bool), np.asarray(dirs, np.float64)


def null_directions(key: jax.Array, design: Design) -> np.ndarray:
  """[num_null, d] never-inserted unit directions: Dirac on the coordinates after the
  canaries', or fresh random unit vectors."""
  m, k, d = int(design.num_canaries), int(design.num_null), int(design.dimension)
  if design.directions == 'dirac':
    return np.eye(d)[m:m + k]
  return _unit_rows(key, k, d)


def real_updates(key: jax.Array, design: Design) -> np.ndarray:
  """float64 [T, num_real, d]: the ordinary nodes' known updates (fresh random direction per
  node and round; node k's norm real_norm x linspace(0.5, 2)[k]). With Dirac canaries they
  live on the coordinates after the canaries' and the null's (orthogonal to both: the
  projections carry the canary and Flower's noise only, as in `dp_audit`'s game)."""
  t, k, d = int(design.num_rounds), int(design.num_real), int(design.dimension)
  if k == 0:
    return np.zeros((t, 0, d))
  g = np.asarray(jax.random.normal(key, (t * k, d)), np.float64)
  if design.directions == 'dirac':
    g[:, :int(design.num_canaries) + int(design.num_null)] = 0.0
  dirs = (g / np.linalg.norm(g, axis=1, keepdims=True)).reshape(t, k, d)
  return dirs * (float(design.real_norm) * np.linspace(0.5, 2.0, k))[None, :, None]


def trained_model(dimension: int) -> mlp.MLP:
  """The trained real nodes' model: 64 -> `mlp_hidden(dimension)` -> 10, ReLU."""
  return mlp.MLP(hidden=(mlp_hidden(dimension),), num_classes=DIGITS_CLASSES)


def _digit_input() -> np.ndarray:
  return np.zeros((1, 8, 8, 1), np.float32)


def model_unravel(dimension: int):
  """(P, unravel): the MLP's parameter count and the map from the vector's first P
  coordinates to its variables (`ravel_pytree` order)."""
  shapes = jax.eval_shape(trained_model(dimension).init, jax.random.key(0), _digit_input())
  zeros = jax.tree_util.tree_map(lambda a: np.zeros(a.shape, a.dtype), shapes)
  flat, unravel = jax.flatten_util.ravel_pytree(zeros)
  return int(flat.size), unravel


def initial_model(key: jax.Array, design: Design) -> np.ndarray:
  """float32 [d], the global model before round 1: zero with fixed real updates; with
  trained ones the MLP's initialisation from `key` on the first P coordinates, zero after."""
  w = np.zeros(int(design.dimension), np.float32)
  if design.real_clients == 'trained':
    flat = _init(int(design.dimension))(key)
    w[:flat.size] = np.asarray(flat, np.float32)
  return w


@functools.lru_cache(maxsize=8)
def _init(dimension: int):
  """key -> the MLP's flat initial parameters, compiled once (op by op, Flax's initialisers
  cost a compilation each)."""
  model = trained_model(dimension)
  return jax.jit(lambda key: jax.flatten_util.ravel_pytree(model.init(key, _digit_input()))[0])


def digits_splits() -> dict[str, data_lib.Dataset]:
  """The offline digits every part of `flower_audit` uses (train 1,438, test 359)."""
  return data_lib.load({'name': 'digits'})


def real_shards(key: jax.Array, design: Design, num_examples: int) -> np.ndarray:
  """int [num_real, TRAINED_PER_CLIENT]: node k's example indices, positions
  k x 16 .. k x 16 + 15 (mod N) of a permutation drawn from `key` (disjoint while
  num_real x 16 <= N)."""
  order = np.asarray(jax.random.permutation(key, int(num_examples)))
  pos = (np.arange(int(design.num_real))[:, None] * TRAINED_PER_CLIENT
         + np.arange(TRAINED_PER_CLIENT)[None, :])
  return order[pos % int(num_examples)]


@functools.lru_cache(maxsize=8)
def _local_sgd(dimension: int):
  """flat params [P], x, y, key -> the flat params after the real node's local SGD (one
  compiled function per model shape, shared by every `RealTrainer` of this process)."""
  _, unravel = model_unravel(dimension)
  loss_fn = losses.make_loss_fn(trained_model(dimension).apply)
  optimizer = optax.sgd(TRAINED_LEARNING_RATE)

  def step(flat, xs, ys, key):
    _, trained = local.client_update(loss_fn, unravel(flat), xs, ys, key=key,
                                     optimizer=optimizer, epochs=TRAINED_EPOCHS,
                                     batch_size=TRAINED_BATCH)
    return jax.flatten_util.ravel_pytree(trained)[0]
  return jax.jit(step)


class RealTrainer:
  """The trained real nodes: node k, in round r, runs `fl.local.client_update` (plain SGD,
  `TRAINED_EPOCHS` epoch, batches of `TRAINED_BATCH`) from the received model's first P
  coordinates on its digits, key fold_in(fold_in(fold_in(key, 5), r), k) for the run's
  `key`; its examples come from fold_in(key, 7) (`real_shards`). `__call__` returns the
  reply: the trained parameters, then the received padding. Rebuilt from (key, design)
  in any process: the job carries no array of it."""

  def __init__(self, key: jax.Array, design: Design):
    self.key = jax.random.fold_in(key, 5)
    self.size, _ = model_unravel(int(design.dimension))
    train = digits_splits()['train']
    idx = real_shards(jax.random.fold_in(key, 7), design, len(train))
    x, y = data_lib.to_float(train.x), train.y.astype(np.int32)
    self.x, self.y = x[idx], y[idx]
    self.step = _local_sgd(int(design.dimension))

  def __call__(self, w: np.ndarray, server_round: int, partition: int) -> np.ndarray:
    k = jax.random.fold_in(jax.random.fold_in(self.key, int(server_round)), int(partition))
    out = np.asarray(w, np.float32).copy()
    out[:self.size] = np.asarray(self.step(out[:self.size], self.x[partition],
                                           self.y[partition], k))
    return out


def digits_metrics(design: Design, models: np.ndarray, split: str = 'test'
                   ) -> dict[str, list[float]]:
  """The MLP's mean cross-entropy ('loss') and accuracy ('accuracy') on a digits split at
  each model of a trained run ([T + 1, d]: before round 1 and after each round)."""
  size, _ = model_unravel(int(design.dimension))
  data = digits_splits()[split]
  x, y = data_lib.to_float(data.x), data.y.astype(np.int32)
  measure = _measure(int(design.dimension))
  out: dict[str, list[float]] = {'loss': [], 'accuracy': []}
  for w in np.asarray(models):
    loss, accuracy = measure(np.asarray(w[:size], np.float32), x, y)
    out['loss'].append(float(loss))
    out['accuracy'].append(float(accuracy))
  return out


@functools.lru_cache(maxsize=8)
def _measure(dimension: int):
  """flat params, x, y -> (mean cross-entropy, accuracy) of the MLP, compiled once."""
  _, unravel = model_unravel(dimension)
  apply = trained_model(dimension).apply

  def measure(flat, x, y):
    logits = apply(unravel(flat), x)
    return losses.cross_entropy(logits, y), jax.numpy.mean(jax.numpy.argmax(logits, -1) == y)
  return jax.jit(measure)


def trained_metrics(design: Design, models: np.ndarray) -> dict[str, Any]:
  """The trained model's shape and its test loss and accuracy by round (`digits_test_loss`,
  `digits_test_accuracy`: [T + 1] lists, the global model before round 1 and after each)."""
  size, _ = model_unravel(int(design.dimension))
  test = digits_metrics(design, models)
  return dict(model=f'mlp 64-{mlp_hidden(design.dimension)}-10',
              model_parameters=size, digits_test_loss=test['loss'],
              digits_test_accuracy=test['accuracy'])


def client_app(setting: dp_audit.Setting, design: Design, included: np.ndarray,
               directions: np.ndarray, real, seed: int = 0) -> ClientApp:
  """One `ClientApp` for every node (its `partition-id` says which): real node k < num_real
  replies w_t + real[t - 1, k] (`real` the fixed updates [T, num_real, d]) or what `real`
  trains (a `RealTrainer`: `real(w_t, t, k)`); canary i = k - num_real replies
  w_t + canary_norm C v_i when included, w_t + 1e-6 C v_i otherwise. It carries the
  setting's Flower mod."""
  mods = {'client_fixed': [fixedclipping_mod], 'client_adaptive': [adaptiveclipping_mod],
          'local_dp': [LocalDpMod(setting.clipping_norm, setting.sensitivity, setting.epsilon,
                                  setting.delta)]}.get(setting.wrapper, [])
  app = ClientApp(mods=[seeding_mod(seed)] + mods)
  c = float(setting.clipping_norm)
  num_real = int(design.num_real)

  @app.train()
  def train(msg: Message, context: Context) -> Message:
    k = int(context.node_config['partition-id'])
    r = client_lib.server_round(msg.content)
    name, record = next(iter(msg.content.array_records.items()))
    w = np.asarray(record[ARRAY_NAME].numpy(), np.float64)
    if k < num_real and callable(real):
      reply = real(w, r, k)
    else:
      if k < num_real:
        update = real[r - 1, k]
      else:
        i = k - num_real
        update = directions[i] * c * (float(design.canary_norm) if included[i] else IDLE)
      reply = (w + update).astype(np.float32)
    arrays = ArrayRecord({ARRAY_NAME: Array(reply)})
    return Message(RecordDict({name: arrays, 'metrics': MetricRecord({'num-examples': 1})}),
                   reply_to=msg)

  return app


class _Sampling(flwr_strategy.FedAvg):
  """Flower's FedAvg, unchanged, keeping the node ids it sampled each round (`sampled`, one
  list a round: what the server knows). Only `configure_train` is overridden: the fixed
  wrappers' accountant requires FedAvg's own `aggregate_train`."""

  def __init__(self, **kw):
    super().__init__(**kw)
    self.sampled: list[list[int]] = []

  def configure_train(self, server_round, arrays, config, grid):
    messages = list(super().configure_train(server_round, arrays, config, grid))
    self.sampled.append([int(msg.metadata.dst_node_id) for msg in messages])
    return messages


class _Uploads(_Sampling):
  """FedAvg that reads every canary upload (LocalDpMod's all-iterates adversary: the server
  sees each upload): per round, canary i's upload minus the round's model, projected on v_i
  (`projections` [T, m]; NaN for a canary not sampled that round)."""

  def __init__(self, canary_nodes: list[int], directions: np.ndarray, **kw):
    super().__init__(**kw)
    self.canary_nodes = {n: i for i, n in enumerate(canary_nodes)}
    self.directions = directions
    self.model = None
    self.projections: list[np.ndarray] = []

  def configure_train(self, server_round, arrays, config, grid):
    self.model = np.asarray(arrays[ARRAY_NAME].numpy(), np.float64)
    return super().configure_train(server_round, arrays, config, grid)

  def aggregate_train(self, server_round, replies):
    replies = list(replies)
    row = np.full(len(self.canary_nodes), np.nan)
    for reply in replies:
      i = self.canary_nodes.get(reply.metadata.src_node_id)
      if i is not None and not reply.has_error():
        v = next(iter(reply.content.array_records.values()))[ARRAY_NAME].numpy()
        row[i] = float(np.dot(np.asarray(v, np.float64) - self.model, self.directions[i]))
    self.projections.append(row)
    return super().aggregate_train(server_round, replies)


def _accountant(setting: dp_audit.Setting, n: int) -> RdpAccountant:
  return RdpAccountant(PrivacyConfig(
      target_delta=float(setting.delta), population_size=int(n),
      neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
      sampling_method=SamplingMethod.NO_AMPLIFICATION))


def build_strategy(setting: dp_audit.Setting, design: Design, canary_nodes: list[int],
                   directions: np.ndarray):
  """Flower's FedAvg (`_Sampling`: it keeps whom it sampled) training k = `sample_size` of
  the n nodes each round (all of them at fraction_train 1), wrapped in the setting's DP
  wrapper with `num_sampled_clients` k (the fixed ones with Flower's own `RdpAccountant`
  over the population n, no amplification); LocalDpMod: `_Uploads` (it keeps uploads too)."""
  n, k = design.num_nodes, design.sample_size
  kw = dict(fraction_train=float(design.fraction_train), fraction_evaluate=0.0,
            min_train_nodes=k, min_available_nodes=n)
  if setting.wrapper == 'local_dp':
    return _Uploads(canary_nodes, directions, **kw)
  inner = _Sampling(**kw)
  if setting.wrapper in dp_audit.ADAPTIVE:
    cls = (flwr_strategy.DifferentialPrivacyServerSideAdaptiveClipping
           if setting.wrapper == 'server_adaptive' else
           flwr_strategy.DifferentialPrivacyClientSideAdaptiveClipping)
    return cls(inner, setting.noise_multiplier, k, initial_clipping_norm=setting.clipping_norm,
               target_clipped_quantile=setting.target_clipped_quantile,
               clip_norm_lr=setting.clip_norm_lr,
               clipped_count_stddev=setting.clipped_count_stddev)
  cls = (flwr_strategy.DifferentialPrivacyServerSideFixedClipping
         if setting.wrapper == 'server_fixed' else
         flwr_strategy.DifferentialPrivacyClientSideFixedClipping)
  return cls(inner, setting.noise_multiplier, setting.clipping_norm, k,
             accountant=_accountant(setting, n))


def _key(args) -> jax.Array:
  return jax.random.wrap_key_data(np.asarray(args['key']))


def _canaries(args) -> tuple[np.ndarray, np.ndarray]:
  data = np.asarray(args['key'])
  return _cached_draws(data.tobytes(), str(data.dtype), data.shape, args['design'])


@functools.lru_cache(maxsize=2)
def _cached_draws(data: bytes, dtype: str, shape: tuple[int, ...], design: Design
                  ) -> tuple[np.ndarray, np.ndarray]:
  # A deployment draws them in its ClientApp, its server and `deploy` (one process in
  # process): each `canary_draws` call compiles its vmap again.
  key = jax.random.wrap_key_data(np.frombuffer(data, dtype).reshape(shape))
  return canary_draws(jax.random.fold_in(key, 0), design)


def _real(args):
  """The real nodes' fixed updates [T, num_real, d], or their `RealTrainer`."""
  key, design = _key(args), args['design']
  if design.real_clients == 'trained':
    return RealTrainer(key, design)
  return real_updates(jax.random.fold_in(key, 1), design)


def _server_seed(key: jax.Array) -> int:
  return int(jax.random.bits(jax.random.fold_in(key, 2), dtype=np.uint32))


def seeding_mod(seed: int):
  """A Flower mod (first in the ClientApp's list) that seeds numpy's global generator, where
  LocalDpMod draws its noise, from (seed, server round, partition) for the message and
  restores it after: the same noise whichever process or engine runs the node."""
  def mod(msg: Message, context: Context, call_next) -> Message:
    r = client_lib.server_round(msg.content) if msg.metadata.message_type == 'train' else 0
    k = int(context.node_config['partition-id'])
    with jobs.seeded(int(np.random.SeedSequence([int(seed), r, k]).generate_state(1)[0])):
      return call_next(msg, context)
  return mod


def job_client(args) -> ClientApp:
  """The nodes' ClientApp of a canary deployment (a `jobs.Job` of part 'training')."""
  included, directions = _canaries(args)
  return client_app(args['setting'], args['design'], included, directions, _real(args),
                    seed=int(args['seed']))


def job_server(args, grid) -> dict[str, Any]:
  """Flower's FedAvg in the setting's DP wrapper over the nodes of `grid` for `num_rounds`
  (`deploy`'s return, without the draws)."""
  setting, design = args['setting'], args['design']
  _, directions = _canaries(args)
  nodes = list(grid.get_node_ids())
  with dp_audit.quiet_flower():
    strategy = build_strategy(setting, design, nodes[int(design.num_real):], directions)
  models, clips = [], []

  def observe(server_round, arrays):
    del server_round
    models.append(np.asarray(arrays[ARRAY_NAME].numpy(), np.float64))
    clips.append(float(getattr(strategy, 'clipping_norm', math.nan)))

  start = time.perf_counter()
  initial = initial_model(jax.random.fold_in(_key(args), 6), design)
  with dp_audit.quiet_flower(py_logging.ERROR):
    strategy.start(grid, ArrayRecord({ARRAY_NAME: Array(initial)}),
                   num_rounds=int(design.num_rounds), evaluate_fn=observe)
  if len(models) != int(design.num_rounds) + 1:
    raise RuntimeError(f'{len(models) - 1} of {design.num_rounds} rounds released a model')
  spent = strategy.privacy_spent() if hasattr(strategy, 'privacy_spent') else None
  return dict(models=np.stack(models), clips=np.asarray(clips),
              upload_projections=(np.stack(strategy.projections)
                                  if isinstance(strategy, _Uploads) else None),
              sampled=sampled_matrix(getattr(strategy, 'strategy', strategy).sampled, nodes),
              stated_flower=(float(spent.epsilon) if spent is not None else math.nan),
              seconds=time.perf_counter() - start)


def sampled_matrix(sampled: list[list[int]], nodes: list[int]) -> np.ndarray:
  """bool [T, n]: whether FedAvg sampled the node of partition j in round t (`nodes`: the
  node ids by partition)."""
  column = {int(node): j for j, node in enumerate(nodes)}
  out = np.zeros((len(sampled), len(nodes)), bool)
  for t, ids in enumerate(sampled):
    out[t, [column[int(i)] for i in ids]] = True
  return out


def deploy(setting: dp_audit.Setting, design: Design, key: jax.Array, *,
           engine: str = 'inprocess', workdir: str | None = None) -> dict[str, Any]:
  """Runs the deployment on `engine` (`engines.run_job`): {'included' [m], 'directions'
  [m, d], 'models' [T + 1, d] (the global model before round 1 and after each round),
  'clips' [T + 1] (the wrapper's clip after each round, NaN without one),
  'upload_projections' [T, m] (LocalDpMod: canary i's upload minus the round's model, on v_i;
  NaN where not sampled) or None, 'sampled' [T, n] (FedAvg sampled partition j in round t),
  'participation' [T, m] (its canaries' columns), 'stated_flower' (the fixed wrappers'
  `privacy_spent().epsilon`, else NaN), 'seconds', 'num_nodes'}. A lost reply (error,
  timeout) raises `jobs.EngineError`: the audit's worlds need every sampled canary's
  reply."""
  from fl_privacy.flower import engines  # pylint: disable=import-outside-toplevel
  seed = _server_seed(key)
  args = dict(setting=setting, design=design, key=np.asarray(jax.random.key_data(key)),
              seed=seed)
  out = engines.run_job(engine, jobs.Job('training', design.num_nodes, args, seed=seed),
                        workdir)
  if out['losses']:
    lost = sorted({(x['round'], x['partition']) for x in out['losses']})
    raise jobs.EngineError(f'the canary deployment lost {len(lost)} replies (round, '
                           f'partition): {lost[:5]}' + (' ...' if len(lost) > 5 else ''))
  included, directions = _canaries(args)
  result = out['result']
  return dict(result, included=included, directions=directions, num_nodes=design.num_nodes,
              participation=result['sampled'][:, int(design.num_real):])


def scores(setting: dp_audit.Setting, run: dict[str, Any], directions: np.ndarray,
           rounds: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Each threat model's statistic for the given unit directions [k, d] (the canaries', or
  never-inserted ones for the null; LocalDpMod's all-iterates statistic needs the canaries'
  own uploads, so it is defined for the canaries only: the null is their excluded half).

  `rounds` None: every direction over every round, the sums as they are (fraction_train 1).
  Else bool [T, k], the rounds each direction is scored over (canary i: the rounds the
  server sampled it in; the null: every round), and each statistic standardised to null
  std 1 (`_sampled_scores`), 0 for a direction with no round."""
  if rounds is not None:
    return _sampled_scores(setting, run, directions, np.asarray(rounds, bool))
  models = run['models']
  deltas = np.diff(models, axis=0)  # [T, d] aggregate_t - model_(t-1)
  out = {'last_iterate': directions @ (models[-1] - models[0])}
  if setting.wrapper == 'local_dp':
    if run['upload_projections'] is not None and directions is run['directions']:
      out['all_iterates'] = run['upload_projections'].sum(axis=0)
    return out
  out['all_iterates'] = (directions @ deltas.T) @ _round_weights(setting, run)
  return out


def _round_weights(setting: dp_audit.Setting, run: dict[str, Any]) -> np.ndarray:
  """The central wrappers' inverse-variance weights of the rounds: 1 for fixed clipping;
  C_(t-1) / sigma_t^2 (up to z'^2 / n^2), normalised to mean 1, for the adaptive ones."""
  weights = np.ones(len(run['models']) - 1)
  if setting.wrapper in dp_audit.ADAPTIVE:
    clips = run['clips']
    weights = clips[:-1] / clips[1:] ** 2  # C_(t-1) / sigma_t^2, up to z'^2 / n^2
    weights = weights / weights.mean()
  return weights


def _round_noise(setting: dp_audit.Setting, run: dict[str, Any]) -> np.ndarray:
  """Each round's noise std on the aggregate, up to one factor common to the rounds: the
  adaptive wrappers' z' C_t / k moves with the clip; the others' is constant."""
  if setting.wrapper in dp_audit.ADAPTIVE:
    return np.asarray(run['clips'][1:], np.float64)
  return np.ones(len(run['models']) - 1)


def _sampled_scores(setting: dp_audit.Setting, run: dict[str, Any], directions: np.ndarray,
                    rounds: np.ndarray) -> dict[str, np.ndarray]:
  """`scores` over each direction's own rounds [T, k]: all iterates, the weighted sum over
  them divided by the root of its rounds' (weight x noise std)^2 (LocalDpMod: the canary's
  uploads over sqrt(T_i)); last iterate, the projection over the root of every round's
  noise variance (the final model carries every round's noise). Standardised so that
  directions scored over different numbers of rounds share one null, mean 0 and std 1 in
  units of a factor common to all (the per-round noise std)."""
  models = run['models']
  deltas = np.diff(models, axis=0)
  noise = _round_noise(setting, run)
  taken = rounds.any(axis=0)
  last = directions @ (models[-1] - models[0]) / math.sqrt(float(np.sum(noise ** 2)))
  out = {'last_iterate': np.where(taken, last, 0.0)}
  if setting.wrapper == 'local_dp':
    if run['upload_projections'] is not None and directions is run['directions']:
      own = np.where(rounds, run['upload_projections'], 0.0).sum(axis=0)
      out['all_iterates'] = own / np.sqrt(np.maximum(rounds.sum(axis=0), 1))
    return out
  w = _round_weights(setting, run)
  total = ((directions @ deltas.T) * rounds.T) @ w
  spread = np.sqrt(rounds.T.astype(np.float64) @ (w * noise) ** 2)
  out['all_iterates'] = np.where(taken, total / np.where(taken, spread, 1.0), 0.0)
  return out


def stated(setting: dp_audit.Setting, design: Design, run: dict[str, Any]
           ) -> tuple[float, float, str]:
  """(Flower's stated epsilon over the T rounds, its delta, source)."""
  t = int(design.num_rounds)
  if setting.wrapper in ('server_fixed', 'client_fixed'):
    return run['stated_flower'], float(setting.delta), 'flwr RdpAccountant (privacy_spent)'
  if setting.wrapper in dp_audit.ADAPTIVE:
    return (dp_audit.flower_rdp_epsilon(setting.noise_multiplier, design.num_nodes,
                                        setting.delta, rounds=t), float(setting.delta),
            'flwr RdpAccountant at z over the rounds (Andrew et al.; Flower states none)')
  return (t * float(setting.epsilon), t * float(setting.delta),
          'LocalDpMod epsilon x rounds (basic composition, at rounds x delta)')


def exact_epsilons(setting: dp_audit.Setting, design: Design, run: dict[str, Any],
                   delta: float) -> dict[str, float]:
  """The exact epsilon of what Flower ran, per canary (zero-out), as mu-GDP composed over
  the rounds (Dong et al. 2019): fixed central, mu = sqrt(T) / z (sensitivity C / n, noise
  z C / n, both adversaries); adaptive, per round (C_(t-1) / n) / (z' C_t / n) at the clips
  the run went through (noise drawn after the clip's update), the aggregates alone
  (`exact_epsilon`) and with the noisy counts of Flower's 0/1 bits (sensitivity 1 under
  zero-out, std sigma_b: `exact_epsilon_with_counts`); LocalDpMod, every upload
  sqrt(T) C / sigma (all iterates) and the final mean sqrt(T) C / (sigma sqrt(n)) (last).

  With client sampling (fraction_train < 1; n -> k, the sample size, in the formulas) each
  canary i is mu_i-GDP over the T_i rounds the server sampled it in (`canary_mus`): the
  exact epsilons are those of the canary sampled most (the largest mu_i), and
  `exact_epsilon_all_iterates_median_canary` that of the median one."""
  if design.sampled:
    return _sampled_exact_epsilons(setting, design, run, delta)
  t, n = int(design.num_rounds), design.num_nodes
  s = dataclasses.replace(setting, num_sampled_clients=n)
  out = {}
  if s.wrapper in ('server_fixed', 'client_fixed'):
    mu = math.sqrt(t) / s.noise_multiplier
    out.update(exact_epsilon_all_iterates=auditing.gdp_epsilon(mu, delta),
               exact_epsilon_last_iterate=auditing.gdp_epsilon(mu, delta))
  elif s.wrapper in dp_audit.ADAPTIVE:
    std_b, z_prime = dp_audit.adaptive_noise(s)
    c = run['clips']
    per_round = c[:-1] / (z_prime * c[1:])
    mu_all = float(np.sqrt(np.sum(per_round ** 2)))
    mu_last = float(np.sum(c[:-1]) / (z_prime * np.sqrt(np.sum(c[1:] ** 2))))
    out.update(exact_epsilon_all_iterates=auditing.gdp_epsilon(mu_all, delta),
               exact_epsilon_last_iterate=auditing.gdp_epsilon(mu_last, delta),
               exact_epsilon_with_counts=auditing.gdp_epsilon(
                   math.sqrt(mu_all ** 2 + t / std_b ** 2), delta),
               exact_epsilon_as_claimed=auditing.gdp_epsilon(
                   math.sqrt(t) / s.noise_multiplier, delta),
               noise_multiplier_aggregate=float(z_prime), clipped_count_stddev=float(std_b))
  else:
    sigma = dp_audit.local_dp_std(s.sensitivity, s.epsilon, s.delta)
    mu = math.sqrt(t) * s.clipping_norm / sigma
    out.update(exact_epsilon_all_iterates=auditing.gdp_epsilon(mu, delta),
               exact_epsilon_last_iterate=auditing.gdp_epsilon(mu / math.sqrt(n), delta))
  return out


def canary_mus(setting: dp_audit.Setting, design: Design, run: dict[str, Any],
               participation: np.ndarray) -> dict[str, np.ndarray]:
  """mu_i [m] of every canary i, per threat (zero-out; the adversary knows the sample), for
  its rounds S_i (`participation` [T, m]; T_i = |S_i|), k = `sample_size`: fixed central,
  sqrt(T_i) / z (all iterates) and T_i / (z sqrt(T)) (last: the final model carries all T
  rounds' noise); adaptive, sqrt(sum_(S_i) (C_(t-1) / (z' C_t))^2) and
  sum_(S_i) C_(t-1) / (z' sqrt(sum_t C_t^2)), with the counts
  sqrt(mu_all^2 + T_i / sigma_b^2) (`with_counts`); LocalDpMod, sqrt(T_i) C / sigma and
  T_i C / (sigma sqrt(k T)). At T_i = T these are `exact_epsilons`' mus of fraction 1."""
  t = int(design.num_rounds)
  part = np.asarray(participation, bool)
  counts = part.sum(axis=0).astype(np.float64)
  s = dataclasses.replace(setting, num_sampled_clients=design.sample_size)
  if s.wrapper in ('server_fixed', 'client_fixed'):
    return {'all_iterates': np.sqrt(counts) / s.noise_multiplier,
            'last_iterate': counts / (s.noise_multiplier * math.sqrt(t))}
  if s.wrapper in dp_audit.ADAPTIVE:
    std_b, z_prime = dp_audit.adaptive_noise(s)
    c = np.asarray(run['clips'], np.float64)
    mu_all = np.sqrt(part.T.astype(np.float64) @ (c[:-1] / (z_prime * c[1:])) ** 2)
    return {'all_iterates': mu_all,
            'last_iterate': (part.T.astype(np.float64) @ c[:-1])
                            / (z_prime * np.sqrt(np.sum(c[1:] ** 2))),
            'with_counts': np.sqrt(mu_all ** 2 + counts / std_b ** 2)}
  sigma = dp_audit.local_dp_std(s.sensitivity, s.epsilon, s.delta)
  return {'all_iterates': np.sqrt(counts) * s.clipping_norm / sigma,
          'last_iterate': counts * s.clipping_norm / (sigma * math.sqrt(
              design.sample_size * t))}


def _sampled_exact_epsilons(setting: dp_audit.Setting, design: Design, run: dict[str, Any],
                            delta: float) -> dict[str, float]:
  mus = canary_mus(setting, design, run, run['participation'])
  out = {f'exact_epsilon_{threat}': auditing.gdp_epsilon(float(np.max(mus[threat])), delta)
         for threat in THREATS}
  out['exact_epsilon_all_iterates_median_canary'] = auditing.gdp_epsilon(
      float(np.median(mus['all_iterates'])), delta)
  if setting.wrapper in dp_audit.ADAPTIVE:
    s = dataclasses.replace(setting, num_sampled_clients=design.sample_size)
    std_b, z_prime = dp_audit.adaptive_noise(s)
    out.update(exact_epsilon_with_counts=auditing.gdp_epsilon(
        float(np.max(mus['with_counts'])), delta),
               exact_epsilon_as_claimed=auditing.gdp_epsilon(
                   math.sqrt(int(design.num_rounds)) / s.noise_multiplier, delta),
               noise_multiplier_aggregate=float(z_prime), clipped_count_stddev=float(std_b))
  return out


def sampling_metrics(design: Design, participation: np.ndarray) -> dict[str, Any]:
  """What the sampling was and how many rounds each canary took part in (`participation`
  [T, m]): `fraction_train`, `sample_size` k, `sampling`, `adversary`,
  `rounds_per_canary_min` / `_median` / `_mean` / `_max`, `canaries_never_sampled`."""
  counts = np.asarray(participation, bool).sum(axis=0)
  return dict(fraction_train=float(design.fraction_train), sample_size=design.sample_size,
              sampling=SAMPLING_FIXED_SIZE if design.sampled else SAMPLING_NONE,
              adversary=ADVERSARY, rounds_per_canary_min=int(counts.min()),
              rounds_per_canary_median=float(np.median(counts)),
              rounds_per_canary_mean=float(counts.mean()),
              rounds_per_canary_max=int(counts.max()),
              canaries_never_sampled=int(np.sum(counts == 0)))


def threat_metrics(threat: str, s: np.ndarray, included: np.ndarray, taken: np.ndarray,
                   null_scores: np.ndarray, *, delta: float, each: float, confidence: float,
                   rng: np.random.Generator, **audit_kw) -> dict[str, Any]:
  """One threat model's fields `<threat>/...`: the one-run bounds of the canaries' scores `s`
  (included vs excluded; each bound at confidence `each`; `audit_kw` to
  `auditing.audit_scores`) and the Gaussian fit of the included canaries that took part
  (`taken`) against `null_scores`, with `n_null` and `fit_n_in`."""
  a = auditing.audit_scores(s[included], s[~included], delta=delta, confidence=each,
                            **audit_kw)
  fit = gaussian_fit(s[included & taken], null_scores, delta, confidence=confidence, rng=rng)
  m = {f'{threat}/{k}': a[k] for k in ('epsilon_one_run', 'epsilon_one_run_fdp', 'n_in',
                                       'n_out')}
  m.update({f'{threat}/{k}': v for k, v in fit.items()})
  m[f'{threat}/n_null'] = int(len(null_scores))
  m[f'{threat}/fit_n_in'] = int(np.sum(included & taken))
  return m


def gaussian_fit(in_scores: np.ndarray, null_scores: np.ndarray, delta: float, *,
                 rng: np.random.Generator | None = None, bootstrap: int = 1000,
                 confidence: float = 0.95) -> dict[str, float]:
  """Andrew et al.'s one-shot estimate: mu = (mean_in - mean_null) / std_null, epsilon of
  mu-GDP at delta (an ESTIMATE, not a bound), with a percentile bootstrap interval of mu
  (both samples resampled; `bootstrap` resamples) mapped through the epsilon of mu-GDP."""
  def mu_of(a, b):
    return (float(np.mean(a)) - float(np.mean(b))) / float(np.std(b))
  mu = mu_of(in_scores, null_scores)
  out = {'fit_mu': mu, 'epsilon_fit': auditing.gdp_epsilon(max(mu, 0.0), delta),
         'fit_in_std_over_null_std': float(np.std(in_scores) / np.std(null_scores))}
  if bootstrap:
    rng = np.random.default_rng(0) if rng is None else rng
    def resampled_mu():
      a = rng.choice(in_scores, len(in_scores))  # in this order: the draws of every run so far
      b = rng.choice(null_scores, len(null_scores))
      # A resample of a small null can repeat one value: no spread, no mu (left out).
      return mu_of(a, b) if np.std(b) > 0 else np.nan
    mus = np.asarray([resampled_mu() for _ in range(int(bootstrap))])
    low, high = np.nanquantile(mus, [(1 - confidence) / 2, (1 + confidence) / 2])
    out.update(fit_mu_ci_low=float(low), fit_mu_ci_high=float(high),
               epsilon_fit_ci_low=auditing.gdp_epsilon(max(float(low), 0.0), delta),
               epsilon_fit_ci_high=auditing.gdp_epsilon(max(float(high), 0.0), delta))
  return out


def audited_threats(setting: dp_audit.Setting, uploads_recorded: bool = True
                    ) -> tuple[str, ...]:
  """The threat models of `THREATS` that `scores` gives a statistic for, from the design
  alone (no score read): both for the central wrappers; LocalDpMod's all-iterates adversary
  reads the canaries' uploads, so it is there only when they were recorded."""
  if setting.wrapper == 'local_dp' and not uploads_recorded:
    return ('last_iterate',)
  return THREATS


def counted_bounds(setting: dp_audit.Setting, uploads_recorded: bool = True
                   ) -> tuple[str, ...]:
  """The bounds the verdict takes the largest of, as '<threat>/<bound>': both one-run bounds
  (`BOUNDS`, the f-DP one counted because every wrapper here is Gaussian) of every threat
  model `audited_threats` gives. Fixed before the data: their number k sets the per-bound
  confidence 1 - (1 - c) / k (4 for every wrapper as deployed, 2 for LocalDpMod without
  recorded uploads)."""
  return tuple(f'{threat}/{bound}' for threat in audited_threats(setting, uploads_recorded)
               for bound in BOUNDS)


def audit(setting: dp_audit.Setting, design: Design, key: jax.Array, *,
          engine: str = 'inprocess', workdir: str | None = None) -> dict[str, Any]:
  """One deployment and its audit against Flower's stated epsilon.

  Every counted bound (`counted_bounds`, k of them: 4, or 2 for LocalDpMod without recorded
  uploads) is computed at confidence 1 - (1 - c) / k, c = `design.confidence` (Bonferroni),
  so `privacy_violation` (the largest of them, `best_bound`, above the stated epsilon) is a
  verdict at family-wise confidence c: where the stated epsilon holds, it flags a violation
  with probability at most 1 - c. The largest of k bounds each at c would hold only at
  1 - k (1 - c). The reported one-run bounds are those counted ones (at `bound_confidence`);
  the Gaussian fit and its interval (at c) are estimates and decide nothing.

  Returns:
    Per threat model `<threat>/epsilon_one_run`, `/epsilon_one_run_fdp` (lower bounds, each
    at `bound_confidence`), `/epsilon_fit`, `/fit_mu` (estimates, with their bootstrap
    interval at c), `/n_in`, `/n_out`, `/n_null`; `stated_epsilon` (+ `_delta`, `_source`),
    the exact epsilons, `best_bound`, `privacy_violation`, `verdict_confidence` (c,
    family-wise), `bound_confidence` (1 - (1 - c) / k), `counted_bounds` (the k
    '<threat>/<bound>' names, comma-separated), `confidence` (c), `accountant_violation`
    (an exact epsilon above the stated one), the clip trajectory (`clip_first`, `clip_last`,
    `clips`), `seconds`, `num_nodes`. The sampling (`sampling_metrics`: `fraction_train`,
    `sample_size`, `sampling`, `adversary`, rounds per canary), `real_clients`, per threat
    `/fit_n_in` (the included canaries the fit reads: those sampled at least once) and
    `/fit_mu_expected` (their mean mu_i, `canary_mus`: what the fit estimates without
    cross-talk); with trained real nodes `trained_metrics`.
  """
  run = deploy(setting, design, key, engine=engine, workdir=workdir)
  eps, delta, source = stated(setting, design, run)
  included = run['included']
  if not (included.any() and (~included).any()):
    raise ValueError(f'{design.num_canaries} canaries gave no canary in one of the worlds')
  # The family is fixed by the wrapper and whether uploads were recorded, before any score.
  uploads = run['upload_projections'] is not None
  threats = audited_threats(setting, uploads)
  counted = counted_bounds(setting, uploads)
  each = 1.0 - (1.0 - float(design.confidence)) / len(counted)
  num_rounds = int(design.num_rounds)
  # The server's sample: each canary scored over its own rounds (q = 1: every round, and the
  # sums as they always were).
  participation = (run['participation'] if design.sampled else
                   np.ones((num_rounds, int(design.num_canaries)), bool))
  rounds = participation if design.sampled else None
  canary = scores(setting, run, run['directions'], rounds)
  if tuple(t for t in THREATS if t in canary) != threats:
    raise RuntimeError(f'the threats scored {sorted(canary)} are not the ones counted '
                       f'{list(threats)}')
  null_dirs = null_directions(jax.random.fold_in(key, 3), design)
  null = scores(setting, run, null_dirs,
                None if rounds is None else np.ones((num_rounds, len(null_dirs)), bool))
  m: dict[str, Any] = dict(stated_epsilon=eps, stated_delta=delta, stated_epsilon_source=source,
                           num_nodes=run['num_nodes'], num_rounds=int(design.num_rounds),
                           num_canaries=int(design.num_canaries), num_real=int(design.num_real),
                           dimension=int(design.dimension), seconds=run['seconds'],
                           game_relation='zero_out', real_clients=str(design.real_clients))
  m.update(exact_epsilons(setting, design, run, delta))
  m.update(sampling_metrics(design, participation))
  mus = canary_mus(setting, design, run, participation)
  # A canary never sampled carries no signal: a trial of the one-run bounds (it abstains at
  # score 0), not a sample of the fit, nor of LocalDpMod's null of excluded canaries.
  taken = participation.any(axis=0)
  for threat in threats:
    s = canary[threat]
    m.update(threat_metrics(
        threat, s, included, taken, null.get(threat, s[~included & taken]), delta=delta,
        each=each, confidence=float(design.confidence),
        rng=np.random.default_rng(np.asarray(jax.random.key_data(jax.random.fold_in(key, 4)),
                                             np.uint32))))
    m[f'{threat}/fit_mu_expected'] = float(np.mean(mus[threat][included & taken]))
  if design.real_clients == 'trained':
    m.update(trained_metrics(design, run['models']))
  best = max(b for b in (m[name] for name in counted) if not math.isnan(b))
  m.update(best_bound=best, privacy_violation=float(best > eps * (1 + 1e-9)),
           accountant_violation=float(max(
               m['exact_epsilon_all_iterates'], m['exact_epsilon_last_iterate']) > eps),
           verdict_confidence=float(design.confidence), bound_confidence=each,
           counted_bounds=','.join(counted), confidence=float(design.confidence))
  clips = run['clips']
  if not np.isnan(clips).all():
    m.update(clip_first=float(clips[0]), clip_last=float(clips[-1]),
             clips=[float(c) for c in clips])
  return m
