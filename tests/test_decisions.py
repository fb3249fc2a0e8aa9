"""The tests' decision comparer (tests/decisions.py) allows a flip only where a row is tied."""

from __future__ import annotations

import numpy as np
import pytest

from tests import decisions


def test_a_count_off_by_one_fails_unless_a_row_sits_on_a_tie():
  logits = np.array([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 0.0, 5.0]])
  labels = np.array([0, 1, 0])
  decisions.assert_correct_count(2, logits, labels)
  with pytest.raises(AssertionError):
    decisions.assert_correct_count(3, logits, labels)
  logits[2, 0] = 5.0 - 1e-6   # row 2 within rounding of its tie: 2 or 3 both agree
  assert decisions.near_ties(logits).tolist() == [False, False, True]
  decisions.assert_correct_count(3, logits, labels)
  decisions.assert_correct_count(2, logits, labels)
  with pytest.raises(AssertionError):   # the tie cannot make a correct row wrong here
    decisions.assert_correct_count(1, logits, labels)
  logits[2] = [0.0, 5.0, 5.0 - 1e-6]    # tied, but not on the label: no slack
  with pytest.raises(AssertionError):
    decisions.assert_correct_count(3, logits, labels)


def test_too_many_ties_refuse_the_comparison():
  logits = np.zeros((20, 3))
  with pytest.raises(AssertionError, match='near a tie'):
    decisions.assert_correct_count(0, logits, np.zeros(20, np.int64))
