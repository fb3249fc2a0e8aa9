"""The one-run canary audit of a user's OWN Flower app: canary SuperNodes beside the real ones.

`canaries` audits Flower's DP wrappers in a deployment this repository builds (its nodes, its
model, its round loop). This module brings the same audit to a Flower app someone already
runs: their strategy, their model, their ClientApp, their SuperLink. Nothing of their training
changes; k extra SuperNodes (the canaries) join the run, and a wrapper around their strategy
reads what their server sees anyway. docs/experiments/flower_own_app.md is the recipe.

Client side. A canary SuperNode is an ordinary `flower-supernode` whose `--node-config` holds

- `canary-index` i (0..k-1), `canary-seed` s (the same on every canary and on the server),
  `canary-norm` (an included canary's update norm in units of the clip, >= 1 so that Flower's
  clip acts) and `clip-norm` C (the DP wrapper's clipping norm);
- optional: `num-examples` (its reply's FedAvg weight, default 1: give it the real clients'
  weight, Flower's accountant refuses unequal ones), `canary-metrics` and
  `canary-eval-metrics` (comma-separated MetricRecord keys the real clients reply besides
  `num-examples`: Flower's FedAvg refuses to aggregate replies whose MetricRecords differ in
  keys; the canary replies 0.0 for each), `canary-weight-key` (the strategy's
  `weighted_by_key`, default `num-examples`).

Canary i has a fair coin b_i and a unit direction v_i over the flattened model, both redrawn
from (s, i) by `canary_coin` / `canary_direction` (numpy `SeedSequence([s, i, purpose])`: the
server redraws them without asking the node). The flattened model is every floating array of
the received ArrayRecord, raveled and concatenated in the record's order (`flat_model`; integer
arrays, e.g. step counters, stay out: Flower's clip cannot scale them either). Its dimension is
learnt from the first message, so any model works. To every train message canary i replies
the received model plus `canary-norm` x C x v_i when b_i = 1, else plus 1e-6 x C x v_i
(`canaries.IDLE`: the zero-out neighbour, a node present and replying that did not train; an
update of exactly zero makes Flower 1.42's clip divide by zero). What float rounding leaves of
that tiny update is never zero (one coordinate is nudged by one ulp where it would be).
Evaluate messages get a reply of weight 0 (`num-examples` 0 and 0.0 for each
`canary-eval-metrics` key): FedAvg's weighted mean of the real nodes' metrics is unchanged,
provided at least one real node is sampled for evaluation (else the weights sum to zero).

- `canary_client_app`: the canary behaviour alone, a Flower App component
  (`fl_privacy.flower.own_app:canary_client_app`) for runs whose every node is a canary (tests,
  a dry run of the recipe).
- `with_canaries(their_client_app)`: what a user's app needs, since in Flower 1.42 every
  SuperNode of a run executes the ClientApp of the run's FAB: a ClientApp that runs the canary
  behaviour on nodes whose node config has `canary-index` (through the user's app-level mods by
  default, so client-side clipping and LocalDpMod act on the canaries as on every node) and
  hands every message of every other node to the user's app unchanged. It also answers the
  audit's discovery query (`QUERY_KEY`) on every node.

Server side. `CanaryAuditStrategy(inner, ...)` wraps any Message-API strategy (e.g. the user's
FedAvg inside `DifferentialPrivacyServerSideFixedClipping`) and delegates every call to it: the
same messages go out, the same replies come in, the same aggregate comes back. It must be the
OUTERMOST wrapper (Flower's server-side clipping rewrites the replies in place, and its noise
is added inside). Before the first round it learns which nodes are canaries, from
`canary_nodes` or by one `query` message to every node (their `canary-index`, seed, norm and
clip, checked against its own). Per round it keeps, projected on the k canary directions and
`num_null` never-inserted ones (indices k, k+1, ...: the null of the Gaussian fit), only what
the user's server holds anyway: the model the round started from and the aggregate the inner
strategy returned, which canaries it sampled and which replied, and with the `uploads` threat
each canary's own upload minus the round's model on v_i (what a server reading uploads sees:
LocalDpMod's adversary). Projections, not models, are kept: memory k + num_null numbers a
round whatever the model's size. No global generator is touched (Flower's noise and sampling
draw from numpy's and Python's), so wrapping changes nothing of the run.

Statistics (`audit_rounds`), per threat, as `canaries.audit` computes them:
- `all_iterates` (a reader of every global model): sum_t <aggregate_t - model_t, v_i>;
- `last_iterate` (the final model only): <aggregate_T - model_1, v_i>;
- `uploads` (optional; the server reading uploads): sum_t <upload_(i,t) - model_t, v_i>.
The rounds are equally weighted (a fixed clip and noise; an adaptive clip only costs power:
any statistic fixed before the data gives valid bounds). With client sampling the server
knows whom it sampled (`canaries.ADVERSARY`); canary i is then scored over its own rounds S_i
and standardised by sqrt(|S_i|) (last iterate: sqrt(T)), a canary never sampled scores 0
(it abstains) and is left out of the fit. The m canaries are the trials of Steinke, Nasr,
Jagielski (NeurIPS 2023) one-run bounds (`auditing.audit_scores`, the 'split' threshold,
seed 0: LOWER bounds) and its f-DP refinement (counted when the mechanism is Gaussian,
`gaussian`); the verdict takes the largest of the k = (bounds per threat) x (threats) counted
bounds, each at 1 - (1 - c) / k (Bonferroni), so it holds at family-wise confidence c. Andrew
et al. (ICLR 2024) Gaussian fit (`canaries.gaussian_fit`) against the null directions (for
`uploads`: the excluded canaries, the null directions have no upload) is an ESTIMATE.
`max_certifiable` is what these canaries could certify at best (every guess right).

Every epsilon is per client (`unit` 'client'), zero-out neighbours (`relation`), against the
stated adversary with the observed sampling; the stated epsilon is the user's, or Flower's
`privacy_spent()` (its RdpAccountant claims add/remove-one, no amplification: for Flower's
fixed-denominator mean the sensitivity C / n is the zero-out one).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import pathlib
from typing import Any, Iterable, Mapping, Sequence

from absl import logging
import numpy as np

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.app import RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fl_privacy.eval import auditing
from fl_privacy.flower import canaries
from fl_privacy.flower import strategies
from fl_privacy.report import atomic

# Node config keys of a canary SuperNode.
INDEX_KEY = 'canary-index'
SEED_KEY = 'canary-seed'
NORM_KEY = 'canary-norm'
CLIP_KEY = 'clip-norm'
EXAMPLES_KEY = 'num-examples'
METRICS_KEY = 'canary-metrics'
EVAL_METRICS_KEY = 'canary-eval-metrics'
WEIGHT_KEY_KEY = 'canary-weight-key'
DEFAULT_WEIGHT_KEY = 'num-examples'
METRIC_RECORD = 'metrics'  # the MetricRecord name of Flower's examples and FedAvg's replies
# The discovery query's ConfigRecord key (value 'canary'), and its reply's record.
QUERY_KEY = 'fl-privacy-canary'
QUERY_RECORD = 'canary'
# Threats the audit can score, and whom each one models.
THREATS = canaries.THREATS + ('uploads',)
DEFAULT_THREATS = canaries.THREATS
READERS = {'all_iterates': 'reads every global model (each round\'s aggregate)',
           'last_iterate': 'reads the final model only',
           'uploads': 'the server reading each canary\'s upload'}
UNIT = 'client'
RELATION = 'zero_out'
THRESHOLD_STRATEGY = 'split'  # `auditing.audit_scores`' default, as `canaries.audit`
SAMPLING_VARYING = 'server_chosen_varying_size'
AUDIT_FILE = 'canary_audit.json'
ROUNDS_FILE = 'canary_rounds.npz'
# SeedSequence purposes: a coin and a direction never share a stream; the fit's bootstrap
# uses an index no canary or null direction reaches.
_COIN, _DIRECTION, _FIT = 0, 1, 2
_FIT_INDEX = 2**32 - 1
# Directions kept in memory while (k + num_null) x dimension x 8 bytes stays below this;
# beyond, each round redraws them (k + num_null normal vectors of the model's size).
DIRECTION_CACHE_BYTES = 256 * 2**20


# ------------------------------------------------------------------- shared by both sides ---

def _check_seed(seed: Any) -> int:
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or int(seed) < 0:
    raise ValueError(f'the canary seed must be an integer >= 0 (got {seed!r})')
  return int(seed)


def _rng(seed: int, index: int, purpose: int) -> np.random.Generator:
  return np.random.default_rng(np.random.SeedSequence([_check_seed(seed), int(index),
                                                       int(purpose)]))


def canary_coin(seed: int, index: int) -> bool:
  """b_i: whether canary `index` of `seed` inserts its update (a fair coin; Steinke et al.'s
  inclusion with probability 1/2)."""
  return bool(_rng(seed, index, _COIN).integers(2) == 1)


def canary_direction(seed: int, index: int, dimension: int) -> np.ndarray:
  """v_i: float64 [dimension], a uniformly random unit vector drawn from (seed, index)."""
  if int(dimension) < 1:
    raise ValueError(f'dimension must be >= 1 (got {dimension})')
  v = _rng(seed, index, _DIRECTION).standard_normal(int(dimension))
  return v / np.linalg.norm(v)


def _floating(a: np.ndarray) -> bool:
  return np.issubdtype(a.dtype, np.floating)


def flat_model(record: ArrayRecord) -> np.ndarray:
  """float64 [d]: the record's floating arrays raveled and concatenated in its order (the
  space the canary directions live in)."""
  parts = [np.asarray(a, np.float64).ravel() for a in record.to_numpy_ndarrays()
           if _floating(np.asarray(a))]
  if not parts:
    raise ValueError(f'the ArrayRecord ({list(record.keys())}) holds no floating array: '
                     'canaries need a model with float parameters')
  return np.concatenate(parts)


def add_to_model(record: ArrayRecord, update: np.ndarray) -> ArrayRecord:
  """`record` plus `update` (float64 [d], `flat_model`'s layout), each array in its own dtype
  and shape, the integer arrays unchanged. Where rounding to the arrays' dtype would leave no
  change at all, the coordinate of the largest |update| moves by one ulp in its direction (a
  zero update makes Flower's clip divide by zero)."""
  update = np.asarray(update, np.float64)
  arrays = record.to_numpy_ndarrays()
  out, offset = [], 0
  for a in arrays:
    a = np.asarray(a)
    if _floating(a):
      part = update[offset:offset + a.size].reshape(a.shape)
      out.append((a.astype(np.float64) + part).astype(a.dtype))
      offset += a.size
    else:
      out.append(a.copy())
  if offset != update.size:
    raise ValueError(f'the update has {update.size} coordinates, the model {offset}')
  if not any(np.any(o != a) for o, a in zip(out, arrays) if _floating(np.asarray(a))):
    j = int(np.argmax(np.abs(update)))
    for o in out:
      if not _floating(o):
        continue
      if j < o.size:
        flat = o.reshape(-1)
        flat[j] = np.nextafter(flat[j], np.inf if update[j] >= 0 else -np.inf,
                               dtype=o.dtype)
        break
      j -= o.size
  return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in zip(record.keys(), out)})


