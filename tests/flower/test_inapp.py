"""What runs inside a user's Flower app (`fl_privacy.flower.inapp`): numpy and flwr only.

One subprocess imports the in-app files with JAX, Flax, optax, TensorFlow, absl,
ml_collections and every heavy fl_privacy module made unimportable (a meta-path finder that
raises), first as a vendored copy in a temp app package with fl_privacy itself unimportable,
then through `import fl_privacy`, `import fl_privacy.flower` and the package; each time it
runs two rounds of Flower's own FedAvg in DifferentialPrivacyServerSideFixedClipping, wrapped
by the in-app `CanaryAuditStrategy`, over 2 user nodes and 4 canary nodes, and reads the
recording back. The other tests are in process.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import RdpAccountant
from flwr.serverapp import strategy as flwr_strategy
from flwr.serverapp.strategy import Strategy
from flwr.supercore.privacy_accounting import GaussianPrivacyEvent, NeighboringRelation
from flwr.supercore.privacy_accounting import PrivacyConfig, SamplingMethod

from fl_privacy.flower.engines import inprocess
from fl_privacy.flower.inapp import fl_privacy_canaries as canaries
from fl_privacy.flower.inapp import fl_privacy_canary_strategy as recorder
from fl_privacy.flower.inapp import vendor

REPO = pathlib.Path(__file__).resolve().parents[2]

# The child: a finder refusing the heavy modules, a minimal Grid (Flower's own needs a
# SuperLink), a user's numpy ClientApp, the round trip; prints what it saw as JSON.
CHILD = r'''
import importlib.abc, json, math, os, pathlib, shutil, sys
HEAVY = ('jax', 'jaxlib', 'flax', 'optax', 'tensorflow', 'tensorflow_datasets', 'absl',
         'ml_collections', 'jax_privacy', 'torch', 'opacus')
LIGHT_FL = ('fl_privacy', 'fl_privacy.validate', 'fl_privacy.flower',
            'fl_privacy.flower.inapp', 'fl_privacy.flower.inapp.fl_privacy_canaries',
            'fl_privacy.flower.inapp.fl_privacy_canary_strategy')
state = {'fl_privacy': False}

class Refuse(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    top = name.split('.')[0]
    if top in HEAVY:
      raise ImportError(f'{name} is blocked in this test')
    if top == 'fl_privacy' and (not state['fl_privacy'] or name not in LIGHT_FL):
      raise ImportError(f'{name} is blocked in this test')
    return None

sys.meta_path.insert(0, Refuse())
import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.app.metadata import Metadata
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.serverapp import strategy as flwr_strategy
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

class TinyGrid(Grid):
  """Nodes are ClientApps of this process; replies in message order."""
  def __init__(self, app, node_configs):
    self.app, self._run, self.n = app, Run.create_empty(7), 0
    self.contexts = {100 + i: Context(run_id=7, node_id=100 + i, node_config={
        'partition-id': i, **c}, state=RecordDict(), run_config={})
        for i, c in enumerate(node_configs)}
  run = property(lambda self: self._run)
  def set_run(self, run): self._run = run
  def create_message(self, *a, **k): raise NotImplementedError
  def get_node_ids(self): return list(self.contexts)
  def push_messages(self, messages): raise NotImplementedError
  def pull_messages(self, ids): raise NotImplementedError
  def send_and_receive(self, messages, *, timeout=None):
    out = []
    for msg in messages:
      m = msg.metadata
      self.n += 1
      got = Message(content=msg.content, metadata=Metadata(
          run_id=7, message_id=str(self.n), src_node_id=m.src_node_id,
          dst_node_id=m.dst_node_id, reply_to_message_id='', group_id=m.group_id,
          created_at=m.created_at, ttl=m.ttl, message_type=m.message_type))
      TaskIdentity.node_id = m.dst_node_id
      out.append(self.app(got, self.contexts[m.dst_node_id]))
      TaskIdentity.node_id = SUPERLINK_NODE_ID
    return out

calls = []
def mod(msg, context, call_next):
  calls.append(int(context.node_config['partition-id']))
  return call_next(msg, context)

user = ClientApp(mods=[mod])

@user.train()
def train(msg, context):
  record = msg.content['arrays']
  target = float(context.node_config['partition-id'] + 1)
  out = {k: Array((a + 0.5 * (target - a)).astype(a.dtype))
         for k, a in zip(record.keys(), record.to_numpy_ndarrays())}
  return Message(RecordDict({'arrays': ArrayRecord(out), 'metrics': MetricRecord(
      {'num-examples': 10})}), reply_to=msg)

def round_trip(c, s, folder, seed):
  TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, SUPERLINK_NODE_ID, 1
  configs = [{}, {}] + c.canary_node_configs(4, seed=seed, canary_norm=2.0, clip_norm=1.0,
                                             **{'num-examples': 10})
  grid = TinyGrid(c.with_canaries(user), configs)
  fedavg = flwr_strategy.FedAvg(fraction_train=1.0, fraction_evaluate=0.0,
                                min_train_nodes=6, min_available_nodes=6)
  dp = flwr_strategy.DifferentialPrivacyServerSideFixedClipping(fedavg, 0.5, 1.0, 6)
  strategy = s.CanaryAuditStrategy(dp, seed=seed, canary_norm=2.0, clip_norm=1.0,
                                   delta=1e-5, num_null=8, num_canaries=4, directory=folder)
  model = ArrayRecord({'w': Array(np.zeros((3, 5), np.float32)),
                       'b': Array(np.zeros(4, np.float32))})
  np.random.seed(0)
  result = strategy.start(grid, model, num_rounds=2)
  meta, rounds = s.load_rounds(pathlib.Path(folder) / s.ROUNDS_FILE)
  final = np.concatenate([a.ravel() for a in result.arrays.to_numpy_ndarrays()]).astype(float)
  dirs = np.stack([c.canary_direction(seed, i, 19) for i in range(12)])
  return dict(module=c.__name__, strategy=s.__name__, format=meta['format'],
              canary_nodes=meta['canary_nodes'], rounds=len(rounds),
              sampled=[r.sampled.tolist() for r in rounds],
              replied=[r.replied.tolist() for r in rounds],
              after_matches=bool(np.allclose(rounds[-1].after, dirs @ final, atol=1e-6)),
              coins=[c.canary_coin(seed, i) for i in range(4)], mods=sorted(set(calls)))

seed, app_root = int(sys.argv[1]), pathlib.Path(sys.argv[2])
sys.path.insert(0, str(app_root))
from my_app import fl_privacy_canaries as vc, fl_privacy_canary_strategy as vs
report = {'vendored': round_trip(vc, vs, app_root / 'out_vendored', seed)}
report['fl_privacy_blocked'] = 'fl_privacy' not in sys.modules
state['fl_privacy'] = True
calls.clear()
import fl_privacy, fl_privacy.flower
from fl_privacy.flower.inapp import fl_privacy_canaries as pc, fl_privacy_canary_strategy as ps
report['package'] = round_trip(pc, ps, app_root / 'out_package', seed)
report['loaded'] = sorted(m for m in sys.modules if m.split('.')[0] in HEAVY + ('fl_privacy',))
print(json.dumps(report))
'''


def _seed() -> int:
  """The first seed whose 4 coins put two canaries in each world."""
  return next(s for s in range(100) if sum(canaries.canary_coin(s, i) for i in range(4)) == 2)


def test_the_in_app_files_run_with_jax_blocked_vendored_and_from_the_package(tmp_path):
  app = tmp_path / 'my_app'
  app.mkdir()
  (app / '__init__.py').write_text('')
  assert vendor.main([str(app)]) == 0
  env = {**os.environ, 'FLWR_TELEMETRY_ENABLED': '0',
         'PYTHONPATH': os.pathsep.join([str(REPO), os.environ.get('PYTHONPATH', '')])}
  seed = _seed()
  done = subprocess.run([sys.executable, '-c', CHILD, str(seed), str(tmp_path)],
                        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  report = json.loads(done.stdout.strip().splitlines()[-1])
  assert report['fl_privacy_blocked']
  assert report['loaded'] == ['fl_privacy', 'fl_privacy.flower', 'fl_privacy.flower.inapp',
                              'fl_privacy.flower.inapp.fl_privacy_canaries',
                              'fl_privacy.flower.inapp.fl_privacy_canary_strategy',
                              'fl_privacy.validate']
  assert report['vendored']['module'] == 'my_app.fl_privacy_canaries'
  assert report['package']['module'] == 'fl_privacy.flower.inapp.fl_privacy_canaries'
  for way in ('vendored', 'package'):
    r = report[way]
    assert r['format'] == recorder.FORMAT and r['rounds'] == 2
    assert sorted(r['canary_nodes'].values()) == [0, 1, 2, 3]
    assert r['sampled'] == r['replied'] == [[True] * 4] * 2
    assert r['after_matches']  # the last aggregate, projected, is the final model's
    assert r['coins'] == [canaries.canary_coin(seed, i) for i in range(4)]
    assert r['mods'] == [0, 1, 2, 3, 4, 5]  # the user's app-level mod ran on every node


def test_the_vendored_files_are_byte_copies_and_a_bad_destination_is_one_line(tmp_path,
                                                                              capsys):
  assert vendor.main([str(tmp_path)]) == 0
  for name in vendor.FILES:
    assert (tmp_path / name).read_bytes() == (vendor.HERE / name).read_bytes()
  assert vendor.main([str(tmp_path / 'missing')]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('DEST: ') and '\n' not in err
  assert not (tmp_path / 'missing').exists()


def test_a_client_app_without_mods_is_one_error_line_never_an_empty_list():
  app = ClientApp(mods=[lambda msg, context, call_next: call_next(msg, context)])
  assert len(canaries.app_mods(app)) == 1
  del app._mods  # pylint: disable=protected-access
  with pytest.raises(AttributeError) as e:
    canaries.with_canaries(app)
  import flwr  # pylint: disable=import-outside-toplevel
  assert str(e.value) == (
      f'with_canaries: this flwr {flwr.__version__} ClientApp has no list `_mods` (got '
      'NoneType): pass with_canaries(app, canary_mods=[...]) with the mods your ClientApp was '
      'built with ([] for none)')
  assert '\n' not in str(e.value)
  # Naming the canaries' mods needs no private attribute.
  assert isinstance(canaries.with_canaries(app, canary_mods=[]), ClientApp)
  with pytest.raises(TypeError, match=r'^with_canaries wraps a flwr.clientapp.ClientApp, got '
                     r'builtins.function$'):
    canaries.with_canaries(lambda msg, context: msg)


def test_a_recording_that_is_not_one_names_the_field(tmp_path):
  rounds = [recorder.CanaryRound(1, np.ones(4, bool), np.ones(4, bool), 6, np.zeros(6),
                                 np.zeros(6))]
  meta = {'format': recorder.FORMAT, 'format_version': recorder.FORMAT_VERSION,
          **{k: None for k in recorder.META_KEYS}, 'num_canaries': 4, 'num_null': 2}
  path = tmp_path / 'r.npz'
  recorder.save_rounds(path, rounds, meta)
  assert recorder.load_rounds(path)[1][0].num_messages == 6
  recorder.save_rounds(path, rounds, {**meta, 'format_version': 0})
  with pytest.raises(ValueError, match='version 0; this reader takes'):
    recorder.load_rounds(path)
  recorder.save_rounds(path, rounds, {k: v for k, v in meta.items() if k != 'seed'})
  with pytest.raises(ValueError, match='meta.seed missing'):
    recorder.load_rounds(path)
  recorder.save_rounds(path, rounds, {**meta, 'num_null': 3})
  with pytest.raises(ValueError, match=r'before has shape \(1, 6\), 1 rounds of 7'):
    recorder.load_rounds(path)
  path.write_bytes(b'not a zip')
  with pytest.raises(ValueError, match='not a readable .npz'):
    recorder.load_rounds(path)
  assert sorted(p.name for p in tmp_path.iterdir()) == ['r.npz']  # no temp file left


def test_the_discovery_query_reaches_only_the_canary_behaviour():
  """A real node answers the query itself (index -1) without the user's app; a canary node
  answers with its settings; a plain query goes to the user's app."""
  seen = []
  user = ClientApp()

  @user.query()
  def query(msg, context):
    seen.append(int(context.node_config['partition-id']))
    return Message(RecordDict({'mine': ConfigRecord({'ok': 1})}), reply_to=msg)

  del query
  configs = [{}] + canaries.canary_node_configs(1, seed=3, canary_norm=2.0, clip_norm=0.5)
  grid = inprocess.InProcessGrid([canaries.with_canaries(user)] * 2, node_configs=configs,
                                 raise_client_errors=True)
  with inprocess.task_identity(grid.run.run_id, SUPERLINK_NODE_ID):
    found = recorder.discover_canaries(grid)
    plain = [Message(RecordDict({'c': ConfigRecord({'x': 1})}), dst_node_id=n,
                     message_type='query') for n in grid.get_node_ids()]
    replies = grid.send_and_receive(plain[:1])
  nodes = grid.get_node_ids()
  assert found == {nodes[1]: {'canary-index': 0, 'canary-seed': 3, 'canary-norm': 2.0,
                              'clip-norm': 0.5}}
  assert replies[0].content['mine']['ok'] == 1 and seen == [0]
  with inprocess.task_identity(grid.run.run_id, SUPERLINK_NODE_ID):
    ask = Message(RecordDict({'c': ConfigRecord({canaries.QUERY_KEY: 'canary'})}),
                  dst_node_id=nodes[0], message_type='query')
    (real,) = grid.send_and_receive([ask])
  assert dict(real.content['canary']) == {'canary-index': -1} and seen == [0]
  # The canaries go through the user's app-level mods (and canary_client_app through none).
  ran = []
  modded = ClientApp(mods=[lambda msg, context, call_next: ran.append(msg.metadata.message_type)
                           or call_next(msg, context)])
  grid = inprocess.InProcessGrid([canaries.with_canaries(modded), canaries.canary_client_app],
                                 node_configs=configs[1:] * 2, raise_client_errors=True)
  with inprocess.task_identity(grid.run.run_id, SUPERLINK_NODE_ID):
    grid.send_and_receive([Message(RecordDict({'config': ConfigRecord({'x': 1})}),
                                   dst_node_id=n, message_type='query')
                           for n in grid.get_node_ids()])
  assert ran == ['query']
  alone = inprocess.InProcessGrid([canaries.canary_client_app], raise_client_errors=True)
  with inprocess.task_identity(alone.run.run_id, SUPERLINK_NODE_ID):
    train = Message(RecordDict({'a': ArrayRecord({'w': Array(np.zeros(2, np.float32))})}),
                    dst_node_id=alone.get_node_ids()[0], message_type='train')
    with pytest.raises(ValueError, match=rf"^node {alone.get_node_ids()[0]} runs the canary "
                       r"ClientApp without canary-index in its node config; a user's own app "
                       r"wraps its ClientApp in with_canaries\(\.\.\.\) instead$"):
      alone.send_and_receive([train])


