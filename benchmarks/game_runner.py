"""Benchmark of the game runner: jit + vmap chunks vs a sequential numpy loop.

  python -m benchmarks.game_runner            # < 1 minute on 2 CPU cores

Toy trial: the gradient of a 512-1000-1 ReLU MLP (squared-error loss) on a batch of
32 x 512 rows drawn from a fixed pool with the trial's key; the outcome is the
gradient's global L2 norm (returning whole gradients would make the benchmark
measure host copies of 2 GB, not the runner). 1,024 trials.

Reference: a Python loop over the same trials, one at a time, with hand-written
numpy gradients on the same batches (indices drawn beforehand, untimed), timed on
the first `--reference_trials` trials. Both paths are checked to give the same
norms. Peak memory vs chunk size is measured
in a fresh subprocess per chunk size, so each peak is that run's own (it includes
JAX's import and XLA compilation, a few hundred MB on CPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from fl_privacy.eval import runner

_NUM_TRIALS = flags.DEFINE_integer('num_trials', 1024, 'Trials per run.')
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', None,
                                   'Chunk size of the headline measurement; None = the '
                                   'runner default (groups sized by bytes), as experiments run.')
_MEMORY_CHUNKS = flags.DEFINE_list(
    'memory_chunks', ['1', '4', '128', '1024'],
    'Chunk sizes of the peak-memory table (one subprocess each).')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed repetitions (median).')
_REFERENCE_TRIALS = flags.DEFINE_integer(
    'reference_trials', 256, 'Trials timed for the sequential reference (its '
    'cost per trial is constant, so fewer keep the benchmark short).')
_CHILD = flags.DEFINE_bool('child', False,
                           'Internal: measure one chunk size and print JSON.')

IN_DIM, HIDDEN, BATCH, POOL = 512, 1000, 32, 4096


def make_problem(seed: int = 0):
  """Params (shared by all trials) and the data pool, as numpy float32."""
  rng = np.random.default_rng(seed)
  params = {
      'w1': (rng.normal(size=(IN_DIM, HIDDEN)) / np.sqrt(IN_DIM)).astype(
          np.float32),
      'b1': np.zeros(HIDDEN, np.float32),
      'w2': (rng.normal(size=(HIDDEN, 1)) / np.sqrt(HIDDEN)).astype(np.float32),
      'b2': np.zeros(1, np.float32),
  }
  x = rng.normal(size=(POOL, IN_DIM)).astype(np.float32)
  y = rng.normal(size=(POOL, 1)).astype(np.float32)
  return params, x, y


def _loss(params, x, y):
  h = jax.nn.relu(x @ params['w1'] + params['b1'])
  out = h @ params['w2'] + params['b2']
  return 0.5 * jnp.mean(jnp.sum((out - y) ** 2, axis=-1))


def batch_indices(key):
  return jax.random.randint(key, (BATCH,), 0, POOL)


def grad_norm_trial(key, index, params, x, y):
  """One trial: the L2 norm of the MLP gradient on a batch drawn with `key`."""
  del index
  rows = batch_indices(key)
  grads = jax.grad(_loss)(params, x[rows], y[rows])
  return jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(grads)))


def numpy_grad_norm(params, x, y) -> float:
  """The same gradient norm by hand-written numpy backpropagation."""
  pre = x @ params['w1'] + params['b1']
  h = np.maximum(pre, 0)
  out = h @ params['w2'] + params['b2']
  dout = (out - y) / x.shape[0]
  g_w2 = h.T @ dout
  g_b2 = dout.sum(axis=0)
  dh = (dout @ params['w2'].T) * (pre > 0)
  g_w1 = x.T @ dh
  g_b1 = dh.sum(axis=0)
  return float(np.sqrt(sum(np.vdot(g, g) for g in (g_w1, g_b1, g_w2, g_b2))))


def reference_run(params, x, y, rows: np.ndarray) -> np.ndarray:
  """The sequential reference: one trial at a time, a Python loop."""
  return np.array([numpy_grad_norm(params, x[r], y[r]) for r in rows])


def _child(num_trials: int, chunk_size: int) -> None:
  params, x, y = make_problem()
  key = jax.random.key(0)
  run = lambda: runner.run_trials(grad_norm_trial, key, num_trials,
                                  chunk_size=chunk_size, args=(params, x, y),
                                  progress=False)
  seconds = common.time_median(run, warmup=1, repeats=1)
  print(json.dumps({'chunk_size': chunk_size,
                    'trials_per_s': num_trials / seconds,
                    'peak_rss_mb': common.peak_rss_mb()}))


def memory_vs_chunk(num_trials: int, chunks) -> list[dict]:
  rows = []
  for c in chunks:
    proc = subprocess.run(
        [sys.executable, '-m', 'benchmarks.game_runner', '--child',
         f'--chunk_size={c}', f'--num_trials={num_trials}'],
        capture_output=True, text=True, check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
  return rows


def main(argv) -> None:
  del argv
  n, chunk = _NUM_TRIALS.value, _CHUNK_SIZE.value
  if _CHILD.value:
    _child(n, chunk)
    return
  params, x, y = make_problem()
  key = jax.random.key(0)
  run = lambda: runner.run_trials(grad_norm_trial, key, n, chunk_size=chunk,
                                  args=(params, x, y), progress=False)
  seconds = common.time_median(run, warmup=1, repeats=_REPEATS.value)
  norms = run()

  n_ref = min(n, _REFERENCE_TRIALS.value)
  rows_idx = np.asarray(jax.vmap(lambda i: batch_indices(
      jax.random.fold_in(key, i)))(jnp.arange(n_ref)))
  ref_seconds = common.time_median(
      lambda: reference_run(params, x, y, rows_idx), warmup=1,
      repeats=_REPEATS.value)
  ref_norms = reference_run(params, x, y, rows_idx)
  np.testing.assert_allclose(norms[:n_ref], ref_norms, rtol=1e-3)

  peak = common.peak_rss_mb()
  plan = runner.plan(grad_norm_trial, key, n, chunk_size=chunk, args=(params, x, y))
  table = [{'path': (f'run_trials (chunk {plan["chunk"]}, groups of {plan["width"]}'
                     f'{", default" if chunk is None else ""})'),
            'trials_per_s': n / seconds, 'peak_rss_mb': peak},
           {'path': f'numpy sequential reference ({n_ref} trials)',
            'trials_per_s': n_ref / ref_seconds, 'peak_rss_mb': peak}]
  for r in memory_vs_chunk(n, [int(c) for c in _MEMORY_CHUNKS.value]):
    table.append({'path': f'run_trials chunk {r["chunk_size"]} (own process)',
                  'trials_per_s': r['trials_per_s'],
                  'peak_rss_mb': r['peak_rss_mb']})
  common.report('game_runner', table, n / seconds, n_ref / ref_seconds, peak)


if __name__ == '__main__':
  app.run(main)
