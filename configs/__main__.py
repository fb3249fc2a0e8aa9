"""Lists the config files, what each is for and which experiment sections it carries.

  python -m configs            # one line per config: sections and the experiments they run
  python -m configs digits     # one config: its docstring and every field

A config runs with `python -m experiments.<name> --config=configs/<file>.py[:arg]`; an
experiment needs its section (e.g. `ami` for `experiments.ami`).
"""

from __future__ import annotations

import importlib
import os
import sys

import ml_collections

from fl_privacy import catalog

HERE = os.path.dirname(os.path.abspath(__file__))

# Which experiments read each section (`fl_privacy.catalog`).
SECTION_EXPERIMENTS = {s: catalog.experiments_reading(s)
                       for s in dict.fromkeys(e.section for e in catalog.EXPERIMENTS.values())}


def config_names() -> list[str]:
  """The config files of this folder (without `.py`), helpers (`_*.py`) left out."""
  return sorted(f[:-3] for f in os.listdir(HERE)
                if f.endswith('.py') and not f.startswith('_'))


def describe(name: str) -> dict:
  """`{'name', 'summary', 'data', 'sections', 'experiments', 'doc', 'config'}` of one config."""
  module = importlib.import_module(f'configs.{name}')
  config = module.get_config(None)
  doc = (module.__doc__ or '').strip()
  first = ' '.join(doc.split('\n\n')[0].split())
  summary = first.split('. ')[0].rstrip('.') + '.' if first else ''
  sections = [k for k in SECTION_EXPERIMENTS if k in config]
  data = config.data.name if 'data' in config else '-'
  return {
      'name': name, 'summary': summary, 'data': data,
      'sections': sections,
      'experiments': [e for s in sections for e in SECTION_EXPERIMENTS[s]],
      'doc': doc, 'config': config,
  }


def listing() -> str:
  """The table printed by `python -m configs`."""
  rows = [describe(n) for n in config_names()]
  width = max(len(r['name']) for r in rows) + 3
  lines = ['Configs (python -m experiments.<experiment> --config=configs/<name>.py[:smoke]):', '']
  for r in rows:
    lines.append(f'{r["name"] + ".py":<{width}} {r["summary"]}')
    lines.append(f'{"":<{width}} data: {r["data"]}; sections: {", ".join(r["sections"])}; '
                 f'experiments: {", ".join(r["experiments"])}')
  lines += ['', 'Details of one config: python -m configs <name>. Every experiment without '
            '--config runs digits.py (toy_game: toy.py).']
  return '\n'.join(lines)


def details(name: str) -> str:
  r = describe(name)
  config: ml_collections.ConfigDict = r['config']
  return f'configs/{name}.py\n\n{r["doc"]}\n\nFields (defaults):\n{config}'


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what the shell reports for a C tool cut off by `head`


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    name = argv[1].removesuffix('.py').split('/')[-1]
    if name not in config_names():
      print(f'error: no config {name!r}; known: {", ".join(config_names())}', file=sys.stderr)
      return 2
    return _print(details(name))
  return _print(listing())


def _print(text: str) -> int:
  """Prints `text` to stdout; a reader that stopped early (`| head -1`) is not an error."""
  try:
    print(text, flush=True)
  except BrokenPipeError:
    # The interpreter flushes stdout again at exit and would report the same broken pipe
    # there; pointing the descriptor at /dev/null makes that flush succeed silently.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
