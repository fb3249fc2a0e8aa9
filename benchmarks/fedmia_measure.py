"""Throughput of `fl.queries.measure` vs the FedMIA code's algorithm, written in JAX.

Both sides compute the same thing for Q queries and K uploads: the loss of each query under
each local model w_t - Delta_k, and the cosine and difference of each query's gradient at w_t
with each Delta_k, plus ||g||^2. `queries.measure` computes each query's per-example gradient
once per chunk and reuses it for all K updates (one matrix product); the reference follows the
authors' code (`main.py`): a loop over clients, and for each client a loop over the queries in
batches of 10 that recomputes the per-example gradients and the losses (a jitted function per
batch). Compilation is excluded on both sides. Outputs are compared (max absolute difference).

Rows: digits MLP(128) (Q = 1,797, K = 10) and AlexNet-CIFAR on 32x32x3 inputs (Q = 64, K = 10,
random data and updates; it runs offline), each `measure` chunk size in its own process, so the
peak RSS column (VmHWM) belongs to that chunk size alone.

  python -m benchmarks.fedmia_measure
  python -m benchmarks.fedmia_measure --models=mlp --chunks=64,512

Throughput: query x client measurements per second. The chunk size the experiment uses by
default (`fedmia.chunk_size`: 32 on digits, 256 on the CIFAR configs) is always measured and
marked "config default"; the last printed line, the JSON summary of `benchmarks.common.report`,
headlines the first model at that default vs its reference (the fastest chunk is a row of its
own).
"""

from __future__ import annotations

import json
import subprocess
import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from fl_privacy import data as data_lib
from fl_privacy import models as models_lib
from fl_privacy.fl import losses
from fl_privacy.fl import queries

_MODELS = flags.DEFINE_list('models', ['mlp', 'alexnet_cifar'], 'Models to time.')
_CHUNKS = flags.DEFINE_list('chunks', ['16', '128', '1024'], 'measure chunk sizes.')
_CLIENTS = flags.DEFINE_integer('clients', 10, 'K.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed repetitions (median).')
_CHILD = flags.DEFINE_string('child', None, 'Internal: "<model>:<chunk or reference>".')

REFERENCE_BATCH = 10  # the code's batches of per-example gradients


def _setup(model_name: str, num_clients: int):
  key = jax.random.key(0)
  if model_name == 'mlp':
    config = {'name': 'digits', 'data_dir': None, 'path': None, 'attribute': 'Smiling',
              'image_size': None, 'max_examples': None}
    splits = data_lib.load(config)
    x = np.concatenate([data_lib.to_float(splits['train'].x), data_lib.to_float(splits['test'].x)])
    y = np.concatenate([splits['train'].y, splits['test'].y]).astype(np.int32)
    model = models_lib.MLP(hidden=(128,), num_classes=10)
  else:
    rng = np.random.default_rng(0)
    x = rng.random((64, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 100, 64).astype(np.int32)
    model = models_lib.AlexNetCifar(num_classes=100)
  params = model.init(jax.random.fold_in(key, 1), jnp.asarray(x[:1]))
  uploads = jax.tree_util.tree_map(
      lambda p: 1e-2 * jax.random.normal(jax.random.fold_in(key, 2), (num_clients,) + p.shape),
      params)
  return model, params, uploads, jnp.asarray(x), jnp.asarray(y)


def reference(model, params, uploads, x, y):
  """The code's algorithm: per client, per batch of 10 queries, recompute the gradients."""
  apply_fn = model.apply

  @jax.jit
  def one_batch(upload, xb, yb):
    def example_loss(p, xi, yi):
      return losses.per_example_cross_entropy(apply_fn(p, xi[None]), yi[None])[0]
    g = jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0))(params, xb, yb)
    g = queries.flatten_stack(g)
    d = jnp.concatenate([jnp.ravel(a) for a in jax.tree_util.tree_leaves(upload)])
    dots = jnp.matmul(g, d, precision=jax.lax.Precision.HIGHEST)
    gsq = jnp.sum(g * g, axis=1)
    cos = dots / jnp.maximum(jnp.sqrt(gsq) * jnp.linalg.norm(d), 1e-30)
    local = jax.tree_util.tree_map(jnp.subtract, params, upload)
    logits = apply_fn(local, xb)
    loss = losses.per_example_cross_entropy(logits, yb)
    return loss, cos, 2 * dots - gsq, gsq, losses.true_label_margin(logits, yb)

  num_clients = jax.tree_util.tree_leaves(uploads)[0].shape[0]
  q = x.shape[0]
  outs = []
  for k in range(num_clients):
    upload = jax.tree_util.tree_map(lambda a: a[k], uploads)
    parts = [one_batch(upload, x[i:i + REFERENCE_BATCH], y[i:i + REFERENCE_BATCH])
             for i in range(0, q, REFERENCE_BATCH)]
    outs.append([jnp.concatenate([p[j] for p in parts]) for j in range(5)])
  return queries.Measurements(loss=jnp.stack([o[0] for o in outs]),
                              cos=jnp.stack([o[1] for o in outs]),
                              diff=jnp.stack([o[2] for o in outs]), grad_sq=outs[0][3],
                              margin=jnp.stack([o[4] for o in outs]))


