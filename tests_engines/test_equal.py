"""Same seed, same results on the engines: the recorded uploads and the FedMIA scores and the
canary audit's statistics on all three, the dishonest detector's decisions and the imprint
server's recoveries in process and on the deployment (the Simulation Engine's equality for
those is the default run's, docs/experiments/flower_audit.md: CI time), bit for bit (Flower
1.42 serialises float32 arrays as raw bytes: nothing is lost on the way, so no tolerance is
needed; only Flower's node ids differ). Both Flower engines run the repository's Flower App
(`flower_app/`) under `flwr run`: one SuperLink with 4 SuperNodes, and one SuperLink in
simulation mode (`--federation-config num-supernodes=4`), each shared by the module's jobs."""

from __future__ import annotations

import copy
import math

import jax
import numpy as np
import pytest

from configs import digits
from fl_privacy.flower.audits import canaries
from fl_privacy.flower.audits import canary_design
from fl_privacy.flower.audits import dp_setting
from fl_privacy.flower.engines import deployment
from fl_privacy.flower.engines import dispatch
from fl_privacy.flower.parts import dishonest
from fl_privacy.flower.parts import fedmia
from fl_privacy.flower.parts import pipeline
from fl_privacy.flower.parts import reconstruction

OTHERS = ('simulation', 'deployment')
# The canary game on 4 nodes (4 canaries, 2 of them in: the split needs both worlds in
# both halves), so one deployment of 4 SuperNodes serves
# every job of this module (the smoke config's FedMIA and imprint deployments have 4 too).
TINY = canary_design.Design(num_canaries=4, num_real=0, num_rounds=2, dimension=128, num_null=60)


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
  config = digits.get_config('smoke')
  config.flower_audit.reconstruction.num_nodes = 4
  # One member target: one crafted round a run (1 member and 3 non-member decisions).
  config.flower_audit.dishonest.targets_in = 1
  config.flower_audit.dishonest.targets_out = 0
  state = pipeline.prepare(config)
  root = tmp_path_factory.mktemp('engines')
  with deployment.LocalDeployment(4, root / 'deployment') as dep, dispatch.using(dep), \
      deployment.LocalDeployment(4, root / 'simulation', simulation=True) as sim, \
      dispatch.using(sim):
    yield config, state, jax.random.key(int(config.seed)), root


def _on(engine, setup):
  config, state, key, root = setup
  config = copy.deepcopy(config)
  config.flower_audit.engine = engine
  return config, dict(state, cache={}), key, str(root / engine)


def _equal_trees(a, b):
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _same_metrics(a, b, skip=()):
  assert set(a) == set(b)
  for k in a:
    if k in skip:
      continue
    x, y = a[k], b[k]
    if isinstance(x, float) and math.isnan(x):
      assert isinstance(y, float) and math.isnan(y), k
    else:
      assert x == y, (k, x, y)


def test_the_fedmia_deployment_records_the_same_uploads_and_scores(setup):
  runs, scores = {}, {}
  for engine in ('inprocess',) + OTHERS:
    config, state, key, workdir = _on(engine, setup)
    runs[engine] = fedmia.flower_deployment(config, state, key, 0, workdir)
    scores[engine] = fedmia.fedmia_point(config, state, key, 'flower', 'fedmia_i')[0]
  ref = runs['inprocess']
  assert ref['losses'] == []
  for engine in OTHERS:
    run = runs[engine]
    assert run['losses'] == []
    assert set(run['recording']) == set(ref['recording'])
    for name, value in ref['recording'].items():
      if name != 'node_ids':  # Flower assigns them
        np.testing.assert_array_equal(run['recording'][name], value, err_msg=name)
    assert not np.array_equal(run['recording']['node_ids'], ref['recording']['node_ids'])
    _equal_trees(run['final'], ref['final'])
    _same_metrics(scores[engine], scores['inprocess'])


def test_the_dishonest_server_decides_the_same(setup):
  """In process and on the deployment (the Simulation Engine: the default run's 300
  decisions, docs/experiments/flower_audit.md; CI time)."""
  out = {}
  for engine in ('inprocess', 'deployment'):
    config, state, key, workdir = _on(engine, setup)
    out[engine] = dishonest.dishonest_point(config, state, key, workdir)[0]
  assert out['inprocess']['n_pos'] >= 1 and out['inprocess']['n_neg'] >= 1
  _same_metrics(out['deployment'], out['inprocess'])


def test_the_canary_audit_reads_the_same_statistics(setup):
  """LocalDpMod draws its noise in the node's process: `canaries.seeding_mod` seeds it from
  (job seed, round, partition), so it is the same noise on every engine. (The central
  wrappers draw theirs in the server's process, which `jobs.serve` seeds: the default run's
  training part, equal on the Simulation Engine; CI time.)"""
  setting = dp_setting.Setting('local_dp', 'local_dp', clipping_norm=1.0, delta=1e-5,
                               num_sampled_clients=TINY.num_nodes, sensitivity=1.0,
                               epsilon=1.0)
  # A key whose coins put two canaries in each world.
  key = next(k for k in (jax.random.fold_in(setup[2], i) for i in range(64))
             if canary_design.canary_draws(jax.random.fold_in(k, 0), TINY)[0].sum() == 2)
  out = {}
  for engine in ('inprocess',) + OTHERS:
    workdir = _on(engine, setup)[3]
    out[engine] = canaries.audit(setting, TINY, key, engine=engine, workdir=workdir)
  for engine in OTHERS:
    _same_metrics(out[engine], out['inprocess'], skip=('seconds',))


def test_the_imprint_server_recovers_the_same_inputs(setup):
  out = {}
  for engine in ('inprocess', 'deployment'):
    config, state, key, workdir = _on(engine, setup)
    out[engine] = reconstruction.deployments(config, state, key, workdir)
  ref = out['inprocess']
  assert sum(rec[1].sum() for rec in ref['flower']) > 0  # something was recovered
  for engine in ('deployment',):
    assert out[engine]['losses'] == []
    for got, want in zip(out[engine]['flower'], ref['flower']):
      for x, y in zip(got, want):
        np.testing.assert_array_equal(x, y)
    for got, want in zip(out[engine]['native'], ref['native']):
      for x, y in zip(got, want):
        np.testing.assert_array_equal(x, y)
