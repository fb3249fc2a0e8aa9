"""Benchmark of the AMI game under LDP at CIFAR size, and of crafting.

  python -m benchmarks.ami_game        # about 1-2 minutes on 2 CPU cores

Work: d = 512 features (ResNet-18 embedding size), r = 1,000 first-layer neurons, |D| = 100,
BitRand at epsilon = 5 on the 1 + 5 + 4-bit encoding (512 x 10 = 5,120 bits per row, 512,000
per trial), one crafted target; a trial draws its batch, randomizes it afresh and decides
member iff some row activates the chosen neuron.

Rows:
- jitted fast path (`ami.fast_trial` on the runner): one 32-bit word per 5-bit group of a
  feature, drawn by inverse CDF (each output code's probability within 2**-32 of Eq. (23));
  the encoding of the pool is computed once.
- jitted exact path: the same trial with `mechanisms.bitrand.randomize` (one threefry word and
  one comparison per bit), vmapped by the runner.
- sequential numpy reference (the headline's reference): a Python loop, one trial at a time,
  per-bit Bernoulli flips with numpy's PCG64, decode, matmul, decision.
Crafting: Adam steps per second of `ami.craft_many` on 4 targets x (500 randomized copies +
1,000 negatives), full batch, the step budget forced (no early stop).
"""

from __future__ import annotations

import functools

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from fl_privacy.attacks import ami
from fl_privacy.eval import runner
from fl_privacy.mechanisms import bitrand
from fl_privacy.mechanisms import fixed_point

_TRIALS = flags.DEFINE_integer('num_trials', 2048, 'Trials of the jitted paths.')
_CHUNK = flags.DEFINE_integer('chunk_size', 64, 'Runner chunk size.')
_REF_TRIALS = flags.DEFINE_integer('reference_trials', 64, 'Trials of the numpy reference.')
_CRAFT_STEPS = flags.DEFINE_integer('craft_steps', 20, 'Crafting steps timed.')

D, R, BATCH, POOL, EPSILON = 512, 1000, 100, 4096, 5.0


def make_problem(seed: int = 0):
  """A random crafted block, a target and a pool of non-negative embedding-like features."""
  rng = np.random.default_rng(seed)
  x = np.minimum(rng.exponential(1.0, size=(POOL + 1, D)), 31.0).astype(np.float32)
  neuron = ami.init_neuron(jax.random.key(seed), D, R)
  # Bias at the 99.5% quantile of randomized rows: a batch fires sometimes, not always, so
  # the paths' member rates are a meaningful check that they draw the same law.
  noisy = bitrand.randomize(jax.random.key(seed + 1), jnp.asarray(x[:2000]), EPSILON)
  v = np.asarray(ami.chosen_value(neuron, noisy))
  neuron = neuron._replace(c=jnp.float32(-np.quantile(v, 0.995)))
  stack = jax.tree.map(lambda a: a[None], neuron)
  return stack, x[:1], x[1:]


def numpy_reference(rng, neuron, target, pool, num_trials: int) -> np.ndarray:
  """Sequential reference: one trial at a time in numpy (exact per-bit flips)."""
  q = np.asarray(bitrand.flip_probabilities(EPSILON, D, 10), np.float64)
  weights = np.asarray(fixed_point.bit_weights(5, 4, True), np.float32)
  pool_bits = np.asarray(fixed_point.encode(jnp.asarray(pool))[0])
  target_bits = np.asarray(fixed_point.encode(jnp.asarray(target))[0])[0]
  w, b, h, c = (np.asarray(a[0]) for a in neuron)
  out = np.zeros(num_trials, bool)
  for i in range(num_trials):
    bits = pool_bits[rng.integers(0, len(pool_bits), BATCH)]
    if i % 2:
      bits[0] = target_bits
    noisy = bits ^ (rng.random(bits.shape) < q)
    x = (noisy @ weights) * (1.0 - 2.0 * noisy[..., 0])
    v = np.maximum(x @ w + b, 0.0) @ h + c
    out[i] = np.any(v > 0)
  return out


