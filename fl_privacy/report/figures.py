"""Saving matplotlib figures as PNG beside the results, atomically; making them readable.

Every figure of the pipelines labels both axes with a quantity and its unit or scale,
puts its legend beside the data (`legend_outside`), draws an unbounded estimate as a
marker on the top edge (`mark_unbounded`), and passes `readability_problems`, which the
tests run on every figure of the smoke runs.
"""

from __future__ import annotations

import io
import os
import re
import sys

import numpy as np

import matplotlib

# Results are written on headless machines; only pick the backend if nobody
# imported pyplot yet (switching later would disturb an interactive session).
if 'matplotlib.pyplot' not in sys.modules:
  matplotlib.use('Agg')

from fl_privacy.report import atomic  # pylint: disable=g-import-not-at-top


def save(fig, workdir: str | os.PathLike, name: str, *, dpi: int = 150) -> str:
  """Writes `fig` as `<workdir>/<name>.png` (atomic) and returns the path.

  Args:
    fig: a `matplotlib.figure.Figure`.
    workdir: the run folder (created if missing).
    name: file stem; characters other than letters, digits, `-_.=` become `_`.
    dpi: resolution.
  """
  stem = name[:-4] if name.lower().endswith('.png') else name
  stem = re.sub(r'[^A-Za-z0-9_.=-]', '_', stem)
  if not stem:
    raise ValueError(f'empty figure name (got {name!r})')
  os.makedirs(workdir, exist_ok=True)
  buf = io.BytesIO()
  fig.savefig(buf, format='png', dpi=dpi, bbox_inches='tight')
  path = os.path.join(os.fspath(workdir), stem + '.png')
  atomic.atomic_write_bytes(path, buf.getvalue())
  return path


# -------------------------------------------------------------------------------------------
# Figures that read on their own: legends beside the data, unbounded values, a checker.

EPSILON_AXIS = 'claimed epsilon (nats)'
RATE_AXIS = 'rate (fraction of trials)'


def legend_outside(ax, **kw):
  """A legend to the right of `ax`, outside its data area (so it never hides a point)."""
  kw.setdefault('fontsize', 7)
  return ax.legend(loc='upper left', bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kw)


def figure_legend(fig, **kw):
  """One legend for the whole figure, right of every axes: each label once, from any axes.

  Call it after `fig.tight_layout()`; `save` crops to include it.
  """
  handles, labels = [], []
  for ax in fig.axes:
    for h, l in zip(*ax.get_legend_handles_labels()):
      if l not in labels:
        handles.append(h)
        labels.append(l)
  kw.setdefault('fontsize', 7)
  # Anchored beside the top of the rightmost axes: below any suptitle, right of all data.
  boxes = [ax.get_position() for ax in fig.axes if ax.axison]
  x = max(b.x1 for b in boxes) + 0.01 if boxes else 1.0
  y = max(b.y1 for b in boxes) if boxes else 0.97
  return fig.legend(handles, labels, loc='upper left', bbox_to_anchor=(x, y),
                    borderaxespad=0.0, **kw)


def mark_unbounded(ax, x: float, lower: float | None, *, color=None, label=None,
                   text: str = 'inf') -> None:
  """Draws an unbounded estimate at `x` as a marker on the top edge, not as a data point.

  A caret sits on the upper edge of the axes (axes coordinates, so it does not stretch
  the y range) with `text` beside it; where the estimate has a finite lower bound, a
  dotted line rises from it to the edge, because that bound is all that was measured.

  Args:
    ax: the axes.
    x: data x of the point.
    lower: the finite lower bound (None or inf: no line).
    color: marker colour (that of the series).
    label: legend label of the marker (give it once per series).
    text: annotation beside the marker.
  """
  import matplotlib.transforms as mtransforms  # pylint: disable=g-import-not-at-top
  blend = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
  ax.plot([x], [0.985], marker='^', ms=7, color=color, transform=blend, clip_on=False,
          ls='none', label=label)
  # Written downwards beside the marker, so neighbouring markers' texts do not collide.
  ax.annotate(text, (x, 0.985), xycoords=blend, xytext=(3, -6), textcoords='offset points',
              fontsize=7, color=color, rotation=90, ha='left', va='top')
  if lower is not None and np.isfinite(lower):
    top = ax.get_ylim()[1]
    ax.plot([x, x], [lower, top], ls=':', lw=1, color=color, label='_nolegend_')
    ax.set_ylim(top=top)


