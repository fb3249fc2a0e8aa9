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


def rate_limits(ax, which: str = 'y', scale: float = 1.0) -> None:
  """Keeps a rate axis (TPR, accuracy, AUC: values in [0, `scale`]) inside that range.

  Matplotlib's margins would show impossible values below 0 or above `scale`; on a linear
  axis a sliver (1.5% of the span) stays on either side, so a marker at 0 or at `scale`
  draws whole. Call it after plotting (and after any shared axis got its data).
  """
  get, put = (ax.get_ylim, ax.set_ylim) if which == 'y' else (ax.get_xlim, ax.set_xlim)
  scale_kind = ax.get_yscale() if which == 'y' else ax.get_xscale()
  lo, hi = get()
  lo, hi = max(lo, 0.0), min(hi, scale)
  if scale_kind == 'linear':
    pad = 0.015 * (hi - lo)
    lo, hi = (lo - pad if lo <= pad else lo), (hi + pad if hi >= scale - pad else hi)
  elif scale_kind == 'symlog' and lo <= 0:
    # Near 0 a symlog axis is linear over `linthresh`: a sliver of it keeps 0 off the spine.
    axis = ax.yaxis if which == 'y' else ax.xaxis
    lo = -0.1 * axis.get_transform().linthresh
  put(lo, hi)


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
  problems += data_problems(fig)
  return problems


# -------------------------------------------------------------------------------------------
# What the data ink says: scales, intervals, visible series, reference lines, ticks.

# A rate's quantity leads or ends the label's head ('TPR at 0.1% FPR', 'test accuracy');
# 'rounds to FPR <= delta' is a count that merely mentions a rate, so it is no rate.
_RATE_FIRST = re.compile(r'^(TPR|FPR|TNR|FNR|AUC|accuracy)\b', re.I)
_RATE_LAST = re.compile(r'\b(TPR|FPR|TNR|FNR|AUC|accuracy|rate|test error|error rate)$', re.I)
_COUNT = re.compile(r'\b(rounds?|epochs?|number of|count)\b', re.I)
# Quantities along which one run passes through every value (a training's rounds): a band
# between two measured rounds follows states that existed. Anything else (epsilon, K) is a
# set of separate experiments, and a band between them invents measurements.
_TRAJECTORY = re.compile(r'\b(rounds?|epochs?|steps?|iterations?)\b', re.I)
_CLASSES = re.compile(r'(\d+)-class', re.I)


def _head_unit(label: str) -> tuple[str, list[str]]:
  """'TPR at 0.1% FPR (%, 95% CI)' -> ('TPR at 0.1% FPR', ['%', '95% CI'])."""
  head, _, rest = label.partition('(')
  unit = rest.rsplit(')', 1)[0]
  return head.strip(), [t.strip() for t in re.split(r'[,;]', unit) if t.strip()]


def rate_scale(label: str) -> float | None:
  """100 for a rate in percent, 1 for a fraction, None when `label` names no rate."""
  head, unit = _head_unit(label)
  if unit and unit[0].startswith('count'):
    return None
  percent = bool(unit) and unit[0].startswith('%')
  fraction = any(t.startswith('fraction') or t.endswith('fraction') for t in unit)
  if percent or fraction or _RATE_FIRST.search(head) or _RATE_LAST.search(head):
    return 100.0 if percent else 1.0
  return None


def _counts(label: str) -> bool:
  head, unit = _head_unit(label)
  return bool(_COUNT.search(head)) or (bool(unit) and unit[0].startswith('count'))


def _labelled_ticks(axis, lo: float, hi: float) -> list[tuple[float, str]]:
  """(location, text) of the major and minor ticks drawn with a label inside [lo, hi]."""
  out = []
  slack = (hi - lo) * 1e-9
  for minor in (False, True):
    ticks = axis.get_minor_ticks() if minor else axis.get_major_ticks()
    locs = list(axis.get_minorticklocs() if minor else axis.get_majorticklocs())
    fmt = axis.get_minor_formatter() if minor else axis.get_major_formatter()
    texts = fmt.format_ticks(locs) if locs else []
    shown = bool(ticks) and (ticks[0].label1.get_visible() or ticks[0].label2.get_visible())
    for loc, text in zip(locs, texts):
      if shown and text.strip() and lo - slack <= loc <= hi + slack:
        out.append((float(loc), text))
  return out


