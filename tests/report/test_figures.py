"""Tests of the figure helpers: the readability check can fail, unbounded values are marked."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

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
