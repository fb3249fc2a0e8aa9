"""Evaluation: the security-game runner, metrics with intervals, statistics."""

from __future__ import annotations

from fl_privacy.eval import metrics
from fl_privacy.eval import runner
from fl_privacy.eval import stats
from fl_privacy.eval.runner import run_trials
from fl_privacy.eval.stats import clopper_pearson
from fl_privacy.eval.stats import rate
