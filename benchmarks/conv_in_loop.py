"""Why CPU training uses im2col convolutions: one ResNet-18-GN step inside a loop vs outside.

Local training (`fl.local.fedavg`) runs its steps in one `lax.scan`. On XLA:CPU a convolution
inside a loop body loses the fast (Eigen) path: the kernel gradient's convolution keeps a layout
that path does not take (jax-ml/jax#12868). This times one SGD step of ResNet-18-GN (CIFAR-sized
32x32x3 inputs, B images, cross-entropy) in four forms, each jitted, compilation excluded:

  scan, im2col   the step inside `lax.scan` with `conv_impl='im2col'` (what CPU training runs)
  scan, xla      the step inside `lax.scan` with XLA's convolutions (the reference)
  plain, xla     the same step with no loop around it, XLA's convolutions
  plain, im2col  the same step with no loop, im2col

The headline is scan/im2col against scan/xla (the same work in the form training needs).
All four give the same parameters up to float rounding (max_abs_diff, against plain/xla).

  python -m benchmarks.conv_in_loop                 # B = 8 (the XLA-in-scan row takes ~1 min)
  python -m benchmarks.conv_in_loop --batch=32
"""

from __future__ import annotations

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from fl_privacy import models as models_lib
from fl_privacy.fl import losses

_BATCH = flags.DEFINE_integer('batch', 8, 'Images per step.')
_REPEATS = flags.DEFINE_integer('repeats', 1, 'Timed repetitions (median reported).')


def _step_fn(conv_impl: str, in_scan: bool, x, y):
  model = models_lib.ResNet18GN(num_classes=10, conv_impl=conv_impl)
  loss_fn = losses.make_loss_fn(model.apply)

  def sgd(p):
    g = jax.grad(loss_fn)(p, x, y)
    return jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g)

  if not in_scan:
    return jax.jit(sgd)
  return jax.jit(lambda p: jax.lax.scan(lambda c, _: (sgd(c), None), p, None, length=1)[0])


def main(argv):
  del argv
  rng = np.random.default_rng(0)
  b = _BATCH.value
  x = jnp.asarray(rng.uniform(size=(b, 32, 32, 3)).astype(np.float32))
  y = jnp.asarray(rng.integers(0, 10, size=b).astype(np.int32))
  params = models_lib.ResNet18GN(num_classes=10, conv_impl='xla').init(jax.random.key(0), x[:1])
  reference = _step_fn('xla', False, x, y)(params)
  rows, rate = [], {}
  for form, in_scan in (('scan', True), ('plain', False)):
    for impl in ('im2col', 'xla'):
      fn = _step_fn(impl, in_scan, x, y)
      seconds = common.time_median(lambda fn=fn: fn(params), repeats=_REPEATS.value)
      diff = max(float(jnp.max(jnp.abs(a - r))) for a, r in zip(
          jax.tree_util.tree_leaves(fn(params)), jax.tree_util.tree_leaves(reference)))
      rate[form, impl] = 1.0 / seconds
      rows.append(dict(form=form, conv_impl=impl, batch=b, seconds_per_step=seconds,
                       max_abs_diff=diff))
  print(f'devices: {jax.devices()}; reference: the same step in lax.scan with XLA convolutions')
  common.report('conv_in_loop', rows, rate['scan', 'im2col'], rate['scan', 'xla'],
                common.peak_rss_mb())


if __name__ == '__main__':
  app.run(main)
