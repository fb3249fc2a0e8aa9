"""The `fedmia` part of `flower_audit`, and the trained deployment `parts.dishonest` attacks.

`flower_deployment` trains a FedAvg deployment of Flower `ClientApp`s on the engine of
`flower_audit.engine` wrapped in `RecordingStrategy` and measures the recorded rounds
(`recording.recording_from_uploads`); `native_training` runs the same training in
fl_privacy's own simulation (`fl.recording.record_shards`); `fedmia_point` scores one attack
on one of them (`attacks.passive.evaluate.evaluate`, aligned scoring) and `dishonest_point`
runs `DishonestStrategy` (one crafted round per target) against the trained deployment.

Replicates: `flower_audit.replicates` = R independent deployments of the FedMIA part, replicate
r trained with key fold_in(run key, r) (shards, w_0 and the nodes' keys; the native training
of replicate r uses the same key, so the two stay comparable). Each replicate's recording is
stored on its own under `<workdir>/deployments/` (resumed without retraining); a point's
metrics are `pipelines.fedmia_replicates.combine` of its replicates' (`eval.replicated`: the
headline is the mean over replicates, `interval_method` names its interval, the
single-deployment intervals sit under `conditional`). The dishonest part attacks replicate 0.
Live trainings are cached in the pipeline's `state['cache']`.

Engines (`flower_audit.engine`, `dispatch.run_job`): each deployment is a `jobs.Job` (part
'fedmia': the recorded training of one replicate; 'dishonest': the crafted rounds from its
final model), run in process, on Flower's Simulation Engine or on a local Deployment Engine;
the nodes rebuild their model, shards and keys from the job (`job_client`), the server side is
`job_server` / `dishonest_server`. A run that lost a reply (a node's error, a timeout, a node
gone) raises `jobs.EngineError` naming the rounds and partitions (`check_complete`).
"""

from __future__ import annotations

import logging as py_logging
import math
from typing import Any

from absl import logging
import jax
import numpy as np
import optax

from flwr.serverapp.strategy import FedAvg

from fl_privacy import data as data_lib
from fl_privacy.attacks.passive import evaluate as evaluate_lib
from fl_privacy.fl import recording as recording_lib
from fl_privacy.flower import bridge
from fl_privacy.flower import client as client_lib
from fl_privacy.flower.audits import dp_games
from fl_privacy.flower.engines import dispatch
from fl_privacy.flower.engines import jobs
from fl_privacy.flower.parts import common
from fl_privacy.flower.strategies import recording as strategies_recording
from fl_privacy.pipelines import fedmia_replicates
from fl_privacy.report import ArtifactStore
from fl_privacy.report import point_key


# Folder of the stored per-replicate recordings.
RECORDINGS = 'deployments'

def optimizer(config):
  s = config.flower_audit
  return optax.sgd(float(s.learning_rate), momentum=float(s.momentum) or None)


def shards(config, state, key) -> list[np.ndarray]:
  s = config.flower_audit
  return data_lib.beta_partition(point_key(key, {'partition': 1}), state['train'].y,
                                 int(s.num_clients), math.inf, int(s.per_client))


def _keys(key):
  return point_key(key, {'init': 1}), point_key(key, {'train': 1})


def _fedavg(k: int) -> FedAvg:
  """FedAvg over all k nodes, no federated evaluation (its warning about that silenced)."""
  with dp_games.quiet_flower():
    return FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=k,
                  min_available_nodes=k)


def _queries(state, parts):
  train, test = state['train'], state['test']
  return recording_lib.query_set(data_lib.to_float(train.x), train.y,
                                 data_lib.to_float(test.x), test.y, parts)


