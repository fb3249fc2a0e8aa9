"""The compiled programs of the reconstruction pipeline (`fl_privacy.pipelines.reconstruction`).

Trials run vmapped (`eval.runner.run_trials`, groups sized by `game.batch_bytes`), as the other
games. Compilation is still a large share of a point on CPU (4-10 s against 1-2 s for 1,000
imprint trials here), so programs are shared: without a defense, clients of every size n share
one program per (attack, B, capacity, E) (n is an argument; clients padded to the capacity
with a row mask); the strengths of one swept defense share one program (`game.make_trial` of
several games, a `lax.switch`), and so do their utility trainings; the client's learning rate
and the imprint's restore scale are traced operands (`game.Knobs`), and the thresholds an
argument, so the learning-rate sweep and the adaptive server's tuning grid (`tune`) reuse the
programs of the points they sit beside.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy import report
from fl_privacy.attacks.reconstruction import game as game_lib
from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.attacks.reconstruction import inversion
from fl_privacy.attacks.reconstruction import metrics as rec_metrics
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
              hooks, num_bins: int | None = None) -> game_lib.Game:
  """The game of one program: the config's model, optimizer, imprint (of `num_bins` units;
  None: the config's) and inversion."""
  s = config.reconstruction
  inv = s.inversion
  return game_lib.Game(
      attack=attack, model=state['model'], batch_size=batch_size, capacity=capacity,
      epochs=epochs, optimizer=str(s.optimizer), learning_rate=float(s.learning_rate),
      output_layer=output_layer(config),
      hooks=None if client.is_identity(hooks) else hooks,
      num_bins=int(s.imprint.num_bins if num_bins is None else num_bins),
      scale=float(s.imprint.scale), restore_scale=float(s.imprint.restore_scale),
      inversion=inversion.Settings(steps=int(inv.steps), learning_rate=float(inv.learning_rate),
                                   tv_weight=float(inv.tv_weight), restarts=int(inv.restarts)))