# --- fast in-process checks of each in-app piece (tiny models, a handful of nodes) ----------

def test_the_draws_are_pinned():
  """The analysis redraws every coin and direction from (seed, i): pinned to the values the
  audit has drawn since issue 42 (numpy SeedSequence([seed, i, 0 or 1]))."""
  assert [int(canaries.canary_coin(11, i)) for i in range(16)] == [
      0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1]
  assert [int(canaries.canary_coin(2**40, i)) for i in range(8)] == [1, 1, 1, 1, 1, 0, 0, 1]
  np.testing.assert_allclose(canaries.canary_direction(11, 3, 5), [
      0.6331848024626029, -0.29954361079622477, 0.2874771438446122, 0.41737599084667,
      -0.5024985623792958], rtol=1e-13)
  assert canaries.canary_direction(11, 3, 1).tolist() in ([1.0], [-1.0])
  assert canaries.check_seed(0) == 0 and canaries.check_seed(np.int64(7)) == 7
  for bad in (-1, True, 1.0, '3'):
    with pytest.raises(ValueError, match='canary seed must be an integer >= 0'):
      canaries.canary_coin(bad, 0)
  with pytest.raises(ValueError, match=r'dimension must be >= 1 \(got 0\)'):
    canaries.canary_direction(1, 0, 0)


