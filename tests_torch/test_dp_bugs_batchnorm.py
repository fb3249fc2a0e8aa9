"""The `opacus_batchnorm` entry of the DP-bug catalog (`attacks.audit.bug_opacus_norm`).

Sizes sit far from every decision (measured with 300 games, seed 5: the bug at B = 16 certifies
6.6 at Opacus's claim of 2.17, its twin 0.0; the sensitivity the noiseless replays give is
4.68 C for the bug and 1.00 C for the twin).
"""

from __future__ import annotations

import pytest

pytest.importorskip('opacus')

from fl_privacy.attacks.audit import bug_audit  # pylint: disable=g-import-not-at-top
from fl_privacy.attacks.audit import bug_catalog  # pylint: disable=g-import-not-at-top
from fl_privacy.attacks.audit import bug_opacus_norm  # pylint: disable=g-import-not-at-top


def _entry():
  return {e.name: e for e in bug_catalog.catalog()}['opacus_batchnorm']


def _audit(variant, n=300, known=16):
  entry = _entry()
  game = entry.build(variant, known)
  present, scores = game.play(5, n)
  return bug_audit.verdict(present, scores, entry.claim(known), game.curve, confidence=0.95,
                           event=game.event)


def test_batchnorm_bug_flagged_twin_not():
  claim = _entry().claim(16).epsilon
  bug = _audit('bug')
  twin = _audit('twin')
  assert bug['verdict'] == 'violation' and bug['best_bound'] > 2 * claim
  assert twin['verdict'] == 'no violation' and twin['best_bound'] < 0.5 * claim


def test_batchnorm_mixes_the_batch_and_groupnorm_does_not():
  # The twin's per-sample clip bounds the canary's move by C; the bug's grows with B.
  assert bug_opacus_norm.shift(16, True) == pytest.approx(1.0, abs=1e-3)
  assert bug_opacus_norm.shift(2, False) > 1.8
  assert bug_opacus_norm.shift(64, False) > 2 * bug_opacus_norm.shift(8, False) > 6.0


def test_opacus_refuses_affine_batchnorm_but_not_this_one():
  checks = bug_opacus_norm.validator_checks(0)
  assert checks['opacus_validate_errors_affine_batchnorm'] == 1
  assert checks['opacus_validate_affine_error'] == 'ShouldReplaceModuleError'
  assert checks['opacus_validate_errors_this_model'] == 0
  assert checks['opacus_validate_errors_frozen_affine_batchnorm'] == 0
  assert checks['opacus_fix_keeps_batchnorm'] == 1.0


def test_privacy_engine_accepts_the_affine_free_batchnorm():
  import torch  # pylint: disable=g-import-not-at-top
  from opacus import PrivacyEngine  # pylint: disable=g-import-not-at-top
  from opacus.validators import ModuleValidator  # pylint: disable=g-import-not-at-top
  net = torch.nn.Sequential(torch.nn.BatchNorm1d(1, affine=False), torch.nn.Flatten(),
                            torch.nn.Linear(2, 1, bias=False))
  data = torch.utils.data.DataLoader(
      torch.utils.data.TensorDataset(torch.zeros(8, 1, 2), torch.zeros(8)), batch_size=4)
  module, _, _ = PrivacyEngine().make_private(
      module=net, optimizer=torch.optim.SGD(net.parameters(), lr=1.0), data_loader=data,
      noise_multiplier=1.0, max_grad_norm=1.0)
  assert any(isinstance(m, torch.nn.BatchNorm1d) for m in module.modules())
  affine = torch.nn.Sequential(torch.nn.BatchNorm1d(1), torch.nn.Flatten(),
                               torch.nn.Linear(2, 1))
  with pytest.raises(Exception, match='BatchNorm'):
    ModuleValidator.validate(affine, strict=True)
