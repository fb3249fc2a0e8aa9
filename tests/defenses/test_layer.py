"""`defenses` sits between `fl` and `eval`: it imports nothing above `fl`."""

from __future__ import annotations

import ast
import pathlib

import fl_privacy.defenses

ALLOWED = ('fl_privacy.validate', 'fl_privacy.accounting', 'fl_privacy.mechanisms', 'fl_privacy.fl',
           'fl_privacy.defenses')


def test_defenses_import_only_lower_layers():
  folder = pathlib.Path(fl_privacy.defenses.__file__).parent
  for path in folder.glob('*.py'):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
      names = []
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module:
        names = [node.module + ('.' + node.names[0].name if node.module == 'fl_privacy'
                                else '')]
      for name in names:
        if name.startswith('fl_privacy'):
          assert name.startswith(ALLOWED), f'{path.name} imports {name}'
