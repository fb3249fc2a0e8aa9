"""The ServerApp: Flower's FedAvg (optionally in Flower's server-side DP wrapper) and a recorder.

`RecordingFedAvg` is FedAvg that keeps what the server sees of the audited node: the model
it sent each round and the model the node uploaded (flat parameter vectors), the uploaded
and the sent model's loss on every input-space canary, the node's metrics (its Opacus
epsilons, noise multiplier, sample rate, steps), and, when the node sends them, its noisy
steps projected on the canary directions (the ConfigRecord 'audit', which FedAvg leaves
alone: it aggregates the one ArrayRecord and the one MetricRecord). Error replies are kept with their reason (Opacus refusing a model, say). After
the last round `main` writes it all to `<record-dir>/record.npz` (with the canaries' coins
and pool, redrawn from the run config by the same numpy code the node used); the
audit (fl_privacy.flower.audits.opacus_record) reads that file, outside the app. With
`client-canaries` k > 0 the vendored `CanaryAuditStrategy` (fl_privacy_canary_strategy.py)
wraps the strategy outermost and records the k client-level canary SuperNodes' rounds to
`<record-dir>/canary_rounds.npz` (fl_privacy.flower.audits.user_app audits it).
"""

from __future__ import annotations

import io
import json
import pathlib
import time
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, RdpAccountant, ServerApp
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig
from flwr.supercore.privacy_accounting import SamplingMethod

from torch_audit_app import client_app
from torch_audit_app import fl_privacy_canary_strategy
from torch_audit_app import task

app = ServerApp()
CLIENT_DP = ('none', 'server_fixed', 'local_dp')


def _flat(arrays: ArrayRecord, model: torch.nn.Module) -> np.ndarray:
  model.load_state_dict(arrays.to_torch_state_dict())
  return task.flat_parameters(model)


class RecordingFedAvg(FedAvg):
  """FedAvg that records what the server sees of the audited node (module docstring)."""

  def __init__(self, run_config: dict[str, Any], canaries: dict[str, np.ndarray] | None,
               **kw):
    super().__init__(**kw)
    self.cfg = dict(run_config)
    self.canaries = canaries
    self.model = task.make_model(task.model_name(self.cfg), int(self.cfg['seed']))
    self.sent: dict[int, ArrayRecord] = {}
    self.rows: list[dict[str, Any]] = []
    self.steps: list[np.ndarray] = []
    self.step_round: list[int] = []
    self.errors: list[str] = []
    self.round_seconds: list[float] = []
    self._t0 = 0.0
    self._round = 0

  def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                      grid: Grid):
    self._t0 = time.monotonic()
    self._round = server_round
    self.sent[server_round] = ArrayRecord(arrays.to_torch_state_dict())
    return super().configure_train(server_round, arrays, config, grid)

  # Flower's fixed-clipping wrapper accounts only around FedAvg's own aggregate_train, so the
  # recorder reads the replies where FedAvg checks them (errors kept, valid ones recorded).
  def _check_and_log_replies(self, replies, is_train: bool, validate: bool = True):
    valid, errors = super()._check_and_log_replies(replies, is_train, validate)
    if is_train:
      for msg in errors:
        if msg.has_error():
          self.errors.append(f'round {self._round}: {msg.error.reason}')
      for msg in valid:
        if 'audit' in msg.content:
          self._record(self._round, msg)
      self.round_seconds.append(time.monotonic() - self._t0)
    return valid, errors

  def _record(self, server_round: int, msg: Message) -> None:
    audit = msg.content['audit']  # a ConfigRecord: FedAvg aggregates arrays and metrics only
    if 'steps' in audit:
      steps = np.load(io.BytesIO(audit['steps']), allow_pickle=False)
      self.steps.append(steps)
      self.step_round += [server_round] * len(steps)
    sent, up = self.sent[server_round], msg.content['arrays']
    row = {'round': server_round, 'sent': _flat(sent, self.model)}
    c = self.canaries
    if c is not None and len(c['input_y']):
      row['input_loss_sent'] = task.per_example_loss(self.model, c['input_x'], c['input_y'])
    row['upload'] = _flat(up, self.model)
    if c is not None and len(c['grad_coins']):
      lo, hi = c['pool']
      delta = (row['upload'] - row['sent'])[lo:hi].astype(np.float32)
      row['upload_projection'] = c['directions'] @ delta  # canaries', then the null's
    if c is not None and len(c['input_y']):
      row['input_loss_upload'] = task.per_example_loss(self.model, c['input_x'], c['input_y'])
    m = msg.content['metrics']
    for k in ('epsilon-rdp', 'epsilon-prv', 'noise-multiplier', 'sample-rate', 'steps-total',
              'steps-round', 'num-examples'):
      row[k] = float(m[k])
    self.rows.append(row)

  def record(self) -> dict[str, np.ndarray]:
    """What was recorded, as arrays (the keys of record.npz)."""
    out: dict[str, np.ndarray] = {}
    if self.rows:
      for k in self.rows[0]:
        out[k.replace('-', '_')] = np.stack([np.asarray(r[k]) for r in self.rows])
    out['steps'] = (np.concatenate(self.steps) if self.steps
                    else np.zeros((0, 0), np.float32))
    out['step_round'] = np.asarray(self.step_round, np.int64)
    if self.canaries is not None:
      for k in ('grad_coins', 'pool', 'input_coins'):
        out[k] = self.canaries[k]
    out['round_seconds'] = np.asarray(self.round_seconds)
    out['errors'] = np.asarray(json.dumps(self.errors))
    out['run_config'] = np.asarray(json.dumps(self.cfg))
    return out


