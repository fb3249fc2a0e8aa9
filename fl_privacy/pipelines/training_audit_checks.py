"""The training audit's checks of what must fit before any training runs
(`fl_privacy.pipelines.training_audit.prepare` calls them): the clients' updates of a chunk of
replicate trainings, and the side-channel game's per-trial draws."""

from __future__ import annotations

from fl_privacy import memory
from fl_privacy import validate
from fl_privacy.pipelines import training_audit_runs as runs


def training_fits(config, tr: dict, dim: int) -> None:
  """Refuses a chunk of replicate trainings whose clients' updates cannot fit in memory (a
  lower bound: one P-float update per client, real and canary, of every training of the
  chunk, side by side under vmap)."""
  s = config.training_audit
  fed, f = runs.federation(config, tr), 'record' if tr['defense'] == 'dp_sgd' else 'client'
  chunk = min(int(s.chunk), runs.replicates(config, tr))
  clients = int(fed.num_clients) + (0 if f == 'record' else
                                    runs.canaries_per_training(config, tr))
  memory.require_fits(f'training_audit.{f}.hidden', tuple(fed.hidden),
                      chunk * clients * dim * memory.FLOAT_BYTES,
                      f"the clients' updates ({chunk} trainings a chunk (training_audit.chunk) "
                      f'x {clients} clients x {dim:,} parameters x 4 bytes)')


def side_channel(config, tr: dict, pool: int, adversary: str) -> None:
  """The side-channel game draws each trial's rows without replacement from the `pool` train
  rows (the target's n + 2 candidates and n for each other client the aggregate's reader
  sees beside it) and holds a permutation of them per trial (`side_channel.play`): both must
  fit before any training runs."""
  s, n = config.training_audit, runs.side_rows(config, tr)
  others = 0 if adversary == 'server' else int(s.side_channel_others)
  validate.require(n + 2 + others * n <= pool, 'training_audit.side_channel_others',
                   f'at most {(pool - n - 2) // n} (each of the other clients holds {n} rows '
                   f'drawn beside the target\'s {n + 2} candidates from the {pool} train rows)',
                   s.side_channel_others)
  # 5 words a row: 1.40 GB peak above the interpreter's for 50,000 trials of the 1,438 digits
  # rows (19.5 bytes a row; /usr/bin/time -v, 2026-11-29).
  memory.require_fits('training_audit.side_channel_trials', s.side_channel_trials,
                      int(s.side_channel_trials) * pool * 5 * memory.FLOAT_BYTES,
                      f'the per-trial draws ({s.side_channel_trials} trials x a permutation '
                      f'of {pool} rows, sorted with its random keys: 5 words of 4 bytes a row)')


__all__ = ['training_fits', 'side_channel']