def _node_inputs(config, key, replicate: int, train=None, model=None) -> dict[str, Any]:
  """What every process of replicate `replicate`'s deployment derives from the config and the
  run key alone: the model, the shards' indices, w_0 and the nodes' training key."""
  if train is None:
    train = data_lib.load(config.data)['train']
  if model is None:
    model = common.make_model(config, train)
  key = fedmia_replicates.key(key, replicate)
  parts = shards(config, {'train': train}, key)
  init_key, train_key = _keys(key)
  init = model.init(init_key, data_lib.to_float(train.x[:1]))
  return dict(train=train, model=model, parts=parts, init=init, train_key=train_key)


def _job_args(config, key, replicate: int, **extra) -> dict[str, Any]:
  return dict(config=config, key=np.asarray(jax.random.key_data(key)), replicate=int(replicate),
              **extra)


def _unpack(args) -> tuple[Any, jax.Array, dict[str, Any]]:
  key = jax.random.wrap_key_data(np.asarray(args['key']))
  return args['config'], key, _node_inputs(args['config'], key, args['replicate'])


def job_client(args):
  """The nodes' ClientApp of a FedMIA deployment (a `jobs.Job` of part 'fedmia')."""
  config, _, n = _unpack(args)
  s = config.flower_audit
  return client_lib.make_client_app(
      n['model'], client_lib.shards_from_dataset(n['train'], n['parts']), key=n['train_key'],
      optimizer=optimizer(config), epochs=int(s.local_epochs), batch_size=int(s.batch_size),
      template=n['init'])


def job_server(args, grid) -> dict[str, Any]:
  """FedAvg over every node for `num_rounds`, wrapped in `RecordingStrategy`: the recorded
  rounds (`RoundUploads`, every `record_every`-th) and the final model (numpy)."""
  config, _, n = _unpack(args)
  s = config.flower_audit
  k = int(s.num_clients)
  every = int(s.record_every)
  log = strategies_recording.UploadLog()
  kept = lambda r: log(r) if r.server_round % every == 0 else None  # noqa: E731
  strategy = strategies_recording.RecordingStrategy(_fedavg(k), n['init'], observer=kept)
  with dp_games.quiet_flower(py_logging.WARNING):
    result = strategy.start(grid, bridge.to_array_record(n['init']),
                            num_rounds=int(s.num_rounds))
  return dict(rounds=log.rounds, final=bridge.from_array_record(result.arrays, n['init']))


def fedmia_job(config, key, replicate: int) -> jobs.Job:
  s = config.flower_audit
  return jobs.Job('fedmia', int(s.num_clients), _job_args(config, key, replicate),
                  seed=_seed(key, replicate, 'fedmia'))


def _seed(key, replicate: int, name: str) -> int:
  return int(jax.random.bits(point_key(fedmia_replicates.key(key, replicate),
                                       {'server_seed': name}), dtype=np.uint32))


def flower_deployment(config, state, key, replicate: int = 0,
                      workdir: str | None = None) -> dict[str, Any]:
  """Trains replicate `replicate` of the Flower deployment once on `flower_audit.engine`
  (key fold_in(key, replicate); cached in `state`): the recording of the recorded rounds (nodes
  by partition), the final model, the shards and what the run lost."""
  cache, name = state['cache'], ('flower', int(replicate))
  if name in cache:
    return cache[name]
  s = config.flower_audit
  n = _node_inputs(config, key, replicate, state['train'], state['model'])
  qx, qy, owner = _queries(state, n['parts'])
  logging.info('flower_audit: Flower FedAvg on engine %s, %d ClientApps, %d rounds',
               common.engine(config), int(s.num_clients), int(s.num_rounds))
  out = dispatch.run_job(common.engine(config), fedmia_job(config, key, replicate),
                         common.job_workdir(workdir, f'fedmia_{int(replicate)}'))
  check_complete(out, 'the FedMIA deployment')
  rec = strategies_recording.recording_from_uploads(
      state['model'].apply, out['result']['rounds'], qx, qy, chunk_size=int(s.chunk_size),
      node_ids=out['node_ids'])
  cache[name] = dict(recording=rec, owner=owner, final=out['result']['final'],
                     parts=n['parts'], init=n['init'], losses=out['losses'])
  return cache[name]