def _child(spec: str) -> None:
  model_name, what = spec.split(':')
  model, params, uploads, x, y = _setup(model_name, _CLIENTS.value)
  if what == 'reference':
    fn = lambda: reference(model, params, uploads, x, y)
  else:
    fn = lambda: queries.measure(model.apply, params, uploads, x, y, chunk_size=int(what))
  seconds = common.time_median(fn, repeats=_REPEATS.value)
  ours = queries.measure(model.apply, params, uploads, x, y, chunk_size=64)
  out = fn()
  diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(ours, out))
  print(json.dumps(dict(seconds=seconds, rss=common.peak_rss_mb(), max_abs_diff=diff,
                        q=int(x.shape[0]))))


def _default_chunk(model_name: str) -> int:
  """`fedmia.chunk_size` of the config this model runs under by default."""
  from configs import cifar100, digits  # pylint: disable=g-import-not-at-top
  return int((digits if model_name == 'mlp' else cifar100).get_config().fedmia.chunk_size)


def main(argv):
  del argv
  if _CHILD.value:
    _child(_CHILD.value)
    return
  k = _CLIENTS.value
  rows = []
  summary = None
  for model_name in _MODELS.value:
    results = {}
    default = str(_default_chunk(model_name))
    chunks = list(dict.fromkeys(list(_CHUNKS.value) + [default]))
    for what in ['reference'] + chunks:
      proc = subprocess.run([sys.executable, '-m', 'benchmarks.fedmia_measure',
                             f'--child={model_name}:{what}', f'--clients={k}',
                             f'--repeats={_REPEATS.value}'], capture_output=True, text=True,
                            check=True)
      results[what] = json.loads(proc.stdout.strip().splitlines()[-1])
      # Each child as it finishes: a run stopped at a deadline still leaves its figures.
      print(f'{model_name} {what}: {results[what]}', file=sys.stderr, flush=True)
    ref = results['reference']
    q = ref['q']
    for what, r in results.items():
      rows.append(dict(model=model_name, Q=q, K=k,
                       mode='code algorithm (per client, batches of 10)' if what == 'reference'
                       else f'measure, chunk {min(int(what), q)}' + (
                           ' (config default)' if what == default else ''),
                       seconds=r['seconds'], measurements_per_s=q * k / r['seconds'],
                       speedup=ref['seconds'] / r['seconds'], peak_rss_mb=r['rss'],
                       max_abs_diff_vs_chunk64=r['max_abs_diff']))
    if summary is None:
      summary = (q * k / results[default]['seconds'], q * k / ref['seconds'],
                 results[default]['rss'])
  print(f'backend {jax.default_backend()}; same outputs: max |difference| column '
        '(loss, cos, diff, grad_sq, margin vs measure at chunk 64)')
  common.report('fedmia_measure', rows, *summary)


if __name__ == '__main__':
  app.run(main)
