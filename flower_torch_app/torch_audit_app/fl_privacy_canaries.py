"""Canary SuperNodes for auditing your own Flower app: numpy and flwr only (the client side).

This file and `fl_privacy_canary_strategy.py` are what runs inside a user's Flower app (1.42,
Message API). They import only numpy, flwr and the standard library, so an app vendors them:
copies both verbatim into its package (`python -m fl_privacy.flower.inapp.vendor my_app/`),
and its pyproject.toml declares nothing new (Flower's SuperLink installs an app's declared
dependencies into a fresh environment; fl-privacy itself would bring JAX). The analysis runs
afterwards on the file the strategy wrote, with fl-privacy on a laptop:
`python -m fl_privacy.flower.audits.user_app canary_rounds.npz`
(docs/experiments/flower_own_app.md is the recipe).

`with_canaries(their_client_app)` is a ClientApp that runs the canary behaviour on nodes whose
node config has `canary-index` (through the user's app-level mods, so client clipping and
LocalDpMod act on canaries as on every node) and hands every message of every other node to
the user's app unchanged; `canary_client_app` is the canary behaviour alone (runs whose every
node is a canary). Canary i (node config `canary-index` i, `canary-seed` s, `canary-norm`,
`clip-norm` C) has a fair coin b_i and a unit direction v_i over the flattened model (every
floating array of the received ArrayRecord, raveled in the record's order; integer arrays
stay out), both redrawn by the server and the analysis from `SeedSequence([s, i, purpose])`.
To a train message it replies the received model plus canary-norm x C x v_i when b_i = 1,
else plus 1e-6 x C x v_i (`IDLE`: the zero-out neighbour, a node present and replying that
did not train; a zero update makes Flower 1.42's clip divide by zero). Evaluate replies weigh
0, so FedAvg's weighted mean of the real nodes' metrics is unchanged. Optional node config
keys: `num-examples` (the train replies' weight, default 1), `canary-metrics` /
`canary-eval-metrics` (comma-separated MetricRecord keys the real replies carry, replied
0.0: FedAvg refuses replies whose keys differ), `canary-weight-key` (default `num-examples`).

The audit is Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS
2023, arXiv:2305.08846), with Andrew et al., "One-shot Empirical Privacy Estimation for
Federated Learning" (ICLR 2024, arXiv:2302.03098).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping, Sequence

import numpy as np

import flwr
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.app import RecordDict
from flwr.clientapp import ClientApp

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
QUERY_KEY = 'fl-privacy-canary'  # the discovery query's ConfigRecord key
QUERY_RECORD = 'canary'  # its reply's record
IDLE = 1e-6  # the excluded canary's update norm, in units of C
# SeedSequence purposes: a coin and a direction never share a stream (the analysis's fit
# bootstrap uses purpose 2 at an index no canary reaches).
_COIN, _DIRECTION = 0, 1


# ------------------------------------------------------------------- shared by both sides ---

def check_seed(seed: Any) -> int:
  """`seed` as an int if it is an integer >= 0 (not a bool); else ValueError."""
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or int(seed) < 0:
    raise ValueError(f'the canary seed must be an integer >= 0 (got {seed!r})')
  return int(seed)


def _rng(seed: int, index: int, purpose: int) -> np.random.Generator:
  return np.random.default_rng(np.random.SeedSequence([check_seed(seed), int(index),
                                                       int(purpose)]))


def canary_coin(seed: int, index: int) -> bool:
  """b_i: whether canary `index` of `seed` inserts its update (a fair coin)."""
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
  """float64 [d]: the record's floating arrays raveled and concatenated in its order."""
  parts = [np.asarray(a, np.float64).ravel() for a in record.to_numpy_ndarrays()
           if _floating(np.asarray(a))]
  if not parts:
    raise ValueError(f'the ArrayRecord ({list(record.keys())}) holds no floating array: '
                     'canaries need a model with float parameters')
  return np.concatenate(parts)


def add_to_model(record: ArrayRecord, update: np.ndarray) -> ArrayRecord:
  """`record` plus `update` (`flat_model`'s layout), each array in its own dtype and shape,
  integer arrays unchanged. Where rounding would leave no change at all, the coordinate of the
  largest |update| moves one ulp its way (a zero update makes Flower's clip divide by zero)."""
  update = np.asarray(update, np.float64)
  arrays = [np.asarray(a) for a in record.to_numpy_ndarrays()]
  size = sum(a.size for a in arrays if _floating(a))
  if size != update.size:
    raise ValueError(f'the update has {update.size} coordinates, the model {size}')
  out, offset = [], 0
  for a in arrays:
    if _floating(a):
      part = update[offset:offset + a.size].reshape(a.shape)
      out.append((a.astype(np.float64) + part).astype(a.dtype))
      offset += a.size
    else:
      out.append(a.copy())
  if not any(np.any(o != a) for o, a in zip(out, arrays) if _floating(a)):
    j = int(np.argmax(np.abs(update)))
    way = np.inf if update[j] >= 0 else -np.inf  # before j becomes an index into one array
    for o in out:
      if not _floating(o):
        continue
      if j < o.size:
        flat = o.reshape(-1)
        flat[j] = np.nextafter(flat[j], way, dtype=o.dtype)
        break
      j -= o.size
  return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in zip(record.keys(), out)})


