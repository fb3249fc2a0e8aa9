"""`RecordingStrategy`: wraps a Flower strategy and records every round's uploads (one
`round_XXXXX.npz` a round), and `recording_from_uploads`, which turns them into the
passive attacks' recording (`fl.recording` format).
"""

from __future__ import annotations

import dataclasses
import io
import os
import pathlib
import re
from typing import Any, Callable, Iterable, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fl_privacy.fl import queries
from fl_privacy.flower import bridge
from fl_privacy.flower.strategies import base
from fl_privacy.report import atomic


ROUND_FILE = 'round_{:05d}.npz'
_ROUND_FILE_RE = re.compile(r'round_(\d{5,})\.npz$')


# --- recorded rounds --------------------------------------------------------------------------


@dataclasses.dataclass
class RoundUploads:
  """What the server received in one training round (numpy pytrees shaped like the template).

  Attributes:
    server_round: Flower's round number r (1-based); the round starts from w_t, t = r - 1.
    global_params: w_t, the arrays the strategy was handed in `configure_train`.
    node_ids: uint64 [K] the nodes whose reply carried an upload, in reply order.
    uploads: K pytrees, node k's uploaded arrays bit for bit.
    num_examples: float64 [K] each reply's weight (`num-examples`, or the inner strategy's
      `weighted_by_key`; NaN when absent).
    sent: node id -> the arrays it received, for nodes sent something other than w_t.
    failures: uint64 [F] nodes whose reply carried an error or no usable upload.
  """
  server_round: int
  global_params: Any
  node_ids: np.ndarray
  uploads: list[Any]
  num_examples: np.ndarray
  sent: dict[int, Any] = dataclasses.field(default_factory=dict)
  failures: np.ndarray = dataclasses.field(
      default_factory=lambda: np.zeros(0, np.uint64))

  def received(self, node_id: int) -> Any:
    """The arrays node `node_id` trained from: its entry of `sent`, else w_t."""
    return self.sent.get(int(node_id), self.global_params)

  def update(self, node_id: int) -> Any:
    """Delta = w_t - w_local of node `node_id` (numpy, the leaves' dtype)."""
    hits = np.flatnonzero(self.node_ids == int(node_id))
    if hits.size == 0:
      raise KeyError(f'node {node_id} uploaded nothing in round {self.server_round} '
                     f'(uploads from {self.node_ids.tolist()})')
    i = int(hits[0])
    return jax.tree_util.tree_map(np.subtract, self.global_params, self.uploads[i])


class UploadLog:
  """An observer keeping every `RoundUploads` in memory (`rounds`, in round order)."""

  def __init__(self):
    self.rounds: list[RoundUploads] = []

  def __call__(self, uploads: RoundUploads) -> None:
    self.rounds.append(uploads)


def _stack(trees: Sequence[Any], template: Any) -> dict[str, np.ndarray]:
  names = bridge.param_names(template)
  leaves = [jax.tree_util.tree_leaves(t) for t in trees]
  out = {}
  for j, (name, leaf) in enumerate(zip(names, jax.tree_util.tree_leaves(template))):
    shape, dtype = tuple(leaf.shape), np.dtype(leaf.dtype)
    out[name] = (np.stack([l[j] for l in leaves]) if leaves
                 else np.zeros((0,) + shape, dtype))
  return out


def round_arrays(uploads: RoundUploads, template: Any) -> dict[str, np.ndarray]:
  """The flat arrays `save_round` writes (names prefixed `global/`, `upload/`, `sent/`)."""
  arrays = {'server_round': np.asarray(uploads.server_round, np.int64),
            'node_ids': np.asarray(uploads.node_ids, np.uint64),
            'num_examples': np.asarray(uploads.num_examples, np.float64),
            'failures': np.asarray(uploads.failures, np.uint64),
            'sent_node_ids': np.asarray(sorted(uploads.sent), np.uint64)}
  names = bridge.param_names(template)
  for name, leaf in zip(names, jax.tree_util.tree_leaves(uploads.global_params)):
    arrays[f'global/{name}'] = np.asarray(leaf)
  for prefix, trees in (('upload', uploads.uploads),
                        ('sent', [uploads.sent[n] for n in sorted(uploads.sent)])):
    for name, stacked in _stack(trees, template).items():
      arrays[f'{prefix}/{name}'] = stacked
  return arrays


def save_round(path: str | os.PathLike, uploads: RoundUploads, template: Any) -> None:
  """Writes one round as an uncompressed .npz, atomically (`report.atomic`)."""
  buffer = io.BytesIO()
  np.savez(buffer, **round_arrays(uploads, template))
  atomic.atomic_write_bytes(path, buffer.getvalue())


