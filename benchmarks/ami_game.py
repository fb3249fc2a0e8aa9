"""Benchmark of the AMI game under LDP at CIFAR size, and of crafting.

  python -m benchmarks.ami_game        # about 1-2 minutes on 2 CPU cores

Work: d = 512 features (ResNet-18 embedding size), r = 1,000 first-layer neurons, |D| = 100,
BitRand at epsilon = 5 on the 1 + 5 + 4-bit encoding (512 x 10 = 5,120 bits per row, 512,000
per trial), one crafted target; a trial draws its batch, randomizes it afresh and decides
member iff some row activates the chosen neuron.

Rows:
- jitted fast path (`ami.fast_trial` on the runner), the headline: the experiment's code path
  at the config defaults (`game.chunk_size=None`, `game.batch_bytes=None`: groups of trials
  sized by bytes). One 32-bit word per 5-bit group of a feature, drawn by inverse CDF (each
  output code's probability within 1.5 * 2**-32 of Eq. (23)); the encoding of the pool is computed
  once. Printed beside it: the fraction of the measured limit it reaches (the limit: per
  trial, only the matmul 100 x 512 x 1,000 with ReLU and readout plus the 102,400 random words
  of one trial, in the same cache-sized groups), and each of the two parts timed alone.
- jitted exact path: the same trial with `mechanisms.bitrand.randomize` (one threefry word and
  one comparison per bit), vmapped by the runner.
- sequential numpy reference (the headline's reference): a Python loop, one trial at a time,
  per-bit Bernoulli flips with numpy's PCG64, decode, matmul, decision.
- seed-code equivalent: what the public AMI code's approach costs here: the string-based
  BitRand codec (each feature formatted as a 10-character bit string, flipped character by
  character with one flip pattern shared by the batch's rows, as their `BitRand_1` does, and
  parsed back), then the same numpy decision. Shown for scale; it is not the same law (one
  pattern per batch), so it is not the ratio's reference.
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
_CHUNK = flags.DEFINE_integer('chunk_size', None,
                              'Runner chunk size; None = the config default (sized by bytes).')
_BATCH_BYTES = flags.DEFINE_integer('batch_bytes', None,
                                    'Runner group budget; None = the backend default.')
_SEED_TRIALS = flags.DEFINE_integer('seed_trials', 3, 'Trials of the seed-code equivalent.')
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


def seed_code_equivalent(rng, neuron, target, pool, num_trials: int) -> np.ndarray:
  """The public code's string-based BitRand (one flip pattern per batch), then the decision."""
  q = np.asarray(bitrand.flip_probabilities(EPSILON, D, 10), np.float64)
  w, b, h, c = (np.asarray(a[0]) for a in neuron)
  out = np.zeros(num_trials, bool)
  for i in range(num_trials):
    rows = pool[rng.integers(0, len(pool), BATCH)]
    if i % 2:
      rows[0] = target[0]
    pattern = rng.random(D * 10) < np.tile(q, D)  # one 1 x (r*l) row for the whole batch
    noisy = np.empty_like(rows)
    for j, row in enumerate(rows):
      code = ''.join(('1' if v < 0 else '0') + format(min(int(round(abs(v) * 16)), 511), '09b')
                     for v in row)
      flipped = ''.join(('1' if ch == '0' else '0') if f else ch
                        for ch, f in zip(code, pattern))
      noisy[j] = [(-1.0 if flipped[k] == '1' else 1.0) * int(flipped[k + 1:k + 10], 2) / 16
                  for k in range(0, D * 10, 10)]
    v = np.maximum(noisy @ w + b, 0.0) @ h + c
    out[i] = np.any(v > 0)
  return out


