"""Flower's DP audited over every round of a real deployment, in one run (canary clients).

The `training` part of `flower_audit`. One Flower deployment per setting on the in-process
grid (`runner.InProcessGrid`): Flower's own `FedAvg` round loop (`Strategy.start`) over
`num_rounds` rounds, wrapped in the setting's DP wrapper, every node's `ClientApp` carrying
the setting's mod (all five of `dp_audit.WRAPPERS`:
`DifferentialPrivacyServerSideFixedClipping`, `DifferentialPrivacyClientSideFixedClipping` +
`fixedclipping_mod`, `LocalDpMod` on every node, `DifferentialPrivacyServerSideAdaptiveClipping`,
`DifferentialPrivacyClientSideAdaptiveClipping` + `adaptiveclipping_mod`). Nothing of Flower
is re-implemented: the noise, the clipping and the adaptive clip's rounds are Flower's.

Nodes. `num_real` ordinary clients whose updates are known, fixed random vectors (fresh
direction per node and round, norms spread `real_norm` x 0.5..2, orthogonal to the Dirac
canaries; they stand for training clients and keep the run fast: no model, no data, about
1 ms per node and round), then `num_canaries` canary clients. The
model is one float32 vector of length `dimension` (4096 by default: independent random
directions are near-orthogonal, |cos| ~ 1 / sqrt(d)). Canary i has a fixed random unit
direction v_i (from `fold_in(key, i)`) and a fair coin b_i (also from `fold_in(key, i)`,
Steinke et al.'s inclusion with probability 1/2). Every round, an included canary replies
w_t + `canary_norm` x C x v_i (above the clip: C = the fixed clip, or the adaptive wrappers'
initial clip, so Flower's clip must act); an excluded one is the zero-out neighbour: the same
node, present and replying, with an update of norm 1e-6 C along v_i (a client that did not
train: an update of exactly zero crashes Flower 1.42's clip with a ZeroDivisionError, see
`docs/experiments/flower_audit.md`). Every node replies every round, so FedAvg's denominator
n = num_real + num_canaries is the same in both worlds and Flower's `num_sampled_clients`
is n: the relation is zero-out, the per-round sensitivity C / n of Flower's claim.

Adversaries (`THREATS`) and scores (projections on v_i):
- `all_iterates`: central wrappers, every aggregate the server (or anyone reading the
  global model) sees, sum_t w_t <aggregate_t - model_(t-1), v_i> with inverse-variance
  weights w_t = C_(t-1) / sigma_t^2 (the round's clip over Flower's noise variance; 1 for
  fixed clipping); LocalDpMod: the server reading every upload of canary i,
  sum_t <upload_(i,t) - model_(t-1), v_i>.
- `last_iterate`: the final model only, <model_T - model_0, v_i>.
With fixed-update clients the central wrappers' last iterate is the sum of the iterates, so
the two coincide for fixed clipping (a real training would separate them).

Statistics per threat model: Steinke, Nasr, Jagielski, "Privacy Auditing with One (1)
Training Run" (NeurIPS 2023, arXiv:2305.08846): `epsilon_one_run` and its f-DP refinement
`epsilon_one_run_fdp` from `fl_privacy.eval.auditing.audit_scores`, the m canaries as the
trials (LOWER bounds, each at `bound_confidence`, see the verdict below). Andrew, Kairouz, Oh,
Oprea, McMahan, Suriyakumar, "One-shot Empirical Privacy Estimation for Federated Learning"
(ICLR 2024, arXiv:2302.03098): a Gaussian fitted to the included canaries' statistic against
the null of `num_null` never-inserted directions scored the same way, mu = (mean_in -
mean_null) / std_null, `epsilon_fit` = `auditing.gdp_epsilon(mu, delta)`: an ESTIMATE, not a bound
(with a bootstrap interval at `confidence`). Beside them Flower's stated epsilon over the
rounds that ran (fixed wrappers: Flower's own `RdpAccountant` passed to the wrapper,
`privacy_spent()`; adaptive: the same accountant composed at z over the rounds, Andrew et
al.'s claim, which Flower does not state itself; LocalDpMod: its `epsilon` argument composed
over the rounds, T eps at T delta) and the exact epsilon of the mechanism Flower ran
(`exact_epsilon`).

The verdict (`privacy_violation`, `best_bound`) takes the largest of the k counted bounds
(`counted_bounds`: both one-run bounds of every threat model the run has a statistic for), so
each is computed at confidence 1 - (1 - c) / k, c = `Design.confidence` (Bonferroni over the
counted bounds, fixed by the wrapper and the threats present before any score is seen): the
verdict then holds at family-wise confidence c. The maximum of k bounds each at c is
guaranteed only at 1 - k (1 - c) (0.80 for four 95% bounds). The f-DP bound tests Gaussian
trade-off curves; it counts for every wrapper here, as in `dp_audit.audit`: each adds Gaussian
noise to clipped updates (the adaptive ones at a clip their noisy count moves), and the claims
it is tested against are Gaussian (Flower's RdpAccountant at z, Andrew et al.'s claim for the
adaptive ones; LocalDpMod's Gaussian calibration). k = 4 (two threats x two bounds) for
every wrapper as deployed; 2 for LocalDpMod without recorded uploads (last iterate only).

Randomness: Flower's noise comes from numpy's global generator (FedAvg samples with Python's
`random`), seeded from the run's key and restored afterwards; directions, coins and the real
updates from `fold_in` keys. A setting's results depend only on its key.
"""

