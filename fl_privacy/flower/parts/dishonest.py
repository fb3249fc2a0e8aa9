"""The `dishonest` part of `flower_audit`: `DishonestStrategy` against the trained FedMIA
deployment (replicate 0), one crafted round per target (`parts.fedmia` docstring).
"""

from __future__ import annotations

import logging as py_logging

import numpy as np

from fl_privacy import data as data_lib
from fl_privacy.eval import stats
from fl_privacy.flower import bridge
from fl_privacy.flower.audits import dp_games
from fl_privacy.flower.engines import dispatch
from fl_privacy.flower.engines import jobs
from fl_privacy.flower.parts import common
from fl_privacy.flower.parts import fedmia
from fl_privacy.flower.strategies import dishonest as strategies_dishonest
from fl_privacy.report import point_key


dishonest_client = fedmia.job_client


def dishonest_server(args, grid) -> list[list[tuple[int, bool, float]]]:
  """One crafted round per target (`DishonestStrategy`, from the trained model `final`):
  per target, (node id, decision, delta) of every node, in partition order."""
  config, _, n = fedmia._unpack(args)
  s, d = config.flower_audit, config.flower_audit.dishonest
  nodes = grid.get_node_ids()
  out = []
  for x, y in args['targets']:
    strategy = strategies_dishonest.DishonestStrategy(
        fedmia._fedavg(len(nodes)), n['model'], (x, y), nodes=nodes,
        num_components=int(d.num_components), optimizer=fedmia.optimizer(config),
        batch_size=int(s.batch_size), epsilon=float(d.epsilon), threshold=float(d.threshold),
        aggregate_targets=True, template=n['init'])
    with dp_games.quiet_flower(py_logging.WARNING):
      strategy.start(grid, bridge.to_array_record(args['final']), num_rounds=1)
    out.append([(int(dec.node_id), bool(dec.member), float(dec.delta))
                for dec in strategy.decisions])
  return out


def dishonest_point(config, state, key, workdir: str | None = None) -> tuple[dict, int]:
  """DishonestStrategy against the trained deployment (replicate 0), one crafted round per
  target, on `flower_audit.engine` (a deployment of its own after the training's)."""
  s, d = config.flower_audit, config.flower_audit.dishonest
  run = fedmia.flower_deployment(config, state, key, 0, workdir)
  parts = run['parts']
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
  job = jobs.Job('dishonest', int(s.num_clients), fedmia._job_args(
      config, key, 0, targets=[(x, y) for x, y, _ in targets], final=run['final']),
                 seed=fedmia._seed(key, 0, 'dishonest'))
  out = dispatch.run_job(common.engine(config), job, common.job_workdir(workdir, 'dishonest'))
  fedmia.check_complete(out, 'the dishonest server\'s deployment')
  member, decided, in_target = [], [], []
  deltas = []
  for (_, _, owner), decisions in zip(targets, out['result']):
    for node, dec, delta in decisions:
      k = out['partitions'][node]
      member.append(k == owner)
      decided.append(dec)
      in_target.append(owner >= 0)
      deltas.append(delta)
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