def test_the_flat_model_and_an_added_update_keep_every_array_its_own():
  record = ArrayRecord({'a': Array(np.arange(6, dtype=np.float32).reshape(2, 3)),
                        'n': Array(np.asarray([3, 4], np.int32)),
                        'b': Array(np.asarray([0.5], np.float64))})
  flat = canaries.flat_model(record)
  assert flat.dtype == np.float64 and flat.tolist() == [0, 1, 2, 3, 4, 5, 0.5]
  update = np.arange(7) / 8.0
  out = canaries.add_to_model(record, update)
  assert list(out.keys()) == ['a', 'n', 'b']
  assert out['a'].numpy().dtype == np.float32 and out['a'].numpy().shape == (2, 3)
  assert out['n'].numpy().tolist() == [3, 4] and out['n'].numpy().dtype == np.int32
  np.testing.assert_array_equal(canaries.flat_model(out), flat + update)
  with pytest.raises(ValueError, match='the update has 6 coordinates, the model 7'):
    canaries.add_to_model(record, np.zeros(6))
  with pytest.raises(ValueError, match=r"\['n'\]\) holds no floating array: canaries need a "
                     'model with float parameters$'):
    canaries.flat_model(ArrayRecord({'n': Array(np.asarray([1], np.int64))}))
  only32 = canaries.flat_model(ArrayRecord({'w': Array(np.asarray([0.1], np.float32))}))
  assert only32.dtype == np.float64 and only32[0] == np.float64(np.float32(0.1))
  # Three float arrays of unequal sizes: each takes its own slice of the update.
  three = ArrayRecord({k: Array(np.zeros(n, np.float64)) for k, n in (('a', 2), ('b', 3),
                                                                       ('c', 1))})
  moved = canaries.add_to_model(three, np.arange(1.0, 7.0))
  assert [moved[k].numpy().tolist() for k in 'abc'] == [[1, 2], [3, 4, 5], [6]]
  # An update rounding would erase moves the largest |update| coordinate by one ulp its way
  # (the second array here, behind an integer one).
  big = ArrayRecord({'n': Array(np.asarray([1], np.int64)),
                     'a': Array(np.full(2, 1e4, np.float32)),
                     'b': Array(np.full(3, 1e4, np.float32))})
  up, down = np.nextafter(np.float32(1e4), np.float32(np.inf)), np.nextafter(
      np.float32(1e4), np.float32(0))
  for update, a, b in (([0, 1e-9, 0, -3e-9, 0], [1e4, 1e4], [1e4, down, 1e4]),
                       ([0, 1e-9, 3e-9, 0, 0], [1e4, 1e4], [up, 1e4, 1e4]),
                       ([0, 2e-9, 0, 0, 0], [1e4, up], [1e4, 1e4, 1e4]),
                       ([0, 0, 0, 0, 0], [up, 1e4], [1e4, 1e4, 1e4])):  # zero: upwards
    nudged = canaries.add_to_model(big, np.asarray(update))
    assert nudged['a'].numpy().tolist() == a and nudged['b'].numpy().tolist() == b, update
    assert nudged['a'].numpy().dtype == nudged['b'].numpy().dtype == np.float32
  square = ArrayRecord({'m': Array(np.full((2, 2), 1e4, np.float32))})
  got = canaries.add_to_model(square, np.asarray([0, 0, -1e-9, 0]))['m'].numpy()
  assert got.tolist() == [[1e4, 1e4], [down, 1e4]]


