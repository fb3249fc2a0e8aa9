"""Active membership inference under LDP (Nguyen et al., AISTATS 2023): the pipeline.

What `python -m experiments.ami` runs (the command, its outputs and every config field:
experiments/ami.py and configs/_ami.py). `prepare(config)` validates the config, loads the data
and computes the features of every role (targets, the adversary's crafting and held-out
negatives, the game pool); `sweep(config, state, store, key)` runs one point per
(mechanism, epsilon) (`run_game_point`: craft, play, certify, utility) and per DP-SGD averaging
setting (`run_dp_point`), then writes the figures (`fl_privacy.pipelines.ami_figures`).
"""

from __future__ import annotations

import functools
import math
import os
import time
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy import defenses
from fl_privacy import models
from fl_privacy import report
from fl_privacy import validate
from fl_privacy.attacks import ami
from fl_privacy.attacks.ami import certified
from fl_privacy.attacks.ami import dp_averaging
from fl_privacy.eval import compile_cache
from fl_privacy.eval import metrics as metrics_lib
from fl_privacy.eval import runner
from fl_privacy.eval import stats
from fl_privacy.eval import utility
from fl_privacy.fl import losses
from fl_privacy.mechanisms import fixed_point
from fl_privacy.pipelines import ami_figures
from fl_privacy.report import progress
from fl_privacy.report import summary
from fl_privacy.report import ResultsStore
from fl_privacy.report import run_point


DECISION_PATHS = ('fast', 'gradient')
# Defenses the AMI client can run: those acting on the batch it trains on (`data`, `batch`
# hooks). The input mechanisms stay in `ami.mechanisms`; update and DP defenses act on what
# the attack does not read on its fast path (see docs/defenses.md).
AMI_DEFENSES = ('none', 'mixup', 'augment', 'sampling')
DP_RULES = dp_averaging.RULES
CHOSEN_INDEX = 0  # the chosen neuron is unit 0 of fc2

# The headline columns: logged per saved point and printed as a table at the end of a run.
SUMMARY = (
    summary.Table('Membership inference game (Adv: the paper\'s rule, and our calibrated '
                  'variant; 95% intervals)', (
        summary.param('mechanism'), summary.param('epsilon'), summary.rate('adv', 'Adv'),
        summary.rate('adv_calibrated', 'Adv calibrated'),
        summary.metric('tpr', 'TPR'), summary.metric('tnr', 'TNR'),
        summary.metric('accuracy', 'accuracy'),
        summary.metric('certified_fraction', 'certified', digits=2), summary.seconds()),
                  where={'part': 'game'}),
    summary.Table('DP-SGD noise averaging: rounds needed (Appendix E)', (
        summary.param('epsilon'), summary.param('dp_delta', 'delta'),
        summary.param('num_chosen', 'K'),
        summary.metric('rounds_closed_form', 'closed form', digits=0),
        summary.metric('rounds_monte_carlo', 'Monte Carlo', digits=0)),
                  where={'part': 'dp_averaging'}),
)