def _rgb(c) -> tuple:
  import matplotlib.colors as mcolors  # pylint: disable=g-import-not-at-top
  return tuple(np.round(mcolors.to_rgb(c), 3))


def _bands(ax) -> list:
  """The fill_between bands of `ax` (FillBetweenPolyCollection from matplotlib 3.10)."""
  return [c for c in ax.collections
          if type(c).__name__ in ('PolyCollection', 'FillBetweenPolyCollection')]


def _band_colours(band) -> set:
  """Colours a band shows: its fill, or its edge (and hatch) when it is not filled."""
  out = set()
  for colours in (band.get_facecolor(), band.get_edgecolor()):
    for c in np.atleast_2d(colours):
      if len(c) == 4 and c[3] > 0:
        out.add(_rgb(c))
  return out


def _display_path(coll):
  import matplotlib.path as mpath  # pylint: disable=g-import-not-at-top
  paths = coll.get_paths()
  if not paths:
    return None
  return coll.get_transform().transform_path(mpath.Path.make_compound_path(*paths))


def _inside(path, pts, tol: float = 1.5) -> np.ndarray:
  """Which display points lie in `path` or within `tol` pixels above or below it (an
  estimate on its interval's edge, e.g. 0 with a Clopper-Pearson lower bound of 0)."""
  pts = np.asarray(pts, float).reshape(-1, 2)
  hit = path.contains_points(pts)
  for dy in (-tol, tol):
    hit |= path.contains_points(pts + [0.0, dy])
  return hit


def _points(line) -> np.ndarray:
  """The finite display points of a data line."""
  xy = np.column_stack([np.asarray(line.get_xdata(), float).ravel(),
                        np.asarray(line.get_ydata(), float).ravel()])
  xy = xy[np.isfinite(xy).all(axis=1)]
  return line.get_transform().transform(xy) if len(xy) else xy.reshape(0, 2)


def _has_marker(line) -> bool:
  return line.get_marker() not in (None, 'None', 'none', '', ' ')


def _has_line(line) -> bool:
  return line.get_linestyle() not in ('None', 'none', '', ' ') and line.get_linewidth() > 0


def _series_lines(ax) -> list[tuple[str, object, object]]:
  """(label, data line, its ErrorbarContainer or None) of every labelled data series."""
  out = []
  of_errorbar = set()
  for cont in ax.containers:
    if type(cont).__name__ == 'ErrorbarContainer' and cont.lines[0] is not None:
      of_errorbar.add(id(cont.lines[0]))
      out.append((cont.get_label(), cont.lines[0], cont))
  for line in ax.get_lines():
    if id(line) in of_errorbar or line.get_transform() != ax.transData:
      continue  # error bar parts; markers in axes coordinates (`mark_unbounded`)
    if not line.get_label().startswith('_'):
      out.append((line.get_label(), line, None))
  return out


def _band_of(ax, line, taken=()):
  """The band in `line`'s colour that holds every point of `line` (none of `taken`), or None."""
  pts, colour = _points(line), _rgb(line.get_color())
  for band in _bands(ax):
    if id(band) in taken:
      continue
    path = _display_path(band)
    if path is not None and colour in _band_colours(band) and _inside(path, pts).all():
      return band
  return None


def _interval_problems(ax, name: str, ylabel: str) -> list[str]:
  """A measured rate (a series drawn with markers) shows its interval: error bars or a band."""
  problems = []
  trajectory = bool(_TRAJECTORY.search(_head_unit(ax.get_xlabel())[0]))
  for label, line, cont in _series_lines(ax):
    if not _has_marker(line):
      continue  # a curve (ROC) or a reference line, not a set of measured points
    if cont is not None:
      if not cont.has_yerr:
        problems.append(f'{name}: {label!r} plots measured rates ({ylabel!r}) without '
                        'their intervals: draw error bars or a band')
      continue
    if _band_of(ax, line) is None:
      problems.append(f'{name}: {label!r} plots measured rates ({ylabel!r}) without their '
                      'intervals: draw error bars or a band in its colour')
    elif not trajectory:
      xs = ', '.join(f'{x:g}' for x in sorted(set(np.asarray(line.get_xdata(), float))))
      problems.append(f'{name}: the band of {label!r} shades between measured points '
                      f'(x = {xs}), suggesting measurements in between: draw error bars at '
                      'the points')
  for cont in ax.containers:
    if type(cont).__name__ == 'BarContainer' and cont.errorbar is None:
      problems.append(f'{name}: bars {cont.get_label()!r} show measured rates ({ylabel!r}) '
                      'without error bars')
  return problems


