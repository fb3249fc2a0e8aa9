"""The AMI security game (Figs. 1 and 3 of the AMI paper), one trial at a time for the runner."""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import models
from fl_privacy.attacks.ami.crafting import CraftedNeuron
from fl_privacy.attacks.ami.crafting import chosen_value
from fl_privacy.attacks.ami.decisions import FC1
from fl_privacy.attacks.ami.decisions import FC2
from fl_privacy.attacks.ami.decisions import decide_from_activation
from fl_privacy.attacks.ami.decisions import decide_from_gradient
from fl_privacy.attacks.ami.decisions import write_into_mlp
from fl_privacy.eval import metrics as metrics_lib
from fl_privacy.eval import runner
from fl_privacy.fl import losses
from fl_privacy.mechanisms import fixed_point
from fl_privacy.mechanisms.codes import Encoding
from fl_privacy.mechanisms.codes import bit_probabilities
from fl_privacy.mechanisms.codes import channel_from_bit_probs
from fl_privacy.mechanisms.codes import codes_to_values
from fl_privacy.mechanisms.codes import pack_codes
from fl_privacy.mechanisms.codes import sample_codes

Array = jax.Array

# ----------------------------------------------------------------------------------------------
# The security game (Figs. 1 and 3 of the AMI paper), one trial at a time for the runner.


class GameSide(NamedTuple):
  """Rows a trial draws from: the targets (one per crafted neuron) or the pool.

  Fields a path does not need may be None (the fast path carries only `codes`).

  Attributes:
    x: [N, d] float32 features as the client holds them (inside the encoding's range).
    y: [N] int32 labels of the legitimate task.
    codes: [N, d, G] uint32 fixed-point group codes of `x` (LDP paths only).
  """
  x: Any = None
  y: Any = None
  codes: Any = None