# ----------------------------------------------------------------------------------------------
# Validation and data.


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def validate_config(config) -> None:
  """Every check that needs no data; raises `ConfigError` naming the field."""
  data_lib.validate_data_config(config.data)
  runner.validate_options(config)
  mechanisms = validate.subset_of(config, 'ami.mechanisms', ami.MECHANISMS)
  if any(m != 'none' for m in mechanisms):
    validate.positive(config, 'ami.epsilons')
  for field in ('batch_size', 'num_trials', 'num_targets', 'num_neurons', 'hidden2', 'copies',
                'max_steps', 'certified_draws', 'dp_trials', 'utility_steps'):
    validate.positive(config, f'ami.{field}', integer=True)
  validate.require(config.ami.num_trials >= 2, 'ami.num_trials', 'an integer >= 2',
                   config.ami.num_trials)
  q = config.ami.certified_samples
  validate.require(_is_int(q) and q >= 0, 'ami.certified_samples',
                   'an integer >= 0 (0 = the whole game pool)', q)
  mn = config.ami.max_negatives
  validate.require(_is_int(mn) and mn >= 0, 'ami.max_negatives', 'an integer >= 0 (0 = all)',
                   mn)
  for field in ('learning_rate', 'utility_learning_rate', 'class_weights', 'dp_epsilons',
                'dp_signal', 'feature_scale'):
    validate.positive(config, f'ami.{field}')
  validate.require(len(tuple(config.ami.class_weights)) == 2, 'ami.class_weights',
                   '(negative, positive)', config.ami.class_weights)
  validate.positive(config, 'ami.dp_neurons', integer=True)
  validate.in_range(config, 'ami.dp_deltas', 0.0, 1.0, low_inclusive=False,
                    high_inclusive=False)
  validate.in_range(config, 'ami.certified_delta', 0.0, 1.0, low_inclusive=False,
                    high_inclusive=False)
  validate.in_range(config, 'ami.heldout_fraction', 0.0, 1.0, low_inclusive=False,
                    high_inclusive=False)
  validate.in_range(config, 'ami.adversary_fraction', 0.0, 1.0, low_inclusive=False,
                    high_inclusive=False)
  validate.one_of(config, 'ami.decision_path', DECISION_PATHS)
  validate.one_of(config, 'ami.extractor', data_lib.features.EXTRACTORS)
  validate.one_of(config, 'ami.dp_rule', DP_RULES)
  for field in ('ldp_sign_bit', 'randomize_negatives', 'stop_when_separated',
                'balanced_class_weights', 'calibrated_variant'):
    v = config.ami[field]
    validate.require(isinstance(v, bool), f'ami.{field}', 'True or False', v)
  for field in ('int_bits', 'frac_bits'):
    v = config.ami[field]
    validate.require(_is_int(v) and v >= 0, f'ami.{field}', 'an integer >= 0', v)
  total = config.ami.int_bits + config.ami.frac_bits
  validate.require(1 <= total <= 30, 'ami.int_bits', 'such that 1 <= int_bits + frac_bits <= 30',
                   (config.ami.int_bits, config.ami.frac_bits))
  hidden = tuple(config.ami.utility_hidden)
  validate.require(all(_is_int(h) and h > 0 for h in hidden), 'ami.utility_hidden',
                   'a tuple of positive integers', config.ami.utility_hidden)
  weights = config.ami.extractor_weights
  validate.require(not weights or os.path.isfile(weights), 'ami.extractor_weights',
                   "'' or an existing .npz file", weights)
  defenses.configured.check_honoured(
      config.defense, 'ami', AMI_DEFENSES,
      'the game decides from the chosen neuron on the batch the client trains on, not from '
      'a computed gradient or upload, so gradient, upload and aggregation defenses cannot act '
      'in it; LDP mechanisms go in ami.mechanisms')


def _features(dataset, config, key) -> np.ndarray:
  a = config.ami
  if a.extractor == 'identity' or not dataset.is_image:
    if a.extractor != 'identity':
      logging.warning('%s holds feature vectors, not images: using them as they are '
                      '(ami.extractor=%r ignored)', dataset.name, a.extractor)
    return data_lib.features.extract(dataset, 'identity', key=key, scale=float(a.feature_scale))
  if a.extractor == 'resnet18':
    return data_lib.features.extract(dataset, 'resnet18', key=key,
                                     weights=a.extractor_weights or None)
  raise validate.ConfigError('ami.extractor', "'identity' or 'resnet18' for this experiment",
                             a.extractor)


def _split(splits: dict, config, field: str):
  name = config.ami[field]
  validate.require(name in splits, f'ami.{field}', f'one of the splits {tuple(splits)}', name)
  return splits[name]