# ------------------------------------------------------------------------------ client side ---

def _keys(value: Any) -> tuple[str, ...]:
  return tuple(k.strip() for k in str(value or '').split(',') if k.strip())


@dataclasses.dataclass(frozen=True)
class CanaryConfig:
  """A canary SuperNode's settings, from its node config (module docstring).

  Attributes:
    index: i, its canary index.
    seed: s, shared by every canary and the server.
    norm: an included canary's update norm in units of `clip` (>= 1).
    clip: C, the DP wrapper's clipping norm.
    num_examples: its train replies' FedAvg weight.
    weight_key: the MetricRecord key the strategy weighs replies by.
    metrics: further train MetricRecord keys (replied 0.0).
    eval_metrics: further evaluate MetricRecord keys (replied 0.0).
  """
  index: int
  seed: int
  norm: float
  clip: float
  num_examples: int = 1
  weight_key: str = DEFAULT_WEIGHT_KEY
  metrics: tuple[str, ...] = ()
  eval_metrics: tuple[str, ...] = ()

  def __post_init__(self):
    if isinstance(self.index, bool) or not isinstance(self.index, (int, np.integer)) or (
        self.index < 0):
      raise ValueError(f'{INDEX_KEY} must be an integer >= 0 (got {self.index!r})')
    _check_seed(self.seed)
    if not (math.isfinite(self.norm) and self.norm >= 1.0):
      raise ValueError(f'{NORM_KEY} must be >= 1 (in units of the clip, so that the clip acts '
                       f'on an included canary; got {self.norm!r})')
    if not (math.isfinite(self.clip) and self.clip > 0):
      raise ValueError(f'{CLIP_KEY} must be > 0 (got {self.clip!r})')
    if int(self.num_examples) < 1:
      raise ValueError(f'{EXAMPLES_KEY} must be >= 1 (got {self.num_examples!r})')

  @classmethod
  def from_node_config(cls, node_config: Mapping[str, Any]) -> 'CanaryConfig | None':
    """The node's canary settings; None on a node without `canary-index` (a real node)."""
    if INDEX_KEY not in node_config:
      return None
    missing = [k for k in (SEED_KEY, NORM_KEY, CLIP_KEY) if k not in node_config]
    if missing:
      raise ValueError(f'a canary node (it has {INDEX_KEY}) needs {missing} in its node config')
    return cls(index=node_config[INDEX_KEY], seed=node_config[SEED_KEY],
               norm=float(node_config[NORM_KEY]), clip=float(node_config[CLIP_KEY]),
               num_examples=int(node_config.get(EXAMPLES_KEY, 1)),
               weight_key=str(node_config.get(WEIGHT_KEY_KEY, DEFAULT_WEIGHT_KEY)),
               metrics=_keys(node_config.get(METRICS_KEY)),
               eval_metrics=_keys(node_config.get(EVAL_METRICS_KEY)))

  @property
  def included(self) -> bool:
    return canary_coin(self.seed, self.index)

  def update(self, dimension: int) -> np.ndarray:
    """float64 [dimension]: norm x C x v_i when included, 1e-6 x C x v_i otherwise."""
    scale = self.norm if self.included else canaries.IDLE
    return scale * self.clip * canary_direction(self.seed, self.index, dimension)


