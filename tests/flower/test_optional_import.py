"""Flower is an optional extra: a clear error without it, and nothing else imports it."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]

_WITHOUT_FLWR = """
import sys
sys.modules['flwr'] = None  # what an uninstalled package looks like to `import flwr`
try:
  import fl_privacy.flower
except ImportError as e:
  print(e)
else:
  raise SystemExit('fl_privacy.flower imported without flwr')
"""


def test_missing_flwr_names_the_extra():
  out = subprocess.run([sys.executable, '-c', _WITHOUT_FLWR], cwd=REPO, capture_output=True,
                       text=True, timeout=120, check=True,
                       env={'FLWR_TELEMETRY_ENABLED': '0', 'PATH': '/usr/bin:/bin',
                            'PYTHONPATH': str(REPO)})
  assert "pip install -e '.[flower]'" in out.stdout, out.stdout + out.stderr
  assert 'flwr>=1.42,<1.43' in out.stdout


def test_no_other_module_imports_flower_or_flwr():
  pattern = re.compile(r'^\s*(from|import)\s+(flwr\b|fl_privacy\.flower\b|fl_privacy import '
                       r'flower\b)', re.MULTILINE)
  offenders = [str(p.relative_to(REPO)) for p in (REPO / 'fl_privacy').rglob('*.py')
               if 'flower' not in p.relative_to(REPO / 'fl_privacy').parts
               and pattern.search(p.read_text())]
  assert not offenders, f'{offenders} import Flower outside fl_privacy/flower/'
