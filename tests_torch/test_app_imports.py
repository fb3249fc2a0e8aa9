"""The torch app needs only torch, opacus, numpy and flwr: its modules import with JAX blocked
and never import fl_privacy (what a SuperLink installs from its pyproject.toml suffices)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

APP_DIR = pathlib.Path(__file__).resolve().parents[1] / 'flower_torch_app'

PROBE = f'''
import sys
sys.modules["jax"] = None  # any "import jax" raises ImportError
sys.path.insert(0, {str(APP_DIR)!r})
import torch_audit_app.client_app, torch_audit_app.server_app
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("fl_privacy", "jaxlib", "flax", "optax", "tensorflow"))
assert not heavy, heavy
print("ok")
'''


def test_the_app_imports_without_jax_or_fl_privacy():
  out = subprocess.run([sys.executable, '-c', PROBE], capture_output=True, text=True,
                       timeout=300, check=False, cwd='/')
  assert out.returncode == 0 and out.stdout.strip().endswith('ok'), out.stderr[-2000:]


def test_the_app_declares_exactly_the_pinned_dependencies():
  import tomllib  # pylint: disable=import-outside-toplevel
  with open(APP_DIR / 'pyproject.toml', 'rb') as f:
    deps = tomllib.load(f)['project']['dependencies']
  assert 'torch==2.13.0' in deps and 'opacus==1.6.0' in deps
  assert not any(d.startswith(('torchvision', 'jax', 'fl-privacy', 'fl_privacy')) for d in deps)


def test_the_vendored_canary_files_are_the_in_app_ones():
  # `python -m fl_privacy.flower.inapp.vendor flower_torch_app/torch_audit_app/` copies them
  # byte for byte; rerun it when fl_privacy/flower/inapp changes.
  inapp = APP_DIR.parent / 'fl_privacy' / 'flower' / 'inapp'
  for name in ('fl_privacy_canaries.py', 'fl_privacy_canary_strategy.py'):
    assert (APP_DIR / 'torch_audit_app' / name).read_bytes() == (inapp / name).read_bytes(), name
