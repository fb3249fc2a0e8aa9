"""The trainings of the training audit (`fl_privacy.pipelines.training_audit`): the claim,
what runs, the replicate trainings with their canaries, and the side-channel game.

Two federations (`configs/_training_audit.py`): the record-level `dp_sgd` runs cross-silo
(`training_audit.record`: a few clients of many rows, canary rows a small share of each
shard), the client-level defenses cross-device (`training_audit.client`: many clients of few
rows, a fraction of them each round, canary clients a small share of each round's
participants). A row of the audit pools the canaries of R replicate trainings (independent
keys, shards and initialisations): as many as `training_audit.canaries` asks, while each
training keeps its canaries at the federation's share.

`claim` configures the defense as a user's `defense` section asks (the registry's declaration
and calibration, for the federation that runs); `ran` is what the trainings run instead, the
claim's hooks or a planted bug (`training_audit.plant`); `run_training` builds the replicates
and runs `attacks.audit.canaries.train` (the experiments' round loop with the defense's hooks);
`side_channel` plays `attacks.audit.side_channel.play` with the same hooks.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
from jax import flatten_util
import jax.numpy as jnp
import ml_collections
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy.attacks.audit import canaries
from fl_privacy.attacks.audit import side_channel as side_lib
from fl_privacy.defenses import configured as configured_lib
from fl_privacy.defenses import registry
from fl_privacy.fl import client as client_lib
from fl_privacy.fl import losses
from fl_privacy.fl import optimizers
from fl_privacy.fl import rounds
from fl_privacy.fl import sampling as sampling_lib

NAME = 'training_audit'
RECORD_KINDS = ('gradient', 'input')


def federation(config, tr: dict) -> ml_collections.ConfigDict:
  """The federation a training runs: `record` for dp_sgd, `client` for the others."""
  s = config.training_audit
  return s.record if tr['defense'] == 'dp_sgd' else s.client


def server_adversary(tr: dict) -> bool:
  """Whether the declaration's adversary is the server (it picks who takes part)."""
  return registry.DEFENSES[tr['defense']].protects == 'server'


def participation(config, tr: dict) -> float:
  """The fraction of the real clients drawn each round (1 for the cross-silo federation)."""
  if tr['defense'] == 'dp_sgd':
    return 1.0
  return float(config.training_audit.client.participation)


def canaries_per_training(config, tr: dict) -> int:
  """The canaries of one training at the federation's share: canary rows per shard x shards
  (record level: gradient or input canaries per client); for canary clients, the most that
  keep them at `canary_share` of a round's
  participants: J <= share / (1 - share) x the real participants, which are every round's
  round(participation K) when the canaries take part every round (the server's choice), and
  participation x (K + J) of K + J otherwise (canaries drawn like the others)."""
  fed = federation(config, tr)
  if tr['defense'] == 'dp_sgd':
    per = fed.input_per_client if tr['canary'] == 'input' else fed.canaries_per_client
    return int(per) * int(fed.num_clients)
  share = float(fed.canary_share)
  k = int(fed.num_clients)
  real = max(1, int(round(participation(config, tr) * k))) if server_adversary(tr) else k
  return max(2, int(math.floor(share / (1.0 - share) * real + 1e-9)))


def canaries_of_row(config, tr: dict) -> int:
  """The canaries a row asks for, pooled over its replicate trainings."""
  fed = federation(config, tr)
  return int(fed.input_canaries if tr['canary'] == 'input' else fed.canaries)


