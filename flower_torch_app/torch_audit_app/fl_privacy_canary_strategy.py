"""The recording strategy for auditing your own Flower app: numpy and flwr only (server side).

Vendored with `fl_privacy_canaries.py` (its module docstring says how and why).
`CanaryAuditStrategy(inner, ...)` wraps any Message-API strategy as the OUTERMOST wrapper and
delegates every call to it: the same messages go out, the same aggregate comes back, and no
global generator is touched (Flower's noise and sampling draw from numpy's and Python's).
Before the first round it learns the canary nodes by one `query` message to every node (or
from `canary_nodes`). Per training round it records what the user's server holds anyway,
projected on the k canary directions and `num_null` never-inserted ones (k + num_null numbers
a round whatever the model's size): the round's model and the aggregate the inner strategy
returned, which canaries were sampled and which replied, with the 'uploads' threat each
canary's upload minus the round's model on its own direction, and Flower's stated epsilon so
far (`privacy_spent()` of the DP wrapper, with its settings and its accountant's ledger).
It rewrites `<directory>/canary_rounds.npz` atomically after every round (`save_rounds`,
`load_rounds`: FORMAT version FORMAT_VERSION, arrays per round plus one JSON `meta` holding
the canary seed, count, nodes, norm and clip, the threats, delta, confidence and claim).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
import os
import pathlib
import tempfile
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

import flwr
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

try:  # inside a package: the user's app, or fl_privacy.flower.inapp
  from . import fl_privacy_canaries as canaries
except ImportError:  # beside it on sys.path
  import fl_privacy_canaries as canaries  # type: ignore[no-redef]

FORMAT = 'fl-privacy-canary-recording'
FORMAT_VERSION = 1
ROUNDS_FILE = 'canary_rounds.npz'
THREATS = ('all_iterates', 'last_iterate', 'uploads')
DEFAULT_THREATS = THREATS[:2]
# Directions kept in memory while (k + num_null) x dimension x 8 bytes stays below this.
DIRECTION_CACHE_BYTES = 256 * 2**20
# What `meta()` holds that `load_rounds` checks for (the analysis reads them).
META_KEYS = ('seed', 'num_canaries', 'num_null', 'canary_norm', 'clip_norm', 'dimension',
             'canary_nodes', 'threats', 'gaussian', 'delta', 'confidence', 'stated_epsilon',
             'flower')
_log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------ server side ---

def discover_canaries(grid: Grid, *, timeout: float = 300.0) -> dict[int, dict[str, Any]]:
  """node id -> the settings each canary node reports, from one `query` message to every
  node. A node that errs (its ClientApp is not wrapped) or does not reply is a real node."""
  nodes = [int(n) for n in grid.get_node_ids()]
  messages = [Message(RecordDict({'config': ConfigRecord({canaries.QUERY_KEY: 'canary'})}),
                      dst_node_id=n, message_type='query') for n in nodes]
  found, answered = {}, set()
  for reply in grid.send_and_receive(messages, timeout=float(timeout)):
    node = int(reply.metadata.src_node_id)
    answered.add(node)
    if reply.has_error() or canaries.QUERY_RECORD not in reply.content.config_records:
      _log.warning('node %d did not answer the canary query (taken as a real node)', node)
      continue
    info = dict(reply.content.config_records[canaries.QUERY_RECORD])
    if int(info.get(canaries.INDEX_KEY, -1)) >= 0:
      found[node] = info
  for node in sorted(set(nodes) - answered):
    _log.warning('node %d did not answer the canary query within %.0f s (taken as a real '
                 'node)', node, timeout)
  return found


def check_indices(canary_nodes: Mapping[int, int], num_canaries: int | None) -> dict[int, int]:
  """{node: index} with indices 0..k-1 (k >= 4, `num_canaries` when given); else ValueError."""
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
  """What the strategy recorded of one training round (k canaries, num_null nulls).

  Attributes:
    server_round: Flower's round number r.
    sampled: bool [k], canary i was sent a train message.
    replied: bool [k], canary i's reply carried a model of the right size.
    num_messages: train messages the inner strategy sent (every node).
    before: float64 [k + num_null], the round's model projected on the directions.
    after: float64 [k + num_null], the inner strategy's aggregate projected (the round's
      model again when it returned none).
    uploads: float64 [k], canary i's upload minus the round's model on v_i (NaN where none),
      or None when the `uploads` threat is off.
    flower_epsilon: Flower's `privacy_spent()` epsilon after the round (NaN if none).
    model, aggregate: the flat models themselves (`keep_models`, in memory only).
  """
  server_round: int
  sampled: np.ndarray
  replied: np.ndarray
  num_messages: int
  before: np.ndarray
  after: np.ndarray
  uploads: np.ndarray | None = None
  flower_epsilon: float = math.nan
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
        self.matrix = np.stack([canaries.canary_direction(self.seed, i, self.dimension)
                                for i in range(self.count)])
    elif int(dimension) != self.dimension:
      raise ValueError(f'the model has {dimension} float coordinates, {self.dimension} in the '
                       'first round: the canary directions need a model of fixed size')

  def direction(self, index: int, dimension: int) -> np.ndarray:
    self._fix(dimension)
    if self.matrix is not None:
      return self.matrix[index]
    return canaries.canary_direction(self.seed, index, dimension)

  def __call__(self, flat: np.ndarray) -> np.ndarray:
    self._fix(flat.size)
    if self.matrix is not None:
      return self.matrix @ flat
    return np.asarray([canaries.canary_direction(self.seed, i, flat.size) @ flat
                       for i in range(self.count)])


def _chain(strategy: Any) -> Iterable[Any]:
  """The strategy and those it wraps (`inner` or Flower's `strategy` attribute)."""
  seen = set()
  while strategy is not None and id(strategy) not in seen:
    seen.add(id(strategy))
    yield strategy
    strategy = getattr(strategy, 'inner', None) or getattr(strategy, 'strategy', None)


def flower_stated(strategy: Strategy) -> dict[str, Any] | None:
  """Flower's own claim: `privacy_spent()` of the first strategy of the chain that has one,
  its delta and declaration, the wrapper's noise settings and its accountant's ledger
  (`state_dict()`, the inputs dp-accounting's RDP composition took); None if none."""
  for s in _chain(strategy):
    spent_fn = getattr(s, 'privacy_spent', None)
    spent = spent_fn() if callable(spent_fn) else None
    if spent is None:
      continue
    accountant = getattr(s, 'accountant', None)
    config = getattr(accountant, 'config', None)
    state = getattr(accountant, 'state_dict', None)
    wrapper = {k: getattr(s, k) for k in ('noise_multiplier', 'clipping_norm',
                                          'num_sampled_clients')
               if isinstance(getattr(s, k, None), (int, float))}
    return dict(stated_epsilon=float(spent.epsilon), stated_delta=float(spent.delta),
                stated_epsilon_source=f'flwr privacy_spent() of {type(s).__name__} '
                f'({spent.accounting_method}, {spent.num_releases} releases)',
                stated_relation=str(getattr(getattr(config, 'neighboring_relation', None),
                                            'value', None)),
                stated_sampling=str(getattr(getattr(config, 'sampling_method', None),
                                            'value', None)),
                wrapper=type(s).__name__, wrapper_settings=wrapper,
                accountant_state=state() if callable(state) else None)
  return None


class CanaryAuditStrategy(Strategy):
  """Wraps a user's Message-API strategy unchanged and records what the server saw.

  Args:
    inner: The user's strategy as deployed (e.g. their FedAvg in Flower's
      `DifferentialPrivacyServerSideFixedClipping`); this wrapper must be the outermost.
    seed: s, the canary SuperNodes' `canary-seed`.
    canary_norm: The canaries' `canary-norm` (units of the clip, >= 1).
    clip_norm: C, the canaries' `clip-norm` (the wrapper's clipping norm).
    delta: The delta of the epsilons the analysis reports; None: Flower's accountant's.
    stated_epsilon: The claim to test (per client, over the rounds that run); None:
      Flower's `privacy_spent()` where the inner strategy has one.
    canary_nodes: node id -> canary index; None: learnt by a `query` before round 1 (the
      canaries must be connected: `min_available_nodes` counting them makes Flower wait).
    num_canaries: The k expected (checked), or None.
    num_null: Never-inserted directions recorded (the Gaussian fit's null).
    confidence: c, the verdict's family-wise confidence (recorded for the analysis).
    threats: What the analysis scores, fixed here before any data: 'all_iterates',
      'last_iterate', and 'uploads' (records each canary's upload: LocalDpMod's adversary).
    gaussian: The mechanism adds Gaussian noise (the f-DP one-run bound then counts).
    directory: Writes ROUNDS_FILE there after every round (atomically).
    keep_models: Also keep every round's flat models in memory (small models, tests).
    query_timeout: Seconds the discovery query waits.
    direction_cache_bytes: Directions kept in memory below this size (else redrawn).
  """

  def __init__(self, inner: Strategy, *, seed: int, canary_norm: float, clip_norm: float,
               delta: float | None = None, stated_epsilon: float | None = None,
               canary_nodes: Mapping[int, int] | None = None, num_canaries: int | None = None,
               num_null: int = 1000, confidence: float = 0.95,
               threats: Sequence[str] = DEFAULT_THREATS, gaussian: bool = True,
               directory: str | os.PathLike | None = None, keep_models: bool = False,
               query_timeout: float = 300.0,
               direction_cache_bytes: int = DIRECTION_CACHE_BYTES):
    if not isinstance(inner, Strategy) or type(inner).start is not Strategy.start:
      raise TypeError('CanaryAuditStrategy wraps a flwr.serverapp.strategy.Strategy whose '
                      f'round loop is Strategy.start (got {type(inner).__qualname__})')
    self.inner = inner
    self.seed = canaries.check_seed(seed)
    if not (math.isfinite(canary_norm) and canary_norm >= 1.0):
      raise ValueError(f'canary_norm must be >= 1 (got {canary_norm})')
    if not (math.isfinite(clip_norm) and clip_norm > 0):
      raise ValueError(f'clip_norm must be > 0 (got {clip_norm})')
    if delta is not None and not 0.0 < float(delta) < 1.0:
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
    self.delta = None if delta is None else float(delta)
    self.confidence = float(confidence)
    self.stated_epsilon = None if stated_epsilon is None else float(stated_epsilon)
    self.num_canaries = None if num_canaries is None else int(num_canaries)
    self.canary_nodes = (None if canary_nodes is None
                         else check_indices(canary_nodes, self.num_canaries))
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
    self.flower: dict[str, Any] | None = None  # `flower_stated` after the last round
    self._projector: _Projector | None = None
    self._pending: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, int]] = {}

  @property
  def k(self) -> int:
    if self.canary_nodes is None:
      raise RuntimeError('the canary nodes are not known before the first round')
    return len(self.canary_nodes)

  def _learn_canaries(self, grid: Grid) -> None:
    found = discover_canaries(grid, timeout=self.query_timeout)
    mine = {canaries.SEED_KEY: self.seed, canaries.NORM_KEY: self.canary_norm,
            canaries.CLIP_KEY: self.clip_norm}
    for node, info in found.items():
      for key, want in mine.items():
        got = info.get(key)
        if got is None or not math.isclose(float(got), float(want), rel_tol=1e-12):
          raise ValueError(f'canary node {node} (index {info.get(canaries.INDEX_KEY)}) has '
                           f'{key}={got}, the strategy {want}: every canary and the strategy '
                           'need the same')
    self.canary_nodes = check_indices(
        {n: int(i[canaries.INDEX_KEY]) for n, i in found.items()}, self.num_canaries)
    _log.info('canary audit: %d canary nodes among %d', len(self.canary_nodes),
              len(list(grid.get_node_ids())))

  def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                      grid: Grid) -> list[Message]:
    """The inner strategy's messages, unchanged; remembers the round's model (projected) and
    which canaries were sampled (the first round learns the canary nodes first)."""
    messages = list(self.inner.configure_train(server_round, arrays, config, grid))
    if self.canary_nodes is None:
      self._learn_canaries(grid)
    if self._projector is None:
      self._projector = _Projector(self.seed, self.k + self.num_null, self.cache_bytes)
    flat = canaries.flat_model(arrays)
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
    rewrites them in place), returns the inner strategy's aggregate unchanged, records."""
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
      upload = canaries.flat_model(next(iter(msg.content.array_records.values())))
      if upload.size != flat.size:
        _log.warning('round %d: canary %d replied %d coordinates, the model has %d (not '
                     'read)', server_round, i, upload.size, flat.size)
        continue
      replied[i] = True
      if uploads is not None:
        uploads[i] = float((upload - flat) @ self._projector.direction(i, flat.size))
    arrays, metrics = self.inner.aggregate_train(server_round, replies)
    after_flat = flat if arrays is None else canaries.flat_model(arrays)
    self.flower = flower_stated(self.inner)
    self.rounds.append(CanaryRound(
        server_round=int(server_round), sampled=sampled, replied=replied, num_messages=count,
        before=before, after=self._projector(after_flat), uploads=uploads,
        flower_epsilon=math.nan if self.flower is None else self.flower['stated_epsilon'],
        model=flat if self.keep_models else None,
        aggregate=after_flat if self.keep_models else None))
    if self.directory is not None:
      save_rounds(self.directory / ROUNDS_FILE, self.rounds, self.meta())
    return arrays, metrics

  def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                         grid: Grid) -> Iterable[Message]:
    return self.inner.configure_evaluate(server_round, arrays, config, grid)

  def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                         ) -> MetricRecord | None:
    return self.inner.aggregate_evaluate(server_round, replies)

  def summary(self) -> None:
    _log.info('CanaryAuditStrategy around %s', type(self.inner).__name__)
    self.inner.summary()

  def meta(self) -> dict[str, Any]:
    """What the analysis needs besides the rounds (saved with them)."""
    return dict(format=FORMAT, format_version=FORMAT_VERSION, seed=self.seed,
                num_canaries=len(self.canary_nodes or {}), num_null=self.num_null,
                canary_norm=self.canary_norm, clip_norm=self.clip_norm, idle=canaries.IDLE,
                dimension=None if self._projector is None else self._projector.dimension,
                canary_nodes={str(n): i for n, i in sorted((self.canary_nodes or {}).items())},
                threats=list(self.threats), gaussian=self.gaussian, delta=self.delta,
                confidence=self.confidence, stated_epsilon=self.stated_epsilon,
                flower=self.flower, flwr_version=str(getattr(flwr, '__version__', '?')),
                numpy_version=np.__version__)


