"""Hooks into Opacus's own DP-SGD step: gradient canaries, the every-step recorder, the plants.

Nothing of DP-SGD is re-implemented: Opacus's `GradSampleModule` computes the per-example
gradients (`p.grad_sample`), its `DPOptimizer` clips them (`clip_and_accumulate`), adds the
noise (`add_noise`), scales (`scale_grad`) and calls its step hook (the accountant's).

- `insert_gradient_canaries` writes, between `loss.backward()` and `optimizer.step()`, the
  gradient canaries' rows of `p.grad_sample` (`canary-norm` x C x the canary's direction on
  the pool's coordinates, zero elsewhere): Opacus then clips them to C and noises them like
  any row.
- `StepRecorder` chains onto the optimizer's step hook (after the accountant's) and reads
  the noisy summed gradient projected on every canary's (and null) direction: p.grad after
  Opacus's noise and scaling, times the expected batch size (`loss_reduction='mean'`), in
  units of C.
- The plants (`apply_plant`) swap the optimizer's class for a subclass of Opacus's own class
  that changes one method: `noise_mismatch` adds noise at `factor` x the noise multiplier the
  accountant reads; `batch_mean_clip` clips the batch's MEAN gradient (not each example's)
  and adds the noise the averaged gradient would have had (std z C / B after scaling).
  `no_poisson` is `make_private(poisson_sampling=False)` (Opacus still accounts at
  1 / len(loader) as if Poisson); `batchnorm` is a model Opacus refuses.
"""

from __future__ import annotations

import numpy as np
import torch
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

PLANTS = ('none', 'noise_mismatch', 'no_poisson', 'batch_mean_clip', 'batchnorm')


def _pool_param(optimizer: DPOptimizer, pool) -> int:
  """The index of the parameter whose flat coordinates are exactly `pool` [lo, hi)."""
  sizes = np.cumsum([0] + [p.numel() for p in optimizer.params])
  for j in range(len(optimizer.params)):
    if sizes[j] == int(pool[0]) and sizes[j + 1] == int(pool[1]):
      return j
  raise ValueError(f'the pool {tuple(pool)} is not one parameter tensor')


def insert_gradient_canaries(optimizer: DPOptimizer, tags: torch.Tensor, pool,
                             directions: np.ndarray, norm: float) -> int:
  """Replaces the per-example gradients of the batch's gradient canaries (tag k >= 0) by
  `norm` x `directions[k]` on the pool's parameter (zero on every other); returns how many
  rows it replaced."""
  rows = torch.nonzero(tags >= 0).flatten()
  if len(rows) == 0:
    return 0
  for p in optimizer.params:
    if not isinstance(p.grad_sample, torch.Tensor):
      raise RuntimeError('expected one per-example gradient tensor per parameter (one '
                         'backward per step)')
    p.grad_sample[rows] = 0.0
  p = optimizer.params[_pool_param(optimizer, pool)]
  v = torch.as_tensor(np.asarray(directions)[tags[rows].numpy()], dtype=p.grad_sample.dtype)
  p.grad_sample[rows] = float(norm) * v.view(len(rows), *p.shape)
  return len(rows)


class StepRecorder:
  """Records the noisy summed gradient projected on `directions` (rows on the pool's
  coordinates) after each of Opacus's steps."""

  def __init__(self, optimizer: DPOptimizer, pool, directions: np.ndarray):
    self.j = _pool_param(optimizer, pool)
    self.directions = torch.as_tensor(np.asarray(directions, np.float32))
    self.rows: list[np.ndarray] = []
    previous = optimizer.step_hook  # the accountant's: keep it, run after it

    def hook(opt: DPOptimizer) -> None:
      if previous is not None:
        previous(opt)
      self.rows.append(self.read(opt))
    optimizer.attach_step_hook(hook)

  def read(self, opt: DPOptimizer) -> np.ndarray:
    scale = float(opt.expected_batch_size * opt.accumulated_iterations) / float(
        opt.max_grad_norm)
    with torch.no_grad():
      g = opt.params[self.j].grad.reshape(-1).to(torch.float32)
      return (self.directions @ g).numpy() * scale

  def array(self) -> np.ndarray:
    return (np.stack(self.rows) if self.rows
            else np.zeros((0, len(self.directions)), np.float32))


class _NoiseMismatch:
  """Noise at `plant_factor` x the noise multiplier the accountant reads."""
  plant_factor = 0.25

  def add_noise(self):
    z = self.noise_multiplier
    self.noise_multiplier = z * self.plant_factor
    try:
      super().add_noise()
    finally:
      self.noise_multiplier = z  # what the accountant's step hook reads


class _BatchMeanClip:
  """Clips the batch's mean gradient to C (not each example's gradient); `add_noise` then
  adds N(0, (z C)^2) to B x the clipped mean, so after `scale_grad` the step is
  clip(mean) + N(0, (z C / B)^2): the noise an honest averaged step has, on a quantity one
  example can move by up to 2 C."""

  def clip_and_accumulate(self):
    grads = [self._get_flat_grad_sample(p).to(p.dtype) for p in self.params]
    n = len(grads[0])
    if n == 0:
      means = [torch.zeros_like(p) for p in self.params]
    else:
      means = [g.mean(0) for g in grads]
    norm = torch.sqrt(sum((m ** 2).sum() for m in means))
    factor = (self.max_grad_norm / (norm + 1e-6)).clamp(max=1.0)
    for p, m in zip(self.params, means):
      _check_processed_flag(p.grad_sample)
      grad = m * factor * float(self.expected_batch_size)
      p.summed_grad = grad if p.summed_grad is None else p.summed_grad + grad
      _mark_as_processed(p.grad_sample)


def apply_plant(optimizer: DPOptimizer, plant: str, factor: float) -> DPOptimizer:
  """Swaps `optimizer`'s class for the plant's subclass of it (in place; returned)."""
  if plant not in PLANTS:
    raise ValueError(f'plant must be one of {PLANTS} (got {plant!r})')
  mixin = {'noise_mismatch': _NoiseMismatch, 'batch_mean_clip': _BatchMeanClip}.get(plant)
  if mixin is not None:
    base = type(optimizer)
    optimizer.__class__ = type(f'{base.__name__}{mixin.__name__}', (mixin, base), {})
    if plant == 'noise_mismatch':
      optimizer.plant_factor = float(factor)
  return optimizer
