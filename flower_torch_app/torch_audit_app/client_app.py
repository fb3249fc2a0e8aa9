"""The ClientApp: one node's local DP-SGD round with Opacus (Flower's Message API).

Every node trains its shard (node config `partition-id` / `num-partitions`) with Opacus's
`PrivacyEngine.make_private` (Poisson sampling, per-example clipping at `max-grad-norm`,
Gaussian noise, its RDP accountant) from the round's global model, and replies the model it
reached (`arrays`) with metrics: `num-examples`, `train-loss`, the noise multiplier and
sample rate the accountant read, the steps so far, and `epsilon-rdp` / `epsilon-prv`: the
epsilon at `target-delta` of this node's whole training so far (Opacus's RDP and PRV
accountants over the history the node keeps in `context.state`; unit: one example,
add/remove-one neighbours, Poisson sampling; adversary: anyone who sees every noisy step,
so also the server seeing the node's uploads).

The node `audited-partition` also holds the record-level canaries (`canaries.py`; each IN by
a fair coin) and, with `record-steps`, replies every noisy step projected on the canaries' directions in a
`ConfigRecord` 'audit' (FedAvg aggregates only the reply's ArrayRecord and MetricRecord). With
`client-dp = "local_dp"` every node's reply also passes Flower's `LocalDpMod` (client-level
local DP on the update). Client-level canary SuperNodes (node config `canary-index`, the
vendored `fl_privacy_canaries.with_canaries`) reply a crafted update instead of training; the
app-level mods (LocalDpMod) act on them as on every node.
"""

from __future__ import annotations

import io
import logging
import warnings

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import LocalDpMod
from opacus import PrivacyEngine
from torch import nn

from torch_audit_app import canaries as canaries_lib
from torch_audit_app import fl_privacy_canaries
from torch_audit_app import opacus_hooks
from torch_audit_app import task

warnings.filterwarnings('ignore', category=UserWarning)
logging.getLogger('opacus').setLevel(logging.ERROR)

STATE = 'opacus-history'  # the node's accountant history across rounds (context.state)


def local_dp_option(msg: Message, context: Context, call_next):
  """Flower's `LocalDpMod` on the reply when the run config asks for it (mods are fixed when
  the app is built; the run config is known only per message)."""
  cfg = context.run_config
  if str(cfg.get('client-dp', 'none')) != 'local_dp':
    return call_next(msg, context)
  mod = LocalDpMod(clipping_norm=float(cfg['client-dp-clip']),
                   sensitivity=float(cfg['client-dp-clip']),
                   epsilon=float(cfg['client-dp-epsilon']), delta=float(cfg['target-delta']))
  return mod(msg, context, call_next)


# The app's own ClientApp; `app` (what pyproject.toml names) is it wrapped by the vendored
# `with_canaries`: a node whose node config has `canary-index` is a client-level canary
# SuperNode (fl_privacy_canaries.py), every other node runs this app unchanged.
torch_app = ClientApp(mods=[local_dp_option])


def node_canaries(cfg, model: nn.Module, image_shape) -> dict[str, np.ndarray]:
  lo, hi = canary_pool(model)
  return canaries_lib.draw(int(cfg['canary-seed']), int(cfg['grad-canaries']),
                           int(cfg['input-canaries']), (lo, hi), tuple(image_shape),
                           task.NUM_CLASSES)


def canary_pool(model: nn.Module) -> tuple[int, int]:
  """The flat coordinates of the largest parameter tensor (the gradient canaries' pool)."""
  sizes = [p.numel() for p in task._plain(model).parameters()]  # pylint: disable=protected-access
  j = int(np.argmax(sizes))
  lo = int(sum(sizes[:j]))
  return lo, lo + sizes[j]


def _seed(*parts: int) -> int:
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def _history(context: Context) -> list[tuple[float, float, int]]:
  if STATE not in context.state:
    return []
  r = context.state[STATE]
  return list(zip(r['z'], r['q'], r['n']))


def _save_history(context: Context, history) -> None:
  z, q, n = zip(*history)
  context.state[STATE] = ConfigRecord({'z': [float(v) for v in z], 'q': [float(v) for v in q],
                                       'n': [int(v) for v in n]})


