"""Record-level canaries, drawn from a seed (numpy only: the analysis redraws them too).

Two kinds, each canary IN the audited node's data by its own fair coin (Steinke, Nasr,
Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023, arXiv:2305.08846:
inclusion with probability 1/2, independently):

- gradient canaries: an example whose per-example gradient, as Opacus's `GradSampleModule`
  computes it, is replaced (before Opacus clips and noises it) by `canary-norm` x C along a
  random unit direction v_k supported on `pool` (the flat coordinates of the largest weight
  tensor), drawn for canary k alone. Random directions in thousands of dimensions are nearly
  orthogonal (|<v_j, v_k>| ~ 1 / sqrt(pool)), and a real example's gradient projects on
  them thinly and evenly, where a Dirac coordinate would catch the real examples' gradient
  spikes (measured: 6 of 256 OUT canaries scored like IN ones with Dirac coordinates at low
  noise). Andrew et al. ("One-shot Empirical Privacy Estimation for Federated Learning",
  ICLR 2024, arXiv:2302.03098) use random directions for the same reason. `null`
  directions: drawn the same way and never inserted (what a direction shows without a
  canary).
- input-space canaries: out-of-distribution examples (uniform random pixels) with random
  labels, ordinary examples otherwise: Opacus computes, clips and noises their gradients like
  any other's (Jagielski et al., "Auditing Differentially Private Machine Learning: How
  Private is Private SGD?", NeurIPS 2020, arXiv:2006.07709, for input-space canaries).

Every draw comes from `numpy.random.SeedSequence([seed, stream])`, one stream per kind.
"""

from __future__ import annotations

import numpy as np

GRAD, DIRECTIONS, INPUT = 1, 2, 3  # the SeedSequence streams


def _rng(seed: int, stream: int) -> np.random.Generator:
  return np.random.default_rng(np.random.SeedSequence([int(seed), int(stream)]))


def draw(seed: int, num_grad: int, num_input: int, pool: tuple[int, int],
         image_shape: tuple[int, ...], num_classes: int, num_null: int | None = None
         ) -> dict[str, np.ndarray]:
  """The canaries of one audited node.

  Args:
    seed: the canary seed.
    num_grad, num_input: gradient and input-space canaries (each >= 0).
    pool: [lo, hi) flat parameter coordinates the directions are supported on.
    image_shape: one example's shape (C, H, W).
    num_classes: labels are drawn from 0..num_classes - 1.
    num_null: directions scored without a canary (default num_grad // 4, at least 16 when
      there are gradient canaries).

  Returns:
    `grad_coins` [num_grad] bool, `pool` [2] int64 (lo, hi), `directions` [num_grad +
    num_null, hi - lo] float32 unit rows (the canaries' first, then the null's),
    `input_coins` [num_input] bool, `input_x` [num_input, *image_shape] float32 in [0, 1],
    `input_y` [num_input] int64.
  """
  lo, hi = int(pool[0]), int(pool[1])
  if num_null is None:
    num_null = max(16, num_grad // 4) if num_grad else 0
  if num_grad < 0 or num_input < 0 or num_null < 0:
    raise ValueError('canary counts must be >= 0')
  if hi - lo < 2:
    raise ValueError(f'the directions need a pool of at least 2 coordinates (got {hi - lo})')
  g = _rng(seed, GRAD)
  grad_coins = g.random(num_grad) < 0.5
  v = _rng(seed, DIRECTIONS).standard_normal((num_grad + num_null, hi - lo))
  v /= np.linalg.norm(v, axis=1, keepdims=True)
  i = _rng(seed, INPUT)
  input_coins = i.random(num_input) < 0.5
  input_x = i.random((num_input, *image_shape)).astype(np.float32)
  input_y = i.integers(0, num_classes, num_input).astype(np.int64)
  return dict(grad_coins=grad_coins, pool=np.asarray([lo, hi], np.int64),
              directions=v.astype(np.float32), input_coins=input_coins, input_x=input_x,
              input_y=input_y)


def with_canaries(x: np.ndarray, y: np.ndarray, c: dict[str, np.ndarray]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The node's examples with its IN canaries appended, and a tag per example: -1 for
  ordinary ones (the input-space canaries are ordinary examples), k >= 0 for gradient canary
  k (its input is a blank image and label 0: its gradient is replaced anyway)."""
  ins = np.flatnonzero(c['input_coins'])
  grads = np.flatnonzero(c['grad_coins'])
  blank = np.zeros((len(grads), *x.shape[1:]), np.float32)
  xs = np.concatenate([x, c['input_x'][ins], blank]).astype(np.float32)
  ys = np.concatenate([y, c['input_y'][ins], np.zeros(len(grads), np.int64)])
  tags = np.concatenate([-np.ones(len(y) + len(ins), np.int64), grads.astype(np.int64)])
  return xs, ys, tags
