"""Active membership inference under LDP (Nguyen et al., AISTATS 2023): the main job.

  python -m experiments.ami                                  # digits, about 1-1.5 minutes on 2 cores
  python -m experiments.ami --config=configs/digits.py:smoke # seconds (CI)
  python -m experiments.ami --config=configs/celeba.py       # the paper's setting (GPU advised)

Sweeps `ami.mechanisms` x `ami.epsilons`. Per point: crafts one neuron per target (vmapped),
plays the security game (`ami.num_trials` trials on the runner), computes the certified
guarantee (Theorem 1) and the utility of the randomized features; then the DP-SGD
noise-averaging analysis (Appendix E). The client runs `config.defense` (configs/_defense.py:
'none', or 'mixup' / 'augment' / 'sampling' on the batch it trains on) in every game trial.
Results: results.json / results.csv with `adv`, `tpr`,
`tnr`, `accuracy` (each with `_ci_low` / `_ci_high`) per point, and the figures
`ami_vs_epsilon.png` (Figs. 5, 11), `neuron_histograms.png` (Fig. 10), `certified.png`
(Figs. 7, 12) and `dp_rounds.png` (Fig. 13). Every field: configs/_ami.py. The code:
fl_privacy/pipelines/ami.py (`prepare`, `plan`, `figures`), fl_privacy/attacks/ami/point.py (the points)
and fl_privacy/pipelines/ami_figures.py (the figures).
"""

from __future__ import annotations

from experiments import common

if __name__ == '__main__':
  common.run('ami')