from __future__ import annotations

import dataclasses
import logging as py_logging
import math
import time
from typing import Any

import jax
import numpy as np

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import LocalDpMod, adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp import RdpAccountant
from flwr.serverapp import strategy as flwr_strategy
from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig
from flwr.supercore.privacy_accounting import SamplingMethod

from fl_privacy.eval import auditing
from fl_privacy.flower import client as client_lib
from fl_privacy.flower import dp_audit
from fl_privacy.flower import jobs

THREATS = ('all_iterates', 'last_iterate')
# The one-run lower bounds `audit` reports per threat model, all counted in the verdict: the
# f-DP one tests Gaussian trade-off curves, and every wrapper audited here is a Gaussian
# mechanism under a Gaussian claim (`dp_audit.audit` counts the Gaussian-curve bounds for all
# five wrappers likewise; the training audit's `NON_GAUSSIAN`, in `attacks.audit`, lists
# LDP-SGD and subsampled mechanisms, none of which runs here).
BOUNDS = ('epsilon_one_run', 'epsilon_one_run_fdp')
DIRECTIONS = ('dirac', 'random')
ARRAY_NAME = 'w'
IDLE = 1e-6  # the excluded canary's update norm, in units of C


@dataclasses.dataclass(frozen=True)
class Design:
  """The canary game's sizes.

  Attributes:
    num_canaries: m canary nodes (each included with probability 1/2).
    num_real: ordinary nodes with known fixed updates.
    num_rounds: FedAvg rounds T (every one audited).
    dimension: d, the model vector's length.
    canary_norm: an included canary's update norm in units of C (the initial clip for the
      adaptive wrappers), >= 1.
    real_norm: the real nodes' update norms are real_norm x 0.5..2 (absolute).
    num_null: never-inserted directions for the Gaussian fit's null.
    confidence: the family-wise confidence c of the verdict (`privacy_violation`): each of
      the k counted one-run bounds is computed at 1 - (1 - c) / k (`audit`); also the level
      of the Gaussian fit's bootstrap interval.
    directions: 'dirac' (canary i on coordinate i, the null on coordinates m..m+num_null-1:
      exactly orthogonal, no canary cross-talk, the real updates on the remaining
      coordinates; needs d > m + num_null) or 'random'
      (independent random unit vectors; the included canaries' cross-talk adds variance
      T m / (2 d) in units of the per-round noise when z = 1, which lowers the fit).
  """
  num_canaries: int = 256
  num_real: int = 256
  num_rounds: int = 5
  dimension: int = 4096
  canary_norm: float = 2.0
  real_norm: float = 1.0
  num_null: int = 1000
  confidence: float = 0.95
  directions: str = 'dirac'

  def __post_init__(self):
    if self.directions not in DIRECTIONS:
      raise ValueError(f'directions must be one of {DIRECTIONS} (got {self.directions!r})')
    if self.directions == 'dirac' and self.dimension <= self.num_canaries + self.num_null:
      raise ValueError(f'dirac canaries need dimension > num_canaries + num_null '
                       f'({self.num_canaries} + {self.num_null}), got {self.dimension}')

  @property
  def num_nodes(self) -> int:
    return int(self.num_canaries) + int(self.num_real)