# ------------------------------------------------------------------------------ the file ---

def _atomic_write(path: str | os.PathLike, data: bytes) -> None:
  """`data` to `path` through a fsynced temp file beside it and os.replace (a reader sees
  the old file or the new one, never a part)."""
  path = os.fspath(path)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                             prefix='.' + os.path.basename(path), suffix='.tmp')
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def save_rounds(path: str | os.PathLike, rounds: Sequence[CanaryRound],
                meta: Mapping[str, Any]) -> None:
  """The recorded rounds as one .npz (atomically), `meta` as JSON (`load_rounds`)."""
  arrays = {'meta': np.asarray(json.dumps(dict(meta), sort_keys=True)),
            'server_round': np.asarray([r.server_round for r in rounds], np.int64),
            'num_messages': np.asarray([r.num_messages for r in rounds], np.int64),
            'flower_epsilon': np.asarray([r.flower_epsilon for r in rounds], np.float64)}
  for name in ('sampled', 'replied', 'before', 'after'):
    arrays[name] = np.stack([getattr(r, name) for r in rounds])
  if rounds and rounds[0].uploads is not None:
    arrays['uploads'] = np.stack([r.uploads for r in rounds])
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  _atomic_write(path, buffer.getvalue())


def load_rounds(path: str | os.PathLike) -> tuple[dict[str, Any], list[CanaryRound]]:
  """(meta, rounds) of a `save_rounds` file; ValueError naming the field it finds wrong."""
  try:
    with np.load(path, allow_pickle=False) as f:
      a = {k: f[k] for k in f.files}
  except (OSError, ValueError) as e:
    raise ValueError(f'{path}: not a readable .npz ({e})') from None
  if 'meta' not in a:
    raise ValueError(f'{path}: no meta: not a canary recording')
  meta = json.loads(str(a['meta']))
  if meta.get('format') != FORMAT or meta.get('format_version') != FORMAT_VERSION:
    raise ValueError(f'{path}: format {meta.get("format")!r} version '
                     f'{meta.get("format_version")!r}; this reader takes {FORMAT!r} version '
                     f'{FORMAT_VERSION}')
  missing = [k for k in META_KEYS if k not in meta]
  if missing:
    raise ValueError(f'{path}: meta.{missing[0]} missing')
  k, t = int(meta['num_canaries']), len(a.get('server_round', ()))
  width = {'sampled': k, 'replied': k, 'before': k + int(meta['num_null']),
           'after': k + int(meta['num_null']), 'uploads': k}
  for name in ('server_round', 'num_messages', 'flower_epsilon', *width):
    if name not in a and name != 'uploads':
      raise ValueError(f'{path}: {name} missing')
    if name in a and (len(a[name]) != t or (name in width and a[name].shape != (t, width[name]))):
      raise ValueError(f'{path}: {name} has shape {a[name].shape}, {t} rounds of '
                       f'{width.get(name, 1)} expected')
  rounds = [CanaryRound(server_round=int(a['server_round'][r]), sampled=a['sampled'][r],
                        replied=a['replied'][r], num_messages=int(a['num_messages'][r]),
                        before=a['before'][r], after=a['after'][r],
                        uploads=a['uploads'][r] if 'uploads' in a else None,
                        flower_epsilon=float(a['flower_epsilon'][r]))
            for r in range(t)]
  return meta, rounds
