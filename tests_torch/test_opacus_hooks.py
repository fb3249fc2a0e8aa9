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


def test_canary_draws_are_seeded_distinct_and_fair():
  a = canaries.draw(3, 400, 40, (100, 9000), (1, 8, 8), 10)
  b = canaries.draw(3, 400, 40, (100, 9000), (1, 8, 8), 10)
  c = canaries.draw(4, 400, 40, (100, 9000), (1, 8, 8), 10)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert not np.array_equal(a['grad_coins'], c['grad_coins'])
  coords = np.concatenate([a['grad_coords'], a['null_coords']])
  assert len(set(coords.tolist())) == len(coords) and coords.min() >= 100 and coords.max() < 9000
  # A fair coin: 400 draws land within 5 standard deviations (10) of 200.
  assert abs(int(a['grad_coins'].sum()) - 200) < 50
  x, y, tags = canaries.with_canaries(np.zeros((5, 1, 8, 8), np.float32),
                                      np.zeros(5, np.int64), a)
  assert len(y) == 5 + a['input_coins'].sum() + a['grad_coins'].sum()
  assert sorted(tags[tags >= 0].tolist()) == np.flatnonzero(a['grad_coins']).tolist()


def test_gradient_canary_is_clipped_to_c_and_recorded_at_its_coordinate():
  # No noise, a batch of three gradient canaries (norm 10 C each, Dirac directions): the
  # recorded step is exactly C at each drawn canary's coordinate (Opacus clipped each to C)
  # and 0 at an absent canary's and at a null coordinate.
  n = 3
  model, opt, data = _private(0.0, n, tags=np.array([0, 1, 2]))
  coords = np.array([8100, 8200, 8300, 8400])  # canary 3 is not in the batch
  rec = opacus_hooks.StepRecorder(opt, np.concatenate([coords, [8500]]))
  xb, yb, tb = next(iter(torch.utils.data.DataLoader(data.dataset, batch_size=n)))
  _step(model, opt, xb, yb)
  assert opacus_hooks.insert_gradient_canaries(opt, tb, coords, 10.0 * C) == 3
  before = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
  opt.step()
  row = rec.array()[0]
  np.testing.assert_allclose(row[:3], C * np.ones(3), rtol=1e-4)
  np.testing.assert_allclose(row[3:], 0.0, atol=1e-6)
  after = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
  # Opacus's SGD step (lr 1) moved each drawn canary's coordinate by -C / the batch size,
  # and nothing else.
  moved = before - after
  np.testing.assert_allclose(moved[coords[:3]], C / n, rtol=1e-4)
  np.testing.assert_allclose(np.delete(moved, coords[:3]), 0.0, atol=1e-7)


def _noise_std(plant: str, factor: float = 0.25) -> tuple[float, float]:
  model, opt, data = _private(2.0, 16, plant, factor)
  rec = opacus_hooks.StepRecorder(opt, np.arange(8000, 9000))
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
  # One gradient canary of norm 10 C beside 15 more whose gradients are replaced by zero
  # (absent canaries' rows): honest Opacus bounds its share of the summed step by C;
  # clipping the batch MEAN (norm 10 C / 16 < C: not clipped) leaves the summed step
  # (B x mean) at 10 C.
  out = {}
  for plant in ('none', 'batch_mean_clip'):
    model, opt, data = _private(0.0, 16, plant, tags=np.arange(16))
    coords = np.arange(8100, 8116)
    rec = opacus_hooks.StepRecorder(opt, coords[:1])
    xb, yb, tb = next(iter(torch.utils.data.DataLoader(data.dataset, batch_size=16)))
    _step(model, opt, xb, yb)
    opacus_hooks.insert_gradient_canaries(opt, tb, coords, 10.0 * C)
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