def _unit_rows(key: jax.Array, rows: int, dimension: int) -> np.ndarray:
  g = np.asarray(jax.random.normal(key, (rows, dimension)), np.float64)
  return g / np.linalg.norm(g, axis=1, keepdims=True)


def canary_draws(key: jax.Array, design: Design) -> tuple[np.ndarray, np.ndarray]:
  """(included bool [m], directions float64 [m, d] unit rows): canary i's fair coin and
  direction from `fold_in(key, i)`."""
  def one(i):
    k_coin, k_dir = jax.random.split(jax.random.fold_in(key, i))
    v = jax.random.normal(k_dir, (int(design.dimension),))
    return jax.random.bernoulli(k_coin), v / jax.numpy.linalg.norm(v)
  coins, dirs = jax.jit(jax.vmap(one))(np.arange(int(design.num_canaries), dtype=np.int32))
  if design.directions == 'dirac':
    dirs = np.eye(int(design.num_canaries), int(design.dimension))
  return np.asarray(coins, bool), np.asarray(dirs, np.float64)


def null_directions(key: jax.Array, design: Design) -> np.ndarray:
  """[num_null, d] never-inserted unit directions: Dirac on the coordinates after the
  canaries', or fresh random unit vectors."""
  m, k, d = int(design.num_canaries), int(design.num_null), int(design.dimension)
  if design.directions == 'dirac':
    return np.eye(d)[m:m + k]
  return _unit_rows(key, k, d)


def real_updates(key: jax.Array, design: Design) -> np.ndarray:
  """float64 [T, num_real, d]: the ordinary nodes' known updates (fresh random direction per
  node and round; node k's norm real_norm x linspace(0.5, 2)[k]). With Dirac canaries they
  live on the coordinates after the canaries' and the null's (orthogonal to both: the
  projections carry the canary and Flower's noise only, as in `dp_audit`'s game)."""
  t, k, d = int(design.num_rounds), int(design.num_real), int(design.dimension)
  if k == 0:
    return np.zeros((t, 0, d))
  g = np.asarray(jax.random.normal(key, (t * k, d)), np.float64)
  if design.directions == 'dirac':
    g[:, :int(design.num_canaries) + int(design.num_null)] = 0.0
  dirs = (g / np.linalg.norm(g, axis=1, keepdims=True)).reshape(t, k, d)
  return dirs * (float(design.real_norm) * np.linspace(0.5, 2.0, k))[None, :, None]


def client_app(setting: dp_audit.Setting, design: Design, included: np.ndarray,
               directions: np.ndarray, real: np.ndarray, seed: int = 0) -> ClientApp:
  """One `ClientApp` for every node (its `partition-id` says which): real node k < num_real
  replies w_t + real[t - 1, k]; canary i = k - num_real replies w_t + canary_norm C v_i when
  included, w_t + 1e-6 C v_i otherwise. It carries the setting's Flower mod."""
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
    w = np.asarray(record[ARRAY_NAME].numpy(), np.float64)
    if k < num_real:
      update = real[r - 1, k]
    else:
      i = k - num_real
      update = directions[i] * c * (float(design.canary_norm) if included[i] else IDLE)
    arrays = ArrayRecord({ARRAY_NAME: Array((w + update).astype(np.float32))})
    return Message(RecordDict({name: arrays, 'metrics': MetricRecord({'num-examples': 1})}),
                   reply_to=msg)

  return app


class _Uploads(flwr_strategy.FedAvg):
  """FedAvg that reads every canary upload (LocalDpMod's all-iterates adversary: the server
  sees each upload): per round, canary i's upload minus the round's model, projected on v_i
  (`projections` [T, m])."""

  def __init__(self, canary_nodes: list[int], directions: np.ndarray, **kw):
    super().__init__(**kw)
    self.canary_nodes = {n: i for i, n in enumerate(canary_nodes)}
    self.directions = directions
    self.model = None
    self.projections: list[np.ndarray] = []

  def configure_train(self, server_round, arrays, config, grid):
    self.model = np.asarray(arrays[ARRAY_NAME].numpy(), np.float64)
    return super().configure_train(server_round, arrays, config, grid)

  def aggregate_train(self, server_round, replies):
    replies = list(replies)
    row = np.full(len(self.canary_nodes), np.nan)
    for reply in replies:
      i = self.canary_nodes.get(reply.metadata.src_node_id)
      if i is not None and not reply.has_error():
        v = next(iter(reply.content.array_records.values()))[ARRAY_NAME].numpy()
        row[i] = float(np.dot(np.asarray(v, np.float64) - self.model, self.directions[i]))
    self.projections.append(row)
    return super().aggregate_train(server_round, replies)


