"""The canary audit's design (`Design`) and its draws: the canaries' coins and directions,
the null directions, the real clients' updates (fixed, or trained on digits), the model
and its metrics. Pure functions of a key and the design (`audits.canaries` docstring).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.flatten_util  # pylint: disable=unused-import
import numpy as np
import optax

from fl_privacy import data as data_lib
from fl_privacy.fl import local
from fl_privacy.fl import losses
from fl_privacy.models import mlp


THREATS = ('all_iterates', 'last_iterate')
# The one-run lower bounds `audit` reports per threat model, all counted in the verdict: the
# f-DP one tests Gaussian trade-off curves, and every wrapper audited here is a Gaussian
# mechanism under a Gaussian claim (`dp_games.audit` counts the Gaussian-curve bounds for all
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
  projections carry the canary and Flower's noise only, as in `dp_games`' game)."""
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
