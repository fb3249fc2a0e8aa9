"""Active membership inference under LDP (Nguyen et al., AISTATS 2023): the pipeline.

What `python -m experiments.ami` runs (command, outputs, config fields: experiments/ami.py,
configs/_ami.py). `prepare(config)` validates the config, loads the data and computes the
features of every role; `plan(config, state, store, key)` lists one point per (mechanism,
epsilon) (`run_game_point`: `attacks.ami.point.run`) and per DP-SGD averaging setting
(`run_dp_point`); `figures` draws them (`fl_privacy.pipelines.ami_figures`). The interface:
`pipelines.base`."""

from __future__ import annotations

import os
import time
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy import defenses
from fl_privacy import memory
from fl_privacy import report
from fl_privacy import validate
from fl_privacy.attacks import ami
from fl_privacy.attacks.ami import dp_averaging
from fl_privacy.attacks.ami import point
from fl_privacy.eval import compile_cache
from fl_privacy.eval import runner
from fl_privacy.mechanisms import fixed_point
from fl_privacy.pipelines import ami_figures
from fl_privacy.pipelines import base
from fl_privacy.report import summary
from fl_privacy.report import ResultsStore


NAME = 'ami'
DECISION_PATHS = ('fast', 'gradient')
# Defenses the AMI client can run: those acting on the batch it trains on (`data`, `batch`
# hooks). The input mechanisms stay in `ami.mechanisms`; update and DP defenses act on what
# the attack does not read on its fast path (see docs/defenses.md).
AMI_DEFENSES = ('none', 'mixup', 'augment', 'sampling')
DP_RULES = dp_averaging.RULES

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


# Declared rules of the fields the helpers above do not cover (checked by `validate_config`).
_NATURAL = validate.number(0, integer=True)
RULES = {
    'ami.num_trials': validate.trials(2),
    'ami.dp_trials': validate.trials(),
    'ami.certified_draws': validate.trials(),
    'ami.certified_samples': validate.number(0, integer=True,
                                             words='0 = the whole game pool'),
    'ami.max_negatives': validate.number(0, integer=True, words='0 = all'),
    'ami.class_weights': validate.Rule('(negative, positive)', lambda w: len(tuple(w)) == 2),
    'ami.int_bits': _NATURAL, 'ami.frac_bits': _NATURAL,
    'ami.utility_hidden': validate.items(validate.number(0, low_open=True, integer=True),
                                         'a tuple of positive integers', scalar=False,
                                         nonempty=False),
    **{f'ami.{f}': validate.BOOLEAN for f in ('ldp_sign_bit', 'randomize_negatives',
                                             'stop_when_separated', 'balanced_class_weights',
                                             'calibrated_variant')},
}


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
  validate.check_all(config, RULES)
  for field in ('learning_rate', 'utility_learning_rate', 'class_weights', 'dp_epsilons',
                'dp_signal', 'feature_scale'):
    validate.positive(config, f'ami.{field}')
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
  total = config.ami.int_bits + config.ami.frac_bits
  validate.require(1 <= total <= 30, 'ami.int_bits', 'such that 1 <= int_bits + frac_bits <= 30',
                   (config.ami.int_bits, config.ami.frac_bits))
  validate.checked(config, 'ami.extractor_weights', validate.Rule(
      "'' or an existing .npz file", lambda w: not w or os.path.isfile(w)))
  data_lib.extractors.check_weights(config.ami.extractor_weights, config.ami.extractor,
                                    'ami.extractor_weights')
  defenses.configured.check_honoured(
      config.defense, 'ami', AMI_DEFENSES,
      'the game decides from the chosen neuron on the batch the client trains on, not from '
      'a computed gradient or upload, so gradient, upload and aggregation defenses cannot act '
      'in it; LDP mechanisms go in ami.mechanisms')


