"""The results store: one `results.json` + `results.csv` per run, resumable.

Schema of `<workdir>/results.json` (the same for every experiment)::

  {"experiment": str,
   "config": {...},              # config.to_dict(), JSON-safe
   "manifest": {"command": str, "cwd": str, "git_revision": str | null,
                "git_dirty": bool | null, "versions": {...}, "python": str,
                "devices": {...}, "start_time": str, "end_time": str | null,
                "earlier_runs": [...]},   # fl_privacy/report/manifest.py
   "points": [{"params": {flat swept parameters},
               "metrics": {flat name -> number},
               "n_trials": int, "elapsed_s": float}, ...]}

A rate `x` is stored as the three metrics `x`, `x_ci_low`, `x_ci_high`
(`fl_privacy.eval.stats.rate`). JSON has no inf/NaN, so non-finite metric values
are stored as the strings "inf", "-inf" and "nan" (`float()` reads them back).
`results.csv` has one row per point: the params columns, then the metrics columns
(the union of keys over points, in first-seen order; a metric whose name clashes
with a param is written as `metrics.<name>`), then `n_trials` and `elapsed_s`.

Both files are rewritten atomically after every point, so an interrupted sweep
leaves every finished point on disk. Re-running with the same workdir resumes:
the stored points are read back and `get(params)` finds them. The stored config
must equal the new one except for fields that do not change results
(`RESUME_IGNORED_FIELDS`: any `*chunk_size`, `*batch_bytes`, `*compile_cache`, `workdir`, `data.data_dir`,
`data.cache_dir`); otherwise `ResumeError` is raised and nothing is written.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from typing import Any, Callable, Mapping

from absl import logging

import numpy as np

from fl_privacy.report import atomic
from fl_privacy.report import manifest as manifest_lib
from fl_privacy.report import progress as progress_lib

RESULTS_JSON = 'results.json'
RESULTS_CSV = 'results.csv'
RESUME_IGNORED_FIELDS = ('workdir', 'data.data_dir', 'data.cache_dir')
RESUME_IGNORED_SUFFIXES = ('chunk_size', 'batch_bytes', 'compile_cache')


class ResumeError(ValueError):
  """A workdir holds results of a different experiment or config."""


def _finite_or_str(value: float):
  if math.isfinite(value):
    return value
  return 'nan' if math.isnan(value) else ('inf' if value > 0 else '-inf')


def json_safe(obj: Any) -> Any:
  """`obj` as plain JSON types (dicts with str keys, lists, numbers, str, None).

  numpy scalars/arrays become Python numbers/lists, tuples lists, non-finite
  floats the strings "inf"/"-inf"/"nan"; anything else its `str()`.
  """
  if hasattr(obj, 'to_dict') and callable(obj.to_dict):
    obj = obj.to_dict()
  if isinstance(obj, Mapping):
    return {str(k): json_safe(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [json_safe(v) for v in obj]
  if isinstance(obj, np.ndarray):
    return json_safe(obj.tolist())
  if isinstance(obj, np.generic):
    obj = obj.item()
  if obj is None or isinstance(obj, (bool, int, str)):
    return obj
  if isinstance(obj, float):
    return _finite_or_str(obj)
  if hasattr(obj, '__array__'):  # jax arrays
    return json_safe(np.asarray(obj))
  return str(obj)


def _round_trip(obj: Any) -> Any:
  return json.loads(json.dumps(json_safe(obj)))


def _flatten(tree: Any, prefix: str = '') -> dict[str, Any]:
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(_flatten(v, f'{prefix}{k}.'))
    return out
  return {prefix[:-1]: tree}


def _ignored(field: str) -> bool:
  return (field in RESUME_IGNORED_FIELDS or
          field.split('.')[-1].endswith(RESUME_IGNORED_SUFFIXES))


def config_differences(old: Mapping[str, Any],
                       new: Mapping[str, Any]) -> list[str]:
  """Dotted fields whose JSON-safe values differ, ignoring resume-safe fields."""
  a, b = _flatten(_round_trip(old)), _flatten(_round_trip(new))
  fields = sorted(set(a) | set(b))
  return [f for f in fields if not _ignored(f) and a.get(f, '<missing>') !=
          b.get(f, '<missing>')]


def _check_flat(params: Mapping[str, Any], what: str) -> dict[str, Any]:
  if not isinstance(params, Mapping):
    raise TypeError(f'{what} must be a flat dict (got {type(params).__name__})')
  safe = _round_trip(dict(params))
  for k, v in safe.items():
    if isinstance(v, dict):
      raise TypeError(f'{what} must be flat: {k!r} holds a dict')
  return safe


class ResultsStore:
  """Results of one run in `workdir`: resumable, written atomically per point.

  Args:
    workdir: the run folder (created if missing).
    experiment: the experiment's name (e.g. `'ami'`).
    config: the run's ConfigDict (or a dict).

  Raises:
    ResumeError: `workdir` holds results of another experiment, or of a config
      that differs in a field outside `RESUME_IGNORED_FIELDS`.
  """

  def __init__(self, workdir: str | os.PathLike, experiment: str, config: Any):
    self.workdir = os.fspath(workdir)
    self.experiment = str(experiment)
    self.config = _round_trip(config)
    self._points: list[dict[str, Any]] = []
    start_time = None
    previous_manifest = None
    previous = self._load()
    if previous is not None:
      if previous.get('experiment') != self.experiment:
        raise ResumeError(
            f'{self.json_path} holds results of experiment '
            f'{previous.get("experiment")!r}, not {self.experiment!r}; use '
            'another --workdir')
      diff = config_differences(previous.get('config', {}), self.config)
      if diff:
        raise ResumeError(
            f'{self.json_path} was written with a different config (fields '
            f'{", ".join(diff)}); resume with the same config or use another '
            '--workdir')
      self._points = list(previous.get('points', []))
      start_time = previous.get('manifest', {}).get('start_time')
      previous_manifest = previous.get('manifest')
    self.manifest = manifest_lib.collect(start_time, previous_manifest)
    os.makedirs(self.workdir, exist_ok=True)
    self._write()

  @property
  def json_path(self) -> str:
    return os.path.join(self.workdir, RESULTS_JSON)

  @property
  def csv_path(self) -> str:
    return os.path.join(self.workdir, RESULTS_CSV)

  @property
  def points(self) -> list[dict[str, Any]]:
    """The stored points (copies), in the order they were first added."""
    return json.loads(json.dumps(self._points))

  def _load(self) -> dict[str, Any] | None:
    try:
      with open(self.json_path, encoding='utf-8') as f:
        return json.load(f)
    except FileNotFoundError:
      return None
    except json.JSONDecodeError as e:
      raise ResumeError(f'{self.json_path} is not valid JSON ({e}); move it '
                        'away or use another --workdir') from e

  def _find(self, params: dict[str, Any]) -> int | None:
    for i, point in enumerate(self._points):
      if point['params'] == params:
        return i
    return None

  def get(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The stored point whose params equal `params` (after a JSON round trip)."""
    i = self._find(_check_flat(params, 'params'))
    return None if i is None else json.loads(json.dumps(self._points[i]))

  def add(self, params: Mapping[str, Any], metrics: Mapping[str, Any],
          n_trials: int, elapsed_s: float) -> dict[str, Any]:
    """Stores one point (replacing one with equal params) and rewrites both files.

    Args:
      params: flat dict of the swept parameters of this point.
      metrics: flat dict name -> number (rates as `x`, `x_ci_low`, `x_ci_high`).
      n_trials: trials behind the metrics.
      elapsed_s: wall time of the point.

    Returns:
      The stored point.
    """
    point = {
        'params': _check_flat(params, 'params'),
        'metrics': _check_flat(metrics, 'metrics'),
        'n_trials': int(n_trials),
        'elapsed_s': float(elapsed_s),
    }
    i = self._find(point['params'])
    if i is None:
      self._points.append(point)
    else:
      self._points[i] = point
    self._write()
    return json.loads(json.dumps(point))

  def finish(self) -> None:
    """Records the end time and rewrites the files."""
    self.manifest['end_time'] = manifest_lib.utc_now()
    self._write()

  def to_dict(self) -> dict[str, Any]:
    return {
        'experiment': self.experiment,
        'config': self.config,
        'manifest': self.manifest,
        'points': self._points,
    }

  def _csv_text(self) -> str:
    param_cols: list[str] = []
    metric_cols: list[str] = []
    for point in self._points:
      for k in point['params']:
        if k not in param_cols:
          param_cols.append(k)
    for point in self._points:
      for k in point['metrics']:
        if k not in metric_cols:
          metric_cols.append(k)
    tail = ['n_trials', 'elapsed_s']

    def metric_name(k):
      return f'metrics.{k}' if k in param_cols or k in tail else k

    def cell(v):
      if v is None:
        return ''
      if isinstance(v, (list, dict)):
        return json.dumps(v)
      return v

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator='\n')
    writer.writerow(param_cols + [metric_name(k) for k in metric_cols] + tail)
    for p in self._points:
      writer.writerow([cell(p['params'].get(k)) for k in param_cols] +
                      [cell(p['metrics'].get(k)) for k in metric_cols] +
                      [p['n_trials'], p['elapsed_s']])
    return buf.getvalue()

  def _write(self) -> None:
    atomic.atomic_write_text(
        self.json_path,
        json.dumps(self.to_dict(), indent=2, allow_nan=False) + '\n')
    atomic.atomic_write_text(self.csv_path, self._csv_text())