def test_a_canary_nodes_settings_and_its_replies():
  config = canaries.CanaryConfig.from_node_config({
      'canary-index': 4, 'canary-seed': 11, 'canary-norm': 3, 'clip-norm': 0.5,
      'num-examples': 7, 'canary-metrics': ' loss, acc ,', 'canary-eval-metrics': 'e',
      'canary-weight-key': 'w'})
  assert (config.index, config.seed, config.norm, config.clip, config.num_examples) == (
      4, 11, 3.0, 0.5, 7)
  assert (config.metrics, config.eval_metrics, config.weight_key) == (('loss', 'acc'),
                                                                      ('e',), 'w')
  assert config.included  # coin 4 of seed 11
  np.testing.assert_array_equal(config.update(5), 1.5 * canaries.canary_direction(11, 4, 5))
  idle = canaries.CanaryConfig(index=0, seed=11, norm=2.0, clip=0.5)
  assert not idle.included and (idle.num_examples, idle.weight_key) == (1, 'num-examples')
  np.testing.assert_array_equal(idle.update(5),
                                canaries.IDLE * 0.5 * canaries.canary_direction(11, 0, 5))
  assert canaries.IDLE == 1e-6
  bad = [(dict(index=-1), 'canary-index must be an integer >= 0'),
         (dict(index=True), 'canary-index must be'), (dict(norm=0.99), 'canary-norm must be >= 1'),
         (dict(norm=math.inf), 'canary-norm'), (dict(clip=0.0), 'clip-norm must be > 0'),
         (dict(clip=math.nan), 'clip-norm'), (dict(num_examples=0), 'num-examples must be >= 1')]
  for change, message in bad:
    with pytest.raises(ValueError, match=message):
      canaries.CanaryConfig(**{**dict(index=0, seed=1, norm=1.0, clip=1.0), **change})
  with pytest.raises(ValueError, match=r"needs \['canary-norm', 'clip-norm'\]"):
    canaries.CanaryConfig.from_node_config({'canary-index': 0, 'canary-seed': 1})
  assert canaries.CanaryConfig.from_node_config({'canary-seed': 1}) is None
  plain = canaries.CanaryConfig.from_node_config({'canary-index': 0, 'canary-seed': 1,
                                                  'canary-norm': 1, 'clip-norm': 1})
  assert (plain.metrics, plain.eval_metrics, plain.num_examples, plain.weight_key) == (
      (), (), 1, 'num-examples')

  grid = inprocess.InProcessGrid([canaries.canary_client_app], raise_client_errors=True,
                                 node_configs=[{'canary-index': 4, 'canary-seed': 11,
                                                'canary-norm': 3, 'clip-norm': 0.5,
                                                'canary-metrics': 'loss',
                                                'canary-eval-metrics': 'e'}])
  node = grid.get_node_ids()[0]
  model = ArrayRecord({'w': Array(np.zeros(5, np.float32))})
  with inprocess.task_identity(grid.run.run_id, SUPERLINK_NODE_ID):
    train, evaluate, query = grid.send_and_receive([
        Message(RecordDict({'m': model, 'config': ConfigRecord({'lr': 0.1})}),
                dst_node_id=node, message_type=t) for t in ('train', 'evaluate', 'query')])
    two = Message(RecordDict({'m': model, 'x': model}), dst_node_id=node, message_type='train')
    with pytest.raises(ValueError, match=r"exactly one ArrayRecord \(the model\), got \['m', 'x'\]"):
      grid.send_and_receive([two])
  assert list(train.content.array_records) == ['m']
  np.testing.assert_allclose(train.content['m']['w'].numpy(),
                             1.5 * canaries.canary_direction(11, 4, 5), rtol=1e-6)
  assert dict(train.content['metrics']) == {'loss': 0.0, 'num-examples': 1}
  assert dict(evaluate.content['metrics']) == {'e': 0.0, 'num-examples': 0}
  assert dict(query.content['canary']) == {'canary-index': 4, 'canary-seed': 11,
                                           'canary-norm': 3.0, 'clip-norm': 0.5}
  assert canaries.node_config_text({'canary-index': 2, 'canary-norm': 2.0, 'on': True,
                                    'off': False, 'k': 'a,b', 'n': np.int64(3)}) == (
      'canary-index=2 canary-norm=2.0 on=true off=false k="a,b" n=3')
  configs = canaries.canary_node_configs(2, seed=5, canary_norm=2, clip_norm=1, x='y')
  assert configs == [{'canary-index': i, 'canary-seed': 5, 'canary-norm': 2.0,
                      'clip-norm': 1.0, 'x': 'y'} for i in range(2)]


