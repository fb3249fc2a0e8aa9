"""Passive server-side membership inference from recorded FedAvg rounds (FedMIA and baselines).

- `fedmia`: FedMIA's per-round Gaussian test against the non-target clients with its outlier
  filters (Zhu et al., CVPR 2025, Eqs. 8-12).
- `scores`: the attacks of the paper's Table 1 (single-round, best-round, series, FedMIA), each
  client as target, with aligned or public-code non-member scoring.
- `whitebox`: the white-box attack of Nasr et al. (2019) on recorded snapshots (feature groups,
  per-group MLPs and an encoder trained on a balanced half) and the loss threshold; PASTEL's
  attack.
- `pastel`: the PASTEL experiment's attacks on its recorded trainings (targets, balanced
  halves, `record`, FedMIA re-scoring of its rows).
- `evaluate`: pooled metrics with intervals (AUC by DeLong, TPR at low FPR by Clopper-Pearson).
- `lira`: LiRA (Carlini et al., S&P 2022) on the logit margin z_y - logsumexp_{j != y} z_j
  (the logit-scaled confidence from the logits), offline against the
  other clients (per-query or fixed variance) and online given IN measurements.
- `rmia`: RMIA (Zarifzadeh et al., ICML 2024) with the other clients as reference models and
  the server's test rows as the population (offline approximation with parameter `a`).

The measurements come from `fl.queries.measure` / `fl.recording.train_recorded`.

Citations: the equation, section and algorithm numbers in this package were not checked
against the papers' text in issue 29 (no copy of the text was at hand); each module marks its
numbers "unverified" where that matters, and the online LiRA test is no longer cited as LiRA's
Eq. (4) (Eq. (4) is the offline one-sided test).
"""

from __future__ import annotations

from fl_privacy.attacks.passive import evaluate
from fl_privacy.attacks.passive import fedmia
from fl_privacy.attacks.passive import lira
from fl_privacy.attacks.passive import pastel
from fl_privacy.attacks.passive import rmia
from fl_privacy.attacks.passive import scores
from fl_privacy.attacks.passive import whitebox
from fl_privacy.attacks.passive.fedmia import FILTERS
from fl_privacy.attacks.passive.scores import ATTACKS
from fl_privacy.attacks.passive.scores import SCORINGS

__all__ = ['ATTACKS', 'FILTERS', 'SCORINGS', 'evaluate', 'fedmia', 'lira', 'rmia', 'scores',
           'whitebox']
