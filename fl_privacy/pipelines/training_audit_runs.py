"""The trainings of the training audit (`fl_privacy.pipelines.training_audit`): the claim,
what runs, and one training with its canaries.

`claim` configures the defense as a user's `defense` section asks (the registry's
declaration and calibration, for the federation that runs: real and canary clients); `ran`
is what the training runs instead, the claim's hooks or a planted bug
(`training_audit.plant`); `run_training` builds the shards and the canaries and runs
`attacks.audit.canaries.train` (the experiments' round loop with the defense's hooks).
"""

from __future__ import annotations

from typing import Any

import jax
from jax import flatten_util
import jax.numpy as jnp
import ml_collections
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy.attacks.audit import canaries
from fl_privacy.defenses import configured as configured_lib
from fl_privacy.defenses import registry
from fl_privacy.fl import client as client_lib
from fl_privacy.fl import optimizers
from fl_privacy.fl import rounds

NAME = 'training_audit'


def _section(config, tr: dict, target: float | None, noise: float | None = None,
             clip: float | None = None) -> ml_collections.ConfigDict:
  """The `defense` section of training `tr`, as a user would write it."""
  s = config.training_audit
  sec = ml_collections.ConfigDict({f: f_.default for f, f_ in
                                   configured_lib.section_fields().items()})
  sec.name = tr['defense']
  sec.clip_norm = float(s.clip_norm if clip is None else clip)
  sec.delta = float(s.delta)
  if tr['defense'] == 'ldp_sgd':
    sec.epsilon = float(target)
    return sec
  sec.target_epsilon = None if target is None else float(target)
  if noise is not None:
    sec.noise_multiplier = float(noise)
  if tr['defense'] == 'dp_sgd':
    sec.dp_sgd_sampling = tr['sampling']
  if tr['sampling'] == 'without_replacement':
    sec.participation = float(s.participation)
  return sec


