"""Experiment pipelines: what `python -m experiments.<name>` runs, as library code.

Each module is one experiment's `base.Pipeline` (`validate_config`, `prepare`, `plan`,
`figures`, `SUMMARY`), registered in `fl_privacy.catalog` and driven by `base.sweep`, so that
the scripts in `experiments/` stay one-line hand-offs and a notebook can run a pipeline
without absl flags.
"""