def roles(key: jax.Array, config, splits: dict) -> dict[str, Any]:
  """Indices of targets, adversary (crafting / held-out) and pool in their splits."""
  a = config.ami
  t_split = _split(splits, config, 'target_split')
  adv_split = _split(splits, config, 'adversary_split')
  _split(splits, config, 'pool_split')
  num_targets = int(a.num_targets)
  validate.require(num_targets < len(t_split), 'ami.num_targets',
                   f'< the size of split {a.target_split!r} ({len(t_split)})', num_targets)
  targets = np.arange(num_targets)
  rng = data_lib.rng_from_key(key)
  if a.adversary_split == a.pool_split:
    rest = np.arange(len(adv_split))
    if a.adversary_split == a.target_split:
      rest = rest[num_targets:]
    rest = rng.permutation(rest)
    n_adv = int(round(a.adversary_fraction * len(rest)))
    adversary, pool = np.sort(rest[:n_adv]), np.sort(rest[n_adv:])
  else:
    adversary = rng.permutation(len(adv_split))
    pool = np.arange(len(splits[a.pool_split]))
    if a.pool_split == a.target_split:
      pool = pool[num_targets:]
  n_held = max(1, int(round(a.heldout_fraction * len(adversary))))
  heldout, crafting = adversary[:n_held], adversary[n_held:]
  if a.max_negatives:
    crafting = crafting[:a.max_negatives]
    heldout = heldout[:max(1, int(round(a.heldout_fraction * a.max_negatives)))]
  validate.require(len(crafting) >= 1, 'ami.heldout_fraction',
                   'small enough to leave the adversary crafting negatives', a.heldout_fraction)
  validate.require(a.batch_size <= len(pool), 'ami.batch_size',
                   f'<= the game pool ({len(pool)} examples)', a.batch_size)
  return {'targets': targets, 'crafting': np.sort(crafting), 'heldout': np.sort(heldout),
          'pool': pool}


def prepare(config) -> dict[str, Any]:
  """Validates the config, loads the data and computes the features of every role."""
  validate_config(config)
  splits = data_lib.load(config.data)
  key = jax.random.key(config.seed)
  idx = roles(jax.random.fold_in(key, 1), config, splits)
  a = config.ami
  names = {}
  for field in ('target_split', 'adversary_split', 'pool_split', 'utility_train_split',
                'utility_test_split'):
    names[config.ami[field]] = _split(splits, config, field)
  feats = {name: _features(split, config, jax.random.fold_in(key, 2))
           for name, split in names.items()}
  encoding = ami.Encoding(int_bits=a.int_bits, frac_bits=a.frac_bits, sign_bit=True,
                          honour_sign=a.ldp_sign_bit)
  state = {
      'target_x': feats[a.target_split][idx['targets']],
      'target_y': splits[a.target_split].y[idx['targets']].astype(np.int32),
      'crafting_x': feats[a.adversary_split][idx['crafting']],
      'heldout_x': feats[a.adversary_split][idx['heldout']],
      'pool_x': feats[a.pool_split][idx['pool']],
      'pool_y': splits[a.pool_split].y[idx['pool']].astype(np.int32),
      'utility_train': (feats[a.utility_train_split], splits[a.utility_train_split].y),
      'utility_test': (feats[a.utility_test_split], splits[a.utility_test_split].y),
      'num_classes': int(splits[a.pool_split].num_classes),
      'encoding': encoding,
  }
  validate.require(int(a.certified_samples) <= len(state['pool_x']), 'ami.certified_samples',
                   f'0 (the whole pool) or <= the game pool ({len(state["pool_x"])} examples)',
                   a.certified_samples)
  every = np.concatenate([state['target_x'], state['pool_x'], state['crafting_x']])
  _, clipped = fixed_point.encode(jnp.asarray(every), a.int_bits, a.frac_bits, True)
  pool_split = splits[a.pool_split]
  image_shape = (tuple(pool_split.x.shape[1:]) if pool_split.is_image and a.extractor ==
                 'identity' else None)
  validate.require(config.defense.name != 'augment' or image_shape is not None,
                   'defense.name', "not 'augment' unless ami.extractor is 'identity' on an "
                   'image dataset (augmentation needs the image behind the features)',
                   config.defense.name)
  configured = defenses.configure(
      config.defense, defenses.Setting(
          num_classes=state['num_classes'], image_shape=image_shape,
          value_range=(0.0, float(a.feature_scale)), batch_size=int(a.batch_size),
          num_examples=int(a.batch_size)), experiment='ami')
  state['defense'] = None if configured.params['defense'] == 'none' else configured.hooks
  state['defense_params'] = configured.params
  state['num_clipped'] = int(clipped)
  state['clipped_fraction'] = int(clipped) / every.size
  if clipped:
    logging.warning('%d of %d feature values (%.3g%%) lie outside the fixed-point range '
                    '[-%g, %g] and are clipped by the LDP encoding', int(clipped), every.size,
                    100 * state['clipped_fraction'], encoding.max_value, encoding.max_value)
  logging.info('ami roles: %d targets, %d crafting negatives, %d held out, pool %d, d = %d',
               len(state['target_x']), len(state['crafting_x']), len(state['heldout_x']),
               len(state['pool_x']), every.shape[1])
  return state