def _accountant(setting: dp_audit.Setting, n: int) -> RdpAccountant:
  return RdpAccountant(PrivacyConfig(
      target_delta=float(setting.delta), population_size=int(n),
      neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
      sampling_method=SamplingMethod.NO_AMPLIFICATION))


def build_strategy(setting: dp_audit.Setting, design: Design, canary_nodes: list[int],
                   directions: np.ndarray):
  """Flower's FedAvg over every node, wrapped in the setting's DP wrapper (the fixed ones
  with Flower's own `RdpAccountant`); LocalDpMod: `_Uploads` (a FedAvg keeping uploads)."""
  n = design.num_nodes
  kw = dict(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n,
            min_available_nodes=n)
  if setting.wrapper == 'local_dp':
    return _Uploads(canary_nodes, directions, **kw)
  inner = flwr_strategy.FedAvg(**kw)
  if setting.wrapper in dp_audit.ADAPTIVE:
    cls = (flwr_strategy.DifferentialPrivacyServerSideAdaptiveClipping
           if setting.wrapper == 'server_adaptive' else
           flwr_strategy.DifferentialPrivacyClientSideAdaptiveClipping)
    return cls(inner, setting.noise_multiplier, n, initial_clipping_norm=setting.clipping_norm,
               target_clipped_quantile=setting.target_clipped_quantile,
               clip_norm_lr=setting.clip_norm_lr,
               clipped_count_stddev=setting.clipped_count_stddev)
  cls = (flwr_strategy.DifferentialPrivacyServerSideFixedClipping
         if setting.wrapper == 'server_fixed' else
         flwr_strategy.DifferentialPrivacyClientSideFixedClipping)
  return cls(inner, setting.noise_multiplier, setting.clipping_norm, n,
             accountant=_accountant(setting, n))


def _draws(args) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  key = jax.random.wrap_key_data(np.asarray(args['key']))
  included, directions = canary_draws(jax.random.fold_in(key, 0), args['design'])
  return included, directions, real_updates(jax.random.fold_in(key, 1), args['design'])


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
  included, directions, real = _draws(args)
  return client_app(args['setting'], args['design'], included, directions, real,
                    seed=int(args['seed']))


def job_server(args, grid) -> dict[str, Any]:
  """Flower's FedAvg in the setting's DP wrapper over every node of `grid` for `num_rounds`
  (`deploy`'s return, without the draws)."""
  setting, design = args['setting'], args['design']
  _, directions, _ = _draws(args)
  nodes = grid.get_node_ids()
  with dp_audit.quiet_flower():
    strategy = build_strategy(setting, design, nodes[int(design.num_real):], directions)
  models, clips = [], []

  def observe(server_round, arrays):
    del server_round
    models.append(np.asarray(arrays[ARRAY_NAME].numpy(), np.float64))
    clips.append(float(getattr(strategy, 'clipping_norm', math.nan)))

  start = time.perf_counter()
  with dp_audit.quiet_flower(py_logging.ERROR):
    strategy.start(grid, ArrayRecord({ARRAY_NAME: Array(np.zeros(
        int(design.dimension), np.float32))}), num_rounds=int(design.num_rounds),
                   evaluate_fn=observe)
  if len(models) != int(design.num_rounds) + 1:
    raise RuntimeError(f'{len(models) - 1} of {design.num_rounds} rounds released a model')
  spent = strategy.privacy_spent() if hasattr(strategy, 'privacy_spent') else None
  return dict(models=np.stack(models), clips=np.asarray(clips),
              upload_projections=(np.stack(strategy.projections)
                                  if isinstance(strategy, _Uploads) else None),
              stated_flower=(float(spent.epsilon) if spent is not None else math.nan),
              seconds=time.perf_counter() - start)


