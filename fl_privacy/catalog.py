"""The one registration of every experiment: its name, config section, pipeline and adversary.

A leaf (imports nothing of fl_privacy), so that every layer can read it: `configs/_base.py`
(which sections a dataset config may carry and which of them carry a `defense` section),
`experiments/common.py` (the section an experiment needs, `--help`), `configs/__main__.py`
(which experiments a config runs), `defenses.registry` (whom a defense must protect against)
and `pipelines.base` (the pipeline module behind `python -m experiments.<name>`).

Adding an experiment: a pipeline module that satisfies `pipelines.base.Pipeline`, its config
section (`configs/_<section>.py`), one `Experiment(...)` entry below, and the three-line script
`experiments/<name>.py` that hands its name to `experiments.common.run`.
"""

from __future__ import annotations

import dataclasses

ADVERSARIES = ('server', 'aggregate')


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One experiment.

  Attributes:
    name: `python -m experiments.<name>`; results.json's `experiment`.
    section: the config section it reads (`configs/_<section>.py` builds it; several
      experiments may read one section).
    pipeline: the module holding its `Pipeline` (imported only when the experiment runs).
    adversary: whom a defense must act against there: `server` (reads each upload),
      `aggregate` (reads only the aggregate) or None (the experiment labels each row itself,
      or runs no client defense).
    defended: whether its clients run the config's `defense` section (dataset configs that
      carry this experiment's section then carry a `defense` section too).
    default_config: the config used without `--config`, relative to the repository.
  """
  name: str
  section: str
  pipeline: str
  adversary: str | None = None
  defended: bool = False
  default_config: str = 'configs/digits.py'

  def __post_init__(self):
    if self.adversary not in ADVERSARIES + (None,):
      raise ValueError(f'{self.name}: adversary must be one of {ADVERSARIES} or None '
                       f'(got {self.adversary!r})')


def _entries(*experiments: Experiment) -> dict[str, Experiment]:
  return {e.name: e for e in experiments}


EXPERIMENTS: dict[str, Experiment] = _entries(
    Experiment('ami', 'ami', 'fl_privacy.pipelines.ami', adversary='server', defended=True),
    Experiment('dishonest_mia', 'dishonest', 'fl_privacy.pipelines.dishonest_mia',
               adversary='server', defended=True),
    Experiment('duplicates', 'dishonest', 'fl_privacy.pipelines.duplicates'),
    Experiment('ldp_audit', 'ldp_audit', 'fl_privacy.pipelines.ldp_audit'),
    Experiment('fedmia', 'fedmia', 'fl_privacy.pipelines.fedmia', adversary='server'),
    # PASTEL attacks both the uploads (the server) and the global model (readers of the
    # aggregate): it runs the aggregate-only baselines and labels each row (`dp_adversary`).
    Experiment('pastel', 'pastel', 'fl_privacy.pipelines.pastel'),
    Experiment('dp_audit', 'dp_audit', 'fl_privacy.pipelines.dp_audit'),
    # Needs the optional extra `pip install -e '.[flower]'` (experiments.common.run says so).
    Experiment('flower_audit', 'flower_audit', 'fl_privacy.flower.parts.pipeline',
               adversary='server'),
    # Audits each DP defense against the adversary its own declaration names.
    Experiment('training_audit', 'training_audit', 'fl_privacy.pipelines.training_audit'),
    # The server reads each upload; its clients run the `defense` section (and a swept list).
    Experiment('reconstruction', 'reconstruction', 'fl_privacy.pipelines.reconstruction',
               adversary='server', defended=True),
    # Documented DP bugs of FL stacks beside their correct twins; each row names its claim.
    Experiment('dp_bugs', 'dp_bugs', 'fl_privacy.pipelines.dp_bugs'),
    Experiment('toy_game', 'toy', 'fl_privacy.pipelines.toy_game',
               default_config='configs/toy.py'),
)
NAMES = tuple(EXPERIMENTS)

# The sections of the dataset configs (`configs/_<section>.py`), in order; `toy` lives in
# configs/toy.py alone.
SECTIONS = tuple(dict.fromkeys(e.section for e in EXPERIMENTS.values() if e.section != 'toy'))
# Sections whose experiments run the config's `defense` section.
DEFENDED_SECTIONS = tuple(dict.fromkeys(e.section for e in EXPERIMENTS.values() if e.defended))


def get(name: str) -> Experiment:
  """The entry of experiment `name` (KeyError naming the known ones)."""
  try:
    return EXPERIMENTS[name]
  except KeyError:
    raise KeyError(f'unknown experiment {name!r}; known: {NAMES}') from None


def section_of(name: str) -> str:
  """The config section experiment `name` reads."""
  return get(name).section


def experiments_reading(section: str) -> tuple[str, ...]:
  """The experiments that read config section `section`, in registration order."""
  return tuple(e.name for e in EXPERIMENTS.values() if e.section == section)


def adversary(name: str) -> str | None:
  """Whom a defense must act against in experiment `name` (None for an unknown name)."""
  e = EXPERIMENTS.get(name)
  return None if e is None else e.adversary
