"""Benchmark of the LDP audit game at the paper's CNN gradient size.

  python -m benchmarks.ldp_audit            # ~2 minutes on 2 CPU cores

Work: white-box trials of the gradient-flip crafter on LDP-SGD (Algorithm 4 of
the LDP-audit paper): secret bit, Algorithm 1 on a d = 13,722 gradient (the
paper's Table 2 CNN on 28x28x1 inputs, our `models.AuditCNN`), cosine guess.

Headline (the config default, `ldp_audit.white_box_path='projected'`, default
chunking): the exact subspace shortcut of that game, checked to reach the same
accuracy as the literal path. Also timed: one 10^6-trial white-box point end to
end (compilation included), the literal path (Algorithm 1 on the full gradient)
with the runner's default byte-sized groups and at an explicit chunk of 1,000,
and black-box trials (server update of Algorithm 2 and the CNN's loss on x1
before and after, Eq. 4), which have no reference.

Reference: the same white-box game as a sequential numpy loop (PCG64 draws, one
trial at a time, full d-dimensional Algorithm 1). Every path must reach the same
accuracy within sampling error.

Memory: one fresh subprocess per chunk size (100, 1,000, 10,000) runs
`--memory_trials` trials; one more runs 5x as many trials at chunk 1,000, to
show that the peak follows the chunk, not the number of trials. Peaks include
JAX's import and XLA compilation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags
import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from fl_privacy import models
from fl_privacy.attacks.audit import crafters
from fl_privacy.attacks.audit import game
from fl_privacy.eval import runner
from fl_privacy.fl import losses
from fl_privacy.mechanisms import ldp_sgd

_NUM_TRIALS = flags.DEFINE_integer('num_trials', 20_000, 'Timed trials.')
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', None,
                                   'Chunk of the timed runs; None = the runner default '
                                   '(sized by bytes), as the experiment runs.')
_POINT_TRIALS = flags.DEFINE_integer('point_trials', 1_000_000,
                                     'Trials of the end-to-end white-box point.')
_REFERENCE_TRIALS = flags.DEFINE_integer('reference_trials', 2000,
                                         'Trials of the numpy reference.')
_BLACK_BOX_TRIALS = flags.DEFINE_integer('black_box_trials', 5000,
                                         'Timed black-box trials.')
_MEMORY_TRIALS = flags.DEFINE_integer('memory_trials', 20_000,
                                      'Trials per memory subprocess.')
_MEMORY_CHUNKS = flags.DEFINE_list('memory_chunks', ['100', '1000', '10000'],
                                   'Chunk sizes of the memory table.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed repetitions (median).')
_CHILD = flags.DEFINE_bool('child', False, 'Internal: one memory measurement.')

EPSILON, CLIP = 2.0, 1.0
WHITE = game.ldp_sgd_trial_fn('white_box')


def make_problem(seed: int = 0) -> dict:
  """The paper's CNN on a random 28x28x1 image: crafted flip pair and model."""
  model = models.AuditCNN(num_classes=10)
  x = jax.random.uniform(jax.random.key(seed), (1, 28, 28, 1))
  variables = model.init(jax.random.key(seed + 1), x)
  loss_fn = losses.make_loss_fn(model.apply)
  c = crafters.gradient_flip(loss_fn, variables, x[0], 3)
  _, unravel = flatten_util.ravel_pytree(variables)

  def per_example(p, xs, ys):
    return losses.per_example_cross_entropy(model.apply(p, xs), ys)

  radius = float(jnp.linalg.norm(c.params))
  lr = float(ldp_sgd.paper_learning_rate(radius, 1, c.g1.size, EPSILON, CLIP))
  args = (jnp.stack([c.g1, c.g2]), c.params, c.x, c.y, jnp.float32(EPSILON),
          jnp.float32(CLIP), jnp.float32(lr), jnp.float32(radius))
  black = game.ldp_sgd_trial_fn('black_box', 'loss_decrease', per_example,
                                unravel)
  return {'args': args, 'black': black, 'dim': int(c.g1.size)}


def reference_run(g_pair: np.ndarray, n: int, rng: np.random.Generator):
  """The white-box game as a plain numpy loop; returns (b, guess) arrays."""
  dim = g_pair.shape[1]
  p_keep = 1.0 / (1.0 + np.exp(-EPSILON))
  units = g_pair / np.linalg.norm(g_pair, axis=1, keepdims=True)
  bs, guesses = np.empty(n, np.int32), np.empty(n, np.int32)
  # Dot products as multiply-and-sum: BLAS ddot spawns threads that, on a
  # shared 2-core machine, made this loop 100x slower than single-threaded.
  dot = lambda a, c: float(np.sum(a * c))
  for i in range(n):
    b = rng.integers(2)
    g = g_pair[b]
    norm = min(np.sqrt(dot(g, g)), CLIP)
    pole = 1.0 if rng.random() < 0.5 + norm / (2 * CLIP) else -1.0
    v = rng.standard_normal(dim)
    v /= np.sqrt(dot(v, v))
    side = pole * (1.0 if dot(units[b], v) >= 0 else -1.0)
    report = v * (side if rng.random() < p_keep else -side)
    bs[i] = b
    guesses[i] = 0 if dot(report, units[0]) >= dot(report, units[1]) else 1
  return bs, guesses


def _child(num_trials: int, chunk_size: int | None) -> None:
  args = make_problem()['args']
  out = runner.run_trials(WHITE, jax.random.key(0), num_trials,
                          chunk_size=chunk_size, args=args, progress=False)
  assert out['b'].shape == (num_trials,)
  print(json.dumps({'chunk_size': chunk_size, 'num_trials': num_trials,
                    'peak_rss_mb': common.peak_rss_mb()}))