def deploy(setting: dp_audit.Setting, design: Design, key: jax.Array, *,
           engine: str = 'inprocess', workdir: str | None = None) -> dict[str, Any]:
  """Runs the deployment on `engine` (`engines.run_job`): {'included' [m], 'directions'
  [m, d], 'models' [T + 1, d] (the global model before round 1 and after each round),
  'clips' [T + 1] (the wrapper's clip after each round, NaN without one),
  'upload_projections' [T, m] (LocalDpMod: canary i's upload minus the round's model, on v_i)
  or None, 'stated_flower' (the fixed wrappers' `privacy_spent().epsilon`, else NaN),
  'seconds', 'num_nodes'}. A lost reply (error, timeout) raises `jobs.EngineError`: the
  audit's worlds need every canary's reply."""
  from fl_privacy.flower import engines  # pylint: disable=import-outside-toplevel
  seed = _server_seed(key)
  args = dict(setting=setting, design=design, key=np.asarray(jax.random.key_data(key)),
              seed=seed)
  out = engines.run_job(engine, jobs.Job('training', design.num_nodes, args, seed=seed),
                        workdir)
  if out['losses']:
    lost = sorted({(x['round'], x['partition']) for x in out['losses']})
    raise jobs.EngineError(f'the canary deployment lost {len(lost)} replies (round, '
                           f'partition): {lost[:5]}' + (' ...' if len(lost) > 5 else ''))
  included, directions, _ = _draws(args)
  return dict(out['result'], included=included, directions=directions,
              num_nodes=design.num_nodes)


def scores(setting: dp_audit.Setting, run: dict[str, Any],
           directions: np.ndarray) -> dict[str, np.ndarray]:
  """Each threat model's statistic for the given unit directions [k, d] (the canaries', or
  never-inserted ones for the null; LocalDpMod's all-iterates statistic needs the canaries'
  own uploads, so it is defined for the canaries only: the null is their excluded half)."""
  models = run['models']
  deltas = np.diff(models, axis=0)  # [T, d] aggregate_t - model_(t-1)
  out = {'last_iterate': directions @ (models[-1] - models[0])}
  if setting.wrapper == 'local_dp':
    if run['upload_projections'] is not None and directions is run['directions']:
      out['all_iterates'] = run['upload_projections'].sum(axis=0)
    return out
  weights = np.ones(len(deltas))
  if setting.wrapper in dp_audit.ADAPTIVE:
    clips = run['clips']
    weights = clips[:-1] / clips[1:] ** 2  # C_(t-1) / sigma_t^2, up to z'^2 / n^2
    weights = weights / weights.mean()
  out['all_iterates'] = (directions @ deltas.T) @ weights
  return out


def stated(setting: dp_audit.Setting, design: Design, run: dict[str, Any]
           ) -> tuple[float, float, str]:
  """(Flower's stated epsilon over the T rounds, its delta, source)."""
  t = int(design.num_rounds)
  if setting.wrapper in ('server_fixed', 'client_fixed'):
    return run['stated_flower'], float(setting.delta), 'flwr RdpAccountant (privacy_spent)'
  if setting.wrapper in dp_audit.ADAPTIVE:
    return (dp_audit.flower_rdp_epsilon(setting.noise_multiplier, design.num_nodes,
                                        setting.delta, rounds=t), float(setting.delta),
            'flwr RdpAccountant at z over the rounds (Andrew et al.; Flower states none)')
  return (t * float(setting.epsilon), t * float(setting.delta),
          'LocalDpMod epsilon x rounds (basic composition, at rounds x delta)')