def describe_params(params: Mapping[str, Any]) -> str:
  """`k=v, k=v` for logs and messages."""
  return ', '.join(f'{k}={v}' for k, v in params.items()) or '(no params)'


def run_point(store: ResultsStore, params: Mapping[str, Any],
              compute: Callable[[], tuple[Mapping[str, Any], int]], *,
              unit: str = 'trials') -> dict[str, Any]:
  """Runs one sweep point unless the store already has it; returns its metrics.

  Args:
    store: the run's results store.
    params: flat dict of the swept parameters of this point.
    compute: `() -> (metrics, n_trials)`, called only for a new point.
    unit: what `n_trials` counts, for the log line ('trials' of a game; 'runs',
      'examples', 'scores' where the point is not a game's trials).

  Returns:
    The point's metrics (as stored).
  """
  tracker = progress_lib.active()
  saved = store.get(params)
  if saved is not None:
    logging.info('skipping %s: already saved in %s', describe_params(params),
                 store.workdir)
    if tracker is not None:
      tracker.point_finished(saved, computed=False)
    return saved['metrics']
  if tracker is not None:
    tracker.point_started(params)
  t0 = time.perf_counter()
  metrics, n_trials = compute()
  point = store.add(params, metrics, n_trials, time.perf_counter() - t0)
  # The experiment's headline metrics (its summary columns), so a log alone says what
  # each point measured.
  headline = tracker.headline(point) if tracker is not None else ''
  logging.info('saved %s (%d %s, %.1f s)%s', describe_params(params), n_trials, unit,
               point['elapsed_s'], f': {headline}' if headline else '')
  if tracker is not None:
    tracker.point_finished(point, computed=True)
  return point['metrics']
