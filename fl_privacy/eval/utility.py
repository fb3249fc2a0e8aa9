"""Utility of LDP-randomized features: accuracy of a classifier trained on them.

The AMI paper (Nguyen et al., Figs. 5 and 11) reports, beside the attack's success, the accuracy
of the legitimate task (CelebA: Smiling; CIFAR-10, Imagenette: class) when clients randomize
their features with the LDP mechanism. Here a small classifier (`models.MLP`; `hidden=()` is
multinomial logistic regression) is trained full batch with Adam on randomized training
features and tested on randomized test features: under LDP every feature vector a client holds
is randomized, at training and at prediction time alike. Each feature is standardised with the
randomized training set's mean and standard deviation.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fl_privacy import models
from fl_privacy.eval import stats


def train_classifier(key: jax.Array, x: jax.Array, y: jax.Array, num_classes: int, *,
                     hidden: Sequence[int] = (), steps: int = 500,
                     learning_rate: float = 1e-2, weight_decay: float = 1e-4):
  """Full-batch AdamW on the mean cross-entropy; returns `(model, variables)`.

  Args:
    key: PRNG key of the initialisation.
    x: [n, d] standardised training features.
    y: [n] int labels.
    num_classes: number of classes.
    hidden: hidden widths of the MLP (() = logistic regression).
    steps: optimisation steps.
    learning_rate: Adam step size.
    weight_decay: decoupled weight decay.
  """
  model = models.MLP(hidden=tuple(hidden), num_classes=num_classes)
  variables = model.init(key, x[:1])
  opt = optax.adamw(learning_rate, weight_decay=weight_decay)

  def loss_fn(v):
    logits = model.apply(v, x)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))

  def step(carry, _):
    v, state = carry
    g = jax.grad(loss_fn)(v)
    updates, state = opt.update(g, state, v)
    return (optax.apply_updates(v, updates), state), None

  (variables, _), _ = jax.lax.scan(step, (variables, opt.init(variables)), None, length=steps)
  return model, variables


def ldp_accuracy(key: jax.Array, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
                 y_test: np.ndarray, num_classes: int,
                 randomize: Callable[[jax.Array, jax.Array], jax.Array] | None, *,
                 hidden: Sequence[int] = (), steps: int = 500,
                 learning_rate: float = 1e-2) -> dict[str, float]:
  """Test accuracy of a classifier trained and tested on LDP-randomized features.

  Args:
    key: PRNG key; fold_in(key, 0) randomizes training, 1 testing, 2 initialises.
    x_train, y_train: training features [n, d] and labels.
    x_test, y_test: test features and labels.
    num_classes: number of classes.
    randomize: the client's mechanism `(key, x) -> x'` (rows randomized independently), or
      None for no LDP.
    hidden, steps, learning_rate: the classifier (see `train_classifier`).

  Returns:
    {'accuracy', 'accuracy_ci_low', 'accuracy_ci_high'} (Clopper-Pearson 95%) and
    'accuracy_n' (test examples).
  """
  x_train = jnp.asarray(x_train, jnp.float32)
  x_test = jnp.asarray(x_test, jnp.float32)
  if randomize is not None:
    x_train = randomize(jax.random.fold_in(key, 0), x_train)
    x_test = randomize(jax.random.fold_in(key, 1), x_test)
  mean = jnp.mean(x_train, axis=0)
  std = jnp.std(x_train, axis=0) + 1e-6
  x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
  fit = _fit_and_predict(num_classes, tuple(hidden), int(steps), float(learning_rate))
  pred = fit(jax.random.fold_in(key, 2), x_train, jnp.asarray(y_train, jnp.int32), x_test)
  correct = int(jnp.sum(pred == jnp.asarray(y_test)))
  out = stats.rate('accuracy', correct, len(y_test))
  out['accuracy_n'] = int(len(y_test))
  return out


@functools.lru_cache(maxsize=8)
def _fit_and_predict(num_classes: int, hidden: tuple, steps: int, learning_rate: float):
  # Compiled once per classifier setting and data shape, reused across sweep points.
  def fit(key, x_train, y_train, x_test):
    model, variables = train_classifier(key, x_train, y_train, num_classes, hidden=hidden,
                                        steps=steps, learning_rate=learning_rate)
    return jnp.argmax(model.apply(variables, x_test), axis=-1)
  return jax.jit(fit)


@functools.partial(jax.jit, static_argnames=('apply_fn',))
def _correct(apply_fn, params, x, y):
  return jnp.sum(jnp.argmax(apply_fn(params, x), -1) == y)


def count_correct(apply_fn, params, x: np.ndarray, y: np.ndarray, batch: int = 1024) -> int:
  """Correct predictions of `params` on (x, y), in fixed-size batches (the last one wrapped).

  Every batch has `batch` rows (the wrapped rows get label -1, never counted), so one compiled
  program serves every call.
  """
  n = len(y)
  total = 0
  for start in range(0, n, batch):
    idx = np.arange(start, start + batch) % n
    stop = min(start + batch, n)
    keep = np.arange(batch) < stop - start
    total += int(_correct(apply_fn, params, jnp.asarray(x[idx]),
                          jnp.asarray(np.where(keep, y[idx], -1))))
  return total


def training_metrics(arrays: dict) -> dict[str, float]:
  """Utility, gap, DP and regulariser diagnostics of one recorded PASTEL training.

  `arrays` as `attacks.passive.pastel.record` returns them (+ `num_test`): test accuracy with
  its Clopper-Pearson interval, the clients' mean local accuracy, member accuracy, the
  generalization gap (member - test accuracy) and the stored diagnostics.
  """
  m = {}
  n_test = int(arrays['num_test'])
  m.update(stats.rate('accuracy', int(arrays['test_correct']), n_test))
  m['local_accuracy_mean'] = float(np.mean(arrays['local_test_correct']) / n_test)
  m['member_accuracy'] = float(arrays['member_correct']) / float(arrays['num_members'])
  m['generalization_gap'] = m['member_accuracy'] - m['accuracy']
  for name in ('dp_epsilon', 'dp_epsilon_per_round', 'noise_multiplier', 'clip_fraction',
               'jsd_last_round', 'upload_norm_median'):
    m[name] = float(arrays[name])
  return m


def pooled_training_metrics(replicas: Sequence[dict]) -> dict[str, float]:
  """`training_metrics` of replicate trainings pooled: counts summed (test accuracy is the
  correct predictions of every replicate's model over all their test predictions, its
  Clopper-Pearson interval over those), the diagnostics averaged over replicates."""
  if len(replicas) == 1:
    return training_metrics(replicas[0])
  pooled = {name: sum(int(a[name]) for a in replicas)
            for name in ('num_test', 'test_correct', 'member_correct', 'num_members')}
  pooled['local_test_correct'] = np.concatenate(
      [np.asarray(a['local_test_correct'], np.float64) * len(replicas) for a in replicas])
  for name in ('dp_epsilon', 'dp_epsilon_per_round', 'noise_multiplier', 'clip_fraction',
               'jsd_last_round', 'upload_norm_median'):
    pooled[name] = float(np.mean([float(a[name]) for a in replicas]))
  return training_metrics(pooled)
