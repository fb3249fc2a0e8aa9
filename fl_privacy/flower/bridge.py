"""Flax parameter pytrees <-> Flower `ArrayRecord` (Flower 1.42 Message API).

A pytree's leaves go into the record in `jax.tree_util` flattening order, each under its path
name: the dict keys (sequence indices, attribute names) from the root joined by '/', e.g.
`params/fc1/kernel` for `{'params': {'fc1': {'kernel': ...}}}` (`param_names`). Flower stores
each array as `np.save` bytes, so the round trip `from_array_record(to_array_record(tree),
tree)` gives back every leaf bit for bit.

Reading checks the record against a template pytree (the model's variables, or anything with
the same structure, shapes and dtypes: `jax.eval_shape(model.init, ...)` works too): the names
must be exactly the template's, and each array's dtype and shape the template leaf's. The
first mismatching array (in the template's order) is named in a `RecordMismatchError`.
Dtypes that `np.save` cannot store natively (bfloat16 and the other `ml_dtypes`: they come
back as raw void bytes, and FedAvg cannot average them) are refused when writing.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from flwr.app import Array, ArrayRecord, RecordDict

# Flower's serialization type of numpy arrays (`flwr.common.constant.SType.NUMPY`).
NUMPY_STYPE = 'numpy.ndarray'


class RecordMismatchError(ValueError):
  """An `ArrayRecord` does not fit the template pytree (names, dtypes or shapes)."""


def _key_name(entry: Any) -> str:
  for attr in ('key', 'idx', 'name'):
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  return str(entry)


def _named_leaves(tree: Any) -> tuple[list[tuple[str, Any]], Any]:
  leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
  named = [('/'.join(_key_name(e) for e in path), leaf) for path, leaf in leaves]
  names = [n for n, _ in named]
  if len(set(names)) != len(names):
    dup = next(n for n in names if names.count(n) > 1)
    raise ValueError(f'two leaves of the pytree share the name {dup!r} (keys containing "/"?)')
  return named, treedef


def param_names(tree: Any) -> list[str]:
  """The record names of `tree`'s leaves, in the fixed (flattening) order."""
  return [n for n, _ in _named_leaves(tree)[0]]


def _check_dtype(name: str, dtype: np.dtype) -> None:
  if dtype.kind not in 'biufc':
    raise TypeError(
        f'array {name!r} has dtype {dtype}, which Flower stores as raw bytes (np.save without '
        'pickle) and cannot average; cast the parameters to float32 (or another numpy dtype)')


def to_array_record(tree: Any) -> ArrayRecord:
  """An `ArrayRecord` holding every leaf of `tree` under its path name, in flattening order.

  Args:
    tree: A pytree of arrays (jax or numpy), e.g. Flax variables `{'params': {...}}`.

  Returns:
    The record; `from_array_record(record, tree)` gives the leaves back bit for bit.

  Raises:
    TypeError: a leaf's dtype is not a native numpy number type (e.g. bfloat16).
  """
  record = ArrayRecord()
  for name, leaf in _named_leaves(tree)[0]:
    array = np.asarray(leaf, order='C')  # (np.ascontiguousarray would make a 0-d leaf 1-d)
    _check_dtype(name, array.dtype)
    record[name] = Array(array)
  return record


def _template_spec(leaf: Any) -> tuple[np.dtype, tuple[int, ...]]:
  return np.dtype(leaf.dtype), tuple(int(d) for d in leaf.shape)


def check_record(record: ArrayRecord, template: Any) -> None:
  """Raises `RecordMismatchError` naming the first array of `record` that does not fit.

  Checks, in the template's order: every template name is present with the template leaf's
  dtype and shape (from the record's metadata and from the decoded array), then that the
  record holds no other name.
  """
  if not isinstance(record, ArrayRecord):
    raise TypeError(f'expected a flwr.app.ArrayRecord, got {type(record).__name__}')
  named, _ = _named_leaves(template)
  for name, leaf in named:
    if name not in record:
      raise RecordMismatchError(
          f'array {name!r} of the template is missing from the ArrayRecord '
          f'(it holds {sorted(record.keys())[:8]}{"..." if len(record) > 8 else ""})')
    dtype, shape = _template_spec(leaf)
    arr = record[name]
    if arr.stype != NUMPY_STYPE:
      raise RecordMismatchError(f'array {name!r}: serialization {arr.stype!r}, expected '
                                f'{NUMPY_STYPE!r}')
    if arr.dtype != str(dtype):
      raise RecordMismatchError(f'array {name!r}: dtype {arr.dtype}, template {dtype}')
    if tuple(arr.shape) != shape:
      raise RecordMismatchError(
          f'array {name!r}: shape {tuple(arr.shape)}, template {shape}')
  extra = [k for k in record.keys() if k not in {n for n, _ in named}]
  if extra:
    raise RecordMismatchError(f'array {extra[0]!r} of the ArrayRecord is not in the template')


def from_array_record(record: ArrayRecord, template: Any) -> Any:
  """The pytree of `template`'s structure with the leaves read from `record` (numpy arrays).

  Args:
    record: An `ArrayRecord` written by `to_array_record` (or by Flower's aggregation of
      such records, which keeps the names).
    template: A pytree with the expected structure, dtypes and shapes (arrays or
      `jax.ShapeDtypeStruct`s).

  Returns:
    The pytree with numpy leaves, bit for bit the arrays of the record.

  Raises:
    RecordMismatchError: a name is missing or extra, or a dtype or shape differs from the
      template's (the message names the first such array).
  """
  check_record(record, template)
  named, treedef = _named_leaves(template)
  leaves = []
  for name, leaf in named:
    array = record[name].numpy()
    dtype, shape = _template_spec(leaf)
    if array.dtype != dtype or array.shape != shape:  # metadata that lies about the bytes
      raise RecordMismatchError(
          f'array {name!r}: decoded dtype {array.dtype} shape {array.shape}, template '
          f'{dtype} {shape}')
    leaves.append(array)
  return jax.tree_util.tree_unflatten(treedef, leaves)


def only_array_record(content: RecordDict) -> tuple[str, ArrayRecord]:
  """(name, record) of the single `ArrayRecord` of a message's content (else ValueError)."""
  records = content.array_records
  if len(records) != 1:
    raise ValueError(f'expected exactly one ArrayRecord in the message, found {len(records)} '
                     f'({sorted(records.keys())})')
  return next(iter(records.items()))