def limit_rate(neuron, width: int, num_trials: int, part: str = 'both') -> float:
  """Trials/s of the physical floor: a trial's random words and its matmul, nothing else.

  `part` = 'matmul' or 'words' times one of the two alone (the same groups). Together they
  can run a little faster than 1 / (1 / matmul + 1 / words) (the two overlap), so the parts
  say which one dominates, not a bound.
  """
  words_per_trial = BATCH * D * len(ami.Encoding().group_sizes())
  w, b, h, c = (a[0] for a in neuron)

  def one(k):
    if part == 'matmul':  # inputs from the key without drawing words: a cheap fill
      x = jnp.full((BATCH, D), jax.random.key_data(k)[-1] & 31).astype(jnp.float32)
    else:
      u = jax.random.bits(k, (words_per_trial,), jnp.uint32)
      if part == 'words':
        return jnp.max(u)
      x = (u[:BATCH * D] >> 23).astype(jnp.float32).reshape(BATCH, D)
      x = x + (u[BATCH * D:] >> 31).astype(jnp.float32).reshape(BATCH, D)
    return jnp.max(jnp.maximum(x @ w + b, 0.0) @ h + c)

  groups = max(1, num_trials // width)
  keys = jax.random.split(jax.random.key(7), groups * width).reshape(groups, width)
  fn = jax.jit(lambda ks: jax.lax.map(jax.vmap(one), ks))
  seconds = common.time_median(lambda: fn(keys), warmup=1, repeats=3)
  return groups * width / seconds


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
  opts = dict(chunk_size=_CHUNK.value, batch_bytes=_BATCH_BYTES.value)
  run_fast = lambda: runner.run_trials(fast_fn, key, n, **opts, args=fast_args, progress=False)
  fast_s = common.time_median(run_fast, warmup=1, repeats=3)
  plan = runner.plan(fast_fn, key, n, args=fast_args, **opts)
  exact_args = (neuron, jnp.asarray(target), jnp.asarray(pool))
  n_exact = max(n // 4, 64)
  run_exact = lambda: runner.run_trials(exact_trial, key, n_exact, **opts, args=exact_args,
                                        progress=False)
  exact_s = common.time_median(run_exact, warmup=1, repeats=1)
  rng = np.random.default_rng(0)
  ref = []
  ref_s = common.time_median(
      lambda: ref.append(numpy_reference(rng, neuron, target, pool, _REF_TRIALS.value)),
      warmup=0, repeats=1)
  seed_s = common.time_median(
      lambda: seed_code_equivalent(np.random.default_rng(1), neuron, target, pool,
                                   _SEED_TRIALS.value), warmup=0, repeats=1)
  limit = limit_rate(neuron, plan['width'], min(n, 512))
  parts = {p: limit_rate(neuron, plan['width'], min(n, 512), p) for p in ('matmul', 'words')}
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
      {'path': (f'jitted fast (code sampler), config defaults: groups of {plan["width"]}, '
                f'chunk {plan["chunk"]}'), 'trials': n, 'trials_per_s': n / fast_s,
       'member_rate': fast_rate},
      {'path': 'measured limit (random words + matmul only)', 'trials': min(n, 512),
       'trials_per_s': limit, 'member_rate': float('nan')},
      {'path': '  its matmul alone (100 x 512 x 1,000, ReLU, readout)', 'trials': min(n, 512),
       'trials_per_s': parts['matmul'], 'member_rate': float('nan')},
      {'path': '  its random words alone (102,400 threefry words)', 'trials': min(n, 512),
       'trials_per_s': parts['words'], 'member_rate': float('nan')},
      {'path': 'jitted exact (bitrand per bit)', 'trials': n_exact,
       'trials_per_s': n_exact / exact_s, 'member_rate': exact_rate},
      {'path': 'numpy sequential reference (per-bit BitRand, PCG64)',
       'trials': _REF_TRIALS.value, 'trials_per_s': _REF_TRIALS.value / ref_s,
       'member_rate': float(np.mean(ref[0]))},
      {'path': 'seed-code equivalent (string BitRand, shared pattern)',
       'trials': _SEED_TRIALS.value, 'trials_per_s': _SEED_TRIALS.value / seed_s,
       'member_rate': float('nan')},
      {'path': f'crafting {targets} targets x {copies + negatives} rows', 'trials':
       _CRAFT_STEPS.value, 'trials_per_s': _CRAFT_STEPS.value / craft_s,
       'member_rate': float('nan')},
  ]
  print(f'sampler: TV per trial <= {channel.tv_per_feature * D * BATCH:.2e} '
        '(code probabilities within 1.5 * 2**-32 of Eq. (23)); crafting row: Adam steps/s')
  print(f'headline {n / fast_s:,.0f} trials/s = {(n / fast_s) / limit:.0%} of the measured '
        f'limit ({limit:,.0f}/s), {(n / fast_s) / (_REF_TRIALS.value / ref_s):.1f}x the numpy '
        f'reference, {(n / fast_s) / (_SEED_TRIALS.value / seed_s):,.0f}x the seed-code '
        'equivalent')
  common.report('ami_game', rows, n / fast_s, _REF_TRIALS.value / ref_s, common.peak_rss_mb())


if __name__ == '__main__':
  app.run(main)