def spread_annotations(ax, *, step: float = 7.0, tries: int = 12) -> None:
  """Moves `ax`'s annotations (offset-points text) up or down until none overlaps another.

  Call it after the layout is final (after `fig.tight_layout()`): overlaps depend on the
  axes' size in pixels. Each annotation keeps its anchor point; only its offset changes,
  alternately above and below where it was, by `step` points at a time.
  """
  import matplotlib.text as mtext  # pylint: disable=g-import-not-at-top
  fig = ax.figure
  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  placed = []
  for t in ax.texts:
    if not isinstance(t, mtext.Annotation) or not t.get_text():
      continue
    x0, y0 = t.xyann
    for k in range(tries + 1):
      shift = step * ((k + 1) // 2) * (1 if k % 2 else -1)
      t.xyann = (x0, y0 + shift)
      box = t.get_window_extent(renderer).padded(2)  # a gap, so that '1' '0.1' is no '10.1'
      if not any(box.overlaps(b) for b in placed):
        break
    placed.append(t.get_window_extent(renderer).padded(2))


def _label_is_auto(label: str) -> bool:
  return label.startswith('_child') or label.startswith('_container') or label == ''


def readability_problems(fig) -> list[str]:
  """What keeps `fig` from reading on its own; empty when nothing does.

  Checks every axes that shows data: an x and a y label, each naming its unit or scale in
  parentheses (`rate (fraction of trials)`); every line, scatter and bar series labelled
  and present in some legend; a legend wherever an axes has more than one series; no
  legend over any axes' data area; no title overlapping another title or an axes.
  """
  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  problems = []
  legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
  legends += list(fig.legends)
  in_legend = {t.get_text() for lg in legends for t in lg.get_texts()}
  shown = [ax for ax in fig.axes if ax.axison and ax.has_data()]
  for i, ax in enumerate(shown):
    name = ax.get_title() or f'axes {i}'
    for which, text in (('x', ax.get_xlabel()), ('y', ax.get_ylabel())):
      if not text.strip():
        problems.append(f'{name}: no {which} label')
      elif '(' not in text:
        problems.append(f'{name}: {which} label {text!r} names no unit or scale in (...)')
    # `_nolegend_` marks the parts of an errorbar (its container carries the label) and
    # repeats of a labelled series; every other line, scatter and bar series counts.
    series = []
    for line in ax.get_lines():
      if line.get_label() != '_nolegend_':
        series.append(('line', line.get_label()))
    for coll in ax.collections:
      if type(coll).__name__ == 'PathCollection' and coll.get_label() != '_nolegend_':
        series.append(('scatter', coll.get_label()))
    # A bar series' error bars are its own (`BarContainer.errorbar`), not another series.
    of_bars = {id(c.errorbar) for c in ax.containers
               if type(c).__name__ == 'BarContainer' and c.errorbar is not None}
    for cont in ax.containers:
      if type(cont).__name__ == 'ErrorbarContainer' and id(cont) not in of_bars:
        series.append(('errorbar', cont.get_label()))
      elif type(cont).__name__ == 'BarContainer':
        labels = [cont.get_label()] + [p.get_label() for p in cont.patches]
        labels = [l for l in labels if l and not l.startswith('_')]
        series.append(('bars', labels[0] if labels else '_container'))
    for kind, label in series:
      if _label_is_auto(label):
        problems.append(f'{name}: a {kind} without a label')
      elif label not in in_legend:
        problems.append(f'{name}: {kind} {label!r} is in no legend')
    if len(series) > 1 and ax.get_legend() is None and not fig.legends and not legends:
      problems.append(f'{name}: {len(series)} series and no legend')
  boxes = [(ax.get_title() or f'axes {i}', ax.get_window_extent(renderer), ax)
           for i, ax in enumerate(shown)]
  for lg in legends:
    lb = lg.get_window_extent(renderer)
    for name, box, _ in boxes:
      if lb.overlaps(box):
        problems.append(f'legend overlaps the data area of {name}')
  titles = [(ax.title.get_text(), ax.title.get_window_extent(renderer), ax)
            for ax in shown if ax.title.get_text()]
  suptitle = fig._suptitle  # pylint: disable=protected-access
  if suptitle is not None and suptitle.get_text():
    titles.append((suptitle.get_text(), suptitle.get_window_extent(renderer), None))
  for lg in legends:
    lb = lg.get_window_extent(renderer)
    for text, box, _ in titles:
      if lb.overlaps(box):
        problems.append(f'a legend overlaps the title {text!r}')
  for ax in shown:
    notes = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts if t.get_text()]
    for j, (text, box) in enumerate(notes):
      for text2, box2 in notes[j + 1:]:
        if box.overlaps(box2):
          problems.append(f'annotations {text!r} and {text2!r} overlap')
  for j, (text, box, owner) in enumerate(titles):
    for text2, box2, _ in titles[j + 1:]:
      if box.overlaps(box2):
        problems.append(f'titles {text!r} and {text2!r} overlap')
    for name, abox, ax in boxes:
      if ax is not owner and box.overlaps(abox):
        problems.append(f'title {text!r} overlaps the data area of {name}')
  return problems
