"""Reconstructing clients' inputs from their uploads, under defenses (issue 30), as library code.

`python -m experiments.reconstruction` runs this pipeline (`pipelines.base`). Every attack point
runs `attacks.reconstruction.game` trials through `eval.runner.run_trials` (the client's round
is `fl.local.client_update` with the defense's hooks) and scores them on the host
(`attacks.reconstruction.metrics.point_metrics`). Points: the imprint's centre first, then for
each swept defense and strength its utility (test accuracy of the honest model one client
trains under it, over several trainings) and the `defense_attacks` at their centre, then the
rest of the attacks' grid (batch size B at one local step; J minibatches; E epochs, each
multi-step point also at the `learning_rates`) under the `defense` section (default none).
The imprint runs by the paper's fixed server and beside it the adaptive server (issue 49:
`reconstruction_runs.tune` chooses restore scale, thresholds, width, structure and rounds on a
tuning pool held out of the clients' split, `tuning_split`, then attacks the same private
clients; the paired difference per client). The points: `pipelines.reconstruction_points`;
the sweep's defenses: `pipelines.reconstruction_defenses`; the compiled programs (shared
across client sizes and across a defense's strengths): `pipelines.reconstruction_runs`;
figures and the table: `pipelines.reconstruction_figures`.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy import defenses
from fl_privacy import models
from fl_privacy import validate
from fl_privacy.attacks.reconstruction import game as game_lib
from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.attacks.reconstruction import value_grid
from fl_privacy.eval import runner
from fl_privacy.fl import client
from fl_privacy.fl import optimizers as optimizers_lib
from fl_privacy.pipelines import base
from fl_privacy.pipelines import reconstruction_checks
from fl_privacy.pipelines import reconstruction_defenses
from fl_privacy.pipelines import reconstruction_figures
from fl_privacy.pipelines import reconstruction_points as points_lib
from fl_privacy.pipelines import reconstruction_runs as runs
from fl_privacy.report import atomic
from fl_privacy.report import summary

NAME = 'reconstruction'
PREFIX = 'reconstruction'
ATTACKS = game_lib.ATTACKS
MODELS = ('mlp', 'flower_cnn')
# The most rounds an adaptive server averages (each is a client round per trial).
MAX_ROUNDS = 64
# The stream of the config's seed that draws the tuning pool out of the clients' split.
TUNE_STREAM = 0x74756E65
IMAGES = reconstruction_figures.IMAGES
attack_point = points_lib.attack_point
utility_point = points_lib.utility_point
validate_sweep = reconstruction_defenses.validate_sweep
sweep_points = reconstruction_defenses.sweep_points
attack_setting = reconstruction_defenses.attack_setting
utility_setting = reconstruction_defenses.utility_setting
base_defense = reconstruction_defenses.base_defense
swept_defense = reconstruction_defenses.swept_defense
output_layer = runs.output_layer
point_key = runs.point_key

SUMMARY = (
    summary.Table('Reconstruction (rates over examples, 95% intervals with the client as the '
                  'unit; adaptive - fixed: paired over clients; PSNR: bootstrap over trials)', (
        summary.param('attack'), summary.param('server'), summary.param('defense'),
        summary.param('strength'), summary.param('batch_size', 'B'),
        summary.param('num_batches', 'J'), summary.param('epochs', 'E'),
        summary.param('learning_rate', 'lr'), summary.rate('exact', 'exact'),
        summary.rate('exact_grid', 'exact, grid'), summary.rate('recovered', 'PSNR>thr'),
        summary.rate('recovered_diff', 'adapt.-fixed'), summary.metric('psnr_mean', 'PSNR', digits=1),
        summary.metric('ssim_mean', 'SSIM', digits=2), summary.rate('label_acc', 'label'),
        summary.metric('dp_epsilon', 'eps', digits=3), summary.seconds()),
        where={'kind': 'attack'}),
    summary.Table('Utility under each defense (test accuracy: 95% interval, trainings as '
                'clusters)', (
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
  positives = validate.Rule('a tuple of finite numbers > 0 (empty: none)', lambda v: all(
      isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < float('inf')
      for x in v))
  for field in ('learning_rates', 'adaptive.restore_scales'):
    validate.checked(config, f'{p}.{field}', positives)
  validate.subset_of(config, f'{p}.adaptive.placements', imprint.PLACEMENTS)
  validate.subset_of(config, f'{p}.adaptive.structures', imprint.STRUCTURES)
  validate.checked(config, f'{p}.adaptive.rounds', validate.Rule(
      f'a tuple of integers in [1, {MAX_ROUNDS}] (the rounds the adaptive server may average; '
      'empty or (1,): one round)', lambda v: all(
          isinstance(r, int) and not isinstance(r, bool) and 1 <= r <= MAX_ROUNDS for r in v)))
  validate.positive(config, f'{p}.adaptive.pool', integer=True)
  validate.one_of(config, f'{p}.adaptive.multi_step', (True, False))
  validate.checked(config, f'{p}.adaptive.num_bins', validate.Rule(
      'a tuple of integers >= 1 (other widths of the imprint layer; empty: the config\'s '
      'only)', lambda v: all(isinstance(w, int) and not isinstance(w, bool) and 1 <= w <= 4096
                             for w in v)))
  validate.checked(config, f'{p}.adaptive.trials', validate.trials())
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
  reconstruction_checks.check_swept_values(config)
  defenses.configured.check_honoured(config.defense, NAME, defenses.NAMES,
                                     'the client of every base point runs it')


def unused_fields(config) -> dict[str, str]:
  """The `reconstruction` fields this run does not read (`base.unused`: a command-line override
  of one is refused rather than recorded as if it ran): the other model's widths or padding,
  an attack's fields when it runs at no point (`attacks`, and `defense_attacks` when a defense
  is swept), the J and E sweeps without a multi-step attack, the defense sweep's fields
  without a swept defense, DP-SGD's samplings without DP-SGD, the clip and delta without a DP
  defense. {} for a config validation refuses (it names the field itself)."""
  s = config.reconstruction
  p = PREFIX
  try:
    swept = {str(n) for n, v in s.defenses.items() if len(tuple(v))}
    attacks = set(s.attacks) | (set(s.defense_attacks) if swept else set())
    multi = set(s.multi_step_attacks) & set(s.attacks)
    model = str(s.model)
    adaptive = len(tuple(s.adaptive.restore_scales)) > 0
  except (TypeError, AttributeError, KeyError):
    return {}
  out: dict[str, str] = {}
  if model == 'mlp':
    out[f'{p}.padding'] = "read only by model 'flower_cnn' (the model is 'mlp')"
  else:
    out[f'{p}.hidden'] = f"read only by model 'mlp' (the model is {model!r})"
  for attack in ATTACKS:
    if attack in attacks:
      continue
    why = f'{attack!r} runs at no point (not in attacks, nor in a swept defense_attacks)'
    fields = [f'center.{attack}', f'max_examples.{attack}']
    if attack in ('imprint', 'inversion'):
      fields += [f'{attack}.{f}' for f in s[attack].keys()]
    if attack == 'inversion':
      fields.append('inversion_trials')
    if attack == 'imprint':
      fields += [f'adaptive.{f}' for f in s.adaptive.keys()]
    out.update({f'{p}.{f}': why for f in fields})
  if 'imprint' in attacks and not adaptive:
    why = 'read only by the adaptive server, which adaptive.restore_scales = () turns off'
    out.update({f'{p}.adaptive.{f}': why for f in ('placements', 'trials', 'num_bins',
                                                    'structures', 'rounds', 'pool',
                                                    'multi_step')})
  if not multi or 'imprint' not in multi:
    out.setdefault(f'{p}.adaptive.multi_step', 'read only by the imprint\'s J and E sweeps, '
                   'which multi_step_attacks leaves out')
  if not multi:
    why = 'read only by the J and E sweeps, which no attack of multi_step_attacks runs'
    out.update({f'{p}.{f}': why for f in ('num_batches', 'epochs', 'learning_rates')})
  elif max(list(s.num_batches) + [int(s.center.num_batches)]) * max(
      list(s.epochs) + [int(s.center.epochs)]) <= 1:
    out[f'{p}.learning_rates'] = ('read only by points of more than one step, which the J and '
                                  'E sweeps (num_batches, epochs) do not reach')
  if not swept:
    out[f'{p}.defense_attacks'] = 'read only by the defense sweep (every defense is empty)'
    if not multi:
      why = ('read only by the J and E sweeps and the defense sweep, which no attack of '
             'multi_step_attacks and no defense runs')
      out.update({f'{p}.center.{f}': why for f in ('num_batches', 'epochs')})
  if 'dp_sgd' not in swept:
    out[f'{p}.dp_sgd_samplings'] = 'read only by dp_sgd, which the defense sweep leaves empty'
  if not swept & {'dp_sgd', 'update_dp'}:
    why = 'read only by dp_sgd and update_dp, which the defense sweep leaves empty'
    out.update({f'{p}.{f}': why for f in ('dp_clip', 'dp_delta')})
  return out


def grid(config) -> list[dict]:
  """The attacks' points {attack, batch_size, num_batches, epochs, learning_rate}, each once,
  in order: B at one step, then J and E at the attack's centre batch (`center.<attack>`),
  within `max_examples.<attack>`, at the client's `learning_rate`; then every point of more
  than one step again at each of `learning_rates` (the rate drives the drift between steps)."""
  s = config.reconstruction
  lr0 = float(s.learning_rate)
  points = []
  for attack in s.attacks:
    b0, top = int(s.center[attack]), int(s.max_examples[attack])
    combos = [(int(b), 1, 1) for b in s.batch_sizes]
    if attack in s.multi_step_attacks:
      combos += ([(b0, int(j), int(s.center.epochs)) for j in s.num_batches] +
                 [(b0, int(s.center.num_batches), int(e)) for e in s.epochs])
    mine = []
    for b, j, e in combos:
      p = dict(attack=attack, batch_size=b, num_batches=j, epochs=e, learning_rate=lr0)
      if b * j <= top and p not in mine:
        mine.append(p)
    mine += [dict(p, learning_rate=float(lr)) for lr in s.learning_rates
             if float(lr) != lr0 for p in list(mine) if p['num_batches'] * p['epochs'] > 1]
    points += mine
  return points


def make_model(config, num_classes: int):
  s = config.reconstruction
  if s.model == 'mlp':
    return models.MLP(hidden=tuple(int(h) for h in s.hidden), num_classes=num_classes)
  return models.FlowerCNN(num_classes, padding=s.padding)


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
  adaptive = len(tuple(s.adaptive.restore_scales)) > 0 and 'imprint' in (
      tuple(s.attacks) + tuple(s.defense_attacks))
  # PSNR and SSIM read pixels in [0, 1] and the figures draw images: feature vectors have
  # neither (they reached matplotlib after the results were written). Checked first: the
  # dataset is the more basic mistake than any size drawn from it.
  validate.require(pool.is_image, 'data.name', 'an image dataset (reconstruction scores and '
                   'draws images: PSNR, SSIM on pixels in [0, 1])',
                   f'{config.data.name}, feature vectors of {tuple(pool.x.shape[1:])}')
  clients, tuning = tuning_split(config, len(pool), adaptive)
  points = grid(config)
  largest = max([p['batch_size'] * p['num_batches'] for p in points] or [1])
  data_lib.require_examples(config.data, f'its {s.split!r} split', len(pool), largest,
                            'the largest client of the sweep')
  validate.require(largest <= len(clients), f'{PREFIX}.batch_sizes', f'clients of at most '
                   f'{len(clients)} examples (the {s.split} split less the tuning pool, '
                   'adaptive.pool)', largest)
  imprinted = [p['batch_size'] * p['num_batches'] for p in points if p['attack'] == 'imprint']
  imprinted += [int(s.center.imprint)] if 'imprint' in s.defense_attacks and s.defenses else []
  need = max(imprinted or [0])
  validate.require(int(s.imprint.num_bins) >= need, f'{PREFIX}.imprint.num_bins',
                   f'>= {need}, the largest client of the imprint attack (N = J x B: each '
                   'example needs a bin of its own)', s.imprint.num_bins)
  if any(len(tuple(v)) for v in s.defenses.values()):
    # The utility client trains on minibatches of the imprint's B from its examples; more
    # examples than the split ran on the whole split while the config said otherwise.
    u = int(s.utility.examples)
    validate.require(int(s.center.imprint) <= u <= len(clients),
                     f'{PREFIX}.utility.examples', f'in [center.imprint = {s.center.imprint} '
                     f'(its minibatch), {len(clients)} (the {s.split} split less the tuning '
                     'pool)]', u)
  if 'imprint' in s.attacks + tuple(s.defense_attacks) and len(tuple(s.adaptive.restore_scales)):
    n0 = int(s.center.imprint) * int(s.center.num_batches)
    validate.require(n0 <= len(tuning), f'{PREFIX}.adaptive.pool', f'at least {n0} examples '
                     '(the tuning pool from which the adaptive server draws its simulated '
                     'clients of center.imprint x center.num_batches)', s.adaptive.pool)
    validate.require(all(int(w) >= n0 for w in s.adaptive.num_bins),
                     f'{PREFIX}.adaptive.num_bins', f'widths of at least {n0} bins (the '
                     'clients the adaptive server attacks: center.imprint x '
                     'center.num_batches examples, each needing a bin)',
                     tuple(s.adaptive.num_bins))
  model = make_model(config, pool.num_classes)
  try:
    jax.eval_shape(model.init, jax.random.key(0),
                   jax.ShapeDtypeStruct((1,) + tuple(pool.x.shape[1:]), jnp.float32))
  except Exception as e:  # pylint: disable=broad-except
    # A model whose layers do not fit the inputs (FlowerCNN's VALID convolutions shrink an
    # 8x8 image to nothing) failed in the first point's compilation, after the results opened.
    raise validate.ConfigError(f'{PREFIX}.model', f'a model that takes '
                               f'{tuple(pool.x.shape[1:])} inputs (padding {s.padding!r})',
                               s.model) from e
  reconstruction_checks.check_sizes(config, pool, points, model)
  x_public = data_lib.to_float(public.x)
  cuts = jnp.asarray(imprint.thresholds(x_public, int(s.imprint.num_bins), s.imprint.statistic),
                     jnp.float32)
  x_all, y_all = data_lib.to_float(pool.x), np.asarray(pool.y)
  # Both pools padded to one length (real rows first; `game.draw` reads only those): the
  # adaptive server's tuning clients run in the private clients' programs.
  rows = max(len(clients), len(tuning), 1)
  pad = lambda a: jnp.asarray(np.concatenate([a, np.zeros((rows - len(a),) + a.shape[1:],
                                                          a.dtype)]))
  state = dict(pool=pool, test=public, points=points, sweep=sweep_points(config),
               x=pad(x_all[clients]), y=pad(y_all[clients]),
               x_tune=pad(x_all[tuning]), y_tune=pad(y_all[tuning]),
               x_public=x_public, pool_size=len(clients), tune_size=len(tuning),
               public_size=len(public), grid=value_grid.learn(x_public),
               cuts=cuts, cuts_by={('quantile', int(s.imprint.num_bins)): cuts}, model=model)
  for p in points:
    base_defense(config, state, p)
  for d in state['sweep']:
    for attack in s.defense_attacks:
      swept_defense(config, state, d, attack_setting(config, state, attack))
    swept_defense(config, state, d, utility_setting(config, state))
  return state


def tuning_split(config, size: int, adaptive: bool) -> tuple[np.ndarray, np.ndarray]:
  """(client rows, tuning rows) of the clients' split of `size` examples: `adaptive.pool`
  examples drawn at random (the config's seed, a stream of its own) are held out for the
  adaptive server's simulated clients, so that its tuning sees neither a private client's
  example nor the public split that sets its thresholds, the value grid and the utility's
  test accuracy. Without the adaptive server every row is a client's."""
  rows = np.arange(size)
  if not adaptive:
    return rows, rows[:0]
  k = int(config.reconstruction.adaptive.pool)
  validate.require(k < size, f'{PREFIX}.adaptive.pool', f'fewer than {size} examples (the '
                   f'{config.reconstruction.split} split; the rest are the clients\')',
                   config.reconstruction.adaptive.pool)
  rng = np.random.default_rng(np.random.SeedSequence([int(config.seed), TUNE_STREAM]))
  held = np.zeros(size, bool)
  held[rng.choice(size, k, replace=False)] = True
  return rows[~held], rows[held]


def groups(state) -> dict:
  """The sweep's points by (defense, sampling), strengths in config order: one program each."""
  out = {}
  for d in state['sweep']:
    out.setdefault((d['defense'], d.get('dp_sgd_sampling')), []).append(d)
  return out


def plan(config, state, store, key) -> list[base.Point]:
  """The imprint's centre point (both servers), then each swept defense (utility, then
  attacks), then the rest of the grid under the `defense` section: the defense table first,
  so that a run cut short has it (a point's numbers do not depend on the order: its clients
  come from `runs.point_key`)."""
  s = config.reconstruction
  images = atomic.read_json(os.path.join(store.workdir, IMAGES), {})
  adaptive = len(tuple(s.adaptive.restore_scales)) > 0
  centre = center_point(config, 'imprint')
  first, rest = [], []
  for p in state['points']:
    d = base_defense(config, state, p)
    extra = {'strength': None, **d.params}
    mine = first if p == centre else rest
    mine.append(attack_point(config, state, store, key, p, d, extra, images))
    if adaptive and adaptive_at(config, p):
      mine.append(attack_point(config, state, store, key, p, d, extra, images,
                               server='adaptive'))
  points = first
  if state['sweep']:
    none = {'defense': 'none', 'strength': None}
    points.append(utility_point(config, state, key, none, defenses.Configured(
        hooks=client.IDENTITY, params={'defense': 'none'}, metrics={})))
  for members in groups(state).values():
    util = [swept_defense(config, state, d, utility_setting(config, state)) for d in members]
    confs = {a: [swept_defense(config, state, d, attack_setting(config, state, a))
                 for d in members] for a in s.defense_attacks}
    for i, d in enumerate(members):
      points.append(utility_point(config, state, key, d, util[i],
                                  tuple(c.hooks for c in util), i))
      for attack in s.defense_attacks:
        p = center_point(config, attack)
        hooks = tuple(c.hooks for c in confs[attack])
        points.append(attack_point(config, state, store, key, p, confs[attack][i], d, images,
                                   hooks, i))
        if adaptive and attack == 'imprint':
          points.append(attack_point(config, state, store, key, p, confs[attack][i], d,
                                     images, hooks, i, server='adaptive'))
  return points + rest


def adaptive_at(config, p: dict) -> bool:
  """Whether the adaptive server attacks grid point `p` beside the fixed one: the imprint's
  centre, and with `adaptive.multi_step` every imprint point of more than one step."""
  s = config.reconstruction
  if p['attack'] != 'imprint' or not len(tuple(s.adaptive.restore_scales)):
    return False
  return p == center_point(config, 'imprint') or (
      bool(s.adaptive.multi_step) and p['num_batches'] * p['epochs'] > 1)


def center_point(config, attack: str) -> dict:
  """The point the defense sweep attacks: the attack's centre B, J, E, the client's rate."""
  s = config.reconstruction
  return dict(attack=attack, batch_size=int(s.center[attack]),
              num_batches=int(s.center.num_batches), epochs=int(s.center.epochs),
              learning_rate=float(s.learning_rate))


def figures(config, state, store, key) -> None:
  """The image grid, the defense curves and the markdown table."""
  del state, key
  images = atomic.read_json(os.path.join(store.workdir, IMAGES), {})
  reconstruction_figures.write_all(config, store.points, images, store.workdir)
