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

`make_trial(*games)` is the `trial_fn(key, index, x_pool, y_pool, cuts, n, branch)` of
`eval.runner.run_trials`: everything random comes from the trial's key by `fold_in`, so a
trial's outcome depends only on it. Scores are computed on the host (`metrics`), from the
returned pool indices of the client's examples.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fl_privacy.attacks.reconstruction import analytic
from fl_privacy.attacks.reconstruction import imprint
from fl_privacy.attacks.reconstruction import inversion
from fl_privacy.fl import client
from fl_privacy.fl import local
from fl_privacy.fl import losses

ATTACKS = ('imprint', 'analytic', 'inversion')
# Outputs of one trial.
OUTCOME_FIELDS = ('index', 'recovered', 'valid', 'label')


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
    optimizer: the client's optax optimizer.
    input_layer: the honest model's dense layer on the flat input (the analytic attack's).
    output_layer: its classifier (iDLG reads its bias).
    hooks: the client's defense (`fl.client.ClientHooks`); None trains plain FedAvg.
    num_bins: the imprint layer's width n.
    scale, restore_scale: `imprint.craft`'s.
    inversion: `inversion.Settings`.
    value_range: the inputs' range (the inversion's box).
  """
  attack: str
  model: nn.Module
  batch_size: int
  capacity: int = 0
  epochs: int = 1
  optimizer: optax.GradientTransformation = dataclasses.field(
      default_factory=lambda: optax.sgd(0.1))
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


def sent_model(game: Game) -> nn.Module:
  """The architecture the server sends: the imprint attack's block in front of the model."""
  return imprint.inject(game.model, game.num_bins) if game.attack == 'imprint' else game.model


def loss_fn_for(model: nn.Module):
  """Mean cross-entropy of `model` as a function of its params (masks and soft labels as
  `fl.losses` takes them, so every defense's hooks apply)."""
  return losses.make_loss_fn(lambda p, x: model.apply({'params': p}, x))


def _layer(params: Any, game: Game, name: str) -> Any:
  return params[imprint.BASE][name] if game.attack == 'imprint' else params[name]


def server_params(game: Game, key: jax.Array, x_example: jax.Array, cuts: jax.Array) -> Any:
  """The parameters the server sends: a random model, crafted for the imprint attack."""
  k_init, k_craft = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
  params = sent_model(game).init(k_init, x_example[None])['params']
  if game.attack == 'imprint':
    params = imprint.craft(params, cuts, k_craft, scale=game.scale,
                           restore_scale=game.restore_scale)
  return params


def attack(game: Game, key: jax.Array, params: Any, upload: Any, x_shape: tuple, labels,
           mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The server's reading of one upload: (recovered flat inputs [K, d], valid [K], label).

  The server knows the client's example count n (FedAvg weights uploads by it): the imprint
  attack keeps the n strongest bins, the inversion optimises n inputs.
  """
  n = jnp.sum(mask > 0)
  label = inversion.idlg_label(_layer(upload, game, game.output_layer)['bias'])
  if game.attack == 'imprint':
    rec, valid, _ = imprint.recover_update(upload, game.capacity)
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
        n: jax.Array) -> dict[str, jax.Array]:
  """One trial of a client holding n examples (the first n of `index`; the rest padding).

  Keys: `fold_in(key, 0)` the server's model, 1 the client's data, 2 the client's round
  (shuffling and the defense), 3 the attack (the inversion's restarts). The client's examples
  are a prefix of one permutation of the pool and its minibatches depend only on its real
  rows (`fl.local.masked_batch_order`), so a trial is the same in any program large enough.
  """
  k_model, k_data, k_train, k_attack = (jax.random.fold_in(key, i) for i in range(4))
  index = jax.random.permutation(k_data, x_pool.shape[0])[:game.capacity].astype(jnp.int32)
  mask = (jnp.arange(game.capacity) < n).astype(jnp.float32)
  x, y = x_pool[index], y_pool[index]
  params = server_params(game, k_model, x[0], cuts)
  upload, _ = local.client_update(loss_fn_for(sent_model(game)), params, x, y, key=k_train,
                                  hooks=game.hooks, mask=mask, optimizer=game.optimizer,
                                  epochs=game.epochs, batch_size=game.batch_size)
  rec, valid, label = attack(game, k_attack, params, upload, x.shape, y, mask)
  return dict(index=index, recovered=rec, valid=valid, label=label)


def make_trial(*games: Game):
  """`trial_fn(key, index, x_pool, y_pool, cuts, n, branch)` for `eval.runner.run_trials`.

  With several games (one defense at several strengths: the same shapes, other constants in
  the hooks) the trial runs `games[branch]` (`lax.switch`): one program compiles them all,
  about half the compilation of one program each (measured on CPU, three mixup strengths:
  27 s against 53 s); with one game `branch` is ignored.
  """
  if not games:
    raise ValueError('make_trial needs at least one game')

  def trial_fn(key, index, x_pool, y_pool, cuts, n, branch):
    del index  # the key is already fold_in(run_key, index)
    if len(games) == 1:
      return run(games[0], key, x_pool, y_pool, cuts, n)
    return jax.lax.switch(branch, [lambda g=g: run(g, key, x_pool, y_pool, cuts, n)
                                   for g in games])
  return trial_fn
