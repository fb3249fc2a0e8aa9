"""Why the dishonest server's detector fired on an outside target: a duplicate, or none.

A false positive of the dishonest-server attack (`fl_privacy.attacks.dishonest`; Pichler et
al., Lemma 2.1: the detector fires only for a sample within eps of the target on its M
detected features) is explained by the client data of its run: an exact duplicate of the
target, a near duplicate that was the example that fired, or no duplicate at all (another
example matched the target's detected features by chance, or nothing fired).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fl_privacy import data as data_lib
from fl_privacy.data import duplicates


def attribute(pool, client_idx: np.ndarray, outcome: dict[str, Any], *, run: int,
              delta: float, num_components: int, near_threshold: float) -> dict[str, Any]:
  """Explains one false positive: a duplicate of the target in the client's data, or none.

  Exact duplicates are byte-identical images; near duplicates lie within `near_threshold`
  (L2 on [0, 1] pixels, `fl_privacy.data.duplicates`; 0 looks for exact ones only).

  Args:
    pool: the `data.Dataset` the client data and target were drawn from.
    client_idx: the client's pool indices in this run (`dishonest.client_indices`).
    outcome: the run's outcome (`dishonest.OUTCOME_FIELDS`).
    run: the run index (recorded).
    delta: the run's Delta as reported (recorded).
    num_components: M, the detected features (named in the cause).
    near_threshold: the near-duplicate radius.

  Returns:
    {run, target, target_label, delta, nearest, nearest_label, nearest_detector_distance,
    nearest_pixel_distance, num_activating, exact_duplicates_in_client,
    near_duplicates_in_client, cause}.
  """
  target = int(outcome['target'])
  idx = np.asarray(client_idx)
  others = idx[idx != target]
  x_t = pool.x[target:target + 1]
  exact = duplicates.cross_matches(x_t, pool.x[others], 0.0)
  exact = [int(others[j]) for j in exact[0][1]] if exact else []
  near = []
  if near_threshold > 0:
    found = duplicates.cross_matches(x_t, pool.x[others], float(near_threshold))
    near = [int(others[j]) for j in found[0][1] if int(others[j]) not in exact] if found else []
  nearest = int(outcome['nearest'])
  # An exact duplicate has the target's detected features, so it fires the detector whenever
  # the target would; a near duplicate only explains the run if it is the example that fired.
  if exact:
    cause = f'exact duplicate of the target: example {exact[0]}'
  elif nearest in near and int(outcome['num_activating']) > 0:
    cause = f'near duplicate of the target: example {nearest}'
  elif int(outcome['num_activating']) > 0:
    held = (f' (the client also holds near duplicate(s) {near}, which did not fire)'
            if near else '')
    cause = (f'none: no duplicate fired; example {nearest} (label {int(pool.y[nearest])}) '
             f'matches the target on its {num_components} detected features within eps{held}')
  else:
    cause = 'none: no client example activates the detector (unexplained)'
  pixel = float(np.linalg.norm(data_lib.to_float(pool.x[nearest]) -
                               data_lib.to_float(pool.x[target])))
  return dict(run=run, target=target, target_label=int(pool.y[target]),
              delta=float(delta), nearest=nearest,
              nearest_label=int(pool.y[nearest]),
              nearest_detector_distance=float(outcome['nearest_distance']),
              nearest_pixel_distance=pixel, num_activating=int(outcome['num_activating']),
              exact_duplicates_in_client=exact, near_duplicates_in_client=near, cause=cause)
