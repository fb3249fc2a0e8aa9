"""A toy Bernoulli game: the smallest experiment through the whole pipeline.

Each trial draws one Bernoulli(p) bit with the trial's key; a point reports the
rate of ones with its 95% Clopper-Pearson interval. Code: fl_privacy/pipelines/toy_game.py.

  python -m experiments.toy_game                    # configs/toy.py, its default
  python -m experiments.toy_game --config=configs/toy.py:smoke --workdir=runs/toy
"""

from __future__ import annotations

from experiments import common

if __name__ == '__main__':
  common.run('toy_game')
