"""The AMI pipeline's `draws/` files: the chosen neuron's values behind Fig. 10 and Theorem 1.

`draws/<mechanism>_eps<epsilon>.npz` holds `target` (v(M(t)) over the certified draws of
target 0), `other` (v(M(x)) over the held-out adversary samples), and the point it belongs
to (`mechanism`, `epsilon`), so a file can be checked against the point that reads it.
Written atomically when a point is computed; on resume a missing or unreadable file is
recomputed by the sweep (`fl_privacy.pipelines.ami.ensure_draws`), and a figure that still
finds none says so in its panel instead of drawing another point's values.
"""

from __future__ import annotations

import io
import os
import zipfile

import numpy as np

from fl_privacy.report import atomic

FOLDER = 'draws'


def path(workdir: str, mechanism: str, epsilon: float) -> str:
  """Where the draws of point (mechanism, epsilon) live."""
  return os.path.join(workdir, FOLDER, f'{mechanism}_eps{epsilon:g}.npz')


def save(workdir: str, mechanism: str, epsilon: float, draws: dict) -> str:
  """Writes the draws of one point atomically; returns the path."""
  target = path(workdir, mechanism, epsilon)
  os.makedirs(os.path.dirname(target), exist_ok=True)
  buf = io.BytesIO()
  np.savez(buf, target=np.asarray(draws['target']), other=np.asarray(draws['other']),
           mechanism=np.asarray(mechanism), epsilon=np.asarray(float(epsilon)))
  atomic.atomic_write_bytes(target, buf.getvalue())
  return target


def load(workdir: str, mechanism: str, epsilon: float) -> tuple[dict | None, str]:
  """The draws of a point, or None with the reason (missing, unreadable, another point's).

  Returns:
    `({'target': array, 'other': array}, '')` or `(None, reason)`.
  """
  p = path(workdir, mechanism, epsilon)
  if not os.path.exists(p):
    return None, f'{os.path.relpath(p, workdir)} is missing'
  try:
    with np.load(p, allow_pickle=False) as z:
      out = {k: np.asarray(z[k], np.float64) for k in ('target', 'other')}
      if 'mechanism' in z.files and (str(z['mechanism']) != mechanism or
                                     float(z['epsilon']) != float(epsilon)):
        return None, (f'{os.path.relpath(p, workdir)} holds the draws of '
                      f'{z["mechanism"]} eps={float(z["epsilon"]):g}')
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
    return None, f'{os.path.relpath(p, workdir)} is unreadable ({type(e).__name__})'
  if any(v.ndim != 1 or v.size == 0 for v in out.values()):
    return None, f'{os.path.relpath(p, workdir)} holds no values'
  return out, ''
