"""The `reconstruction` part of `flower_audit` (opt-in, issue 30): the imprint server in Flower.

A deployment of `num_nodes` Flower ClientApps (`client.make_client_app`) whose model carries
the imprint block of Fowl et al. (ICLR 2022) in front of the audit's model
(`attacks.reconstruction.imprint.inject`), each holding `per_client` IID digits of the train
split, is driven for one round by Flower's FedAvg loop on the in-process grid, wrapped in
`ReconstructionStrategy` (`strategies.reconstruction`): every node receives a model crafted
with its own key
(thresholds at the mean-brightness quantiles of the test split, the distribution the server
knows), trains it for real (E epochs of B) and replies; the server recovers its inputs from the
reply. The `native` deployment is the same attack in fl_privacy's own simulation: the same
crafted model, shard, client key and optimizer through `fl.local.client_update` (what
`fl.rounds` runs), read by the same `ReconstructionStrategy.recover`. Both are scored against
each node's true inputs (`attacks.reconstruction.metrics.trial_scores`: one-to-one matching,
exact = max abs error < 1/255).
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
from fl_privacy import validate
from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.attacks.reconstruction import metrics as rec_metrics
from fl_privacy.eval import stats
from fl_privacy.fl import local
from fl_privacy.fl import losses
from fl_privacy.fl import rounds
from fl_privacy.flower import bridge
from fl_privacy.flower import client as client_lib
from fl_privacy.flower.audits import dp_games
from fl_privacy.flower.engines import dispatch
from fl_privacy.flower.engines import jobs
from fl_privacy.flower.parts import common
from fl_privacy.flower.parts import config_checks
from fl_privacy.flower.strategies import reconstruction as strategies_reconstruction
from fl_privacy.report import point_key


PREFIX = 'flower_audit.reconstruction'
# The one attacked round: the server is dishonest from the start, so the native simulation
# starts from the same model without re-running honest rounds.
ROUND = 1

_POSITIVE_INT = config_checks.POSITIVE_INT
_POSITIVE = validate.number(0, low_open=True)


def validate_section(config) -> None:
  """Checks every field of `flower_audit.reconstruction` (nothing loaded)."""
  r = config.flower_audit.reconstruction
  for field in ('num_nodes', 'per_client', 'batch_size', 'local_epochs', 'num_bins',
                'bootstrap_resamples'):
    validate.checked(config, f'{PREFIX}.{field}', _POSITIVE_INT)
  for field in ('learning_rate', 'scale', 'restore_scale', 'psnr_threshold'):
    validate.checked(config, f'{PREFIX}.{field}', _POSITIVE)
  validate.one_of(config, f'{PREFIX}.statistic', imprint.STATISTICS)
  validate.checked(config, f'{PREFIX}.num_bins', validate.Rule(
      f'>= per_client ({r.per_client}): each example needs a bin of its own',
      lambda n: int(n) >= int(r.per_client)))


def prepare(config, state) -> None:
  """The checks that need the data."""
  r = config.flower_audit.reconstruction
  n = len(state['train'])
  validate.require(int(r.num_nodes) * int(r.per_client) <= n, f'{PREFIX}.num_nodes',
                   f'num_nodes x per_client <= {n} training examples', int(r.num_nodes))


def _fedavg(k: int) -> FedAvg:
  with dp_games.quiet_flower():
    return FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=k,
                  min_available_nodes=k)


def _native_trained(model, optimizer, epochs: int, batch_size: int):
  loss_fn = losses.make_loss_fn(model.apply)

  @jax.jit
  def trained(params, x, y, key):
    return local.client_update(loss_fn, params, x, y, key=key, optimizer=optimizer,
                               epochs=epochs, batch_size=batch_size)[1]
  return trained


def _inputs(config, key, train=None, test=None, model=None) -> dict[str, Any]:
  """What every process of the imprint deployment derives from the config and the run key:
  shards, thresholds, the model with its imprint block, w_0 and the keys."""
  if train is None or test is None:
    splits = data_lib.load(config.data)
    train, test = splits['train'], splits['test']
  if model is None:
    model = common.make_model(config, train)
  r = config.flower_audit.reconstruction
  k, bins = int(r.num_nodes), int(r.num_bins)
  parts = data_lib.beta_partition(point_key(key, {'partition': 'reconstruction'}), train.y,
                                  k, math.inf, int(r.per_client))
  shards = client_lib.shards_from_dataset(train, parts)
  model = imprint.inject(model, bins)
  init_key, train_key, craft_key = (point_key(key, {'reconstruction': name})
                                    for name in ('init', 'train', 'craft'))
  return dict(shards=shards, model=model, variables=model.init(init_key, shards[0][0][:1]),
              cuts=imprint.thresholds(data_lib.to_float(test.x), bins, r.statistic),
              train_key=train_key, craft_key=craft_key,
              optimizer=optax.sgd(float(r.learning_rate)))


def _unpack(args) -> tuple[Any, dict[str, Any]]:
  key = jax.random.wrap_key_data(np.asarray(args['key']))
  return args['config'], _inputs(args['config'], key)


def job_client(args):
  """The nodes' ClientApp of the imprint deployment (a `jobs.Job` of part
  'reconstruction')."""
  config, n = _unpack(args)
  r = config.flower_audit.reconstruction
  # 'highest': TF32 matmuls on a GPU would blur the one-bin differences the attack reads.
  return client_lib.make_client_app(n['model'], n['shards'], key=n['train_key'],
                                    optimizer=n['optimizer'], epochs=int(r.local_epochs),
                                    batch_size=int(r.batch_size), template=n['variables'],
                                    matmul_precision='highest')


def job_server(args, grid) -> dict[str, Any]:
  """One round of `ReconstructionStrategy` against every node (crafting keys by partition):
  per partition the recovery (inputs, valid, bins; None when its reply failed) and the
  crafted variables it was sent."""
  config, n = _unpack(args)
  r = config.flower_audit.reconstruction
  nodes = grid.get_node_ids()
  strategy = strategies_reconstruction.ReconstructionStrategy(
      _fedavg(len(nodes)), n['variables'], n['cuts'], key=n['craft_key'], nodes=nodes,
      rounds=[ROUND], scale=float(r.scale), restore_scale=float(r.restore_scale),
      aggregate_targets=True, key_ids=grid.partitions)
  with dp_games.quiet_flower(py_logging.WARNING):
    strategy.start(grid, bridge.to_array_record(n['variables']), num_rounds=1)
  by_node = {rec.node_id: rec for rec in strategy.recoveries}
  return dict(recoveries=[(by_node[v].inputs, by_node[v].valid, by_node[v].bins)
                          if v in by_node else None for v in nodes],
              sent=[strategy.sent.get((ROUND, v)) for v in nodes])


def deployments(config, state, key, workdir: str | None = None) -> dict[str, Any]:
  """Both deployments' recoveries (cached in `state['cache']`): per deployment a list of
  (inputs, valid, bins) in partition order, the nodes' true inputs and the node ids. The
  Flower deployment runs on `flower_audit.engine`."""
  cache = state['cache']
  if 'reconstruction' in cache:
    return cache['reconstruction']
  r = config.flower_audit.reconstruction
  n = _inputs(config, key, state['train'], state['test'], state['model'])
  k = int(r.num_nodes)
  logging.info('flower_audit: imprint server on engine %s, %d ClientApps of %d digits, B = %d, '
               'E = %d', common.engine(config), k, int(r.per_client), int(r.batch_size),
               int(r.local_epochs))
  job = jobs.Job('reconstruction', k, dict(config=config, key=np.asarray(jax.random.key_data(
      key))), seed=int(jax.random.bits(point_key(key, {'reconstruction': 'server_seed'}),
                                       dtype=np.uint32)))
  out = dispatch.run_job(common.engine(config), job,
                         common.job_workdir(workdir, 'reconstruction'))
  trained_fn = _native_trained(n['model'], n['optimizer'], int(r.local_epochs),
                               int(r.batch_size))
  native = []
  for i, sent in enumerate(out['result']['sent']):
    x, y = n['shards'][i]
    with jax.default_matmul_precision('highest'):
      trained = trained_fn(sent, x, y, rounds.client_key(n['train_key'], ROUND - 1, i))
    native.append(imprint_recover(n, r, sent, trained, len(x)))
  cache['reconstruction'] = dict(flower=out['result']['recoveries'], native=native,
                                 true=[x for x, _ in n['shards']], nodes=out['node_ids'],
                                 losses=out['losses'])
  return cache['reconstruction']


def imprint_recover(n, r, sent, trained, num_examples: int):
  """What the server recovers from `trained` (the native twin of a node's reply)."""
  strategy = strategies_reconstruction.ReconstructionStrategy(
      _fedavg(1), n['variables'], n['cuts'], key=n['craft_key'], nodes=[0],
      scale=float(r.scale), restore_scale=float(r.restore_scale))
  return strategy.recover(sent, jax.tree_util.tree_map(np.asarray, trained), num_examples)


def _difference(a, b) -> float:
  """Max |a - b| over two deployments' recoveries of the same nodes (inf when one is missing
  or they read different bins)."""
  worst = 0.0
  for p, q in zip(a, b):
    if p is None or q is None or not np.array_equal(p[2], q[2]):
      return float('inf')
    worst = max(worst, float(np.max(np.abs(p[0] - q[0]), initial=0.0)))
  return worst


def point(config, state, key, deployment: str, workdir: str | None = None
          ) -> tuple[dict, int]:
  """Per node and pooled: the fraction of its inputs recovered exactly and above the PSNR
  threshold (pooled: an interval with the node as the unit, `metrics.clustered_rate`, and
  Clopper-Pearson over examples as `*_example_ci_*`; per node: Clopper-Pearson), PSNR and
  SSIM of the matched pairs (bootstrap over nodes), and the largest difference between the
  Flower and native recoveries."""
  r = config.flower_audit.reconstruction
  run = deployments(config, state, key, workdir)
  scores = []
  for rec, true in zip(run[deployment], run['true']):
    if rec is None:  # the node's reply failed: nothing recovered
      scores.append(dict(n=len(true), recovered=0, exact=0, psnr_mean=float('nan'),
                         ssim_mean=float('nan')))
      continue
    scores.append(rec_metrics.trial_scores(rec[0], rec[1], true,
                                           psnr_threshold=float(r.psnr_threshold)))
  n = [s['n'] for s in scores]
  total = int(sum(n))
  metrics: dict[str, Any] = dict(
      n_nodes=len(scores), n_examples=total, psnr_threshold=float(r.psnr_threshold),
      node_ids=[int(v) for v in run['nodes']], node_examples=n,
      node_exact=[int(s['exact']) for s in scores],
      node_recovered=[int(s['recovered']) for s in scores],
      node_psnr=[float(s['psnr_mean']) for s in scores],
      node_ssim=[float(s['ssim_mean']) for s in scores],
      failed_nodes=sum(rec is None for rec in run[deployment]),
      max_abs_diff_flower_native=_difference(run['flower'], run['native']))
  intervals = [stats.clopper_pearson(int(s['exact']), int(s['n'])) for s in scores]
  metrics['node_exact_ci_low'] = [float(lo) for lo, _ in intervals]
  metrics['node_exact_ci_high'] = [float(hi) for _, hi in intervals]
  # The node is the unit (its inputs fail together when they share a bin), as in the native
  # experiment's headline; Clopper-Pearson over examples stays beside it.
  for name in ('exact', 'recovered'):
    metrics.update(rec_metrics.rate_fields(name, metrics[f'node_{name}'], n))
  metrics.update(stats.rate('all_exact', sum(e == m for e, m in zip(metrics['node_exact'], n)),
                            len(n)))
  rng = data_lib.rng_from_key(point_key(key, {'part': 'reconstruction', 'bootstrap': 1}))
  for name, values in (('psnr_mean', metrics['node_psnr']), ('ssim_mean', metrics['node_ssim'])):
    v = np.asarray(values, np.float64)
    metrics[name] = float(np.nanmean(v)) if np.isfinite(v).any() else float('nan')
    lo, hi = rec_metrics.bootstrap_mean(v, rng, int(r.bootstrap_resamples))
    metrics[f'{name}_ci_low'], metrics[f'{name}_ci_high'] = lo, hi
  return metrics, total


def point_params(config, deployment: str) -> dict:
  r = config.flower_audit.reconstruction
  return {'part': 'reconstruction', 'deployment': deployment, 'attack': 'imprint',
          'num_nodes': int(r.num_nodes), 'per_client': int(r.per_client),
          'batch_size': int(r.batch_size), 'epochs': int(r.local_epochs),
          'num_bins': int(r.num_bins)}