def replicates(config, tr: dict) -> int:
  """R, the replicate trainings whose canaries one row pools."""
  return max(1, -(-canaries_of_row(config, tr) // canaries_per_training(config, tr)))


@functools.lru_cache(maxsize=None)
def optimizer(name: str, learning_rate: float):
  """One optax optimizer per (name, lr): a static argument of the compiled trainings."""
  return optimizers.make(name, learning_rate)


def model(config, state, tr: dict):
  """The federation's model (`state['models']`, by its hidden widths)."""
  return state['models'][tuple(federation(config, tr).hidden)]


def _section(config, tr: dict, target: float | None, noise: float | None = None,
             clip: float | None = None) -> ml_collections.ConfigDict:
  """The `defense` section of training `tr`, as a user would write it."""
  s = config.training_audit
  sec = ml_collections.ConfigDict({f: f_.default for f, f_ in
                                   configured_lib.section_fields().items()})
  sec.name = tr['defense']
  sec.clip_norm = float(s.clip_norm if clip is None else clip)
  sec.delta = float(s.delta)
  sec.accountant = str(s.accountant)
  if tr['defense'] == 'ldp_sgd':
    sec.epsilon = float(target)
    return sec
  sec.target_epsilon = None if target is None else float(target)
  if noise is not None:
    sec.noise_multiplier = float(noise)
  if tr['defense'] == 'dp_sgd':
    sec.dp_sgd_sampling = tr['sampling']
  if tr['sampling'] == 'without_replacement':
    sec.participation = float(s.client.participation)
  return sec


def setting(config, state, tr: dict, rounds_: int | None = None) -> registry.Setting:
  """The `registry.Setting` of the federation that runs (real and canary clients). Its record
  count is the public one the federation declares (`per_client`): DP-SGD's Poisson schedule
  takes its rate and steps from it, never from a shard."""
  fed = federation(config, tr)
  record = tr['defense'] == 'dp_sgd'
  k = int(fed.num_clients) + (0 if record else canaries_per_training(config, tr))
  extra = max(int(fed.canaries_per_client), int(fed.input_per_client)) if record else 0
  return registry.Setting(
      num_classes=int(state['train'].num_classes), image_shape=None,
      batch_size=int(fed.batch_size), num_examples=int(fed.per_client),
      max_examples=max(int(fed.per_client) + extra, side_rows(config, tr) + 1),
      epochs=int(fed.epochs), rounds=int(fed.num_rounds if rounds_ is None else rounds_),
      num_clients=k)


def side_rows(config, tr: dict) -> int:
  """n, the side channel's target rows in its OUT world: for DP-SGD B x the public steps an
  epoch (where one record more would add a step to a schedule that followed the shard), else
  the federation's rows per client."""
  fed = federation(config, tr)
  if tr['defense'] == 'dp_sgd':
    return int(fed.batch_size) * -(-int(fed.per_client) // int(fed.batch_size))
  return int(fed.per_client)


def _per_report(config, tr: dict) -> float:
  """LDP-SGD's epsilon per report: the claim split over the rounds, one report each."""
  return tr['claimed_epsilon'] / int(config.training_audit.client.num_rounds)


def claim(config, state, tr: dict) -> configured_lib.Configured:
  """The defense as claimed: configured for the training's claim (what the audit checks)."""
  plant = config.training_audit.plant
  rounds_ = 1 if plant == 'one_composition' else None
  target = _per_report(config, tr) if tr['defense'] == 'ldp_sgd' else tr['claimed_epsilon']
  return configured_lib.configure(_section(config, tr, target),
                                  setting(config, state, tr, rounds_), experiment=NAME)


def _full_batches(key, mask, *, epochs, batch_size):
  """A planted `batches` hook: every row in every step, as many steps as Poisson runs."""
  del key
  n = mask.shape[0]
  steps = -(-n // batch_size)
  idx = jnp.broadcast_to(jnp.arange(n), (epochs, steps, n))
  rows = jnp.broadcast_to(mask, (epochs, steps, n))
  return idx, rows, jnp.ones((epochs, steps), jnp.float32)


def data_dependent_batches(max_batch_size: int):
  """A planted `batches` hook: Poisson batches whose rate and number of steps come from the
  shard's private row count n (q = B / n, ceil(n / B) steps an epoch; the sampler before the
  public schedule of `fl.sampling`), so one record more where n is a multiple of B adds a whole
  noisy step. The side-channel adversary must flag it."""
  def sampler(key, mask, *, epochs, batch_size):
    capacity = mask.shape[0]
    steps = -(-capacity // batch_size)
    real = mask > 0
    n = jnp.sum(real.astype(jnp.int32))
    rate = jnp.minimum(batch_size / jnp.maximum(n, 1).astype(jnp.float32), 1.0)
    live_steps = (n + batch_size - 1) // batch_size
    rank = jnp.cumsum(real.astype(jnp.int32)) - 1
    rows = jnp.arange(capacity, dtype=jnp.int32)

    def one_step(epoch, step):
      step_key = jax.random.fold_in(jax.random.fold_in(key, epoch), step)
      words = jax.vmap(lambda r: jax.random.bits(jax.random.fold_in(step_key, r), (2,),
                                                 jnp.uint32))(rank)
      u = (words[:, 0] >> 8).astype(jnp.float32) * (2.0 ** -24)
      live = step < live_steps
      selected = real & (u < rate) & live
      _, _, order = jax.lax.sort((jnp.where(selected, 0, 1).astype(jnp.int32), words[:, 1],
                                  rows), num_keys=3)
      if max_batch_size > capacity:
        order = jnp.concatenate([order, jnp.zeros(max_batch_size - capacity, jnp.int32)])
      kept = jnp.minimum(jnp.sum(selected.astype(jnp.int32)), max_batch_size)
      return (order[:max_batch_size], (jnp.arange(max_batch_size) < kept).astype(jnp.float32),
              live.astype(jnp.float32))

    e = jnp.arange(epochs)[:, None] * jnp.ones((1, steps), jnp.int32)
    j = jnp.ones((epochs, 1), jnp.int32) * jnp.arange(steps)[None, :]
    return jax.vmap(jax.vmap(one_step))(e, j)
  return sampler


def ran(config, state, tr: dict, claimed: configured_lib.Configured
        ) -> tuple[client_lib.ClientHooks, float]:
  """(hooks, participation) that the trainings run: the claimed defense, or the planted bug."""
  s = config.training_audit
  plant, name = s.plant, tr['defense']
  part = participation(config, tr)
  if plant in ('none', 'one_composition', 'participation_not_run', 'poisson_full_batch',
               'data_dependent_schedule', 'reported_rows'):
    hooks = claimed.hooks
    if plant == 'participation_not_run':
      part = 1.0
    if plant == 'poisson_full_batch' and hooks.batches is not None:
      hooks = hooks._replace(batches=_full_batches)
    if plant == 'data_dependent_schedule' and hooks.batches is not None:
      hooks = hooks._replace(batches=data_dependent_batches(
          int(claimed.metrics['dp_max_batch_size'])))
    if plant == 'reported_rows':   # the server weighs by the real row counts
      hooks = hooks._replace(report=None)
    return hooks, part
  st = setting(config, state, tr)
  if name == 'ldp_sgd':
    sec = _section(config, tr, _per_report(config, tr) * (2.0 if plant == 'half_noise' else 1.0))
    return configured_lib.configure(sec, st, experiment=NAME).hooks, part
  z = float(claimed.metrics['noise_multiplier'])
  if plant == 'half_noise':
    sec = _section(config, tr, None, noise=0.5 * z)
  else:   # clip_mismatch: the clip applied is 2C, the noise is z C
    sec = _section(config, tr, None, noise=0.5 * z, clip=2.0 * float(s.clip_norm))
  return configured_lib.configure(sec, st, experiment=NAME).hooks, part


# ------------------------------------------------------------------------- replicates ---


def _shards(config, tr: dict, state, key) -> tuple[rounds.ClientData, np.ndarray, np.ndarray]:
  """One replicate's IID shards of the federation, and the images no client holds (the
  unused train rows: the input canaries' pool)."""
  fed = federation(config, tr)
  train = state['train']
  parts = data_lib.iid_partition(jax.random.fold_in(key, 1), len(train), int(fed.num_clients),
                                 per_client=int(fed.per_client))
  x = data_lib.to_float(train.x).reshape(len(train), -1)
  unused = np.setdiff1d(np.arange(len(train)), np.concatenate(parts))
  clients = rounds.ClientData(x=np.stack([x[p] for p in parts]),
                              y=np.stack([train.y[p].astype(np.int32) for p in parts]))
  return clients, x[unused], train.y[unused].astype(np.int32)


def _stack(trees: list) -> Any:
  return jax.tree_util.tree_map(lambda *a: np.stack([np.asarray(v) for v in a]), *trees)


def _replicate(config, state, tr: dict, key, relation: str) -> dict[str, Any]:
  """One replicate training's inputs: w_0, the clients (with canary rows for record kinds),
  its `canaries.Planted`, and the real clients alone (for its canary-free twin)."""
  s = config.training_audit
  model_ = model(config, state, tr)
  clients, pool_x, pool_y = _shards(config, tr, state, key)
  params = model_.init(jax.random.fold_in(key, 2), np.asarray(clients.x[0, :1]))
  flat, unravel = flatten_util.ravel_pytree(params)
  dim = int(flat.shape[0])
  m = canaries_per_training(config, tr)
  world = canaries.coins(jax.random.fold_in(key, 3), m)
  norm = float(s.canary_norm) * float(s.clip_norm)
  fed = federation(config, tr)
  if tr['canary'] == 'client':
    dirs = canaries.directions(jax.random.fold_in(key, 4), m, dim, s.direction)
    inj = canaries.injected_clients(dirs, world, unravel, norm=norm, relation=relation,
                                    size=float(fed.per_client))
    planted = canaries.Planted(world=world, directions=dirs,
                               injected=(inj.deltas, inj.sizes))
    return dict(params=params, clients=clients, twin=clients, planted=planted, dim=dim)
  num_classes = int(state['train'].num_classes)
  if tr['canary'] == 'gradient':
    coords = canaries.dirac_coordinates(jax.random.fold_in(key, 4), m, dim)
    cx = np.zeros((m, clients.x.shape[2]), np.float32)
    cy = (num_classes + np.arange(m)).astype(np.int32)
    planted = canaries.Planted(world=world, coordinates=coords.astype(np.int32),
                               code_sign=canaries.signs(relation, world))
  else:
    rng = data_lib.rng_from_key(jax.random.fold_in(key, 4))
    pick = rng.choice(len(pool_y), m, replace=False)
    cx = pool_x[pick]
    true = pool_y[pick]
    wrong = ((true + rng.integers(1, num_classes, m)) % num_classes).astype(np.int32)
    cy = wrong if relation == 'add_remove' else np.where(world, wrong, true).astype(np.int32)
    planted = canaries.Planted(world=world, x=cx.astype(np.float32), y=wrong)
  ex = canaries.place_examples(clients, cx, cy, world, relation)
  # The twin walks its shards as the canaried training walks the real rows: masked (a shard
  # without a mask would take `local.batch_order`, another permutation that drops N mod B rows).
  twin = clients._replace(mask=np.ones(np.shape(clients.y), np.float32))
  return dict(params=params, clients=ex.clients, twin=twin, planted=planted, dim=dim,
              owner=ex.owner)


def relation_of(claimed: configured_lib.Configured, tr: dict) -> str:
  """The canaries' neighbouring relation: the declaration's (add/remove for Poisson DP-SGD,
  replace-one otherwise)."""
  if claimed.declaration is not None:
    return claimed.declaration.relation
  return 'replace_one'


def step_reading(config, tr: dict, claimed: configured_lib.Configured
                 ) -> canaries.StepReading | None:
  """The `all_steps` reading of gradient canaries under the claim (None for other kinds)."""
  if tr['canary'] != 'gradient' or 'all_steps' not in tuple(config.training_audit.threats):
    return None
  fed = federation(config, tr)
  c = float(config.training_audit.clip_norm)
  z = float(claimed.metrics['noise_multiplier'])
  poisson = tr['sampling'] == 'poisson'
  rate = float(claimed.declaration.sampling_rate) if poisson else 1.0
  return canaries.StepReading(poisson=poisson, clip_norm=c, batch_size=int(fed.batch_size),
                              rate=rate, noise_std=z * c, base_rows=int(fed.per_client))


def run_training(config, state, tr: dict, key) -> dict[str, Any]:
  """The R replicate trainings of one row, with canaries; the claim, what ran, the scores."""
  s = config.training_audit
  fed = federation(config, tr)
  model_, test = model(config, state, tr), state['test']
  claimed = claim(config, state, tr)
  relation = relation_of(claimed, tr)
  hooks, part = ran(config, state, tr, claimed)
  r = replicates(config, tr)
  keys = [jax.random.fold_in(key, i) for i in range(r)]
  reps = [_replicate(config, state, tr, k, relation) for k in keys]
  stacked = lambda f: _stack([rep[f] for rep in reps])
  test_x = data_lib.to_float(test.x).reshape(len(test), -1)
  train_keys = jnp.stack([jax.random.fold_in(k, 5) for k in keys])
  opt = optimizer(s.optimizer, float(fed.learning_rate))
  scores = canaries.train(
      model_.apply, stacked('params'), stacked('clients'), keys=train_keys, hooks=hooks,
      num_rounds=int(fed.num_rounds), optimizer=opt,
      epochs=int(fed.epochs), batch_size=int(fed.batch_size), participation=part,
      kind=tr['canary'], clip_norm=float(s.clip_norm), planted=stacked('planted'),
      owner=reps[0].get('owner'), reading=step_reading(config, tr, claimed), test_x=test_x,
      test_y=test.y, num_classes=int(state['train'].num_classes),
      canary_norm=float(s.canary_norm) * float(s.clip_norm),
      always=tr['canary'] == 'client' and server_adversary(tr) and part < 1,
      chunk=int(s.chunk))
  twins = min(int(fed.twins), r)
  twin_acc = np.zeros(0)
  if twins:   # the same keys, shards and w_0 without canaries
    twin_acc = canaries.accuracy(
        model_.apply, _stack([rep['params'] for rep in reps[:twins]]),
        _stack([rep['twin'] for rep in reps[:twins]]), keys=train_keys[:twins], hooks=hooks,
        num_rounds=int(fed.num_rounds), optimizer=opt, epochs=int(fed.epochs),
        batch_size=int(fed.batch_size), participation=part, test_x=test_x, test_y=test.y)
  world = np.concatenate([np.asarray(rep['planted'].world) for rep in reps])
  return dict(claimed=claimed, scores=scores, world=world, participation=part,
              relation=relation, dim=reps[0]['dim'], replicates=r,
              per_training=canaries_per_training(config, tr), twin_accuracy=twin_acc)


# ---------------------------------------------------------------------- side channel ---


def side_channel(config, state, tr: dict, key) -> dict[str, Any]:
  """The side-channel game of (defense, sampling, claim) with the hooks that run."""
  s = config.training_audit
  fed = federation(config, tr)
  claimed = claim(config, state, tr)
  hooks, _ = ran(config, state, tr, claimed)
  decl = claimed.declaration
  unit = decl.unit if decl is not None else 'client'
  relation = relation_of(claimed, tr)
  adversary = decl.adversary if decl is not None else 'server'
  train = state['train']
  pool_x = data_lib.to_float(train.x).reshape(len(train), -1)
  model_ = model(config, state, tr)
  params = model_.init(jax.random.fold_in(key, 2), pool_x[:1])
  world, scores = side_lib.play(
      model_.apply, params, pool_x, train.y.astype(np.int32),
      key=jax.random.fold_in(key, 7), hooks=hooks, adversary=adversary,
      mode=side_lib.neighbours(unit, relation), trials=int(s.side_channel_trials),
      num_examples=side_rows(config, tr),
      others=0 if adversary == 'server' else int(s.side_channel_others),
      optimizer=optimizer(s.optimizer, float(fed.learning_rate)),
      epochs=int(fed.epochs), batch_size=int(fed.batch_size))
  return dict(claimed=claimed, world=world, side_scores=scores, adversary=adversary,
              unit=unit, relation=relation)


__all__ = ['federation', 'canaries_per_training', 'replicates', 'setting', 'claim', 'ran',
           'data_dependent_batches', 'run_training', 'side_channel', 'step_reading',
           'relation_of', 'participation', 'server_adversary', 'side_rows']
