"""A ServerApp strategy and N ClientApps in one process: no network, no Ray, no SuperLink.

`InProcessGrid` implements Flower 1.42's `flwr.serverapp.Grid` (abstract methods `set_run`,
`run`, `create_message`, `get_node_ids`, `push_messages`, `pull_messages`,
`send_and_receive`). `push_messages` delivers each instruction `Message` at once to the
`ClientApp` of its `dst_node_id`, calling `app(message, context)` as a SuperNode does, and
keeps the reply until `pull_messages` collects it by the instruction's message id.
Delivery copies the message content (`copy.deepcopy`), as serialization would: Flower's
strategies put one `RecordDict` object into every node's message, and a client must not see
another client's (or the server's) objects.

Each node keeps one `Context` for the whole run (`node_config` `partition-id` = its index,
`num-partitions` = N; `state` persists across rounds, like a SuperNode's). A `ClientApp`
that raises gets an error reply (`Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, ...)`), as a
deployment would report it, unless the grid was built with `raise_client_errors=True`.

Flower stamps instruction messages with the process-wide `flwr.supercore.task_identity.
TaskIdentity` (run id, node id, task id) that its runtime sets; `task_identity` sets it for
a block (the server's identity `SUPERLINK_NODE_ID` around the strategy, each node's id around
its `ClientApp`) and restores the previous values after. `run` drives `strategy.start` on
such a grid. Nothing here is thread-safe (neither is `TaskIdentity`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import traceback
from typing import Callable, Iterable, Iterator, Mapping, Sequence

os.environ.setdefault('FLWR_TELEMETRY_ENABLED', '0')

# pylint: disable=wrong-import-position
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord
from flwr.app import RecordDict
from flwr.app.metadata import Metadata, validate_message_type
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity


# Node ids of `InProcessGrid` when none are given: FIRST_NODE_ID, FIRST_NODE_ID + 1, ...
# (distinct from the partition indices 0..N-1 and from SUPERLINK_NODE_ID).
FIRST_NODE_ID = 1001
DEFAULT_RUN_ID = 1


@contextlib.contextmanager
def task_identity(run_id: int, node_id: int, task_id: int = 1) -> Iterator[None]:
  """Sets Flower's process-wide `TaskIdentity` inside the block, restoring it after.

  `flwr.app.Message(content, dst_node_id, message_type)` (what every strategy's
  `configure_*` calls) reads `TaskIdentity.run_id` and `.node_id`; Flower's runtime sets them
  in each app process, an in-process run has to.
  """
  # pylint: disable=protected-access
  saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
  TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, node_id, task_id
  try:
    yield
  finally:
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


class InProcessGrid(Grid):
  """A Flower `Grid` whose nodes are `ClientApp` objects of this process.

  Args:
    apps: One `ClientApp` per node (the same object may serve every node), or a mapping
      node id -> `ClientApp`.
    node_ids: The nodes' ids when `apps` is a sequence (default FIRST_NODE_ID, +1, ...).
    run_id: The run id messages carry.
    run_config: Every node's `context.run_config`.
    node_configs: Per node extra `node_config` entries (merged over `partition-id` and
      `num-partitions`), in node order.
    raise_client_errors: Re-raise a `ClientApp`'s exception instead of replying with an
      error message (handy in tests).
    keep_delivered: Keep every instruction as its node received it in `self.delivered`
      (tests; it holds one model copy per message).
  """

  def __init__(self, apps: Sequence[ClientApp] | Mapping[int, ClientApp], *,
               node_ids: Sequence[int] | None = None, run_id: int = DEFAULT_RUN_ID,
               run_config: Mapping | None = None,
               node_configs: Sequence[Mapping] | None = None,
               raise_client_errors: bool = False, keep_delivered: bool = False) -> None:
    if isinstance(apps, Mapping):
      if node_ids is not None:
        raise ValueError('node_ids are the keys of `apps` when it is a mapping')
      node_ids, apps = list(apps.keys()), list(apps.values())
    apps = list(apps)
    if not apps:
      raise ValueError('InProcessGrid needs at least one ClientApp')
    if node_ids is None:
      node_ids = [FIRST_NODE_ID + i for i in range(len(apps))]
    node_ids = [int(n) for n in node_ids]
    if len(node_ids) != len(apps):
      raise ValueError(f'{len(node_ids)} node ids for {len(apps)} ClientApps')
    if len(set(node_ids)) != len(node_ids) or SUPERLINK_NODE_ID in node_ids:
      raise ValueError(f'node ids must be distinct and not {SUPERLINK_NODE_ID} (the '
                       f'SuperLink\'s): got {node_ids}')
    for app in apps:
      if not callable(app):
        raise TypeError(f'expected flwr.clientapp.ClientApp objects, got {type(app).__name__}')
    if node_configs is not None and len(node_configs) != len(apps):
      raise ValueError(f'{len(node_configs)} node_configs for {len(apps)} nodes')
    self._apps = dict(zip(node_ids, apps))
    self._contexts = {}
    for i, node in enumerate(node_ids):
      node_config = {'partition-id': i, 'num-partitions': len(node_ids)}
      node_config.update(dict(node_configs[i]) if node_configs is not None else {})
      self._contexts[node] = Context(run_id=run_id, node_id=node, node_config=node_config,
                                     state=RecordDict(), run_config=dict(run_config or {}))
    self._run = Run.create_empty(run_id)
    self._replies: dict[str, Message] = {}
    self._next_id = 0
    self.raise_client_errors = raise_client_errors
    self.keep_delivered = keep_delivered
    self.delivered: list[Message] = []

  # --- Grid's abstract interface ------------------------------------------------------------

  def set_run(self, run: Run) -> None:
    """Sets the run (its `run_id` must be the one the nodes' contexts carry)."""
    if not isinstance(run, Run):
      raise TypeError(f'run must be a flwr.supercore.run.Run, got {type(run).__name__}')
    if run.run_id != self._run.run_id:
      raise ValueError(f'run {run.run_id}: the nodes\' contexts belong to run '
                       f'{self._run.run_id} (build the grid with run_id={run.run_id})')
    self._run = run

  @property
  def run(self) -> Run:
    """The run this grid operates in."""
    return self._run

  def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                     group_id: str, ttl: float | None = None) -> Message:
    """A new instruction message (deprecated in Flower: use the `Message` constructor)."""
    return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

  def get_node_ids(self) -> list[int]:
    """The node ids, in construction order."""
    return list(self._apps)

  def push_messages(self, messages: Iterable[Message]) -> list[str]:
    """Delivers each message to its node's `ClientApp` now; returns the message ids.

    Raises:
      ValueError: a message is a reply, targets an unknown node, or has an invalid type.
    """
    ids = []
    for msg in messages:
      meta = msg.metadata
      if meta.reply_to_message_id:
        raise ValueError('push_messages takes instruction messages, got a reply (to '
                         f'{meta.reply_to_message_id})')
      if meta.dst_node_id not in self._apps:
        raise ValueError(f'message to node {meta.dst_node_id}, which is not in the grid '
                         f'(nodes {self.get_node_ids()})')
      if not validate_message_type(meta.message_type):
        raise ValueError(f'invalid message type {meta.message_type!r}')
      message_id = self._new_id()
      delivered = Message(
          content=copy.deepcopy(msg.content),
          metadata=Metadata(run_id=meta.run_id, message_id=message_id,
                            src_node_id=meta.src_node_id, dst_node_id=meta.dst_node_id,
                            reply_to_message_id='', group_id=meta.group_id,
                            created_at=meta.created_at, ttl=meta.ttl,
                            message_type=meta.message_type, src_task_id=meta.src_task_id,
                            dst_task_id=meta.dst_task_id))
      if self.keep_delivered:
        self.delivered.append(delivered)
      self._replies[message_id] = self._call(delivered)
      ids.append(message_id)
    return ids

  def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
    """The replies to `message_ids` not pulled yet (each reply is returned once)."""
    return [self._replies.pop(i) for i in message_ids if i in self._replies]

  def send_and_receive(self, messages: Iterable[Message], *,
                       timeout: float | None = None) -> list[Message]:
    """`push_messages` then `pull_messages`: every reply, in message order.

    `timeout` is accepted and ignored: delivery is synchronous, so every reply is there.
    """
    del timeout
    return self.pull_messages(self.push_messages(messages))

  # --- delivery -------------------------------------------------------------------------------

  def _new_id(self) -> str:
    self._next_id += 1
    return f'{self._run.run_id}-{self._next_id:08d}'

  def _call(self, msg: Message) -> Message:
    node = msg.metadata.dst_node_id
    context = self._contexts[node]
    try:
      with task_identity(self._run.run_id, node):
        reply = self._apps[node](msg, context)
      if not isinstance(reply, Message):
        raise TypeError(f'the ClientApp returned {type(reply).__name__}, not a Message')
      if reply.metadata.reply_to_message_id != msg.metadata.message_id:
        raise ValueError('the ClientApp\'s reply is not a reply to the message it got (build '
                         'it with Message(content, reply_to=message))')
      return reply
    except Exception as e:  # pylint: disable=broad-except
      if self.raise_client_errors:
        raise
      reason = f'{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}'
      return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason),
                     reply_to=msg)


def run(strategy: Strategy, grid: InProcessGrid, initial_arrays: ArrayRecord, *,
        num_rounds: int, train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        task_id: int = 1) -> Result:
  """`strategy.start(grid, initial_arrays, num_rounds, ...)` with the server's TaskIdentity.

  What a ServerApp's main function does with the `Grid` it is handed; here the grid is
  `InProcessGrid`, so all rounds run in this process.

  Returns:
    Flower's `Result` (final arrays, per-round train / evaluate metrics).
  """
  if not isinstance(strategy, Strategy):
    raise TypeError('run needs a Flower Message-API strategy (flwr.serverapp.strategy.'
                    f'Strategy, e.g. FedAvg), got {type(strategy).__name__}')
  if int(num_rounds) < 1:
    raise ValueError(f'num_rounds must be >= 1 (got {num_rounds})')
  with task_identity(grid.run.run_id, SUPERLINK_NODE_ID, task_id):
    return strategy.start(grid, initial_arrays, num_rounds=int(num_rounds),
                          train_config=train_config, evaluate_config=evaluate_config,
                          evaluate_fn=evaluate_fn)
