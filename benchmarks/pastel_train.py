"""Client training throughput with the PASTEL regulariser: vmapped clients vs a loop over clients.

One FedAvg round of K clients (E epochs of J minibatches of B, AdaGrad), the regulariser's V
drawn from each client's held-out rows at every step, in three modes: lambda = 0 (the hook
returns the plain loss), `activation` and `gradient` (lambda = 1, every Dense layer for the MLP;
`block8` and `fc1` for the ResNet). The vmapped side is one jitted `vmap` of
`local.fedavg` over the K clients (what `fl.rounds.run` does); the reference is a Python loop
over the same clients, each one call of the jitted single-client trainer, with the same keys
and data. Compilation is excluded (warm-up call) on both sides. Throughput is client steps per
second (K x E x J steps per round).

  python -m benchmarks.pastel_train                        # digits MLP and a small ResNet round
  python -m benchmarks.pastel_train --models=mlp
  python -m benchmarks.pastel_train --models=resnet --repeats=1   # ~7 min on 2 CPU cores
  python -m benchmarks.pastel_train --resnet_clients=4 --resnet_examples=128   # GPU

Models: the digits MLP(128, 64) on 8x8 digits (K = 5, 230 members and 57 held-out rows each,
B = 32, E = 2: 16 steps per client) and ResNet-18-GN on CIFAR-sized 32x32x3 synthetic images
(K = `resnet_clients`, `resnet_examples` members each, B = 32, E = 1), so it runs offline.
The last printed line is the JSON summary of `benchmarks.common.report` (the MLP activation
row: vmapped vs loop).
"""

from __future__ import annotations

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from fl_privacy import data as data_lib
from fl_privacy import models as models_lib
from fl_privacy.defenses import pastel
from fl_privacy.fl import local
from fl_privacy.fl import losses
from fl_privacy.fl import optimizers

_MODELS = flags.DEFINE_list('models', ['mlp', 'resnet'], 'Which models to time.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed repetitions (median reported).')
_RESNET_CLIENTS = flags.DEFINE_integer('resnet_clients', 2, 'K of the ResNet round.')
_RESNET_EXAMPLES = flags.DEFINE_integer('resnet_examples', 32, 'Members per ResNet client.')
_MODES = flags.DEFINE_list('modes', ['lambda=0', 'activation', 'gradient'],
                           'Which modes to time (the gradient mode is second order).')

MODES = (('lambda=0', 'activation', 0.0), ('activation', 'activation', 1.0),
         ('gradient', 'gradient', 1.0))


def _digits(num_clients: int, members: int, held: int):
  ds = data_lib.load({'name': 'digits'})['train']
  x, y = data_lib.to_float(ds.x), ds.y
  rng = np.random.default_rng(0)
  order = rng.permutation(len(y))[:num_clients * (members + held)].reshape(num_clients, -1)
  return (x[order[:, :members]], y[order[:, :members]], x[order[:, members:]],
          y[order[:, members:]])


def _synthetic_images(num_clients: int, members: int, held: int):
  rng = np.random.default_rng(0)
  n = members + held
  x = rng.uniform(size=(num_clients, n, 32, 32, 3)).astype(np.float32)
  y = rng.integers(0, 10, size=(num_clients, n)).astype(np.int32)
  return x[:, :members], y[:, :members], x[:, members:], y[:, members:]


def _setup(name: str):
  if name == 'mlp':
    model = models_lib.MLP(hidden=(128, 64), num_classes=10)
    xs, ys, hx, hy = _digits(5, 230, 57)
    return model, (xs, ys, hx, hy), ('fc1', 'fc2', 'fc3'), 2
  model = models_lib.ResNet18GN(num_classes=10)
  k, m = _RESNET_CLIENTS.value, _RESNET_EXAMPLES.value
  xs, ys, hx, hy = _synthetic_images(k, m, max(8, m // 4))
  return model, (xs, ys, hx, hy), ('block8', 'fc1'), 1


def _time_model(name: str) -> list[dict]:
  model, (xs, ys, hx, hy), layers, epochs = _setup(name)
  k, n = xs.shape[:2]
  batch = 32
  steps = k * epochs * (n // batch)
  params = model.init(jax.random.key(0), jnp.asarray(xs[0, :1]))
  loss_fn = losses.make_loss_fn(model.apply)
  opt = optimizers.make('adagrad', 0.1)
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(1), i))(jnp.arange(k))
  xs, ys = jnp.asarray(xs), jnp.asarray(ys)
  aux = {'x': jnp.asarray(hx), 'y': jnp.asarray(hy), 'mask': jnp.ones(hy.shape, jnp.float32)}
  rows = []
  for label, representation, weight in MODES:
    if label not in _MODES.value:
      continue
    hooks = pastel.make(model.apply, weight=weight, layers=layers,
                        representation=representation, heldout_batch_size=batch)

    def one(x, y, a, key, hooks=hooks):
      return local.fedavg(loss_fn, params, x, y, key=key, optimizer=opt, epochs=epochs,
                          batch_size=batch, hooks=hooks, aux=a)

    vmapped = jax.jit(jax.vmap(one))
    single = jax.jit(one)
    aux_k = [jax.tree_util.tree_map(lambda v, i=i: v[i], aux) for i in range(k)]
    t_vmap = common.time_median(lambda: vmapped(xs, ys, aux, keys), repeats=_REPEATS.value)
    t_loop = common.time_median(lambda: [single(xs[i], ys[i], aux_k[i], keys[i])
                                         for i in range(k)], repeats=_REPEATS.value)
    a = vmapped(xs, ys, aux, keys)
    b = [single(xs[i], ys[i], aux_k[i], keys[i]) for i in range(k)]
    diff = max(float(jnp.max(jnp.abs(la[i] - lb))) for i in range(k)
               for la, lb in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b[i])))
    rows.append(dict(model=name, mode=label, clients=k, steps=steps,
                     vmap_steps_per_s=steps / t_vmap, loop_steps_per_s=steps / t_loop,
                     ratio=t_loop / t_vmap, max_abs_diff=diff))
  return rows


def main(argv):
  del argv
  rows = []
  for name in _MODELS.value:
    if name not in ('mlp', 'resnet'):
      raise app.UsageError(f'--models: mlp and/or resnet (got {name!r})')
    rows += _time_model(name)
  head = next((r for r in rows if r['mode'] == 'activation'), rows[0])
  print(f'devices: {jax.devices()}; outputs of the two sides agree up to float rounding '
        '(max_abs_diff)')
  common.report('pastel_train', rows, head['vmap_steps_per_s'], head['loop_steps_per_s'],
                common.peak_rss_mb())


if __name__ == '__main__':
  app.run(main)
