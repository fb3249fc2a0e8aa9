"""The app's hooks into Opacus's DP-SGD step, checked on one step with known gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch import nn

from torch_audit_app import canaries
from torch_audit_app import opacus_hooks
from torch_audit_app import task

C = 1.0


def _private(noise: float, n: int = 32, plant: str = 'none', factor: float = 0.25,
             tags=None):
  torch.manual_seed(0)
  model = task.make_model('cnn', 0)
  x = np.zeros((n, 1, 8, 8), np.float32)
  y = np.zeros(n, np.int64)
  tags = -np.ones(n, np.int64) if tags is None else tags
  data = task.loader(x, y, tags, n)
  opt = torch.optim.SGD(model.parameters(), lr=1.0)
  model, opt, data = PrivacyEngine().make_private(
      module=model, optimizer=opt, data_loader=data, noise_multiplier=noise, max_grad_norm=C,
      poisson_sampling=False)
  opacus_hooks.apply_plant(opt, plant, factor)
  return model, opt, data


def _step(model, opt, xb, yb):
  opt.zero_grad()
  loss = nn.functional.cross_entropy(model(xb), yb, reduction='sum') / max(len(yb), 1)
  loss.backward()


def test_canary_draws_are_seeded_and_fair():
  a = canaries.draw(3, 400, 40, (100, 9000), (1, 8, 8), 10)
  b = canaries.draw(3, 400, 40, (100, 9000), (1, 8, 8), 10)
  c = canaries.draw(4, 400, 40, (100, 9000), (1, 8, 8), 10)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert not np.array_equal(a['grad_coins'], c['grad_coins'])
  v = a['directions']
  assert v.shape == (500, 8900)
  np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)
  # A fair coin: 400 draws land within 5 standard deviations (50) of 200.
  assert abs(int(a['grad_coins'].sum()) - 200) < 50
  x, y, tags = canaries.with_canaries(np.zeros((5, 1, 8, 8), np.float32),
                                      np.zeros(5, np.int64), a)
  assert len(y) == 5 + a['input_coins'].sum() + a['grad_coins'].sum()
  assert sorted(tags[tags >= 0].tolist()) == np.flatnonzero(a['grad_coins']).tolist()


def _pool(opt):
  sizes = np.cumsum([0] + [p.numel() for p in opt.params])
  j = int(np.argmax([p.numel() for p in opt.params]))
  return int(sizes[j]), int(sizes[j + 1])


def _directions(k, pool):
  v = np.random.default_rng(0).standard_normal((k, pool[1] - pool[0]))
  return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def test_gradient_canary_is_clipped_to_c_and_recorded_on_its_direction():
  # No noise, a batch of three gradient canaries (norm 10 C each): Opacus clips each to C,
  # so the recorded step projected on a drawn canary's direction is C (plus the others'
  # cross-talk, |<v_j, v_k>| ~ 1 / sqrt(8192)), on an absent one's and a null one's ~0.
  n = 3
  model, opt, data = _private(0.0, n, tags=np.array([0, 1, 2]))
  pool = _pool(opt)
  v = _directions(5, pool)  # canary 3 is not in the batch; row 4 is a null direction
  rec = opacus_hooks.StepRecorder(opt, pool, v)
  xb, yb, tb = next(iter(torch.utils.data.DataLoader(data.dataset, batch_size=n)))
  _step(model, opt, xb, yb)
  assert opacus_hooks.insert_gradient_canaries(opt, tb, pool, v[:4], 10.0 * C) == 3
  before = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
  opt.step()
  row = rec.array()[0]
  expected = C * v @ v[:3].sum(axis=0)
  np.testing.assert_allclose(row, expected, atol=1e-4)
  np.testing.assert_allclose(row[:3], C, atol=0.05)
  np.testing.assert_allclose(row[3:], 0.0, atol=0.05)
  after = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
  # Opacus's SGD step (lr 1) moved the pool by -C (v_0 + v_1 + v_2) / the batch size, and
  # nothing else.
  moved = before - after
  np.testing.assert_allclose(moved[pool[0]:pool[1]], C * v[:3].sum(axis=0) / n, atol=1e-6)
  np.testing.assert_allclose(np.delete(moved, np.arange(*pool)), 0.0, atol=1e-7)


def _noise_std(plant: str, factor: float = 0.25) -> tuple[float, float]:
  model, opt, data = _private(2.0, 16, plant, factor)
  rec = opacus_hooks.StepRecorder(opt, _pool(opt), _directions(1000, _pool(opt)))
  xb, yb, _ = next(iter(torch.utils.data.DataLoader(data.dataset, batch_size=16)))
  for _ in range(3):
    _step(model, opt, xb, yb)
    opt.step()
  return float(np.std(rec.array())), float(opt.noise_multiplier)


def test_noise_mismatch_plant_adds_less_noise_than_the_accountant_reads():
  honest, z = _noise_std('none')
  planted, z_planted = _noise_std('noise_mismatch', 0.25)
  assert z == z_planted == 2.0  # what the accountant's hook reads
  assert honest == pytest.approx(2.0 * C, rel=0.1)  # z C in units of C, 3,000 draws
  assert planted == pytest.approx(0.5 * C, rel=0.1)


def test_batch_mean_clip_plant_lets_one_example_move_the_step_by_its_full_gradient():
  # One gradient canary of norm 10 C beside 15 whose gradients are replaced by zero: honest
  # Opacus bounds its share of the summed step by C; clipping the batch MEAN (norm
  # 10 C / 16 < C: not clipped) leaves the summed step (B x mean) at 10 C.
  out = {}
  for plant in ('none', 'batch_mean_clip'):
    model, opt, data = _private(0.0, 16, plant, tags=np.arange(16))
    pool = _pool(opt)
    v = _directions(16, pool)
    rec = opacus_hooks.StepRecorder(opt, pool, v[:1])
    xb, yb, tb = next(iter(torch.utils.data.DataLoader(data.dataset, batch_size=16)))
    _step(model, opt, xb, yb)
    opacus_hooks.insert_gradient_canaries(opt, tb, pool, v, 10.0 * C)
    for p in opt.params:  # every canary but the first: a zero gradient
      p.grad_sample[1:] = 0.0
    opt.step()
    out[plant] = float(rec.array()[0, 0])
  assert out['none'] == pytest.approx(C, rel=1e-4)
  assert out['batch_mean_clip'] == pytest.approx(10 * C, rel=1e-4)


def test_unknown_plant_is_refused():
  _, opt, _ = _private(1.0, 4)
  with pytest.raises(ValueError, match='plant must be one of'):
    opacus_hooks.apply_plant(opt, 'typo', 0.25)
