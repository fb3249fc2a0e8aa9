"""tests_torch: the PyTorch + Opacus Flower App (flower_torch_app/) and its record-level audit.

Needs the `torch` extra (`pip install -e '.[torch]'`: torch==2.13.0 CPU, opacus==1.6.0), which
CI's torch step installs. Nothing here is skipped: without torch or opacus the session stops
with one line saying how to install them (a failure, not a pass).
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

APP_DIR = pathlib.Path(__file__).resolve().parents[1] / 'flower_torch_app'

_missing = [m for m in ('torch', 'opacus', 'flwr') if importlib.util.find_spec(m) is None]
if _missing:
  raise pytest.UsageError(f"tests_torch needs {', '.join(_missing)}: run "
                          "pip install -e '.[torch]' (torch==2.13.0, opacus==1.6.0)")

# The app's package, importable the way Flower imports it from an unpacked FAB.
if str(APP_DIR) not in sys.path:
  sys.path.insert(0, str(APP_DIR))
