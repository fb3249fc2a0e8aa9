"""The server side of the canary audit of a user's own Flower app: canary discovery and
`CanaryAuditStrategy`, which wraps the user's strategy, adds no noise of its own and
records what the audit needs each round (`audits.user_app` docstring).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any, Iterable, Mapping, Sequence

from absl import logging
import numpy as np

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.app import RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fl_privacy.flower.audits import user_app
from fl_privacy.flower.audits import user_rounds
from fl_privacy.flower.strategies import base
from fl_privacy.report import atomic


# ------------------------------------------------------------------------------ server side ---

def discover_canaries(grid: Grid, *, timeout: float = 300.0) -> dict[int, dict[str, Any]]:
  """node id -> the settings each canary node reports (`canary_query`), from one `query`
  message to every node of `grid`. A node that replies with an error (its ClientApp is not
  `with_canaries` / `canary_client_app`) or not at all is taken as a real node (logged)."""
  nodes = [int(n) for n in grid.get_node_ids()]
  messages = [Message(RecordDict({'config': ConfigRecord({user_app.QUERY_KEY: 'canary'})}),
                      dst_node_id=n, message_type='query') for n in nodes]
  replies = list(grid.send_and_receive(messages, timeout=float(timeout)))
  found, answered = {}, set()
  for reply in replies:
    node = int(reply.metadata.src_node_id)
    answered.add(node)
    if reply.has_error() or user_app.QUERY_RECORD not in reply.content.config_records:
      logging.warning('node %d did not answer the canary query (taken as a real node)', node)
      continue
    info = dict(reply.content.config_records[user_app.QUERY_RECORD])
    if int(info.get(user_app.INDEX_KEY, -1)) >= 0:
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
        self.matrix = np.stack([user_app.canary_direction(self.seed, i, self.dimension)
                                for i in range(self.count)])
    elif int(dimension) != self.dimension:
      raise ValueError(f'the model has {dimension} float coordinates, {self.dimension} in the '
                       'first round: the canary directions need a model of fixed size')

  def direction(self, index: int, dimension: int) -> np.ndarray:
    self._fix(dimension)
    if self.matrix is not None:
      return self.matrix[index]
    return user_app.canary_direction(self.seed, index, dimension)

  def __call__(self, flat: np.ndarray) -> np.ndarray:
    self._fix(flat.size)
    if self.matrix is not None:
      return self.matrix @ flat
    return np.asarray([user_app.canary_direction(self.seed, i, flat.size) @ flat
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


class CanaryAuditStrategy(base._Wrapper):  # pylint: disable=protected-access
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
               threats: Sequence[str] = user_app.DEFAULT_THREATS, gaussian: bool = True,
               directory: str | os.PathLike | None = None, keep_models: bool = False,
               query_timeout: float = 300.0,
               direction_cache_bytes: int = user_app.DIRECTION_CACHE_BYTES):
    super().__init__(inner)
    self.seed = user_app._check_seed(seed)
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
    if (not threats or len(set(threats)) != len(threats)
        or not set(threats) <= set(user_app.THREATS)):
      raise ValueError(f'threats must be distinct names of {user_app.THREATS} (got {threats})')
    if int(num_null) < 2:
      raise ValueError(f'num_null must be >= 2 (got {num_null})')
    self.canary_norm, self.clip_norm = float(canary_norm), float(clip_norm)
    self.delta, self.confidence = float(delta), float(confidence)
    self.stated_epsilon = None if stated_epsilon is None else float(stated_epsilon)
    self.num_canaries = None if num_canaries is None else int(num_canaries)
    self.canary_nodes = (None if canary_nodes is None
                         else _check_indices(canary_nodes, self.num_canaries))
    self.num_null = int(num_null)
    self.threats = tuple(t for t in user_app.THREATS if t in threats)
    self.gaussian = bool(gaussian)
    self.directory = None if directory is None else pathlib.Path(directory)
    if self.directory is not None:
      self.directory.mkdir(parents=True, exist_ok=True)
    self.keep_models = bool(keep_models)
    self.query_timeout = float(query_timeout)
    self.cache_bytes = int(direction_cache_bytes)
    self.rounds: list[user_rounds.CanaryRound] = []
    self._projector: _Projector | None = None
    self._pending: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, int]] = {}

  @property
  def k(self) -> int:
    if self.canary_nodes is None:
      raise RuntimeError('the canary nodes are not known before the first round')
    return len(self.canary_nodes)

  def _learn_canaries(self, grid: Grid) -> None:
    found = discover_canaries(grid, timeout=self.query_timeout)
    mine = {user_app.SEED_KEY: self.seed, user_app.NORM_KEY: self.canary_norm,
            user_app.CLIP_KEY: self.clip_norm}
    for node, info in found.items():
      for key, want in mine.items():
        got = info.get(key)
        if got is None or not math.isclose(float(got), float(want), rel_tol=1e-12):
          raise ValueError(f'canary node {node} (index {info.get(user_app.INDEX_KEY)}) has '
                           f'{key}={got}, '
                           f'the strategy {want}: every canary and the strategy need the same')
    self.canary_nodes = _check_indices({n: int(i[user_app.INDEX_KEY]) for n, i in found.items()},
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
    flat = user_app.flat_model(arrays)
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
      upload = user_app.flat_model(next(iter(msg.content.array_records.values())))
      if upload.size != flat.size:
        logging.warning('round %d: canary %d replied %d coordinates, the model has %d (not '
                        'read)', server_round, i, upload.size, flat.size)
        continue
      replied[i] = True
      if uploads is not None:
        uploads[i] = float((upload - flat) @ self._projector.direction(i, flat.size))
    arrays, metrics = self.inner.aggregate_train(server_round, replies)
    after_flat = flat if arrays is None else user_app.flat_model(arrays)
    self.rounds.append(user_rounds.CanaryRound(
        server_round=int(server_round), sampled=sampled, replied=replied, num_messages=count,
        before=before, after=self._projector(after_flat), uploads=uploads,
        model=flat if self.keep_models else None,
        aggregate=after_flat if self.keep_models else None))
    if self.directory is not None:
      user_rounds.save_rounds(self.directory / user_app.ROUNDS_FILE, self.rounds, self.meta())
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
    out = user_rounds.audit_rounds(self.rounds, seed=self.seed, num_canaries=self.k,
                                   delta=self.delta, confidence=self.confidence,
                                   threats=self.threats, gaussian=self.gaussian,
                                   stated=self.stated())
    out.update(canary_norm=self.canary_norm, clip_norm=self.clip_norm,
               dimension=self._projector.dimension)
    if self.directory is not None:
      atomic.atomic_write_text(self.directory / user_app.AUDIT_FILE,
                               json.dumps(out, indent=1, sort_keys=True))
    return out
