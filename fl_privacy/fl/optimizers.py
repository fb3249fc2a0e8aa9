"""Client optimizers by config name (optax)."""

from __future__ import annotations

import optax

from fl_privacy import validate

OPTIMIZERS = ('sgd', 'momentum', 'adam', 'adagrad')
DEFAULT_MOMENTUM = 0.9


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
