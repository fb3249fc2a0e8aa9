"""A numpy-only job part for the engine tests (`jobs.Job('tests_engines.toy_part', ...)`):
FedAvg over a 3-vector, node k replies w + (k + 1); `args['actions']` makes node k raise or
sleep in round r, and `args['markers']` is a folder where each node marks the rounds it
started."""

from __future__ import annotations

import os
import time

import numpy as np

from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg


def job_client(args):
  app = ClientApp()

  @app.train()
  def train(msg, context):
    k = int(context.node_config['partition-id'])
    r = int(msg.content['config']['server-round'])
    if args.get('markers'):
      open(os.path.join(args['markers'], f'r{r}_p{k}'), 'w', encoding='utf-8').close()
    action = args.get('actions', {}).get((r, k), '')
    if action == 'raise':
      raise RuntimeError(f'partition {k} fails in round {r}')
    if action.startswith('sleep:'):
      time.sleep(float(action.split(':')[1]))
    w = msg.content['arrays']['w'].numpy()
    return Message(RecordDict({'arrays': ArrayRecord({'w': Array(w + np.float32(k + 1))}),
                               'metrics': MetricRecord({'num-examples': k + 1})}),
                   reply_to=msg)

  del train
  return app


def job_server(args, grid):
  n = args.get('min_nodes', len(grid.get_node_ids()))
  strategy = FedAvg(fraction_train=args.get('fraction', 1.0), fraction_evaluate=0.0,
                    min_train_nodes=1, min_available_nodes=n)
  models = []
  strategy.start(grid, ArrayRecord({'w': Array(np.zeros(3, np.float32))}),
                 num_rounds=int(args['rounds']),
                 evaluate_fn=lambda r, a: models.append(a['w'].numpy().copy()))
  return {'models': models}
