"""One reconstruction trial: the server sends a model, one client trains, the server reads.

A trial draws the client's n examples from a pool (a shard padded to the game's static
`capacity`, real rows masked, as our simulations pad unequal clients; n is an argument, so one
compiled program serves every client size and J = ceil(n / B)), builds the model the server sends
(honest, or with the imprint block crafted in front: `imprint.inject` + `imprint.craft`),
runs the client's real round (`fl.local.client_update`: E epochs of J minibatches of B, the
defense's hooks at every point, its upload hook last) and hands the upload to the attack:

- `imprint`: `imprint.recover_update` (Fowl et al. 2022, Eq. (2)), up to N inputs;
- `analytic`: `analytic.recover_update` on the honest model's first dense layer (Phong et
  al. 2018), one input;
- `inversion`: `inversion.invert` of the upload's direction (Geiping et al. 2020), N inputs,
  labels from iDLG where N = 1 and given otherwise (their batch experiments' assumption).

`make_trial(*games)` is the `trial_fn(key, index, x_pool, y_pool, cuts, n, branch, knobs)` of
`eval.runner.run_trials`: everything random comes from the trial's key by `fold_in`, so a
trial's outcome depends only on it. `knobs` (`Knobs`: the imprint's restore scale, structure
and rounds, the client's learning rate) are traced operands, not constants of the program, so that one
compilation serves a learning-rate sweep and an adaptive server's tuning grid. Scores are
computed on the host (`metrics`), from the returned pool indices of the client's examples.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from fl_privacy.attacks.reconstruction import analytic
from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.attacks.reconstruction import inversion
from fl_privacy.fl import client
from fl_privacy.fl import local
from fl_privacy.fl import losses
from fl_privacy.fl import optimizers as optimizers_lib

ATTACKS = ('imprint', 'analytic', 'inversion')
# Outputs of one trial.
OUTCOME_FIELDS = ('index', 'recovered', 'valid', 'label')


class Knobs(NamedTuple):
  """What a trial reads as traced scalars (float32 arrays), not as program constants.

  restore_scale: `imprint.craft`'s (the server's choice; an adaptive server tunes it).
  learning_rate: the client's optimizer's rate (the driver of multi-step drift).
  pool_size: the client draws from the first `pool_size` rows of the pool (int32), so that
    pools of different sizes padded to one shape (the clients' split, the public split the
    adaptive server simulates on) share a program.
  sparse: the imprint's structure (float32 1: `imprint`'s sparse one-hot layer; 0: the
    paper's cumulative one).
  rounds: the server sends the same crafted model this many rounds (int32 >= 1) and reads the
    mean of the client's uploads: the client's data are the same each round, the defense's
    randomness (its noise, its sampling) fresh, so noise averages down by sqrt(rounds).
  """
  restore_scale: jax.Array
  learning_rate: jax.Array
  pool_size: jax.Array
  sparse: jax.Array
  rounds: jax.Array


def knobs(restore_scale: float, learning_rate: float, pool_size: int, sparse: bool = False,
          rounds: int = 1) -> Knobs:
  """`Knobs` as scalars of one dtype and shape each (new values never recompile)."""
  if int(rounds) < 1:
    raise ValueError(f'rounds must be >= 1 (got {rounds})')
  return Knobs(jnp.float32(restore_scale), jnp.float32(learning_rate), jnp.int32(pool_size),
               jnp.float32(1.0 if sparse else 0.0), jnp.int32(rounds))


def draw(key: jax.Array, rows: int, pool_size, count: int) -> jax.Array:
  """`count` distinct indices, uniformly without replacement, from the first `pool_size` of
  `rows` (the `count` smallest of uniform keys, the padding's keys set above every real one)."""
  u = jax.random.uniform(key, (rows,))
  u = jnp.where(jnp.arange(rows) < pool_size, u, 2.0)
  return jax.lax.top_k(-u, count)[1].astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Game:
  """One configuration (static across its trials).

  Attributes:
    attack: one of `ATTACKS`.
    model: the honest Flax model (the imprint attack puts its block in front).
    batch_size: B, the client's minibatch (static).
    capacity: the largest client (static); a trial's client holds n <= capacity real rows,
      trained in ceil(n / B) minibatches per epoch (the last one partial).
    epochs: E.
    optimizer: the client's optimizer's name (`fl.optimizers.OPTIMIZERS`), built inside the
      trial at the traced `Knobs.learning_rate`.
    learning_rate: the client's rate when a trial is run without `Knobs`.
    input_layer: the honest model's dense layer on the flat input (the analytic attack's).
    output_layer: its classifier (iDLG reads its bias).
    hooks: the client's defense (`fl.client.ClientHooks`); None trains plain FedAvg.
    num_bins: the imprint layer's width n.
    scale, restore_scale: `imprint.craft`'s (restore_scale: the default of `Knobs`).
    inversion: `inversion.Settings`.
    value_range: the inputs' range (the inversion's box).
  """
  attack: str
  model: nn.Module
  batch_size: int
  capacity: int = 0
  epochs: int = 1
  optimizer: str = 'sgd'
  learning_rate: float = 0.1
  input_layer: str = 'fc1'
  output_layer: str = 'fc2'
  hooks: client.ClientHooks | None = None
  num_bins: int = 0
  scale: float = imprint.SCALE
  restore_scale: float = imprint.RESTORE_SCALE
  inversion: inversion.Settings = inversion.Settings()
  value_range: tuple[float, float] = (0.0, 1.0)

  def __post_init__(self):
    if self.attack not in ATTACKS:
      raise ValueError(f'attack must be one of {ATTACKS} (got {self.attack!r})')
    if self.capacity < 1:
      object.__setattr__(self, 'capacity', self.batch_size)
    if self.attack == 'imprint' and self.num_bins < self.capacity:
      raise ValueError(f'the imprint layer needs at least N = {self.capacity} bins '
                       f'(got {self.num_bins})')

  @property
  def num_recovered(self) -> int:
    """Rows of the `recovered` output: the capacity, or 1 for the analytic attack."""
    return 1 if self.attack == 'analytic' else self.capacity

  def default_knobs(self, pool_size: int) -> Knobs:
    return knobs(self.restore_scale, self.learning_rate, pool_size)


def sent_model(game: Game) -> nn.Module:
  """The architecture the server sends: the imprint attack's block in front of the model."""
  return imprint.inject(game.model, game.num_bins) if game.attack == 'imprint' else game.model


def loss_fn_for(model: nn.Module, **call_kwargs):
  """Mean cross-entropy of `model` as a function of its params (masks and soft labels as
  `fl.losses` takes them, so every defense's hooks apply); `call_kwargs` go to its call (the
  imprint block's `sparse`)."""
  return losses.make_loss_fn(lambda p, x: model.apply({'params': p}, x, **call_kwargs))


def _layer(params: Any, game: Game, name: str) -> Any:
  return params[imprint.BASE][name] if game.attack == 'imprint' else params[name]


def server_params(game: Game, key: jax.Array, x_example: jax.Array, cuts: jax.Array,
                  restore_scale: jax.Array | float | None = None, sparse=0.0) -> Any:
  """The parameters the server sends: a random model, crafted for the imprint attack
  (`restore_scale` and `sparse`, traced or not; None: the game's)."""
  k_init, k_craft = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
  params = sent_model(game).init(k_init, x_example[None])['params']
  if game.attack == 'imprint':
    params = imprint.craft(params, cuts, k_craft, scale=game.scale,
                           restore_scale=game.restore_scale if restore_scale is None
                           else restore_scale, sparse=sparse, top=game.value_range[1])
  return params


def attack(game: Game, key: jax.Array, params: Any, upload: Any, x_shape: tuple, labels,
           mask: jax.Array, sparse=0.0) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The server's reading of one upload: (recovered flat inputs [K, d], valid [K], label).

  The server knows the client's example count n (FedAvg weights uploads by it): the imprint
  attack keeps the n strongest bins, the inversion optimises n inputs.
  """
  n = jnp.sum(mask > 0)
  label = inversion.idlg_label(_layer(upload, game, game.output_layer)['bias'])
  if game.attack == 'imprint':
    rec, valid, _ = imprint.recover_update(upload, game.capacity, sparse=sparse)
    valid = valid & (jnp.arange(game.capacity) < n)
  elif game.attack == 'analytic':
    layer = _layer(upload, game, game.input_layer)
    x, ok = analytic.recover_update(layer['kernel'], layer['bias'])
    rec, valid = x[None], ok[None]
  else:
    loss_fn = loss_fn_for(sent_model(game))
    grad_fn = lambda x, y: jax.grad(loss_fn)(params, x, y, mask)
    y = jnp.where(n == 1, jnp.full_like(labels, label), labels)
    x, _ = inversion.invert(key, grad_fn, upload, x_shape, y, game.inversion,
                            game.value_range, mask)
    rec, valid = x.reshape(game.capacity, -1), mask > 0
  lo, hi = game.value_range
  # The server knows the data's range: clipping a recovery into it is free.
  return jnp.clip(rec, lo, hi), valid, label


def run(game: Game, key: jax.Array, x_pool: jax.Array, y_pool: jax.Array, cuts: jax.Array,
        n: jax.Array, knobs_: Knobs | None = None) -> dict[str, jax.Array]:
  """One trial of a client holding n examples (the first n of `index`; the rest padding),
  at `knobs_` (None: the game's restore scale and learning rate).

  Keys: `fold_in(key, 0)` the server's model, 1 the client's data, 2 the client's round
  (shuffling and the defense; round r > 0 of `knobs_.rounds` folds r into it), 3 the attack
  (the inversion's restarts). The client's examples
  are a prefix of one random order of the pool (`draw`) and its minibatches depend only on its
  real rows (`fl.local.masked_batch_order`), so a trial is the same in any program large enough.
  """
  k_model, k_data, k_train, k_attack = (jax.random.fold_in(key, i) for i in range(4))
  kn = game.default_knobs(x_pool.shape[0]) if knobs_ is None else knobs_
  index = draw(k_data, x_pool.shape[0], kn.pool_size, game.capacity)
  mask = (jnp.arange(game.capacity) < n).astype(jnp.float32)
  x, y = x_pool[index], y_pool[index]
  imprinting = game.attack == 'imprint'
  sparse = kn.sparse if imprinting else 0.0
  params = server_params(game, k_model, x[0], cuts, kn.restore_scale, sparse)
  optimizer = optimizers_lib.make(game.optimizer, kn.learning_rate)
  loss_fn = loss_fn_for(sent_model(game), **({'sparse': sparse} if imprinting else {}))

  def one_round(r, total):
    # Round 0 keeps the single round's key (one round is the same trial as before).
    k = jax.random.wrap_key_data(jnp.where(r == 0, jax.random.key_data(k_train),
                                           jax.random.key_data(jax.random.fold_in(k_train, r))))
    upload, _ = local.client_update(loss_fn, params, x, y, key=k, hooks=game.hooks, mask=mask,
                                    optimizer=optimizer, epochs=game.epochs,
                                    batch_size=game.batch_size)
    return jax.tree.map(jnp.add, total, upload)

  zero = jax.tree.map(jnp.zeros_like, params)
  rounds = jnp.maximum(kn.rounds, 1)
  total = jax.lax.fori_loop(0, rounds, one_round, zero)
  upload = jax.tree.map(lambda t: t / rounds.astype(t.dtype), total)
  rec, valid, label = attack(game, k_attack, params, upload, x.shape, y, mask, sparse)
  return dict(index=index, recovered=rec, valid=valid, label=label)


def make_trial(*games: Game):
  """`trial_fn(key, index, x_pool, y_pool, cuts, n, branch, knobs)` for
  `eval.runner.run_trials` (`knobs`: a `Knobs` of traced scalars).

  With several games (one defense at several strengths: the same shapes, other constants in
  the hooks) the trial runs `games[branch]` (`lax.switch`): one program compiles them all,
  about half the compilation of one program each (measured on CPU, three mixup strengths:
  27 s against 53 s); with one game `branch` is ignored.
  """
  if not games:
    raise ValueError('make_trial needs at least one game')

  def trial_fn(key, index, x_pool, y_pool, cuts, n, branch, knobs_):
    del index  # the key is already fold_in(run_key, index)
    knobs_ = Knobs(*knobs_)
    if len(games) == 1:
      return run(games[0], key, x_pool, y_pool, cuts, n, knobs_)
    return jax.lax.switch(branch, [lambda g=g: run(g, key, x_pool, y_pool, cuts, n, knobs_)
                                   for g in games])
  return trial_fn