# ------------------------------------------------------------------------------ client side ---

def _keys(value: Any) -> tuple[str, ...]:
  return tuple(k.strip() for k in str(value or '').split(',') if k.strip())


@dataclasses.dataclass(frozen=True)
class CanaryConfig:
  """A canary SuperNode's settings, from its node config (module docstring)."""
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
    check_seed(self.seed)
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
    """float64 [dimension]: norm x C x v_i when included, IDLE x C x v_i otherwise."""
    scale = self.norm if self.included else IDLE
    return scale * self.clip * canary_direction(self.seed, self.index, dimension)


def canary_train(msg: Message, config: CanaryConfig) -> Message:
  """The reply to a train message: the received model plus `config.update`, under the
  received record's name, with a MetricRecord of the real clients' keys."""
  records = msg.content.array_records
  if len(records) != 1:
    raise ValueError(f'a canary takes a message with exactly one ArrayRecord (the model), got '
                     f'{list(records)}')
  name, record = next(iter(records.items()))
  reply = add_to_model(record, config.update(flat_model(record).size))
  metrics = {k: 0.0 for k in config.metrics}
  metrics[config.weight_key] = int(config.num_examples)
  return Message(RecordDict({name: reply, METRIC_RECORD: MetricRecord(metrics)}), reply_to=msg)


def canary_evaluate(msg: Message, config: CanaryConfig) -> Message:
  """Weight 0 and 0.0 for every `canary-eval-metrics` key (FedAvg's mean is unchanged)."""
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
  """Canary nodes to the canary behaviour, every other node's messages to the user's app."""

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


def app_mods(app: ClientApp) -> list[Any]:
  """The app-level mods of a flwr ClientApp (Flower 1.42 keeps them in the private `_mods`);
  if this Flower has no such attribute, one clear error line, never a silent empty list
  (the canaries would then skip the user's clipping or LocalDpMod: another mechanism)."""
  mods = getattr(app, '_mods', None)
  if not isinstance(mods, list):
    raise AttributeError(
        f'with_canaries: this flwr {getattr(flwr, "__version__", "?")} ClientApp has no list '
        f'`_mods` (got {type(mods).__name__}): pass with_canaries(app, canary_mods=[...]) with '
        'the mods your ClientApp was built with ([] for none)')
  return list(mods)


def with_canaries(app: ClientApp, *, canary_mods: Sequence[Any] | None = None) -> ClientApp:
  """The user's ClientApp with canary nodes: a node whose node config has `canary-index` runs
  the canary behaviour, every other node runs `app` on every message, unchanged (and answers
  the discovery query itself, index -1).

  Args:
    app: The user's ClientApp (what their pyproject's `clientapp` names).
    canary_mods: Mods the canary messages go through. None: `app`'s own app-level mods
      (`app_mods`), so that `fixedclipping_mod` and `LocalDpMod` act on the canaries as on
      every node; mods of one handler (`@app.train(mods=...)`) are not reached. [] for none.
  """
  if not isinstance(app, ClientApp):
    raise TypeError(f'with_canaries wraps a flwr.clientapp.ClientApp, got '
                    f'{type(app).__module__}.{type(app).__qualname__}')
  mods = app_mods(app) if canary_mods is None else list(canary_mods)
  return _WithCanaries(app, _canary_app(mods))


def canary_node_configs(num_canaries: int, *, seed: int, canary_norm: float, clip_norm: float,
                        **extra: Any) -> list[dict[str, Any]]:
  """The node configs of k canary SuperNodes (`extra`: further keys, the same on each)."""
  return [{INDEX_KEY: i, SEED_KEY: check_seed(seed), NORM_KEY: float(canary_norm),
           CLIP_KEY: float(clip_norm), **extra} for i in range(int(num_canaries))]


def node_config_text(config: Mapping[str, Any]) -> str:
  """`flower-supernode --node-config` text of one node config (TOML values)."""
  def value(v):
    if isinstance(v, bool):
      return 'true' if v else 'false'
    if isinstance(v, (int, float, np.integer, np.floating)):
      return repr(v.item() if hasattr(v, 'item') else v)
    return json.dumps(str(v))
  return ' '.join(f'{k}={value(v)}' for k, v in config.items())