def unused_fields(config) -> dict[str, str]:
  """The `ami` fields this run does not read (`base.unused`: a command-line override of one is
  refused rather than recorded as if it ran): without an LDP mechanism, the epsilons, the
  randomized copies, the negatives' randomization, the fixed-point encoding, the sign bit and
  the certified guarantee (all read only under LDP); `class_weights` under balanced weights;
  `feature_scale` with an extractor other than 'identity'. {} for a config validation refuses
  (it names the field itself)."""
  a = config.ami
  try:
    mechanisms = tuple(a.mechanisms)
    ldp = [m for m in mechanisms if m != 'none']
  except TypeError:
    return {}
  out: dict[str, str] = {}
  if not ldp:
    why = ('read only under an LDP mechanism (bitrand, ome), which ami.mechanisms does not '
           'include')
    out.update({f'ami.{f}': why for f in (
        'epsilons', 'copies', 'randomize_negatives', 'ldp_sign_bit', 'int_bits', 'frac_bits',
        'certified_draws', 'certified_delta', 'certified_samples')})
  if bool(a.balanced_class_weights):
    out['ami.class_weights'] = 'read only when ami.balanced_class_weights is False'
  if a.extractor != 'identity':
    out['ami.feature_scale'] = f"read only by extractor 'identity' (not {a.extractor!r})"
  return out


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
  if a.target_split == a.adversary_split == a.pool_split:
    data_lib.require_examples(
        config.data, f'its {a.target_split!r} split', len(t_split),
        ami.game.least_shared_split(num_targets, a.adversary_fraction, a.heldout_fraction,
                                    a.batch_size),
        f'ami.num_targets = {num_targets} targets, adversary_fraction = '
        f'{a.adversary_fraction} of the rest with a crafting negative, a game pool of '
        f'batch_size = {a.batch_size}')
  data_lib.require_examples(config.data, f'its {a.target_split!r} split', len(t_split),
                            num_targets + 1,
                            f'ami.num_targets = {num_targets} targets and one more example')
  validate.require(num_targets < len(t_split), 'ami.num_targets',
                   f'< the size of split {a.target_split!r} ({len(t_split)})', num_targets)
  idx = ami.game.role_indices(
      data_lib.rng_from_key(key), num_targets, len(adv_split), len(splits[a.pool_split]),
      adversary_is_pool=a.adversary_split == a.pool_split,
      adversary_is_target=a.adversary_split == a.target_split,
      pool_is_target=a.pool_split == a.target_split, adversary_fraction=a.adversary_fraction,
      heldout_fraction=a.heldout_fraction, max_negatives=a.max_negatives)
  pool = idx['pool']
  validate.require(len(idx['crafting']) >= 1, 'ami.heldout_fraction',
                   'small enough to leave the adversary crafting negatives', a.heldout_fraction)
  data_lib.require_examples(config.data, 'its game pool (what targets and adversary leave)',
                            len(pool), int(a.batch_size), f'ami.batch_size = {a.batch_size}')
  validate.require(a.batch_size <= len(pool), 'ami.batch_size',
                   f'<= the game pool ({len(pool)} examples)', a.batch_size)
  return idx


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
  if any(m != 'none' for m in a.mechanisms):
    # Crafting stacks `copies` randomized copies of every target: [targets, copies, d].
    nt, d = state['target_x'].shape
    memory.require_fits('ami.copies', a.copies, nt * int(a.copies) * d * memory.FLOAT_BYTES,
                        f'the randomized copies ({nt} targets x {a.copies} copies x {d} '
                        'features x 4 bytes)')
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


def point_key(key: jax.Array, mechanism: str, epsilon: float | None) -> jax.Array:
  """`report.point_key` of (mechanism, epsilon): not of the sweep's order or subset."""
  return report.point_key(key, {'part': 'game', 'mechanism': mechanism, 'epsilon': epsilon})


def settings(config) -> point.Settings:
  """The `ami` section's static settings of every point, as plain values."""
  a = config.ami
  return point.Settings(
      batch_size=int(a.batch_size), num_trials=int(a.num_trials), copies=int(a.copies),
      randomize_negatives=bool(a.randomize_negatives), num_neurons=int(a.num_neurons),
      hidden2=int(a.hidden2), learning_rate=float(a.learning_rate), max_steps=int(a.max_steps),
      class_weights=(None if a.balanced_class_weights
                     else tuple(float(w) for w in a.class_weights)),
      stop_when_separated=bool(a.stop_when_separated),
      calibrated_variant=bool(a.calibrated_variant), decision_path=a.decision_path,
      certified_samples=int(a.certified_samples), certified_draws=int(a.certified_draws),
      certified_delta=float(a.certified_delta), utility_hidden=tuple(a.utility_hidden),
      utility_steps=int(a.utility_steps), utility_learning_rate=float(a.utility_learning_rate),
      run_options=runner.options(config))


