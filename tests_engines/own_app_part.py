"""A user's own Flower App audited with canary SuperNodes (tests_engines/test_own_app.py).

The test lays out the app as a user would (docs/experiments/flower_own_app.md): a folder with
a pyproject.toml that declares only flwr and numpy and a package `my_app` holding this file
as `my_app/task.py` beside the two vendored in-app files
(`python -m fl_privacy.flower.inapp.vendor my_app/`). Nothing here imports fl-privacy, so it
is never imported as `tests_engines.own_app_part`.

The model is four float32 arrays. The ClientApp (`user_app`: node k moves the model halfway to
a target of its own, weight 10) is wrapped by `with_canaries` (`client_app`); the ServerApp
(`server_app`) runs Flower's FedAvg in DifferentialPrivacyServerSideFixedClipping with
Flower's RdpAccountant, wrapped by `CanaryAuditStrategy`, which learns the canary nodes by its
query and records the rounds under `config['out']` (`canary_rounds.npz`). `serve(grid,
config)` is the ServerApp's body, so the same run goes on an in-process grid too; it also
writes `final.npz` (the final model, the evaluate metrics, and the heavy modules its process
had imported).
"""

from __future__ import annotations

import json
import pathlib
import random
import sys
from typing import Any, Mapping

import numpy as np

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, RdpAccountant, ServerApp
from flwr.serverapp import strategy as flwr_strategy
from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig
from flwr.supercore.privacy_accounting import SamplingMethod

from . import fl_privacy_canaries as canaries  # pylint: disable=relative-beyond-top-level
from . import fl_privacy_canary_strategy as recorder  # pylint: disable=relative-beyond-top-level

SHAPES = {'kernel': (64, 30), 'bias': (30,), 'head': (30, 3), 'head_bias': (3,)}
DIM = sum(int(np.prod(s)) for s in SHAPES.values())
EXAMPLES = 10
# The run config's defaults (the test's pyproject declares the same keys).
CONFIG = {'out': '', 'seed': 5, 'canary-seed': 0, 'rounds': 2, 'noise': 1.0, 'clip': 1.0,
          'canary-norm': 2.0, 'num-nodes': 6, 'delta': 1e-5, 'num-null': 64}
HEAVY = ('jax', 'flax', 'optax', 'tensorflow', 'ml_collections', 'fl_privacy')


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


client_app = canaries.with_canaries(user_app)


def canary_configs(num_canaries: int, seed: int, config: Mapping[str, Any] = CONFIG
                   ) -> list[dict[str, Any]]:
  """The canary SuperNodes' node configs for this app (its metric keys, its weight)."""
  return canaries.canary_node_configs(
      num_canaries, seed=seed, canary_norm=float(config['canary-norm']),
      clip_norm=float(config['clip']), **{'num-examples': EXAMPLES,
                                         'canary-metrics': 'train_loss',
                                         'canary-eval-metrics': 'eval_loss'})


def serve(grid: Grid, config: Mapping[str, Any]) -> recorder.CanaryAuditStrategy:
  """The ServerApp's body: FedAvg in Flower's server-side fixed clipping (its accountant),
  under the canary recording; writes the rounds and `final.npz`."""
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
  strategy = recorder.CanaryAuditStrategy(
      dp, seed=int(config['canary-seed']), canary_norm=float(config['canary-norm']),
      clip_norm=float(config['clip']), num_null=int(config['num-null']), directory=out)
  # Flower's noise (numpy) and sampling (Python's random) from the run's seed, as a user who
  # wants a reproducible run would; restored after.
  saved = random.getstate(), np.random.get_state()
  random.seed(int(config['seed']))
  np.random.seed(int(config['seed']))
  try:
    result = strategy.start(grid, initial_model(), num_rounds=int(config['rounds']))
  finally:
    random.setstate(saved[0])
    np.random.set_state(saved[1])
  evaluate = {str(r): dict(m) for r, m in result.evaluate_metrics_clientapp.items()}
  heavy = sorted(m for m in sys.modules if m.split('.')[0] in HEAVY)
  np.savez(out / 'final.npz', model=_flat(result.arrays),
           evaluate=np.asarray(json.dumps(evaluate)), heavy=np.asarray(json.dumps(heavy)))
  return strategy


server_app = ServerApp()


@server_app.main()
def _main(grid: Grid, context: Context) -> None:
  serve(grid, context.run_config)