def test_only_a_query_carrying_the_key_is_the_discovery_query():
  with inprocess.task_identity(1, SUPERLINK_NODE_ID):
    def message(kind, key):
      return Message(RecordDict({'c': ConfigRecord({key: 'canary'})}), dst_node_id=5,
                     message_type=kind)
    assert canaries.is_discovery_query(message('query', canaries.QUERY_KEY))
    assert canaries.is_discovery_query(message('query.mine', canaries.QUERY_KEY))
    assert not canaries.is_discovery_query(message('query', 'other'))
    assert not canaries.is_discovery_query(message('train', canaries.QUERY_KEY))
  assert canaries.QUERY_KEY == 'fl-privacy-canary'


SEED4 = 1  # coins of seed 1, canaries 0..3: two in each world (checked below)
DIM4 = 7


class _Stub(Strategy):
  """A Message-API strategy: trains every node, returns a fixed aggregate (or none)."""

  def __init__(self, aggregate=None, only=None):
    self.aggregate = aggregate
    self.only = only
    self.seen = []
    self.asked = []

  def configure_train(self, server_round, arrays, config, grid):
    self.asked.append((server_round, config))
    return [Message(RecordDict({'arrays': arrays}), dst_node_id=n, message_type='train')
            for n in grid.get_node_ids() if self.only is None or n in self.only]

  def aggregate_train(self, server_round, replies):
    self.seen.append((server_round, len(list(replies))))
    return self.aggregate, None

  def configure_evaluate(self, server_round, arrays, config, grid):
    return []

  def aggregate_evaluate(self, server_round, replies):
    return None

  def summary(self):
    pass


def _record(values) -> ArrayRecord:
  return ArrayRecord({'w': Array(np.asarray(values, np.float64))})


def test_the_strategy_records_the_projections_the_replies_and_the_uploads(tmp_path, caplog):
  """By hand on a stub strategy: the model and the aggregate on every direction (cached or
  redrawn), which canaries were sent and replied, each canary's upload on its direction; a
  reply of another size or an error is not read; the file holds what memory holds."""
  assert [canaries.canary_coin(SEED4, i) for i in range(4)].count(True) == 2
  nodes = [10, 11, 12, 13, 14, 15]  # 10, 11 real; canary i on node 12 + i
  grid = inprocess.InProcessGrid([canaries.canary_client_app] * 6, node_ids=nodes)
  model, aggregate = _record(np.linspace(-1, 1, DIM4)), _record(np.arange(DIM4) / 10)
  dirs = np.stack([canaries.canary_direction(SEED4, i, DIM4) for i in range(6)])
  got = []
  for cache in (recorder.DIRECTION_CACHE_BYTES, 0):
    stub = _Stub(aggregate)
    strategy = recorder.CanaryAuditStrategy(
        stub, seed=SEED4, canary_norm=2.0, clip_norm=0.5, delta=1e-5, num_null=2,
        canary_nodes={12 + i: i for i in range(4)}, threats=('uploads', 'all_iterates'),
        directory=tmp_path / str(cache), direction_cache_bytes=cache, keep_models=True)
    assert strategy.threats == ('all_iterates', 'uploads') and strategy.k == 4
    with inprocess.task_identity(grid.run.run_id, SUPERLINK_NODE_ID):
      sent = strategy.configure_train(3, model, ConfigRecord(), grid)
      sent = [m for m in sent if m.metadata.dst_node_id != 15]  # canary 3's reply is lost
      replies = {m.metadata.dst_node_id: Message(RecordDict({'arrays': _record(
          np.linspace(-1, 1, DIM4) + (m.metadata.dst_node_id - 9))}), reply_to=m)
                 for m in sent}
      replies[12] = Message(RecordDict({'arrays': _record(np.zeros(3))}), reply_to=sent[2])
      replies[14] = Message(Error(code=0, reason='lost'), reply_to=sent[4])
      with caplog.at_level('WARNING'):
        arrays, metrics = strategy.aggregate_train(3, list(replies.values()))
    assert 'round 3: canary 0 replied 3 coordinates, the model has 7 (not read)' in caplog.text
    assert arrays is aggregate and metrics is None
    assert stub.seen == [(3, 5)] and stub.asked == [(3, ConfigRecord())]
    (r,) = strategy.rounds
    assert r.server_round == 3 and r.num_messages == 6
    assert r.sampled.tolist() == [True, True, True, True]  # configure_train sent all 6
    assert r.replied.tolist() == [False, True, False, False]
    assert r.sampled.dtype == r.replied.dtype == np.bool_
    np.testing.assert_allclose(r.before, dirs @ np.linspace(-1, 1, DIM4), rtol=1e-13)
    np.testing.assert_allclose(r.after, dirs @ (np.arange(DIM4) / 10), rtol=1e-13)
    np.testing.assert_allclose(r.uploads[1], 4 * dirs[1].sum(), rtol=1e-12)
    assert np.isnan(r.uploads[[0, 2, 3]]).all() and math.isnan(r.flower_epsilon)
    assert (strategy._projector.matrix is None) == (cache == 0)  # pylint: disable=protected-access
    np.testing.assert_array_equal(r.model, np.linspace(-1, 1, DIM4))
    np.testing.assert_array_equal(r.aggregate, np.arange(DIM4) / 10)
    meta, (again,) = recorder.load_rounds(tmp_path / str(cache) / recorder.ROUNDS_FILE)
    assert meta == {**strategy.meta()} and again.model is None
    for name in ('sampled', 'replied', 'before', 'after', 'uploads'):
      np.testing.assert_array_equal(getattr(again, name), getattr(r, name))
    got.append(r)
  np.testing.assert_allclose(got[0].before, got[1].before, rtol=1e-13)
  assert {k: v for k, v in meta.items() if k not in ('flwr_version', 'numpy_version')} == {
      'format': recorder.FORMAT, 'format_version': 1, 'seed': SEED4, 'num_canaries': 4,
      'num_null': 2, 'canary_norm': 2.0, 'clip_norm': 0.5, 'idle': 1e-6, 'dimension': DIM4,
      'canary_nodes': {'12': 0, '13': 1, '14': 2, '15': 3},
      'threats': ['all_iterates', 'uploads'], 'gaussian': True, 'delta': 1e-5,
      'confidence': 0.95, 'stated_epsilon': None, 'flower': None}
  # No aggregate: the round's model again. No configure_train: refused.
  strategy = recorder.CanaryAuditStrategy(_Stub(None, only=(10, 13, 14)), seed=SEED4,
                                          canary_norm=1.0, clip_norm=1.0, num_null=2,
                                          canary_nodes={12 + i: i for i in range(4)})
  assert strategy.meta()['flower'] is None and strategy.meta()['dimension'] is None
  with inprocess.task_identity(grid.run.run_id, SUPERLINK_NODE_ID):
    strategy.configure_train(1, model, ConfigRecord(), grid)
    strategy.aggregate_train(1, [])
    with pytest.raises(RuntimeError, match='aggregate_train of round 2 without its '
                       'configure_train'):
      strategy.aggregate_train(2, [])
    with pytest.raises(ValueError, match='the model has 3 float coordinates, 7 in the first'):
      strategy.configure_train(2, _record(np.zeros(3)), ConfigRecord(), grid)
  np.testing.assert_array_equal(strategy.rounds[0].after, strategy.rounds[0].before)
  assert strategy.rounds[0].uploads is None and not strategy.rounds[0].replied.any()
  assert strategy.meta()['delta'] is None
  assert strategy.rounds[0].sampled.tolist() == [False, True, True, False]
  assert strategy.rounds[0].num_messages == 3
  assert strategy.rounds[0].model is None and strategy.rounds[0].aggregate is None