# ----------------------------------------------------------------------------------------------
# One point: craft, play, certify, measure utility.


def point_key(key: jax.Array, mechanism: str, epsilon: float | None) -> jax.Array:
  """`report.point_key` of (mechanism, epsilon): not of the sweep's order or subset."""
  return report.point_key(key, {'part': 'game', 'mechanism': mechanism, 'epsilon': epsilon})


def craft_targets(key, config, state, randomize, ldp: bool):
  """Crafts one neuron per target with the paper's rule, and its calibrated variant.

  Returns:
    (neurons, report, calibrated, predicted): `neurons` decide with the paper's rule
    (member iff v > 0 with the crafted bias); `calibrated` are the same neurons with the
    bias shifted by `ami.calibrate_bias` on held-out adversary data (None unless
    `ami.calibrated_variant`); `predicted` the calibration's predicted Adv per target
    (NaN without the variant). Both are rescaled by `ami.rescale` (decisions unchanged).
  """
  a = config.ami
  t_x = jnp.asarray(state['target_x'])
  num_targets, d = t_x.shape
  neg = jnp.asarray(state['crafting_x'])
  held = jnp.asarray(state['heldout_x'])
  k_pos, k_neg, k_init, k_vpos, k_vneg = (jax.random.fold_in(key, i) for i in range(5))

  def copies(k, n):
    return jnp.stack([randomize(jax.random.fold_in(k, t), jnp.broadcast_to(t_x[t], (n, d)))
                      for t in range(num_targets)])

  def once(k, x):
    if not (ldp and a.randomize_negatives):
      return jnp.broadcast_to(x, (num_targets,) + x.shape)
    return jnp.stack([randomize(jax.random.fold_in(k, t), x) for t in range(num_targets)])

  pos = copies(k_pos, a.copies) if ldp else t_x[:, None, :]
  negs = once(k_neg, neg)
  weights = None if a.balanced_class_weights else tuple(float(w) for w in a.class_weights)
  max_steps = int(a.max_steps)
  neurons, report = ami.craft_many(
      jax.random.split(k_init, num_targets), pos, negs, num_neurons=int(a.num_neurons),
      learning_rate=float(a.learning_rate), max_steps=max_steps, class_weights=weights,
      stop_when_separated=bool(a.stop_when_separated))
  predicted = jnp.full((num_targets,), jnp.nan)
  calibrated = None
  if a.calibrated_variant:
    v_pos = jax.vmap(ami.chosen_value)(neurons, copies(k_vpos, a.copies) if ldp
                                       else t_x[:, None, :])
    held_r = (jnp.stack([randomize(jax.random.fold_in(k_vneg, t), held)
                         for t in range(num_targets)]) if ldp
              else jnp.broadcast_to(held, (num_targets,) + held.shape))
    v_neg = jax.vmap(ami.chosen_value)(neurons, held_r)
    calibrated, predicted = jax.vmap(ami.calibrate_bias, in_axes=(0, 0, 0, None))(
        neurons, v_pos, v_neg, int(a.batch_size))
  rows = jnp.concatenate([pos, negs], axis=1)
  neurons = jax.vmap(ami.rescale)(neurons, rows)
  if calibrated is not None:
    calibrated = jax.vmap(ami.rescale)(calibrated, rows)
  return neurons, report, calibrated, predicted


def play(key, config, state, neurons, mechanism, epsilon, randomize, calibrated=None):
  """Runs the security game; returns (outcomes, extra metrics).

  With `calibrated` neurons the outcomes also carry `decision_variant` / `score_variant`: the
  same trials (same key: same batches and randomization) decided by them. The fast paths under
  LDP or a defense score each randomized batch with both neurons in one run; the others
  (no LDP: a gather of precomputed values; the literal gradient path) replay the game.
  """
  out, extra = _play(key, config, state, neurons, mechanism, epsilon, randomize, calibrated)
  if calibrated is not None and 'decision_variant' not in out:
    other, _ = _play(key, config, state, calibrated, mechanism, epsilon, randomize)
    out = dict(out, decision_variant=other['decision'], score_variant=other['score'])
  return out, extra


