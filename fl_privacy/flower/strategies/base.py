"""Server-side strategies that audit a Flower deployment (Flower >= 1.42, Message API).

Both wrap an inner `flwr.serverapp.strategy.Strategy` (FedAvg, FedProx, a DP wrapper, ...) and
delegate `configure_train`, `aggregate_train`, `configure_evaluate`, `aggregate_evaluate` and
`summary` to it; the round loop is Flower's own `Strategy.start`, which calls those methods on
the wrapper. An inner strategy that overrides `start` is refused (its loop would be bypassed).

`RecordingStrategy` changes nothing: the inner strategy sees the same messages and replies
(the same objects) and returns the same aggregate. It records, per server round r (1-based),
the model the round started from (w_t, t = r - 1: the `arrays` handed to `configure_train`),
the model each node received when it differs from w_t, and every node's uploaded arrays with
its node id and weight (`RoundUploads`). Rounds go to an observer callable (`UploadLog` keeps
them in memory) and/or to `<directory>/round_<r:05d>.npz` (written atomically; `load_rounds`
reads them back). `recording_from_uploads` turns recorded rounds into the `fl.recording`
format (`loss`, `cos`, `diff` [R, K, Q], `grad_sq` [R, Q], `rounds` [R]) with
`fl.queries.measure` on the updates Delta = w_t - w_local.

`DishonestStrategy` is the dishonest server of Pichler et al. (`attacks.dishonest`): in an
attacked round it writes the 2M+1-ReLU detector of a target example into the round's model
(`dishonest.craft`, on the trunk the global model has) and sends that model, in a message of
its own, to each target node the inner strategy sampled; the other nodes get the inner
strategy's honest messages. From a target's upload it computes Eq. (9)'s statistic
(`dishonest.delta_statistic` against `dishonest.server_step`, the simulated step on the
target alone) and decides membership (`dishonest.decide`). The targets' replies are left out
of the aggregate unless `aggregate_targets` (they were trained from a crafted model).

`ReconstructionStrategy` is the dishonest server of Fowl et al. (ICLR 2022,
`attacks.reconstruction.imprint`): the deployment's clients train a model with an imprint
block in front (`imprint.inject`); in an attacked round the server writes the imprint layer
(`imprint.craft`, thresholds on a public statistic) into the round's model and sends it to each
sampled target node, then reads each target's inputs back from its reply: Delta = sent -
upload, `imprint.recover_update` with the reply's `num-examples` (`Recovery`).
"""

from __future__ import annotations

from typing import Any, Iterable

from absl import logging

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy



DEFAULT_WEIGHT_KEY = 'num-examples'


def check_inner(inner: Any, wrapper: str) -> Strategy:
  """`inner` if it is a Message-API strategy whose round loop is Flower's; else TypeError."""
  if not isinstance(inner, Strategy):
    legacy = ' (a legacy flwr.server.strategy strategy: use flwr.serverapp.strategy)' if (
        type(inner).__module__.startswith('flwr.server.')) else ''
    raise TypeError(
        f'{wrapper} wraps a Flower Message-API strategy, an instance of '
        f'flwr.serverapp.strategy.Strategy (e.g. flwr.serverapp.strategy.FedAvg); got '
        f'{type(inner).__module__}.{type(inner).__qualname__}{legacy}')
  if type(inner).start is not Strategy.start:
    raise TypeError(
        f'{wrapper} drives the rounds with flwr.serverapp.strategy.Strategy.start; '
        f'{type(inner).__qualname__} overrides start, whose loop the wrapper would bypass')
  return inner


class _Wrapper(Strategy):
  """Delegates every `Strategy` method to `self.inner`."""

  def __init__(self, inner: Strategy):
    self.inner = check_inner(inner, type(self).__name__)

  def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                      grid: Grid) -> Iterable[Message]:
    return self.inner.configure_train(server_round, arrays, config, grid)

  def aggregate_train(self, server_round: int, replies: Iterable[Message]
                      ) -> tuple[ArrayRecord | None, MetricRecord | None]:
    return self.inner.aggregate_train(server_round, replies)

  def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                         grid: Grid) -> Iterable[Message]:
    return self.inner.configure_evaluate(server_round, arrays, config, grid)

  def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                         ) -> MetricRecord | None:
    return self.inner.aggregate_evaluate(server_round, replies)

  def summary(self) -> None:
    logging.info('%s around %s', type(self).__name__, type(self.inner).__name__)
    self.inner.summary()


def _weight_key(inner: Strategy) -> str:
  return str(getattr(inner, 'weighted_by_key', DEFAULT_WEIGHT_KEY))


def _weight(content: RecordDict, key: str) -> float:
  for record in content.metric_records.values():
    if key in record and not isinstance(record[key], list):
      return float(record[key])
  return float('nan')


def _same_arrays(a: ArrayRecord, b: ArrayRecord) -> bool:
  if a is b:
    return True
  return list(a.keys()) == list(b.keys()) and all(
      a[k].dtype == b[k].dtype and tuple(a[k].shape) == tuple(b[k].shape) and
      a[k].data == b[k].data for k in a.keys())
