"""Reconstructing clients' inputs from their uploads, under defenses (issue 30), as library code.

`python -m experiments.reconstruction` runs this pipeline (`pipelines.base`). Every attack point
runs `attacks.reconstruction.game` trials through `eval.runner.run_trials` (the client's round
is `fl.local.client_update` with the defense's hooks) and scores them on the host
(`attacks.reconstruction.metrics.point_metrics`). Points: the attacks' grid (batch size B at
one local step; J minibatches; E epochs) under the `defense` section (default none), then, for
each swept defense and strength, its utility (test accuracy of the honest model one client
trains under it) and the `defense_attacks` at their centre. The sweep's defenses:
`pipelines.reconstruction_defenses`; figures and the table: `pipelines.reconstruction_figures`.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy import defenses
from fl_privacy import models
from fl_privacy import report
from fl_privacy import validate
from fl_privacy.attacks.reconstruction import game as game_lib
from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.attacks.reconstruction import inversion
from fl_privacy.attacks.reconstruction import metrics as rec_metrics
from fl_privacy.eval import runner
from fl_privacy.eval import stats
from fl_privacy.fl import client
from fl_privacy.fl import local
from fl_privacy.fl import optimizers as optimizers_lib
from fl_privacy.pipelines import base
from fl_privacy.pipelines import reconstruction_defenses
from fl_privacy.pipelines import reconstruction_figures
from fl_privacy.report import atomic
from fl_privacy.report import summary

NAME = 'reconstruction'
PREFIX = 'reconstruction'
ATTACKS = game_lib.ATTACKS
MODELS = ('mlp', 'flower_cnn')
IMAGES = reconstruction_figures.IMAGES
validate_sweep = reconstruction_defenses.validate_sweep
sweep_points = reconstruction_defenses.sweep_points
attack_setting = reconstruction_defenses.attack_setting
utility_setting = reconstruction_defenses.utility_setting
base_defense = reconstruction_defenses.base_defense
swept_defense = reconstruction_defenses.swept_defense

SUMMARY = (
    summary.Table('Reconstruction (rates over examples: 95% Clopper-Pearson; PSNR: bootstrap '
                  'over trials)', (
        summary.param('attack'), summary.param('defense'), summary.param('strength'),
        summary.param('batch_size', 'B'), summary.param('num_batches', 'J'),
        summary.param('epochs', 'E'), summary.rate('exact', 'exact'),
        summary.rate('recovered', 'PSNR>thr'), summary.metric('psnr_mean', 'PSNR', digits=1),
        summary.metric('ssim_mean', 'SSIM', digits=2), summary.rate('label_acc', 'label'),
        summary.metric('dp_epsilon', 'eps', digits=3), summary.seconds()),
        where={'kind': 'attack'}),
    summary.Table('Utility under each defense (test accuracy: 95% Clopper-Pearson)', (
        summary.param('defense'), summary.param('strength'),
        summary.rate('test_accuracy', 'test acc.'), summary.seconds()),
        where={'kind': 'utility'}),
)


def validate_config(config) -> None:
  """Every check that needs no data."""
  s = config.reconstruction
  p = PREFIX
  data_lib.validate_data_config(config.data)
  validate.subset_of(config, f'{p}.attacks', ATTACKS)
  validate.one_of(config, f'{p}.model', MODELS)
  validate.positive(config, f'{p}.hidden', integer=True)
  validate.one_of(config, f'{p}.padding', ('VALID', 'SAME'))
  for field in ('trials', 'inversion_trials', 'utility.trials'):
    validate.checked(config, f'{p}.{field}', validate.trials())
  for field in ('batch_sizes', 'num_batches', 'epochs', 'center.num_batches', 'center.epochs',
                'imprint.num_bins', 'inversion.steps', 'inversion.restarts', 'utility.rounds',
                'utility.examples', 'bootstrap_resamples', 'grid_images'):
    validate.positive(config, f'{p}.{field}', integer=True)
  for attack in ATTACKS:
    validate.positive(config, f'{p}.center.{attack}', integer=True)
    validate.positive(config, f'{p}.max_examples.{attack}', integer=True)
  validate.one_of(config, f'{p}.optimizer', optimizers_lib.OPTIMIZERS)
  for field in ('learning_rate', 'psnr_threshold', 'imprint.scale', 'imprint.restore_scale',
                'inversion.learning_rate', 'dp_clip'):
    validate.positive(config, f'{p}.{field}')
  validate.in_range(config, f'{p}.inversion.tv_weight', 0.0, float('inf'))
  validate.one_of(config, f'{p}.imprint.statistic', imprint.STATISTICS)
  validate.in_range(config, f'{p}.dp_delta', 0.0, 1.0, low_inclusive=False,
                    high_inclusive=False)
  validate.subset_of(config, f'{p}.defense_attacks', ATTACKS)
  validate.checked(config, f'{p}.multi_step_attacks',
                   validate.Rule(f'a subset of {ATTACKS}', lambda v: set(v) <= set(ATTACKS)))
  validate.subset_of(config, f'{p}.dp_sgd_samplings', ('poisson', 'shuffle'))
  validate_sweep(s.defenses)
  if 'analytic' in s.attacks or 'analytic' in s.defense_attacks:
    validate.require(s.model == 'mlp', f'{p}.model', "'mlp' for the analytic attack (it "
                     'recovers the input of a dense layer with a bias on the input; the '
                     'first layer of flower_cnn is a convolution, which has none to craft '
                     'or read)', s.model)
  runner.validate_options(config)
  defenses.configured.check_honoured(config.defense, NAME, defenses.NAMES,
                                     'the client of every base point runs it')


def grid(config) -> list[dict]:
  """The attacks' points {attack, batch_size, num_batches, epochs}, each once, in order: B at
  one step, then J and E at the attack's centre batch (`center.<attack>`), within
  `max_examples.<attack>`."""
  s = config.reconstruction
  points = []
  for attack in s.attacks:
    b0, top = int(s.center[attack]), int(s.max_examples[attack])
    combos = [(int(b), 1, 1) for b in s.batch_sizes]
    if attack in s.multi_step_attacks:
      combos += ([(b0, int(j), int(s.center.epochs)) for j in s.num_batches] +
                 [(b0, int(s.center.num_batches), int(e)) for e in s.epochs])
    for b, j, e in combos:
      p = dict(attack=attack, batch_size=b, num_batches=j, epochs=e)
      if b * j <= top and p not in points:
        points.append(p)
  return points


def make_model(config, num_classes: int):
  s = config.reconstruction
  if s.model == 'mlp':
    return models.MLP(hidden=tuple(int(h) for h in s.hidden), num_classes=num_classes)
  return models.FlowerCNN(num_classes, padding=s.padding)


def output_layer(config) -> str:
  s = config.reconstruction
  return f'fc{len(tuple(s.hidden)) + 1}' if s.model == 'mlp' else 'fc3'


def prepare(config) -> dict:
  """Validates, loads the splits, sets the imprint thresholds on the public split, and builds
  every defense (so that one that cannot be built stops the run before anything is written)."""
  validate_config(config)
  s = config.reconstruction
  splits = data_lib.load(config.data)
  for field in ('split', 'public_split'):
    validate.require(s[field] in splits, f'{PREFIX}.{field}', f'one of {tuple(splits)}',
                     s[field])
  validate.require(s.public_split != s.split, f'{PREFIX}.public_split', 'a split other than '
                   f'{s.split!r} (the server knows the distribution, not the clients\' data)',
                   s.public_split)
  pool, public = splits[s.split], splits[s.public_split]
  points = grid(config)
  largest = max([p['batch_size'] * p['num_batches'] for p in points] or [1])
  data_lib.require_examples(config.data, f'its {s.split!r} split', len(pool), largest,
                            'the largest client of the sweep')
  validate.require(largest <= len(pool), f'{PREFIX}.batch_sizes', f'clients of at most '
                   f'{len(pool)} examples (the {s.split} split)', largest)
  imprinted = [p['batch_size'] * p['num_batches'] for p in points if p['attack'] == 'imprint']
  imprinted += [int(s.center.imprint)] if 'imprint' in s.defense_attacks and s.defenses else []
  need = max(imprinted or [0])
  validate.require(int(s.imprint.num_bins) >= need, f'{PREFIX}.imprint.num_bins',
                   f'>= {need}, the largest client of the imprint attack (N = J x B: each '
                   'example needs a bin of its own)', s.imprint.num_bins)
  if s.model == 'flower_cnn':
    validate.require(pool.is_image, 'data.name', 'an image dataset for flower_cnn',
                     config.data.name)
  x_public = data_lib.to_float(public.x)
  state = dict(pool=pool, test=public, points=points, sweep=sweep_points(config),
               x=jnp.asarray(data_lib.to_float(pool.x)), y=jnp.asarray(pool.y),
               cuts=jnp.asarray(imprint.thresholds(x_public, int(s.imprint.num_bins),
                                                   s.imprint.statistic), jnp.float32),
               model=make_model(config, pool.num_classes))
  for p in points:
    base_defense(config, state, p)
  for d in state['sweep']:
    for attack in s.defense_attacks:
      swept_defense(config, state, d, attack_setting(config, state, attack))
    swept_defense(config, state, d, utility_setting(config, state))
  return state


def make_game(config, state, attack: str, batch_size: int, capacity: int, epochs: int,
              hooks) -> game_lib.Game:
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


def program(config, state, p: dict, hooks) -> tuple:
  """(trial_fn, n) of point `p`: one compiled program per (attack, B, capacity, E, defense).

  Without a defense the clients of a sweep share programs (compilation is what a point costs
  here): one-step points (J = E = 1) run as one minibatch of the attack's largest B with n real
  rows; the others at their B with the capacity of the largest J. Results agree with unshared
  programs to float rounding (recovered pixels within 6e-5; the inversion's identical)."""
  attack, b, j, e = p['attack'], p['batch_size'], p['num_batches'], p['epochs']
  if not client.is_identity(hooks):
    spec = (attack, b, b * j, e, id(hooks))
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
    cache[spec] = game_lib.make_trial(make_game(config, state, *spec[:4], hooks))
  return cache[spec], b * j


def point_key(key, p: dict):
  """Common random numbers: every attack and defense sees the same clients at (B, J, E)."""
  return report.point_key(key, {k: p[k] for k in ('batch_size', 'num_batches', 'epochs')})


def run_options(config) -> dict:
  """`runner.options`, except that on CPU without a `game.batch_bytes` trials run one at a
  time: a point runs its trials in well under a second and compiles for 5-10 s, and a
  `lax.map` of single trials compiles about twice as fast as vmapped groups (measured here:
  12 s vs 23 s for an imprint point). Chunking never changes a trial's outcome."""
  opts = runner.options(config)
  if opts['batch_bytes'] is None and jax.default_backend() == 'cpu':
    opts['batch_bytes'] = 1
  return opts


def simulate(config, state, p: dict, hooks, key) -> dict:
  """All trials of an attack point, outcomes on the host."""
  s = config.reconstruction
  trials = int(s.inversion_trials if p['attack'] == 'inversion' else s.trials)
  opts = run_options(config)
  trial_fn, n = program(config, state, p, hooks)
  with jax.default_matmul_precision('highest'):
    return runner.run_trials(trial_fn, point_key(key, p), trials, chunk_size=opts['chunk_size'],
                             batch_bytes=opts['batch_bytes'],
                             args=(state['x'], state['y'], state['cuts'], jnp.int32(n)))


def attack_point(config, state, store, key, p: dict, defense: defenses.Configured,
                 extra: dict, images: dict) -> base.Point:
  s = config.reconstruction
  params = dict(kind='attack', **p, **extra)

  def compute():
    out = simulate(config, state, p, defense.hooks, key)
    x, y = np.asarray(state['x']), np.asarray(state['y'])
    n = p['batch_size'] * p['num_batches']
    m = rec_metrics.point_metrics(out, x, y, n=n, rng=data_lib.rng_from_key(point_key(key, p)),
                                  psnr_threshold=float(s.psnr_threshold),
                                  resamples=int(s.bootstrap_resamples))
    m.update(defense.metrics)
    label = reconstruction_figures.label(params)
    images[label] = reconstruction_figures.example_images(out, x, int(s.grid_images), n)
    atomic.atomic_write_text(os.path.join(store.workdir, IMAGES), json.dumps(images))
    return m, int(m['n_trials'])

  return base.Point(params, compute, 'trials')


def utility_trial(model, hooks, optimizer, rounds: int, examples: int, batch_size: int):
  """`trial_fn(key, index, x, y, x_test, y_test)`: test predictions of the honest model one
  client trains for `rounds` rounds of one epoch under `hooks` (the server applies each
  upload, so upload defenses cost what they cost), from `examples` drawn from `x`."""
  loss_fn = game_lib.loss_fn_for(model)

  def trial_fn(key, index, x, y, x_test, y_test):
    del index
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


def utility_point(config, state, key, d: dict, defense: defenses.Configured) -> base.Point:
  s = config.reconstruction
  u = s.utility
  params = dict(kind='utility', **d)

  def compute():
    fn = utility_trial(state['model'], defense.hooks,
                       optimizers_lib.make(s.optimizer, float(s.learning_rate)),
                       int(u.rounds), int(u.examples), int(s.center.imprint))
    test = state['test']
    keys = jax.random.split(report.point_key(key, {'utility': True}), int(u.trials))
    # A few trainings, not a game of many trials: one program, compiled once (the runner
    # would compile it twice, once to size its groups), the trainings one after the other.
    args = (state['x'], state['y'], jnp.asarray(data_lib.to_float(test.x)),
            jnp.asarray(test.y))
    trainings = jax.jit(lambda keys, *a: jax.lax.map(lambda k: fn(k, 0, *a), keys))
    with jax.default_matmul_precision('highest'):
      correct = np.asarray(trainings(keys, *args))
    m = stats.rate('test_accuracy', int(np.sum(correct)), int(np.size(correct)))
    m.update({f'utility_{k}': v for k, v in defense.metrics.items()})
    return m, int(u.trials)

  return base.Point(params, compute, 'trainings')


def plan(config, state, store, key) -> list[base.Point]:
  """The grid under the `defense` section, then each swept defense: utility, then attacks."""
  s = config.reconstruction
  images = atomic.read_json(os.path.join(store.workdir, IMAGES), {})
  points = []
  for p in state['points']:
    d = base_defense(config, state, p)
    extra = {'strength': None, **d.params}
    points.append(attack_point(config, state, store, key, p, d, extra, images))
  if state['sweep']:
    none = {'defense': 'none', 'strength': None}
    points.append(utility_point(config, state, key, none, defenses.Configured(
        hooks=client.IDENTITY, params={'defense': 'none'}, metrics={})))
  for d in state['sweep']:
    points.append(utility_point(config, state, key, d,
                                swept_defense(config, state, d, utility_setting(config, state))))
    for attack in s.defense_attacks:
      p = dict(attack=attack, batch_size=int(s.center[attack]),
               num_batches=int(s.center.num_batches), epochs=int(s.center.epochs))
      conf = swept_defense(config, state, d, attack_setting(config, state, attack))
      points.append(attack_point(config, state, store, key, p, conf, d, images))
  return points


def figures(config, state, store, key) -> None:
  """The image grid, the defense curves and the markdown table."""
  del state, key
  images = atomic.read_json(os.path.join(store.workdir, IMAGES), {})
  reconstruction_figures.write_all(config, store.points, images, store.workdir)
