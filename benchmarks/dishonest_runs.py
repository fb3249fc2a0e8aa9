"""Throughput of the dishonest-server game: the runner's default vs a sequential loop over runs.

Every row does the same work: the same runs (keys, client data, targets, trunks), each a
crafted Flower CNN, one FedAvg round of real local training (J = 16 minibatches of B = 32,
E = 1, SGD with momentum) and the server's simulated step, on 28x28x1 inputs (MNIST-sized
synthetic images, so it runs offline). Compilation is excluded (warm-up call) everywhere.

Rows:
- headline: `eval.runner.run_trials` at the experiment's defaults (`game.chunk_size=None`,
  `game.batch_bytes=None`) with the default model (`FlowerCNN(conv_impl='auto')`: im2col +
  matmul convolutions on CPU, XLA's convolutions on accelerators). On CPU one run's working
  set exceeds the group budget, so runs go one at a time inside a jitted chunk; on an
  accelerator they run side by side (vmap).
- reference: a Python loop over the same runs, each one call of the jitted single-run
  function with XLA's convolutions (the plain way to run them).
- the same loop with im2col convolutions; run_trials with every run of the chunk vmapped
  (`batch_bytes` huge: the wide form, grouped convolutions) with each convolution form.

  python -m benchmarks.dishonest_runs
  python -m benchmarks.dishonest_runs --runs=64 --num_batches=16

The last printed line is the JSON summary of `benchmarks.common.report`.
"""

from __future__ import annotations

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from fl_privacy import data as data_lib
from fl_privacy import models
from fl_privacy.attacks import dishonest
from fl_privacy.eval import runner
from fl_privacy.fl import optimizers

_RUNS = flags.DEFINE_integer('runs', 32, 'Runs per measurement (half with the target inside).')
_NUM_BATCHES = flags.DEFINE_integer('num_batches', 16, 'J, minibatches per epoch.')
_EPOCHS = flags.DEFINE_integer('epochs', 1, 'E, local epochs.')
_M = flags.DEFINE_integer('M', 4, 'Detected feature values.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed repetitions (median reported).')


def _pool(num_examples: int):
  ds = data_lib.load(dict(name='synthetic', num_examples=num_examples, num_classes=10,
                          shape=(28, 28, 1), seed=0))['train']
  return jnp.asarray(data_lib.to_float(ds.x)), jnp.asarray(ds.y)


def _game(conv_impl: str):
  return dishonest.Game(model=models.FlowerCNN(10, padding='VALID', conv_impl=conv_impl),
                        num_components=_M.value, num_batches=_NUM_BATCHES.value,
                        epochs=_EPOCHS.value, batch_size=32,
                        optimizer=optimizers.make('sgd', 1e-3, momentum=0.9))


def main(argv):
  del argv
  runs = _RUNS.value
  game = _game('auto')
  x, y = _pool(max(2 * game.num_examples, 1024))
  key = jax.random.key(0)
  trials = {impl: dishonest.make_trial(_game(impl)) for impl in ('auto', 'xla', 'im2col')}

  def run_trials(impl, **kw):
    return runner.run_trials(trials[impl], key, runs, args=(x, y), progress=False, **kw)

  def loop(impl):
    single = jax.jit(trials[impl])
    return lambda: [single(jax.random.fold_in(key, i), jnp.int32(i), x, y) for i in range(runs)]

  plan = runner.plan(trials['auto'], key, runs, args=(x, y))
  wide = dict(batch_bytes=1 << 50)
  timed = {}
  with jax.default_matmul_precision('highest'):
    timed['default'] = common.time_median(lambda: run_trials('auto'), repeats=_REPEATS.value)
    for impl in ('xla', 'im2col'):
      timed[f'loop {impl}'] = common.time_median(loop(impl), repeats=_REPEATS.value)
      timed[f'wide {impl}'] = common.time_median(lambda i=impl: run_trials(i, **wide),
                                                 repeats=_REPEATS.value)
    a = run_trials('auto')
    b = loop('xla')()
  # Same runs on both sides: same targets and decisions, Deltas equal up to float rounding.
  same_targets = bool(np.all(a['target'] == np.array([int(r['target']) for r in b])))
  same_decisions = bool(np.all(a['decision'] == np.array([bool(r['decision']) for r in b])))
  delta_b = np.array([float(r['delta']) for r in b])
  max_rel = float(np.max(np.abs(a['delta'] - delta_b) / np.maximum(np.abs(delta_b), 1e-12)))
  names = {
      'default': (f'run_trials, defaults (conv {models.cnn._conv_impl("auto")}, groups of '
                  f'{plan["width"]}, chunk {plan["chunk"]})'),
      'loop xla': 'reference: sequential loop of jitted runs, XLA conv',
      'loop im2col': 'sequential loop of jitted runs, im2col conv',
      'wide xla': 'run_trials, all runs vmapped (wide form), XLA conv',
      'wide im2col': 'run_trials, all runs vmapped (wide form), im2col conv',
  }
  rows = [dict(mode=names[k], runs=runs, seconds=t, runs_per_s=runs / t,
               vs_reference=timed['loop xla'] / t) for k, t in timed.items()]
  print(f'J={game.num_batches} E={game.epochs} B={game.batch_size} M={game.num_components} '
        f'28x28x1 on {jax.default_backend()}; same targets: {same_targets}; same decisions: '
        f'{same_decisions}; max relative Delta difference: {max_rel:.2e}')
  common.report('dishonest_runs', rows, runs / timed['default'], runs / timed['loop xla'],
                common.peak_rss_mb())


if __name__ == '__main__':
  app.run(main)
