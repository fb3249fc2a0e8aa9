"""Test-session settings: XLA's CPU compile flags and one fresh JAX compilation cache.

The suite is compile-bound: about 90% of the fl, defenses, attacks and models tests' time is
JAX tracing and XLA compiling small programs, 75% XLA's backend alone (measured 2026-11-27).

Two XLA:CPU flags cut that (set here before JAX starts a backend, unless XLA_FLAGS already
names them; subprocesses inherit them): the classic fusion emitters
(`--xla_cpu_use_fusion_emitters=false`; the newer ones compile slowly) and LLVM's backend
optimisation level 1 instead of the default (`--xla_backend_optimization_level=1`). Together
they took tests/fl/test_sampling.py from 61 to 24 CPU-seconds, while a vmapped 20-step CNN
training runs within 5% as fast (level 0 would run it 5x slower; measured 2026-11-27).
tests/experiments/cli.py puts level 0 on most experiment subprocesses.

Many tests compile the same programs (the same model and step under different test names,
and every experiment subprocess's setup), so a persistent cache shared across the session's
processes compiles each once: about a quarter off the fl tests here. It starts empty, so a
run on this machine takes what a clean CI machine takes (the experiments' default cache in
the user's home, warm from earlier runs, would hide that). A cache you set yourself through
`FL_PRIVACY_COMPILE_CACHE` is used as it is ('' turns it off).

One BLAS thread a process: `pytest -n auto` already runs one worker per core, and OpenBLAS's
own threads on top of them oversubscribe the cores and spin: on this 2-core machine under
load, numpy's QR of a 610 x 600 matrix (the canary frame, `canaries.directions`) took 0.4-3.5
s with two BLAS threads and 0.05 s with one, and one training-audit test went from 70 s to 25
s (measured 2026-12-08). Set before numpy loads (subprocesses inherit it), unless set already.
"""

from __future__ import annotations

import os
import shutil
import tempfile

for _blas in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS'):
  os.environ.setdefault(_blas, '1')

from tests.experiments.cli import USER_LEVEL  # stdlib only: JAX not imported yet

TEST_XLA_FLAGS = ('--xla_cpu_use_fusion_emitters=false', '--xla_backend_optimization_level=1')


def with_flags(flags: str, extra) -> str:
  """`flags` (an XLA_FLAGS value) with each of `extra` added unless its name is there."""
  for flag in extra:
    if flag.split('=')[0] not in flags:
      flags = f'{flags} {flag}'.strip()
  return flags


# Whether XLA_FLAGS named the optimisation level before this file did (it is then the
# user's): the first process (xdist's controller) decides, its workers inherit the answer.
if USER_LEVEL not in os.environ:
  os.environ[USER_LEVEL] = (
      '1' if 'xla_backend_optimization_level' in os.environ.get('XLA_FLAGS', '') else '')
os.environ['XLA_FLAGS'] = with_flags(os.environ.get('XLA_FLAGS', ''), TEST_XLA_FLAGS)

# pylint: disable=g-import-not-at-top,wrong-import-position

from fl_privacy.eval import compile_cache

# Set in the controller and inherited by xdist's workers, so they share one directory.
_SESSION = 'FL_PRIVACY_TEST_SESSION_CACHE'


def pytest_configure(config):
  if compile_cache.ENV not in os.environ:
    directory = tempfile.mkdtemp(prefix='fl_privacy_test_jax_cache_')
    os.environ[compile_cache.ENV] = directory
    os.environ[_SESSION] = directory
  compile_cache.enable(os.environ[compile_cache.ENV])


def pytest_unconfigure(config):
  # Only the process that made the directory removes it (xdist's workers end first).
  directory = os.environ.get(_SESSION)
  if directory and not hasattr(config, 'workerinput'):
    shutil.rmtree(directory, ignore_errors=True)