def _only_array_record(msg: Message) -> tuple[str, ArrayRecord]:
  records = msg.content.array_records
  if len(records) != 1:
    raise ValueError(f'a canary takes a message with exactly one ArrayRecord (the model), got '
                     f'{list(records)}')
  return next(iter(records.items()))


def canary_train(msg: Message, config: CanaryConfig) -> Message:
  """The canary's reply to a train message: the received model plus `config.update`, under the
  received record's name, with a MetricRecord of the real clients' keys."""
  name, record = _only_array_record(msg)
  reply = add_to_model(record, config.update(flat_model(record).size))
  metrics = {k: 0.0 for k in config.metrics}
  metrics[config.weight_key] = int(config.num_examples)
  return Message(RecordDict({name: reply, METRIC_RECORD: MetricRecord(metrics)}), reply_to=msg)


def canary_evaluate(msg: Message, config: CanaryConfig) -> Message:
  """Weight 0 and 0.0 for every `canary-eval-metrics` key: FedAvg's weighted mean of the real
  nodes' metrics is unchanged."""
  metrics = {k: 0.0 for k in config.eval_metrics}
  metrics[config.weight_key] = 0
  return Message(RecordDict({METRIC_RECORD: MetricRecord(metrics)}), reply_to=msg)


def is_discovery_query(msg: Message) -> bool:
  """Whether `msg` is the audit's discovery query (`discover_canaries`)."""
  if not msg.metadata.message_type.startswith('query') or not msg.has_content():
    return False
  return any(QUERY_KEY in r for r in msg.content.config_records.values())


def canary_query(msg: Message, config: CanaryConfig | None) -> Message:
  """The discovery reply: the node's canary settings, `canary-index` -1 on a real node."""
  info: dict[str, Any] = {INDEX_KEY: -1}
  if config is not None:
    info = {INDEX_KEY: int(config.index), SEED_KEY: int(config.seed), NORM_KEY: float(config.norm),
            CLIP_KEY: float(config.clip)}
  return Message(RecordDict({QUERY_RECORD: ConfigRecord(info)}), reply_to=msg)


def _node_config(context: Context) -> CanaryConfig:
  config = CanaryConfig.from_node_config(context.node_config)
  if config is None:
    raise ValueError(f'node {context.node_id} runs the canary ClientApp without {INDEX_KEY} in '
                     'its node config; a user\'s own app wraps its ClientApp in '
                     'with_canaries(...) instead')
  return config


def _canary_app(mods: Sequence[Any] = ()) -> ClientApp:
  app = ClientApp(mods=list(mods))

  @app.train()
  def train(msg: Message, context: Context) -> Message:
    return canary_train(msg, _node_config(context))

  @app.evaluate()
  def evaluate(msg: Message, context: Context) -> Message:
    return canary_evaluate(msg, _node_config(context))

  @app.query()
  def query(msg: Message, context: Context) -> Message:
    return canary_query(msg, _node_config(context))

  del train, evaluate, query
  return app


