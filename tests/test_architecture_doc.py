"""docs/ARCHITECTURE.md covers every package of fl_privacy and names every experiment script.

Convention: a package `fl_privacy/<path>/` (a directory with `__init__.py`) has a Markdown
heading that contains its path in backticks with a trailing slash, e.g.
"## attacks.ami (`fl_privacy/attacks/ami/`)"; the top-level package's heading holds
`` `fl_privacy/` ``. An experiment script is `experiments/<name>.py` with a
`if __name__ == '__main__':` block, and the document names it as `experiments/<name>.py`.
"""

from __future__ import annotations

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
DOC = REPO / 'docs' / 'ARCHITECTURE.md'


def _packages() -> list[str]:
  root = REPO / 'fl_privacy'
  return sorted(str(init.parent.relative_to(REPO)) + '/' for init in root.rglob('__init__.py'))


def _headings(text: str) -> list[str]:
  return [line for line in text.splitlines() if re.match(r'#{1,6} ', line)]


def _experiment_scripts() -> list[str]:
  scripts = []
  for path in sorted((REPO / 'experiments').glob('*.py')):
    if re.search(r"^if __name__ == ['\"]__main__['\"]:", path.read_text(), re.MULTILINE):
      scripts.append(f'experiments/{path.name}')
  return scripts


def test_finds_the_packages_and_scripts():
  # Guards the discovery itself: an empty list would make the checks below vacuous.
  packages = _packages()
  assert 'fl_privacy/' in packages and 'fl_privacy/attacks/ami/' in packages
  assert len(packages) >= 10
  assert 'experiments/ami.py' in _experiment_scripts()
  assert 'experiments/common.py' not in _experiment_scripts()


def test_every_package_has_a_section():
  headings = _headings(DOC.read_text())
  missing = [p for p in _packages() if not any(f'`{p}`' in h for h in headings)]
  assert not missing, f'docs/ARCHITECTURE.md has no heading naming {missing}'


def test_every_experiment_script_is_named():
  text = DOC.read_text()
  missing = [s for s in _experiment_scripts() if s not in text]
  assert not missing, f'docs/ARCHITECTURE.md does not name {missing}'