def _band_overlap_problems(ax, name: str) -> list[str]:
  """Filled bands of one colour and alpha that overlap merge into one block."""
  owners = {}
  for label, line, _ in _series_lines(ax):
    band = _band_of(ax, line, taken=owners)  # two series never own one band
    if band is not None:
      owners[id(band)] = label
  filled = []
  for k, band in enumerate(_bands(ax)):
    face = np.atleast_2d(band.get_facecolor())
    if len(face) and face.shape[1] == 4 and face[0][3] > 0 and not band.get_hatch():
      filled.append((owners.get(id(band), f'band {k}'), tuple(np.round(face[0], 3)),
                     _display_path(band)))
  problems = []
  for i, (la, fa, pa) in enumerate(filled):
    for lb, fb, pb in filled[i + 1:]:
      if fa != fb or pa is None or pb is None:
        continue
      a, b = pa.get_extents(), pb.get_extents()
      x0, x1, y0, y1 = max(a.x0, b.x0), min(a.x1, b.x1), max(a.y0, b.y0), min(a.y1, b.y1)
      if x1 <= x0 or y1 <= y0:
        continue
      gx, gy = np.meshgrid(np.linspace(x0, x1, 40), np.linspace(y0, y1, 40))
      grid = np.column_stack([gx.ravel(), gy.ravel()])
      if (pa.contains_points(grid) & pb.contains_points(grid)).any():
        problems.append(f'{name}: the bands of {la!r} and {lb!r} share colour and alpha and '
                        'overlap: they merge into one block')
  return problems


def _hidden_problems(ax, name: str, in_legend: set) -> list[str]:
  """A series in a legend shows: not transparent, not all NaN, not under another line."""
  problems = []
  lines = ax.get_lines()
  order = {id(l): (l.get_zorder(), k) for k, l in enumerate(lines)}
  for label, line, _ in _series_lines(ax):
    if label not in in_legend:
      continue
    alpha = line.get_alpha()
    if not line.get_visible() or (alpha is not None and alpha == 0):
      problems.append(f'{name}: {label!r} is in the legend but drawn invisible (zero alpha)')
      continue
    pts = _points(line)
    if not len(pts):
      problems.append(f'{name}: {label!r} is in the legend but has no finite point (all NaN)')
      continue
    for other in lines:
      if (other is line or order[id(other)] < order[id(line)] or not other.get_visible() or
          other.get_transform() != ax.transData or (other.get_alpha() or 1.0) < 0.5):
        continue
      # The cover must be as wide wherever `line` puts ink: a solid stroke at least as thick
      # over its stroke, markers at least as large over its markers.
      if _has_line(line) and not (_has_line(other) and other.get_linestyle() == '-' and
                                  other.get_linewidth() >= line.get_linewidth()):
        continue
      if _has_marker(line) and not (_has_marker(other) and
                                    other.get_markersize() >= line.get_markersize()):
        continue
      theirs = _points(other)
      if not len(theirs):
        continue
      gap = np.abs(pts[:, None, :] - theirs[None, :, :]).max(axis=2).min(axis=1)
      if (gap <= 1.0).all():
        problems.append(f'{name}: {label!r} is in the legend but hidden behind '
                        f'{other.get_label()!r} (every point under it)')
        break
  return problems


def _reference_problems(ax, name: str, ylabel: str) -> list[str]:
  """A chance line holds for the series it spans: named when they differ, right for k classes."""
  problems = []
  quantities = [q.strip() for q in _head_unit(ylabel)[0].split(',') if q.strip()]
  series = [label for label, _, _ in _series_lines(ax)]
  scale = rate_scale(ylabel) or 1.0
  for line in ax.get_lines():
    label = line.get_label()
    ys = np.asarray(line.get_ydata(), float)
    if not label.lower().startswith('chance') or not len(ys) or np.ptp(ys) > 0:
      continue  # horizontal chance lines only: a diagonal (ROC) has no single level
    level = float(ys[0]) / scale
    named = ' for ' in label
    if len(quantities) > 1 and not named:
      problems.append(f'{name}: reference line {label!r} spans {", ".join(quantities)}, '
                      'whose chance levels differ: say which series it is for')
    for text in ([label] if named else series + [ylabel]):
      m = _CLASSES.search(text)
      if m and abs(level - 1.0 / int(m.group(1))) > 1e-6:
        problems.append(f'{name}: reference line {label!r} at {level:g} is wrong for '
                        f'{text!r}: chance for {m.group(1)} classes is '
                        f'{1.0 / int(m.group(1)):g}')
  return problems