def test_the_strategy_refuses_what_it_cannot_record(tmp_path):
  ok = dict(seed=1, canary_norm=2.0, clip_norm=1.0)
  bad = [(dict(seed=-1), 'canary seed'), (dict(canary_norm=0.5), 'canary_norm must be >= 1'),
         (dict(clip_norm=0.0), 'clip_norm must be > 0'), (dict(delta=1.0), 'delta must be in'),
         (dict(delta=0.0), 'delta must be in'), (dict(confidence=0.5), 'confidence must be'),
         (dict(confidence=1.0), 'confidence must be'),
         (dict(stated_epsilon=-0.1), 'stated_epsilon must be >= 0'),
         (dict(threats=()), 'threats must be'), (dict(threats=('x',)), 'threats must be'),
         (dict(threats=('uploads', 'uploads')), 'threats must be'),
         (dict(num_null=1), 'num_null must be >= 2'),
         (dict(canary_nodes={1: 0, 2: 1, 3: 2}), r'^3 canary nodes: the audit needs at least 4 '
          r'\(two in each world for the split threshold\)$'),
         (dict(canary_nodes={1: 0, 2: 1, 3: 2, 4: 4}), r'must be 0..k-1, one node each \(got '
          r'\[0, 1, 2, 4\]\)'),
         (dict(canary_nodes={1: 0, 2: 1, 3: 2, 4: 3}, num_canaries=5),
          '4 canary nodes, 5 expected')]
  for change, message in bad:
    with pytest.raises(ValueError, match=message):
      recorder.CanaryAuditStrategy(_Stub(), **{**ok, **change})
  with pytest.raises(TypeError, match=r'^CanaryAuditStrategy wraps a flwr.serverapp.strategy.'
                     r'Strategy whose round loop is Strategy.start \(got object\)$'):
    recorder.CanaryAuditStrategy(object(), **ok)

  class OwnLoop(_Stub):
    def start(self, *args, **kwargs):  # pylint: disable=arguments-differ
      raise AssertionError

  with pytest.raises(TypeError, match='round loop is Strategy.start'):
    recorder.CanaryAuditStrategy(OwnLoop(), **ok)
  strategy = recorder.CanaryAuditStrategy(_Stub(), **ok, delta=0.001, stated_epsilon=0,
                                          confidence=0.99, gaussian=False)
  assert (strategy.delta, strategy.stated_epsilon, strategy.confidence, strategy.gaussian,
          strategy.num_null, strategy.threats) == (0.001, 0.0, 0.99, False, 1000,
                                                   ('all_iterates', 'last_iterate'))
  with pytest.raises(RuntimeError, match='not known before the first round'):
    _ = strategy.k
  assert (strategy.keep_models, strategy.query_timeout, strategy.cache_bytes,
          strategy.directory) == (False, 300.0, 256 * 2**20, None)
  every = recorder.CanaryAuditStrategy(_Stub(), **ok, threats=recorder.THREATS[::-1],
                                       query_timeout=12, directory=tmp_path / 'new' / 'run')
  again = recorder.CanaryAuditStrategy(_Stub(), **ok, directory=tmp_path / 'new' / 'run')
  assert every.directory == again.directory and every.directory.is_dir()
  assert every.threats == ('all_iterates', 'last_iterate', 'uploads')
  assert every.query_timeout == 12.0 and isinstance(every.query_timeout, float)


