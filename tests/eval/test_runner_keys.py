"""The runner's per-trial keys over a long run: all distinct, and the documented fold_in.

A runner that reused keys (e.g. folding in the index within a chunk, or wrapping the index)
would still give plausible rates; only the keys themselves show it.
"""

from __future__ import annotations

import jax
import numpy as np

from fl_privacy.eval import runner


def _key_words(key, index):
  del index
  return jax.random.bits(key, (2,), np.uint32)



def test_keys_never_repeat_over_a_long_run_and_are_fold_in_of_the_global_index():
  run_key = jax.random.key(11)
  n, chunk, start = 70_000, 4096, 3
  words = runner.run_trials(_key_words, run_key, n, chunk_size=chunk, start=start,
                            progress=False)
  assert words.shape == (n - start, 2)
  # 64 random bits per trial: a collision among 7e4 honest keys has probability ~1e-10.
  as64 = words[:, 0].astype(np.uint64) << np.uint64(32) | words[:, 1].astype(np.uint64)
  assert len(np.unique(as64)) == n - start
  # Trial i's key is fold_in(run_key, i) for the global index i (first, chunk edges, last).
  for i in (start, chunk - 1, chunk, chunk + start, 2 * chunk + 1, n - 1):
    want = jax.random.bits(jax.random.fold_in(run_key, i), (2,), np.uint32)
    np.testing.assert_array_equal(words[i - start], np.asarray(want))
