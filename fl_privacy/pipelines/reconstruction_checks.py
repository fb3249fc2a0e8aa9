"""The reconstruction experiment's checks of sizes and swept values, before any work.

`pipelines.reconstruction` calls `check_swept_values` from `validate_config` (no data) and
`check_sizes` from `prepare` once the splits are loaded (the input size is the data's).
A value the grid would drop (a client larger than every attack's `max_examples`) ran nothing
and was recorded in the config; a size whose arrays cannot fit the machine aborted the
process (`imprint.num_bins=1e9`: a 1.2 TB allocation) or ran out of memory after the results
opened. Every bound below is a lower bound on one array the setting allocates
(`fl_privacy.memory`), so a setting is refused only when it cannot fit.
"""

from __future__ import annotations

import math

from fl_privacy import memory
from fl_privacy import validate
from fl_privacy.attacks.reconstruction import metrics as rec_metrics

PREFIX = 'reconstruction'
# The index array of a bootstrap over pairs (`metrics.bootstrap_mean`: int64).
INDEX_BYTES = 8


def check_swept_values(config) -> None:
  """Refuses swept values no point runs whatever attacks are chosen: a batch size above every
  attack's `max_examples` (and batch sizes of which the chosen attacks run none), a J whose N = J x center.<attack> exceeds it for every multi-step
  attack, a centre J whose E sweep runs for none, a figure grid wider than any client, and a
  PSNR threshold above the cap no score reaches. (An attack's own cap dropping some sizes is the design: `max_examples`.)"""
  s, p = config.reconstruction, PREFIX
  tops = {a: int(s.max_examples[a]) for a in s.max_examples.keys()}
  top = max(tops.values())
  for b in s.batch_sizes:
    validate.require(int(b) <= top, f'{p}.batch_sizes', f'sizes some attack runs: each at most '
                     f'the largest max_examples ({top}; a larger client runs at no point)',
                     tuple(s.batch_sizes))
  chosen = max(tops[a] for a in s.attacks)
  validate.require(any(int(b) <= chosen for b in s.batch_sizes), f'{p}.batch_sizes',
                   f'sizes the chosen attacks run (at least one <= {chosen}, the largest '
                   'max_examples of reconstruction.attacks; else no batch-size point runs)',
                   tuple(s.batch_sizes))
  multi = [a for a in s.multi_step_attacks if a in tops]
  if multi:
    for j in s.num_batches:
      validate.require(any(int(s.center[a]) * int(j) <= tops[a] for a in multi),
                       f'{p}.num_batches', 'J some multi-step attack runs: J x center.<attack> '
                       'at most max_examples.<attack> for one of ' + ', '.join(
                           f'{a} ({s.center[a]} x J <= {tops[a]})' for a in multi),
                       tuple(s.num_batches))
    validate.require(any(int(s.center[a]) * int(s.center.num_batches) <= tops[a]
                         for a in multi), f'{p}.center.num_batches',
                     'a J the E sweep runs: center.num_batches x center.<attack> at most '
                     'max_examples.<attack> for one of the multi-step attacks',
                     s.center.num_batches)
  validate.require(int(s.grid_images) <= top, f'{p}.grid_images', f'at most {top}, the largest '
                   'max_examples (a point shows at most its own inputs)', s.grid_images)
  validate.require(float(s.psnr_threshold) < rec_metrics.PSNR_CAP, f'{p}.psnr_threshold',
                   f'below {rec_metrics.PSNR_CAP:g} dB (PSNRs are capped there: exact copies '
                   'score the cap, so no input would count as recovered)', s.psnr_threshold)


def check_sizes(config, pool, points: list[dict], model) -> None:
  """Refuses sizes whose arrays cannot fit the machine (`memory.require_fits`), each named by
  its field: the model, the crafted imprint layer, a point's recovered rows over its trials
  and the bootstrap's index array.

  Args:
    config: the experiment's config.
    pool: the clients' split (`data.Dataset`; its example shape sizes every input).
    points: the attacks' grid (`reconstruction.grid`).
    model: the honest model.
  """
  s, p = config.reconstruction, PREFIX
  shape = tuple(pool.x.shape[1:])
  dim = math.prod(shape)
  params = memory.num_parameters(model, shape)
  memory.require_fits(f'{p}.hidden' if s.model == 'mlp' else f'{p}.model', tuple(s.hidden),
                      params * memory.FLOAT_BYTES,
                      f'the honest model ({params:,} parameters x 4 bytes)')
  swept = any(len(tuple(v)) for v in s.defenses.values())
  run = set(s.attacks) | (set(s.defense_attacks) if swept else set())
  sizes = {a: max([q['batch_size'] * q['num_batches'] for q in points if q['attack'] == a]
                  or [int(s.center[a])]) for a in run}
  bins = int(s.imprint.num_bins)
  if 'imprint' in sizes:
    # The crafted layer: its [d, n] weights (and as many in each upload).
    memory.require_fits(f'{p}.imprint.num_bins', bins, dim * bins * memory.FLOAT_BYTES,
                        f'the crafted layer ({dim:,} inputs x {bins:,} bins x 4 bytes)')
  for attack, n in sorted(sizes.items(), key=lambda a: (a[0] != 'imprint', a[0])):
    field = 'inversion_trials' if attack == 'inversion' else 'trials'
    trials = int(s[field])
    rows = bins if attack == 'imprint' else n   # the imprint reads one row per bin
    memory.require_fits(f'{p}.{field}', trials, trials * rows * dim * memory.FLOAT_BYTES,
                        f'a point\'s recovered rows ({trials:,} trials x {rows:,} rows of '
                        f'{attack} x {dim:,} inputs x 4 bytes)')
    memory.require_fits(f'{p}.bootstrap_resamples', s.bootstrap_resamples,
                        int(s.bootstrap_resamples) * trials * n * INDEX_BYTES,
                        f'the bootstrap\'s indices ({s.bootstrap_resamples:,} resamples x '
                        f'{trials:,} trials x {n} examples of {attack} x 8 bytes)')
