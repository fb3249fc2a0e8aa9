"""Reading and writing single neurons of a parameter pytree.

A malicious server "crafts" a model by writing chosen weights into chosen
neurons (AMI's crafted block, the dishonest-server detector). These helpers do
that by path, purely: they return a new pytree and never modify their input.

Conventions: `layer_path` is a tuple of keys down to a layer's dict, such as
`('params', 'fc1')` for a variables dict or `('fc1',)` for a bare params dict.
The layer holds `kernel` (Dense `[in, out]`, Conv `[kh, kw, in, out]`) and
optionally `bias` `[out]`. Neuron `index` is position `index` of the last kernel
axis, so its weights have shape `kernel.shape[:-1]`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Params = Any


def _path_str(layer_path: Sequence[str]) -> str:
  return '/'.join(str(k) for k in layer_path)


def _check_path(layer_path) -> tuple:
  if isinstance(layer_path, str) or not isinstance(layer_path, Sequence):
    raise TypeError('layer_path must be a tuple of keys such as '
                    f"('params', 'fc1') (got {layer_path!r})")
  if not layer_path:
    raise ValueError('layer_path must not be empty')
  return tuple(layer_path)


def _get_layer(params: Params, layer_path) -> Mapping:
  node = params
  for depth, key in enumerate(layer_path):
    if not isinstance(node, Mapping) or key not in node:
      keys = sorted(node) if isinstance(node, Mapping) else type(node).__name__
      raise KeyError(f'layer path {_path_str(layer_path)!r}: no key {key!r} at '
                     f'{_path_str(layer_path[:depth]) or "<root>"} '
                     f'(available: {keys})')
    node = node[key]
  if not isinstance(node, Mapping) or 'kernel' not in node:
    raise KeyError(f'{_path_str(layer_path)!r} is not a layer with a kernel')
  return node


def _set_layer(params: Params, layer_path, layer: Mapping) -> Params:
  """A copy of `params` whose dict at `layer_path` is `layer`."""
  if not layer_path:
    return layer
  head, rest = layer_path[0], layer_path[1:]
  new = dict(params)
  new[head] = _set_layer(params[head], rest, layer)
  return type(params)(new) if not isinstance(params, dict) else new


def _check_index(index, num_neurons: int, layer_path) -> None:
  if isinstance(index, (int, np.integer)):
    if not -num_neurons <= index < num_neurons:
      raise IndexError(f'neuron index {index} out of range for '
                       f'{_path_str(layer_path)!r} with {num_neurons} neurons')


def _check_shape(name: str, got, want: tuple, layer_path) -> jnp.ndarray:
  value = jnp.asarray(got)
  if value.shape != tuple(want):
    raise ValueError(f'{name} for {_path_str(layer_path)!r} must have shape '
                     f'{tuple(want)} (got {value.shape})')
  return value


def read_neuron(params: Params, layer_path, index) -> tuple:
  """Weights and bias of one neuron.

  Args:
    params: Parameter pytree (nested dicts).
    layer_path: Keys down to the layer, e.g. `('params', 'fc1')`.
    index: Neuron (output unit / channel) index; may be traced.

  Returns:
    `(weights, bias)`: weights of shape `kernel.shape[:-1]`; bias a scalar, or
    None when the layer has no bias.
  """
  layer_path = _check_path(layer_path)
  layer = _get_layer(params, layer_path)
  kernel = layer['kernel']
  _check_index(index, kernel.shape[-1], layer_path)
  bias = layer.get('bias')
  return kernel[..., index], (None if bias is None else bias[index])


def write_neuron(params: Params, layer_path, index, weights,
                 bias=None) -> Params:
  """A copy of `params` with one neuron's weights (and bias) replaced.

  Args:
    params: Parameter pytree (nested dicts); left unchanged.
    layer_path: Keys down to the layer, e.g. `('params', 'fc1')`.
    index: Neuron index (column of a Dense kernel); may be traced.
    weights: New incoming weights, shape `kernel.shape[:-1]`.
    bias: New bias (scalar); None keeps the current bias.

  Returns:
    The new pytree; the neuron's pre-activation is then `weights . x + bias`.

  Raises:
    KeyError: the path does not lead to a layer with a kernel.
    ValueError: a shape does not match, or a bias is given for a layer without.
    IndexError: a concrete `index` is out of range.
  """
  layer_path = _check_path(layer_path)
  layer = dict(_get_layer(params, layer_path))
  kernel = layer['kernel']
  _check_index(index, kernel.shape[-1], layer_path)
  weights = _check_shape('weights', weights, kernel.shape[:-1], layer_path)
  layer['kernel'] = kernel.at[..., index].set(weights.astype(kernel.dtype))
  if bias is not None:
    if 'bias' not in layer:
      raise ValueError(f'{_path_str(layer_path)!r} has no bias to write')
    bias = _check_shape('bias', bias, (), layer_path)
    old = layer['bias']
    layer['bias'] = old.at[index].set(bias.astype(old.dtype))
  return _set_layer(params, layer_path, layer)


def write_layer(params: Params, layer_path, kernel=None, bias=None) -> Params:
  """A copy of `params` with a layer's whole kernel and/or bias replaced.

  Args:
    params: Parameter pytree (nested dicts); left unchanged.
    layer_path: Keys down to the layer, e.g. `('params', 'fc2')`.
    kernel: New kernel with the current kernel's shape; None keeps it.
    bias: New bias with the current bias's shape; None keeps it.

  Returns:
    The new pytree.

  Raises:
    KeyError: the path does not lead to a layer with a kernel.
    ValueError: a shape does not match, or a bias is given for a layer without.
  """
  layer_path = _check_path(layer_path)
  layer = dict(_get_layer(params, layer_path))
  if kernel is not None:
    old = layer['kernel']
    layer['kernel'] = _check_shape('kernel', kernel, old.shape,
                                   layer_path).astype(old.dtype)
  if bias is not None:
    if 'bias' not in layer:
      raise ValueError(f'{_path_str(layer_path)!r} has no bias to write')
    old = layer['bias']
    layer['bias'] = _check_shape('bias', bias, old.shape,
                                 layer_path).astype(old.dtype)
  return _set_layer(params, layer_path, layer)


def param_count(params: Params) -> int:
  """Total number of scalars in the leaves of `params` (works on shapes too)."""
  return int(sum(int(np.prod(leaf.shape))
                 for leaf in jax.tree_util.tree_leaves(params)))
