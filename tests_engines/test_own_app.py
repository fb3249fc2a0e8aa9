"""The recipe of docs/experiments/flower_own_app.md on Flower's Deployment Engine, laid out as
a user would: an app folder whose pyproject.toml declares only flwr and numpy, a package
`my_app` holding the user's app (`tests_engines/own_app_part.py` copied as `my_app/task.py`)
and the two in-app files vendored beside it (`fl_privacy.flower.inapp.vendor`); a local
SuperLink with 2 real and 4 canary SuperNodes (`--node-config "canary-index=i ..."`), the app
submitted with `flwr run`. The analysis of its recording equals that of the same app run on an
`InProcessGrid` (Flower's grid returns replies in arrival order and gives nodes random ids, so
FedAvg sums the same float32 replies in another order: equal up to that rounding), and its
ServerApp process imported neither JAX nor fl_privacy."""

from __future__ import annotations

import importlib
import json
import math
import pathlib
import shutil
import sys

import numpy as np
import pytest

from flwr.common.constant import SUPERLINK_NODE_ID

from fl_privacy.flower.audits import user_app
from fl_privacy.flower.engines import deployment
from fl_privacy.flower.engines import inprocess
from fl_privacy.flower.inapp import vendor

NUM_REAL, NUM_CANARIES = 2, 4
PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "my-app"
version = "1.0.0"
description = "A user's own Flower App with canary SuperNodes beside its real ones"
license = "Apache-2.0"
dependencies = ["flwr>=1.42,<1.43", "numpy"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fl-privacy"

[tool.flwr.app.components]
serverapp = "my_app.task:server_app"
clientapp = "my_app.task:client_app"

[tool.flwr.app.config]
{config}
"""


def _toml(value):
  return json.dumps(value) if isinstance(value, str) else repr(value)


def _canary_seed() -> int:
  """The first seed whose 4 coins put two canaries in each world (the split needs both)."""
  return next(s for s in range(100)
              if sum(user_app.canary_coin(s, i) for i in range(NUM_CANARIES)) == 2)


def _close(a, b, key):
  if isinstance(a, float) and math.isnan(a):
    assert isinstance(b, float) and math.isnan(b), key
  elif isinstance(a, float):
    assert b == pytest.approx(a, rel=1e-5, abs=1e-9), (key, a, b)
  else:
    assert a == b, (key, a, b)


def _user_app_folder(root: pathlib.Path) -> pathlib.Path:
  """The user's app folder: their package with the vendored files, their pyproject."""
  package = root / 'my_app'
  package.mkdir(parents=True)
  (package / '__init__.py').write_text('')
  shutil.copyfile(pathlib.Path(__file__).with_name('own_app_part.py'), package / 'task.py')
  vendor.vendor(package)
  return root


def test_a_users_app_with_vendored_canaries_audits_as_in_process(no_leftovers, monkeypatch):
  seed = _canary_seed()
  nodes = NUM_REAL + NUM_CANARIES
  app = _user_app_folder(no_leftovers / 'app')
  monkeypatch.syspath_prepend(str(app))
  monkeypatch.delitem(sys.modules, 'my_app', raising=False)
  task = importlib.import_module('my_app.task')  # the user's in-process rehearsal
  configs = [{} for _ in range(NUM_REAL)] + task.canary_configs(NUM_CANARIES, seed)
  base = {'canary-seed': seed, 'num-nodes': nodes}

  grid = inprocess.InProcessGrid([task.client_app] * nodes, node_configs=configs)
  with inprocess.task_identity(grid.run.run_id, SUPERLINK_NODE_ID):
    task.serve(grid, {**base, 'out': str(no_leftovers / 'inprocess')})
  ref = user_app.audit_recording(*user_app.load_rounds(
      no_leftovers / 'inprocess' / user_app.ROUNDS_FILE))

  declared = {**task.CONFIG, **base}
  (app / 'pyproject.toml').write_text(PYPROJECT.format(config='\n'.join(
      f'{k} = {_toml(v)}' for k, v in declared.items())), encoding='utf-8')
  out = no_leftovers / 'deployment'
  with deployment.LocalDeployment(nodes, no_leftovers / 'dep', node_configs=configs) as dep:
    run_id = dep.submit({'out': str(out)}, app_dir=app)
    entry = dep.wait(run_id, timeout=900)
  assert entry['status'] == 'finished:completed', entry
  # The analysis, on the laptop: the command over the deployment's recording.
  assert user_app.main([str(out), f'--workdir={no_leftovers / "analysis"}']) == 0
  got = json.loads((no_leftovers / 'analysis' / user_app.RESULTS).read_text())

  # The canaries were found by the query and kept their indices; the worlds are the seed's.
  assert (ref['num_canaries'], ref['n_in'], ref['n_out']) == (NUM_CANARIES, 2, 2)
  meta, rounds = user_app.load_rounds(out / user_app.ROUNDS_FILE)
  ref_meta, ref_rounds = user_app.load_rounds(no_leftovers / 'inprocess' / user_app.ROUNDS_FILE)
  assert sorted(meta['canary_nodes'].values()) == list(range(NUM_CANARIES))
  assert meta['canary_nodes'] != ref_meta['canary_nodes']  # Flower's own node ids
  for r, s in zip(rounds, ref_rounds):
    assert r.sampled.all() and r.replied.all() and r.num_messages == nodes
    np.testing.assert_allclose(r.before, s.before, rtol=0, atol=1e-6)
    np.testing.assert_allclose(r.after, s.after, rtol=0, atol=1e-6)
  # The one-run bounds read only ranks: no two scores are within rounding of each other, so
  # the same ranks, the same bounds.
  scores, _, _ = user_app.statistics(ref_rounds, NUM_CANARIES, user_app.DEFAULT_THREATS)
  for s in scores.values():
    assert np.min(np.diff(np.sort(s))) > 1e-4 * np.max(np.abs(s))
  assert set(got) == set(ref)
  for key, value in ref.items():
    _close(value, math.nan if got[key] is None else got[key], key)
  assert got['stated_epsilon_source'].startswith('flwr privacy_spent()')
  assert got['dp_accounting_epsilon'] == pytest.approx(got['stated_epsilon'], rel=1e-9)
  with np.load(out / 'final.npz') as f, np.load(no_leftovers / 'inprocess' / 'final.npz') as g:
    np.testing.assert_allclose(f['model'], g['model'], rtol=0, atol=1e-6)
    evaluate, ref_evaluate = json.loads(str(f['evaluate'])), json.loads(str(g['evaluate']))
    assert json.loads(str(f['heavy'])) == []  # the ServerApp process: no JAX, no fl_privacy
  assert set(evaluate) == {'1', '2'}
  for r, metrics in ref_evaluate.items():
    assert evaluate[r]['eval_loss'] == pytest.approx(metrics['eval_loss'], rel=1e-5)
