"""Index splits: member/non-member pools, held-out splits, and client partitions.

Every function returns index arrays (into a dataset) and draws its randomness from
a JAX key through `rng_from_key`, so the same key gives the same split.
"""

from __future__ import annotations

import math

import numpy as np

from fl_privacy.data.dataset import rng_from_key


def holdout_split(num_examples: int, fraction: float = 0.2,
                  seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """A fixed (seeded) split of range(num_examples) into (train, test) indices.

  Used by loaders whose source has no test split; the seed is part of the data
  definition, not an experiment's randomness, so it is a plain integer.

  Returns:
    Sorted train and test index arrays; the test part has round(fraction * N) items.
  """
  order = np.random.default_rng(seed).permutation(num_examples)
  num_test = int(round(fraction * num_examples))
  return np.sort(order[num_test:]), np.sort(order[:num_test])


def member_nonmember_split(key, num_examples: int,
                           num_members: int) -> tuple[np.ndarray, np.ndarray]:
  """Splits range(num_examples) at random into members and non-members.

  Args:
    key: JAX key.
    num_examples: Size of the pool.
    num_members: How many indices become members (0..num_examples).

  Returns:
    (members [num_members], nonmembers [num_examples - num_members]), disjoint, each
    in random order (so any prefix is itself a uniform random subset).
  """
  if not 0 <= num_members <= num_examples:
    raise ValueError(f'num_members must be in [0, {num_examples}], got {num_members}')
  order = rng_from_key(key).permutation(num_examples)
  return order[:num_members], order[num_members:]


def iid_partition(key, num_examples: int, num_clients: int,
                  per_client: int | None = None) -> list[np.ndarray]:
  """Uniformly random disjoint client shards.

  Args:
    key: JAX key.
    num_examples: Size of the pool.
    num_clients: Number of shards.
    per_client: Examples per client; None splits all examples as evenly as possible
      (sizes differ by at most one).

  Returns:
    num_clients disjoint index arrays.
  """
  if num_clients < 1:
    raise ValueError(f'num_clients must be >= 1, got {num_clients}')
  order = rng_from_key(key).permutation(num_examples)
  if per_client is None:
    return [np.asarray(a) for a in np.array_split(order, num_clients)]
  if per_client * num_clients > num_examples:
    raise ValueError(f'{num_clients} clients x {per_client} examples exceed the '
                     f'{num_examples} available')
  return [order[k * per_client:(k + 1) * per_client] for k in range(num_clients)]


def _dirichlet_by_class(rng, labels, num_clients, beta):
  """Each class's examples go to clients in Dirichlet(beta) proportions."""
  shards = [[] for _ in range(num_clients)]
  for c in np.unique(labels):
    members = rng.permutation(np.flatnonzero(labels == c))
    shares = rng.dirichlet(np.full(num_clients, beta))
    cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
    for k, part in enumerate(np.split(members, cuts)):
      shards[k].append(part)
  return [rng.permutation(np.concatenate(s)) for s in shards]


def _dirichlet_fixed_size(rng, labels, num_clients, beta, per_client):
  """Each client draws class proportions q ~ Dir(beta) and takes per_client examples.

  Class counts are multinomial(q); a class that runs out gives its surplus back to
  a new multinomial draw over the classes that still have examples (q restricted),
  so shards stay disjoint and exactly per_client long.
  """
  classes = np.unique(labels)
  pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
  used = np.zeros(len(classes), dtype=np.int64)
  sizes = np.array([len(p) for p in pools])
  shards = []
  for _ in range(num_clients):
    q = rng.dirichlet(np.full(len(classes), beta))
    take = np.zeros(len(classes), dtype=np.int64)
    need = per_client
    while need > 0:
      left = sizes - used - take
      w = np.where(left > 0, q, 0.0)
      # Every preferred class exhausted: fall back to the remaining ones uniformly.
      w = w / w.sum() if w.sum() > 0 else (left > 0) / np.sum(left > 0)
      extra = np.minimum(rng.multinomial(need, w), left)
      take += extra
      need -= int(extra.sum())
    parts = [pools[c][used[c]:used[c] + take[c]] for c in range(len(classes))]
    used += take
    shards.append(rng.permutation(np.concatenate(parts)))
  return shards


def dirichlet_partition(key, labels, num_clients: int, beta: float,
                        per_client: int | None = None, *,
                        min_per_client: int = 1, max_tries: int = 100) -> list[np.ndarray]:
  """Label-skewed disjoint client shards (Dirichlet label skew, as in FedMIA).

  With per_client None, every class c draws proportions p_c ~ Dir(beta * 1_K) over
  the K clients and its examples are cut in those proportions (Hsu et al., 2019);
  all examples are assigned and the draw is repeated (from the same stream) until
  every client has at least `min_per_client`. With per_client set, each client draws
  class proportions q_k ~ Dir(beta * 1_C) and takes exactly per_client examples
  without replacement. Small beta -> few classes per client; large beta -> IID.

  Args:
    key: JAX key.
    labels: int labels [N].
    num_clients: K.
    beta: Dirichlet concentration (> 0).
    per_client: Fixed shard size, or None to assign every example.
    min_per_client: Smallest acceptable shard when per_client is None.
    max_tries: Redraws allowed before giving up.

  Returns:
    K disjoint index arrays, each in random order.
  """
  labels = np.asarray(labels)
  if beta <= 0:
    raise ValueError(f'beta must be > 0, got {beta}')
  if num_clients < 1:
    raise ValueError(f'num_clients must be >= 1, got {num_clients}')
  rng = rng_from_key(key)
  if per_client is not None:
    if per_client * num_clients > len(labels):
      raise ValueError(f'{num_clients} clients x {per_client} examples exceed the '
                       f'{len(labels)} available')
    return _dirichlet_fixed_size(rng, labels, num_clients, beta, per_client)
  for _ in range(max_tries):
    shards = _dirichlet_by_class(rng, labels, num_clients, beta)
    if min(len(s) for s in shards) >= min_per_client:
      return shards
  raise ValueError(f'no Dirichlet({beta}) draw in {max_tries} tries gave every one of '
                   f'{num_clients} clients >= {min_per_client} examples; raise beta or '
                   f'lower min_per_client')


def beta_partition(key, labels, num_clients: int, beta: float,
                   per_client: int | None = None) -> list[np.ndarray]:
  """Client shards of a labelled pool: `iid_partition` for beta = inf (FedMIA's IID
  setting), else `dirichlet_partition` with concentration beta."""
  if math.isinf(beta):
    return iid_partition(key, len(labels), num_clients, per_client)
  return dirichlet_partition(key, labels, num_clients, beta, per_client)
