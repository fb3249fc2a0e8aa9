"""Decisions two float computations of the same thing must agree on, up to rounding.

A test that recomputes a jitted program's decision (an argmax, a count of correct
predictions) outside it agrees only where no value sits within float rounding of the
boundary: a different fusion, CPU or XLA flag may round the two sides apart (issue 41: an
example 3.7e-9 from a bin threshold failed the imprint test on another CPU). These helpers
compare counts exactly where every decision has a margin and allow one flip per row without
one, and refuse a comparison where such rows are more than a few (the test would say nothing).
"""

from __future__ import annotations

import numpy as np

# Relative margin between the two largest logits below which a row's argmax may flip between
# two computations whose parameters agree to ~1e-5 relative (the tests' own tolerance).
TIE_TOL = 1e-4


def near_ties(logits, tol: float = TIE_TOL) -> np.ndarray:
  """[N] bool: rows whose two largest logits are within `tol` x max(1, |largest|)."""
  z = np.sort(np.asarray(logits, np.float64), axis=-1)
  return (z[..., -1] - z[..., -2]) <= tol * np.maximum(1.0, np.abs(z[..., -1]))


def assert_correct_count(got, logits, labels, tol: float = TIE_TOL) -> None:
  """`got` (a count of correct predictions, or several) is argmax(logits) == labels counted
  here: exactly over the rows with a margin, and for each near-tied row either way where its
  label is among the tied logits (never where it is not); at most a tenth of the rows (and at
  least one allowed) may be near-tied."""
  z = np.asarray(logits, np.float64)
  labels = np.asarray(labels)
  near = near_ties(z, tol)
  assert near.sum() <= max(1, len(labels) // 10), f'{near.sum()} of {len(labels)} rows near a tie'
  top = z.max(-1)
  own = np.take_along_axis(z, labels[:, None].astype(np.int64), -1)[:, 0]
  base = int(np.sum((np.argmax(z, -1) == labels) & ~near))
  either = int(np.sum(near & (top - own <= tol * np.maximum(1.0, np.abs(top)))))
  got = np.atleast_1d(np.asarray(got))
  assert np.all((base <= got) & (got <= base + either)), (got, base, either)
