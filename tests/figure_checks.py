"""Test helper: render a pipeline's figures and collect what keeps each from reading alone."""

from __future__ import annotations

import contextlib

from fl_privacy.report import figures


@contextlib.contextmanager
def capture(monkeypatch):
  """Within the block, every `figures.save` records `{name: problems}` and writes nothing."""
  found: dict[str, list[str]] = {}

  def save(fig, workdir, name, **kw):
    del kw
    found[name] = figures.readability_problems(fig)
    return f'{workdir}/{name}.png'

  monkeypatch.setattr(figures, 'save', save)
  yield found
