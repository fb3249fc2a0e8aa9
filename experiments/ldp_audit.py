"""Empirical lower bounds of LDP epsilon, with confidence (the LDP-audit paper).

For each crafter x distinguisher x epsilon (Table 1 of Matsumoto et al.), a
client holding one of two crafted gradients runs LDP-SGD, and a distinguisher
guesses which; FP, FN and accuracy (95% Clopper-Pearson intervals) give the
empirical epsilon of Eq. (3) and its one-sided 95% lower bound. With
`ldp_audit.mechanism` = 'bitrand' / 'ome' / 'gaussian' the input mechanisms are
audited instead (two extreme inputs, the exact likelihood-ratio test), claimed
vs attained epsilon. A lower bound above the claim is logged as an error and
stored as `privacy_violation = 1`.

  python -m experiments.ldp_audit                                  # digits, about 1.5 minutes
  python -m experiments.ldp_audit --config=configs/digits.py:smoke # seconds (CI)
  python -m experiments.ldp_audit --config=configs/mnist.py:data_dir=DIR
  python -m experiments.ldp_audit --config.ldp_audit.mechanism=bitrand

Writes results.json, results.csv and fig2_<mechanism>.png to --workdir
(default ./runs/ldp_audit-<UTC timestamp>; re-using one resumes the sweep).

Fields: configs/_ldp_audit.py. Results: docs/experiments/ldp_audit.md.
Code: fl_privacy/pipelines/ldp_audit.py (validation, points, metrics) and
fl_privacy/pipelines/ldp_audit_figures.py (figures).
"""

from __future__ import annotations

from experiments import common

if __name__ == '__main__':
  common.run('ldp_audit')