def _play(key, config, state, neurons, mechanism, epsilon, randomize, calibrated=None):
  # `calibrated` is honoured only where it costs one activation (the fast LDP/defense paths).
  a = config.ami
  enc = state['encoding']
  d = state['pool_x'].shape[1]
  n = int(a.num_trials)
  opts = runner.options(config)
  extra = {}
  if a.decision_path == 'gradient':
    return _play_literal(key, config, state, neurons, mechanism, epsilon, randomize)
  defense = state.get('defense')
  if mechanism == 'none' and defense is None:
    v_t, v_p = ami.precomputed_values(neurons, jnp.asarray(state['target_x']),
                                      jnp.asarray(state['pool_x']))
    fn = _cached_partial(ami.fast_trial_no_ldp, batch_size=int(a.batch_size))
    return runner.run_trials(fn, key, n, **opts, args=(v_t, v_p)), extra
  p_one = None if mechanism == 'none' else ami.bit_probabilities(mechanism, epsilon, d, enc)
  if p_one is None:
    kw = dict(batch_size=int(a.batch_size), mechanism=randomize, defense=defense)
    sides = (ami.GameSide(x=jnp.asarray(state['target_x'])),
             ami.GameSide(x=jnp.asarray(state['pool_x'])), ())
    if mechanism != 'none':
      extra['sampler_tv_per_trial'] = 0.0
  else:
    channel = ami.channel_from_bit_probs(p_one, enc.group_sizes())
    sizes = enc.group_sizes()
    t_codes = ami.pack_codes(fixed_point.encode(jnp.asarray(state['target_x']), enc.int_bits,
                                                enc.frac_bits, True)[0], sizes)
    p_codes = ami.pack_codes(fixed_point.encode(jnp.asarray(state['pool_x']), enc.int_bits,
                                                enc.frac_bits, True)[0], sizes)
    kw = dict(batch_size=int(a.batch_size), xor=channel.xor, encoding=enc, defense=defense)
    sides = (ami.GameSide(codes=t_codes), ami.GameSide(codes=p_codes),
             tuple(jnp.asarray(t) for t in channel.thresholds))
    # Total-variation bound between the simulated and the exact client, per trial.
    extra['sampler_tv_per_trial'] = channel.tv_per_feature * d * int(a.batch_size)
  if calibrated is None:
    fn = _cached_partial(ami.fast_trial, **kw)
    return runner.run_trials(fn, key, n, **opts, args=(neurons,) + sides), extra
  fn = _cached_partial(ami.fast_trial_pair, **kw)
  return runner.run_trials(fn, key, n, **opts, args=(neurons, calibrated) + sides), extra


@functools.lru_cache(maxsize=32)
def _cached_partial(fn, **kw):
  # One partial per static setting, so the runner's compile cache is reused across points.
  return functools.partial(fn, **kw)


def _mlp_params(key, config, state, neurons):
  a = config.ami
  d = state['pool_x'].shape[1]
  model = models.MLP(hidden=(int(a.num_neurons), int(a.hidden2)),
                     num_classes=state['num_classes'])
  per_target = []
  for t in range(neurons.w.shape[0]):
    honest = model.init(jax.random.fold_in(key, t), jnp.zeros((1, d), jnp.float32))
    neuron = jax.tree.map(lambda x, t=t: x[t], neurons)
    per_target.append(ami.write_into_mlp(neuron, honest, CHOSEN_INDEX))
  return model, jax.tree.map(lambda *xs: jnp.stack(xs), *per_target)