def exact_trial(key, index, neuron, target, pool):
  """The fast trial with the exact per-bit mechanism instead of the code sampler."""
  return ami.fast_trial(key, index, neuron, ami.GameSide(x=target), ami.GameSide(x=pool), (),
                        batch_size=BATCH,
                        mechanism=lambda k, x: bitrand.randomize(k, x, EPSILON))


def main(_):
  neuron, target, pool = make_problem()
  enc = ami.Encoding()
  sizes = enc.group_sizes()
  channel = ami.channel_from_bit_probs(ami.bit_probabilities('bitrand', EPSILON, D, enc), sizes)
  codes = lambda x: ami.pack_codes(fixed_point.encode(jnp.asarray(x))[0], sizes)
  fast_args = (neuron, ami.GameSide(codes=codes(target)), ami.GameSide(codes=codes(pool)),
               tuple(jnp.asarray(t) for t in channel.thresholds))
  fast_fn = functools.partial(ami.fast_trial, batch_size=BATCH, xor=channel.xor, encoding=enc)
  key = jax.random.key(0)
  n = _TRIALS.value
  run_fast = lambda: runner.run_trials(fast_fn, key, n, chunk_size=_CHUNK.value,
                                       args=fast_args, progress=False)
  fast_s = common.time_median(run_fast, warmup=1, repeats=3)
  exact_args = (neuron, jnp.asarray(target), jnp.asarray(pool))
  n_exact = max(n // 4, _CHUNK.value)
  run_exact = lambda: runner.run_trials(exact_trial, key, n_exact, chunk_size=_CHUNK.value,
                                        args=exact_args, progress=False)
  exact_s = common.time_median(run_exact, warmup=1, repeats=1)
  rng = np.random.default_rng(0)
  ref = []
  ref_s = common.time_median(
      lambda: ref.append(numpy_reference(rng, neuron, target, pool, _REF_TRIALS.value)),
      warmup=0, repeats=1)
  # Both LDP paths draw the same law: their member-decision rates agree within noise.
  fast_rate = float(np.mean(run_fast()['decision']))
  exact_rate = float(np.mean(run_exact()['decision']))

  # Crafting at CIFAR size.
  targets, copies, negatives = 4, 500, 1000
  pos = jnp.asarray(np.broadcast_to(pool[:targets, None, :], (targets, copies, D)))
  neg = jnp.asarray(np.broadcast_to(pool[targets:targets + negatives], (targets, negatives, D)))
  craft = lambda: ami.craft_many(jax.random.split(key, targets), pos, neg, num_neurons=R,
                                 learning_rate=1e-3, max_steps=_CRAFT_STEPS.value,
                                 stop_when_separated=False)[0]
  craft_s = common.time_median(craft, warmup=1, repeats=1)

  rows = [
      {'path': 'jitted fast (code sampler)', 'trials': n, 'trials_per_s': n / fast_s,
       'member_rate': fast_rate},
      {'path': 'jitted exact (bitrand per bit)', 'trials': n_exact,
       'trials_per_s': n_exact / exact_s, 'member_rate': exact_rate},
      {'path': 'numpy sequential reference', 'trials': _REF_TRIALS.value,
       'trials_per_s': _REF_TRIALS.value / ref_s, 'member_rate': float(np.mean(ref[0]))},
      {'path': f'crafting {targets} targets x {copies + negatives} rows', 'trials':
       _CRAFT_STEPS.value, 'trials_per_s': _CRAFT_STEPS.value / craft_s,
       'member_rate': float('nan')},
  ]
  print(f'sampler: TV per trial <= {channel.tv_per_feature * D * BATCH:.2e} '
        '(code probabilities within 2**-32 of Eq. (23)); crafting row: Adam steps/s')
  common.report('ami_game', rows, n / fast_s, _REF_TRIALS.value / ref_s, common.peak_rss_mb())


if __name__ == '__main__':
  app.run(main)