def setting(config, state, tr: dict, sizes: np.ndarray, rounds_: int | None = None
            ) -> registry.Setting:
  """The `registry.Setting` of the federation that runs (real and canary clients)."""
  s = config.training_audit
  k = int(s.num_clients) + (int(s.num_canary_clients) if tr['canary'] == 'client' else 0)
  return registry.Setting(
      num_classes=int(state['train'].num_classes), image_shape=None,
      batch_size=int(s.batch_size), num_examples=int(np.min(sizes)),
      max_examples=int(np.max(sizes)), epochs=int(s.epochs),
      steps_per_epoch=-(-int(np.max(sizes)) // int(s.batch_size)),
      rounds=int(s.num_rounds if rounds_ is None else rounds_), num_clients=k)


def _per_report(config, tr: dict) -> float:
  """LDP-SGD's epsilon per report: the claim split over the rounds, one report each."""
  return tr['claimed_epsilon'] / int(config.training_audit.num_rounds)


def claim(config, state, tr: dict, sizes: np.ndarray) -> configured_lib.Configured:
  """The defense as claimed: configured for the training's claim (what the audit checks)."""
  s = config.training_audit
  plant = s.plant
  rounds_ = 1 if plant == 'one_composition' else None
  if tr['defense'] == 'ldp_sgd':
    sec = _section(config, tr, _per_report(config, tr))
    return configured_lib.configure(sec, setting(config, state, tr, sizes, rounds_),
                                    experiment=NAME)
  return configured_lib.configure(_section(config, tr, tr['claimed_epsilon']),
                                  setting(config, state, tr, sizes, rounds_), experiment=NAME)


def _full_batches(key, mask, *, epochs, batch_size):
  """A planted `batches` hook: every row in every step, as many steps as Poisson runs."""
  del key
  n = mask.shape[0]
  steps = -(-n // batch_size)
  idx = jnp.broadcast_to(jnp.arange(n), (epochs, steps, n))
  rows = jnp.broadcast_to(mask, (epochs, steps, n))
  return idx, rows, jnp.ones((epochs, steps), jnp.float32)


def ran(config, state, tr: dict, claimed: configured_lib.Configured, sizes
        ) -> tuple[client_lib.ClientHooks, float]:
  """(hooks, participation) that the training runs: the claimed defense, or the planted bug."""
  s = config.training_audit
  plant, name = s.plant, tr['defense']
  part = float(s.participation) if tr['sampling'] == 'without_replacement' else 1.0
  if plant in ('none', 'one_composition', 'participation_not_run', 'poisson_full_batch'):
    hooks = claimed.hooks
    if plant == 'participation_not_run':
      part = 1.0
    if plant == 'poisson_full_batch' and name == 'dp_sgd':
      hooks = hooks._replace(batches=_full_batches)
    return hooks, part
  st = setting(config, state, tr, sizes)
  if name == 'ldp_sgd':
    sec = _section(config, tr, _per_report(config, tr) * (2.0 if plant == 'half_noise' else 1.0))
    return configured_lib.configure(sec, st, experiment=NAME).hooks, part
  z = float(claimed.metrics['noise_multiplier'])
  if plant == 'half_noise':
    sec = _section(config, tr, None, noise=0.5 * z)
  else:   # clip_mismatch: the clip applied is 2C, the noise is z C
    sec = _section(config, tr, None, noise=0.5 * z, clip=2.0 * float(s.clip_norm))
  return configured_lib.configure(sec, st, experiment=NAME).hooks, part


def _shards(config, state, key) -> tuple[rounds.ClientData, np.ndarray, np.ndarray]:
  """The clients' IID shards, and the images no client holds (x, y: the input canaries'
  pool: the unused train rows, then the test split)."""
  s = config.training_audit
  train, test = state['train'], state['test']
  parts = data_lib.iid_partition(jax.random.fold_in(key, 1), len(train), int(s.num_clients),
                                 per_client=int(s.per_client))
  x = data_lib.to_float(train.x).reshape(len(train), -1)
  unused = np.setdiff1d(np.arange(len(train)), np.concatenate(parts))
  pool_x = np.concatenate([x[unused], data_lib.to_float(test.x).reshape(len(test), -1)])
  pool_y = np.concatenate([train.y[unused], test.y]).astype(np.int32)
  clients = rounds.pad_clients([x[p] for p in parts], [train.y[p].astype(np.int32)
                                                       for p in parts])
  return clients, pool_x, pool_y


def run_training(config, state, tr: dict, key) -> dict[str, Any]:
  """One training with canaries: the claim, what ran, and the canaries' scores."""
  s = config.training_audit
  model, test = state['model'], state['test']
  clients, pool_x, pool_y = _shards(config, state, key)
  params = model.init(jax.random.fold_in(key, 2), np.asarray(clients.x[0, :1]))
  flat, unravel = flatten_util.ravel_pytree(params)
  dim = int(flat.shape[0])
  m = int(s.num_canary_clients if tr['canary'] == 'client' else s.num_canary_examples)
  world = canaries.coins(jax.random.fold_in(key, 3), m)
  norm = float(s.canary_norm) * float(s.clip_norm)
  test_x = data_lib.to_float(test.x).reshape(len(test), -1)
  opt = optimizers.make(s.optimizer, float(s.learning_rate))
  kw: dict[str, Any] = dict(kind=tr['canary'], test_x=test_x, test_y=test.y)
  per_client = np.full(int(s.num_clients), int(s.per_client))
  if tr['canary'] == 'client':
    claimed = claim(config, state, tr, per_client)
    dirs = canaries.directions(jax.random.fold_in(key, 4), m, dim, s.direction)
    relation = claimed.declaration.relation if claimed.declaration is not None else 'replace_one'
    kw.update(canary_dirs=dirs, injected=canaries.injected_clients(
        dirs, world, unravel, norm=norm, relation=relation, size=float(s.per_client)))
  else:
    relation = 'add_remove' if tr['sampling'] == 'poisson' else 'replace_one'
    num_classes = int(state['train'].num_classes)
    if tr['canary'] == 'gradient':
      coords = canaries.dirac_coordinates(jax.random.fold_in(key, 4), m, dim)
      cx = np.zeros((m, clients.x.shape[2]), np.float32)
      cy = (num_classes + np.arange(m)).astype(np.int32)
      kw.update(coordinates=coords)
    else:
      rng = data_lib.rng_from_key(jax.random.fold_in(key, 4))
      pick = rng.choice(len(pool_y), m, replace=False)
      cx = pool_x[pick]
      true = pool_y[pick]
      wrong = ((true + rng.integers(1, num_classes, m)) % num_classes).astype(np.int32)
      cy = wrong if relation == 'add_remove' else np.where(world, wrong, true).astype(np.int32)
      kw.update(canary_x=cx, canary_y=wrong)
    ex = canaries.place_examples(clients, cx, cy, world, relation)
    clients = ex.clients
    sizes = np.asarray(clients.mask).sum(axis=1)
    claimed = claim(config, state, tr, sizes)
    kw.update(examples=ex)
  hooks, participation = ran(config, state, tr, claimed, np.asarray(
      clients.mask).sum(axis=1) if clients.mask is not None else per_client)
  if tr['canary'] == 'gradient':
    sgn = canaries.signs(relation, world)
    hooks = hooks._replace(loss=canaries.gradient_canary_loss(
        hooks.loss, num_classes, kw['coordinates'], sgn, norm,
        lambda p: flatten_util.ravel_pytree(p)[0]))
  scores = canaries.train(model.apply, params, clients, key=jax.random.fold_in(key, 5),
                          hooks=hooks, clip_norm=float(s.clip_norm),
                          num_rounds=int(s.num_rounds), optimizer=opt, epochs=int(s.epochs),
                          batch_size=int(s.batch_size),
                          participation=participation, **kw)
  return dict(claimed=claimed, scores=scores, world=world, participation=participation,
              relation=relation, dim=dim)