def load_round(path: str | os.PathLike, template: Any) -> RoundUploads:
  """Reads a file of `save_round` back into `RoundUploads` (checked against `template`)."""
  with np.load(path, allow_pickle=False) as f:
    arrays = {k: f[k] for k in f.files}
  _, treedef = jax.tree_util.tree_flatten(template)
  names = bridge.param_names(template)
  specs = [(np.dtype(l.dtype), tuple(l.shape)) for l in jax.tree_util.tree_leaves(template)]
  for prefix in ('global', 'upload', 'sent'):
    for name, (dtype, shape) in zip(names, specs):
      key = f'{prefix}/{name}'
      if key not in arrays:
        raise bridge.RecordMismatchError(f'{path}: array {key!r} of the template is missing')
      got = arrays[key]
      want = shape if prefix == 'global' else got.shape[:1] + shape
      if got.dtype != dtype or got.shape != want:
        raise bridge.RecordMismatchError(
            f'{path}: array {key!r} is {got.dtype} {got.shape}, template {dtype} {want}')

  def tree(prefix, i=None):
    return jax.tree_util.tree_unflatten(
        treedef, [arrays[f'{prefix}/{n}'] if i is None else arrays[f'{prefix}/{n}'][i]
                  for n in names])

  node_ids = arrays['node_ids']
  sent_ids = arrays['sent_node_ids']
  return RoundUploads(
      server_round=int(arrays['server_round']), global_params=tree('global'),
      node_ids=node_ids, uploads=[tree('upload', i) for i in range(len(node_ids))],
      num_examples=arrays['num_examples'],
      sent={int(n): tree('sent', i) for i, n in enumerate(sent_ids)},
      failures=arrays['failures'])


def load_rounds(directory: str | os.PathLike, template: Any) -> list[RoundUploads]:
  """Every `round_<r>.npz` of `directory`, in round order."""
  files = sorted((int(m.group(1)), p) for p in pathlib.Path(directory).iterdir()
                 if (m := _ROUND_FILE_RE.match(p.name)))
  return [load_round(p, template) for _, p in files]


class RecordingStrategy(base._Wrapper):
  """Wraps a Message-API strategy unchanged and records every client's upload per round.

  Args:
    inner: The strategy (e.g. `flwr.serverapp.strategy.FedAvg()`).
    template: The model's pytree (structure, dtypes, shapes; e.g. `model.init(...)` or
      `jax.eval_shape` of it); every recorded ArrayRecord is checked against it.
    directory: Write each round to `<directory>/round_<r:05d>.npz` (created if needed).
    observer: Called with each round's `RoundUploads` (e.g. an `UploadLog`).

  Attributes:
    inner: The wrapped strategy.
  """

  def __init__(self, inner: Strategy, template: Any, *,
               directory: str | os.PathLike | None = None,
               observer: Callable[[RoundUploads], None] | None = None):
    super().__init__(inner)
    if directory is None and observer is None:
      raise ValueError('RecordingStrategy needs a directory, an observer (e.g. UploadLog()), '
                       'or both: otherwise it records nothing')
    self.template = template
    self.names = bridge.param_names(template)
    self.directory = None if directory is None else pathlib.Path(directory)
    if self.directory is not None:
      self.directory.mkdir(parents=True, exist_ok=True)
    self.observer = observer
    self._started: dict[int, tuple[Any, ArrayRecord, dict[int, Any]]] = {}

  def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                      grid: Grid) -> list[Message]:
    """The inner strategy's messages, unchanged (as a list); remembers w_t and who got what."""
    messages = list(self.inner.configure_train(server_round, arrays, config, grid))
    global_params = bridge.from_array_record(arrays, self.template)
    sent = {}
    for msg in messages:
      if not msg.has_content() or len(msg.content.array_records) != 1:
        continue
      _, record = bridge.only_array_record(msg.content)
      if not base._same_arrays(record, arrays):
        sent[int(msg.metadata.dst_node_id)] = bridge.from_array_record(record, self.template)
    self._started[int(server_round)] = (global_params, arrays, sent)
    return messages

  def aggregate_train(self, server_round: int, replies: Iterable[Message]
                      ) -> tuple[ArrayRecord | None, MetricRecord | None]:
    """Records the replies, then returns the inner strategy's aggregate of the same replies."""
    replies = list(replies)
    self._record(int(server_round), replies)
    return self.inner.aggregate_train(server_round, replies)

  def _record(self, server_round: int, replies: list[Message]) -> None:
    if server_round not in self._started:
      raise RuntimeError(f'aggregate_train of round {server_round} without its '
                         'configure_train: the round\'s model w_t is unknown')
    global_params, _, sent = self._started.pop(server_round)
    key = base._weight_key(self.inner)
    node_ids, uploads, weights, failures = [], [], [], []
    for msg in replies:
      node = int(msg.metadata.src_node_id)
      if msg.has_error():
        failures.append(node)
        continue
      try:
        _, record = bridge.only_array_record(msg.content)
        upload = bridge.from_array_record(record, self.template)
      except ValueError as e:  # RecordMismatchError too: the inner strategy decides
        logging.warning('round %d: reply of node %d not recorded: %s', server_round, node, e)
        failures.append(node)
        continue
      node_ids.append(node)
      uploads.append(upload)
      weights.append(base._weight(msg.content, key))
    result = RoundUploads(server_round=server_round, global_params=global_params,
                          node_ids=np.asarray(node_ids, np.uint64), uploads=uploads,
                          num_examples=np.asarray(weights, np.float64), sent=sent,
                          failures=np.asarray(failures, np.uint64))
    if self.directory is not None:
      save_round(self.directory / ROUND_FILE.format(server_round), result, self.template)
    if self.observer is not None:
      self.observer(result)


