"""Server-side strategies that audit a Flower deployment (Flower >= 1.42, Message API).

Both wrap an inner `flwr.serverapp.strategy.Strategy` (FedAvg, FedProx, a DP wrapper, ...) and
delegate `configure_train`, `aggregate_train`, `configure_evaluate`, `aggregate_evaluate` and
`summary` to it; the round loop is Flower's own `Strategy.start`, which calls those methods on
the wrapper. An inner strategy that overrides `start` is refused (its loop would be bypassed).

`RecordingStrategy` changes nothing: the inner strategy sees the same messages and replies
(the same objects) and returns the same aggregate. It records, per server round r (1-based),
the model the round started from (w_t, t = r - 1: the `arrays` handed to `configure_train`),
the model each node received when it differs from w_t, and every node's uploaded arrays with
its node id and weight (`RoundUploads`). Rounds go to an observer callable (`UploadLog` keeps
them in memory) and/or to `<directory>/round_<r:05d>.npz` (written atomically; `load_rounds`
reads them back). `recording_from_uploads` turns recorded rounds into the `fl.recording`
format (`loss`, `cos`, `diff` [R, K, Q], `grad_sq` [R, Q], `rounds` [R]) with
`fl.queries.measure` on the updates Delta = w_t - w_local.

`DishonestStrategy` is the dishonest server of Pichler et al. (`attacks.dishonest`): in an
attacked round it writes the 2M+1-ReLU detector of a target example into the round's model
(`dishonest.craft`, on the trunk the global model has) and sends that model, in a message of
its own, to each target node the inner strategy sampled; the other nodes get the inner
strategy's honest messages. From a target's upload it computes Eq. (9)'s statistic
(`dishonest.delta_statistic` against `dishonest.server_step`, the simulated step on the
target alone) and decides membership (`dishonest.decide`). The targets' replies are left out
of the aggregate unless `aggregate_targets` (they were trained from a crafted model).

`ReconstructionStrategy` is the dishonest server of Fowl et al. (ICLR 2022,
`attacks.reconstruction.imprint`): the deployment's clients train a model with an imprint
block in front (`imprint.inject`); in an attacked round the server writes the imprint layer
(`imprint.craft`, thresholds on a public statistic) into the round's model and sends it to each
sampled target node, then reads each target's inputs back from its reply: Delta = sent -
upload, `imprint.recover_update` with the reply's `num-examples` (`Recovery`).
"""

from __future__ import annotations

import dataclasses
import io
import os
import pathlib
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fl_privacy.attacks import dishonest
from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.fl import losses
from fl_privacy.fl import queries
from fl_privacy.flower import bridge
from fl_privacy.report import atomic

DEFAULT_WEIGHT_KEY = 'num-examples'
ROUND_FILE = 'round_{:05d}.npz'
_ROUND_FILE_RE = re.compile(r'round_(\d{5,})\.npz$')


def check_inner(inner: Any, wrapper: str) -> Strategy:
  """`inner` if it is a Message-API strategy whose round loop is Flower's; else TypeError."""
  if not isinstance(inner, Strategy):
    legacy = ' (a legacy flwr.server.strategy strategy: use flwr.serverapp.strategy)' if (
        type(inner).__module__.startswith('flwr.server.')) else ''
    raise TypeError(
        f'{wrapper} wraps a Flower Message-API strategy, an instance of '
        f'flwr.serverapp.strategy.Strategy (e.g. flwr.serverapp.strategy.FedAvg); got '
        f'{type(inner).__module__}.{type(inner).__qualname__}{legacy}')
  if type(inner).start is not Strategy.start:
    raise TypeError(
        f'{wrapper} drives the rounds with flwr.serverapp.strategy.Strategy.start; '
        f'{type(inner).__qualname__} overrides start, whose loop the wrapper would bypass')
  return inner


