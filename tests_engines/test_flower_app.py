"""The repository's Flower App (`flower_app/`) under `flwr run` on a simulation federation (a
SuperLink in simulation mode), equal to the in-process run of the same job. (Under `flwr run`
on a local deployment of SuperNodes it runs in every deployment test: `LocalDeployment.run`
submits each job with `flwr run flower_app`; `test_equal.py` compares those runs.)"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from configs import digits
from fl_privacy.flower.engines import deployment
from fl_privacy.flower.engines import dispatch
from fl_privacy.flower.parts import fedmia


@pytest.fixture(scope='module')
def job_and_reference():
  job = fedmia.fedmia_job(digits.get_config('smoke'), jax.random.key(3), 0)
  return job, dispatch.run_job('inprocess', job)


def _equal(out, ref):
  assert out['losses'] == [] and sorted(out['partitions'].values()) == [0, 1, 2, 3]
  for got, want in zip(out['result']['rounds'], ref['result']['rounds']):
    assert got.server_round == want.server_round
    for u, v in zip(got.uploads, want.uploads):
      for x, y in zip(jax.tree_util.tree_leaves(u), jax.tree_util.tree_leaves(v)):
        np.testing.assert_array_equal(x, y)
  for x, y in zip(jax.tree_util.tree_leaves(out['result']['final']),
                  jax.tree_util.tree_leaves(ref['result']['final'])):
    np.testing.assert_array_equal(x, y)


def test_flwr_run_on_a_simulation_federation_equals_the_in_process_run(job_and_reference,
                                                                      no_leftovers):
  job, ref = job_and_reference
  with deployment.LocalDeployment(job.num_nodes, no_leftovers / 'dep', simulation=True) as dep:
    out = dep.run(job, no_leftovers / 'job', timeout=600)
  _equal(out, ref)