def test_flowers_stated_claim_and_its_ledger_are_recorded():
  """The first strategy of the chain with `privacy_spent()` (the DP wrapper inside a wrapper
  of ours), its delta, relation, sampling, settings and ledger; none without an accountant."""
  fedavg = flwr_strategy.FedAvg()
  accountant = RdpAccountant(PrivacyConfig(
      target_delta=1e-5, population_size=10,
      neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
      sampling_method=SamplingMethod.NO_AMPLIFICATION))
  dp = flwr_strategy.DifferentialPrivacyServerSideFixedClipping(fedavg, 1.5, 0.5, 10,
                                                                accountant=accountant)
  assert recorder.flower_stated(dp)['stated_epsilon'] == 0.0  # nothing spent yet
  accountant.compose(GaussianPrivacyEvent(1.5, 10, 10), 2)
  outer = recorder.CanaryAuditStrategy(dp, seed=1, canary_norm=2.0, clip_norm=0.5)
  got = recorder.flower_stated(outer)
  spent = dp.privacy_spent()
  assert got == {
      'stated_epsilon': spent.epsilon, 'stated_delta': 1e-5,
      'stated_epsilon_source': 'flwr privacy_spent() of '
      'DifferentialPrivacyServerSideFixedClipping (rdp, 2 releases)',
      'stated_relation': 'add-or-remove-one', 'stated_sampling': 'no-amplification',
      'wrapper': 'DifferentialPrivacyServerSideFixedClipping',
      'wrapper_settings': {'noise_multiplier': 1.5, 'clipping_norm': 0.5,
                           'num_sampled_clients': 10},
      'accountant_state': accountant.state_dict()}
  assert recorder.flower_stated(recorder.CanaryAuditStrategy(
      flwr_strategy.DifferentialPrivacyServerSideFixedClipping(fedavg, 1.5, 0.5, 10),
      seed=1, canary_norm=2.0, clip_norm=0.5)) is None


def test_the_canaries_are_learnt_by_one_query_and_must_share_the_strategys_settings(caplog):
  """2 user nodes (one of them not wrapped: its query reply is an error, so it is a real
  node), 4 canaries: the strategy learns node -> index before round 1; a canary whose seed,
  norm or clip is not the strategy's stops the run with the setting named."""
  user = ClientApp()
  configs = [{}, {}] + canaries.canary_node_configs(4, seed=SEED4, canary_norm=2.0,
                                                    clip_norm=0.5)
  apps = [user] + [canaries.with_canaries(user)] * 5
  grid = inprocess.InProcessGrid(apps, node_configs=configs, node_ids=[7, 8, 20, 21, 22, 23])
  with inprocess.task_identity(grid.run.run_id, SUPERLINK_NODE_ID):
    found = recorder.discover_canaries(grid, timeout=5)
    assert sorted(found) == [20, 21, 22, 23]
    assert found[22] == {'canary-index': 2, 'canary-seed': SEED4, 'canary-norm': 2.0,
                         'clip-norm': 0.5}
    strategy = recorder.CanaryAuditStrategy(_Stub(), seed=SEED4, canary_norm=2.0,
                                            clip_norm=0.5, num_null=2, num_canaries=4)
    with caplog.at_level('WARNING'):
      strategy.configure_train(1, _record(np.zeros(3)), ConfigRecord(), grid)
    assert strategy.canary_nodes == {20: 0, 21: 1, 22: 2, 23: 3} and strategy.k == 4
    assert 'node 7 did not answer the canary query (taken as a real node)' in caplog.text
    for change, key in ((dict(seed=SEED4 + 1), 'canary-seed'), (dict(canary_norm=3.0),
                                                               'canary-norm'),
                        (dict(clip_norm=0.25), 'clip-norm')):
      settings = {**dict(seed=SEED4, canary_norm=2.0, clip_norm=0.5), **change}
      other = recorder.CanaryAuditStrategy(_Stub(), num_null=2, **settings)
      with pytest.raises(ValueError, match=rf'^canary node 20 \(index 0\) has {key}='
                         r'[0-9.]+, the strategy [0-9.]+: every canary and the strategy need '
                         'the same$'):
        other.configure_train(1, _record(np.zeros(3)), ConfigRecord(), grid)
    wrong_count = recorder.CanaryAuditStrategy(_Stub(), seed=SEED4, canary_norm=2.0,
                                               clip_norm=0.5, num_canaries=5)
    with pytest.raises(ValueError, match='4 canary nodes, 5 expected'):
      wrong_count.configure_train(1, _record(np.zeros(3)), ConfigRecord(), grid)


class _Silent(inprocess.InProcessGrid):
  """A grid whose last node never answers (Flower's grid drops a reply after its timeout)."""

  def send_and_receive(self, messages, *, timeout=None):
    self.timeouts = getattr(self, 'timeouts', []) + [timeout]
    messages = list(messages)
    return super().send_and_receive(messages[:-1])


def test_a_node_that_does_not_answer_the_query_is_a_real_node(caplog):
  configs = canaries.canary_node_configs(5, seed=SEED4, canary_norm=2.0, clip_norm=0.5)
  grid = _Silent([canaries.canary_client_app] * 5, node_configs=configs)
  with inprocess.task_identity(grid.run.run_id, SUPERLINK_NODE_ID), caplog.at_level('WARNING'):
    found = recorder.discover_canaries(grid, timeout=12.5)
  nodes = grid.get_node_ids()
  assert sorted(found) == nodes[:4] and grid.timeouts == [12.5]
  assert (f'node {nodes[4]} did not answer the canary query within 12 s (taken as a real '
          'node)') in caplog.text


