"""Empirical lower bounds of LDP (the LDP-audit paper, Matsumoto et al.).

`crafters` builds the two raw inputs/gradients of a point (Table 1),
`distinguishers` guesses which one the client randomized (Eqs. 4-7 and the
likelihood-ratio tests for input mechanisms), `game` runs the trials and turns
them into FP, FN, accuracy and empirical epsilon with confidence bounds.
`dp_canary` holds the white-box Dirac-canary games of the DP audit (Nasr et al. 2023) against
the central DP mechanisms, their optimal scores and the epsilon bounds that count.
"""

from __future__ import annotations

from fl_privacy.attacks.audit import canaries
from fl_privacy.attacks.audit import crafters
from fl_privacy.attacks.audit import distinguishers
from fl_privacy.attacks.audit import dp_canary
from fl_privacy.attacks.audit import game
from fl_privacy.attacks.audit.crafters import CRAFTERS
from fl_privacy.attacks.audit.crafters import Crafted
from fl_privacy.attacks.audit.distinguishers import BLACK_BOX_RULE
from fl_privacy.attacks.audit.distinguishers import DISTINGUISHERS
from fl_privacy.attacks.audit.game import MECHANISMS
from fl_privacy.attacks.audit.game import summarize

__all__ = [
    'BLACK_BOX_RULE', 'CRAFTERS', 'Crafted', 'DISTINGUISHERS', 'MECHANISMS',
    'canaries', 'crafters', 'distinguishers', 'dp_canary', 'game', 'summarize',
]
