"""How a participation fraction becomes a number of clients per round (`rounds.participants`).

The count is max(1, round(fraction K)) with Python's `round` (halves to even), fraction 1 is
every client; pinned exactly here, including the rounding edges, since a count off by one
changes every sampled-DP accounting that assumes it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fl_privacy.fl import rounds

KEY = jax.random.key(3)

# (K, fraction, count), worked out by hand.
CASES = [
    (10, 1.0, 10), (1, 1.0, 1), (7, 1.0, 7),          # everyone
    (10, 0.5, 5), (10, 0.3, 3), (10, 0.7, 7), (20, 0.1, 2), (8, 0.25, 2), (8, 0.75, 6),
    (10, 0.04, 1), (10, 0.01, 1), (3, 0.1, 1),         # rounds to 0 -> at least one
    (10, 0.06, 1), (10, 0.16, 2), (10, 0.14, 1),       # rounding to nearest, not floor / ceil
    (10, 0.96, 10), (10, 0.94, 9),                      # near 1 but not 1
    (10, 0.25, 2), (6, 0.25, 2), (10, 0.35, 4), (10, 0.45, 4),  # halves: to even
    (4, 0.5, 2), (5, 0.5, 2), (3, 0.5, 2), (7, 0.5, 4), (2, 0.5, 1),
    (100, 0.015, 2), (100, 0.025, 2), (1000, 0.001, 1), (1000, 0.0015, 2),
]


@pytest.mark.parametrize('num_clients,fraction,count', CASES)
def test_the_count_of_each_fraction(num_clients, fraction, count):
  parts = np.asarray(rounds.participants(KEY, 0, num_clients, fraction))
  assert parts.shape == (num_clients,) and parts.dtype == bool
  assert int(parts.sum()) == count


def test_the_count_is_the_same_every_round_and_the_draw_changes():
  parts = np.asarray(jax.vmap(lambda t: rounds.participants(KEY, t, 9, 0.4))(jnp.arange(50)))
  np.testing.assert_array_equal(parts.sum(1), 4)
  assert len({tuple(p) for p in parts}) > 1


def test_the_draw_depends_on_the_round_key_and_salt_only():
  a = np.asarray(rounds.participants(KEY, 5, 10, 0.3))
  b = np.asarray(rounds.participants(KEY, 5, 10, 0.3))
  np.testing.assert_array_equal(a, b)
  k = jax.random.fold_in(jax.random.fold_in(KEY, 5), rounds.PARTICIPATION_SALT)
  want = np.zeros(10, bool)
  want[np.asarray(jax.random.permutation(k, 10))[:3]] = True
  np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize('fraction', [0.0, -0.1, 1.01, 2.0])
def test_fractions_outside_0_1_are_refused(fraction):
  with pytest.raises(ValueError, match='participation fraction'):
    rounds.participants(KEY, 0, 10, fraction)


@pytest.mark.parametrize('num_clients,fraction,count', CASES)
def test_the_accountant_assumes_the_count_the_rounds_draw(num_clients, fraction, count):
  """Sampled central DP's declaration (`defenses.registry`, from the participation fraction)
  assumes as many participants per round as `rounds.participants` draws."""
  from fl_privacy.defenses import registry  # pylint: disable=g-import-not-at-top
  setting = registry.Setting(rounds=3, num_clients=num_clients)
  declare = registry._declare_server(False)  # pylint: disable=protected-access
  declared = declare({'participation': fraction}, setting)
  assert declared.sample_size == count


# ----------------------------------------------------------------------------------------------
# participant_indices: the round's sample as sorted indices (what `rounds.run` gathers).


def test_indices_are_sorted_distinct_counted_and_the_participants_set():
  """For every worked case: strictly increasing int indices in [0, K), max(1, round(f K)) of
  them, and exactly the True entries of `participants` (the same draw)."""
  for t, (num_clients, fraction, count) in enumerate(CASES):
    idx = np.asarray(rounds.participant_indices(KEY, t, num_clients, fraction))
    assert idx.shape == (count,), (num_clients, fraction)
    assert np.issubdtype(idx.dtype, np.integer)
    assert np.all(np.diff(idx) > 0) and idx.min() >= 0 and idx.max() < num_clients
    np.testing.assert_array_equal(
        idx, np.flatnonzero(np.asarray(rounds.participants(KEY, t, num_clients, fraction))))


def test_indices_are_the_documented_draw_keyed_by_key_and_round():
  """sort(permutation(fold_in(fold_in(key, t), PARTICIPATION_SALT), K)[:m]): the same (key, t)
  gives the same set, another round or another run key another set."""
  for t in (0, 5, 17):
    k = jax.random.fold_in(jax.random.fold_in(KEY, t), rounds.PARTICIPATION_SALT)
    want = np.sort(np.asarray(jax.random.permutation(k, 12))[:4])
    np.testing.assert_array_equal(rounds.participant_indices(KEY, t, 12, 1 / 3), want)
    np.testing.assert_array_equal(rounds.participant_indices(KEY, t, 12, 1 / 3),
                                  rounds.participant_indices(KEY, t, 12, 1 / 3))
  draws = {tuple(np.asarray(rounds.participant_indices(key, t, 12, 1 / 3)).tolist())
           for key in (KEY, jax.random.key(4)) for t in range(6)}
  assert len(draws) > 6  # 12 (key, round) pairs, C(12, 4) = 495 sets: repeats are rare
  # Under jit/vmap the round may be traced: the same sets as the eager calls.
  traced = jax.jit(jax.vmap(lambda t: rounds.participant_indices(KEY, t, 12, 1 / 3)))(
      jnp.arange(3))
  for t in range(3):
    np.testing.assert_array_equal(traced[t], rounds.participant_indices(KEY, t, 12, 1 / 3))
  with pytest.raises(ValueError, match='participation fraction'):
    rounds.participant_indices(KEY, 0, 10, 0.0)
  np.testing.assert_array_equal(rounds.participant_indices(KEY, 3, 5, 1.0), np.arange(5))


def test_indices_are_a_uniform_sample_without_replacement():
  """Over T = 3,000 rounds of m = 3 of K = 8: each client is in with probability m / K and
  each pair with m (m - 1) / (K (K - 1)) (a uniform m-subset; a random contiguous block or a
  stratified draw has the right marginals but not these pairs); 5-sigma binomial bands."""
  num_clients, m, num_rounds = 8, 3, 3000
  idx = np.asarray(jax.jit(jax.vmap(
      lambda t: rounds.participant_indices(KEY, t, num_clients, m / num_clients)))(
          jnp.arange(num_rounds)))
  member = np.zeros((num_rounds, num_clients))
  np.put_along_axis(member, idx, 1.0, axis=1)
  np.testing.assert_array_equal(member.sum(1), m)
  p = m / num_clients
  np.testing.assert_allclose(member.mean(0), p, atol=5 * np.sqrt(p * (1 - p) / num_rounds))
  pairs = member.T @ member / num_rounds
  q = m * (m - 1) / (num_clients * (num_clients - 1))
  off = pairs[~np.eye(num_clients, dtype=bool)]
  np.testing.assert_allclose(off, q, atol=5 * np.sqrt(q * (1 - q) / num_rounds))
