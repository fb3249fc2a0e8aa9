"""Saving matplotlib figures as PNG beside the results, atomically."""

from __future__ import annotations

import io
import os
import re
import sys

import matplotlib

# Results are written on headless machines; only pick the backend if nobody
# imported pyplot yet (switching later would disturb an interactive session).
if 'matplotlib.pyplot' not in sys.modules:
  matplotlib.use('Agg')

from fl_privacy.report import atomic  # pylint: disable=g-import-not-at-top


def save(fig, workdir: str | os.PathLike, name: str, *, dpi: int = 150) -> str:
  """Writes `fig` as `<workdir>/<name>.png` (atomic) and returns the path.

  Args:
    fig: a `matplotlib.figure.Figure`.
    workdir: the run folder (created if missing).
    name: file stem; characters other than letters, digits, `-_.=` become `_`.
    dpi: resolution.
  """
  stem = name[:-4] if name.lower().endswith('.png') else name
  stem = re.sub(r'[^A-Za-z0-9_.=-]', '_', stem)
  if not stem:
    raise ValueError(f'empty figure name (got {name!r})')
  os.makedirs(workdir, exist_ok=True)
  buf = io.BytesIO()
  fig.savefig(buf, format='png', dpi=dpi, bbox_inches='tight')
  path = os.path.join(os.fspath(workdir), stem + '.png')
  atomic.atomic_write_bytes(path, buf.getvalue())
  return path
