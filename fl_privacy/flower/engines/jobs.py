"""What a Flower run executes, as data: a `Job`, its ClientApp and its server side.

A `Job` names a `flower_audit` part (`PARTS`: the module holding the part's
`job_client(args) -> ClientApp` and `job_server(args, grid) -> result`), its node count, its
arguments (configs, numpy arrays, raw key data, this repository's dataclasses) and the seed of
the server process's global generators (FedAvg samples nodes with Python's `random`; Flower's
DP wrappers draw their noise from numpy's). A job travels inside the run, as data: `dumps`
writes it as `codec` text (JSON, compressed, base64; no pickle) for the run config's `job`
entry, which Flower hands the ServerApp and every node's ClientApp; `loads` rebuilds it. So the
same job runs on every engine (`dispatch.run_job`), and a node needs no file of the
submitter's:

- `client_app_for(job)`: a thin `ClientApp` whose train and evaluate build the part's
  ClientApp from the job on the node's first message (cached per process and job) and hand it
  the message; its `query` replies the node's `partition-id`. `client_app_for()` reads the
  job from the run config (`from_run_config`): the Flower App's ClientApp
  (`fl_privacy.flower.engines.app`).
- `serve(job, grid)`: the server side on any Flower `Grid`: asks every node its partition
  (`partition_map`), seeds the server's generators, runs the part on an `OrderedGrid` and
  returns {'result', 'partitions', 'node_ids' (by partition), 'losses'}. The Flower App's
  ServerApp runs it on the job of the run config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import logging
import random
import time
from typing import Any, Iterable, Mapping

import numpy as np

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.run import Run

from fl_privacy.flower.engines import codec


# Part name -> module defining job_client(args) and job_server(args, grid).
PARTS = {'fedmia': 'fl_privacy.flower.parts.fedmia',
         'dishonest': 'fl_privacy.flower.parts.dishonest',
         'reconstruction': 'fl_privacy.flower.parts.reconstruction',
         'training': 'fl_privacy.flower.audits.canary_deploy'}
PARTITION_KEY = 'partition-id'
QUERY_KEY = 'fl-privacy'


class EngineError(RuntimeError):
  """A Flower engine did not run the job to the end (one line says why)."""


@dataclasses.dataclass(frozen=True)
class Job:
  """One Flower run, rebuildable in any process.

  Attributes:
    part: A key of `PARTS`, or the dotted name of a module of `codec.TRUSTED_PACKAGES`
      (this repository's packages) defining `job_client(args)` and `job_server(args, grid)`
      (the tests' and benchmarks' own parts; every process of the run must be able to import
      it).
    num_nodes: N, the nodes' partitions are 0..N-1.
    args: The part's arguments (what `codec` encodes).
    seed: Seeds Python's `random` and numpy's global generator in the server's process
      during `serve` (restored after).
    round_timeout: Seconds a round waits for replies (None: Flower's default, 3600).
    wait_timeout: Seconds the server waits for N nodes to connect.
  """
  part: str
  num_nodes: int
  args: Any
  seed: int
  round_timeout: float | None = None
  wait_timeout: float = 300.0

  def __post_init__(self):
    if self.part not in PARTS and not ('.' in self.part and
                                       codec.trusted_module(self.part)):
      raise ValueError(f'part must be one of {tuple(PARTS)} or the dotted name of a module of '
                       f'{codec.TRUSTED_PACKAGES} (got {self.part!r})')
    if int(self.num_nodes) < 1:
      raise ValueError(f'num_nodes must be >= 1 (got {self.num_nodes})')


def dumps(job: Job) -> str:
  """`job` as text for the run config's `job` entry (`codec.dumps`: JSON, compressed,
  base64; no pickle)."""
  if not isinstance(job, Job):
    raise TypeError(f'expected a Job, got {type(job).__name__}')
  return codec.dumps(job)


def job_hash(job: Job) -> str:
  return hashlib.sha256(dumps(job).encode('ascii')).hexdigest()


_LOADED: dict[str, Job] = {}
_BUILT: dict[str, ClientApp] = {}


def loads(text: str) -> Job:
  """The job `dumps` wrote (cached per process by the text's hash). ValueError when the
  text is not a job."""
  h = hashlib.sha256(str(text).encode('utf-8')).hexdigest()
  if h not in _LOADED:
    job = codec.loads(text)
    if not isinstance(job, Job):
      raise ValueError(f"the run config's job holds a {type(job).__name__}, not a Job")
    _LOADED[h] = job
  return _LOADED[h]


def _module(job: Job):
  return importlib.import_module(PARTS.get(job.part, job.part))


def build_client_app(job: Job) -> ClientApp:
  """The part's own ClientApp for `job`."""
  fn = getattr(_module(job), 'dishonest_client' if job.part == 'dishonest' else 'job_client')
  return fn(job.args)


def client_app(job: Job) -> ClientApp:
  """`build_client_app(job)`, built once per process and job (a SuperNode's or Ray actor's
  later messages reuse it)."""
  h = job_hash(job)
  if h not in _BUILT:
    if not _BUILT:
      _compile_cache()
    _BUILT[h] = build_client_app(job)
  return _BUILT[h]


def _compile_cache() -> None:
  """JAX's persistent compilation cache in a node's process (a SuperNode starts one process a
  message, each would compile the same step again), where `$FL_PRIVACY_COMPILE_CACHE` (or
  the user cache directory) allows it."""
  from fl_privacy.eval import compile_cache  # pylint: disable=import-outside-toplevel
  directory = compile_cache.resolve(None)
  if directory:
    compile_cache.enable(directory)


NO_JOB = ("the run config has no 'job' (a fl_privacy.flower.engines.jobs.Job as `jobs.dumps` "
          'text): run `python -m experiments.flower_audit --config.flower_audit.engine='
          "deployment`, or pass --run-config <a TOML file holding job = \"<jobs.dumps(job)>\">")


def from_run_config(context: Context) -> Job:
  """The job the run carries in its run config's `job` entry (Flower hands the run config to
  the ServerApp and to every node's ClientApp)."""
  text = str(context.run_config.get('job', ''))
  if not text:
    raise ValueError(NO_JOB)
  return loads(text)


def client_app_for(ref: Job | None = None) -> ClientApp:
  """A ClientApp running job `ref` (None: the job of the run config, `from_run_config`):
  train and evaluate go to the part's ClientApp, query returns `partition-id`."""
  app = ClientApp()
  own: dict[str, ClientApp] = {}  # a Job given as an object: built for this app only

  def forward(msg: Message, context: Context) -> Message:
    if isinstance(ref, Job):
      if 'app' not in own:
        own['app'] = build_client_app(ref)
      return own['app'](msg, context)
    return client_app(from_run_config(context))(msg, context)

  app.train()(forward)
  app.evaluate()(forward)

  @app.query()
  def query(msg: Message, context: Context) -> Message:
    return Message(RecordDict({'node': ConfigRecord(
        {PARTITION_KEY: int(context.node_config[PARTITION_KEY])})}), reply_to=msg)

  del query
  return app


# ---------------------------------------------------------------------------- server side ---

def partition_map(grid: Grid, num_nodes: int, timeout: float = 300.0) -> dict[int, int]:
  """node id -> partition-id of the `num_nodes` nodes (waits up to `timeout` s for them to
  connect, then one `query` message each). EngineError when a node does not answer or the
  partitions are not 0..N-1."""
  deadline = time.monotonic() + float(timeout)
  while len(nodes := list(grid.get_node_ids())) < num_nodes:
    if time.monotonic() > deadline:
      raise EngineError(f'{len(nodes)} of {num_nodes} nodes connected after {timeout:.0f} s')
    time.sleep(0.5)
  messages = [Message(RecordDict({'config': ConfigRecord({QUERY_KEY: 'partition'})}),
                      dst_node_id=int(n), message_type='query') for n in nodes]
  replies = list(grid.send_and_receive(messages, timeout=float(timeout)))
  out = {}
  for reply in replies:
    if reply.has_error():
      raise EngineError(f'node {reply.metadata.src_node_id} did not say its partition: '
                        f'{last_line(reply.error.reason)}')
    out[int(reply.metadata.src_node_id)] = int(reply.content['node'][PARTITION_KEY])
  missing = sorted(set(map(int, nodes)) - set(out))
  if missing:
    raise EngineError(f'nodes {missing} did not say their partition within {timeout:.0f} s')
  if sorted(out.values()) != list(range(num_nodes)) or len(out) != num_nodes:
    raise EngineError(f'the nodes\' partitions are {sorted(out.values())}, not 0..'
                      f'{num_nodes - 1} (one node per partition)')
  return out


def last_line(text: Any) -> str:
  """The last non-empty line of an error's text (a traceback's is the exception)."""
  lines = [line.strip() for line in str(text).splitlines() if line.strip()]
  return lines[-1] if lines else ''


def _round_of(msg: Message) -> int | None:
  if not msg.has_content():
    return None
  for record in msg.content.config_records.values():
    if 'server-round' in record:
      return int(record['server-round'])
  return None


class OrderedGrid(Grid):
  """A Flower `Grid` around another one: node ids listed by partition, replies returned by
  partition (their arrival order is the engine's), and what each exchange lost.

  Attributes:
    losses: One dict per instruction without a usable reply: 'round' (its `server-round`,
      None when it has none), 'node', 'partition', 'type' (message type), 'reason' ('error:
      <code> <reason>' or 'no reply within the timeout').
  """

  def __init__(self, grid: Grid, partitions: Mapping[int, int],
               round_timeout: float | None = None):
    self.grid = grid
    self.partitions = {int(k): int(v) for k, v in partitions.items()}
    self.round_timeout = round_timeout
    self.losses: list[dict[str, Any]] = []

  def set_run(self, run: Run) -> None:
    self.grid.set_run(run)

  @property
  def run(self) -> Run:
    return self.grid.run

  def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
    return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

  def get_node_ids(self) -> list[int]:
    live = set(map(int, self.grid.get_node_ids()))
    return sorted((n for n in self.partitions if n in live), key=self.partitions.__getitem__)

  def _rank(self, msg: Message) -> tuple[int, int]:
    node = int(msg.metadata.src_node_id)
    return (self.partitions.get(node, len(self.partitions)), node)

  def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
    return self.grid.push_messages(messages)

  def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
    return sorted(self.grid.pull_messages(message_ids), key=self._rank)

  def send_and_receive(self, messages: Iterable[Message], *,
                       timeout: float | None = None) -> Iterable[Message]:
    messages = list(messages)
    if self.round_timeout is not None:
      timeout = self.round_timeout
    replies = sorted(self.grid.send_and_receive(messages, timeout=timeout), key=self._rank)
    answered = {int(r.metadata.src_node_id): r for r in replies}
    by_partition = lambda m: (self.partitions.get(int(m.metadata.dst_node_id),  # noqa: E731
                                                  len(self.partitions)),
                              int(m.metadata.dst_node_id))
    for msg in sorted(messages, key=by_partition):
      node = int(msg.metadata.dst_node_id)
      reply = answered.get(node)
      if reply is not None and not reply.has_error():
        continue
      reason = ('no reply within the timeout' if reply is None else
                f'error: {reply.error.code} {last_line(reply.error.reason)}')
      self.losses.append({'round': _round_of(msg), 'node': node,
                          'partition': self.partitions.get(node),
                          'type': msg.metadata.message_type, 'reason': reason})
      logging.getLogger('fl_privacy').warning(
          'Flower round %s: node %d (partition %s) %s', _round_of(msg), node,
          self.partitions.get(node), reason)
    return replies


@contextlib.contextmanager
def seeded(seed: int):
  """Python's `random` and numpy's global generator seeded with `seed`, restored after."""
  state = random.getstate(), np.random.get_state()
  random.seed(int(seed))
  np.random.seed(int(seed) % 2**32)
  try:
    yield
  finally:
    random.setstate(state[0])
    np.random.set_state(state[1])


def serve(job: Job, grid: Grid) -> dict[str, Any]:
  """The job's server side on `grid` (module docstring)."""
  partitions = partition_map(grid, job.num_nodes, job.wait_timeout)
  ordered = OrderedGrid(grid, partitions, job.round_timeout)
  with seeded(job.seed):
    result = _module(job).__dict__[
        'dishonest_server' if job.part == 'dishonest' else 'job_server'](job.args, ordered)
  return {'result': result, 'partitions': partitions, 'node_ids': ordered.get_node_ids(),
          'losses': list(ordered.losses)}
