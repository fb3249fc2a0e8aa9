"""The PASTEL pipeline (Elhattab and Bouchenak): the regulariser and the DP baselines under attack.

`python -m experiments.pastel` hands `prepare` and `sweep` to `experiments.common.main`; the
script's docstring says how to run it and what it writes.

Data. The train split is cut into K IID shards; each shard is split (seeded) into members (the
rows every defense trains on) and a held-out part (`validation_fraction`) that only PASTEL
reads, as its V batches; held-out rows are neither members nor non-members in any attack. The
test split holds the non-members.

Trainings. One training per (defense, strength, optimizer): `none`; `pastel` at each lambda;
`wdp`, `ldp`, `cdp` at each target epsilon; and `none` and `pastel` (lambda
`ablation_pastel_weight`) with `ablation_optimizer`, which separates the regulariser from
AdaGrad. The DP baselines are `defenses.dp`'s mechanisms calibrated by `dp_accounting`. Every
training starts from the same w_0 with the same client keys (shuffles), so
defenses differ only by the defense (common random numbers). Rounds run in segments; at each
recorded round t (every `record_every`-th) the server's view is kept: the K uploads
(Delta_k, so client k's model is w_t - Delta_k) and the new global model w_{t+1}. At the last
`attack_snapshots` recorded rounds the white-box features of every attacked example are taken
on those models; FedMIA's measurements (`fl.queries.measure`) at every recorded round. The
arrays go to the artifact store (`<workdir>/trained/*.npz`, atomic), so re-scoring or resuming
never retrains.

Attacks and targets. `local`: client k's uploaded model; members: k's members; non-members: a
disjoint 1/K share of the test split (each test example is scored on one client's model only,
so the pooled rows are independent examples); pooled over clients. `global`: the global
model; members: every client's members; non-members: the test split. For each target a seeded
balanced half of the labelled rows trains the white-box attack (`nasr_whitebox`) and the
other half is scored by every attack (`loss_threshold` = -loss on the last snapshot; FedMIA-I
and -II on the local target's same rows, scored aligned), so all attacks and all defenses are
compared on the same rows. Each (training, attack, target) is one results point.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fl_privacy import data as data_lib
from fl_privacy import defenses as defenses_lib
from fl_privacy import models as models_lib
from fl_privacy import validate
from fl_privacy.attacks.passive import evaluate as evaluate_lib
from fl_privacy.attacks.passive import scores as scores_lib
from fl_privacy.attacks.passive import whitebox
from fl_privacy.defenses import pastel as pastel_lib
from fl_privacy.defenses import dp as dp_lib
from fl_privacy.eval import auditing
from fl_privacy.eval import stats
from fl_privacy.fl import client as client_lib
from fl_privacy.fl import losses
from fl_privacy.fl import optimizers as optimizers_lib
from fl_privacy.fl import queries
from fl_privacy.fl import rounds as rounds_lib
from fl_privacy.pipelines import pastel_figures
from fl_privacy.report import ArtifactStore
from fl_privacy.report import atomic
from fl_privacy.report import point_key
from fl_privacy.report import progress
from fl_privacy.report import run_point
from fl_privacy.report import summary

NAME = 'pastel'
DEFENSES = ('none', 'pastel', 'wdp', 'ldp', 'cdp')
DP_DEFENSES = ('wdp', 'ldp', 'cdp')
ATTACKS = ('nasr_whitebox', 'loss_threshold', 'fedmia_i', 'fedmia_ii')
FEDMIA_ATTACKS = ('fedmia_i', 'fedmia_ii')
TARGETS = ('local', 'global')
TRAINED = 'trained'
TABLE = 'table.md'
_NO_ABLATION = (None, '', 'none', 'None')
# The headline columns: logged per saved point and printed as a table at the end of a run.
SUMMARY = summary.Table('PASTEL (attack AUC and accuracy: 95% intervals)', (
    summary.param('defense'), summary.param('strength'), summary.param('optimizer'),
    summary.param('attack'), summary.param('target'), summary.rate('attack_auc', 'AUC'),
    summary.rate('tpr_at_fpr_1e-2', 'TPR@1%FPR'), summary.rate('accuracy', 'test acc.'),
    summary.metric('dp_epsilon', 'DP eps', digits=2, nan='-'), summary.seconds()))
# Rows the internal-gap diagnostic (jsd_last_round) reads per client (memory on big models).
_JSD_ROWS = 512


def _s(config):
  return config.pastel


def _ablation(config) -> str | None:
  a = _s(config).ablation_optimizer
  return None if a in _NO_ABLATION else a


def validate_static(config) -> None:
  """Checks every field that does not need the data or the model (before anything loads)."""
  data_lib.validate_data_config(config.data)
  s = _s(config)
  validate.one_of(config, 'pastel.model', models_lib.MODELS)
  if s.model == 'mlp':
    validate.positive(config, 'pastel.mlp_hidden', integer=True)
  k = validate.positive(config, 'pastel.num_clients', integer=True)
  validate.require(k >= 2, 'pastel.num_clients', 'an integer >= 2', k)
  t = validate.positive(config, 'pastel.num_rounds', integer=True)
  r = validate.positive(config, 'pastel.record_every', integer=True)
  validate.require(t % r == 0, 'pastel.record_every', f'a divisor of num_rounds ({t})', r)
  validate.positive(config, 'pastel.local_epochs', integer=True)
  validate.positive(config, 'pastel.batch_size', integer=True)
  validate.one_of(config, 'pastel.optimizer', optimizers_lib.OPTIMIZERS)
  validate.positive(config, 'pastel.learning_rate')
  a = s.ablation_optimizer
  validate.require(a in _NO_ABLATION or a in optimizers_lib.OPTIMIZERS,
                   'pastel.ablation_optimizer',
                   f'None or one of {optimizers_lib.OPTIMIZERS}', a)
  validate.positive(config, 'pastel.ablation_learning_rate')
  validate.in_range(config, 'pastel.ablation_pastel_weight', 0.0, math.inf)
  defenses = validate.subset_of(config, 'pastel.defenses', DEFENSES)
  validate.require(len(tuple(s.pastel_weights)) > 0, 'pastel.pastel_weights',
                   'a non-empty list of lambdas >= 0', s.pastel_weights)
  validate.in_range(config, 'pastel.pastel_weights', 0.0, math.inf)
  validate.require(all(isinstance(n, str) for n in tuple(s.pastel_layers)),
                   'pastel.pastel_layers', 'a list of layer names (() = every Dense layer)',
                   s.pastel_layers)
  validate.one_of(config, 'pastel.pastel_representation', pastel_lib.REPRESENTATIONS)
  validate.positive(config, 'pastel.pastel_temperature')
  validate.in_range(config, 'pastel.validation_fraction', 0.0, 0.5, low_inclusive=False)
  validate.positive(config, 'pastel.epsilons')
  validate.in_range(config, 'pastel.dp_delta', 0.0, 1.0, low_inclusive=False,
                    high_inclusive=False)
  validate.positive(config, 'pastel.clip_norm')
  defenses_lib.registry.FIELDS['dp_sgd_sampling'].rule.check('pastel.ldp_sampling',
                                                             s.ldp_sampling)
  if 'defense' in config:
    defenses_lib.check_honoured(config.defense, NAME, ('none',), 'PASTEL sweeps its own '
                                'defenses in pastel.defenses')
  validate.positive(config, 'pastel.update_clip_norm')
  attacks = validate.subset_of(config, 'pastel.attacks', ATTACKS)
  validate.subset_of(config, 'pastel.targets', TARGETS)
  snaps = validate.positive(config, 'pastel.attack_snapshots', integer=True)
  validate.require(snaps <= t // r, 'pastel.attack_snapshots',
                   f'<= the number of recorded rounds (num_rounds / record_every = {t // r})',
                   snaps)
  if set(attacks) & set(FEDMIA_ATTACKS):
    validate.require(k >= 3, 'pastel.num_clients',
                     '>= 3 with FedMIA attacks (each needs >= 2 other clients)', k)
  validate.positive(config, 'pastel.attack_steps', integer=True)
  validate.positive(config, 'pastel.attack_learning_rate')
  validate.positive(config, 'pastel.attack_hidden', integer=True)
  validate.positive(config, 'pastel.feature_chunk_size', integer=True)
  validate.require(isinstance(s.attack_last_layer_grad, bool), 'pastel.attack_last_layer_grad',
                   'True or False', s.attack_last_layer_grad)
  del defenses


def make_model(config, num_classes: int):
  s = _s(config)
  kw = {'hidden': tuple(s.mlp_hidden)} if s.model == 'mlp' else {}
  return models_lib.make(s.model, num_classes, field='pastel.model', **kw)


def prepare(config) -> dict:
  """Validates the config, loads the data, and checks what depends on the data or the model."""
  validate_static(config)
  s = _s(config)
  splits = data_lib.load(config.data)
  validate.require('train' in splits and 'test' in splits, 'data.name',
                   'a dataset with train and test splits', config.data.name)
  train, test = splits['train'], splits['test']
  k = int(s.num_clients)
  per_client = len(train) // k
  held = int(round(s.validation_fraction * per_client))
  validate.require(held >= 1 and per_client - held >= 2, 'pastel.num_clients',
                   f'small enough that each of the {len(train)} // K train rows keeps >= 2 '
                   'members and >= 1 held-out row', k)
  validate.require(len(test) >= 4 * k, 'pastel.num_clients',
                   f'<= {len(test) // 4} (each client needs >= 4 test non-members)', k)
  model = make_model(config, train.num_classes)
  x1 = jax.ShapeDtypeStruct((1,) + tuple(train.x.shape[1:]), jnp.float32)
  # Shapes only: under eval_shape no random number is drawn from this key.
  shapes = jax.eval_shape(model.init, jax.random.key(0), x1)
  available = pastel_lib.available_layers(model.apply, shapes, x1)
  layers = tuple(s.pastel_layers) or pastel_lib.dense_layers(shapes)
  for name in layers:
    validate.require(name in available, 'pastel.pastel_layers',
                     f'names of layers of {s.model}: {available}', tuple(s.pastel_layers))
  if s.pastel_representation == 'gradient':
    for name in layers:
      sub = shapes['params'].get(name, {})
      has_kernel = any(getattr(p[-1], 'key', None) == 'kernel'
                       for p, _ in jax.tree_util.tree_flatten_with_path(sub)[0])
      validate.require(has_kernel, 'pastel.pastel_layers',
                       "layers with a kernel for pastel_representation 'gradient'", name)
  return dict(train=train, test=test, model=model, layers=layers,
              x_train=data_lib.to_float(train.x), x_test=data_lib.to_float(test.x))


# ---------------------------------------------------------------------------------------------
# Data roles.


def split_data(config, state, key) -> dict:
  """Client shards, members / held-out per client, and the test split shared out to clients.

  Depends only on the run key (never on the defense): every training sees the same members.
  """
  s = _s(config)
  k = int(s.num_clients)
  n_train, n_test = len(state['train']), len(state['test'])
  shards = data_lib.iid_partition(point_key(key, {'role': 'partition'}), n_train, k)
  members, heldout = [], []
  for i, shard in enumerate(shards):
    rng = data_lib.rng_from_key(point_key(key, {'role': 'heldout', 'client': i}))
    perm = rng.permutation(np.asarray(shard))
    h = max(1, int(round(s.validation_fraction * len(shard))))
    heldout.append(np.sort(perm[:h]))
    members.append(np.sort(perm[h:]))
  rng = data_lib.rng_from_key(point_key(key, {'role': 'test_parts'}))
  test_parts = [np.sort(p) for p in np.array_split(rng.permutation(n_test), k)]
  return dict(members=members, heldout=heldout, test_parts=test_parts)


def attack_rows(config, state, split: dict, key) -> dict:
  """Rows of each target and their seeded balanced halves (the same for every training).

  Global rows: every client's members (client order), then the whole test split. Local rows:
  for each client k, k's members then its test share. Each row's `example` indexes the train
  (members) or test (non-members) split.

  Returns:
    {target: {'labels', 'client', 'example', 'train' (row indices), 'eval' (row indices)}}.
  """
  k = len(split['members'])
  n_test = len(state['test'])
  out = {}
  g_labels = np.r_[np.ones(sum(len(m) for m in split['members']), np.int8),
                   np.zeros(n_test, np.int8)]
  g_client = np.r_[np.concatenate([np.full(len(m), i) for i, m in enumerate(split['members'])]),
                   np.full(n_test, -1)]
  g_example = np.r_[np.concatenate(split['members']), np.arange(n_test)]
  rng = data_lib.rng_from_key(point_key(key, {'role': 'halves', 'target': 'global'}))
  pos, neg = np.flatnonzero(g_labels == 1), np.flatnonzero(g_labels == 0)
  tp, tn, ep, en = whitebox.balanced_halves(rng, len(pos), len(neg))
  out['global'] = dict(labels=g_labels, client=g_client, example=g_example,
                       train=np.r_[pos[tp], neg[tn]], eval=np.r_[pos[ep], neg[en]])
  labels, client, example, train_rows, eval_rows = [], [], [], [], []
  offset = 0
  for i in range(k):
    m, t = split['members'][i], split['test_parts'][i]
    labels.append(np.r_[np.ones(len(m), np.int8), np.zeros(len(t), np.int8)])
    client.append(np.full(len(m) + len(t), i))
    example.append(np.r_[m, t])
    rng = data_lib.rng_from_key(point_key(key, {'role': 'halves', 'target': 'local',
                                                'client': i}))
    tp, tn, ep, en = whitebox.balanced_halves(rng, len(m), len(t))
    train_rows.append(offset + np.r_[tp, len(m) + tn])
    eval_rows.append(offset + np.r_[ep, len(m) + en])
    offset += len(m) + len(t)
  out['local'] = dict(labels=np.concatenate(labels), client=np.concatenate(client),
                      example=np.concatenate(example), train=np.concatenate(train_rows),
                      eval=np.concatenate(eval_rows))
  return out


def client_data(state, split: dict) -> rounds_lib.ClientData:
  """Members as padded client shards; the held-out rows as `aux` (PASTEL's V)."""
  x, y = state['x_train'], state['train'].y
  clients = rounds_lib.pad_clients([x[m] for m in split['members']],
                                   [y[m] for m in split['members']])
  aux = pastel_lib.heldout_aux([x[h] for h in split['heldout']],
                               [y[h] for h in split['heldout']])
  return clients._replace(aux=aux)


# ---------------------------------------------------------------------------------------------
# Trainings.


def trainings(config) -> list[dict]:
  """Every (defense, strength, optimizer) trained, in sweep order."""
  s = _s(config)
  out = []
  for d in s.defenses:
    if d == 'none':
      out.append(dict(defense='none', strength=0.0, optimizer=s.optimizer))
    elif d == 'pastel':
      out += [dict(defense='pastel', strength=float(w), optimizer=s.optimizer)
              for w in s.pastel_weights]
    else:
      out += [dict(defense=d, strength=float(e), optimizer=s.optimizer) for e in s.epsilons]
  ablation = _ablation(config)
  if ablation is not None and ablation != s.optimizer:
    out.append(dict(defense='none', strength=0.0, optimizer=ablation))
    out.append(dict(defense='pastel', strength=float(s.ablation_pastel_weight),
                    optimizer=ablation))
  return out


def describe(tr: dict) -> str:
  return f'{tr["defense"]}({tr["strength"]:g}, {tr["optimizer"]})'


@functools.lru_cache(maxsize=None)
def _optimizer(name: str, learning_rate: float):
  # One object per (name, lr): it is a static argument of the jitted rounds.
  return optimizers_lib.make(name, learning_rate, field='pastel.optimizer')


@functools.lru_cache(maxsize=None)
def _hook_factory(kind: str, apply_fn, layers: tuple, representation: str, temperature: float,
                  batch_size: int, clip_norm: float, max_batch_size: int | None = None):
  """`strength -> ClientHooks` of one kind, cached: a static argument of the jitted rounds.

  The strength (lambda, or the DP noise multiplier) is traced, so every lambda of PASTEL, and
  every epsilon of a DP mechanism, reuses one compiled training (wdp and cdp share one: they
  are the same mechanism at different noise).
  """
  if kind == 'pastel':
    return lambda w: pastel_lib.make(apply_fn, weight=w, layers=layers,
                                     representation=representation, temperature=temperature,
                                     heldout_batch_size=batch_size)
  if kind in ('ldp', 'server_dp'):
    # The registry's builders, with the noise multiplier traced; `central_dp` and `weak_dp`
    # are the same DP-FedAvg mechanism at different noise.
    build = defenses_lib.DEFENSES['dp_sgd' if kind == 'ldp' else 'central_dp'].build
    extra = {} if kind == 'server_dp' else dict(
        sampling='shuffle' if max_batch_size is None else 'poisson', batch_size=batch_size,
        num_examples=batch_size, max_batch_size=max_batch_size)
    return lambda z: build(clip_norm=clip_norm, noise_multiplier=z, **extra)
  raise ValueError(f'unknown hook kind {kind!r}')


def training_setup(config, state, split: dict, tr: dict):
  """(hook factory, its strength, optimizer, DP info) of one training.

  The factory is None for `none`; the strength is lambda for `pastel` and the calibrated noise
  multiplier for the DP baselines.
  """
  s = _s(config)
  lr = s.learning_rate if tr['optimizer'] == s.optimizer else s.ablation_learning_rate
  opt = _optimizer(tr['optimizer'], float(lr))
  info = dict(noise_multiplier=math.nan, dp_epsilon=math.nan, dp_epsilon_per_round=math.nan)
  apply_fn, b = state['model'].apply, int(s.batch_size)
  if tr['defense'] == 'none':
    return None, 0.0, opt, info
  if tr['defense'] == 'pastel':
    factory = _hook_factory('pastel', apply_fn, tuple(state['layers']),
                            s.pastel_representation, float(s.pastel_temperature), b, 0.0)
    return factory, float(tr['strength']), opt, info
  dp = dp_accounting(config, split, tr['defense'], tr['strength'])
  info.update({k: dp[k] for k in info})
  if tr['defense'] == 'ldp':
    factory = _hook_factory('ldp', apply_fn, (), '', 1.0, b, float(s.clip_norm),
                            dp.get('dp_max_batch_size'))
  else:
    factory = _hook_factory('server_dp', apply_fn, (), '', 1.0, b, float(s.update_clip_norm))
  return factory, dp['noise_multiplier'], opt, info


# PASTEL's DP baselines, by the defense registry's names.
DP_NAMES = {'ldp': 'dp_sgd', 'cdp': 'central_dp', 'wdp': 'weak_dp'}


def dp_setting(config, split: dict) -> defenses_lib.Setting:
  """The run as the DP accounting sees it: n the smallest client's member count, J =
  ceil(n / B) steps per epoch, E epochs, T rounds, K clients (all take part); the largest
  client sizes the padded Poisson batch."""
  s = _s(config)
  n, b = min(len(m) for m in split['members']), int(s.batch_size)
  return defenses_lib.Setting(batch_size=b, num_examples=n, epochs=int(s.local_epochs),
                              steps_per_epoch=math.ceil(n / b), rounds=int(s.num_rounds),
                              num_clients=len(split['members']),
                              max_examples=max(len(m) for m in split['members']))


def dp_accounting(config, split: dict, defense: str, target_epsilon: float) -> dict:
  """Noise multiplier, epsilons and declaration of one DP baseline (the defense registry's
  declaration, calibrated by `fl_privacy.accounting` with dp-accounting's RDP accountant).

  - `ldp` (`dp_sgd`, record level, against the server): `pastel.ldp_sampling` 'poisson' (E J T
    steps of the Poisson-subsampled Gaussian at q = B / n, n the smallest client's members) or
    'shuffle' (E T epochs, one replace-one release each, no amplification).
  - `cdp` (`central_dp`, client level, replace-one, readers of the aggregate): T rounds.
  - `wdp` (`weak_dp`): calibrated for ONE round (PASTEL's weak DP); `dp_epsilon` is its
    composition over T rounds.

  Returns:
    {'noise_multiplier', 'dp_epsilon' (over the run), 'dp_epsilon_per_round' (nan but for
    wdp), 'dp_steps', 'dp_sampling_rate', the declaration's `dp_unit`, `dp_relation`,
    `dp_adversary`, `dp_sampling`, and `dp_max_batch_size` for Poisson DP-SGD}.
  """
  s = _s(config)
  name = DP_NAMES.get(defense)
  if name is None:
    raise ValueError(f'not a DP baseline: {defense!r}')
  clip = float(s.clip_norm if defense == 'ldp' else s.update_clip_norm)
  fixed = {'clip_norm': clip}
  if defense == 'ldp':
    fixed['sampling'] = s.ldp_sampling
  built = defenses_lib.configured.sweep_point(
      name, None, dp_setting(config, split), experiment=NAME, prefix='pastel', fixed=fixed,
      delta=float(s.dp_delta), target_epsilon=float(target_epsilon))
  m = dict(built.metrics)
  m.setdefault('dp_epsilon_per_round', math.nan)
  m['dp_steps'] = m['dp_compositions']
  return m


_STATIC = ('apply_fn', 'optimizer', 'epochs', 'batch_size', 'hook_factory')


def _server_view(key, t, k, global_params, upload):
  """What the server keeps of client k in round t: its upload and the global model w_t."""
  del key, t, k
  return upload, global_params


@functools.partial(jax.jit, static_argnames=_STATIC + ('num_rounds',))
def _segment(params, clients, key, first, strength, *, apply_fn, optimizer, epochs, batch_size,
             hook_factory, num_rounds):
  """Rounds first .. first + num_rounds - 1 in one program.

  Returns (w_{first + num_rounds}, the last round's K uploads, that round's w_t): the default
  `reduce` keeps only the last round's observations, so nothing accumulates over rounds.
  """
  hooks = None if hook_factory is None else hook_factory(strength)
  zeros = jax.tree_util.tree_map(
      lambda a: jnp.zeros((clients.num_clients,) + a.shape, a.dtype), params)
  final, log = rounds_lib.run(losses.make_loss_fn(apply_fn), params, clients, key=key,
                              num_rounds=num_rounds, first_round=first, optimizer=optimizer,
                              epochs=epochs, batch_size=batch_size, hooks=hooks,
                              observe=_server_view, init=(zeros, zeros))
  uploads, globals_ = log.observed
  return final, uploads, jax.tree_util.tree_map(lambda a: a[0], globals_)


@functools.lru_cache(maxsize=None)
def _feature_fn(apply_fn, last_layer):
  # One jitted program per model, shared by every training.
  return whitebox.make_feature_fn(apply_fn, last_layer=last_layer)


@functools.partial(jax.jit, static_argnames=('apply_fn',))
def _correct(apply_fn, params, x, y):
  return jnp.sum(jnp.argmax(apply_fn(params, x), -1) == y)


def count_correct(apply_fn, params, x: np.ndarray, y: np.ndarray, batch: int = 1024) -> int:
  """Correct predictions of `params` on (x, y), in fixed-size batches (the last one wrapped)."""
  n = len(y)
  total = 0
  for start in range(0, n, batch):
    idx = np.arange(start, start + batch) % n
    stop = min(start + batch, n)
    keep = np.arange(batch) < stop - start
    total += int(_correct(apply_fn, params, jnp.asarray(x[idx]),
                          jnp.asarray(np.where(keep, y[idx], -1))))
  return total


def _stack_snapshots(snaps: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {g: np.stack([s[g] for s in snaps], axis=1) for g in snaps[0]}


def train(config, state, split: dict, rows: dict, tr: dict, key) -> dict[str, np.ndarray]:
  """One training: rounds in segments; features and measurements at the recorded rounds.

  Returns:
    Arrays for the artifact store: white-box features `global/<group>` and `local/<group>`
    [rows, S, d]; FedMIA's `fm_loss`, `fm_cos`, `fm_diff` [R, K, Q], `fm_grad_sq` [R, Q]
    (queries: the global rows); `test_accuracy_rounds` [R]; the final model's test, member and
    per-client local counts; the internal gap `jsd_last_round`; DP info and `clip_fraction`.
  """
  s = _s(config)
  model = state['model']
  apply_fn = model.apply
  factory, strength, opt, info = training_setup(config, state, split, tr)
  clients = client_data(state, split)
  clients = rounds_lib.ClientData(*(None if a is None else jax.tree_util.tree_map(jnp.asarray, a)
                                    for a in clients))
  x_train, y_train = state['x_train'], state['train'].y
  x_test, y_test = state['x_test'], state['test'].y
  params = model.init(point_key(key, {'role': 'init'}), jnp.asarray(x_train[:1]))
  run_key = point_key(key, {'role': 'training'})
  static = dict(apply_fn=apply_fn, optimizer=opt, epochs=int(s.local_epochs),
                batch_size=int(s.batch_size), hook_factory=factory)
  t_total, every = int(s.num_rounds), int(s.record_every)
  recorded = list(range(every - 1, t_total, every))
  attacked = recorded[-int(s.attack_snapshots):]
  feature_fn = _feature_fn(
      apply_fn, whitebox.last_layer_name(params) if s.attack_last_layer_grad else None)
  chunk = int(s.feature_chunk_size)
  g_rows, l_rows = rows['global'], rows['local']
  last_locals = []
  gx = np.concatenate([x_train[np.concatenate(split['members'])], x_test])
  gy = np.r_[y_train[np.concatenate(split['members'])], y_test]
  need_fedmia = bool(set(s.attacks) & set(FEDMIA_ATTACKS)) and 'local' in s.targets
  g_snaps, l_snaps, fm, acc_rounds, upload_norms = [], [], [], [], []
  t = 0
  for r in recorded:
    # Rounds t .. r in one program; `params` becomes w_r, the recorded round's global model.
    new_params, uploads, params = _segment(params, clients, run_key, t,
                                           jnp.float32(strength), num_rounds=r + 1 - t,
                                           **static)
    norms = jax.vmap(dp_lib.global_norm)(uploads)
    upload_norms.append(np.asarray(norms))
    acc_rounds.append(count_correct(apply_fn, new_params, x_test, y_test) / len(y_test))
    if need_fedmia:
      meas = queries.measure(apply_fn, params, uploads, jnp.asarray(gx), jnp.asarray(gy),
                             chunk_size=chunk)
      fm.append({n: np.asarray(getattr(meas, n)) for n in ('loss', 'cos', 'diff', 'grad_sq')})
    if r in attacked:
      g_snaps.append(whitebox.features(feature_fn, new_params, gx, gy, chunk_size=chunk))
      parts = []
      for i in range(len(split['members'])):
        local = jax.tree_util.tree_map(lambda w, u, i=i: w - u[i], params, uploads)
        sel = l_rows['client'] == i
        ex = l_rows['example'][sel]
        is_member = l_rows['labels'][sel] == 1
        xs = np.concatenate([x_train[ex[is_member]], x_test[ex[~is_member]]])
        ys = np.r_[y_train[ex[is_member]], y_test[ex[~is_member]]]
        parts.append(whitebox.features(feature_fn, local, xs, ys, chunk_size=chunk))
      l_snaps.append({g: np.concatenate([p[g] for p in parts]) for g in parts[0]})
    if r == recorded[-1]:
      last_locals = [jax.tree_util.tree_map(lambda w, u, i=i: w - u[i], params, uploads)
                     for i in range(len(split['members']))]
    params, t = new_params, r + 1
  out = {f'global/{g}': v for g, v in _stack_snapshots(g_snaps).items()}
  out.update({f'local/{g}': v for g, v in _stack_snapshots(l_snaps).items()})
  if fm:
    for n in ('loss', 'cos', 'diff', 'grad_sq'):
      out[f'fm_{n}'] = np.stack([m[n] for m in fm])
    out['fm_rounds'] = np.asarray(recorded)
  out['test_accuracy_rounds'] = np.asarray(acc_rounds)
  out['test_correct'] = count_correct(apply_fn, params, x_test, y_test)
  members_all = np.concatenate(split['members'])
  out['member_correct'] = count_correct(apply_fn, params, x_train[members_all],
                                        y_train[members_all])
  out['num_members'] = len(members_all)
  out['local_test_correct'] = np.asarray([count_correct(apply_fn, p, x_test, y_test)
                                          for p in last_locals])
  loss_fn = losses.make_loss_fn(apply_fn)
  jsd = []
  for m, h in zip(split['members'], split['heldout']):
    m, h = m[:_JSD_ROWS], h[:_JSD_ROWS]
    jsd.append(pastel_lib.mean_jsd(apply_fn, loss_fn, params, jnp.asarray(x_train[m]),
                                   jnp.asarray(y_train[m]), jnp.asarray(x_train[h]),
                                   jnp.asarray(y_train[h]), layers=state['layers'],
                                   representation=s.pastel_representation,
                                   temperature=float(s.pastel_temperature)))
  out['jsd_last_round'] = float(np.mean(jsd))
  # Clipping: DP-SGD's per-example gradients at the final global model (members), or the
  # server's clip of the recorded rounds' uploads.
  if tr['defense'] == 'ldp':
    g = out['global/grad_norms'][:, -1][g_rows['labels'] == 1]
    out['clip_fraction'] = float(np.mean(np.sqrt(np.sum(g.astype(np.float64) ** 2, -1)) >
                                         s.clip_norm))
  elif tr['defense'] in ('cdp', 'wdp'):
    out['clip_fraction'] = float(np.mean(np.concatenate(upload_norms) > s.update_clip_norm))
  else:
    out['clip_fraction'] = math.nan
  out['upload_norm_median'] = float(np.median(np.concatenate(upload_norms)))
  for name, value in info.items():
    out[name] = value
  return out


# ---------------------------------------------------------------------------------------------
# Attacks and metrics.


def attack_plan(config) -> list[tuple[str, str]]:
  """(attack, target) pairs; FedMIA attacks score the local target only."""
  s = _s(config)
  return [(a, t) for t in s.targets for a in s.attacks
          if not (a in FEDMIA_ATTACKS and t != 'local')]


def _features(arrays: dict, target: str) -> dict[str, np.ndarray]:
  prefix = f'{target}/'
  return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


def fedmia_scores(arrays: dict, rows: dict, split: dict, attack: str) -> tuple[np.ndarray,
                                                                              np.ndarray]:
  """FedMIA-I / -II (aligned, leave-one-out filter) on the local target's evaluation rows.

  Queries are the global rows (members of every client, then the test split); for target k,
  `scores.pooled_round_scores` ranks k's members against every other query; only k's
  evaluation-half members and test share are kept, so FedMIA scores the same rows as the
  other attacks.
  """
  recording = {n: arrays[f'fm_{n}'] for n in ('loss', 'cos', 'diff', 'grad_sq')}
  recording['rounds'] = arrays['fm_rounds']
  g = rows['global']
  owner = np.where(g['labels'] == 1, g['client'], -1)
  pooled = scores_lib.pooled_round_scores(recording, owner, attack)
  final = scores_lib.combine_rounds(pooled['scores'], attack)
  # Entry order of pooled_round_scores: per target k, its members then every other query.
  query_ids, target_ids = [], []
  for k in range(len(split['members'])):
    members, others = scores_lib.target_views(owner, k)
    query_ids.append(np.r_[members, others])
    target_ids.append(np.full(len(members) + len(others), k))
  query_ids, target_ids = np.concatenate(query_ids), np.concatenate(target_ids)
  loc = rows['local']
  n_members = len(np.concatenate(split['members']))
  # Global query index of each local evaluation row.
  wanted = {}
  for r in loc['eval']:
    k = int(loc['client'][r])
    ex = int(loc['example'][r])
    if loc['labels'][r] == 1:
      q = int(np.flatnonzero((g['client'] == k) & (g['example'] == ex) & (g['labels'] == 1))[0])
    else:
      q = n_members + ex
    wanted[(k, q)] = int(loc['labels'][r])
  keep = np.array([(int(k), int(q)) in wanted for k, q in zip(target_ids, query_ids)])
  labels = np.array([wanted[(int(k), int(q))] for k, q in zip(target_ids[keep],
                                                               query_ids[keep])])
  assert np.array_equal(labels, pooled['labels'][keep])
  return final[keep], labels


def attack_scores(config, arrays: dict, rows: dict, split: dict, attack: str, target: str,
                  key) -> tuple[np.ndarray, np.ndarray]:
  """(scores, labels) of `attack` on `target`'s evaluation half."""
  s = _s(config)
  r = rows[target]
  if attack in FEDMIA_ATTACKS:
    return fedmia_scores(arrays, rows, split, attack)
  feats = _features(arrays, target)
  labels = r['labels'][r['eval']]
  if attack == 'loss_threshold':
    return whitebox.loss_scores({'loss': feats['loss'][r['eval']]}), labels
  scores = whitebox.train_and_score(
      point_key(key, {'role': 'attack', 'target': target}),
      {g: v[r['train']] for g, v in feats.items()}, r['labels'][r['train']],
      {g: v[r['eval']] for g, v in feats.items()}, steps=int(s.attack_steps),
      learning_rate=float(s.attack_learning_rate), hidden=int(s.attack_hidden))
  return scores, labels


def training_metrics(arrays: dict, num_clients: int) -> dict[str, float]:
  """Utility, gap, DP and regulariser diagnostics of one training (shared by its points)."""
  m = {}
  n_test = int(arrays['num_test'])
  m.update(stats.rate('accuracy', int(arrays['test_correct']), n_test))
  m['local_accuracy_mean'] = float(np.mean(arrays['local_test_correct']) / n_test)
  m['member_accuracy'] = float(arrays['member_correct']) / float(arrays['num_members'])
  m['generalization_gap'] = m['member_accuracy'] - m['accuracy']
  for name in ('dp_epsilon', 'dp_epsilon_per_round', 'noise_multiplier', 'clip_fraction',
               'jsd_last_round', 'upload_norm_median'):
    m[name] = float(arrays[name])
  del num_clients
  return m


def point_metrics(config, arrays: dict, rows: dict, split: dict, attack: str, target: str,
                  key, tr_defense: str = 'none', tr_strength: float = 0.0) -> dict[str, float]:
  scores, labels = attack_scores(config, arrays, rows, split, attack, target, key)
  base = evaluate_lib.score_metrics(scores, labels)
  m = {'attack_auc': base['auc'], 'attack_auc_ci_low': base['auc_ci_low'],
       'attack_auc_ci_high': base['auc_ci_high'], 'log_auc': base['log_auc']}
  for name in ('tpr_at_fpr_1e-2', 'tpr_at_fpr_1e-3'):
    for suffix in ('', '_ci_low', '_ci_high'):
      m[name + suffix] = base[name + suffix]
  m['n_pos'], m['n_neg'] = base['n_pos'], base['n_neg']
  m.update(training_metrics(arrays, len(split['members'])))
  if tr_defense in DP_NAMES:
    m.update(auditing.attack_bounds(scores, labels, float(_s(config).dp_delta)))
    decl = dp_accounting(config, split, tr_defense, tr_strength)
    for k in ('dp_unit', 'dp_relation', 'dp_adversary', 'dp_sampling'):
      m[k] = decl[k]
    if decl['dp_adversary'] == 'aggregate' and target == 'local':
      # The server reads each upload before DP-FedAvg adds its noise: no epsilon holds here.
      m['dp_epsilon'] = math.nan
      m['dp_epsilon_per_round'] = math.nan
  return m


def point_params(tr: dict, attack: str, target: str) -> dict:
  return dict(defense=tr['defense'], strength=float(tr['strength']),
              optimizer=tr['optimizer'], attack=attack, target=target)


def sweep(config, state, store, key) -> None:
  """Trains (or loads) every training, scores every (attack, target), writes table and figures.

  Args:
    config: the validated config.
    state: what `prepare` returned.
    store: the run's `fl_privacy.report.ResultsStore`.
    key: the run's PRNG key.
  """
  split = split_data(config, state, key)
  rows = attack_rows(config, state, split, key)
  artifacts = ArtifactStore(store.workdir, TRAINED)
  plan = attack_plan(config)
  losses_for_figure = {}
  todo_trainings = trainings(config)
  progress.plan(len(todo_trainings) * len(plan))
  for tr in todo_trainings:
    arrays = None
    todo = [p for p in (point_params(tr, a, t) for a, t in plan) if store.get(p) is None]
    if todo or tr['defense'] in ('none', 'pastel'):
      arrays = artifacts.load(tr)
      if arrays is None:
        logging.info('pastel: training %s', describe(tr))
        arrays = train(config, state, split, rows, tr, key)
        arrays['num_test'] = len(state['test'])
        artifacts.save(tr, arrays)
      m = training_metrics(arrays, len(split['members']))
      logging.info('pastel: %s test accuracy %.4f, JSD %.4f', describe(tr), m['accuracy'],
                   m['jsd_last_round'])
      if 'global/loss' in arrays:
        g = rows['global']
        losses_for_figure[describe(tr)] = dict(
            params=tr, member=arrays['global/loss'][g['labels'] == 1, -1, 0],
            nonmember=arrays['global/loss'][g['labels'] == 0, -1, 0])
    for attack, target in plan:
      p = point_params(tr, attack, target)
      n_eval = len(rows[target]['eval'])
      run_point(store, p, lambda a=attack, t=target, arr=arrays: (
          point_metrics(config, arr, rows, split, a, t, key, tr['defense'], tr['strength']),
          n_eval))
  atomic.atomic_write_text(os.path.join(store.workdir, TABLE),
                           pastel_figures.table_markdown(config, store.points))
  pastel_figures.save_figures(config, store.points, losses_for_figure, store.workdir)