def serve(grid: Grid, run_config: dict[str, Any]) -> dict[str, np.ndarray]:
  """Runs the rounds on `grid`; what the recorder kept, with the test accuracy and loss of
  the global model before the first round and after each (`test_accuracy`, `test_loss`)."""
  cfg = dict(run_config)
  dp = str(cfg.get('client-dp', 'none'))
  if dp not in CLIENT_DP:
    raise ValueError(f'client-dp must be one of {CLIENT_DP} (got {dp!r})')
  model = task.make_model(task.model_name(cfg), int(cfg['seed']))
  x, _ = task.test_split(str(cfg.get('data-npz', '')))
  c = None
  if int(cfg['grad-canaries']) + int(cfg['input-canaries']) > 0:
    c = client_app.node_canaries(cfg, model, x.shape[1:])
  nodes = len(list(grid.get_node_ids()))
  strategy = RecordingFedAvg(cfg, c, fraction_train=1.0, fraction_evaluate=0.0,
                             min_train_nodes=nodes, min_available_nodes=nodes)
  outer = strategy
  if dp == 'server_fixed':
    # With Flower's own accountant, so that the wrapper states its epsilon (privacy_spent():
    # per client, add/remove one, no amplification claimed: every node every round).
    accountant = RdpAccountant(PrivacyConfig(
        target_delta=float(cfg['target-delta']), population_size=nodes,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=SamplingMethod.NO_AMPLIFICATION))
    outer = DifferentialPrivacyServerSideFixedClipping(
        strategy, noise_multiplier=float(cfg['client-dp-noise']),
        clipping_norm=float(cfg['client-dp-clip']), num_sampled_clients=nodes,
        accountant=accountant)
  xt, yt = task.test_split(str(cfg.get('data-npz', '')))
  evals: list[tuple[float, float]] = []
  evaluator = task.make_model(task.model_name(cfg), int(cfg['seed']))

  def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    evaluator.load_state_dict(arrays.to_torch_state_dict())
    loss, acc = task.evaluate(evaluator, xt, yt)
    evals.append((loss, acc))
    return MetricRecord({'test-loss': loss, 'test-accuracy': acc})

  audit = None
  if int(cfg.get('client-canaries', 0)) > 0:
    # Client level: the vendored recording strategy, outermost (canary SuperNodes answer its
    # query; it writes canary_rounds.npz to record-dir after every round).
    audit = fl_privacy_canary_strategy.CanaryAuditStrategy(
        outer, seed=int(cfg['canary-seed']), canary_norm=float(cfg['client-canary-norm']),
        clip_norm=float(cfg['client-dp-clip']), delta=float(cfg['target-delta']),
        num_canaries=int(cfg['client-canaries']),
        directory=str(cfg.get('record-dir', '')) or None)
    outer = audit
  outer.start(grid, ArrayRecord(model.state_dict()), num_rounds=int(cfg['num-server-rounds']),
              evaluate_fn=evaluate_fn)
  out = strategy.record()
  out['test_loss'] = np.asarray([e[0] for e in evals])
  out['test_accuracy'] = np.asarray([e[1] for e in evals])
  out['num_nodes'] = np.asarray(nodes)
  if audit is not None:
    out['client_canary_meta'] = np.asarray(json.dumps(audit.meta(), default=float))
  return out


def write(record: dict[str, np.ndarray], record_dir: str) -> pathlib.Path:
  path = pathlib.Path(record_dir)
  path.mkdir(parents=True, exist_ok=True)
  tmp = path / 'record.tmp.npz'
  np.savez(tmp, **record)
  tmp.replace(path / 'record.npz')
  return path / 'record.npz'


@app.main()
def main(grid: Grid, context: Context) -> None:
  record = serve(grid, dict(context.run_config))
  if str(context.run_config.get('record-dir', '')):
    write(record, str(context.run_config['record-dir']))