def test_the_strategy_hands_evaluation_and_its_summary_to_the_inner_strategy(caplog):
  calls = []

  class Inner(_Stub):
    def configure_evaluate(self, server_round, arrays, config, grid):
      calls.append(('configure_evaluate', server_round, arrays, config, grid))
      return ['m']

    def aggregate_evaluate(self, server_round, replies):
      calls.append(('aggregate_evaluate', server_round, replies))
      return 'metrics'

    def summary(self):
      calls.append(('summary',))

  strategy = recorder.CanaryAuditStrategy(Inner(), seed=1, canary_norm=2.0, clip_norm=1.0)
  assert strategy.configure_evaluate(3, 'a', 'c', 'g') == ['m']
  assert strategy.aggregate_evaluate(4, 'r') == 'metrics'
  with caplog.at_level('INFO'):
    strategy.summary()
  assert calls == [('configure_evaluate', 3, 'a', 'c', 'g'), ('aggregate_evaluate', 4, 'r'),
                   ('summary',)]
  assert 'CanaryAuditStrategy around Inner' in caplog.text


def test_the_recording_is_replaced_whole_with_the_usual_file_mode(tmp_path):
  path = tmp_path / 'r.bin'
  recorder._atomic_write(path, b'one')  # pylint: disable=protected-access
  umask = os.umask(0)
  os.umask(umask)
  assert path.read_bytes() == b'one' and (path.stat().st_mode & 0o777) == 0o666 & ~umask
  with pytest.raises(TypeError):
    recorder._atomic_write(path, 'not bytes')  # pylint: disable=protected-access
  assert path.read_bytes() == b'one' and sorted(p.name for p in tmp_path.iterdir()) == ['r.bin']


def test_directions_are_kept_in_memory_up_to_the_cache_size_exactly():
  for cache, kept in ((6 * DIM4 * 8, True), (6 * DIM4 * 8 - 1, False)):
    projector = recorder._Projector(SEED4, 6, cache)  # pylint: disable=protected-access
    flat = np.arange(DIM4, dtype=np.float64)
    got = projector(flat)
    assert (projector.matrix is not None) == kept and projector.dimension == DIM4
    np.testing.assert_allclose(got, [canaries.canary_direction(SEED4, i, DIM4) @ flat
                                     for i in range(6)], rtol=1e-13)
    np.testing.assert_array_equal(projector.direction(2, DIM4),
                                  canaries.canary_direction(SEED4, 2, DIM4))


def test_the_chain_of_wrapped_strategies_ends_and_never_loops():
  class W:
    def __init__(self, inner=None, strategy=None):
      self.inner, self.strategy = inner, strategy

  c = W()
  b = W(strategy=c)
  a = W(inner=b)
  assert list(recorder._chain(a)) == [a, b, c]  # pylint: disable=protected-access
  a.inner, c.strategy = b, a  # a cycle
  assert list(recorder._chain(a)) == [a, b, c]  # pylint: disable=protected-access
  assert list(recorder._chain(None)) == []  # pylint: disable=protected-access


class _Spends(_Stub):
  """A strategy with Flower's `privacy_spent()` over a real RdpAccountant, one release per
  aggregate; `bare` drops the accountant attribute (a wrapper of someone else's)."""

  def __init__(self, bare=False):
    super().__init__(_record(np.zeros(DIM4)))
    acc = RdpAccountant(PrivacyConfig(
        target_delta=1e-5, population_size=6, neighboring_relation=NeighboringRelation.
        REPLACE_ONE, sampling_method=SamplingMethod.WITHOUT_REPLACEMENT), orders=(2.0, 8.0))
    self._acc = acc
    if not bare:
      self.accountant = acc
    self.noise_multiplier, self.clipping_norm, self.num_sampled_clients = 2.0, 0.5, 6

  def aggregate_train(self, server_round, replies):
    self._acc.compose(GaussianPrivacyEvent(2.0, 6, 6))
    return super().aggregate_train(server_round, replies)

  def privacy_spent(self):
    return self._acc.get_privacy_spent()


def test_flowers_epsilon_after_every_round_is_recorded(tmp_path):
  nodes = [10, 11, 12, 13, 14, 15]
  grid = inprocess.InProcessGrid([canaries.canary_client_app] * 6, node_ids=nodes)
  inner = _Spends()
  strategy = recorder.CanaryAuditStrategy(inner, seed=SEED4, canary_norm=2.0, clip_norm=0.5,
                                          num_null=2, canary_nodes={12 + i: i for i in range(4)},
                                          directory=tmp_path)
  with inprocess.task_identity(grid.run.run_id, SUPERLINK_NODE_ID):
    for r in (1, 2):
      strategy.configure_train(r, _record(np.zeros(DIM4)), ConfigRecord(), grid)
      strategy.aggregate_train(r, [])
  first, second = (x.flower_epsilon for x in strategy.rounds)
  assert 0 < first < second == inner.privacy_spent().epsilon
  meta, rounds = recorder.load_rounds(tmp_path / recorder.ROUNDS_FILE)
  assert [x.flower_epsilon for x in rounds] == [first, second]
  assert meta['flower']['stated_relation'] == 'replace-one'
  assert meta['flower']['accountant_state'] == inner.accountant.state_dict()
  assert meta['flower']['wrapper_settings'] == {'noise_multiplier': 2.0, 'clipping_norm': 0.5,
                                                'num_sampled_clients': 6}
  bare = recorder.flower_stated(_Spends(bare=True))
  assert (bare['stated_relation'], bare['stated_sampling'], bare['accountant_state']) == (
      'None', 'None', None)
  assert bare['stated_epsilon'] == 0.0 and bare['wrapper'] == '_Spends'