def _play_literal(key, config, state, neurons, mechanism, epsilon, randomize):
  a = config.ami
  model, params = _mlp_params(jax.random.fold_in(key, 10**6), config, state, neurons)
  loss_fn = losses.make_loss_fn(model.apply)
  targets = ami.GameSide(x=jnp.asarray(state['target_x']), y=jnp.asarray(state['target_y']))
  pool = ami.GameSide(x=jnp.asarray(state['pool_x']), y=jnp.asarray(state['pool_y']))
  fn = _cached_partial(ami.literal_trial, batch_size=int(a.batch_size), loss_fn=loss_fn,
                       chosen_index=CHOSEN_INDEX,
                       mechanism=None if mechanism == 'none' else randomize,
                       defense=state.get('defense'))
  out = runner.run_trials(fn, key, int(a.num_trials), **runner.options(config),
                          args=(params, targets, pool, None))
  agree = float(np.mean(out['decision'] == out['decision_fast']))
  return out, {'fast_path_agreement': agree}


def certified_rows(key, config, state) -> np.ndarray:
  """Indices into the game pool of the certificate's q non-target samples.

  Hoeffding's inequality needs samples independent of the bounded function v: the
  pool is data that neither crafting nor calibration saw (both use only the adversary's
  part), so its rows are. `ami.certified_samples` of them at random without
  replacement (0 = the whole pool: the most q the dataset allows).
  """
  n_pool = len(state['pool_x'])
  q = int(config.ami.certified_samples) or n_pool
  validate.require(q <= n_pool, 'ami.certified_samples',
                   f'0 (the whole pool) or <= the game pool ({n_pool} examples)', q)
  if q == n_pool:
    return np.arange(n_pool)
  return np.sort(data_lib.rng_from_key(key).choice(n_pool, q, replace=False))


def certify_point(key, config, state, neurons, randomize, enc) -> tuple[dict, dict]:
  """Theorem 1 per target; metrics of target 0 and the fraction certified, and draws.

  p = `ami.certified_draws` randomized copies of the target; q = `certified_rows`
  pool samples (never seen by crafting or calibration), each randomized once.
  """
  a = config.ami
  held = jnp.asarray(state['pool_x'][certified_rows(jax.random.fold_in(key, 1 << 20), config,
                                                    state)])
  low, high = enc.min_value, enc.max_value
  out, draws, certified_count, deltas = {}, {}, 0, []
  for t in range(neurons.w.shape[0]):
    neuron = jax.tree.map(lambda x, t=t: x[t], neurons)
    v_t = certified.monte_carlo_values(jax.random.fold_in(key, 2 * t), neuron,
                                       jnp.asarray(state['target_x'][t]), randomize,
                                       int(a.certified_draws))
    v_x = certified.monte_carlo_values(jax.random.fold_in(key, 2 * t + 1), neuron, held,
                                       randomize)
    res = certified.certify(v_t, v_x, certified.value_range(neuron, low, high),
                            float(a.certified_delta))
    certified_count += int(res['certified'])
    deltas.append(res['delta_star'])
    if t == 0:
      out = {f'certified_{k}': v for k, v in res.items()}
      draws = {'target': v_t, 'other': v_x}
  out['certified_q'] = int(held.shape[0])
  out['certified_fraction'] = certified_count / neurons.w.shape[0]
  out['certified_delta_star_median'] = float(np.median(deltas))
  return out, draws


def _utility(key, config, state, randomize):
  a = config.ami
  (x_tr, y_tr), (x_te, y_te) = state['utility_train'], state['utility_test']
  return utility.ldp_accuracy(key, x_tr, y_tr, x_te, y_te, state['num_classes'], randomize,
                              hidden=tuple(a.utility_hidden), steps=int(a.utility_steps),
                              learning_rate=float(a.utility_learning_rate))


def run_game_point(key, config, state, mechanism: str, epsilon: float | None, workdir: str):
  """All metrics of one (mechanism, epsilon) point; returns (metrics, n_trials).

  Besides the attack's metrics: `compile_s` (tracing + XLA compilation, or persistent-cache
  loads, during the point) and `run_s` (the rest of its wall time).
  """
  t_point = time.perf_counter()
  with compile_cache.CompileTimer() as timer:
    m, n = _game_point(key, config, state, mechanism, epsilon, workdir)
  m['compile_s'] = timer.compile_s
  m['run_s'] = time.perf_counter() - t_point - timer.compile_s
  return m, n


