"""Experiment pipelines: what `python -m experiments.<name>` runs, as library code.

Each module holds one experiment's `prepare(config)` (validation, then data) and
`sweep(config, state, store, key)` (the points, their metrics, its figures and tables),
so that the scripts in `experiments/` stay thin hand-offs and a notebook can run a
pipeline without absl flags.
"""
