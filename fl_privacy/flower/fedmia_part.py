"""The `fedmia` and `dishonest` parts of `flower_audit` (split out of `pipeline`).

`flower_deployment` trains a FedAvg deployment of Flower `ClientApp`s on the in-process grid
(`runner.InProcessGrid`) wrapped in `RecordingStrategy` and measures the recorded rounds
(`strategies.recording_from_uploads`); `native_training` runs the same training in
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
"""

from __future__ import annotations

import logging as py_logging
import math
from typing import Any

from absl import logging
import numpy as np
import optax

from flwr.serverapp.strategy import FedAvg

from fl_privacy import data as data_lib
from fl_privacy.attacks.passive import evaluate as evaluate_lib
from fl_privacy.eval import stats
from fl_privacy.fl import recording as recording_lib
from fl_privacy.flower import bridge
from fl_privacy.flower import client as client_lib
from fl_privacy.flower import dp_audit
from fl_privacy.flower import runner
from fl_privacy.flower import strategies
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
  with dp_audit.quiet_flower():
    return FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=k,
                  min_available_nodes=k)


def _queries(state, parts):
  train, test = state['train'], state['test']
  return recording_lib.query_set(data_lib.to_float(train.x), train.y,
                                 data_lib.to_float(test.x), test.y, parts)


def flower_deployment(config, state, key, replicate: int = 0) -> dict[str, Any]:
  """Trains replicate `replicate` of the Flower deployment once (key fold_in(key, replicate);
  cached in `state`): the recording of the recorded rounds, the final model, the grid and the
  shards."""
  cache, name = state['cache'], ('flower', int(replicate))
  if name in cache:
    return cache[name]
  key = fedmia_replicates.key(key, replicate)
  s = config.flower_audit
  model, k = state['model'], int(s.num_clients)
  parts = shards(config, state, key)
  qx, qy, owner = _queries(state, parts)
  init_key, train_key = _keys(key)
  init = model.init(init_key, qx[:1])
  app = client_lib.make_client_app(
      model, client_lib.shards_from_dataset(state['train'], parts), key=train_key,
      optimizer=optimizer(config), epochs=int(s.local_epochs), batch_size=int(s.batch_size))
  grid = runner.InProcessGrid([app] * k)
  every = int(s.record_every)
  log = strategies.UploadLog()
  kept = lambda r: log(r) if r.server_round % every == 0 else None  # noqa: E731
  strategy = strategies.RecordingStrategy(_fedavg(k), init, observer=kept)
  logging.info('flower_audit: Flower FedAvg, %d ClientApps, %d rounds', k, int(s.num_rounds))
  with dp_audit.quiet_flower(py_logging.WARNING):
    result = runner.run(strategy, grid, bridge.to_array_record(init),
                        num_rounds=int(s.num_rounds))
  rec = strategies.recording_from_uploads(model.apply, log.rounds, qx, qy,
                                          chunk_size=int(s.chunk_size),
                                          node_ids=grid.get_node_ids())
  cache[name] = dict(recording=rec, owner=owner, final=result.arrays, grid=grid, parts=parts,
                     init=init)
  return cache[name]


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
  arrays = None if artifacts is None else artifacts.load(params)
  if arrays is None:
    train = flower_deployment if deployment == 'flower' else native_training
    run = train(config, state, key, replicate)
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


def dishonest_point(config, state, key) -> tuple[dict, int]:
  """DishonestStrategy against the trained deployment (replicate 0), one crafted round per
  target."""
  s, d = config.flower_audit, config.flower_audit.dishonest
  run = flower_deployment(config, state, key, 0)
  grid, parts, model = run['grid'], run['parts'], state['model']
  nodes = grid.get_node_ids()
  rng = data_lib.rng_from_key(point_key(key, {'part': 'dishonest', 'targets': 1}))
  train, test = state['train'], state['test']
  xf, test_x = data_lib.to_float(train.x), data_lib.to_float(test.x)
  targets = []  # (x, y, owner node index or -1)
  owners = rng.integers(0, len(parts), int(d.targets_in))
  for k in owners:
    i = int(rng.choice(parts[int(k)]))
    targets.append((xf[i], int(train.y[i]), int(k)))
  for i in rng.choice(len(test_x), int(d.targets_out), replace=False):
    targets.append((test_x[int(i)], int(test.y[int(i)]), -1))
  member, decided, in_target = [], [], []
  deltas = []
  for x, y, owner in targets:
    strategy = strategies.DishonestStrategy(
        _fedavg(len(nodes)), model, (x, y), nodes=nodes, num_components=int(d.num_components),
        optimizer=optimizer(config), batch_size=int(s.batch_size), epsilon=float(d.epsilon),
        threshold=float(d.threshold), aggregate_targets=True, template=run['init'])
    with dp_audit.quiet_flower(py_logging.WARNING):
      runner.run(strategy, grid, run['final'], num_rounds=1)
    for dec in strategy.decisions:
      k = nodes.index(dec.node_id)
      member.append(k == owner)
      decided.append(bool(dec.member))
      in_target.append(owner >= 0)
      deltas.append(float(dec.delta))
  member, decided = np.asarray(member), np.asarray(decided)
  in_target = np.asarray(in_target)
  n_pos, n_neg = int(member.sum()), int((~member).sum())
  metrics = {}
  metrics.update(stats.rate('tpr', int((decided & member).sum()), n_pos))
  metrics.update(stats.rate('fpr', int((decided & ~member).sum()), n_neg))
  out_neg = ~member & ~in_target
  metrics.update(stats.rate('fpr_out_targets', int((decided & out_neg).sum()),
                            int(out_neg.sum())))
  metrics.update(n_pos=n_pos, n_neg=n_neg, n_out_target_decisions=int(out_neg.sum()),
                 targets_in=int(d.targets_in), targets_out=int(d.targets_out),
                 nan_decisions=int(np.isnan(deltas).sum()),
                 delta_member_mean=float(np.nanmean(np.asarray(deltas)[member]))
                 if n_pos else float('nan'),
                 delta_nonmember_mean=float(np.nanmean(np.asarray(deltas)[~member]))
                 if n_neg else float('nan'))
  return metrics, n_pos + n_neg