class _Wrapper(Strategy):
  """Delegates every `Strategy` method to `self.inner`."""

  def __init__(self, inner: Strategy):
    self.inner = check_inner(inner, type(self).__name__)

  def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                      grid: Grid) -> Iterable[Message]:
    return self.inner.configure_train(server_round, arrays, config, grid)

  def aggregate_train(self, server_round: int, replies: Iterable[Message]
                      ) -> tuple[ArrayRecord | None, MetricRecord | None]:
    return self.inner.aggregate_train(server_round, replies)

  def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                         grid: Grid) -> Iterable[Message]:
    return self.inner.configure_evaluate(server_round, arrays, config, grid)

  def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                         ) -> MetricRecord | None:
    return self.inner.aggregate_evaluate(server_round, replies)

  def summary(self) -> None:
    logging.info('%s around %s', type(self).__name__, type(self.inner).__name__)
    self.inner.summary()


def _weight_key(inner: Strategy) -> str:
  return str(getattr(inner, 'weighted_by_key', DEFAULT_WEIGHT_KEY))


def _weight(content: RecordDict, key: str) -> float:
  for record in content.metric_records.values():
    if key in record and not isinstance(record[key], list):
      return float(record[key])
  return float('nan')


def _same_arrays(a: ArrayRecord, b: ArrayRecord) -> bool:
  if a is b:
    return True
  return list(a.keys()) == list(b.keys()) and all(
      a[k].dtype == b[k].dtype and tuple(a[k].shape) == tuple(b[k].shape) and
      a[k].data == b[k].data for k in a.keys())


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


class RecordingStrategy(_Wrapper):
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
      if not _same_arrays(record, arrays):
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
    key = _weight_key(self.inner)
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
      weights.append(_weight(msg.content, key))
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


# --- the dishonest server ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Decision:
  """The dishonest server's verdict on one target node in one round.

  Attributes:
    server_round: Flower's round number.
    node_id: The target node.
    delta: Eq. (9)'s statistic (NaN when the node replied with an error or an upload that
      does not fit the model; then `member` is False).
    member: Delta >= threshold: the server believes the target example is in the node's data.
    eps_client: Detector bias in the node's upload.
    eps_server: Detector bias after the server's simulated step on the target alone.
    epsilon: Detector bias sent.
  """
  server_round: int
  node_id: int
  delta: float
  member: bool
  eps_client: float
  eps_server: float
  epsilon: float


@dataclasses.dataclass(frozen=True)
class _Attack:
  epsilon: float
  eps_server: float
  nodes: frozenset
  components: np.ndarray