def exact_epsilons(setting: dp_audit.Setting, design: Design, run: dict[str, Any],
                   delta: float) -> dict[str, float]:
  """The exact epsilon of what Flower ran, per canary (zero-out), as mu-GDP composed over
  the rounds (Dong et al. 2019): fixed central, mu = sqrt(T) / z (sensitivity C / n, noise
  z C / n, both adversaries); adaptive, per round (C_(t-1) / n) / (z' C_t / n) at the clips
  the run went through (noise drawn after the clip's update), the aggregates alone
  (`exact_epsilon`) and with the noisy counts of Flower's 0/1 bits (sensitivity 1 under
  zero-out, std sigma_b: `exact_epsilon_with_counts`); LocalDpMod, every upload
  sqrt(T) C / sigma (all iterates) and the final mean sqrt(T) C / (sigma sqrt(n)) (last)."""
  t, n = int(design.num_rounds), design.num_nodes
  s = dataclasses.replace(setting, num_sampled_clients=n)
  out = {}
  if s.wrapper in ('server_fixed', 'client_fixed'):
    mu = math.sqrt(t) / s.noise_multiplier
    out.update(exact_epsilon_all_iterates=auditing.gdp_epsilon(mu, delta),
               exact_epsilon_last_iterate=auditing.gdp_epsilon(mu, delta))
  elif s.wrapper in dp_audit.ADAPTIVE:
    std_b, z_prime = dp_audit.adaptive_noise(s)
    c = run['clips']
    per_round = c[:-1] / (z_prime * c[1:])
    mu_all = float(np.sqrt(np.sum(per_round ** 2)))
    mu_last = float(np.sum(c[:-1]) / (z_prime * np.sqrt(np.sum(c[1:] ** 2))))
    out.update(exact_epsilon_all_iterates=auditing.gdp_epsilon(mu_all, delta),
               exact_epsilon_last_iterate=auditing.gdp_epsilon(mu_last, delta),
               exact_epsilon_with_counts=auditing.gdp_epsilon(
                   math.sqrt(mu_all ** 2 + t / std_b ** 2), delta),
               exact_epsilon_as_claimed=auditing.gdp_epsilon(
                   math.sqrt(t) / s.noise_multiplier, delta),
               noise_multiplier_aggregate=float(z_prime), clipped_count_stddev=float(std_b))
  else:
    sigma = dp_audit.local_dp_std(s.sensitivity, s.epsilon, s.delta)
    mu = math.sqrt(t) * s.clipping_norm / sigma
    out.update(exact_epsilon_all_iterates=auditing.gdp_epsilon(mu, delta),
               exact_epsilon_last_iterate=auditing.gdp_epsilon(mu / math.sqrt(n), delta))
  return out


def gaussian_fit(in_scores: np.ndarray, null_scores: np.ndarray, delta: float, *,
                 rng: np.random.Generator | None = None, bootstrap: int = 1000,
                 confidence: float = 0.95) -> dict[str, float]:
  """Andrew et al.'s one-shot estimate: mu = (mean_in - mean_null) / std_null, epsilon of
  mu-GDP at delta (an ESTIMATE, not a bound), with a percentile bootstrap interval of mu
  (both samples resampled; `bootstrap` resamples) mapped through the epsilon of mu-GDP."""
  def mu_of(a, b):
    return (float(np.mean(a)) - float(np.mean(b))) / float(np.std(b))
  mu = mu_of(in_scores, null_scores)
  out = {'fit_mu': mu, 'epsilon_fit': auditing.gdp_epsilon(max(mu, 0.0), delta),
         'fit_in_std_over_null_std': float(np.std(in_scores) / np.std(null_scores))}
  if bootstrap:
    rng = np.random.default_rng(0) if rng is None else rng
    mus = np.asarray([mu_of(rng.choice(in_scores, len(in_scores)),
                            rng.choice(null_scores, len(null_scores)))
                      for _ in range(int(bootstrap))])
    low, high = np.quantile(mus, [(1 - confidence) / 2, (1 + confidence) / 2])
    out.update(fit_mu_ci_low=float(low), fit_mu_ci_high=float(high),
               epsilon_fit_ci_low=auditing.gdp_epsilon(max(float(low), 0.0), delta),
               epsilon_fit_ci_high=auditing.gdp_epsilon(max(float(high), 0.0), delta))
  return out


def audited_threats(setting: dp_audit.Setting, uploads_recorded: bool = True
                    ) -> tuple[str, ...]:
  """The threat models of `THREATS` that `scores` gives a statistic for, from the design
  alone (no score read): both for the central wrappers; LocalDpMod's all-iterates adversary
  reads the canaries' uploads, so it is there only when they were recorded."""
  if setting.wrapper == 'local_dp' and not uploads_recorded:
    return ('last_iterate',)
  return THREATS


def counted_bounds(setting: dp_audit.Setting, uploads_recorded: bool = True
                   ) -> tuple[str, ...]:
  """The bounds the verdict takes the largest of, as '<threat>/<bound>': both one-run bounds
  (`BOUNDS`, the f-DP one counted because every wrapper here is Gaussian) of every threat
  model `audited_threats` gives. Fixed before the data: their number k sets the per-bound
  confidence 1 - (1 - c) / k (4 for every wrapper as deployed, 2 for LocalDpMod without
  recorded uploads)."""
  return tuple(f'{threat}/{bound}' for threat in audited_threats(setting, uploads_recorded)
               for bound in BOUNDS)