def program(config, state, p: dict, group: tuple, num_bins: int | None = None) -> tuple:
  """(trial_fn, n) of point `p`: one compiled program per (attack, B, capacity, E, defense,
  imprint width); `group` is the hooks of the defense's strengths (one for an unswept
  defense); `num_bins` an adaptive server's other width (None: the config's).

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
  width = int(config.reconstruction.imprint.num_bins if num_bins is None else num_bins)
  spec += (width,)
  cache = state.setdefault('programs', {})
  if spec not in cache:
    cache[spec] = game_lib.make_trial(*(make_game(config, state, *spec[:4], h, width)
                                        for h in group))
  return cache[spec], b * j


# Trials per chunk unless `game.chunk_size` says otherwise: one chunk shape for every run of a
# program (1,000 private trials in 16 chunks, the last padded; an adaptive server's 64 public
# ones in one), so that the tuning compiles nothing new.
CHUNK = 64


def run_options(config) -> dict:
  """`runner.options`, chunks of `CHUNK` by default: vmapped groups of trials sized by
  `game.batch_bytes` (1,000 imprint trials of B = 8 run in about 1.2 s here, against 32 one
  at a time in about the same time before). Chunking never changes a trial's outcome
  (`eval.runner`)."""
  opts = runner.options(config)
  if opts['chunk_size'] is None:
    opts['chunk_size'] = CHUNK
  return opts


def knobs_of(config, state, p: dict, restore_scale: float | None = None,
             public: bool = False, structure: str = 'cumulative',
             rounds: int = 1) -> game_lib.Knobs:
  """The traced knobs of point `p`: its learning rate (the config's unless `p` sweeps one),
  the restore scale, the imprint's structure and the rounds averaged (the config's, the
  paper's and 1 unless an adaptive server chose others), and the size of the pool its clients
  draw from (the clients' split, or the adaptive server's tuning pool)."""
  s = config.reconstruction
  return game_lib.knobs(float(s.imprint.restore_scale if restore_scale is None
                              else restore_scale),
                        float(p.get('learning_rate', s.learning_rate)),
                        state['tune_size' if public else 'pool_size'],
                        sparse=structure == 'sparse', rounds=int(rounds))


def simulate(config, state, p: dict, group: tuple, branch: int, key, *,
             knobs: game_lib.Knobs | None = None, cuts=None, public: bool = False,
             trials: int | None = None, num_bins: int | None = None) -> dict:
  """All trials of an attack point (strength `branch` of `group`), outcomes on the host.

  `knobs` / `cuts` default to the point's (`knobs_of`) and the config's thresholds. `public`
  draws the clients from the tuning pool with other keys (the adaptive server's own
  simulation, `tune`), never the clients' split nor the public data of the thresholds. `num_bins`: the imprint's width (None: the
  config's; another width is another program)."""
  s = config.reconstruction
  if trials is None:
    trials = int(s.inversion_trials if p['attack'] == 'inversion' else s.trials)
  opts = run_options(config)
  trial_fn, n = program(config, state, p, group, num_bins)
  run_key = point_key(key, p)
  x, y = state['x'], state['y']
  if public:
    run_key = jax.random.fold_in(run_key, PUBLIC_STREAM)
    x, y = state['x_tune'], state['y_tune']
  with jax.default_matmul_precision('highest'):
    return runner.run_trials(trial_fn, run_key, int(trials), chunk_size=opts['chunk_size'],
                             batch_bytes=opts['batch_bytes'],
                             args=(x, y, state['cuts'] if cuts is None else cuts, jnp.int32(n),
                                   jnp.int32(branch), knobs_of(config, state, p, public=public)
                                   if knobs is None else knobs))


# The adaptive server's simulated clients draw from this stream of the point's key (the private
# clients use the point's key itself): tuning never sees a private client's draw.
PUBLIC_STREAM = 0x7075626C


def candidates(config, n: int) -> list[tuple[float, str, int, str]]:
  """The adaptive server's grid (restore scale, placement, width, structure) for clients of n
  examples (widths of fewer than n bins left out), the fixed attack's setting first (so that a
  tie keeps the paper's)."""
  s = config.reconstruction
  a = s.adaptive
  width = int(s.imprint.num_bins)
  widths = [width] + [int(w) for w in a.num_bins if int(w) != width and int(w) >= n]
  grid = [(float(r), str(q), w, str(k)) for w in widths for k in a.structures
          for q in a.placements for r in a.restore_scales]
  fixed = fixed_setting(config)
  return [fixed] + [g for g in grid if g != fixed]


def fixed_setting(config) -> tuple[float, str, int, str]:  # pylint: disable=invalid-name
  """The paper's server as configured: (restore scale, 'quantile', width, 'cumulative')."""
  s = config.reconstruction
  return (float(s.imprint.restore_scale), 'quantile', int(s.imprint.num_bins), 'cumulative')


def cuts_for(config, state, placement: str, num_bins: int) -> jax.Array:
  """The thresholds of `placement` for a layer of `num_bins` units, from the public split."""
  cache = state.setdefault('cuts_by', {})
  if (placement, num_bins) not in cache:
    s = config.reconstruction
    cache[(placement, num_bins)] = jnp.asarray(imprint.thresholds(
        np.asarray(state['x_public'])[:int(state['public_size'])], int(num_bins),
        s.imprint.statistic, placement), jnp.float32)
  return cache[(placement, num_bins)]


def _public_score(config, state, p, group, branch, key, setting, rounds) -> dict:
  """One setting's counts on the tuning pool: examples recovered above the PSNR threshold,
  exactly and exactly after rounding to the value grid."""
  s = config.reconstruction
  restore, placement, width, structure = setting
  n = p['batch_size'] * p['num_batches']
  trials = int(s.adaptive.trials)
  out = simulate(config, state, p, group, branch, key, public=True, trials=trials,
                 cuts=cuts_for(config, state, placement, width),
                 knobs=knobs_of(config, state, p, restore, public=True, structure=structure,
                                rounds=rounds), num_bins=width)
  x_tune = np.asarray(state['x_tune'])
  rec = exact = 0
  for t in range(trials):
    sc = rec_metrics.trial_scores(out['recovered'][t], out['valid'][t],
                                  x_tune[np.asarray(out['index'][t])[:n]],
                                  psnr_threshold=float(s.psnr_threshold),
                                  grid=state.get('grid'))
    rec, exact = rec + int(sc['recovered']), exact + int(sc['exact_grid'])
  return dict(restore_scale=restore, placement=placement, num_bins=width,
              structure=structure, rounds=int(rounds), recovered=rec, exact=exact)


def tune(config, state, p: dict, group: tuple, branch: int, key) -> dict:
  """The adaptive server's choice for point `p` under strength `branch` of `group`.

  The server knows the defense (it is announced; its strength too) and simulates it on
  `adaptive.trials` clients of the point's size drawn from the tuning pool (examples held out
  of the clients' split, apart from the public split that sets the thresholds, the value grid
  and the utility's test accuracy; keys of their own). Two passes: every (restore scale,
  placement, width, structure) of `candidates` in one round, then the best of them averaged
  over each of `adaptive.rounds` (the defense's noise fresh each round). A setting scores the
  examples recovered above the PSNR threshold, then those exact after rounding to the value
  grid; ties keep the earlier candidate (the fixed setting first) and the fewer rounds. The
  private clients are never read. Returns the choice and every candidate's public counts."""
  s = config.reconstruction
  n = p['batch_size'] * p['num_batches']
  order = lambda sc: (sc['recovered'], sc['exact'])
  scores = [_public_score(config, state, p, group, branch, key, c, 1)
            for c in candidates(config, n)]
  best = max(range(len(scores)), key=lambda i: (*order(scores[i]), -i))
  chosen = scores[best]
  setting = (chosen['restore_scale'], chosen['placement'], chosen['num_bins'],
             chosen['structure'])
  for r in sorted({int(r) for r in s.adaptive.rounds} - {1}):
    sc = _public_score(config, state, p, group, branch, key, setting, r)
    scores.append(sc)
    if order(sc) > order(chosen):
      chosen = sc
  return dict(chosen, examples=int(s.adaptive.trials) * n, candidates=scores)


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
                       optimizers_lib.make(s.optimizer, float(s.learning_rate),
                                           field=f'{PREFIX}.optimizer'),
                       int(u.rounds), int(u.examples), int(s.center.imprint))
    cache[spec] = jax.jit(lambda keys, b, *a: jax.lax.map(lambda k: fn(k, b, *a), keys))
  keys = jax.random.split(report.point_key(key, {'utility': True}), int(u.trials))
  test = state['test']
  with jax.default_matmul_precision('highest'):
    real = int(state['pool_size'])
    return np.asarray(cache[spec](keys, jnp.int32(branch), state['x'][:real], state['y'][:real],
                                  jnp.asarray(data_lib.to_float(test.x)), jnp.asarray(test.y)))
