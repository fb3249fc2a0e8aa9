"""Tests of the utility of LDP-randomized features (fl_privacy/eval/utility.py)."""

from __future__ import annotations

import jax
import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

from fl_privacy.eval import utility
from fl_privacy.mechanisms import bitrand


def _digits():
  x, y = load_digits(return_X_y=True)
  perm = np.random.default_rng(0).permutation(len(x))
  tr, te = perm[:1200], perm[1200:]
  return x[tr].astype(np.float32), y[tr], x[te].astype(np.float32), y[te]


def test_accuracy_without_ldp_agrees_with_sklearn():
  x_tr, y_tr, x_te, y_te = _digits()
  out = utility.ldp_accuracy(jax.random.key(0), x_tr, y_tr, x_te, y_te, 10, None, steps=300)
  mean, std = x_tr.mean(0), x_tr.std(0) + 1e-6
  ref = LogisticRegression(max_iter=2000).fit((x_tr - mean) / std, y_tr)
  ref_acc = ref.score((x_te - mean) / std, y_te)
  assert out['accuracy_n'] == len(y_te)
  assert out['accuracy_ci_low'] <= out['accuracy'] <= out['accuracy_ci_high']
  assert abs(out['accuracy'] - ref_acc) < 0.04
  assert out['accuracy'] > 0.9


def test_accuracy_falls_to_chance_under_strong_ldp():
  x_tr, y_tr, x_te, y_te = _digits()
  rand = lambda k, x: bitrand.randomize(k, x, 0.5)
  out = utility.ldp_accuracy(jax.random.key(0), x_tr, y_tr, x_te, y_te, 10, rand, steps=300)
  assert out['accuracy_ci_low'] < 0.2