def audit(setting: dp_audit.Setting, design: Design, key: jax.Array, *,
          engine: str = 'inprocess', workdir: str | None = None) -> dict[str, Any]:
  """One deployment and its audit against Flower's stated epsilon.

  Every counted bound (`counted_bounds`, k of them: 4, or 2 for LocalDpMod without recorded
  uploads) is computed at confidence 1 - (1 - c) / k, c = `design.confidence` (Bonferroni),
  so `privacy_violation` (the largest of them, `best_bound`, above the stated epsilon) is a
  verdict at family-wise confidence c: where the stated epsilon holds, it flags a violation
  with probability at most 1 - c. The largest of k bounds each at c would hold only at
  1 - k (1 - c). The reported one-run bounds are those counted ones (at `bound_confidence`);
  the Gaussian fit and its interval (at c) are estimates and decide nothing.

  Returns:
    Per threat model `<threat>/epsilon_one_run`, `/epsilon_one_run_fdp` (lower bounds, each
    at `bound_confidence`), `/epsilon_fit`, `/fit_mu` (estimates, with their bootstrap
    interval at c), `/n_in`, `/n_out`, `/n_null`; `stated_epsilon` (+ `_delta`, `_source`),
    the exact epsilons, `best_bound`, `privacy_violation`, `verdict_confidence` (c,
    family-wise), `bound_confidence` (1 - (1 - c) / k), `counted_bounds` (the k
    '<threat>/<bound>' names, comma-separated), `confidence` (c), `accountant_violation`
    (an exact epsilon above the stated one), the clip trajectory (`clip_first`, `clip_last`,
    `clips`), `seconds`, `num_nodes`.
  """
  run = deploy(setting, design, key, engine=engine, workdir=workdir)
  eps, delta, source = stated(setting, design, run)
  included = run['included']
  if not (included.any() and (~included).any()):
    raise ValueError(f'{design.num_canaries} canaries gave no canary in one of the worlds')
  # The family is fixed by the wrapper and whether uploads were recorded, before any score.
  uploads = run['upload_projections'] is not None
  threats = audited_threats(setting, uploads)
  counted = counted_bounds(setting, uploads)
  each = 1.0 - (1.0 - float(design.confidence)) / len(counted)
  canary = scores(setting, run, run['directions'])
  if tuple(t for t in THREATS if t in canary) != threats:
    raise RuntimeError(f'the threats scored {sorted(canary)} are not the ones counted '
                       f'{list(threats)}')
  null_dirs = null_directions(jax.random.fold_in(key, 3), design)
  null = scores(setting, run, null_dirs)
  m: dict[str, Any] = dict(stated_epsilon=eps, stated_delta=delta, stated_epsilon_source=source,
                           num_nodes=run['num_nodes'], num_rounds=int(design.num_rounds),
                           num_canaries=int(design.num_canaries), num_real=int(design.num_real),
                           dimension=int(design.dimension), seconds=run['seconds'],
                           game_relation='zero_out')
  m.update(exact_epsilons(setting, design, run, delta))
  for threat in threats:
    s = canary[threat]
    a = auditing.audit_scores(s[included], s[~included], delta=delta, confidence=each)
    nul = null.get(threat, s[~included])
    fit = gaussian_fit(s[included], nul, delta, confidence=float(design.confidence),
                       rng=np.random.default_rng(np.asarray(jax.random.key_data(
                           jax.random.fold_in(key, 4)), np.uint32)))
    for k in ('epsilon_one_run', 'epsilon_one_run_fdp', 'n_in', 'n_out'):
      m[f'{threat}/{k}'] = a[k]
    for k, v in fit.items():
      m[f'{threat}/{k}'] = v
    m[f'{threat}/n_null'] = int(len(nul))
  best = max(b for b in (m[name] for name in counted) if not math.isnan(b))
  m.update(best_bound=best, privacy_violation=float(best > eps * (1 + 1e-9)),
           accountant_violation=float(max(
               m['exact_epsilon_all_iterates'], m['exact_epsilon_last_iterate']) > eps),
           verdict_confidence=float(design.confidence), bound_confidence=each,
           counted_bounds=','.join(counted), confidence=float(design.confidence))
  clips = run['clips']
  if not np.isnan(clips).all():
    m.update(clip_first=float(clips[0]), clip_last=float(clips[-1]),
             clips=[float(c) for c in clips])
  return m
