"""The compiled programs of the reconstruction pipeline (`fl_privacy.pipelines.reconstruction`).

Compilation, not running, is what a point costs on CPU (5-15 s here against well under a
second of trials), so programs are shared: without a defense, clients of every size n share
one program per (attack, B, capacity, E) (n is an argument; clients padded to the capacity
with a row mask); the strengths of one swept defense share one program (`game.make_trial` of
several games, a `lax.switch`), and so do their utility trainings.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy import report
from fl_privacy.attacks.reconstruction import game as game_lib
from fl_privacy.attacks.reconstruction import inversion
from fl_privacy.eval import runner
from fl_privacy.fl import client
from fl_privacy.fl import local
from fl_privacy.fl import optimizers as optimizers_lib

PREFIX = 'reconstruction'


def output_layer(config) -> str:
  s = config.reconstruction
  return f'fc{len(tuple(s.hidden)) + 1}' if s.model == 'mlp' else 'fc3'


def point_key(key, p: dict):
  """Common random numbers: every attack and defense sees the same clients at (B, J, E)."""
  return report.point_key(key, {k: p[k] for k in ('batch_size', 'num_batches', 'epochs')})


def make_game(config, state, attack: str, batch_size: int, capacity: int, epochs: int,
              hooks) -> game_lib.Game:
  """The game of one program: the config's model, optimizer, imprint and inversion."""
  s = config.reconstruction
  inv = s.inversion
  return game_lib.Game(
      attack=attack, model=state['model'], batch_size=batch_size, capacity=capacity,
      epochs=epochs, optimizer=optimizers_lib.make(s.optimizer, float(s.learning_rate),
                                                   field=f'{PREFIX}.optimizer'),
      output_layer=output_layer(config),
      hooks=None if client.is_identity(hooks) else hooks, num_bins=int(s.imprint.num_bins),
      scale=float(s.imprint.scale), restore_scale=float(s.imprint.restore_scale),
      inversion=inversion.Settings(steps=int(inv.steps), learning_rate=float(inv.learning_rate),
                                   tv_weight=float(inv.tv_weight), restarts=int(inv.restarts)))


def program(config, state, p: dict, group: tuple) -> tuple:
  """(trial_fn, n) of point `p`: one compiled program per (attack, B, capacity, E, defense);
  `group` is the hooks of the defense's strengths (one for an unswept defense).

  Without a defense the clients of a sweep share programs (compilation is what a point costs
  here): one-step points (J = E = 1) run as one minibatch of the attack's largest B with n real
  rows; the others at their B with the capacity of the largest J. Results agree with unshared
  programs to float rounding (recovered pixels within 6e-5; the inversion's identical)."""
  attack, b, j, e = p['attack'], p['batch_size'], p['num_batches'], p['epochs']
  if len(group) > 1 or not client.is_identity(group[0]):
    spec = (attack, b, b * j, e, tuple(id(h) for h in group))
  elif j == 1 and e == 1:
    top = max(q['batch_size'] for q in state['points']
              if q['attack'] == attack and q['num_batches'] == 1 and q['epochs'] == 1)
    spec = (attack, top, top, 1, None)
  else:
    jmax = max(q['num_batches'] for q in state['points']
               if q['attack'] == attack and q['batch_size'] == b)
    spec = (attack, b, b * jmax, e, None)
  cache = state.setdefault('programs', {})
  if spec not in cache:
    cache[spec] = game_lib.make_trial(*(make_game(config, state, *spec[:4], h) for h in group))
  return cache[spec], b * j


def run_options(config) -> dict:
  """`runner.options`, except that on CPU without a `game.batch_bytes` trials run one at a
  time: a point runs its trials in well under a second and compiles for 5-10 s, and a
  `lax.map` of single trials compiles about twice as fast as vmapped groups (measured here:
  12 s vs 23 s for an imprint point). Chunking never changes a trial's outcome."""
  opts = runner.options(config)
  if opts['batch_bytes'] is None and jax.default_backend() == 'cpu':
    opts['batch_bytes'] = 1
  return opts


def simulate(config, state, p: dict, group: tuple, branch: int, key) -> dict:
  """All trials of an attack point (strength `branch` of `group`), outcomes on the host."""
  s = config.reconstruction
  trials = int(s.inversion_trials if p['attack'] == 'inversion' else s.trials)
  opts = run_options(config)
  trial_fn, n = program(config, state, p, group)
  with jax.default_matmul_precision('highest'):
    return runner.run_trials(trial_fn, point_key(key, p), trials, chunk_size=opts['chunk_size'],
                             batch_bytes=opts['batch_bytes'],
                             args=(state['x'], state['y'], state['cuts'], jnp.int32(n),
                                   jnp.int32(branch)))


def utility_trial(model, group: tuple, optimizer, rounds: int, examples: int,
                  batch_size: int):
  """`trial_fn(key, branch, x, y, x_test, y_test)`: test predictions of the honest model one
  client trains for `rounds` rounds of one epoch under `group[branch]` (the server applies
  each upload, so upload defenses cost what they cost), from `examples` drawn from `x`."""
  loss_fn = game_lib.loss_fn_for(model)

  def trial_fn(key, branch, x, y, x_test, y_test):
    return jax.lax.switch(branch, [lambda h=h: train(h, key, x, y, x_test, y_test)
                                   for h in group])

  def train(hooks, key, x, y, x_test, y_test):
    k_init, k_data, k_train = (jax.random.fold_in(key, i) for i in range(3))
    idx = jax.random.permutation(k_data, x.shape[0])[:examples]
    params = model.init(k_init, x[:1])['params']

    def round_(params, r):
      upload, _ = local.client_update(loss_fn, params, x[idx], y[idx],
                                      key=jax.random.fold_in(k_train, r), hooks=hooks,
                                      optimizer=optimizer, epochs=1, batch_size=batch_size)
      return client.apply_update(params, upload), None

    params, _ = jax.lax.scan(round_, params, jnp.arange(rounds))
    return jnp.argmax(model.apply({'params': params}, x_test), -1) == y_test
  return trial_fn




def utility(config, state, key, group: tuple, branch: int) -> np.ndarray:
  """Correct test predictions [trials, test examples] of strength `branch` of `group`: one
  program per group, compiled once (the runner would compile it twice, once to size its
  groups), the trainings one after the other."""
  s = config.reconstruction
  u = s.utility
  cache = state.setdefault('utility_programs', {})
  spec = tuple(id(h) for h in group)
  if spec not in cache:
    fn = utility_trial(state['model'], group,
                       optimizers_lib.make(s.optimizer, float(s.learning_rate)),
                       int(u.rounds), int(u.examples), int(s.center.imprint))
    cache[spec] = jax.jit(lambda keys, b, *a: jax.lax.map(lambda k: fn(k, b, *a), keys))
  keys = jax.random.split(report.point_key(key, {'utility': True}), int(u.trials))
  test = state['test']
  with jax.default_matmul_precision('highest'):
    return np.asarray(cache[spec](keys, jnp.int32(branch), state['x'], state['y'],
                                  jnp.asarray(data_lib.to_float(test.x)), jnp.asarray(test.y)))
