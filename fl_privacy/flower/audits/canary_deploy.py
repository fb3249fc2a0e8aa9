"""The canary audit's Flower deployment: the nodes' ClientApp (canary and real clients, in
the setting's DP wrapper), the server's strategy, the job's two sides (`engines.jobs`,
part 'training') and `deploy`, which runs it on an engine (`audits.canaries` docstring).
"""

from __future__ import annotations

import functools
import logging as py_logging
import math
import time
from typing import Any

import jax
import jax.flatten_util  # pylint: disable=unused-import
import numpy as np

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import LocalDpMod, adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp import RdpAccountant
from flwr.serverapp import strategy as flwr_strategy
from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig
from flwr.supercore.privacy_accounting import SamplingMethod

from fl_privacy.flower import client as client_lib
from fl_privacy.flower.audits import canary_design
from fl_privacy.flower.audits import dp_games
from fl_privacy.flower.audits import dp_setting
from fl_privacy.flower.engines import dispatch
from fl_privacy.flower.engines import jobs


def client_app(setting: dp_setting.Setting, design: canary_design.Design, included: np.ndarray,
               directions: np.ndarray, real, seed: int = 0) -> ClientApp:
  """One `ClientApp` for every node (its `partition-id` says which): real node k < num_real
  replies w_t + real[t - 1, k] (`real` the fixed updates [T, num_real, d]) or what `real`
  trains (a `RealTrainer`: `real(w_t, t, k)`); canary i = k - num_real replies
  w_t + canary_norm C v_i when included, w_t + 1e-6 C v_i otherwise. It carries the
  setting's Flower mod."""
  mods = {'client_fixed': [fixedclipping_mod], 'client_adaptive': [adaptiveclipping_mod],
          'local_dp': [LocalDpMod(setting.clipping_norm, setting.sensitivity, setting.epsilon,
                                  setting.delta)]}.get(setting.wrapper, [])
  app = ClientApp(mods=[seeding_mod(seed)] + mods)
  c = float(setting.clipping_norm)
  num_real = int(design.num_real)

  @app.train()
  def train(msg: Message, context: Context) -> Message:
    k = int(context.node_config['partition-id'])
    r = client_lib.server_round(msg.content)
    name, record = next(iter(msg.content.array_records.items()))
    w = np.asarray(record[canary_design.ARRAY_NAME].numpy(), np.float64)
    if k < num_real and callable(real):
      reply = real(w, r, k)
    else:
      if k < num_real:
        update = real[r - 1, k]
      else:
        i = k - num_real
        update = directions[i] * c * (float(design.canary_norm) if included[i]
                                      else canary_design.IDLE)
      reply = (w + update).astype(np.float32)
    arrays = ArrayRecord({canary_design.ARRAY_NAME: Array(reply)})
    return Message(RecordDict({name: arrays, 'metrics': MetricRecord({'num-examples': 1})}),
                   reply_to=msg)

  return app


class _Sampling(flwr_strategy.FedAvg):
  """Flower's FedAvg, unchanged, keeping the node ids it sampled each round (`sampled`, one
  list a round: what the server knows). Only `configure_train` is overridden: the fixed
  wrappers' accountant requires FedAvg's own `aggregate_train`."""

  def __init__(self, **kw):
    super().__init__(**kw)
    self.sampled: list[list[int]] = []

  def configure_train(self, server_round, arrays, config, grid):
    messages = list(super().configure_train(server_round, arrays, config, grid))
    self.sampled.append([int(msg.metadata.dst_node_id) for msg in messages])
    return messages


class _Uploads(_Sampling):
  """FedAvg that reads every canary upload (LocalDpMod's all-iterates adversary: the server
  sees each upload): per round, canary i's upload minus the round's model, projected on v_i
  (`projections` [T, m]; NaN for a canary not sampled that round)."""

  def __init__(self, canary_nodes: list[int], directions: np.ndarray, **kw):
    super().__init__(**kw)
    self.canary_nodes = {n: i for i, n in enumerate(canary_nodes)}
    self.directions = directions
    self.model = None
    self.projections: list[np.ndarray] = []

  def configure_train(self, server_round, arrays, config, grid):
    self.model = np.asarray(arrays[canary_design.ARRAY_NAME].numpy(), np.float64)
    return super().configure_train(server_round, arrays, config, grid)

  def aggregate_train(self, server_round, replies):
    replies = list(replies)
    row = np.full(len(self.canary_nodes), np.nan)
    for reply in replies:
      i = self.canary_nodes.get(reply.metadata.src_node_id)
      if i is not None and not reply.has_error():
        v = next(iter(reply.content.array_records.values()))[canary_design.ARRAY_NAME].numpy()
        row[i] = float(np.dot(np.asarray(v, np.float64) - self.model, self.directions[i]))
    self.projections.append(row)
    return super().aggregate_train(server_round, replies)


