"""`auditing.STANDARD_NORMAL`, the scipy.special path that jax-privacy's auditor is handed in
place of `scipy.stats.norm` (for speed): the same values, and the same bounds."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from fl_privacy.eval import auditing

X = np.concatenate([np.linspace(-40, 40, 801), [-np.inf, np.inf, np.nan, 0.0, -0.0]])
Q = np.concatenate([np.linspace(0, 1, 1001), np.logspace(-300, -1, 300), [-0.5, 1.5, np.nan]])


@pytest.mark.parametrize('name, grid', [('cdf', X), ('sf', X), ('logcdf', X), ('ppf', Q),
                                        ('isf', Q)])
def test_each_function_is_scipys_value_for_value(name, grid):
  ours = getattr(auditing.STANDARD_NORMAL, name)
  theirs = getattr(sps.norm, name)
  np.testing.assert_array_equal(ours(grid), theirs(grid))
  for v in grid[::37]:  # the auditor's scalar calls
    assert np.array_equal(ours(float(v)), theirs(float(v)), equal_nan=True)


def test_anything_else_goes_to_scipy():
  assert auditing.STANDARD_NORMAL.pdf(0.3) == sps.norm.pdf(0.3)
  assert auditing.STANDARD_NORMAL.cdf(1.0) == sps.norm.cdf(1.0)
  assert auditing.STANDARD_NORMAL.ppf(0.2) == sps.norm.ppf(0.2, loc=0.0, scale=1.0)


def test_the_auditor_gets_it_and_every_bound_is_what_scipys_gives(monkeypatch):
  lib = auditing._library()  # pylint: disable=protected-access
  assert lib._norm is auditing.STANDARD_NORMAL  # pylint: disable=protected-access
  rng = np.random.default_rng(3)
  ins, outs = rng.normal(2.0, 1.0, 400), rng.normal(0.0, 1.0, 400)
  fast = auditing.audit_scores(ins, outs, delta=1e-5)
  monkeypatch.setattr(lib, '_norm', sps.norm)
  monkeypatch.setattr(auditing, '_library', lambda: lib)
  lib._gaussian_dp_blow_up_inverse.cache_clear()  # pylint: disable=protected-access
  slow = auditing.audit_scores(ins, outs, delta=1e-5)
  lib._gaussian_dp_blow_up_inverse.cache_clear()  # pylint: disable=protected-access
  assert fast.keys() == slow.keys()
  assert fast['epsilon_one_run_fdp'] > 0.5   # a bound the normal's functions decide
  for k in fast:
    a, b = np.asarray(fast[k]), np.asarray(slow[k])
    if a.dtype.kind in 'fc':
      assert np.array_equal(a, b, equal_nan=True), k
    else:
      assert fast[k] == slow[k], k
