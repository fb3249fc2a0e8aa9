"""Passive server-side membership scores from recorded rounds (the FedMIA paper's Table 1).

Input: a recording (`fl.recording.train_recorded`): `loss`, `cos`, `diff` [R, K, Q] and
`grad_sq` [R, Q] of Q queries at R recorded rounds, and `owner` [Q] (the client holding each
query, -1 for test examples). Each client is the target in turn; for target k the members are
its own queries and the non-members every other query (the test split and the other clients'
data), so the pooled evaluation has sum_k n_k members and K Q - sum_k n_k non-members.

Attacks (`ATTACKS`; higher score = member; query q, round t, target k):

| attack | score |
|---|---|
| `blackbox_loss` | -loss[t, k, q] at one round (Yeom et al.'s loss attack) |
| `grad_cosine` | cos[t, k, q] (Eq. 7) at one round (Li et al.) |
| `grad_diff` | diff[t, k, q] at one round (Li et al.) |
| `grad_norm` | -grad_sq[t, q] at one round (Nasr et al.; not target-specific) |
| `<single>_best_round` | the single-round attack at the recorded round whose pooled TPR@0.1% FPR is highest on the evaluation data itself, as the authors' code picks it: optimistic |
| `loss_series` | mean over rounds of -loss (Gu et al.'s loss series, averaged) |
| `avg_cosine` | mean over rounds of cos (Li et al.) |
| `fedmia_i` | (1/R) sum_t Phi((-loss - mu_t) / sigma_t) over the other clients (Eq. 12, FedMIA-I) |
| `fedmia_ii` | the same with cos (FedMIA-II) |

`fedmia_*` use an outlier filter (`fedmia.FILTERS`): `fedmia_ii` the configured one (default
`leave_one_out`), `fedmia_ii@paper` / `fedmia_ii@none` name one explicitly.

Non-member scoring (`SCORINGS`):
- `aligned`: a query keeps its identity across clients and rounds: its round scores are
  averaged over rounds, and FedMIA's shadows are the other clients' values for that query.
- `public_code`: the authors' code draws fresh non-members for every client and round
  (`main.py`, `mia_attack_auto.py`) and combines the arrays position by position, so the
  non-member at position i of the target in round t is a different example from the one at
  position i in round t' and from the one each shadow client measured at position i. We
  reproduce that with one random permutation of the target's non-member pool per (client,
  round); members stay aligned (the code keeps the target's training indices fixed). Averaging
  scores of different examples narrows the non-member distribution, which inflates TPR at low
  FPR; the pair of scorings measures by how much.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fl_privacy.attacks.passive import fedmia

SINGLE = ('blackbox_loss', 'grad_cosine', 'grad_diff', 'grad_norm')
BEST_ROUND = tuple(f'{a}_best_round' for a in SINGLE)
SERIES = ('loss_series', 'avg_cosine')
FEDMIA = ('fedmia_i', 'fedmia_ii')
ATTACKS = SINGLE + BEST_ROUND + SERIES + FEDMIA
SCORINGS = ('aligned', 'public_code')

# Which recorded measurement each attack reads.
MEASUREMENT = {
    'blackbox_loss': 'loss', 'grad_cosine': 'cos', 'grad_diff': 'diff', 'grad_norm': 'grad_sq',
    'loss_series': 'loss', 'avg_cosine': 'cos', 'fedmia_i': 'loss', 'fedmia_ii': 'cos',
}
MEASUREMENT.update({f'{a}_best_round': MEASUREMENT[a] for a in SINGLE})

# Display names (the paper's).
LABELS = {
    'blackbox_loss': 'Blackbox-Loss', 'grad_cosine': 'Grad-Cosine', 'grad_diff': 'Grad-Diff',
    'grad_norm': 'Grad-Norm', 'loss_series': 'Loss-Series', 'avg_cosine': 'Avg-Cosine',
    'fedmia_i': 'FedMIA-I', 'fedmia_ii': 'FedMIA-II',
}
LABELS.update({f'{a}_best_round': f'{LABELS[a]} (best round, optimistic)' for a in SINGLE})


def parse(name: str, default_filter: str = 'leave_one_out') -> tuple[str, str | None]:
  """`'fedmia_ii@paper'` -> ('fedmia_ii', 'paper'); filters apply to FedMIA attacks only."""
  base, _, filt = name.partition('@')
  if base not in ATTACKS:
    raise ValueError(f'unknown attack {base!r}; known: {ATTACKS}')
  if base in FEDMIA:
    filt = filt or default_filter
    if filt not in fedmia.FILTERS:
      raise ValueError(f'unknown outlier filter {filt!r} in {name!r}; known: {fedmia.FILTERS}')
    return base, filt
  if filt:
    raise ValueError(f'{base} takes no outlier filter (got {name!r})')
  return base, None


def label(name: str, default_filter: str = 'leave_one_out') -> str:
  """Display name: 'FedMIA-II (leave-one-out filter)', 'Loss-Series', ..."""
  base, filt = parse(name, default_filter)
  if filt is None:
    return LABELS[base]
  return f'{LABELS[base]} ({filt.replace("_", "-")} filter)'


def signed_measurement(recording: dict[str, np.ndarray], name: str) -> np.ndarray:
  """The measurement oriented so that higher = member, [R, K, Q] ([R, 1, Q] for grad_sq)."""
  if name == 'loss':
    return -np.asarray(recording['loss'], np.float64)
  if name == 'grad_sq':
    return -np.asarray(recording['grad_sq'], np.float64)[:, None, :]
  return np.asarray(recording[name], np.float64)


def target_views(owner: np.ndarray, target: int) -> tuple[np.ndarray, np.ndarray]:
  """(member query indices, non-member query indices) of `target`."""
  owner = np.asarray(owner)
  return np.flatnonzero(owner == target), np.flatnonzero(owner != target)


def round_scores(values: np.ndarray, owner: np.ndarray, target: int, *, kind: str,
                 outlier_filter: str | None = None, scoring: str = 'aligned',
                 rng: np.random.Generator | None = None) -> dict[str, Any]:
  """Per-round scores of one target's members and non-members.

  The per-round term of Eq. (5)/(12) of the FedMIA paper: for `kind='fedmia'` the round's
  Phi((M_target - mu_t) / sigma_t) (`fedmia.round_scores`), otherwise the target's own
  measurement (or the shared one when `values` has a single client row, as grad_sq).

  Args:
    values: [R, K or 1, Q] signed measurement (`signed_measurement`).
    owner: [Q] owning client of each query, -1 for test queries.
    target: the target client k.
    kind: 'fedmia' or 'plain'.
    outlier_filter: FedMIA's filter (`fedmia.FILTERS`).
    scoring: 'aligned' or 'public_code' (module docstring).
    rng: numpy Generator; needed for 'public_code'.

  Returns:
    dict with `scores` [R, n] (members first, then non-members in position order), `labels`
    [n] (1 member), and for 'fedmia' the filter's `removed` count, `examined` count, and
    `owner_removed` / `owner_examined` (how often the shadow that owns a non-member query was
    removed, only counted where positions are aligned).
  """
  if scoring not in SCORINGS:
    raise ValueError(f'scoring must be one of {SCORINGS} (got {scoring!r})')
  values = np.asarray(values, np.float64)
  num_rounds, rows, _ = values.shape
  members, nonmembers = target_views(owner, target)
  n_pos, n_neg = members.size, nonmembers.size
  row = target if rows > 1 else 0
  out_scores = np.empty((num_rounds, n_pos + n_neg))
  removed = examined = owner_removed = owner_examined = 0
  shadow_ids = np.delete(np.arange(rows), row) if rows > 1 else np.zeros(0, int)
  nonmember_owner = np.asarray(owner)[nonmembers]
  for t in range(num_rounds):
    if scoring == 'aligned':
      idx = np.broadcast_to(np.concatenate([members, nonmembers]), (rows, n_pos + n_neg))
    else:
      if rng is None:
        raise ValueError("scoring='public_code' needs an rng")
      # A fresh non-member draw for every client in this round (positions misaligned).
      idx = np.stack([np.concatenate([members, nonmembers[rng.permutation(n_neg)]])
                      for _ in range(rows)])
    view = np.take_along_axis(values[t], idx, axis=1)  # [rows, n]
    if kind == 'fedmia':
      if rows < 3:
        raise ValueError('FedMIA needs at least 2 non-target clients')
      s, rem = fedmia.round_scores(view, row, outlier_filter)
      out_scores[t] = s
      removed += int(rem.sum())
      examined += rem.size
      if scoring == 'aligned':
        # Rows of `rem` are the shadows in client order; find the owner's row per column.
        owned = nonmember_owner >= 0
        which = np.searchsorted(shadow_ids, nonmember_owner[owned])
        cols = n_pos + np.flatnonzero(owned)
        owner_removed += int(rem[which, cols].sum())
        owner_examined += int(owned.sum())
    else:
      out_scores[t] = view[row]
  labels = np.r_[np.ones(n_pos, np.int8), np.zeros(n_neg, np.int8)]
  return dict(scores=out_scores, labels=labels, removed=removed, examined=examined,
              owner_removed=owner_removed, owner_examined=owner_examined)


def pooled_round_scores(recording: dict[str, np.ndarray], owner: np.ndarray, attack: str, *,
                        scoring: str = 'aligned', default_filter: str = 'leave_one_out',
                        rng: np.random.Generator | None = None) -> dict[str, Any]:
  """`round_scores` of every client as target, concatenated (targets in client order).

  Returns:
    dict: `scores` [R, N], `labels` [N], `target` [N] (which target each entry belongs to),
    and the FedMIA filter counts summed over targets.
  """
  base, filt = parse(attack, default_filter)
  values = signed_measurement(recording, MEASUREMENT[base])
  num_clients = recording['loss'].shape[1]
  kind = 'fedmia' if base in FEDMIA else 'plain'
  parts = [round_scores(values, owner, k, kind=kind, outlier_filter=filt, scoring=scoring,
                        rng=rng) for k in range(num_clients)]
  out = dict(scores=np.concatenate([p['scores'] for p in parts], axis=1),
             labels=np.concatenate([p['labels'] for p in parts]),
             target=np.concatenate([np.full(p['labels'].size, k, np.int32)
                                    for k, p in enumerate(parts)]))
  for name in ('removed', 'examined', 'owner_removed', 'owner_examined'):
    out[name] = sum(p[name] for p in parts)
  return out


def combine_rounds(round_scores_: np.ndarray, attack: str, *, upto: int | None = None,
                   single_index: int | None = None) -> np.ndarray:
  """Final scores from per-round scores [R, N].

  Multi-round attacks (series and FedMIA, Eqs. 5 and 12) average rounds 0 .. upto - 1 (all by
  default); single-round attacks take round `single_index`.
  """
  base, _ = parse(attack)
  if base in SERIES or base in FEDMIA:
    upto = round_scores_.shape[0] if upto is None else upto
    return round_scores_[:upto].mean(axis=0)
  if single_index is None:
    raise ValueError(f'{attack} needs single_index')
  return round_scores_[single_index]


def pooled_queries(owner: np.ndarray, num_clients: int) -> np.ndarray:
  """The query index of every entry of `pooled_round_scores` (aligned scoring), [N].

  Targets in client order, each its members then its non-members (`target_views`); e.g. the
  groups of a query-cluster bootstrap (`eval.bootstrap`).
  """
  return np.concatenate([np.concatenate(target_views(owner, k)) for k in range(num_clients)])
