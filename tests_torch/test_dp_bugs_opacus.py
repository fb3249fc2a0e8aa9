"""The Opacus entries of the DP-bug catalog (`attacks.audit.bug_opacus`), at small sizes.

Each game runs Opacus 1.6's own optimizers; sizes sit far from every decision (measured with
300 games: the adaptive-clipping bug certifies ~5 at a claim of 1.77 and its twin 0; the
normaliser bug at d = 64 exceeds the claimed privacy profile by ~0.8 in delta and its twin
never does).
"""

from __future__ import annotations

import pytest

pytest.importorskip('opacus')

from fl_privacy.attacks.audit import bug_audit  # pylint: disable=g-import-not-at-top
from fl_privacy.attacks.audit import bug_catalog  # pylint: disable=g-import-not-at-top
from fl_privacy.attacks.audit import bug_opacus  # pylint: disable=g-import-not-at-top


def _audit(name, variant, n=300, severity=None):
  entry = {e.name: e for e in bug_catalog.catalog()}[name]
  sev = entry.severity if severity is None else severity
  game = entry.build(variant, sev)
  present, scores = game.play(5, n)
  return bug_audit.verdict(present, scores, entry.claim(sev), game.curve, confidence=0.95,
                           event=game.event)


def test_adaclip_accounting_bug_flagged_twin_not():
  bug = _audit('opacus_adaclip_accounting', 'bug')
  twin = _audit('opacus_adaclip_accounting', 'twin')
  claim = {e.name: e for e in bug_catalog.catalog()}['opacus_adaclip_accounting'].claim(1.1)
  assert bug['verdict'] == 'violation' and bug['best_bound'] > 2 * claim.epsilon
  assert twin['verdict'] == 'no violation'


def test_normaliser_bug_flagged_in_high_dimension_twin_not():
  bug = _audit('opacus_819', 'bug', severity=64)
  twin = _audit('opacus_819', 'twin', severity=64)
  assert bug['verdict'] == 'violation' and bug['profile_excess'] > 0.3
  assert twin['verdict'] == 'no violation'
  assert _audit('opacus_571', 'twin')['verdict'] == 'no violation'


def test_prefix_subclass_hands_the_accountant_the_adjusted_multiplier():
  # sigma_b = 1.1 x z / 2 with z = 1: z' = (1 - 1 / 1.21)^-1/2 = 2.40.
  assert bug_opacus.accounted_multiplier(1.1) == pytest.approx(
      bug_opacus.adjusted(1.0, 0.55), rel=1e-6)
  assert bug_opacus.adjusted(1.0, 0.55) == pytest.approx(2.4004, abs=1e-3)


def test_expected_batch_size_follows_the_dataset():
  assert [bug_opacus.ebs(n, 0.5) for n in (3, 4)] == [1, 2]