def _game_point(key, config, state, mechanism: str, epsilon: float | None, workdir: str):
  a = config.ami
  enc = state['encoding']
  d = state['pool_x'].shape[1]
  ldp = mechanism != 'none'
  randomize = ami.mechanism_fn(mechanism, epsilon, d, enc)
  k_craft, k_game, k_cert, k_util = (jax.random.fold_in(key, i) for i in range(4))
  t0 = time.perf_counter()
  neurons, report, calibrated, predicted = craft_targets(k_craft, config, state, randomize,
                                                         ldp)
  jax.block_until_ready(neurons)
  craft_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  # Our extension (the calibrated bias) is scored on the very same trials as the paper's
  # rule, so the difference is the calibration alone.
  out, extra = play(k_game, config, state, neurons, mechanism, epsilon, randomize, calibrated)
  game_s = time.perf_counter() - t0
  m = metrics_lib.tpr_tnr_adv(out['decision'], out['b'])
  m.update(extra)
  if calibrated is not None:
    m.update(calibrated_metrics({'b': out['b'], 'decision': out['decision_variant'],
                                 'score': out['score_variant']}))
  m['trials_per_s'] = int(a.num_trials) / max(game_s, 1e-9)
  m['craft_s'] = craft_s
  steps = np.asarray(report.steps)
  m['craft_steps_mean'] = float(np.mean(steps))
  m['craft_steps_max'] = int(np.max(steps))
  m['craft_separated_fraction'] = float(np.mean(np.asarray(report.separated)))
  m['craft_train_tpr'] = float(np.mean(np.asarray(report.train_tpr)))
  m['craft_train_tnr'] = float(np.mean(np.asarray(report.train_tnr)))
  m['calibrated_predicted_adv'] = (float(np.nanmean(np.asarray(predicted)))
                                   if a.calibrated_variant else math.nan)
  per_target = [metrics_lib.tpr_tnr_adv(out['decision'][out['target'] == t],
                                        out['b'][out['target'] == t])['adv']
                for t in range(neurons.w.shape[0])]
  m['adv_target_min'] = float(np.min(per_target))
  m['adv_target_max'] = float(np.max(per_target))
  m['num_clipped'] = state['num_clipped']
  m['clipped_fraction'] = state['clipped_fraction']
  m['auc'] = metrics_lib.roc_auc(out['score'], out['b'])
  t0 = time.perf_counter()
  if ldp:
    cert, draws = certify_point(k_cert, config, state, neurons, randomize, enc)
    m.update(cert)
    ami_figures.draws_store(workdir).save(ami_figures.draw_params(mechanism, epsilon),
                                             draws)
  cert_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  m.update(_utility(k_util, config, state, None if not ldp else randomize))
  logging.info('%s eps=%s: craft %.1f s, game %.1f s, certified %.1f s, utility %.1f s; '
               'Adv %.3f', mechanism, epsilon, craft_s, game_s, cert_s,
               time.perf_counter() - t0, m['adv'])
  return m, int(a.num_trials)


def ensure_draws(key, config, state, mechanism: str, epsilon: float, workdir: str) -> bool:
  """Recomputes the draws of a stored point whose `draws/` file is missing or unreadable.

  The point's crafting and certification keys are those `run_game_point` used, so the
  recomputed values are the ones the stored metrics came from (never another point's).
  Returns True when the file had to be recomputed.
  """
  draws, reason = ami_figures.load_draws(workdir, mechanism, epsilon)
  if draws is not None:
    return False
  logging.warning('%s: recomputing the draws of %s eps=%g from the point\'s keys', reason,
                  mechanism, epsilon)
  d = state['pool_x'].shape[1]
  randomize = ami.mechanism_fn(mechanism, epsilon, d, state['encoding'])
  neurons, _, _, _ = craft_targets(jax.random.fold_in(key, 0), config, state, randomize, True)
  _, draws = certify_point(jax.random.fold_in(key, 2), config, state, neurons, randomize,
                           state['encoding'])
  ami_figures.draws_store(workdir).save(ami_figures.draw_params(mechanism, epsilon), draws)
  return True


CALIBRATED_SUFFIX = '_calibrated'