def _timed(compute):
  """`compute() -> (metrics, n)` plus `compile_s` (tracing, compiling or cache loads during the
  point) and `run_s` (the rest of its wall time)."""
  t_point = time.perf_counter()
  with compile_cache.CompileTimer() as timer:
    m, n = compute()
  m['compile_s'] = timer.compile_s
  m['run_s'] = time.perf_counter() - t_point - timer.compile_s
  return m, n


def run_game_point(key, config, state, mechanism: str, epsilon: float | None, workdir: str):
  """All metrics of one (mechanism, epsilon) point (`ami.point.run`: craft, play, certify,
  utility) with `compile_s` and `run_s`; saves the certificate's draws; (metrics, n_trials)."""
  def compute():
    m, draws = point.run(key, settings(config), state, mechanism, epsilon)
    if draws is not None:
      ami_figures.draws_store(workdir).save(ami_figures.draw_params(mechanism, epsilon), draws)
    return m, int(config.ami.num_trials)
  return _timed(compute)


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
  draws = point.recompute_draws(key, settings(config), state, mechanism, epsilon)
  ami_figures.draws_store(workdir).save(ami_figures.draw_params(mechanism, epsilon), draws)
  return True


def run_dp_point(key, config, epsilon, delta, num_neurons):
  """Rounds needed to average away DP-SGD noise (Appendix E, `dp_averaging.point_metrics`);
  returns (metrics, n_trials), with `compile_s` and `run_s` as in `run_game_point`."""
  a = config.ami
  return _timed(lambda: dp_averaging.point_metrics(
      key, epsilon=epsilon, delta=delta, num_neurons=num_neurons, signal=float(a.dp_signal),
      rule=a.dp_rule, num_trials=int(a.dp_trials)))


def plan(config, state, store: ResultsStore, key: jax.Array) -> list[base.Point]:
  """One game point per (mechanism, epsilon), then the DP-SGD averaging points.

  Each point's key depends only on its parameters (`point_key`); a game point's `after`
  makes sure its figure data (the draws) exist, resumed or not.
  """
  a = config.ami
  mechanisms = validate.subset_of(config, 'ami.mechanisms', ami.MECHANISMS)
  epsilons = tuple(float(e) for e in a.epsilons)
  points = []
  for mechanism in mechanisms:
    for epsilon in ((None,) if mechanism == 'none' else epsilons):
      params = {'part': 'game', 'mechanism': mechanism, 'epsilon': epsilon,
                **state['defense_params']}
      # Keyed by (mechanism, epsilon) only: defenses are compared on the same trials.
      k = point_key(key, mechanism, epsilon)
      after = None if mechanism == 'none' else (
          lambda _, k=k, m=mechanism, e=epsilon: ensure_draws(k, config, state, m, e,
                                                              store.workdir))
      points.append(base.Point(params, lambda k=k, m=mechanism, e=epsilon: run_game_point(
          k, config, state, m, e, store.workdir), after=after))
  dp_points = [(e, dl, 1) for e in a.dp_epsilons for dl in a.dp_deltas]
  dp_points += [(e, a.dp_deltas[0], k) for e in a.dp_epsilons for k in a.dp_neurons if k != 1]
  for epsilon, delta, k_neurons in dp_points:
    params = {'part': 'dp_averaging', 'epsilon': float(epsilon), 'dp_delta': float(delta),
              'num_chosen': int(k_neurons)}
    k = report.point_key(key, params)
    points.append(base.Point(params, lambda k=k, e=epsilon, dl=delta, kn=k_neurons:
                             run_dp_point(k, config, float(e), float(dl), int(kn))))
  return points


def figures(config, state, store: ResultsStore, key: jax.Array) -> None:
  """The figures of `ami_figures` from the stored points and the saved draws."""
  del state, key
  ami_figures.make_figures(store.points, store.workdir, config)
