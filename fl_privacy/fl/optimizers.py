"""Client optimizers by config name (optax)."""

from __future__ import annotations

import jax.numpy as jnp
import optax

from fl_privacy import validate

OPTIMIZERS = ('sgd', 'momentum', 'adam', 'adagrad')
DEFAULT_MOMENTUM = 0.9
LR_SCHEDULES = ('cosine', 'exponential', 'constant')


def make(name: str, learning_rate, *, weight_decay: float = 0.0,
         field: str = 'optimizer', **kw) -> optax.GradientTransformation:
  """The optimizer called `name`.

  Args:
    name: One of `OPTIMIZERS`: plain SGD, SGD with heavy-ball momentum (default
      0.9, as in the dishonest-server and FedMIA clients), Adam, AdaGrad.
    learning_rate: A float, a traced scalar (e.g. a per-round cosine value) or
      an optax schedule.
    weight_decay: Coupled L2 decay added to the gradient before the optimizer,
      as PyTorch's `weight_decay` does (FedMIA uses 5e-4); 0 disables it.
    field: Config field named in the error for an unknown `name`.
    **kw: Passed to the optax constructor (`momentum`, `nesterov`, `b1`,
      `b2`, `eps`, `initial_accumulator_value`, ...).

  Returns:
    An `optax.GradientTransformation`.

  Raises:
    ConfigError: `name` is not in `OPTIMIZERS`.
  """
  validate.require(name in OPTIMIZERS, field, f'one of {OPTIMIZERS}', name)
  if name == 'sgd':
    opt = optax.sgd(learning_rate, **kw)
  elif name == 'momentum':
    kw.setdefault('momentum', DEFAULT_MOMENTUM)
    opt = optax.sgd(learning_rate, **kw)
  elif name == 'adam':
    opt = optax.adam(learning_rate, **kw)
  else:
    opt = optax.adagrad(learning_rate, **kw)
  if weight_decay:
    opt = optax.chain(optax.add_decayed_weights(weight_decay), opt)
  return opt


def per_round(name: str, learning_rate: float, *, num_rounds: int, schedule: str,
              decay: float = 1.0, momentum: float = 0.0, weight_decay: float = 0.0,
              field: str = 'optimizer'):
  """`t -> optax`: the optimizer `name` at round t's learning rate (FedMIA's clients).

  Args:
    name: One of `OPTIMIZERS`.
    learning_rate: lr_0.
    num_rounds: T, the cosine schedule's period.
    schedule: One of `LR_SCHEDULES`: 'cosine' is PyTorch's CosineAnnealingLR over the rounds
      (eta_min 0), lr_0 (1 + cos(pi t / T)) / 2; 'exponential' lr_0 decay^t; 'constant' lr_0.
    decay: The exponential schedule's factor per round.
    momentum: Heavy-ball momentum of 'sgd' and 'momentum' (0 leaves plain SGD plain and
      'momentum' at `DEFAULT_MOMENTUM`); ignored by the others.
    weight_decay: As in `make`.
    field: Config field named in the error for an unknown `name`.

  Returns:
    `optimizer(t)`, t the global round (a traced scalar); pass the same object to every
    training to reuse compilations.
  """
  kw = {'momentum': float(momentum)} if name in ('sgd', 'momentum') else {}
  if name == 'sgd' and not momentum:
    kw = {}

  def lr(t):
    if schedule == 'cosine':
      return learning_rate * 0.5 * (1.0 + jnp.cos(jnp.pi * t / num_rounds))
    if schedule == 'exponential':
      return learning_rate * decay ** t
    return learning_rate

  def optimizer(t):
    return make(name, lr(t), weight_decay=weight_decay, field=field, **kw)
  return optimizer