def recording_from_uploads(apply_fn: Callable, rounds: Sequence[RoundUploads], query_x,
                           query_y, *, chunk_size: int = 256,
                           node_ids: Sequence[int] | None = None) -> dict[str, np.ndarray]:
  """The `fl.recording` arrays of recorded Flower rounds, through `fl.queries.measure`.

  For each round, the K updates Delta_k = w_t - w_local_k (w_t the round's global model,
  w_local_k node k's upload) go through `queries.measure` at w_t, as
  `recording.train_recorded` measures a recorded round.

  Args:
    apply_fn: `apply_fn(params, x) -> logits` (hashable, e.g. `model.apply`).
    rounds: The recorded rounds (`UploadLog.rounds` or `load_rounds(...)`).
    query_x: Query inputs [Q, ...] (float, as the model takes them).
    query_y: Query labels [Q].
    chunk_size: Queries per `measure` chunk.
    node_ids: The K nodes, in the order of axis K (default: the first round's, sorted);
      every round must hold an upload of each.

  Returns:
    `loss`, `cos`, `diff`, `margin` float32 [R, K, Q], `grad_sq` float32 [R, Q], `rounds` int32 [R]
    (0-based index t = server round - 1 of the model w_t each round measured at), and
    `node_ids` uint64 (Flower node ids are unsigned 64-bit) [K], `num_examples` float64 [R, K] (the replies' weights).
  """
  if not rounds:
    raise ValueError('recording_from_uploads needs at least one recorded round')
  order = (np.sort(rounds[0].node_ids) if node_ids is None
           else np.asarray(node_ids, np.uint64))
  if order.size == 0:
    raise ValueError(f'round {rounds[0].server_round} holds no upload')
  out = {name: [] for name in ('loss', 'cos', 'diff', 'grad_sq', 'margin', 'num_examples')}
  for r in rounds:
    index = {int(n): i for i, n in enumerate(r.node_ids)}
    missing = [int(n) for n in order if int(n) not in index]
    if missing:
      raise ValueError(f'round {r.server_round} has no upload of node(s) {missing} (uploads '
                       f'from {r.node_ids.tolist()}); pass node_ids present in every round')
    picks = [index[int(n)] for n in order]
    deltas = jax.tree_util.tree_map(
        lambda w, *ups: jnp.stack([np.subtract(w, u) for u in ups]),
        r.global_params, *[r.uploads[i] for i in picks])
    global_params = jax.tree_util.tree_map(jnp.asarray, r.global_params)
    m = queries.measure(apply_fn, global_params, deltas, query_x, query_y,
                        chunk_size=chunk_size)
    for name in ('loss', 'cos', 'diff', 'grad_sq', 'margin'):
      out[name].append(np.asarray(getattr(m, name), np.float32))
    out['num_examples'].append(r.num_examples[picks])
  result = {name: np.stack(values) for name, values in out.items()}
  result['num_examples'] = result['num_examples'].astype(np.float64)
  result['rounds'] = np.asarray([r.server_round - 1 for r in rounds], np.int32)
  result['node_ids'] = order.astype(np.uint64)
  return result
