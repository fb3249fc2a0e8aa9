"""Results of a run: the resumable results store, per-point artifacts and keys, figures."""

from __future__ import annotations

from fl_privacy.report.artifacts import ArtifactStore
from fl_privacy.report.artifacts import point_key
from fl_privacy.report.atomic import atomic_write_bytes
from fl_privacy.report.atomic import atomic_write_text
from fl_privacy.report.store import describe_params
from fl_privacy.report.store import json_safe
from fl_privacy.report.store import RESULTS_CSV
from fl_privacy.report.store import RESULTS_JSON
from fl_privacy.report.store import ResultsStore
from fl_privacy.report.store import ResumeError
from fl_privacy.report.store import run_point
