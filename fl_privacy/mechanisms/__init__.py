"""Jit-able privacy mechanisms: fixed-point encoding, BitRand, OME, Gaussian noise.

Each randomizer is a pure function `(key, x, epsilon, ...) -> randomized x`, vectorised over
leading batch axes; `registry.randomizer(name, ...)` builds one by its config name (the one
name -> mechanism dispatch) and `transforms.make(name, ...)` wraps one as an (init, update) pair.
"""

from fl_privacy.mechanisms import bitrand
from fl_privacy.mechanisms import codes
from fl_privacy.mechanisms import fixed_point
from fl_privacy.mechanisms import gaussian
from fl_privacy.mechanisms import ome
from fl_privacy.mechanisms import registry
from fl_privacy.mechanisms import transforms
from fl_privacy.mechanisms import ldp_sgd