def _bytes(a: np.ndarray) -> bytes:
  buf = io.BytesIO()
  np.save(buf, a, allow_pickle=False)
  return buf.getvalue()


@torch_app.train()
def train(msg: Message, context: Context) -> Message:
  cfg = context.run_config
  pid = int(context.node_config['partition-id'])
  parts = int(context.node_config['num-partitions'])
  server_round = int(msg.content['config']['server-round'])
  plant = str(cfg.get('plant', 'none'))
  x, y = task.partition(pid, parts, str(cfg.get('data-npz', '')))
  model = task.make_model(task.model_name(cfg), int(cfg['seed']))
  model.load_state_dict(msg.content['arrays'].to_torch_state_dict())
  audited = pid == int(cfg['audited-partition']) and (
      int(cfg['grad-canaries']) + int(cfg['input-canaries']) > 0)
  tags = -np.ones(len(y), np.int64)
  c = None
  if audited:
    c = node_canaries(cfg, model, x.shape[1:])
    x, y, tags = canaries_lib.with_canaries(x, y, c)
  torch.manual_seed(_seed(int(cfg['seed']), pid, server_round))
  batch = int(cfg['batch-size'])
  data = task.loader(x, y, tags, batch)
  steps_round = int(cfg['local-epochs']) * len(data)
  z = float(cfg['noise-multiplier'])
  if float(cfg.get('target-epsilon', 0.0)) > 0:
    z = task.pick_noise(float(cfg['target-epsilon']), float(cfg['target-delta']),
                        1.0 / len(data), int(cfg['num-server-rounds']) * steps_round)
  optimizer = torch.optim.SGD(model.parameters(), lr=float(cfg['learning-rate']))
  engine = PrivacyEngine(accountant='rdp')
  # Opacus refuses a model it cannot make private (BatchNorm): the ClientApp raises, and the
  # run's error reply says why (the recorder keeps it).
  model, optimizer, data = engine.make_private(
      module=model, optimizer=optimizer, data_loader=data, noise_multiplier=z,
      max_grad_norm=float(cfg['max-grad-norm']), poisson_sampling=plant != 'no_poisson')
  opacus_hooks.apply_plant(optimizer, plant, float(cfg.get('plant-factor', 0.25)))
  recorder = None
  grads = audited and len(c['grad_coins']) > 0
  if grads and bool(cfg.get('record-steps', True)):
    recorder = opacus_hooks.StepRecorder(optimizer, c['pool'], c['directions'])
  losses = []
  model.train()
  for _ in range(int(cfg['local-epochs'])):
    for xb, yb, tb in data:
      optimizer.zero_grad()
      # sum / n: the mean over a non-empty batch (Opacus's loss_reduction 'mean'), and a
      # finite zero on an empty Poisson batch.
      loss = nn.functional.cross_entropy(model(xb), yb, reduction='sum') / max(len(yb), 1)
      loss.backward()
      if grads:
        opacus_hooks.insert_gradient_canaries(
            optimizer, tb, c['pool'], c['directions'],
            float(cfg['canary-norm']) * float(cfg['max-grad-norm']))
      optimizer.step()
      losses.append(float(loss))
  history = _history(context) + list(engine.accountant.history)
  _save_history(context, history)
  eps = task.accountant_epsilons(history, float(cfg['target-delta']))
  metrics = MetricRecord({
      'num-examples': int(len(y)), 'train-loss': float(np.mean(losses)) if losses else 0.0,
      'epsilon-rdp': eps['rdp'], 'epsilon-prv': eps['prv'], 'noise-multiplier': z,
      'sample-rate': float(history[-1][1]),
      'steps-total': int(sum(n for _, _, n in history)), 'steps-round': int(steps_round)})
  content = RecordDict({'arrays': ArrayRecord(task._plain(model).state_dict()),  # pylint: disable=protected-access
                        'metrics': metrics})
  if audited:
    audit = {'partition-id': pid}
    if recorder is not None:
      audit['steps'] = _bytes(recorder.array())
    content['audit'] = ConfigRecord(audit)
  return Message(content=content, reply_to=msg)


app = fl_privacy_canaries.with_canaries(torch_app)