def trial_roles(index: Array, num_targets: int) -> tuple[Array, Array]:
  """(b, target) of a global trial index: b = index % 2, target = (index // 2) % T.

  Members and non-members alternate, so any prefix of trials is balanced and every target
  gets as many member as non-member trials when the count is a multiple of 2 T.
  """
  b = (index % 2).astype(jnp.int32)
  return b, ((index // 2) % num_targets).astype(jnp.int32)


def _take(tree, t, num_targets: int):
  # A single target is a static slice; several are a per-trial gather.
  if num_targets == 1:
    return jax.tree.map(lambda a: a[0], tree)
  return jax.tree.map(lambda a: a[t], tree)


def trial_batch(key: Array, index: Array, targets: GameSide, pool: GameSide, *,
                batch_size: int) -> tuple[Array, Array, GameSide]:
  """The client's batch D of one trial, before any randomization.

  Member trial (b = 1): the target plus |D| - 1 pool rows drawn uniformly with replacement;
  non-member trial (b = 0): |D| pool rows (as in the public code's game).

  Args:
    key: the trial's key (the runner's fold_in(run_key, index)); the draw uses fold_in(key, 0).
    index: global trial index.
    targets: target rows, leading axis T.
    pool: pool rows, leading axis N.
    batch_size: |D|.

  Returns:
    (b, target index, rows) with rows a `GameSide` of leading axis |D|.
  """
  num_targets = jax.tree.leaves(targets)[0].shape[0]
  num_pool = jax.tree.leaves(pool)[0].shape[0]
  b, t = trial_roles(index, num_targets)
  idx = jax.random.randint(jax.random.fold_in(key, 0), (batch_size,), 0, num_pool)
  target = _take(targets, t, num_targets)

  def pick(target_rows, pool_rows):
    rows = pool_rows[idx]
    return rows.at[0].set(jnp.where(b == 1, target_rows, rows[0]))

  return b, t, jax.tree.map(pick, target, pool)


def randomize_key(key: Array) -> Array:
  """The key of a trial's LDP randomization (fold_in(key, 1); the batch draw uses 0)."""
  return jax.random.fold_in(key, 1)


def defense_key(key: Array) -> Array:
  """The key of a trial's defense hooks (fold_in(key, 2))."""
  return jax.random.fold_in(key, 2)


def apply_defense(key: Array, defense: Any, x: Array, y: Array | None
                  ) -> tuple[Array, Array | None, Array | None]:
  """The client's defense on the batch it trains on: its `data` then its `batch` hook.

  `defense` is an `fl.client.ClientHooks` (from `fl_privacy.defenses`) or None (no defense:
  returns the batch unchanged and mask None). The hooks get `fold_in(defense_key(key), 0)`
  and `fold_in(defense_key(key), 1)`; labels default to zeros where the path carries none
  (the fast path's decision reads only x).

  Returns:
    (x', y', mask) with mask [B] marking the rows the client trains on.
  """
  if defense is None:
    return x, y, None
  k = defense_key(key)
  labels = jnp.zeros(x.shape[0], jnp.int32) if y is None else y
  mask = jnp.ones(x.shape[0], jnp.float32)
  x, labels, mask = defense.data(jax.random.fold_in(k, 0), x, labels, mask, None)
  x, labels, mask = defense.batch(jax.random.fold_in(k, 1), x, labels, mask, None)
  return x, labels, mask


def fast_trial(key: Array, index: Array, neurons: CraftedNeuron, targets: GameSide,
               pool: GameSide, thresholds: tuple, *, batch_size: int, xor: tuple = (),
               encoding: Encoding | None = None,
               mechanism: Callable | None = None, defense: Any = None,
               variants: CraftedNeuron | None = None) -> dict:
  """One LDP game trial on the fast path: randomize codes, decode, member iff max v > 0.

  The client's whole batch is randomized afresh in every trial (Fig. 3).

  Args:
    key: the trial's key.
    index: global trial index.
    neurons: crafted blocks stacked over targets [T, ...].
    targets: `GameSide(codes=[T, d, G])`.
    pool: `GameSide(codes=[N, d, G])`.
    thresholds: `CodeChannel.thresholds` as arrays.
    batch_size: |D|.
    xor: `CodeChannel.xor`.
    encoding: the fixed-point encoding (with the sign switch).
    mechanism: if given, `(key, x) -> x'` on `GameSide.x` replaces the code sampler (for
      channels `bit_probabilities` cannot tabulate); `thresholds` is then ignored.
    defense: the client's defense hooks (`apply_defense`) on the randomized batch, or None.
    variants: optional other neurons [T, ...] (e.g. the calibrated bias) that score the very
      same randomized batch; their decision costs one more activation, not another
      randomization, and equals what a separate run with the same key would give.

  Returns:
    {'b', 'target', 'decision', 'score'}, plus 'decision_variant' and 'score_variant' with
    `variants`.
  """
  b, t, rows = trial_batch(key, index, targets, pool, batch_size=batch_size)
  if mechanism is not None:
    x = mechanism(randomize_key(key), rows.x)
  else:
    codes = sample_codes(randomize_key(key), rows.codes, thresholds, xor)
    sizes = tuple(int(np.log2(tab.shape[-1] + 1)) for tab in thresholds)
    x = codes_to_values(codes, sizes, encoding)
  x, _, mask = apply_defense(key, defense, x, rows.y)
  num_targets = jax.tree.leaves(targets)[0].shape[0]
  decision, score = decide_from_activation(_take(neurons, t, num_targets), x, mask)
  out = {'b': b, 'target': t, 'decision': decision, 'score': score}
  if variants is not None:
    out['decision_variant'], out['score_variant'] = decide_from_activation(
        _take(variants, t, num_targets), x, mask)
  return out


def fast_trial_pair(key: Array, index: Array, neurons: CraftedNeuron, variants: CraftedNeuron,
                    targets: GameSide, pool: GameSide, thresholds: tuple, **kwargs) -> dict:
  """`fast_trial` with `variants` as a positional argument (a jit argument for the runner)."""
  return fast_trial(key, index, neurons, targets, pool, thresholds, variants=variants,
                    **kwargs)


def precomputed_values(neurons: CraftedNeuron, target_x: Array, pool_x: Array
                       ) -> tuple[Array, Array]:
  """v of every target under its own neuron [T] and of every pool row under each [T, N].

  Without LDP nothing in a trial but the index draw depends on the trial, so v is computed
  once per target and pool row, and a trial only gathers.
  """
  v_target = jax.vmap(chosen_value)(neurons, target_x)
  v_pool = jax.vmap(chosen_value, in_axes=(0, None))(neurons, pool_x)
  return v_target, v_pool


def fast_trial_no_ldp(key: Array, index: Array, v_target: Array, v_pool: Array, *,
                      batch_size: int) -> dict:
  """One game trial without LDP from precomputed values (same batch draws as the others)."""
  targets = GameSide(x=v_target)
  pool = GameSide(x=v_pool.T)  # [N, T]: a pool row carries its value under every neuron
  b, t, rows = trial_batch(key, index, targets, pool, batch_size=batch_size)
  v = rows.x[:, t]  # row 0 already holds v_target[t] in member trials
  score = jnp.max(v)
  return {'b': b, 'target': t, 'decision': score > 0, 'score': score}


def neuron_from_params(params: Any, chosen_index: int, *, fc1: tuple = FC1,
                       fc2: tuple = FC2) -> CraftedNeuron:
  """Reads the crafted block back out of MLP params (what the client actually runs)."""
  def at(path):
    node = params
    for name in path:
      node = node[name]
    return node
  l1, l2 = at(fc1), at(fc2)
  return CraftedNeuron(w=l1['kernel'], b=l1['bias'], h=l2['kernel'][:, chosen_index],
                       c=l2['bias'][chosen_index])


def literal_trial(key: Array, index: Array, params: Any, targets: GameSide, pool: GameSide,
                  thresholds: tuple | None, *, batch_size: int, loss_fn: Callable,
                  chosen_index: int, xor: tuple = (), encoding: Encoding | None = None,
                  mechanism: Callable | None = None, defense: Any = None) -> dict:
  """One game trial exactly as Figs. 3-4 describe it: the client computes the gradient.

  The client randomizes its batch (by the code sampler when `thresholds` is given, by the
  `mechanism(key, x)` when given, else not at all), computes jax.grad of the crafted MLP's
  loss, and the server decides from the chosen neuron's gradient. The fast decision on the
  same randomized batch is returned beside it, for the agreement test.

  Args:
    key: the trial's key.
    index: global trial index.
    params: crafted MLP variables stacked over targets [T, ...].
    targets: `GameSide(x, y, codes)` of the targets.
    pool: `GameSide(x, y, codes)` of the pool.
    thresholds: `CodeChannel.thresholds` or None.
    batch_size: |D|.
    loss_fn: `loss_fn(params, x, y) -> scalar`.
    chosen_index: the chosen fc2 unit.
    xor: `CodeChannel.xor`.
    encoding: fixed-point encoding (code sampler only).
    mechanism: `(key, x) -> x'` applied to the float batch (exact upstream mechanism).
    defense: the client's defense hooks on the randomized batch (`apply_defense`), or None;
      the loss is then the masked mean over the rows the client trains on (soft labels after
      mixup).

  Returns:
    {'b', 'target', 'decision', 'decision_fast', 'score'}.
  """
  b, t, rows = trial_batch(key, index, targets, pool, batch_size=batch_size)
  if thresholds is not None:
    sizes = tuple(int(np.log2(tab.shape[-1] + 1)) for tab in thresholds)
    codes = sample_codes(randomize_key(key), rows.codes, thresholds, xor)
    x = codes_to_values(codes, sizes, encoding)
  elif mechanism is not None:
    x = mechanism(randomize_key(key), rows.x)
  else:
    x = rows.x
  x, y, mask = apply_defense(key, defense, x, rows.y)
  p = _take(params, t, jax.tree.leaves(targets)[0].shape[0])
  if mask is None:
    decision = decide_from_gradient(loss_fn, p, x, y, chosen_index)
  else:
    masked_loss = lambda q, xb, yb: loss_fn(q, xb, yb, mask)
    decision = decide_from_gradient(masked_loss, p, x, y, chosen_index)
  fast, score = decide_from_activation(neuron_from_params(p, chosen_index), x, mask)
  return {'b': b, 'target': t, 'decision': decision, 'decision_fast': fast, 'score': score}


def game_rates(outcomes: dict) -> dict[str, float | int]:
  """TPR, TNR and Adv = (TPR + TNR) / 2 (Eq. 3 of the AMI paper) as plain counts and rates.

  Intervals are added by the caller with `eval.stats` / `eval.metrics`.
  """
  b = np.asarray(outcomes['b']).astype(bool)
  d = np.asarray(outcomes['decision']).astype(bool)
  tp, n_pos = int(np.sum(d & b)), int(np.sum(b))
  tn, n_neg = int(np.sum(~d & ~b)), int(np.sum(~b))
  tpr, tnr = tp / max(n_pos, 1), tn / max(n_neg, 1)
  return {'tp': tp, 'n_pos': n_pos, 'tn': tn, 'n_neg': n_neg, 'tpr': tpr, 'tnr': tnr,
          'adv': 0.5 * (tpr + tnr)}


# ----------------------------------------------------------------------------------------------
# Playing the game: every trial of one point through `eval.runner.run_trials`.


@functools.lru_cache(maxsize=32)
def _cached_partial(fn, **kw):
  # One partial per static setting, so the runner's compile cache is reused across points.
  return functools.partial(fn, **kw)


def play(key: Array, neurons: CraftedNeuron, targets: GameSide, pool: GameSide, *,
         mechanism: str, epsilon: float | None, randomize: Callable, encoding: Encoding,
         num_trials: int, batch_size: int, defense: Any = None, decision_path: str = 'fast',
         mlp_hidden: tuple[int, ...] = (), num_classes: int | None = None,
         calibrated: CraftedNeuron | None = None,
         run_options: dict | None = None) -> tuple[dict, dict]:
  """Runs the security game (Figs. 1 and 3 of the AMI paper); returns (outcomes, extra metrics).

  Args:
    key: the game's run key (trial i uses fold_in(key, i)).
    neurons: the crafted neurons, one per target (leading axis T).
    targets, pool: `GameSide(x, y)` as the client holds them (y: the literal path only).
    mechanism, epsilon, randomize, encoding: the clients' LDP mechanism ('none': no LDP).
    num_trials, batch_size: trials and |D|.
    defense: the client's batch defense (`ClientHooks` or None).
    decision_path: 'fast' (some row activates the chosen neuron) or 'gradient' (the client
      computes `jax.grad` of a real `models.MLP(mlp_hidden, num_classes)` holding the crafted
      block; also reports `fast_path_agreement`).
    calibrated: the calibrated variant's neurons: the outcomes also carry
      `decision_variant` / `score_variant`, the same trials (same key: same batches and
      randomization) decided by them. The fast paths under LDP or a defense score each
      randomized batch with both neurons in one run; the others (no LDP: a gather of
      precomputed values; the literal gradient path) replay the game.
    run_options: `run_trials` keyword arguments (`runner.options(config)`).
  """
  kw = dict(mechanism=mechanism, epsilon=epsilon, randomize=randomize, encoding=encoding,
            num_trials=int(num_trials), batch_size=int(batch_size), defense=defense,
            decision_path=decision_path, mlp_hidden=tuple(mlp_hidden),
            num_classes=num_classes, run_options=dict(run_options or {}))
  out, extra = _play(key, neurons, targets, pool, calibrated=calibrated, **kw)
  if calibrated is not None and 'decision_variant' not in out:
    other, _ = _play(key, calibrated, targets, pool, **kw)
    out = dict(out, decision_variant=other['decision'], score_variant=other['score'])
  return out, extra


def _play(key, neurons, targets, pool, *, mechanism, epsilon, randomize, encoding, num_trials,
          batch_size, defense, decision_path, mlp_hidden, num_classes, run_options,
          calibrated=None):
  # `calibrated` is honoured only where it costs one activation (the fast LDP/defense paths).
  enc = encoding
  d = pool.x.shape[1]
  n = num_trials
  opts = run_options
  extra = {}
  if decision_path == 'gradient':
    return _play_literal(key, neurons, targets, pool, mechanism=mechanism, randomize=randomize,
                         num_trials=n, batch_size=batch_size, defense=defense,
                         mlp_hidden=mlp_hidden, num_classes=num_classes, run_options=opts)
  if mechanism == 'none' and defense is None:
    v_t, v_p = precomputed_values(neurons, jnp.asarray(targets.x), jnp.asarray(pool.x))
    fn = _cached_partial(fast_trial_no_ldp, batch_size=batch_size)
    return runner.run_trials(fn, key, n, **opts, args=(v_t, v_p)), extra
  p_one = None if mechanism == 'none' else bit_probabilities(mechanism, epsilon, d, enc)
  if p_one is None:
    kw = dict(batch_size=batch_size, mechanism=randomize, defense=defense)
    sides = (GameSide(x=jnp.asarray(targets.x)), GameSide(x=jnp.asarray(pool.x)), ())
    if mechanism != 'none':
      extra['sampler_tv_per_trial'] = 0.0
  else:
    channel = channel_from_bit_probs(p_one, enc.group_sizes())
    sizes = enc.group_sizes()
    t_codes = pack_codes(fixed_point.encode(jnp.asarray(targets.x), enc.int_bits,
                                            enc.frac_bits, True)[0], sizes)
    p_codes = pack_codes(fixed_point.encode(jnp.asarray(pool.x), enc.int_bits,
                                            enc.frac_bits, True)[0], sizes)
    kw = dict(batch_size=batch_size, xor=channel.xor, encoding=enc, defense=defense)
    sides = (GameSide(codes=t_codes), GameSide(codes=p_codes),
             tuple(jnp.asarray(t) for t in channel.thresholds))
    # Total-variation bound between the simulated and the exact client, per trial.
    extra['sampler_tv_per_trial'] = channel.tv_per_feature * d * batch_size
  if calibrated is None:
    fn = _cached_partial(fast_trial, **kw)
    return runner.run_trials(fn, key, n, **opts, args=(neurons,) + sides), extra
  fn = _cached_partial(fast_trial_pair, **kw)
  return runner.run_trials(fn, key, n, **opts, args=(neurons, calibrated) + sides), extra


def mlp_with_neurons(key: Array, neurons: CraftedNeuron, num_features: int,
                     mlp_hidden: tuple[int, ...], num_classes: int, chosen_index: int = 0):
  """(model, params stacked over targets): an honest `models.MLP` init per target (key
  fold_in(key, t)) with the crafted block written in (`write_into_mlp`)."""
  model = models.MLP(hidden=tuple(mlp_hidden), num_classes=num_classes)
  per_target = []
  for t in range(neurons.w.shape[0]):
    honest = model.init(jax.random.fold_in(key, t), jnp.zeros((1, num_features), jnp.float32))
    neuron = jax.tree.map(lambda x, t=t: x[t], neurons)
    per_target.append(write_into_mlp(neuron, honest, chosen_index))
  return model, jax.tree.map(lambda *xs: jnp.stack(xs), *per_target)


# The chosen neuron of the literal path's MLP is unit 0 of fc2.
CHOSEN_INDEX = 0


def _play_literal(key, neurons, targets, pool, *, mechanism, randomize, num_trials, batch_size,
                  defense, mlp_hidden, num_classes, run_options):
  model, params = mlp_with_neurons(jax.random.fold_in(key, 10**6), neurons, pool.x.shape[1],
                                   mlp_hidden, num_classes, CHOSEN_INDEX)
  loss_fn = losses.make_loss_fn(model.apply)
  t_side = GameSide(x=jnp.asarray(targets.x), y=jnp.asarray(targets.y))
  p_side = GameSide(x=jnp.asarray(pool.x), y=jnp.asarray(pool.y))
  fn = _cached_partial(literal_trial, batch_size=batch_size, loss_fn=loss_fn,
                       chosen_index=CHOSEN_INDEX,
                       mechanism=None if mechanism == 'none' else randomize,
                       defense=defense)
  out = runner.run_trials(fn, key, num_trials, **run_options,
                          args=(params, t_side, p_side, None))
  agree = float(np.mean(out['decision'] == out['decision_fast']))
  return out, {'fast_path_agreement': agree}


CALIBRATED_SUFFIX = '_calibrated'


def calibrated_metrics(out: dict) -> dict:
  """The calibrated variant's rates, named `<rate>_calibrated` (`_ci_low/_ci_high` after).

  `out`: {'b', 'decision', 'score'} of the variant. E.g. `adv_calibrated`,
  `adv_calibrated_ci_low`, `tpr_calibrated`, `auc_calibrated`.
  """
  m = metrics_lib.tpr_tnr_adv(out['decision'], out['b'])
  named = {}
  for k, v in m.items():
    base, sep, tail = k.partition('_ci_')
    named[f'{base}{CALIBRATED_SUFFIX}{sep}{tail}'] = v
  named[f'auc{CALIBRATED_SUFFIX}'] = metrics_lib.roc_auc(out['score'], out['b'])
  return named


def target_spread(out: dict, num_targets: int) -> dict[str, float]:
  """The smallest and largest per-target Adv (`adv_target_min`, `adv_target_max`)."""
  per_target = [metrics_lib.tpr_tnr_adv(out['decision'][out['target'] == t],
                                        out['b'][out['target'] == t])['adv']
                for t in range(num_targets)]
  return {'adv_target_min': float(np.min(per_target)),
          'adv_target_max': float(np.max(per_target))}


# ----------------------------------------------------------------------------------------------
# The game's data roles (Fig. 1 of the AMI paper): targets, the adversary's rows, the pool.


def least_shared_split(num_targets: int, adversary_fraction: float, heldout_fraction: float,
                       batch_size: int, limit: int = 10**7) -> int:
  """The fewest examples one split holding targets, adversary and pool needs (as
  `role_indices` cuts it): >= 1 crafting negative and a pool of >= `batch_size` rows.

  Counts only, in `role_indices`' order, so a too-small data file is reported with the size
  that passes every check rather than one check at a time.
  """
  nt, n = int(num_targets), int(num_targets) + 1
  while n < limit:
    rest = n - nt
    n_adv = int(round(adversary_fraction * rest))
    n_held = max(1, int(round(heldout_fraction * n_adv)))
    if n_adv - n_held >= 1 and rest - n_adv >= batch_size:
      return n
    n += 1
  return n


def role_indices(rng: np.random.Generator, num_targets: int, adversary_size: int,
                 pool_size: int, *, adversary_is_pool: bool, adversary_is_target: bool,
                 pool_is_target: bool, adversary_fraction: float, heldout_fraction: float,
                 max_negatives: int = 0) -> dict[str, np.ndarray]:
  """Indices of the targets, the adversary's crafting and held-out rows and the game pool.

  Targets are the first `num_targets` rows of their split. Where the adversary's split is the
  pool's, its rows (less the targets when that split is also theirs) are permuted by `rng`
  and cut at `adversary_fraction`; otherwise the adversary holds its whole split (permuted)
  and the pool every row of its split but the targets. `heldout_fraction` of the adversary's
  rows are held out (>= 1); `max_negatives` > 0 caps the crafting rows (and the held-out
  ones in proportion). The roles never share a row of a split.

  Returns:
    {'targets', 'crafting' (sorted), 'heldout' (sorted), 'pool'}; `crafting` may be empty
    (the caller refuses that).
  """
  targets = np.arange(num_targets)
  if adversary_is_pool:
    rest = np.arange(adversary_size)
    if adversary_is_target:
      rest = rest[num_targets:]
    rest = rng.permutation(rest)
    n_adv = int(round(adversary_fraction * len(rest)))
    adversary, pool = np.sort(rest[:n_adv]), np.sort(rest[n_adv:])
  else:
    adversary = rng.permutation(adversary_size)
    pool = np.arange(pool_size)
    if pool_is_target:
      pool = pool[num_targets:]
  n_held = max(1, int(round(heldout_fraction * len(adversary))))
  heldout, crafting = adversary[:n_held], adversary[n_held:]
  if max_negatives:
    crafting = crafting[:max_negatives]
    heldout = heldout[:max(1, int(round(heldout_fraction * max_negatives)))]
  return {'targets': targets, 'crafting': np.sort(crafting), 'heldout': np.sort(heldout),
          'pool': pool}