class DishonestStrategy(_Wrapper):
  """The dishonest server of `attacks.dishonest` on top of a Message-API strategy.

  Args:
    inner: The honest strategy (e.g. FedAvg) choosing nodes and aggregating.
    model: The Flax module the clients train (with `embed` and `head`, dense layers
      `layers`; e.g. `models.MLP(hidden=(2M, 1), ...)` or `models.FlowerCNN`).
    target: (x_t [input shape], y_t): the example whose membership is tested (float input as
      the model takes it, integer label).
    nodes: Node ids to attack (those the inner strategy samples in an attacked round).
    num_components: M.
    optimizer: The clients' optax transformation (the server knows it: Assumption 3).
    batch_size: The clients' B (Eq. (9)'s scale).
    epsilon: The detector's bias.
    threshold: xi: member iff Delta >= xi.
    layers: The three dense layers the detector occupies.
    rounds: Server rounds to attack (None: every round).
    aggregate_targets: Keep the targets' replies in the aggregate (default: dropped, they
      were trained from the crafted model).
    template: The model's pytree; None: `jax.eval_shape(model.init, ...)` on the target.
    observer: Called with each `Decision`.

  Attributes:
    decisions: Every `Decision`, in order.
  """

  def __init__(self, inner: Strategy, model, target: tuple[Any, Any], *,
               nodes: Sequence[int], num_components: int, optimizer, batch_size: int,
               epsilon: float = 1e-3, threshold: float = 0.1,
               layers: tuple[str, str, str] = dishonest.FC_LAYERS,
               rounds: Sequence[int] | None = None, aggregate_targets: bool = False,
               template: Any = None, observer: Callable[[Decision], None] | None = None):
    super().__init__(inner)
    x_t, y_t = target
    self.x_t, self.y_t = jnp.asarray(x_t), jnp.asarray(y_t, jnp.int32)
    if self.y_t.ndim != 0:
      raise ValueError(f'target label must be a scalar, got shape {self.y_t.shape}')
    self.nodes = frozenset(int(n) for n in nodes)
    if not self.nodes:
      raise ValueError('DishonestStrategy needs at least one target node')
    for name, value in (('num_components', num_components), ('batch_size', batch_size)):
      if not (isinstance(value, (int, np.integer)) and value >= 1):
        raise ValueError(f'{name} must be a positive integer (got {value!r})')
    if not (epsilon > 0 and threshold > 0):
      raise ValueError(f'epsilon and threshold must be > 0 (got {epsilon}, {threshold})')
    self.model = model
    self.num_components = int(num_components)
    self.optimizer = optimizer
    self.batch_size = int(batch_size)
    self.epsilon = float(epsilon)
    self.threshold = float(threshold)
    self.layers = tuple(layers)
    self.rounds = None if rounds is None else frozenset(int(r) for r in rounds)
    self.aggregate_targets = aggregate_targets
    self.template = (jax.eval_shape(model.init, jax.random.key(0), self.x_t[None])
                     if template is None else template)
    self._check_detector_fits()
    self.observer = observer
    self.decisions: list[Decision] = []
    self._attacks: dict[int, _Attack] = {}
    self._loss_fn = losses.make_loss_fn(model.apply)

  def _check_detector_fits(self) -> None:
    """ValueError unless `layers` are dense layers of the template with room for 2M units."""
    params = self.template.get('params', {}) if hasattr(self.template, 'get') else {}
    missing = [n for n in self.layers if 'kernel' not in params.get(n, {})]
    if missing:
      raise ValueError(f'the model has no dense layer(s) {missing} under params (the detector '
                       f'needs three: layers={self.layers})')
    features, width = params[self.layers[0]]['kernel'].shape
    if self.num_components > features or 2 * self.num_components > width:
      raise ValueError(f'num_components M={self.num_components} needs M <= {features} '
                       f'features and 2M <= {width} units of {self.layers[0]}')

  def attacks(self, server_round: int) -> bool:
    """Whether round `server_round` is attacked."""
    return self.rounds is None or int(server_round) in self.rounds

  def craft(self, variables: Any) -> tuple[Any, float, float, np.ndarray]:
    """(crafted variables, eps sent, eps after the server's simulated step, components).

    `dishonest.craft` on the trunk of `variables`, `dishonest.server_step` with the
    clients' optimizer on the target alone, at full matmul precision (as `dishonest.play`).
    """
    with jax.default_matmul_precision('highest'):
      h_t = self.model.apply(variables, self.x_t[None], method='embed')[0]
      crafted, components = dishonest.craft(variables, h_t, self.y_t, self.num_components,
                                            self.epsilon, layers=self.layers)
      simulated = dishonest.server_step(self._loss_fn, crafted, self.x_t, self.y_t,
                                        self.optimizer)
      epsilon = float(dishonest.detector_bias(crafted, layers=self.layers))
      eps_server = float(dishonest.detector_bias(simulated, layers=self.layers))
    return crafted, epsilon, eps_server, np.asarray(components)

  def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                      grid: Grid) -> list[Message]:
    """The inner strategy's messages; in an attacked round, each sampled target node's
    replaced by one carrying the crafted model (same config, type, group and ttl)."""
    messages = list(self.inner.configure_train(server_round, arrays, config, grid))
    targets = [m for m in messages if int(m.metadata.dst_node_id) in self.nodes]
    if not self.attacks(server_round) or not targets:
      return messages
    variables = jax.tree_util.tree_map(jnp.asarray,
                                       bridge.from_array_record(arrays, self.template))
    crafted, epsilon, eps_server, components = self.craft(variables)
    record = bridge.to_array_record(jax.tree_util.tree_map(np.asarray, crafted))
    out = []
    for msg in messages:
      if int(msg.metadata.dst_node_id) not in self.nodes or not msg.has_content():
        out.append(msg)
        continue
      name, _ = bridge.only_array_record(msg.content)
      content = RecordDict({k: (record if k == name else v) for k, v in msg.content.items()})
      meta = msg.metadata
      out.append(Message(content, meta.dst_node_id, meta.message_type, ttl=meta.ttl,
                         group_id=meta.group_id))
    self._attacks[int(server_round)] = _Attack(
        epsilon=epsilon, eps_server=eps_server, components=components,
        nodes=frozenset(int(m.metadata.dst_node_id) for m in targets))
    return out

  def aggregate_train(self, server_round: int, replies: Iterable[Message]
                      ) -> tuple[ArrayRecord | None, MetricRecord | None]:
    """Decides on each attacked node's upload, then aggregates (without them by default)."""
    replies = list(replies)
    attack = self._attacks.pop(int(server_round), None)
    if attack is None:
      return self.inner.aggregate_train(server_round, replies)
    for msg in replies:
      node = int(msg.metadata.src_node_id)
      if node in attack.nodes:
        self._decide(int(server_round), node, msg, attack)
    kept = replies if self.aggregate_targets else [
        m for m in replies if int(m.metadata.src_node_id) not in attack.nodes]
    return self.inner.aggregate_train(server_round, kept)

  def _decide(self, server_round: int, node: int, msg: Message, attack: _Attack) -> None:
    nan = float('nan')
    upload = None
    if not msg.has_error():
      try:
        _, record = bridge.only_array_record(msg.content)
        upload = bridge.from_array_record(record, self.template)
      except ValueError as e:  # RecordMismatchError too
        logging.warning('round %d: no decision on node %d: %s', server_round, node, e)
    if upload is None:
      decision = Decision(server_round, node, nan, False, nan, attack.eps_server,
                          attack.epsilon)
    else:
      eps_client = float(dishonest.detector_bias(upload, layers=self.layers))
      delta = dishonest.delta_statistic(jnp.float32(eps_client), jnp.float32(attack.eps_server),
                                        jnp.float32(attack.epsilon), self.batch_size)
      decision = Decision(server_round, node, float(delta),
                          bool(dishonest.decide(delta, self.threshold)), eps_client,
                          attack.eps_server, attack.epsilon)
    self.decisions.append(decision)
    if self.observer is not None:
      self.observer(decision)


