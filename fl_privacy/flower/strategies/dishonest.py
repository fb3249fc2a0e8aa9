"""`DishonestStrategy`: a server that crafts the global model to detect a target record in
a node's data (`attacks.dishonest`), one crafted round per target.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fl_privacy.attacks import dishonest
from fl_privacy.fl import losses
from fl_privacy.flower import bridge
from fl_privacy.flower.strategies import base


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


class DishonestStrategy(base._Wrapper):
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