canary_client_app = _canary_app()


class _WithCanaries(ClientApp):
  """A ClientApp routing canary nodes to the canary behaviour, every other node's messages to
  the user's app (`with_canaries`)."""

  def __init__(self, app: ClientApp, canary: ClientApp):
    super().__init__()
    self.app = app
    self.canary = canary

  def __call__(self, message: Message, context: Context) -> Message:
    if CanaryConfig.from_node_config(context.node_config) is not None:
      return self.canary(message, context)
    if is_discovery_query(message):
      return canary_query(message, None)
    return self.app(message, context)


def with_canaries(app: ClientApp, *, canary_mods: Sequence[Any] | None = None) -> ClientApp:
  """The user's ClientApp with canary nodes: a node whose node config has `canary-index` runs
  the canary behaviour (train, evaluate and the discovery query), every other node runs `app`
  on every message, unchanged; a real node answers the discovery query itself (index -1).

  Args:
    app: The user's ClientApp (what their pyproject's `clientapp` names).
    canary_mods: Mods the canary messages go through. None (the default): `app`'s own
      app-level mods, so that client-side clipping (`fixedclipping_mod`) and `LocalDpMod` act
      on the canaries as on every node; mods registered on one handler
      (`@app.train(mods=...)`) are not reached. [] for none.
  """
  if not isinstance(app, ClientApp):
    raise TypeError(f'with_canaries wraps a flwr.clientapp.ClientApp, got '
                    f'{type(app).__module__}.{type(app).__qualname__}')
  # pylint: disable-next=protected-access
  mods = list(getattr(app, '_mods', [])) if canary_mods is None else list(canary_mods)
  return _WithCanaries(app, _canary_app(mods))


# ------------------------------------------------------------------------------ server side ---

def discover_canaries(grid: Grid, *, timeout: float = 300.0) -> dict[int, dict[str, Any]]:
  """node id -> the settings each canary node reports (`canary_query`), from one `query`
  message to every node of `grid`. A node that replies with an error (its ClientApp is not
  `with_canaries` / `canary_client_app`) or not at all is taken as a real node (logged)."""
  nodes = [int(n) for n in grid.get_node_ids()]
  messages = [Message(RecordDict({'config': ConfigRecord({QUERY_KEY: 'canary'})}),
                      dst_node_id=n, message_type='query') for n in nodes]
  replies = list(grid.send_and_receive(messages, timeout=float(timeout)))
  found, answered = {}, set()
  for reply in replies:
    node = int(reply.metadata.src_node_id)
    answered.add(node)
    if reply.has_error() or QUERY_RECORD not in reply.content.config_records:
      logging.warning('node %d did not answer the canary query (taken as a real node)', node)
      continue
    info = dict(reply.content.config_records[QUERY_RECORD])
    if int(info.get(INDEX_KEY, -1)) >= 0:
      found[node] = info
  for node in sorted(set(nodes) - answered):
    logging.warning('node %d did not answer the canary query within %.0f s (taken as a real '
                    'node)', node, timeout)
  return found


def _check_indices(canary_nodes: Mapping[int, int], num_canaries: int | None) -> dict[int, int]:
  nodes = {int(k): int(v) for k, v in canary_nodes.items()}
  if sorted(nodes.values()) != list(range(len(nodes))):
    raise ValueError(f'the canary indices must be 0..k-1, one node each (got '
                     f'{sorted(nodes.values())})')
  if num_canaries is not None and len(nodes) != int(num_canaries):
    raise ValueError(f'{len(nodes)} canary nodes, {num_canaries} expected')
  if len(nodes) < 4:
    raise ValueError(f'{len(nodes)} canary nodes: the audit needs at least 4 (two in each '
                     'world for the split threshold)')
  return nodes


@dataclasses.dataclass
class CanaryRound:
  """What the strategy kept of one training round (k canaries, num_null null directions).

  Attributes:
    server_round: Flower's round number r.
    sampled: bool [k], canary i was sent a train message.
    replied: bool [k], canary i's reply carried a model.
    num_messages: train messages the inner strategy sent (every node).
    before: float64 [k + num_null], the round's model projected on the directions.
    after: float64 [k + num_null], the aggregate the inner strategy returned, projected (the
      round's model again when it returned none).
    uploads: float64 [k], canary i's upload minus the round's model on v_i (NaN where none),
      or None when the `uploads` threat is off.
    model, aggregate: the flat models themselves (`keep_models` only).
  """
  server_round: int
  sampled: np.ndarray
  replied: np.ndarray
  num_messages: int
  before: np.ndarray
  after: np.ndarray
  uploads: np.ndarray | None = None
  model: np.ndarray | None = None
  aggregate: np.ndarray | None = None


class _Projector:
  """Projections on the directions of indices 0..n-1 of `seed`, for models of one size."""

  def __init__(self, seed: int, count: int, cache_bytes: int):
    self.seed, self.count, self.cache_bytes = int(seed), int(count), int(cache_bytes)
    self.dimension: int | None = None
    self.matrix: np.ndarray | None = None

  def _fix(self, dimension: int) -> None:
    if self.dimension is None:
      self.dimension = int(dimension)
      if self.count * self.dimension * 8 <= self.cache_bytes:
        self.matrix = np.stack([canary_direction(self.seed, i, self.dimension)
                                for i in range(self.count)])
    elif int(dimension) != self.dimension:
      raise ValueError(f'the model has {dimension} float coordinates, {self.dimension} in the '
                       'first round: the canary directions need a model of fixed size')

  def direction(self, index: int, dimension: int) -> np.ndarray:
    self._fix(dimension)
    if self.matrix is not None:
      return self.matrix[index]
    return canary_direction(self.seed, index, dimension)

  def __call__(self, flat: np.ndarray) -> np.ndarray:
    self._fix(flat.size)
    if self.matrix is not None:
      return self.matrix @ flat
    return np.asarray([canary_direction(self.seed, i, flat.size) @ flat
                       for i in range(self.count)])


