"""Attacks: what a dishonest or curious server learns from what clients send.

- `ami`: active membership inference with a trained crafted neuron, under input LDP
  (the AMI paper): `ami.crafting`, `ami.decisions`, `ami.game`, with `ami.certified`
  (Theorem 1, Eqs. 9-10) and `ami.dp_averaging` (Appendix E, DP-SGD noise averaged over
  rounds and neurons).
- `dishonest`: the 2M+1 ReLU detector of the dishonest-server paper (perfect MI);
  `dishonest_attribution` explains its false positives (a duplicate of the target, or none).
- `passive`: passive server-side MI from recorded rounds (FedMIA and the baselines of its
  Table 1).
- `audit`: crafters and distinguishers that lower-bound LDP epsilon (the LDP-audit paper),
  the DP audit's canary games and the training audit's canaries.
- `reconstruction`: recovering clients' inputs (analytic, imprint) and its metrics.
"""

from fl_privacy.attacks import ami
from fl_privacy.attacks import audit
from fl_privacy.attacks import dishonest
from fl_privacy.attacks import dishonest_attribution
from fl_privacy.attacks import passive
from fl_privacy.attacks import reconstruction

__all__ = ['ami', 'audit', 'dishonest', 'dishonest_attribution', 'passive', 'reconstruction']
