r"""Passive server-side membership scores from recorded rounds (the FedMIA paper's Table 1).

Input: a recording (`fl.recording.train_recorded`): `loss`, `cos`, `diff` [R, K, Q] and
`grad_sq` [R, Q] of Q queries at R recorded rounds, and `owner` [Q] (the client holding each
query, -1 for test examples). Each client is the target in turn; for target k the members are
its own queries and the non-members every other query (the test split and the other clients'
data), so the pooled evaluation has sum_k n_k members and K Q - sum_k n_k non-members.

Attacks (`ATTACKS`; higher score = member; query q, round t, target k):

| attack | score |
|---|---|
| `blackbox_loss` | -loss[t, k, q] at one round (Yeom et al.'s loss attack); every `loss` here is softplus(-margin), see below |
| `grad_cosine` | cos[t, k, q] (Eq. 7) at one round (Li et al.) |
| `grad_diff` | diff[t, k, q] at one round (Li et al.) |
| `grad_norm` | -grad_sq[t, q] at one round (Nasr et al.; not target-specific) |
| `<single>_best_round` | the single-round attack at the recorded round whose pooled TPR@0.1% FPR is highest on the evaluation data itself, as the authors' code picks it: optimistic |
| `loss_series` | mean over rounds of -loss (Gu et al.'s loss series, averaged) |
| `avg_cosine` | mean over rounds of cos (Li et al.) |
| `fedmia_i` | (1/R) sum_t Phi((-loss - mu_t) / sigma_t) over the other clients (Eq. 12, FedMIA-I) |
| `fedmia_ii` | the same with cos (FedMIA-II) |
| `lira_offline` | (1/R) sum_t Phi((phi - mu_t) / sigma_t), phi the logit margin z_y - logsumexp_{j != y} z_j of the true label (`margin`), mu_t and sigma_t (per query) of the other clients (offline LiRA, `lira`) |
| `lira_offline_fixed` | the same with one global sigma_t per round pooled over the queries (LiRA's fixed variance) |
| `lira_online` | (1/R) sum_t [log N(phi; mu_in,t, s_in,t^2) - log N(phi; mu_out,t, s_out,t^2)], IN: the server's re-runs of the round from w_t on shadow sets with the query (`fl.shadow`, `margin_in`), OUT: the other clients; per query (online LiRA, the paper's Gaussian likelihood ratio) |
| `lira_online_fixed` | the same with the paper's global s_in,t and s_out,t: one IN and one OUT variance per round, each pooled over the queries (LiRA's fixed variance) |
| `rmia` | (1/R) sum_t Pr_z[LR_t(x, z) >= gamma] over the population z = the test rows, the other clients as reference models, Pr(x \| theta) = sigmoid(margin) (offline RMIA, `rmia`; `rmia_gamma`, `rmia_a`) |

The loss-reading attacks (Blackbox-Loss, Loss-Series, FedMIA-I) read the cross-entropy
derived from the recorded logit margin m = z_y - logsumexp_{j != y} z_j: -log p_y =
log(1 + exp(-m)) = softplus(-m) (p_y = sigmoid(m)), in float64 (`rmia.loss_from_margin`). The
recorded float32 loss (optax's softmax cross-entropy) rounds to exactly 0 from a margin of
about 14.5 (13.4 with logits near 20; 10 classes, measured), so on a confident model the members
it should rank tie at 0; the derived loss keeps the margin's own float32 precision down to
exp(-745), where float64 underflows.

`fedmia_*` use an outlier filter (`fedmia.FILTERS`): without a suffix the paper's (`paper`,
Eqs. 8-9; `DEFAULT_FILTER`), `fedmia_ii@leave_one_out` our leave-one-out filter,
`fedmia_ii@none` none. LiRA and RMIA (`REFERENCE`) use no filter; they, like the loss-reading
attacks, read the recording's logit margins (`margin`; a recording without them is refused). Online LiRA (`ONLINE`) needs a
recording with `margin_in` (IN measurements, `fl.recording`'s `in_models`) and refuses one
without.

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
  FPR; the pair of scorings measures by how much. LiRA's per-position Gaussian test is
  FedMIA's and takes the permutation the same way. Online LiRA is scored aligned only: the
  code has no IN models, so which example the IN values at a misaligned position belong to
  would be our choice, not the code's, and both choices make artefacts (IN values following the
  target's row: AUC 0.29, and 0.002 with the fixed variance, on the digits recording where
  aligned gives 0.51-0.52; following the position's aligned query: the offline attacks'
  inflation). RMIA does not take the permutation either: its score compares the
  target's ratio with a population (the test rows), not with the other clients' values at a
  position, so there is no position to misalign cleanly; RMIA is scored aligned only and
  refuses 'public_code' (`supports`). (Permuting only its reference marginal adds variance
  that its thresholded score turns into higher non-member scores: an artefact, not the code.)
- `public_code_2024`: the authors' Feb 2024 code: the non-members of target k are the other
  clients' training rows only (no test rows), aligned as in `aligned`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fl_privacy.attacks.passive import fedmia
from fl_privacy.attacks.passive import lira
from fl_privacy.attacks.passive import rmia

SINGLE = ('blackbox_loss', 'grad_cosine', 'grad_diff', 'grad_norm')
BEST_ROUND = tuple(f'{a}_best_round' for a in SINGLE)
SERIES = ('loss_series', 'avg_cosine')
FEDMIA = ('fedmia_i', 'fedmia_ii')
# The state of the art beside the paper's attacks: offline LiRA and RMIA.
# Online LiRA: IN models the server builds (`fl.shadow`), read from the recording's `loss_in`.
ONLINE = ('lira_online', 'lira_online_fixed')
REFERENCE = ('lira_offline', 'lira_offline_fixed') + ONLINE + ('rmia',)
ATTACKS = SINGLE + BEST_ROUND + SERIES + FEDMIA + REFERENCE
# Attacks that average their per-round scores over the recorded rounds.
MULTI_ROUND = SERIES + FEDMIA + REFERENCE
SCORINGS = ('aligned', 'public_code', 'public_code_2024')
# (attack, scoring) pairs that are not scored (module docstring).
UNSUPPORTED = frozenset({('rmia', 'public_code'), ('lira_online', 'public_code'),
                         ('lira_online_fixed', 'public_code')})
# RMIA's threshold gamma and offline parameter a when the caller gives none (the RMIA
# authors' configs use gamma = 2; a = 1 is their "unknown" default, Pr(x) = Pr_OUT(x)).
RMIA_GAMMA = 2.0
RMIA_A = 1.0
# FedMIA's outlier filter when an attack name gives none: the paper's (Eqs. 8-9).
DEFAULT_FILTER = 'paper'

# Which recorded measurement each attack reads.
MEASUREMENT = {
    'blackbox_loss': 'loss', 'grad_cosine': 'cos', 'grad_diff': 'diff', 'grad_norm': 'grad_sq',
    'loss_series': 'loss', 'avg_cosine': 'cos', 'fedmia_i': 'loss', 'fedmia_ii': 'cos',
    'lira_offline': 'phi', 'lira_offline_fixed': 'phi', 'lira_online': 'phi',
    'lira_online_fixed': 'phi', 'rmia': 'log_p',
}
MEASUREMENT.update({f'{a}_best_round': MEASUREMENT[a] for a in SINGLE})

# Display names (the paper's).
LABELS = {
    'blackbox_loss': 'Blackbox-Loss', 'grad_cosine': 'Grad-Cosine', 'grad_diff': 'Grad-Diff',
    'grad_norm': 'Grad-Norm', 'loss_series': 'Loss-Series', 'avg_cosine': 'Avg-Cosine',
    'fedmia_i': 'FedMIA-I', 'fedmia_ii': 'FedMIA-II', 'lira_offline': 'LiRA (offline)',
    'lira_offline_fixed': 'LiRA (offline, fixed variance)', 'lira_online': 'LiRA (online)',
    'lira_online_fixed': 'LiRA (online, fixed variance)', 'rmia': 'RMIA (offline)',
}
LABELS.update({f'{a}_best_round': f'{LABELS[a]} (best round, optimistic)' for a in SINGLE})


def parse(name: str, default_filter: str = DEFAULT_FILTER) -> tuple[str, str | None]:
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


def supports(name: str, scoring: str) -> bool:
  """Whether attack `name` is scored under `scoring` (RMIA and online LiRA not under
  'public_code')."""
  return (parse(name)[0], scoring) not in UNSUPPORTED


def label(name: str, default_filter: str = DEFAULT_FILTER) -> str:
  """Display name: 'FedMIA-II (paper filter)', 'FedMIA-II (leave-one-out filter)',
  'Loss-Series', ..."""
  base, filt = parse(name, default_filter)
  if filt is None:
    return LABELS[base]
  return f'{LABELS[base]} ({filt.replace("_", "-")} filter)'


def signed_measurement(recording: dict[str, np.ndarray], name: str) -> np.ndarray:
  """The measurement oriented so that higher = member, [R, K, Q] ([R, 1, Q] for grad_sq).

  'phi' is LiRA's statistic, the logit margin of the true label (`lira.phi`); 'log_p' is
  RMIA's log Pr(x | theta) = log sigmoid(margin) and 'loss' the cross-entropy -log p_y =
  softplus(-margin) (`rmia.recording_loss`), all from the recording's `margin` in float64,
  never from the float32 loss, which rounds to exactly 0 from a margin of about 14.5 (module
  docstring) and ties every confident member. A recording without margins is refused
  (`lira.phi`).
  """
  if name == 'phi':
    return lira.phi(recording)
  if name in ('log_p', 'loss'):
    return -rmia.recording_loss(recording)
  if name == 'grad_sq':
    return -np.asarray(recording['grad_sq'], np.float64)[:, None, :]
  return np.asarray(recording[name], np.float64)


def target_views(owner: np.ndarray, target: int,
                 scoring: str = 'aligned') -> tuple[np.ndarray, np.ndarray]:
  """(member query indices, non-member query indices) of `target`.

  The non-members are every other query, or with `scoring='public_code_2024'` only the other
  clients' training queries (owner >= 0).
  """
  owner = np.asarray(owner)
  if scoring not in SCORINGS:
    raise ValueError(f'scoring must be one of {SCORINGS} (got {scoring!r})')
  others = owner != target
  if scoring == 'public_code_2024':
    others &= owner >= 0
  return np.flatnonzero(owner == target), np.flatnonzero(others)


def round_scores(values: np.ndarray, owner: np.ndarray, target: int, *, kind: str,
                 outlier_filter: str | None = None, scoring: str = 'aligned',
                 rng: np.random.Generator | None = None, rmia_gamma: float = RMIA_GAMMA,
                 rmia_a: float = RMIA_A, in_values: np.ndarray | None = None
                 ) -> dict[str, Any]:
  """Per-round scores of one target's members and non-members.

  The per-round term of Eq. (5)/(12) of the FedMIA paper (equation numbers as the module
  `fedmia` reads them; unverified against the paper's text): for `kind='fedmia'` the round's
  Phi((M_target - mu_t) / sigma_t) (`fedmia.round_scores`), for 'lira' / 'lira_fixed' offline
  LiRA's Phi on the same columns (`lira.offline_scores`, per-query or fixed variance), for
  'lira_online' / 'lira_online_fixed' online LiRA's log likelihood ratio (the LiRA paper's
  online test, `lira.online_scores`) with `in_values` as IN and the other clients as OUT, for
  'rmia' RMIA's pairwise test against the rows no client holds (owner -1,
  `rmia.pairwise_scores`), otherwise the
  target's own measurement (or the shared one when `values` has a single client row, as
  grad_sq).

  Args:
    values: [R, K or 1, Q] signed measurement (`signed_measurement`; 'phi' for LiRA,
      'log_p' = log Pr(x | theta) for RMIA).
    owner: [Q] owning client of each query, -1 for test queries.
    target: the target client k.
    kind: 'fedmia', 'lira', 'lira_fixed', 'lira_online', 'lira_online_fixed', 'rmia' or
      'plain'.
    outlier_filter: FedMIA's filter (`fedmia.FILTERS`).
    scoring: one of `SCORINGS` (module docstring).
    rng: numpy Generator; needed for 'public_code'.
    rmia_gamma, rmia_a: RMIA's threshold and offline parameter.
    in_values: [R, M, Q] IN measurements (phi) of online LiRA (`lira.in_measurements`); at a
      permuted position the target's query's (module docstring).

  Returns:
    dict with `scores` [R, n] (members first, then non-members in position order), `labels`
    [n] (1 member), and for 'fedmia' the filter's `removed` count, `examined` count, and
    `owner_removed` / `owner_examined` (how often the shadow that owns a non-member query was
    removed, only counted where positions are aligned).
  """
  values = np.asarray(values, np.float64)
  num_rounds, rows, _ = values.shape
  members, nonmembers = target_views(owner, target, scoring)
  n_pos, n_neg = members.size, nonmembers.size
  row = target if rows > 1 else 0
  out_scores = np.empty((num_rounds, n_pos + n_neg))
  removed = examined = owner_removed = owner_examined = 0
  shadow_ids = np.delete(np.arange(rows), row) if rows > 1 else np.zeros(0, int)
  nonmember_owner = np.asarray(owner)[nonmembers]
  if kind != 'plain' and rows < 3:
    raise ValueError(f'{kind} needs at least 2 non-target clients')
  if kind.startswith('lira_online') and in_values is None:
    raise ValueError(f'{kind} needs in_values (IN measurements, `lira.in_measurements`)')
  if kind in ONLINE and (kind, scoring) in UNSUPPORTED:
    raise ValueError(f"online LiRA is scored aligned only (the public code has no IN models to "
                     f"misalign); scoring={scoring!r} refused, use 'aligned' or "
                     "'public_code_2024'")
  if kind == 'rmia':
    if ('rmia', scoring) in UNSUPPORTED:
      raise ValueError(f"RMIA is scored aligned only (no position to permute in its population "
                       f"test); scoring={scoring!r} refused, use 'aligned' or 'public_code_2024'")
    population = np.flatnonzero(np.asarray(owner) == -1)
    position = np.full(values.shape[2], -1, np.int64)  # of each query in the population
    position[population] = np.arange(population.size)
  aligned = np.concatenate([members, nonmembers])
  for t in range(num_rounds):
    if scoring != 'public_code':
      # Every client's row read at the same columns: a plain column gather (the same values
      # as take_along_axis with the columns broadcast to every row, without its index array).
      target_idx = aligned
      view = values[t][:, aligned]  # [rows, n]
    else:
      if rng is None:
        raise ValueError("scoring='public_code' needs an rng")
      # A fresh non-member draw for every client in this round (positions misaligned).
      idx = np.stack([np.concatenate([members, nonmembers[rng.permutation(n_neg)]])
                      for _ in range(rows)])
      target_idx = idx[row]
      view = np.take_along_axis(values[t], idx, axis=1)  # [rows, n]
    if kind == 'fedmia':
      s, rem = fedmia.round_scores(view, row, outlier_filter)
      out_scores[t] = s
      removed += int(rem.sum())
      examined += rem.size
      if scoring != 'public_code':
        # Rows of `rem` are the shadows in client order; find the owner's row per column.
        owned = nonmember_owner >= 0
        which = np.searchsorted(shadow_ids, nonmember_owner[owned])
        cols = n_pos + np.flatnonzero(owned)
        owner_removed += int(rem[which, cols].sum())
        owner_examined += int(owned.sum())
    elif kind in ('lira', 'lira_fixed'):
      out_scores[t] = lira.offline_scores(view, row, fixed_variance=kind == 'lira_fixed')
    elif kind in ('lira_online', 'lira_online_fixed'):
      # IN values follow the target's row: the query whose membership is tested there.
      out_scores[t] = lira.online_scores(view[row], in_values[t][:, target_idx],
                                         np.delete(view, row, axis=0),
                                         fixed_variance=kind == 'lira_online_fixed')
    elif kind == 'rmia':
      # values = log p; r = log Pr(x | theta_target) - log Pr(x) of every column (aligned).
      ratio = view[row] - rmia.log_marginal(-np.delete(view, row, axis=0), rmia_a)
      pop_ratio = values[t, row, population] - rmia.log_marginal(
          -np.delete(values[t][:, population], row, axis=0), rmia_a)
      out_scores[t] = rmia.pairwise_scores(ratio, pop_ratio, rmia_gamma, position[target_idx])
    else:
      out_scores[t] = view[row]
  labels = np.r_[np.ones(n_pos, np.int8), np.zeros(n_neg, np.int8)]
  return dict(scores=out_scores, labels=labels, removed=removed, examined=examined,
              owner_removed=owner_removed, owner_examined=owner_examined)


def pooled_round_scores(recording: dict[str, np.ndarray], owner: np.ndarray, attack: str, *,
                        scoring: str = 'aligned', default_filter: str = DEFAULT_FILTER,
                        rng: np.random.Generator | None = None, rmia_gamma: float = RMIA_GAMMA,
                        rmia_a: float = RMIA_A) -> dict[str, Any]:
  """`round_scores` of every client as target, concatenated (targets in client order).

  `rmia_gamma` and `rmia_a` are RMIA's threshold and offline parameter (other attacks ignore
  them).

  Returns:
    dict: `scores` [R, N], `labels` [N], `target` [N] (which target each entry belongs to),
    and the FedMIA filter counts summed over targets.
  """
  base, filt = parse(attack, default_filter)
  values = signed_measurement(recording, MEASUREMENT[base])
  num_clients = recording['loss'].shape[1]
  kind = {'lira_offline': 'lira', 'lira_offline_fixed': 'lira_fixed', 'rmia': 'rmia'}.get(
      base, base if base in ONLINE else 'fedmia' if base in FEDMIA else 'plain')
  in_values = lira.in_measurements(recording) if base in ONLINE else None
  parts = [round_scores(values, owner, k, kind=kind, outlier_filter=filt, scoring=scoring,
                        rng=rng, rmia_gamma=rmia_gamma, rmia_a=rmia_a, in_values=in_values)
           for k in range(num_clients)]
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

  Multi-round attacks (`MULTI_ROUND`: series, FedMIA, LiRA, RMIA; Eqs. 5 and 12) average
  rounds 0 .. upto - 1 (online LiRA: the mean of per-round log likelihood ratios, the log
  likelihood ratio of independent rounds divided by R) (all by default); single-round attacks take round `single_index`.
  """
  base, _ = parse(attack)
  if base in MULTI_ROUND:
    return fedmia.mean_over_rounds(round_scores_, upto)
  if single_index is None:
    raise ValueError(f'{attack} needs single_index')
  return round_scores_[single_index]


def pooled_queries(owner: np.ndarray, num_clients: int, scoring: str = 'aligned') -> np.ndarray:
  """The query index of every entry of `pooled_round_scores`, [N].

  Targets in client order, each its members then its non-members (`target_views` of
  `scoring`); e.g. the groups of a query-cluster bootstrap (`eval.bootstrap`). Under
  'public_code' a non-member position holds a different query in every round and client: the
  index is then the query the position holds aligned, a label of the position.
  """
  return np.concatenate([np.concatenate(target_views(owner, k, scoring))
                         for k in range(num_clients)])
