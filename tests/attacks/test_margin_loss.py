"""The loss-reading attacks (Blackbox-Loss, Loss-Series, FedMIA-I) read the cross-entropy
derived from the recorded logit margin, softplus(-margin) in float64, not the float32 loss that
rounds to 0 on a confident model (issue 41, item 4)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special
from sklearn import metrics as sk_metrics

from fl_privacy.attacks.passive import evaluate
from fl_privacy.attacks.passive import rmia
from fl_privacy.attacks.passive import scores
from fl_privacy.fl import losses

LOSS_ATTACKS = ('blackbox_loss', 'loss_series', 'fedmia_i', 'fedmia_i@leave_one_out')
ROUNDS, CLIENTS, PER_CLIENT, TEST_ROWS, CLASSES = 2, 4, 12, 24, 10


def _logits(margin: np.ndarray) -> np.ndarray:
  """float32 logits [..., C] of label 0 with logit margin `margin`: the others equal at 0."""
  z = np.zeros(margin.shape + (CLASSES,), np.float32)
  z[..., 0] = margin + np.log(CLASSES - 1)
  return z


def _confident_recording(seed: int) -> dict[str, np.ndarray]:
  """A recording of confident uploads: every margin above 20 (float32 loss exactly 0), each
  client's own rows about 6 nats more confident than the rows it did not train on."""
  rng = np.random.default_rng(seed)
  owner = np.r_[np.repeat(np.arange(CLIENTS), PER_CLIENT), np.full(TEST_ROWS, -1)]
  own = owner[None, :] == np.arange(CLIENTS)[:, None]  # [K, Q]
  margin = 22.0 + 6.0 * own[None] + 0.3 * rng.normal(size=(ROUNDS, CLIENTS, owner.size))
  z = jnp.asarray(_logits(margin).reshape(-1, CLASSES))
  y = jnp.zeros(z.shape[0], jnp.int32)
  shape = margin.shape
  loss = np.asarray(losses.per_example_cross_entropy(z, y)).reshape(shape)
  recorded_margin = np.asarray(losses.true_label_margin(z, y)).reshape(shape)
  zeros = np.zeros(shape, np.float32)
  return dict(loss=loss, margin=recorded_margin, cos=zeros, diff=zeros,
              grad_sq=np.zeros((ROUNDS, owner.size), np.float32), owner=owner,
              rounds=np.arange(ROUNDS))


def _auc(recording: dict[str, np.ndarray], attack: str) -> float:
  out = evaluate.final_scores(recording, recording['owner'], attack)
  return float(sk_metrics.roc_auc_score(out['labels'], out['scores']))


@pytest.mark.parametrize('attack', LOSS_ATTACKS)
def test_on_a_confident_model_the_float32_loss_ties_while_the_margin_derived_loss_ranks(attack):
  rec = _confident_recording(0)
  # The premise: the float32 cross-entropy of every entry is exactly 0, so an attack on it
  # scores every entry alike (AUC 0.5).
  assert not rec['loss'].any()
  from_float32 = dict(rec, margin=-np.log(np.expm1(np.maximum(rec['loss'].astype(np.float64),
                                                                 1e-300))))
  assert _auc(from_float32, attack) == pytest.approx(0.5, abs=1e-12)
  # From the margins, own rows (6 nats more confident, noise sd 0.3) rank above the others.
  assert _auc(rec, attack) > 0.95


def test_the_derived_loss_is_the_cross_entropy_computed_directly_where_it_is_not_rounded():
  rng = np.random.default_rng(1)
  z = (3.0 * rng.normal(size=(400, CLASSES))).astype(np.float32)
  y = rng.integers(0, CLASSES, size=400)
  margin = np.asarray(losses.true_label_margin(jnp.asarray(z), jnp.asarray(y)))
  got = rmia.recording_loss({'margin': margin[None, None]})[0, 0]
  assert got.dtype == np.float64
  # scipy's log-softmax in float64 of the same float32 logits: the margin's float32 rounding
  # (a few ulps of logits of size <= 15) is all that separates them.
  want = -special.log_softmax(z.astype(np.float64), axis=1)[np.arange(400), y]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # The float32 loss agrees with both to its absolute error, a few float32 ulps of the
  # logits (that absolute error is what makes small losses round to 0).
  loss32 = np.asarray(losses.per_example_cross_entropy(jnp.asarray(z), jnp.asarray(y)))
  ulps = 8 * np.finfo(np.float32).eps * np.abs(z).max()
  np.testing.assert_allclose(loss32, got, rtol=0, atol=ulps)
  # What the attacks score is minus that loss.
  rec = {'margin': margin[None, None], 'loss': loss32[None, None]}
  np.testing.assert_array_equal(scores.signed_measurement(rec, 'loss'), -got[None, None])


def test_where_float32_rounds_to_zero_the_derived_loss_still_orders_the_margins():
  margin = np.linspace(15.0, 60.0, 46).astype(np.float32)
  z = jnp.asarray(_logits(margin))
  y = jnp.zeros(margin.size, jnp.int32)
  assert not np.asarray(losses.per_example_cross_entropy(z, y)).any()
  got = rmia.recording_loss({'margin': np.asarray(losses.true_label_margin(z, y))[None, None]})
  assert (got > 0).all() and (np.diff(got[0, 0]) < 0).all()
  np.testing.assert_allclose(got[0, 0], np.exp(-margin.astype(np.float64)), rtol=1e-5)


@pytest.mark.parametrize('attack', LOSS_ATTACKS)
def test_a_recording_without_margins_is_refused_by_every_loss_attack(attack):
  rec = _confident_recording(2)
  del rec['margin']
  with pytest.raises(ValueError, match='loss-reading attacks.*re-record'):
    evaluate.final_scores(rec, rec['owner'], attack)


def test_the_upload_loss_gap_reads_the_derived_loss():
  rec = _confident_recording(3)
  # Own rows' loss ~ e^-28, test rows' ~ e^-22: the gap is ~ e^-22 where float32 says 0.
  gap = evaluate.upload_loss_gap(rec)
  assert np.exp(-22.5) < gap < np.exp(-21.5)


def test_signed_measurement_orients_every_measurement_from_its_own_field():
  # Distinct values in every field, so a branch reading another field or sign shows.
  rng = np.random.default_rng(4)
  shape = (ROUNDS, CLIENTS, 5)
  rec = dict(margin=rng.normal(size=shape).astype(np.float32),
             loss=rng.uniform(1, 2, size=shape).astype(np.float32),
             cos=rng.normal(size=shape).astype(np.float32),
             grad_sq=rng.uniform(1, 2, size=(ROUNDS, 5)).astype(np.float32))
  m = rec['margin'].astype(np.float64)
  np.testing.assert_array_equal(scores.signed_measurement(rec, 'phi'), m)
  derived = -np.logaddexp(0.0, -m)   # log sigmoid(m) = -softplus(-m), never the 'loss' field
  for name in ('log_p', 'loss'):
    got = scores.signed_measurement(rec, name)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, derived, rtol=1e-12)
  grad = scores.signed_measurement(rec, 'grad_sq')
  assert grad.shape == (ROUNDS, 1, 5) and grad.dtype == np.float64
  np.testing.assert_array_equal(grad[:, 0], -rec['grad_sq'].astype(np.float64))
  cos = scores.signed_measurement(rec, 'cos')
  assert cos.dtype == np.float64
  np.testing.assert_array_equal(cos, rec['cos'].astype(np.float64))
