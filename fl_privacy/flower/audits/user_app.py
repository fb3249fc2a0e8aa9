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
(`canary_design.IDLE`: the zero-out neighbour, a node present and replying that did not train; an
update of exactly zero makes Flower 1.42's clip divide by zero). What float rounding leaves of
that tiny update is never zero (one coordinate is nudged by one ulp where it would be).
Evaluate messages get a reply of weight 0 (`num-examples` 0 and 0.0 for each
`canary-eval-metrics` key): FedAvg's weighted mean of the real nodes' metrics is unchanged,
provided at least one real node is sampled for evaluation (else the weights sum to zero).

- `canary_client_app`: the canary behaviour alone, a Flower App component
  (`fl_privacy.flower.audits.user_app:canary_client_app`) for runs whose every node is a canary
  (tests, a dry run of the recipe).
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
knows whom it sampled (`canary_design.ADVERSARY`); canary i is then scored over its own rounds S_i
and standardised by sqrt(|S_i|) (last iterate: sqrt(T)), a canary never sampled scores 0
(it abstains) and is left out of the fit. The m canaries are the trials of Steinke, Nasr,
Jagielski (NeurIPS 2023) one-run bounds (`auditing.audit_scores`, the 'split' threshold,
seed 0: LOWER bounds) and its f-DP refinement (counted when the mechanism is Gaussian,
`gaussian`); the verdict takes the largest of the k = (bounds per threat) x (threats) counted
bounds, each at 1 - (1 - c) / k (Bonferroni), so it holds at family-wise confidence c. Andrew
et al. (ICLR 2024) Gaussian fit (`canary_stats.gaussian_fit`) against the null directions (for
`uploads`: the excluded canaries, the null directions have no upload) is an ESTIMATE.
`max_certifiable` is what these canaries could certify at best (every guess right).

Every epsilon is per client (`unit` 'client'), zero-out neighbours (`relation`), against the
stated adversary with the observed sampling; the stated epsilon is the user's, or Flower's
`privacy_spent()` (its RdpAccountant claims add/remove-one, no amplification: for Flower's
fixed-denominator mean the sensitivity C / n is the zero-out one).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.app import RecordDict
from flwr.clientapp import ClientApp

from fl_privacy.flower.audits import canary_design


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
THREATS = canary_design.THREATS + ('uploads',)
DEFAULT_THREATS = canary_design.THREATS
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
    scale = self.norm if self.included else canary_design.IDLE
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