def _chain(strategy: Any) -> Iterable[Any]:
  """The strategy and those it wraps (ours keep theirs in `inner`, Flower's in `strategy`)."""
  seen = set()
  while strategy is not None and id(strategy) not in seen:
    seen.add(id(strategy))
    yield strategy
    strategy = getattr(strategy, 'inner', None) or getattr(strategy, 'strategy', None)


def flower_stated(strategy: Strategy) -> dict[str, Any] | None:
  """Flower's own claim: `privacy_spent()` of the first strategy of the chain that has one
  (the fixed-clipping wrappers with an accountant), with its delta and declaration."""
  for s in _chain(strategy):
    spent_fn = getattr(s, 'privacy_spent', None)
    spent = spent_fn() if callable(spent_fn) else None
    if spent is None:
      continue
    config = getattr(getattr(s, 'accountant', None), 'config', None)
    relation = getattr(getattr(config, 'neighboring_relation', None), 'value', None)
    sampling = getattr(getattr(config, 'sampling_method', None), 'value', None)
    return dict(stated_epsilon=float(spent.epsilon), stated_delta=float(spent.delta),
                stated_epsilon_source=f'flwr privacy_spent() of {type(s).__name__} '
                f'({spent.accounting_method}, {spent.num_releases} releases)',
                stated_relation=str(relation), stated_sampling=str(sampling))
  return None


