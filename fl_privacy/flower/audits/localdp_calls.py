"""LocalDpMod's two DP functions and the whole `LocalDpMod.__call__`, called as Flower calls
them (flwr 1.42), for the DP-bug catalog's Flower entries (`fl_privacy.attacks.audit.bug_flower`
builds the games; this module is the only place they touch Flower, inside the optional extra).
"""

from __future__ import annotations

import logging

import numpy as np

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType
from flwr.app import MetricRecord, RecordDict
from flwr.clientapp.mod import LocalDpMod
from flwr.supercore import differential_privacy as fdp
from flwr.supercore.task_identity import TaskIdentity


def clip_and_noise(rng: np.random.Generator, base: np.ndarray, update: np.ndarray, clip: float,
                   std: float) -> np.ndarray:
  """One reply `base + update` through `compute_clip_model_update` and
  `add_gaussian_noise_inplace` (what LocalDpMod does), numpy's global generator seeded from
  `rng` (Flower draws its noise from it)."""
  np.random.seed(int(rng.integers(2**32)))
  params = [(base.astype(np.float64) + update).astype(np.float32)]
  fdp.compute_clip_model_update(params, [base.copy()], clip)
  fdp.add_gaussian_noise_inplace(params, std)
  return params[0]


def through_mod(rng: np.random.Generator, base: np.ndarray, update: np.ndarray, clip: float,
                sensitivity: float, epsilon: float, delta: float) -> np.ndarray:
  """The same reply through the whole `LocalDpMod.__call__` (Flower's Message layer)."""
  np.random.seed(int(rng.integers(2**32)))
  mod = LocalDpMod(clip, sensitivity, epsilon, delta)
  params = (base.astype(np.float64) + update).astype(np.float32)

  def reply(m, c):
    del c
    return Message(RecordDict({'arrays': ArrayRecord({'w': Array(params.copy())}),
                               'metrics': MetricRecord({'num-examples': 1})}), reply_to=m)
  saved = tuple(getattr(TaskIdentity, f'_{k}') for k in ('run_id', 'node_id', 'task_id'))
  flwr_logger = logging.getLogger('flwr')
  level = flwr_logger.level
  try:
    # Flower's Message reads the running task's identity (set by its runtime).
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    flwr_logger.setLevel(logging.ERROR)
    msg = Message(RecordDict({'arrays': ArrayRecord({'w': Array(base.copy())}),
                              'config': ConfigRecord({'server-round': 1})}), 1,
                  MessageType.TRAIN)
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    out = mod(msg, ctx, reply)
  finally:
    (TaskIdentity._run_id, TaskIdentity._node_id,  # pylint: disable=protected-access
     TaskIdentity._task_id) = saved  # pylint: disable=protected-access
    flwr_logger.setLevel(level)
  if out.has_error():
    raise RuntimeError(f'LocalDpMod replied with an error: {out.error.reason}')
  _, record = next(iter(out.content.array_records.items()))
  return np.asarray(record['w'].numpy())