def calibrated_metrics(out) -> dict:
  """The calibrated variant's rates, named `<rate>_calibrated` (`_ci_low/_ci_high` after).

  E.g. `adv_calibrated`, `adv_calibrated_ci_low`, `tpr_calibrated`, `auc_calibrated`.
  """
  m = metrics_lib.tpr_tnr_adv(out['decision'], out['b'])
  named = {}
  for k, v in m.items():
    base, sep, tail = k.partition('_ci_')
    named[f'{base}{CALIBRATED_SUFFIX}{sep}{tail}'] = v
  named[f'auc{CALIBRATED_SUFFIX}'] = metrics_lib.roc_auc(out['score'], out['b'])
  return named



def run_dp_point(key, config, epsilon, delta, num_neurons):
  """Rounds needed to average away DP-SGD noise (Appendix E); returns (metrics, n_trials).

  `compile_s` and `run_s` as in `run_game_point`.
  """
  t_point = time.perf_counter()
  with compile_cache.CompileTimer() as timer:
    m, n = _dp_point(key, config, epsilon, delta, num_neurons)
  m['compile_s'] = timer.compile_s
  m['run_s'] = time.perf_counter() - t_point - timer.compile_s
  return m, n


def _dp_point(key, config, epsilon, delta, num_neurons):
  a = config.ami
  kw = dict(epsilon=epsilon, delta=delta, num_neurons=num_neurons, signal=float(a.dp_signal),
            rule=a.dp_rule)
  closed = dp_averaging.rounds_needed(**kw)
  fpr, fnr = dp_averaging.error_rates(max(closed, 1), **kw)
  m = {'rounds_closed_form': closed, 'fpr_closed_form': fpr, 'fnr_closed_form': fnr}
  cap = 20_000
  if 0 < closed <= cap:
    max_rounds = min(cap, int(math.ceil(1.5 * closed)) + 2)
    errors = dp_averaging.monte_carlo_errors(key, max_rounds, num_trials=int(a.dp_trials),
                                             **kw)
    m['rounds_monte_carlo'] = dp_averaging.rounds_needed_monte_carlo(errors, delta)
    n = errors['n']
    m.update(stats.rate('fpr_mc', int(errors['fp'][closed - 1]), n))
    m.update(stats.rate('fnr_mc', int(errors['fn'][closed - 1]), n))
  else:
    m['rounds_monte_carlo'] = -1
  return m, 2 * int(a.dp_trials)


def sweep(config, state, store: ResultsStore, key: jax.Array) -> None:
  """Runs every game and DP-averaging point not yet in `store`, then writes the figures.

  Args:
    config: the experiment's config (its `ami` section: configs/_ami.py).
    state: what `prepare(config)` returned.
    store: the run's results store; points it already holds are skipped.
    key: the run key; each point's key depends only on its parameters (`point_key`).
  """
  a = config.ami
  mechanisms = validate.subset_of(config, 'ami.mechanisms', ami.MECHANISMS)
  epsilons = tuple(float(e) for e in a.epsilons)
  dp_points = [(e, dl, 1) for e in a.dp_epsilons for dl in a.dp_deltas]
  dp_points += [(e, a.dp_deltas[0], k) for e in a.dp_epsilons for k in a.dp_neurons if k != 1]
  progress.plan(sum(1 if m == 'none' else len(epsilons) for m in mechanisms) + len(dp_points))
  for mechanism in mechanisms:
    for epsilon in ((None,) if mechanism == 'none' else epsilons):
      params = {'part': 'game', 'mechanism': mechanism, 'epsilon': epsilon,
                **state['defense_params']}
      # Keyed by (mechanism, epsilon) only: defenses are compared on the same trials.
      k = point_key(key, mechanism, epsilon)
      run_point(store, params, lambda k=k, m=mechanism, e=epsilon: run_game_point(
          k, config, state, m, e, store.workdir))
      if mechanism != 'none':  # a resumed point's figure data must be its own
        ensure_draws(k, config, state, mechanism, epsilon, store.workdir)
  for epsilon, delta, k_neurons in dp_points:
    params = {'part': 'dp_averaging', 'epsilon': float(epsilon), 'dp_delta': float(delta),
              'num_chosen': int(k_neurons)}
    k = report.point_key(key, params)
    run_point(store, params, lambda k=k, e=epsilon, dl=delta, kn=k_neurons: run_dp_point(
        k, config, float(e), float(dl), int(kn)))
  ami_figures.make_figures(store.points, store.workdir, config)