def _memory(chunk: int, trials: int) -> dict:
  proc = subprocess.run(
      [sys.executable, '-m', 'benchmarks.ldp_audit', '--child',
       f'--chunk_size={chunk}', f'--memory_trials={trials}'],
      capture_output=True, text=True, check=True,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _accuracy(b, guess) -> float:
  return float(np.mean(np.asarray(b) == np.asarray(guess)))


def main(argv) -> None:
  del argv
  if _CHILD.value:
    _child(_MEMORY_TRIALS.value, _CHUNK_SIZE.value)
    return
  n, chunk = _NUM_TRIALS.value, _CHUNK_SIZE.value
  problem = make_problem()
  args = problem['args']
  key = jax.random.key(0)
  run = lambda: runner.run_trials(WHITE, key, n, chunk_size=chunk, args=args,
                                  progress=False)
  seconds = common.time_median(run, warmup=1, repeats=_REPEATS.value)
  out = run()
  plan = runner.plan(WHITE, key, n, chunk_size=chunk, args=args)
  run_1000 = lambda: runner.run_trials(WHITE, key, n, chunk_size=1000, args=args,
                                       progress=False)
  seconds_1000 = common.time_median(run_1000, warmup=1, repeats=1)

  n_ref = _REFERENCE_TRIALS.value
  g_pair = np.asarray(args[0], np.float64)
  ref_seconds = common.time_median(
      lambda: reference_run(g_pair, n_ref, np.random.default_rng(0)),
      warmup=0, repeats=1)
  ref = reference_run(g_pair, n_ref, np.random.default_rng(1))
  acc, acc_ref = _accuracy(out['b'], out['guess']), _accuracy(*ref)
  se = np.sqrt(acc * (1 - acc) * (1 / n + 1 / n_ref))
  assert abs(acc - acc_ref) < 4.5 * se + 1e-9, (acc, acc_ref)

  nb = _BLACK_BOX_TRIALS.value
  black = lambda: runner.run_trials(problem['black'], key, nb,
                                    chunk_size=chunk, args=args,
                                    progress=False)
  black_seconds = common.time_median(black, warmup=1, repeats=1)

  # The exact subspace shortcut of the same white-box game (O(1) per trial).
  projected = game.ldp_sgd_projected_white_box_trial_fn()
  coef = game.subspace_coefficients(np.asarray(args[0]))
  p_args = (jnp.asarray(coef), args[4], args[5], jnp.float32(problem['dim']))
  n_proj = 10 * n
  # The 10^6-trial point as the experiment runs it, from a cold program (compile included).
  n_point = _POINT_TRIALS.value
  t0 = time.perf_counter()
  point = game.run_point(projected, jax.random.key(1), n_point, chunk_size=chunk,
                         args=p_args, claimed_epsilon=EPSILON, progress=False)
  point_seconds = time.perf_counter() - t0
  fast = lambda: runner.run_trials(projected, key, n_proj, chunk_size=chunk, args=p_args,
                                   progress=False)
  fast_seconds = common.time_median(fast, warmup=1, repeats=_REPEATS.value)
  fast_out = fast()
  acc_fast = _accuracy(fast_out['b'], fast_out['guess'])
  se_fast = np.sqrt(acc * (1 - acc) * (1 / n + 1 / n_proj))
  assert abs(acc - acc_fast) < 4.5 * se_fast + 1e-9, (acc, acc_fast)

  peak = common.peak_rss_mb()
  auto = 'default chunks' if chunk is None else f'chunk {chunk}'
  table = [
      {'path': f'white-box projected, {auto} (headline: config default)',
       'trials': n_proj, 'trials_per_s': n_proj / fast_seconds, 'acc': acc_fast,
       'peak_rss_mb': peak},
      {'path': 'white-box numpy sequential reference (literal, full d)',
       'trials': n_ref, 'trials_per_s': n_ref / ref_seconds, 'acc': acc_ref,
       'peak_rss_mb': peak},
      {'path': f'white-box point of {n_point:,} trials, projected, wall s incl. compile',
       'trials': n_point, 'trials_per_s': n_point / point_seconds,
       'acc': point['acc'], 'peak_rss_mb': peak},
      {'path': (f'white-box literal, {auto} (groups of {plan["width"]}, '
                f'chunk {plan["chunk"]}, d {problem["dim"]})'),
       'trials': n, 'trials_per_s': n / seconds, 'acc': acc,
       'peak_rss_mb': peak},
      {'path': 'white-box literal, explicit chunk 1,000', 'trials': n,
       'trials_per_s': n / seconds_1000, 'acc': acc, 'peak_rss_mb': peak},
      {'path': f'black-box Eq. 4 run_trials ({auto})', 'trials': nb,
       'trials_per_s': nb / black_seconds, 'acc': float('nan'),
       'peak_rss_mb': peak},
  ]
  mem_trials = _MEMORY_TRIALS.value
  runs = [(int(c), mem_trials) for c in _MEMORY_CHUNKS.value]
  runs.append((1000, 5 * mem_trials))
  for c, t in runs:
    r = _memory(c, t)
    table.append({'path': f'white-box chunk {c} (own process)', 'trials': t,
                  'trials_per_s': float('nan'), 'acc': float('nan'),
                  'peak_rss_mb': r['peak_rss_mb']})
  print(f'1e6-trial white-box point: {point_seconds:.2f} s (target < 20 s); literal path '
        f'{n / seconds:,.0f} trials/s = {(n / seconds) / (n_ref / ref_seconds):.2f}x the '
        'numpy loop')
  common.report('ldp_audit', table, n_proj / fast_seconds, n_ref / ref_seconds, peak)


if __name__ == '__main__':
  app.run(main)
