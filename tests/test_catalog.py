"""The one registration of experiments (fl_privacy/catalog.py) and the pipeline interface.

Every reader of "which experiments exist" derives from the catalog, every registered pipeline
satisfies `pipelines.base.Pipeline`, every script is one `common.run(name)` line, and
`base.sweep` runs a plan as the interface promises (compute once, `after` always, figures last).
"""

from __future__ import annotations

import pathlib
import re
import sys
import types

import ml_collections
import pytest

from fl_privacy import catalog
from fl_privacy.defenses import registry
from fl_privacy.pipelines import base
from fl_privacy.report import ResultsStore

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize('name', catalog.NAMES)
def test_every_registered_pipeline_satisfies_the_interface(name):
  if catalog.get(name).pipeline.startswith('fl_privacy.flower.'):
    pytest.importorskip('flwr')  # the optional extra `.[flower]`
  module = base.load(name)
  assert isinstance(module, base.Pipeline)
  assert module.NAME == name
  assert module.__name__ == catalog.get(name).pipeline


def test_every_script_is_one_registration_and_every_registration_has_a_script():
  scripts = {}
  for path in (REPO / 'experiments').glob('*.py'):
    m = re.search(r"^if __name__ == '__main__':\n  common\.run\('(\w+)'\)\s*$", path.read_text(),
                  re.MULTILINE)
    if m:
      scripts[path.stem] = m.group(1)
  assert scripts == {n: n for n in catalog.NAMES}


def test_every_reader_derives_from_the_catalog():
  from configs import _base  # pylint: disable=g-import-not-at-top
  from configs import __main__ as listing  # pylint: disable=g-import-not-at-top
  from experiments import common  # pylint: disable=g-import-not-at-top
  assert _base.EXPERIMENTS == catalog.SECTIONS == (
      'ami', 'dishonest', 'ldp_audit', 'fedmia', 'pastel', 'dp_audit', 'flower_audit',
      'training_audit', 'reconstruction', 'dp_bugs')
  assert _base.DEFENDED == ('ami', 'dishonest', 'reconstruction')
  assert common.SECTIONS == {n: e.section for n, e in catalog.EXPERIMENTS.items()}
  assert listing.SECTION_EXPERIMENTS['dishonest'] == ('dishonest_mia', 'duplicates')
  assert registry.ADVERSARY['fedmia'] == 'server' and registry.ADVERSARY['pastel'] is None
  for section in catalog.SECTIONS:
    assert (REPO / 'configs' / f'_{section}.py').is_file(), section


def test_unknown_names_and_adversaries_are_refused():
  with pytest.raises(KeyError, match='unknown experiment'):
    catalog.get('nope')
  with pytest.raises(ValueError, match='adversary'):
    catalog.Experiment('x', 'x', 'x', adversary='clients')
  assert catalog.adversary('nope') is None


def test_load_refuses_a_module_that_is_not_a_pipeline(monkeypatch):
  fake = types.ModuleType('fake_pipeline')
  fake.NAME, fake.SUMMARY = 'fake', None
  fake.validate_config = fake.prepare = fake.figures = lambda *a: None
  monkeypatch.setitem(sys.modules, 'fake_pipeline', fake)
  monkeypatch.setitem(catalog.EXPERIMENTS, 'fake',
                      catalog.Experiment('fake', 'toy', 'fake_pipeline'))
  with pytest.raises(TypeError, match=r"lacks \['plan'\]"):
    base.load('fake')
  fake.plan = lambda *a: []
  assert base.load('fake') is fake
  fake.NAME = 'other'
  with pytest.raises(TypeError, match='registered as'):
    base.load('fake')


def test_sweep_computes_each_point_once_calls_after_always_and_figures_last(tmp_path):
  calls = []

  class Fake:
    NAME, SUMMARY = 'fake', None

    @staticmethod
    def plan(config, state, store, key):
      return [base.Point({'i': i}, lambda i=i: (calls.append(('compute', i)) or {'v': i * i}, 1),
                         after=lambda m, i=i: calls.append(('after', i, m['v'])))
              for i in range(3)]

    @staticmethod
    def figures(config, state, store, key):
      calls.append(('figures', len(store.points)))

  config = ml_collections.ConfigDict({'seed': 0})
  store = ResultsStore(str(tmp_path / 'run'), 'fake', config)
  base.sweep(Fake, config, None, store, None)
  assert calls == [('compute', 0), ('after', 0, 0), ('compute', 1), ('after', 1, 1),
                   ('compute', 2), ('after', 2, 4), ('figures', 3)]
  calls.clear()
  store = ResultsStore(str(tmp_path / 'run'), 'fake', config)  # resumed: nothing recomputed
  base.sweep(Fake, config, None, store, None)
  assert calls == [('after', 0, 0), ('after', 1, 1), ('after', 2, 4), ('figures', 3)]