def data_problems(fig) -> list[str]:
  """What misleads in the data ink of `fig`; empty when nothing does.

  `readability_problems` calls it. Per axes showing data:
  - a rate axis (TPR, FPR, accuracy, AUC, test error; `(fraction)` or `(%...)`) stays in
    [0, 1] or [0, 100] (2% of the span beyond, so that edge markers draw whole);
  - panels with the same y label share one y scale, unless the label says `per panel`;
  - a series of measured rates (drawn with markers) shows its interval, error bars or a
    band in its colour; a band only along a trajectory (rounds, epochs), not between
    separate measurements (epsilons), where it would suggest measurements in between;
  - filled bands of one colour and alpha do not overlap;
  - a legend entry's series shows: not transparent, not all NaN, not under another line;
  - a horizontal chance line says which series it is for when the y label names several
    quantities, and is 1/k for a k-class accuracy;
  - a count axis (rounds, epochs, `(count)`) labels whole numbers only;
  - a log axis labels at least two ticks.
  """
  fig.canvas.draw()
  problems = []
  legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
  legends += list(fig.legends)
  in_legend = {t.get_text() for lg in legends for t in lg.get_texts()}
  shown = [ax for ax in fig.axes if ax.axison and ax.has_data()]
  names = {id(ax): ax.get_title() or f'axes {i}' for i, ax in enumerate(shown)}
  for ax in shown:
    name, ylabel = names[id(ax)], ax.get_ylabel()
    for which, label, limits in (('x', ax.get_xlabel(), ax.get_xlim()),
                                 ('y', ylabel, ax.get_ylim())):
      lo, hi = min(limits), max(limits)
      scale = rate_scale(label)
      pad = 0.02 * (hi - lo) + 1e-12
      if scale is not None and (lo < -pad or hi > scale + pad):
        problems.append(f'{name}: {which} axis {label!r} is a rate in [0, {scale:g}] but '
                        f'spans {lo:.3g} to {hi:.3g}')
      axis = ax.xaxis if which == 'x' else ax.yaxis
      ticks = _labelled_ticks(axis, lo, hi)
      if _counts(label):
        odd = [text for loc, text in ticks if abs(loc - round(loc)) > 1e-9]
        if odd:
          problems.append(f'{name}: {which} axis {label!r} counts whole units but labels '
                          f'ticks at {", ".join(odd)}: tick whole numbers only')
      kind = ax.get_xscale() if which == 'x' else ax.get_yscale()
      shared = ax.get_shared_x_axes() if which == 'x' else ax.get_shared_y_axes()
      labelled_elsewhere = not ticks and len(shared.get_siblings(ax)) > 1
      if kind in ('log', 'symlog') and len(ticks) < 2 and not labelled_elsewhere:
        texts = ', '.join(t for _, t in ticks) or 'none'
        problems.append(f'{name}: {kind} {which} axis {label!r} labels {len(ticks)} tick(s) '
                        f'({texts}): a log axis needs at least two labelled ticks')
    if rate_scale(ylabel) is not None:
      problems += _interval_problems(ax, name, ylabel)
    problems += _band_overlap_problems(ax, name)
    problems += _hidden_problems(ax, name, in_legend)
    problems += _reference_problems(ax, name, ylabel)
  by_label: dict[str, list] = {}
  for ax in shown:
    if ax.get_ylabel().strip() and 'per panel' not in ax.get_ylabel():
      by_label.setdefault(ax.get_ylabel(), []).append(ax)
  for label, group in by_label.items():
    scales = {(ax.get_yscale(), *np.round(sorted(ax.get_ylim()), 9)) for ax in group}
    if len(scales) > 1:
      problems.append(f'panels {", ".join(repr(names[id(ax)]) for ax in group)} show '
                      f'{label!r} on different y scales: share the y axis (sharey) so that '
                      'equal gaps read as equal')
  return problems
