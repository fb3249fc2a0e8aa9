"""A JAX/Flax Flower `ClientApp` for fl_privacy's models and data (no PyTorch).

`make_client_app` returns a `flwr.clientapp.ClientApp` with a `train` and an `evaluate`
function. A node finds its data by `context.node_config['partition-id']` (what Flower's
simulation engine and `inprocess.InProcessGrid` set; a deployed SuperNode sets it with
`--node-config "partition-id=<k>"`).

train: reads the model from the message's only `ArrayRecord` (`bridge.from_array_record`,
checked against the template), runs E epochs of local FedAvg (`fl.local.client_update`, hooks
optional) with key `fl.rounds.client_key(key, server_round - 1, partition_id)` (the key
`fl.rounds.run` gives client k in round t), and replies with the trained parameters under the
same record name plus a `MetricRecord` `metrics` holding `num-examples` (FedAvg's weight) and
`train_loss` (mean loss of the trained model on the shard). The server round comes from
the `server-round` entry of the message's `ConfigRecord` (Flower's strategies write it).
With an `upload` hook (a defense) the reply is w_t - upload, what `attacks.dishonest.play`
lets the server see.

evaluate: `num-examples`, `eval_loss`, `eval_acc` of the received model on the node's
evaluation shard (its training shard when no evaluation shards are given).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_privacy import data as data_lib
from fl_privacy.fl import client as client_lib
from fl_privacy.fl import local
from fl_privacy.fl import losses
from fl_privacy.fl import rounds
from fl_privacy.flower import bridge

PARTITION_KEY = 'partition-id'
ROUND_KEY = 'server-round'
WEIGHT_KEY = 'num-examples'
METRICS_KEY = 'metrics'


def shards_from_dataset(dataset: data_lib.Dataset, parts: Sequence[np.ndarray]
                        ) -> list[tuple[np.ndarray, np.ndarray]]:
  """(float inputs, int32 labels) of `dataset` restricted to each index array of `parts`."""
  x = data_lib.to_float(dataset.x)
  return [(x[idx], dataset.y[idx].astype(np.int32)) for idx in parts]


def server_round(content: RecordDict) -> int:
  """The `server-round` entry of the message's `ConfigRecord`s (ValueError when absent)."""
  for record in content.config_records.values():
    if ROUND_KEY in record:
      return int(record[ROUND_KEY])
  raise ValueError(f"the message carries no '{ROUND_KEY}' in a ConfigRecord (Flower's "
                   'strategies write it in configure_train)')


def partition_id(context: Context, num_partitions: int) -> int:
  """The node's shard index from `context.node_config`, checked against the shard count."""
  if PARTITION_KEY not in context.node_config:
    raise ValueError(f"node {context.node_id} has no '{PARTITION_KEY}' in its node_config")
  k = int(context.node_config[PARTITION_KEY])
  if not 0 <= k < num_partitions:
    raise ValueError(f"node {context.node_id}: '{PARTITION_KEY}' {k} is not in "
                     f'[0, {num_partitions})')
  return k


def _train(loss_fn, optimizer, epochs, batch_size, hooks, params, x, y, key):
  upload, trained = local.client_update(loss_fn, params, x, y, key=key, hooks=hooks,
                                        optimizer=optimizer, epochs=epochs,
                                        batch_size=batch_size)
  if hooks is not None and hooks.upload is not client_lib.IDENTITY.upload:
    trained = client_lib.apply_update(params, upload)
  return trained, loss_fn(trained, x, y)


def _evaluate(apply_fn, params, x, y):
  logits = apply_fn(params, x)
  loss = jnp.mean(losses.per_example_cross_entropy(logits, y))
  return loss, jnp.mean((jnp.argmax(logits, -1) == y).astype(jnp.float32))


def make_client_app(model, shards: Sequence[tuple[Any, Any]], *, key: jax.Array, optimizer,
                    epochs: int, batch_size: int, template: Any = None,
                    eval_shards: Sequence[tuple[Any, Any]] | None = None,
                    hooks: client_lib.ClientHooks | None = None,
                    matmul_precision: str | None = None) -> ClientApp:
  """A Flower `ClientApp` training `model` with local FedAvg on `shards[partition-id]`.

  Args:
    model: A Flax module; the exchanged pytree is its variables (`model.init`'s output).
    shards: Per partition (float inputs [N_k, ...], int labels [N_k]).
    key: Run key; node k's key in server round r is `rounds.client_key(key, r - 1, k)`.
    optimizer: The clients' optax transformation (fresh state each round).
    epochs: Local epochs E.
    batch_size: B (each epoch takes N_k // B minibatches, as `fl.local.fedavg`).
    template: The variables' structure, dtypes and shapes; None: `jax.eval_shape` of
      `model.init` on one example of shard 0.
    eval_shards: Per partition evaluation data; None evaluates on the training shard.
    hooks: The clients' `fl.client.ClientHooks` (a defense); None is plain FedAvg.
    matmul_precision: `jax.default_matmul_precision` of training and evaluation (e.g.
      'highest', what `attacks.dishonest.play` uses: on GPUs the default TF32 matmuls can
      blur a detector with eps = 1e-3); None keeps JAX's default.

  Returns:
    The `ClientApp`.
  """
  if not shards:
    raise ValueError('make_client_app needs at least one shard')
  if eval_shards is not None and len(eval_shards) != len(shards):
    raise ValueError(f'{len(eval_shards)} evaluation shards for {len(shards)} shards')
  data = [(jnp.asarray(x), jnp.asarray(y, jnp.int32)) for x, y in shards]
  evals = data if eval_shards is None else [(jnp.asarray(x), jnp.asarray(y, jnp.int32))
                                            for x, y in eval_shards]
  if template is None:
    template = jax.eval_shape(model.init, jax.random.key(0), data[0][0][:1])
  loss_fn = losses.make_loss_fn(model.apply)
  train_fn = jax.jit(functools.partial(_train, loss_fn, optimizer, int(epochs),
                                       int(batch_size), hooks))
  eval_fn = jax.jit(functools.partial(_evaluate, model.apply))
  app = ClientApp()

  def precision():
    return (contextlib.nullcontext() if matmul_precision is None
            else jax.default_matmul_precision(matmul_precision))

  @app.train()
  def train(msg: Message, context: Context) -> Message:
    k = partition_id(context, len(data))
    name, record = bridge.only_array_record(msg.content)
    params = bridge.from_array_record(record, template)
    t = server_round(msg.content) - 1
    x, y = data[k]
    with precision():
      trained, loss = train_fn(params, x, y, rounds.client_key(key, t, k))
    metrics = MetricRecord({WEIGHT_KEY: int(x.shape[0]), 'train_loss': float(loss)})
    return Message(RecordDict({name: bridge.to_array_record(trained), METRICS_KEY: metrics}),
                   reply_to=msg)

  @app.evaluate()
  def evaluate(msg: Message, context: Context) -> Message:
    k = partition_id(context, len(evals))
    _, record = bridge.only_array_record(msg.content)
    params = bridge.from_array_record(record, template)
    x, y = evals[k]
    with precision():
      loss, acc = eval_fn(params, x, y)
    metrics = MetricRecord({WEIGHT_KEY: int(x.shape[0]), 'eval_loss': float(loss),
                            'eval_acc': float(acc)})
    return Message(RecordDict({METRICS_KEY: metrics}), reply_to=msg)

  return app