# --- the imprint server (reconstruction) -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Recovery:
  """What the imprint server read from one target node's reply in one round.

  Attributes:
    server_round: Flower's round number.
    node_id: The target node.
    num_examples: The reply's `num-examples` (-1 when the reply carried an error or an upload
      that does not fit the model; then nothing is recovered).
    inputs: float32 [K, d] the recovered flat inputs (K = num_examples, at most the number
      of bins), clipped to `value_range`; rows not `valid` are zero.
    valid: bool [K] rows read from a bin that held data.
    bins: int32 [K] the bin each row was read from (-1: none).
  """
  server_round: int
  node_id: int
  num_examples: int
  inputs: np.ndarray
  valid: np.ndarray
  bins: np.ndarray


def _crafting_key(key: jax.Array, server_round: int, node_id: int) -> jax.Array:
  return jax.random.fold_in(jax.random.fold_in(key, int(server_round)), int(node_id))


class ReconstructionStrategy(_Wrapper):
  """The imprint attack of Fowl et al. (`attacks.reconstruction.imprint`) on a Message-API
  strategy.

  Args:
    inner: The honest strategy (e.g. FedAvg) choosing nodes and aggregating.
    template: The deployment's variables (`imprint.inject(model, n).init(...)`, or its
      `jax.eval_shape`): `collection` must hold a Dense `layer_name` of n units on the flat
      input and a Dense `restore_name` after it.
    cuts: The n bin thresholds (`imprint.thresholds` on data the server knows).
    key: Crafting key; node k in round r gets a model crafted with `fold_in(fold_in(key, r),
      k)` (each target its own shared outgoing direction).
    nodes: Node ids to attack (those the inner strategy samples in an attacked round).
    rounds: Server rounds to attack (None: every round).
    scale, restore_scale: `imprint.craft`'s.
    value_range: The inputs' range; recovered inputs are clipped into it (the server knows
      it, so clipping costs it nothing).
    aggregate_targets: Keep the targets' replies in the aggregate (default: dropped, they
      were trained from a crafted model).
    collection: The variables' collection holding the imprint block.
    observer: Called with each `Recovery`.
    key_ids: node id -> the integer its crafting key folds in instead of the node id (e.g.
      its partition: Flower's engines give nodes random ids, so crafting by partition
      keeps a run comparable across engines).

  Attributes:
    recoveries: Every `Recovery`, in order.
    sent: (server round, node id) -> the crafted variables that node received (numpy).
  """

  def __init__(self, inner: Strategy, template: Any, cuts, *, key: jax.Array,
               nodes: Sequence[int], rounds: Sequence[int] | None = None,
               scale: float = imprint.SCALE, restore_scale: float = imprint.RESTORE_SCALE,
               value_range: tuple[float, float] = (0.0, 1.0), aggregate_targets: bool = False,
               layer_name: str = imprint.IMPRINT, restore_name: str = imprint.RESTORE,
               collection: str = 'params',
               observer: Callable[[Recovery], None] | None = None,
               key_ids: Mapping[int, int] | None = None):
    super().__init__(inner)
    self.key_ids = {int(k): int(v) for k, v in (key_ids or {}).items()}
    self.nodes = frozenset(int(n) for n in nodes)
    if not self.nodes:
      raise ValueError('ReconstructionStrategy needs at least one target node')
    if not (scale > 0 and restore_scale > 0):
      raise ValueError(f'scale and restore_scale must be > 0 (got {scale}, {restore_scale})')
    lo, hi = (float(v) for v in value_range)
    if not lo < hi:
      raise ValueError(f'value_range must be (low, high) with low < high (got {value_range})')
    self.template = template
    self.collection = collection
    self.layer_name, self.restore_name = layer_name, restore_name
    self.cuts = np.asarray(cuts, np.float32)
    self._check_imprint_fits()
    self.key = key
    self.rounds = None if rounds is None else frozenset(int(r) for r in rounds)
    self.scale, self.restore_scale = float(scale), float(restore_scale)
    self.value_range = (lo, hi)
    self.aggregate_targets = aggregate_targets
    self.observer = observer
    self.recoveries: list[Recovery] = []
    self.sent: dict[tuple[int, int], Any] = {}

  def _check_imprint_fits(self) -> None:
    """ValueError unless the template holds the imprint block and the cuts fit its width."""
    params = self.template.get(self.collection, {}) if hasattr(self.template, 'get') else {}
    missing = [n for n in (self.layer_name, self.restore_name)
               if 'kernel' not in params.get(n, {})]
    if missing or 'bias' not in params.get(self.layer_name, {}):
      raise ValueError(
          f'the model has no imprint block under {self.collection}/{self.layer_name} (Dense '
          f'with a bias) and {self.collection}/{self.restore_name}: build the clients\' model '
          'with attacks.reconstruction.imprint.inject(model, num_bins)')
    width = params[self.layer_name]['kernel'].shape[1]
    if self.cuts.shape != (width,):
      raise ValueError(f'{width} thresholds needed for the imprint layer of {width} units '
                       f'(got cuts of shape {self.cuts.shape})')

  def attacks(self, server_round: int) -> bool:
    """Whether round `server_round` is attacked."""
    return self.rounds is None or int(server_round) in self.rounds

  def craft(self, variables: Any, server_round: int, node_id: int) -> Any:
    """The variables node `node_id` receives in round `server_round` (numpy): the imprint
    layer written into `variables` (the round's model), the rest unchanged."""
    variables = jax.tree_util.tree_map(jnp.asarray, variables)
    crafted = imprint.craft(variables[self.collection], self.cuts,
                            _crafting_key(self.key, server_round,
                                          self.key_ids.get(int(node_id), int(node_id))),
                            scale=self.scale,
                            restore_scale=self.restore_scale, layer_name=self.layer_name,
                            restore_name=self.restore_name)
    out = dict(variables)
    out[self.collection] = crafted
    return jax.tree_util.tree_map(np.asarray, out)

  def recover(self, sent: Any, upload: Any, num_examples: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(inputs [K, d], valid [K], bins [K]) from a reply: Eq. (2) of Fowl et al. on
    Delta = sent - upload (`imprint.recover_update`), clipped to `value_range`."""
    delta = jax.tree_util.tree_map(np.subtract, sent[self.collection],
                                   upload[self.collection])
    x, valid, bins = imprint.recover_update(delta, int(num_examples),
                                            layer_name=self.layer_name)
    x = np.clip(np.asarray(x, np.float32), *self.value_range)
    valid = np.asarray(valid, bool)
    return np.where(valid[:, None], x, 0.0).astype(np.float32), valid, np.asarray(bins)

  def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                      grid: Grid) -> list[Message]:
    """The inner strategy's messages; in an attacked round each sampled target node's
    replaced by one carrying its crafted model (same config, type, group and ttl)."""
    messages = list(self.inner.configure_train(server_round, arrays, config, grid))
    if not self.attacks(server_round):
      return messages
    variables = None
    out = []
    for msg in messages:
      node = int(msg.metadata.dst_node_id)
      if node not in self.nodes or not msg.has_content():
        out.append(msg)
        continue
      if variables is None:
        variables = bridge.from_array_record(arrays, self.template)
      crafted = self.craft(variables, server_round, node)
      self.sent[(int(server_round), node)] = crafted
      name, _ = bridge.only_array_record(msg.content)
      record = bridge.to_array_record(crafted)
      content = RecordDict({k: (record if k == name else v) for k, v in msg.content.items()})
      meta = msg.metadata
      out.append(Message(content, meta.dst_node_id, meta.message_type, ttl=meta.ttl,
                         group_id=meta.group_id))
    return out

  def aggregate_train(self, server_round: int, replies: Iterable[Message]
                      ) -> tuple[ArrayRecord | None, MetricRecord | None]:
    """Recovers each attacked node's inputs, then aggregates (without them by default)."""
    replies = list(replies)
    attacked = {n for r, n in self.sent if r == int(server_round)}
    for msg in replies:
      node = int(msg.metadata.src_node_id)
      if node in attacked:
        self._recover(int(server_round), node, msg)
    kept = replies if self.aggregate_targets else [
        m for m in replies if int(m.metadata.src_node_id) not in attacked]
    return self.inner.aggregate_train(server_round, kept)

  def _recover(self, server_round: int, node: int, msg: Message) -> None:
    sent = self.sent[(server_round, node)]
    upload, n = None, -1
    if not msg.has_error():
      try:
        _, record = bridge.only_array_record(msg.content)
        upload = bridge.from_array_record(record, self.template)
        n = _weight(msg.content, _weight_key(self.inner))
        # Without a reported count the server reads every bin that held data.
        n = int(n) if np.isfinite(n) and n >= 1 else len(self.cuts)
      except ValueError as e:  # RecordMismatchError too
        logging.warning('round %d: nothing recovered from node %d: %s', server_round, node, e)
        upload, n = None, -1
    if upload is None:
      dim = int(np.prod(sent[self.collection][self.layer_name]['kernel'].shape[:1]))
      rec = Recovery(server_round, node, -1, np.zeros((0, dim), np.float32),
                     np.zeros(0, bool), np.zeros(0, np.int32))
    else:
      x, valid, bins = self.recover(sent, upload, n)
      rec = Recovery(server_round, node, n, x, valid, bins)
    self.recoveries.append(rec)
    if self.observer is not None:
      self.observer(rec)
