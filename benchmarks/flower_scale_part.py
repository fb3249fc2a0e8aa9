"""The recording workload of `benchmarks.flower_engines` as a `jobs.Job` part
(`jobs.Job('benchmarks.flower_scale_part', ...)`): N Flower nodes training Flower's tutorial
CNN on one digit each (plain SGD, B = 1, E = 1, `client.make_client_app`), FedAvg sampling a
fraction of them each round (Flower's own sampling), wrapped in `RecordingStrategy` (every
upload of every round kept in memory, as the FedMIA part keeps its recorded rounds)."""

from __future__ import annotations

import logging as py_logging
import time

import jax
import numpy as np
import optax

from flwr.serverapp.strategy import FedAvg

from fl_privacy import data as data_lib
from fl_privacy import models
from fl_privacy.flower import bridge
from fl_privacy.flower import client as client_lib
from fl_privacy.flower.audits import dp_games
from fl_privacy.flower.strategies import recording


def _inputs(args):
  train = data_lib.load(args['data'])['train']
  model = models.FlowerCNN(train.num_classes, padding='SAME')
  n = int(args['num_nodes'])
  parts = [np.asarray([i % len(train)]) for i in range(n)]
  init = model.init(jax.random.key(0), data_lib.to_float(train.x[:1]))
  return train, model, parts, init


def job_client(args):
  train, model, parts, init = _inputs(args)
  return client_lib.make_client_app(model, client_lib.shards_from_dataset(train, parts),
                                    key=jax.random.key(1), optimizer=optax.sgd(0.1), epochs=1,
                                    batch_size=1, template=init)


def job_server(args, grid):
  _, _, _, init = _inputs(args)
  n = int(args['num_nodes'])
  log = recording.UploadLog()
  stamps = []

  def observe(uploads):
    stamps.append(time.perf_counter())
    log(uploads)
  with dp_games.quiet_flower():
    inner = FedAvg(fraction_train=float(args['fraction']), fraction_evaluate=0.0,
                   min_available_nodes=n, min_train_nodes=1)
  strategy = recording.RecordingStrategy(inner, init, observer=observe)
  start = time.perf_counter()
  with dp_games.quiet_flower(py_logging.WARNING):
    strategy.start(grid, bridge.to_array_record(init), num_rounds=int(args['rounds']))
  return {'uploads_per_round': [len(r.node_ids) for r in log.rounds],
          'round_seconds': list(np.diff([start] + stamps))}
