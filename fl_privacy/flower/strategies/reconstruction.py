"""`ReconstructionStrategy`: a server that sends an imprint-injected model and recovers the
nodes' inputs from their replies (`attacks.reconstruction.imprint`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.flower import bridge
from fl_privacy.flower.strategies import base


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


class ReconstructionStrategy(base._Wrapper):
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
        n = base._weight(msg.content, base._weight_key(self.inner))
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