class CanaryAuditStrategy(strategies._Wrapper):  # pylint: disable=protected-access
  """Wraps a user's Message-API strategy unchanged and audits it with canary nodes.

  Args:
    inner: The user's strategy as deployed (e.g. their FedAvg in Flower's
      `DifferentialPrivacyServerSideFixedClipping`); this wrapper must be the outermost.
    seed: s, the canary SuperNodes' `canary-seed` (required: it draws the coins and the
      directions on both sides).
    canary_norm: The canaries' `canary-norm` (units of the clip, >= 1).
    clip_norm: C, the canaries' `clip-norm` (the wrapper's clipping norm).
    delta: The delta of every epsilon reported (that of Flower's accountant when its claim is
      the one tested).
    stated_epsilon: The claim to test (per client, over the rounds that run); None: Flower's
      `privacy_spent()` where the inner strategy has it (`flower_stated`), else no verdict.
    canary_nodes: node id -> canary index; None: learnt before the first round by a `query`
      to every node (`discover_canaries`; the canaries must be connected by then: the inner
      strategy's `min_available_nodes` counting them makes Flower wait).
    num_canaries: The k expected (checked), or None.
    num_null: Never-inserted directions scored for the Gaussian fit's null.
    confidence: c, the verdict's family-wise confidence (each counted bound at
      1 - (1 - c) / k) and the fit's bootstrap level.
    threats: What the audit scores and counts (`THREATS`): fixed here, before any data.
      Flower's central wrappers state their epsilon against readers of the global model
      (the default); add 'uploads' for LocalDpMod (the server reading uploads).
    gaussian: The mechanism adds Gaussian noise (Flower's DP wrappers and LocalDpMod): the
      f-DP one-run bound counts. False: only `epsilon_one_run` counts.
    directory: Writes `ROUNDS_FILE` after every round and `AUDIT_FILE` from `audit()` there.
    keep_models: Also keep the flat models of every round (`CanaryRound.model`, `.aggregate`).
    query_timeout: Seconds the discovery query waits for replies.
    direction_cache_bytes: Directions kept in memory below this size (else redrawn a round).

  Attributes:
    rounds: One `CanaryRound` per training round.
    canary_nodes: node id -> canary index (after the first round when discovered).
  """

  def __init__(self, inner: Strategy, *, seed: int, canary_norm: float, clip_norm: float,
               delta: float, stated_epsilon: float | None = None,
               canary_nodes: Mapping[int, int] | None = None, num_canaries: int | None = None,
               num_null: int = 1000, confidence: float = 0.95,
               threats: Sequence[str] = DEFAULT_THREATS, gaussian: bool = True,
               directory: str | os.PathLike | None = None, keep_models: bool = False,
               query_timeout: float = 300.0,
               direction_cache_bytes: int = DIRECTION_CACHE_BYTES):
    super().__init__(inner)
    self.seed = _check_seed(seed)
    if not (math.isfinite(canary_norm) and canary_norm >= 1.0):
      raise ValueError(f'canary_norm must be >= 1 (got {canary_norm})')
    if not (math.isfinite(clip_norm) and clip_norm > 0):
      raise ValueError(f'clip_norm must be > 0 (got {clip_norm})')
    if not 0.0 < float(delta) < 1.0:
      raise ValueError(f'delta must be in (0, 1) (got {delta})')
    if not 0.5 < float(confidence) < 1.0:
      raise ValueError(f'confidence must be in (0.5, 1) (got {confidence})')
    if stated_epsilon is not None and not float(stated_epsilon) >= 0:
      raise ValueError(f'stated_epsilon must be >= 0 (got {stated_epsilon})')
    threats = tuple(threats)
    if not threats or len(set(threats)) != len(threats) or not set(threats) <= set(THREATS):
      raise ValueError(f'threats must be distinct names of {THREATS} (got {threats})')
    if int(num_null) < 2:
      raise ValueError(f'num_null must be >= 2 (got {num_null})')
    self.canary_norm, self.clip_norm = float(canary_norm), float(clip_norm)
    self.delta, self.confidence = float(delta), float(confidence)
    self.stated_epsilon = None if stated_epsilon is None else float(stated_epsilon)
    self.num_canaries = None if num_canaries is None else int(num_canaries)
    self.canary_nodes = (None if canary_nodes is None
                         else _check_indices(canary_nodes, self.num_canaries))
    self.num_null = int(num_null)
    self.threats = tuple(t for t in THREATS if t in threats)
    self.gaussian = bool(gaussian)
    self.directory = None if directory is None else pathlib.Path(directory)
    if self.directory is not None:
      self.directory.mkdir(parents=True, exist_ok=True)
    self.keep_models = bool(keep_models)
    self.query_timeout = float(query_timeout)
    self.cache_bytes = int(direction_cache_bytes)
    self.rounds: list[CanaryRound] = []
    self._projector: _Projector | None = None
    self._pending: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, int]] = {}

  @property
  def k(self) -> int:
    if self.canary_nodes is None:
      raise RuntimeError('the canary nodes are not known before the first round')
    return len(self.canary_nodes)

  def _learn_canaries(self, grid: Grid) -> None:
    found = discover_canaries(grid, timeout=self.query_timeout)
    mine = {SEED_KEY: self.seed, NORM_KEY: self.canary_norm, CLIP_KEY: self.clip_norm}
    for node, info in found.items():
      for key, want in mine.items():
        got = info.get(key)
        if got is None or not math.isclose(float(got), float(want), rel_tol=1e-12):
          raise ValueError(f'canary node {node} (index {info.get(INDEX_KEY)}) has {key}={got}, '
                           f'the strategy {want}: every canary and the strategy need the same')
    self.canary_nodes = _check_indices({n: int(i[INDEX_KEY]) for n, i in found.items()},
                                       self.num_canaries)
    logging.info('canary audit: %d canary nodes among %d', len(self.canary_nodes),
                 len(list(grid.get_node_ids())))

  def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                      grid: Grid) -> list[Message]:
    """The inner strategy's messages, unchanged; remembers the round's model (projected) and
    which canaries were sampled. The first round learns the canary nodes first if needed."""
    messages = list(self.inner.configure_train(server_round, arrays, config, grid))
    if self.canary_nodes is None:
      self._learn_canaries(grid)
    if self._projector is None:
      self._projector = _Projector(self.seed, self.k + self.num_null, self.cache_bytes)
    flat = flat_model(arrays)
    sampled = np.zeros(self.k, bool)
    for msg in messages:
      i = self.canary_nodes.get(int(msg.metadata.dst_node_id))
      if i is not None:
        sampled[i] = True
    self._pending[int(server_round)] = (flat, self._projector(flat), sampled, len(messages))
    return messages

  def aggregate_train(self, server_round: int, replies: Iterable[Message]
                      ) -> tuple[ArrayRecord | None, MetricRecord | None]:
    """Reads the canaries' replies (before the inner strategy: Flower's server-side clipping
    rewrites them in place), then returns the inner strategy's aggregate, unchanged."""
    replies = list(replies)
    if int(server_round) not in self._pending:
      raise RuntimeError(f'aggregate_train of round {server_round} without its configure_train')
    flat, before, sampled, count = self._pending.pop(int(server_round))
    replied = np.zeros(self.k, bool)
    uploads = np.full(self.k, np.nan) if 'uploads' in self.threats else None
    for msg in replies:
      i = self.canary_nodes.get(int(msg.metadata.src_node_id))
      if i is None or msg.has_error() or len(msg.content.array_records) != 1:
        continue
      upload = flat_model(next(iter(msg.content.array_records.values())))
      if upload.size != flat.size:
        logging.warning('round %d: canary %d replied %d coordinates, the model has %d (not '
                        'read)', server_round, i, upload.size, flat.size)
        continue
      replied[i] = True
      if uploads is not None:
        uploads[i] = float((upload - flat) @ self._projector.direction(i, flat.size))
    arrays, metrics = self.inner.aggregate_train(server_round, replies)
    after_flat = flat if arrays is None else flat_model(arrays)
    self.rounds.append(CanaryRound(
        server_round=int(server_round), sampled=sampled, replied=replied, num_messages=count,
        before=before, after=self._projector(after_flat), uploads=uploads,
        model=flat if self.keep_models else None,
        aggregate=after_flat if self.keep_models else None))
    if self.directory is not None:
      save_rounds(self.directory / ROUNDS_FILE, self.rounds, self.meta())
    return arrays, metrics

  def meta(self) -> dict[str, Any]:
    """What `audit_rounds` needs besides the rounds (saved with them)."""
    return dict(seed=self.seed, num_canaries=len(self.canary_nodes or {}),
                num_null=self.num_null,
                canary_norm=self.canary_norm, clip_norm=self.clip_norm,
                dimension=None if self._projector is None else self._projector.dimension,
                canary_nodes={str(n): i for n, i in sorted((self.canary_nodes or {}).items())})

  def stated(self) -> dict[str, Any]:
    """The claim tested: `stated_epsilon` when given, else Flower's (`flower_stated`), else
    none (NaN, no verdict)."""
    flower = flower_stated(self.inner)
    if self.stated_epsilon is not None:
      out = dict(stated_epsilon=self.stated_epsilon, stated_delta=self.delta,
                 stated_epsilon_source='given')
    elif flower is not None:
      if not math.isclose(flower['stated_delta'], self.delta, rel_tol=1e-9):
        raise ValueError(f'Flower states its epsilon at delta {flower["stated_delta"]}, the '
                         f'audit runs at {self.delta}: pass delta={flower["stated_delta"]}')
      out = dict(flower)
    else:
      out = dict(stated_epsilon=math.nan, stated_delta=math.nan, stated_epsilon_source='none')
    if flower is not None:
      out['flower_privacy_spent_epsilon'] = flower['stated_epsilon']
    return out

  def audit(self) -> dict[str, Any]:
    """The one-run audit of the rounds so far (`audit_rounds`), with the stated claim; also
    written to `<directory>/canary_audit.json` when the strategy has a directory."""
    if not self.rounds:
      raise RuntimeError('no training round ran: nothing to audit')
    out = audit_rounds(self.rounds, seed=self.seed, num_canaries=self.k, delta=self.delta,
                       confidence=self.confidence, threats=self.threats,
                       gaussian=self.gaussian, stated=self.stated())
    out.update(canary_norm=self.canary_norm, clip_norm=self.clip_norm,
               dimension=self._projector.dimension)
    if self.directory is not None:
      atomic.atomic_write_text(self.directory / AUDIT_FILE,
                               json.dumps(out, indent=1, sort_keys=True))
    return out


