"""Flax pytree <-> Flower ArrayRecord: exact round trip, fixed order, checked mismatches."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest

from flwr.app import Array, ArrayRecord

from fl_privacy.flower import bridge
from tests.flower import common


def _mixed_tree():
  rng = np.random.default_rng(3)
  return {'params': {'b': {'kernel': rng.normal(size=(3, 2)).astype(np.float32),
                           'bias': np.asarray([np.nan, -0.0], np.float32)},
                     'a': {'scale': rng.normal(size=(4,)).astype(np.float64)}},
          'stats': {'count': np.arange(5, dtype=np.int32),
                    'half': rng.normal(size=(2, 2)).astype(np.float16),
                    'scalar': np.float32(1.5)}}


def _bits_equal(a, b) -> bool:
  a, b = np.asarray(a), np.asarray(b)
  return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_round_trip_is_bit_exact_for_a_flax_model():
  model = common.mlp()
  variables = common.init(model)
  back = bridge.from_array_record(bridge.to_array_record(variables), variables)
  assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(variables)
  assert all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(_bits_equal, variables, back)))


def test_round_trip_is_bit_exact_for_mixed_dtypes_nan_and_negative_zero():
  tree = _mixed_tree()
  record = bridge.to_array_record(tree)
  back = bridge.from_array_record(record, tree)
  assert all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(_bits_equal, tree, back)))
  # The bytes Flower carries are np.save of the leaf: a copy through Array survives too.
  copied = ArrayRecord({k: Array(v.dtype, tuple(v.shape), v.stype, bytes(v.data))
                        for k, v in record.items()})
  again = bridge.from_array_record(copied, tree)
  assert all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(_bits_equal, tree, again)))


def test_names_are_flattened_paths_in_fixed_order():
  variables = common.init(common.mlp())
  names = bridge.param_names(variables)
  assert names == ['params/fc1/bias', 'params/fc1/kernel', 'params/fc2/bias',
                   'params/fc2/kernel', 'params/fc3/bias', 'params/fc3/kernel']
  assert list(bridge.to_array_record(variables).keys()) == names
  # Insertion order of the source dicts does not matter, only the flattening order.
  tree = _mixed_tree()
  assert bridge.param_names(tree)[:3] == ['params/a/scale', 'params/b/bias', 'params/b/kernel']


def test_template_may_be_shapes_only():
  model = common.mlp()
  variables = common.init(model)
  template = jax.eval_shape(model.init, jax.random.key(0), np.zeros((1, common.DIM),
                                                                    np.float32))
  back = bridge.from_array_record(bridge.to_array_record(variables), template)
  assert all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(_bits_equal, variables, back)))


@pytest.mark.parametrize('change, message', [
    (lambda r: r.pop('params/fc2/bias'), "'params/fc2/bias' of the template is missing"),
    (lambda r: r.__setitem__('params/fc9/bias', Array(np.zeros(3, np.float32))),
     "'params/fc9/bias' of the ArrayRecord is not in the template"),
    (lambda r: r.__setitem__('params/fc1/kernel', Array(np.zeros((8, 8), np.float64))),
     "'params/fc1/kernel': dtype float64, template float32"),
    (lambda r: r.__setitem__('params/fc3/kernel', Array(np.zeros((4, 2), np.float32))),
     "'params/fc3/kernel': shape (4, 2), template (4, 3)"),
])
def test_mismatch_names_the_array(change, message):
  variables = common.init(common.mlp())
  record = bridge.to_array_record(variables)
  change(record)
  with pytest.raises(bridge.RecordMismatchError) as e:
    bridge.from_array_record(record, variables)
  assert message in str(e.value)


def test_the_first_mismatch_in_template_order_is_named():
  variables = common.init(common.mlp())
  record = bridge.to_array_record(variables)
  record['params/fc3/kernel'] = Array(np.zeros((4, 2), np.float32))
  record['params/fc1/bias'] = Array(np.zeros(7, np.float32))
  with pytest.raises(bridge.RecordMismatchError, match="'params/fc1/bias'"):
    bridge.check_record(record, variables)


def test_metadata_that_lies_about_the_bytes_is_caught():
  variables = common.init(common.mlp())
  record = bridge.to_array_record(variables)
  real = record['params/fc1/bias']
  record['params/fc1/bias'] = Array(real.dtype, tuple(real.shape), real.stype,
                                    Array(np.zeros(5, np.float32)).data)
  with pytest.raises(bridge.RecordMismatchError, match="'params/fc1/bias': decoded"):
    bridge.from_array_record(record, variables)


def test_dtypes_flower_cannot_carry_are_refused():
  with pytest.raises(TypeError, match="'w'.*bfloat16.*float32"):
    bridge.to_array_record({'w': np.ones(3, ml_dtypes.bfloat16)})


def test_not_a_record_is_a_type_error():
  with pytest.raises(TypeError, match='ArrayRecord'):
    bridge.from_array_record({'params/fc1/bias': np.zeros(8)}, common.init(common.mlp()))


def test_only_array_record_needs_exactly_one():
  from flwr.app import RecordDict  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match='exactly one ArrayRecord.*found 0'):
    bridge.only_array_record(RecordDict())