def _accountant(setting: dp_setting.Setting, n: int) -> RdpAccountant:
  return RdpAccountant(PrivacyConfig(
      target_delta=float(setting.delta), population_size=int(n),
      neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
      sampling_method=SamplingMethod.NO_AMPLIFICATION))


def build_strategy(setting: dp_setting.Setting, design: canary_design.Design,
                   canary_nodes: list[int], directions: np.ndarray):
  """Flower's FedAvg (`_Sampling`: it keeps whom it sampled) training k = `sample_size` of
  the n nodes each round (all of them at fraction_train 1), wrapped in the setting's DP
  wrapper with `num_sampled_clients` k (the fixed ones with Flower's own `RdpAccountant`
  over the population n, no amplification); LocalDpMod: `_Uploads` (it keeps uploads too)."""
  n, k = design.num_nodes, design.sample_size
  kw = dict(fraction_train=float(design.fraction_train), fraction_evaluate=0.0,
            min_train_nodes=k, min_available_nodes=n)
  if setting.wrapper == 'local_dp':
    return _Uploads(canary_nodes, directions, **kw)
  inner = _Sampling(**kw)
  if setting.wrapper in dp_setting.ADAPTIVE:
    cls = (flwr_strategy.DifferentialPrivacyServerSideAdaptiveClipping
           if setting.wrapper == 'server_adaptive' else
           flwr_strategy.DifferentialPrivacyClientSideAdaptiveClipping)
    return cls(inner, setting.noise_multiplier, k, initial_clipping_norm=setting.clipping_norm,
               target_clipped_quantile=setting.target_clipped_quantile,
               clip_norm_lr=setting.clip_norm_lr,
               clipped_count_stddev=setting.clipped_count_stddev)
  cls = (flwr_strategy.DifferentialPrivacyServerSideFixedClipping
         if setting.wrapper == 'server_fixed' else
         flwr_strategy.DifferentialPrivacyClientSideFixedClipping)
  return cls(inner, setting.noise_multiplier, setting.clipping_norm, k,
             accountant=_accountant(setting, n))


def _key(args) -> jax.Array:
  return jax.random.wrap_key_data(np.asarray(args['key']))


def _canaries(args) -> tuple[np.ndarray, np.ndarray]:
  data = np.asarray(args['key'])
  return _cached_draws(data.tobytes(), str(data.dtype), data.shape, args['design'])


@functools.lru_cache(maxsize=2)
def _cached_draws(data: bytes, dtype: str, shape: tuple[int, ...], design: canary_design.Design
                  ) -> tuple[np.ndarray, np.ndarray]:
  # A deployment draws them in its ClientApp, its server and `deploy` (one process in
  # process): each `canary_draws` call compiles its vmap again.
  key = jax.random.wrap_key_data(np.frombuffer(data, dtype).reshape(shape))
  return canary_design.canary_draws(jax.random.fold_in(key, 0), design)


def _real(args):
  """The real nodes' fixed updates [T, num_real, d], or their `RealTrainer`."""
  key, design = _key(args), args['design']
  if design.real_clients == 'trained':
    return canary_design.RealTrainer(key, design)
  return canary_design.real_updates(jax.random.fold_in(key, 1), design)


def _server_seed(key: jax.Array) -> int:
  return int(jax.random.bits(jax.random.fold_in(key, 2), dtype=np.uint32))


def seeding_mod(seed: int):
  """A Flower mod (first in the ClientApp's list) that seeds numpy's global generator, where
  LocalDpMod draws its noise, from (seed, server round, partition) for the message and
  restores it after: the same noise whichever process or engine runs the node."""
  def mod(msg: Message, context: Context, call_next) -> Message:
    r = client_lib.server_round(msg.content) if msg.metadata.message_type == 'train' else 0
    k = int(context.node_config['partition-id'])
    with jobs.seeded(int(np.random.SeedSequence([int(seed), r, k]).generate_state(1)[0])):
      return call_next(msg, context)
  return mod


