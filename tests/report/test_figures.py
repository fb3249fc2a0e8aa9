"""Tests of the figure helpers: the readability check can fail, unbounded values are marked."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position
from matplotlib import ticker  # pylint: disable=g-import-not-at-top,wrong-import-position

from fl_privacy.pipelines import ldp_audit_figures  # pylint: disable=wrong-import-position
from fl_privacy.report import figures  # pylint: disable=wrong-import-position


def test_check_flags_unlabelled_axes_series_and_legend_over_data():
  fig, ax = plt.subplots()
  ax.plot([0, 1, 2], [0, 1, 2], label='a')
  ax.plot([0, 1, 2], [2, 1, 0])
  ax.legend(loc='center')
  problems = figures.readability_problems(fig)
  plt.close(fig)
  assert any('no x label' in p for p in problems)
  assert any('no y label' in p for p in problems)
  assert any('without a label' in p for p in problems)
  assert any('legend overlaps' in p for p in problems)


def test_check_wants_a_unit_and_passes_a_readable_figure():
  fig, ax = plt.subplots()
  ax.plot([0, 1], [0, 1], label='a')
  ax.plot([0, 1], [1, 0], label='b')
  ax.set_xlabel('epsilon')
  ax.set_ylabel('rate (fraction of trials)')
  figures.rate_limits(ax)  # a rate stays in [0, 1] (its own check, below)
  figures.legend_outside(ax)
  problems = figures.readability_problems(fig)
  assert problems == ["axes 0: x label 'epsilon' names no unit or scale in (...)"]
  ax.set_xlabel(figures.EPSILON_AXIS)
  assert figures.readability_problems(fig) == []
  plt.close(fig)


def test_check_reads_a_bar_series_label_and_its_own_error_bars():
  fig, ax = plt.subplots()
  ax.bar([0, 1], [0.2, 0.3], yerr=[0.05, 0.05], label='attack A')
  ax.bar([0.4, 1.4], [0.1, 0.2], yerr=[0.05, 0.05])
  ax.set_xlabel('defense (name)')
  ax.set_ylabel('AUC (ROC area)')
  figures.legend_outside(ax)
  problems = figures.readability_problems(fig)
  plt.close(fig)
  assert problems == ['axes 0: a bars without a label']


def test_spread_annotations_separates_overlapping_texts():
  fig, ax = plt.subplots()
  ax.plot([0.5, 0.5001], [0.5, 0.5], 'o', label='points')
  for text in ('1', '0.1', '10'):
    ax.annotate(text, (0.5, 0.5), textcoords='offset points', xytext=(4, 4), fontsize=7)
  ax.set_xlabel('x (a.u.)')
  ax.set_ylabel('y (a.u.)')
  figures.legend_outside(ax)
  assert any('overlap' in p for p in figures.readability_problems(fig))
  figures.spread_annotations(ax)
  assert figures.readability_problems(fig) == []
  plt.close(fig)


def _point(eps, emp, lower, upper, distinguisher='likelihood_ratio'):
  return {'params': {'mechanism': 'bitrand', 'crafter': 'extreme_pair',
                     'distinguisher': distinguisher, 'epsilon': eps},
          'metrics': {'eps_emp': emp, 'eps_emp_lower': lower, 'eps_emp_upper': upper}}


def test_unbounded_eps_emp_is_a_marker_not_a_point(monkeypatch, tmp_path):
  stored = [_point(0.5, 'inf', 7.2, 'inf'), _point(1.0, 1.1, 0.9, 1.3),
            _point(2.0, 'inf', 6.9, 'inf')]
  drawn = {}

  def save(fig, workdir, name, **kw):
    del workdir, kw
    drawn[name] = figures.readability_problems(fig)
    ax = fig.axes[0]
    ymax = ax.get_ylim()[1]
    data = [l for l in ax.get_lines() if l.get_transform() == ax.transData]
    drawn['ys'] = [y for l in data if l.get_linestyle() != ':' for y in l.get_ydata()
                   if l.get_label() != 'claimed = empirical']
    drawn['texts'] = [t.get_text() for t in ax.texts]
    drawn['ymax'] = ymax
    return name

  monkeypatch.setattr(figures, 'save', save)
  ldp_audit_figures.draw_figures(stored, str(tmp_path))
  plt.close('all')
  assert drawn['fig2_bitrand'] == []
  # The only plotted estimate is the finite one; the infinite ones are annotated markers.
  assert all(math.isfinite(y) and y < 2.0 for y in drawn['ys'])
  assert drawn['texts'] == ['inf (>= 7.20)', 'inf (>= 6.90)']
  assert drawn['ymax'] > 7.2  # the lower bounds stay on the axes


# --- One synthetic figure per kind of misleading data ink: each is caught, named by its axes.

def _axes(n=1, **kw):
  fig, axes = plt.subplots(1, n, squeeze=False, **kw)
  for i, ax in enumerate(axes[0]):
    ax.set_title(f'panel {i}')
    ax.set_xlabel('claimed epsilon (nats)')
    ax.set_ylabel('TPR (fraction)')
  return fig, list(axes[0])


def _problems(fig):
  fig.tight_layout()
  figures.figure_legend(fig)  # beside every panel, each label once
  out = figures.readability_problems(fig)
  plt.close(fig)
  return out


def _rounds(ax):
  ax.set_xlabel('communication round (count)')
  ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))


def _errorbar(ax, label='TPR', y=(0.2, 0.4), **kw):
  ax.errorbar([1, 2], list(y), yerr=0.05, marker='o', label=label, **kw)


def test_a_rate_axis_leaving_0_1_is_caught():
  fig, (ax,) = _axes()
  _errorbar(ax)
  ax.set_ylim(-0.1, 0.5)
  assert _problems(fig) == [
      "panel 0: y axis 'TPR (fraction)' is a rate in [0, 1] but spans -0.1 to 0.5"]
  fig, (ax,) = _axes()
  _errorbar(ax)
  figures.rate_limits(ax)
  assert _problems(fig) == []


def test_panels_of_one_quantity_on_different_scales_are_caught():
  fig, axes = _axes(2)
  _errorbar(axes[0], y=(0.1, 0.2))
  _errorbar(axes[1], y=(0.5, 0.9))
  problems = _problems(fig)
  assert len(problems) == 1
  assert "panels 'panel 0', 'panel 1' show 'TPR (fraction)' on different y scales" in problems[0]
  fig, axes = _axes(2, sharey=True)
  _errorbar(axes[0], y=(0.1, 0.2))
  _errorbar(axes[1], y=(0.5, 0.9))
  assert _problems(fig) == []


def test_measured_rates_without_intervals_are_caught():
  fig, (ax,) = _axes()
  ax.plot([1, 2], [0.2, 0.4], marker='o', label='no defense')
  ax.errorbar([1, 2], [0.5, 0.6], marker='s', label='errorbar without yerr')
  ax.bar([1.5], [0.3], width=0.2, label='bars')
  assert _problems(fig) == [
      "panel 0: 'errorbar without yerr' plots measured rates ('TPR (fraction)') without "
      'their intervals: draw error bars or a band',
      "panel 0: 'no defense' plots measured rates ('TPR (fraction)') without their "
      'intervals: draw error bars or a band in its colour',
      "panel 0: bars 'bars' show measured rates ('TPR (fraction)') without error bars"]


def test_a_band_belongs_to_its_own_series_and_only_along_rounds():
  # Two series of one colour (aligned, public code): the first's band does not cover the
  # second, which is far above it.
  fig, (ax,) = _axes()
  _rounds(ax)
  ax.plot([1, 2, 3], [0.01, 0.02, 0.01], 'o-', color='tab:blue', label='aligned')
  ax.fill_between([1, 2, 3], 0, [0.05, 0.06, 0.05], color='tab:blue', alpha=0.2)
  ax.plot([1, 2, 3], [0.3, 0.5, 0.6], 's--', color='tab:blue', label='public code')
  figures.rate_limits(ax)
  assert _problems(fig) == [
      "panel 0: 'public code' plots measured rates ('TPR (fraction)') without their "
      'intervals: draw error bars or a band in its colour']
  # Between two measured epsilons a band suggests measurements in between.
  fig, (ax,) = _axes()
  ax.plot([2, 9], [0.3, 0.6], 'o-', color='tab:red', label='TPR')
  ax.fill_between([2, 9], [0.2, 0.5], [0.4, 0.7], color='tab:red', alpha=0.2)
  figures.rate_limits(ax)
  assert _problems(fig) == [
      "panel 0: the band of 'TPR' shades between measured points (x = 2, 9), suggesting "
      'measurements in between: draw error bars at the points']


def test_overlapping_bands_of_one_colour_and_alpha_are_caught():
  fig, (ax,) = _axes()
  _rounds(ax)
  for label, y in (('A', 0.3), ('B', 0.35)):
    ax.plot([1, 2, 3], [y] * 3, 'o-', color='tab:gray', lw=1, label=label)
    ax.fill_between([1, 2, 3], y - 0.1, y + 0.1, color='tab:gray', alpha=0.2)
  figures.rate_limits(ax)
  assert _problems(fig) == [
      "panel 0: the bands of 'A' and 'B' share colour and alpha and overlap: they merge into "
      'one block']


def test_legend_entries_one_cannot_see_are_caught():
  fig, (ax,) = _axes()
  ax.set_ylabel('v (a.u.)')
  ax.plot([1, 2], [1, 2], 'o-', ms=3, label='under')
  ax.plot([1, 2], [1, 2], 'o-', ms=4, label='over')
  ax.plot([1, 2], [2, 3], label='transparent', alpha=0)
  ax.plot([1, 2], [float('nan')] * 2, label='all NaN')
  assert _problems(fig) == [
      "panel 0: 'under' is in the legend but hidden behind 'over' (every point under it)",
      "panel 0: 'transparent' is in the legend but drawn invisible (zero alpha)",
      "panel 0: 'all NaN' is in the legend but has no finite point (all NaN)"]
  fig, (ax,) = _axes()
  ax.set_ylabel('v (a.u.)')
  ax.plot([1, 2], [1, 2], 'o-', ms=4, label='under, larger markers')
  ax.plot([1, 2], [1, 2], 'o-', ms=2, label='over')
  assert _problems(fig) == []


def test_fractional_ticks_on_a_count_axis_are_caught():
  fig, (ax,) = _axes()
  ax.set_xlabel('communication round (count)')
  _errorbar(ax)
  figures.rate_limits(ax)
  problems = _problems(fig)
  assert len(problems) == 1
  assert problems[0].startswith("panel 0: x axis 'communication round (count)' counts whole "
                                'units but labels ticks at 1.2')
  fig, (ax,) = _axes()
  ax.set_xlabel('communication round (count)')
  _errorbar(ax)
  figures.rate_limits(ax)
  ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  assert _problems(fig) == []


def test_a_chance_line_wrong_for_a_series_it_spans_is_caught():
  fig, (ax,) = _axes()
  ax.set_ylabel('TPR, TNR, accuracy (fraction)')
  _errorbar(ax, 'TPR')
  _errorbar(ax, '10-class accuracy', y=(0.5, 0.6))
  ax.axhline(0.5, color='grey', label='chance (0.5)')
  figures.rate_limits(ax)
  assert _problems(fig) == [
      "panel 0: reference line 'chance (0.5)' spans TPR, TNR, accuracy, whose chance levels "
      'differ: say which series it is for',
      "panel 0: reference line 'chance (0.5)' at 0.5 is wrong for '10-class accuracy': "
      'chance for 10 classes is 0.1']
  fig, (ax,) = _axes()
  ax.set_ylabel('TPR, TNR, accuracy (fraction)')
  _errorbar(ax, 'TPR')
  _errorbar(ax, '10-class accuracy', y=(0.5, 0.6))
  ax.axhline(0.5, color='grey', label='chance for TPR, TNR (0.5)')
  ax.axhline(0.1, color='green', label='chance for 10-class accuracy (0.1)')
  figures.rate_limits(ax)
  assert _problems(fig) == []


def test_a_log_axis_with_one_labelled_tick_is_caught():
  fig, (ax,) = _axes()
  ax.set_ylabel('rounds to FPR <= delta (count, log)')
  ax.semilogy([4, 8], [6, 14], label='closed form')
  ax.yaxis.set_major_formatter(ticker.FormatStrFormatter('%g'))
  ax.yaxis.set_minor_formatter(ticker.NullFormatter())
  assert _problems(fig) == [
      "panel 0: log y axis 'rounds to FPR <= delta (count, log)' labels 1 tick(s) (10): a log "
      'axis needs at least two labelled ticks']