# ----------------------------------------------------------------------------- the audit ---

def counted_bounds(threats: Sequence[str], gaussian: bool = True) -> tuple[str, ...]:
  """'<threat>/<bound>' of every bound the verdict takes the largest of (fixed by the threats
  and the mechanism's shape before any score: `canaries.BOUNDS` per threat, the f-DP one only
  for a Gaussian mechanism)."""
  bounds = canaries.BOUNDS if gaussian else canaries.BOUNDS[:1]
  return tuple(f'{t}/{b}' for t in threats for b in bounds)


def max_certifiable(n_in: int, n_out: int, *, delta: float, confidence: float,
                    num_counted: int, gaussian: bool = True) -> float:
  """The largest epsilon these canaries can certify: the counted one-run bounds (each at
  1 - (1 - c) / num_counted, the 'split' threshold) on perfectly separated scores (every
  guess right). 0 where the split leaves a part without both worlds."""
  if not auditing.split_possible(int(n_in), int(n_out)):
    return 0.0
  each = 1.0 - (1.0 - float(confidence)) / int(num_counted)
  a = auditing.audit_scores(np.ones(int(n_in)), np.zeros(int(n_out)), delta=float(delta),
                            confidence=each, fdp=bool(gaussian))
  return float(max(a['epsilon_one_run'], a['epsilon_one_run_fdp'] if gaussian else 0.0))