def job_client(args) -> ClientApp:
  """The nodes' ClientApp of a canary deployment (a `jobs.Job` of part 'training')."""
  included, directions = _canaries(args)
  return client_app(args['setting'], args['design'], included, directions, _real(args),
                    seed=int(args['seed']))


def job_server(args, grid) -> dict[str, Any]:
  """Flower's FedAvg in the setting's DP wrapper over the nodes of `grid` for `num_rounds`
  (`deploy`'s return, without the draws)."""
  setting, design = args['setting'], args['design']
  _, directions = _canaries(args)
  nodes = list(grid.get_node_ids())
  with dp_games.quiet_flower():
    strategy = build_strategy(setting, design, nodes[int(design.num_real):], directions)
  models, clips = [], []

  def observe(server_round, arrays):
    del server_round
    models.append(np.asarray(arrays[canary_design.ARRAY_NAME].numpy(), np.float64))
    clips.append(float(getattr(strategy, 'clipping_norm', math.nan)))

  start = time.perf_counter()
  initial = canary_design.initial_model(jax.random.fold_in(_key(args), 6), design)
  with dp_games.quiet_flower(py_logging.ERROR):
    strategy.start(grid, ArrayRecord({canary_design.ARRAY_NAME: Array(initial)}),
                   num_rounds=int(design.num_rounds), evaluate_fn=observe)
  if len(models) != int(design.num_rounds) + 1:
    raise RuntimeError(f'{len(models) - 1} of {design.num_rounds} rounds released a model')
  spent = strategy.privacy_spent() if hasattr(strategy, 'privacy_spent') else None
  return dict(models=np.stack(models), clips=np.asarray(clips),
              upload_projections=(np.stack(strategy.projections)
                                  if isinstance(strategy, _Uploads) else None),
              sampled=sampled_matrix(getattr(strategy, 'strategy', strategy).sampled, nodes),
              stated_flower=(float(spent.epsilon) if spent is not None else math.nan),
              seconds=time.perf_counter() - start)


def sampled_matrix(sampled: list[list[int]], nodes: list[int]) -> np.ndarray:
  """bool [T, n]: whether FedAvg sampled the node of partition j in round t (`nodes`: the
  node ids by partition)."""
  column = {int(node): j for j, node in enumerate(nodes)}
  out = np.zeros((len(sampled), len(nodes)), bool)
  for t, ids in enumerate(sampled):
    out[t, [column[int(i)] for i in ids]] = True
  return out


def deploy(setting: dp_setting.Setting, design: canary_design.Design, key: jax.Array, *,
           engine: str = 'inprocess', workdir: str | None = None) -> dict[str, Any]:
  """Runs the deployment on `engine` (`dispatch.run_job`): {'included' [m], 'directions'
  [m, d], 'models' [T + 1, d] (the global model before round 1 and after each round),
  'clips' [T + 1] (the wrapper's clip after each round, NaN without one),
  'upload_projections' [T, m] (LocalDpMod: canary i's upload minus the round's model, on v_i;
  NaN where not sampled) or None, 'sampled' [T, n] (FedAvg sampled partition j in round t),
  'participation' [T, m] (its canaries' columns), 'stated_flower' (the fixed wrappers'
  `privacy_spent().epsilon`, else NaN), 'seconds', 'num_nodes'}. A lost reply (error,
  timeout) raises `jobs.EngineError`: the audit's worlds need every sampled canary's
  reply."""
  seed = _server_seed(key)
  args = dict(setting=setting, design=design, key=np.asarray(jax.random.key_data(key)),
              seed=seed)
  out = dispatch.run_job(engine, jobs.Job('training', design.num_nodes, args, seed=seed),
                         workdir)
  if out['losses']:
    lost = sorted({(x['round'], x['partition']) for x in out['losses']})
    raise jobs.EngineError(f'the canary deployment lost {len(lost)} replies (round, '
                           f'partition): {lost[:5]}' + (' ...' if len(lost) > 5 else ''))
  included, directions = _canaries(args)
  result = out['result']
  return dict(result, included=included, directions=directions, num_nodes=design.num_nodes,
              participation=result['sampled'][:, int(design.num_real):])