def check_complete(out: dict[str, Any], what: str) -> None:
  """EngineError naming the rounds and nodes a run lost: the audit needs every reply."""
  if out['losses']:
    lost = ', '.join(f"round {x['round']} partition {x['partition']} ({x['reason']})"
                     for x in out['losses'][:5])
    more = len(out['losses']) - 5
    raise jobs.EngineError(f'{what} lost {len(out["losses"])} replies: {lost}'
                           + (f' and {more} more' if more > 0 else ''))


def native_training(config, state, key, replicate: int = 0) -> dict[str, Any]:
  """Replicate `replicate`'s training in fl_privacy's simulation (`fl.recording.record_shards`,
  the Flower deployment's key fold_in(key, replicate)), cached."""
  cache, name = state['cache'], ('native', int(replicate))
  if name in cache:
    return cache[name]
  key = fedmia_replicates.key(key, replicate)
  s = config.flower_audit
  parts = shards(config, state, key)
  init_key, train_key = _keys(key)
  rec = recording_lib.record_shards(
      state['model'], init_key, state['train'], state['test'], parts, label='native',
      key=train_key, num_rounds=int(s.num_rounds), record_every=int(s.record_every),
      optimizer=optimizer(config), epochs=int(s.local_epochs), batch_size=int(s.batch_size),
      chunk_size=int(s.chunk_size))
  cache[name] = dict(recording=rec, owner=rec['owner'])
  return cache[name]


def recording(config, state, key, deployment: str, replicate: int,
              workdir: str | None = None) -> dict[str, np.ndarray]:
  """Replicate `replicate`'s recording (with its `owner`): read from `<workdir>/deployments/`,
  else trained and saved there on its own, so an interrupted run resumes at the first
  replicate not stored (no `workdir`: trained, not stored)."""
  artifacts = None if workdir is None else ArtifactStore(workdir, RECORDINGS)
  params = {'deployment': deployment, 'replicate': int(replicate)}
  if deployment == 'flower':  # another engine's recording is not this run's
    params['engine'] = common.engine(config)
  arrays = None if artifacts is None else artifacts.load(params)
  if arrays is None:
    run = (flower_deployment(config, state, key, replicate, workdir) if deployment == 'flower'
           else native_training(config, state, key, replicate))
    arrays = dict(run['recording'], owner=run['owner'])
    if artifacts is not None:
      artifacts.save(params, arrays)
  return arrays


def fedmia_point(config, state, key, deployment: str, attack: str,
                 workdir: str | None = None) -> tuple[dict, int]:
  """One attack on one deployment over `flower_audit.replicates` replicates (module
  docstring)."""
  s = config.flower_audit
  per = []
  for r in range(int(s.replicates)):
    rec = recording(config, state, key, deployment, r, workdir)
    # The same numpy stream for both deployments (common random numbers).
    rng = data_lib.rng_from_key(point_key(fedmia_replicates.key(key, r),
                                          {'part': 'fedmia', 'attack': attack}))
    entries = {}
    m = evaluate_lib.evaluate(rec, rec['owner'], attack, scoring='aligned', single_index=-1,
                              default_filter=s.outlier_filter, rng=rng, entries_out=entries)
    per.append((m, entries))
  metrics = fedmia_replicates.combine(
      per, rng=data_lib.rng_from_key(point_key(key, {'part': 'fedmia', 'attack': attack,
                                                     'replicated': 1})),
      num_resamples=evaluate_lib.BOOT_RESAMPLES)
  metrics.update(recorded_rounds=[int(r) + 1 for r in np.asarray(rec['rounds'])],
                 num_clients=int(s.num_clients))
  return metrics, int(metrics.get('n_pos', 0)) + int(metrics.get('n_neg', 0))
