"""pytest set-up for the whole suite (loaded before any test module imports JAX).

The tests are dominated by XLA compiling many small programs, not by running them: with LLVM's
backend optimisations off a compile costs about half (`tests/experiments/cli.py` has the
measurement for the experiments' subprocesses, which already ran this way), and these programs
are far too small for the lost optimisations to matter. A user's own XLA_FLAGS are kept.
"""

from __future__ import annotations

import os

os.environ.setdefault('XLA_FLAGS', '--xla_backend_optimization_level=0')
