"""A user's own Flower App, audited with canary SuperNodes (tests_engines/test_own_app.py).

What docs/experiments/flower_own_app.md asks of a user, on a numpy model of four float32
arrays: their ClientApp (`user_app`: node k moves the model halfway to a target of its own,
weight 10) wrapped by `own_app.with_canaries` (`client_app`), and their ServerApp
(`server_app`): Flower's FedAvg in DifferentialPrivacyServerSideFixedClipping with Flower's
RdpAccountant, wrapped by `own_app.CanaryAuditStrategy`, which learns the canary nodes by its
query. `serve(grid, config)` is the ServerApp's body, so the same run goes on an
`InProcessGrid` too. It writes, under `config['out']`, the audit (`canary_audit.json`), the
recorded projections (`canary_rounds.npz`) and `final.npz` (the final model and the
evaluate metrics).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Mapping

os.environ.setdefault('FLWR_TELEMETRY_ENABLED', '0')

# pylint: disable=wrong-import-position
import numpy as np

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, RdpAccountant, ServerApp
from flwr.serverapp import strategy as flwr_strategy
from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig
from flwr.supercore.privacy_accounting import SamplingMethod

from fl_privacy.flower.audits import user_app as user_app_lib
from fl_privacy.flower.audits import user_rounds
from fl_privacy.flower.audits import user_strategy
from fl_privacy.flower.engines import jobs

SHAPES = {'kernel': (64, 30), 'bias': (30,), 'head': (30, 3), 'head_bias': (3,)}
DIM = sum(int(np.prod(s)) for s in SHAPES.values())
EXAMPLES = 10
# The run config's defaults (the test's pyproject declares the same keys).
CONFIG = {'out': '', 'seed': 5, 'canary-seed': 0, 'rounds': 2, 'noise': 1.0, 'clip': 1.0,
          'canary-norm': 2.0, 'num-nodes': 6, 'delta': 1e-5, 'num-null': 64}


def initial_model() -> ArrayRecord:
  rng = np.random.default_rng(0)
  return ArrayRecord({k: Array((0.1 * rng.standard_normal(s)).astype(np.float32))
                      for k, s in SHAPES.items()})


def _flat(record: ArrayRecord) -> np.ndarray:
  return np.concatenate([np.asarray(a, np.float64).ravel() for a in record.to_numpy_ndarrays()])


def _target(context: Context) -> np.ndarray:
  return np.random.default_rng(1000 + int(context.node_config['partition-id'])).standard_normal(
      DIM) * 0.1


user_app = ClientApp()


@user_app.train()
def _train(msg: Message, context: Context) -> Message:
  record = msg.content['arrays']
  w = _flat(record)
  new = w + 0.5 * (_target(context) - w)
  out, offset = {}, 0
  for k, a in zip(record.keys(), record.to_numpy_ndarrays()):
    out[k] = Array(new[offset:offset + a.size].reshape(a.shape).astype(a.dtype))
    offset += a.size
  return Message(RecordDict({'arrays': ArrayRecord(out), 'metrics': MetricRecord(
      {'train_loss': float(np.sum((w - _target(context)) ** 2)), 'num-examples': EXAMPLES})}),
                 reply_to=msg)


@user_app.evaluate()
def _evaluate(msg: Message, context: Context) -> Message:
  w = _flat(msg.content['arrays'])
  return Message(RecordDict({'metrics': MetricRecord(
      {'eval_loss': float(np.sum((w - _target(context)) ** 2)), 'num-examples': EXAMPLES})}),
                 reply_to=msg)


client_app = user_app_lib.with_canaries(user_app)


def canary_configs(num_canaries: int, seed: int, config: Mapping[str, Any] = CONFIG
                   ) -> list[dict[str, Any]]:
  """The canary SuperNodes' node configs for this app (its metric keys, its weight)."""
  return user_rounds.canary_node_configs(
      num_canaries, seed=seed, canary_norm=float(config['canary-norm']),
      clip_norm=float(config['clip']), **{'num-examples': EXAMPLES,
                                         'canary-metrics': 'train_loss',
                                         'canary-eval-metrics': 'eval_loss'})


def serve(grid: Grid, config: Mapping[str, Any]) -> dict[str, Any]:
  """The ServerApp's body: FedAvg in Flower's server-side fixed clipping (its accountant),
  under the canary audit; returns the audit and writes it, the rounds and the final model."""
  config = {**CONFIG, **dict(config)}
  n = int(config['num-nodes'])
  fedavg = flwr_strategy.FedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=n,
                                min_evaluate_nodes=n, min_available_nodes=n)
  accountant = RdpAccountant(PrivacyConfig(
      target_delta=float(config['delta']), population_size=n,
      neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
      sampling_method=SamplingMethod.NO_AMPLIFICATION))
  dp = flwr_strategy.DifferentialPrivacyServerSideFixedClipping(
      fedavg, float(config['noise']), float(config['clip']), n, accountant=accountant)
  out = pathlib.Path(str(config['out']))
  strategy = user_strategy.CanaryAuditStrategy(
      dp, seed=int(config['canary-seed']), canary_norm=float(config['canary-norm']),
      clip_norm=float(config['clip']), delta=float(config['delta']),
      num_null=int(config['num-null']), directory=out)
  # Flower's noise (numpy) and sampling (Python's random) from the run's seed, as a user who
  # wants a reproducible run would.
  with jobs.seeded(int(config['seed'])):
    result = strategy.start(grid, initial_model(), num_rounds=int(config['rounds']))
  audit = strategy.audit()
  evaluate = {str(r): dict(m) for r, m in result.evaluate_metrics_clientapp.items()}
  np.savez(out / 'final.npz', model=_flat(result.arrays),
           evaluate=np.asarray(json.dumps(evaluate)))
  return audit


server_app = ServerApp()


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
  serve(grid, context.run_config)
