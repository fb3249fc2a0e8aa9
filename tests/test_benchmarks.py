"""The benchmarks' references compute what the library computes, and every source compiles.

A benchmark's reference is only a reference while it does the same work: `fedmia_measure`'s
stopped running when `queries.Measurements` gained `margin`, and nothing noticed until a run
on an accelerator.
"""

import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import fedmia_measure
from fl_privacy import models as models_lib
from fl_privacy.fl import queries

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_fedmia_measure_reference_equals_queries_measure():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.random((13, 6), dtype=np.float32))  # not a multiple of its batch of 10
  y = jnp.asarray(rng.integers(0, 3, 13).astype(np.int32))
  model = models_lib.MLP(hidden=(5,), num_classes=3)
  params = model.init(jax.random.key(1), x[:1])
  uploads = jax.tree_util.tree_map(
      lambda p: 0.3 * jax.random.normal(jax.random.key(2), (4,) + p.shape), params)
  ours = queries.measure(model.apply, params, uploads, x, y, chunk_size=4)
  ref = fedmia_measure.reference(model, params, uploads, x, y)
  assert ref._fields == ours._fields
  for name in ours._fields:
    np.testing.assert_allclose(getattr(ref, name), getattr(ours, name), rtol=2e-4, atol=2e-5,
                               err_msg=name)


def test_every_source_compiles_without_warnings():
  # Python 3.12 warns of an invalid escape ('\|' in a docstring) at import; later versions
  # will refuse it.
  paths = [p for d in ('fl_privacy', 'experiments', 'configs', 'benchmarks', 'tests', 'tools')
           for p in sorted((ROOT / d).rglob('*.py'))]
  assert len(paths) > 100
  for path in paths:
    with warnings.catch_warnings():
      warnings.simplefilter('error')
      compile(path.read_text(encoding='utf-8'), str(path), 'exec')
