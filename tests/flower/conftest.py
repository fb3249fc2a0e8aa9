"""Setup of the Flower tests: telemetry off, Flower's process identity.

Without Flower installed (it is the optional extra `pip install -e '.[flower]'`, also in
`.[test]`), only the test of the missing-extra error runs.
"""

from __future__ import annotations

import importlib.util
import os

os.environ['FLWR_TELEMETRY_ENABLED'] = '0'  # before anything imports flwr

# pylint: disable=wrong-import-position
import pytest

if importlib.util.find_spec('flwr') is None:
  collect_ignore_glob = ['test_[!o]*.py']  # keeps test_optional_import.py
else:
  from fl_privacy.flower.engines import inprocess

  @pytest.fixture(autouse=True)
  def flower_identity():
    """Flower's TaskIdentity (what its runtime sets), for strategies called directly."""
    with inprocess.task_identity(inprocess.DEFAULT_RUN_ID, 1):
      yield
