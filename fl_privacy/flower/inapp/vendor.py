"""Copies the in-app canary files into a user's Flower app.

`python -m fl_privacy.flower.inapp.vendor DEST`, DEST the app's package folder (the one
holding its client_app.py and server_app.py): writes `DEST/fl_privacy_canaries.py` and
`DEST/fl_privacy_canary_strategy.py`, byte for byte this folder's (numpy and flwr only, so the
app's pyproject.toml declares nothing new). The same as
`cp fl_privacy/flower/inapp/fl_privacy_canar*.py DEST/`. Prints the paths written; bad input
is one line naming DEST, exit 2, nothing written.
"""

from __future__ import annotations

import pathlib
import shutil
import sys

FILES = ('fl_privacy_canaries.py', 'fl_privacy_canary_strategy.py')
HERE = pathlib.Path(__file__).parent


def vendor(dest: str | pathlib.Path) -> list[pathlib.Path]:
  """The paths FILES were copied to, in the folder `dest` (ValueError if it is none)."""
  folder = pathlib.Path(dest)
  if not folder.is_dir():
    raise ValueError(f'DEST: {dest} is not a folder (give your app\'s package folder, the one '
                     'holding its client_app.py)')
  written = []
  for name in FILES:
    shutil.copyfile(HERE / name, folder / name)
    written.append(folder / name)
  return written


def main(argv: list[str]) -> int:
  if len(argv) != 1 or argv[0].startswith('-'):
    print('usage: python -m fl_privacy.flower.inapp.vendor DEST (your app\'s package folder)',
          file=sys.stderr)
    return 2
  try:
    paths = vendor(argv[0])
  except ValueError as e:
    print(e, file=sys.stderr)
    return 2
  print('\n'.join(str(p) for p in paths))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
