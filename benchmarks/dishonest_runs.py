"""Throughput of the dishonest-server game: vmapped runs vs a sequential loop over runs.

Both sides do the same work: the same runs (keys, client data, targets, trunks), each a crafted
Flower CNN, one FedAvg round of real local training (J = 16 minibatches of B = 32, E = 1,
SGD with momentum) and the server's simulated step, on 28x28x1 inputs (MNIST-sized synthetic
images, so it runs offline). The vmapped side is `eval.runner.run_trials` with all runs in one
chunk; the reference is a Python loop over the same runs, each one call of the jitted single-run
function. Compilation is excluded (warm-up call) on both sides. Extra rows time `run_trials`
with smaller chunks (`--chunks`), the knob that matters on CPU: vmapping runs that each own
their convolution kernels turns every convolution into a grouped one, which XLA's CPU backend
runs slower than the same convolutions one run at a time.

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
_CHUNKS = flags.DEFINE_list('chunks', ['4'], 'Extra rows: run_trials with these chunk sizes.')


def _pool(num_examples: int):
  ds = data_lib.load(dict(name='synthetic', num_examples=num_examples, num_classes=10,
                          shape=(28, 28, 1), seed=0))['train']
  return jnp.asarray(data_lib.to_float(ds.x)), jnp.asarray(ds.y)


def main(argv):
  del argv
  runs = _RUNS.value
  game = dishonest.Game(model=models.FlowerCNN(10, padding='VALID'), num_components=_M.value,
                        num_batches=_NUM_BATCHES.value, epochs=_EPOCHS.value, batch_size=32,
                        optimizer=optimizers.make('sgd', 1e-3, momentum=0.9))
  x, y = _pool(max(2 * game.num_examples, 1024))
  key = jax.random.key(0)
  trial = dishonest.make_trial(game)

  def vmapped(chunk=runs):
    return runner.run_trials(trial, key, runs, chunk_size=chunk, args=(x, y), progress=False)

  single = jax.jit(trial)

  def sequential():
    return [single(jax.random.fold_in(key, i), jnp.int32(i), x, y) for i in range(runs)]

  with jax.default_matmul_precision('highest'):
    t_vmap = common.time_median(vmapped, repeats=_REPEATS.value)
    t_seq = common.time_median(sequential, repeats=_REPEATS.value)
    t_chunks = {int(c): common.time_median(lambda c=int(c): vmapped(c), repeats=_REPEATS.value)
                for c in _CHUNKS.value}
    a, b = vmapped(), sequential()
  # Same runs on both sides: same targets and decisions, Deltas equal up to float rounding.
  same_targets = bool(np.all(a['target'] == np.array([int(r['target']) for r in b])))
  delta_b = np.array([float(r['delta']) for r in b])
  max_rel = float(np.max(np.abs(a['delta'] - delta_b) / np.maximum(np.abs(delta_b), 1e-12)))
  rows = [
      dict(mode='vmap (run_trials, one chunk)', runs=runs, seconds=t_vmap,
           runs_per_s=runs / t_vmap),
      dict(mode='sequential loop of jitted runs', runs=runs, seconds=t_seq,
           runs_per_s=runs / t_seq),
  ] + [dict(mode=f'run_trials, chunks of {c}', runs=runs, seconds=t, runs_per_s=runs / t)
       for c, t in t_chunks.items()]
  print(f'J={game.num_batches} E={game.epochs} B={game.batch_size} M={game.num_components} '
        f'28x28x1; same targets: {same_targets}; max relative Delta difference: {max_rel:.2e}')
  common.report('dishonest_runs', rows, runs / t_vmap, runs / t_seq, common.peak_rss_mb())


if __name__ == '__main__':
  app.run(main)
