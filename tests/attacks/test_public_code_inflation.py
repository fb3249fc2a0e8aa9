"""When the public code's non-member scoring inflates TPR at low FPR, and when it does not.

The authors' code redraws the non-members per client and round and averages scores position by
position (`scores` module docstring): a non-member "score" is then a mean over different
queries, narrower than a member's mean over one query's rounds. That inflates TPR at low FPR
exactly when a (client, query) measurement carries an effect that persists over the rounds
(members keep theirs in the average, non-members lose it); with i.i.d. rounds and real signal
the two scorings measure the same thing. Synthetic recordings of each kind show both, through
the experiment's own `evaluate` (FedMIA-II and LiRA), with tolerances from Clopper-Pearson
intervals on the member counts.
"""

from __future__ import annotations

import numpy as np
import pytest

from fl_privacy.attacks.passive import evaluate
from fl_privacy.eval import stats

R, K, PER_CLIENT, TEST = 12, 6, 150, 900


def _recording(seed: int, *, persistent: float, signal: float) -> tuple[dict, np.ndarray]:
  """cos[t, k, q] = signal * [q is k's] + persistent * u[k, q] + e[t, k, q], u and e N(0, 1),
  and the loss whose logit confidence is cos."""
  rng = np.random.default_rng(seed)
  owner = np.r_[np.repeat(np.arange(K), PER_CLIENT), -np.ones(TEST, int)]
  q = owner.size
  member = owner[None, :] == np.arange(K)[:, None]  # [K, Q]
  cos = (signal * member[None] + persistent * rng.normal(size=(1, K, q)) +
         rng.normal(size=(R, K, q)))
  # loss = log(1 + e^-cos) and margin = cos: LiRA's logit margin is cos itself and
  # FedMIA-II (cos) and LiRA see the same measurement.
  rec = dict(cos=cos, loss=np.logaddexp(0.0, -cos), margin=cos, diff=np.zeros((R, K, q)),
             grad_sq=np.zeros((R, q)), rounds=np.arange(R))
  return rec, owner


def _both_scorings(rec, owner, attack, seed):
  """(aligned metrics, public-code metrics, members above the 1%-FPR threshold under each,
  members)."""
  kw = dict(rng=np.random.default_rng(seed), num_resamples=1)
  aligned = evaluate.evaluate(rec, owner, attack, scoring='aligned', **kw)
  public = evaluate.evaluate(rec, owner, attack, scoring='public_code', **kw)
  n = int(aligned['n_pos'])
  ka, kp = (int(round(m['tpr_at_fpr_1e-2'] * n)) for m in (aligned, public))
  return aligned, public, ka, kp, n


@pytest.mark.parametrize('attack', ['fedmia_ii', 'lira_offline'])
def test_persistent_client_query_effects_inflate_the_public_code_scoring(attack):
  # No membership signal at all: the aligned scoring stays at chance, the public code's
  # position-by-position averaging manufactures TPR at 1% FPR.
  rec, owner = _recording(0, persistent=1.0, signal=0.0)
  aligned, _, ka, kp, n = _both_scorings(rec, owner, attack, 1)
  assert abs(aligned['auc'] - 0.5) < 3 * (aligned['auc_ci_high'] - aligned['auc'])
  _, aligned_high = stats.clopper_pearson(ka, n)
  public_low, _ = stats.clopper_pearson(kp, n)
  assert aligned_high < 0.05  # chance is 1%
  assert public_low > 3 * aligned_high, (ka, kp, n)


@pytest.mark.parametrize('attack', ['fedmia_ii', 'lira_offline'])
def test_without_persistent_effects_both_scorings_measure_the_same_signal(attack):
  # Real signal, i.i.d. rounds: the permutation changes nothing in distribution, so the two
  # TPRs at 1% FPR agree within their intervals (and the signal is well above chance).
  rec, owner = _recording(2, persistent=0.0, signal=0.35)
  aligned, public, ka, kp, n = _both_scorings(rec, owner, attack, 3)
  low, high = stats.newcombe_difference(kp, n, ka, n)[1:]
  assert low < 0 < high, (ka, kp, n)
  assert aligned['auc_ci_low'] > 0.6
  assert abs(public['auc'] - aligned['auc']) < 0.03