def statistics(rounds: Sequence[CanaryRound], num_canaries: int, threats: Sequence[str]
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
  """({threat: canary scores [k]}, {threat: null scores}, participation [T, k]) (module
  docstring). Every canary sampled every round: the sums as they are; else each canary over
  its own rounds, standardised (`canaries._sampled_scores` with equal rounds)."""
  k = int(num_canaries)
  part = np.stack([r.sampled for r in rounds])
  before = np.stack([r.before for r in rounds])
  after = np.stack([r.after for r in rounds])
  deltas = after - before
  t = len(rounds)
  every = bool(part.all())
  counts = part.sum(axis=0)
  taken = counts > 0
  root = np.sqrt(np.maximum(counts, 1))
  last = after[-1] - before[0]
  canary, null = {}, {}
  if 'all_iterates' in threats:
    if every:
      canary['all_iterates'] = deltas[:, :k].sum(axis=0)
      null['all_iterates'] = deltas[:, k:].sum(axis=0)
    else:
      canary['all_iterates'] = np.where(taken, (deltas[:, :k] * part).sum(axis=0) / root, 0.0)
      null['all_iterates'] = deltas[:, k:].sum(axis=0) / math.sqrt(t)
  if 'last_iterate' in threats:
    scale = 1.0 if every else math.sqrt(t)
    canary['last_iterate'] = np.where(taken, last[:k] / scale, 0.0)
    null['last_iterate'] = last[k:] / scale
  if 'uploads' in threats:
    ups = np.stack([r.uploads for r in rounds])
    own = np.where(part & np.isfinite(ups), ups, 0.0).sum(axis=0)
    canary['uploads'] = own if every else np.where(taken, own / root, 0.0)
  return canary, null, part


def _sampling(rounds: Sequence[CanaryRound], part: np.ndarray) -> str:
  if part.all():
    return canaries.SAMPLING_NONE
  if len({r.num_messages for r in rounds}) == 1:
    return canaries.SAMPLING_FIXED_SIZE
  return SAMPLING_VARYING


def audit_rounds(rounds: Sequence[CanaryRound], *, seed: int, num_canaries: int, delta: float,
                 confidence: float, threats: Sequence[str] = DEFAULT_THREATS,
                 gaussian: bool = True, stated: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
  """The one-run audit of recorded rounds against the stated claim.

  Returns:
    Per threat `<threat>/epsilon_one_run`, `/epsilon_one_run_fdp` (LOWER bounds, each at
    `bound_confidence`), `/n_in`, `/n_out`, `/adversary`, the fit's `/fit_mu`, `/epsilon_fit`
    (ESTIMATES, with bootstrap intervals at c), `/n_null`, `/fit_n_in`; `best_bound`,
    `privacy_violation` (best_bound above the stated epsilon: 1.0 / 0.0, NaN without a claim),
    `max_certifiable`, `counted_bounds`, `verdict_confidence` (c, family-wise),
    `bound_confidence`, `unit`, `relation`, `adversary`, `sampling`, rounds per canary,
    `lost_canary_replies` (sampled, no model back: they carry no signal), `n_in`, `n_out`,
    `num_canaries`, `num_rounds`, `num_null`, `seed`, `delta`, `threshold_strategy`, and the
    stated claim's fields (`stated_epsilon`, `stated_delta`, `stated_epsilon_source`, ...).
  """
  if not rounds:
    raise ValueError('no recorded round to audit')
  k = int(num_canaries)
  threats = tuple(t for t in THREATS if t in threats)
  if 'uploads' in threats and any(r.uploads is None for r in rounds):
    raise ValueError("the 'uploads' threat needs the canaries' uploads, which these rounds "
                     'did not keep')
  included = np.asarray([canary_coin(seed, i) for i in range(k)])
  if included.sum() < 2 or (~included).sum() < 2:
    raise ValueError(f'{int(included.sum())} of {k} canaries included: the one-run bounds need '
                     'at least two in each world (more canaries, or another seed)')
  counted = counted_bounds(threats, gaussian)
  each = 1.0 - (1.0 - float(confidence)) / len(counted)
  scores, null, part = statistics(rounds, k, threats)
  taken = part.any(axis=0)
  replied = np.stack([r.replied for r in rounds])
  counts = part.sum(axis=0)
  m: dict[str, Any] = dict(
      unit=UNIT, relation=RELATION, adversary=canaries.ADVERSARY,
      sampling=_sampling(rounds, part), num_canaries=k, num_rounds=len(rounds),
      num_null=int(rounds[0].before.size - k), seed=int(seed), delta=float(delta),
      n_in=int(included.sum()), n_out=int((~included).sum()),
      threshold_strategy=THRESHOLD_STRATEGY, counted_bounds=','.join(counted),
      verdict_confidence=float(confidence), bound_confidence=each,
      confidence=float(confidence), rounds_per_canary_min=int(counts.min()),
      rounds_per_canary_median=float(np.median(counts)),
      rounds_per_canary_max=int(counts.max()), canaries_never_sampled=int(np.sum(~taken)),
      lost_canary_replies=int(np.sum(part & ~replied)))
  fit_rng = _rng(seed, _FIT_INDEX, _FIT)
  for threat in threats:
    s = scores[threat]
    m.update(canaries.threat_metrics(
        threat, s, included, taken, null.get(threat, s[~included & taken]), delta=delta,
        each=each, confidence=float(confidence), rng=fit_rng,
        threshold_strategy=THRESHOLD_STRATEGY, fdp=gaussian))
    m[f'{threat}/adversary'] = READERS[threat]
  best = max([float(m[c]) for c in counted if not math.isnan(m[c])] + [0.0])
  m['best_bound'] = best
  m['max_certifiable'] = max_certifiable(m['n_in'], m['n_out'], delta=delta,
                                         confidence=confidence, num_counted=len(counted),
                                         gaussian=gaussian)
  m.update(stated or dict(stated_epsilon=math.nan, stated_delta=math.nan,
                          stated_epsilon_source='none'))
  eps = float(m['stated_epsilon'])
  m['privacy_violation'] = math.nan if math.isnan(eps) else float(best > eps * (1 + 1e-9))
  return m


# ------------------------------------------------------------------------------ the files ---

def save_rounds(path: str | os.PathLike, rounds: Sequence[CanaryRound],
                meta: Mapping[str, Any]) -> None:
  """The recorded rounds as one .npz (atomically), with `meta` as JSON (`load_rounds`)."""
  arrays = {'meta': np.asarray(json.dumps(dict(meta), sort_keys=True)),
            'server_round': np.asarray([r.server_round for r in rounds], np.int64),
            'num_messages': np.asarray([r.num_messages for r in rounds], np.int64)}
  for name in ('sampled', 'replied', 'before', 'after'):
    arrays[name] = np.stack([getattr(r, name) for r in rounds])
  if rounds and rounds[0].uploads is not None:
    arrays['uploads'] = np.stack([r.uploads for r in rounds])
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  atomic.atomic_write_bytes(path, buffer.getvalue())


def load_rounds(path: str | os.PathLike) -> tuple[dict[str, Any], list[CanaryRound]]:
  """(meta, rounds) of a `save_rounds` file: `audit_rounds(rounds, seed=meta['seed'],
  num_canaries=meta['num_canaries'], ...)` audits them again offline."""
  with np.load(path, allow_pickle=False) as f:
    a = {k: f[k] for k in f.files}
  rounds = [CanaryRound(server_round=int(a['server_round'][t]), sampled=a['sampled'][t],
                        replied=a['replied'][t], num_messages=int(a['num_messages'][t]),
                        before=a['before'][t], after=a['after'][t],
                        uploads=a['uploads'][t] if 'uploads' in a else None)
            for t in range(len(a['server_round']))]
  return json.loads(str(a['meta'])), rounds


def client_apps(app: ClientApp, num_real: int, canary_configs: Sequence[Mapping[str, Any]]
                ) -> tuple[list[ClientApp], list[dict[str, Any]]]:
  """(apps, node_configs) for an `InProcessGrid` rehearsal of the recipe: `num_real` nodes
  running the user's `app` (wrapped by `with_canaries`), then one node per canary config,
  the same wrapped app (their node config makes them canaries)."""
  wrapped = with_canaries(app)
  configs = [{} for _ in range(int(num_real))] + [dict(c) for c in canary_configs]
  return [wrapped] * len(configs), configs


def canary_node_configs(num_canaries: int, *, seed: int, canary_norm: float, clip_norm: float,
                        **extra: Any) -> list[dict[str, Any]]:
  """The node configs of k canary SuperNodes (`extra`: further keys, e.g. `num-examples`, or
  `canary-metrics`, the same on each); `node_config_text` writes one for `--node-config`."""
  return [{INDEX_KEY: i, SEED_KEY: _check_seed(seed), NORM_KEY: float(canary_norm),
           CLIP_KEY: float(clip_norm), **extra} for i in range(int(num_canaries))]


def node_config_text(config: Mapping[str, Any]) -> str:
  """`--node-config` text of one node config (TOML values: strings quoted)."""
  def value(v):
    if isinstance(v, bool):
      return 'true' if v else 'false'
    if isinstance(v, (int, float, np.integer, np.floating)):
      return repr(v.item() if hasattr(v, 'item') else v)
    return json.dumps(str(v))
  return ' '.join(f'{k}={value(v)}' for k, v in config.items())
