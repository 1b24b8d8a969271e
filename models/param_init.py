"""Parameter initialisation schemes beyond the layers' own (Flax's).

Flax's ``nn.Dense`` and ``nn.Conv`` draw kernels LeCun-normal (truncated,
variance ``1 / fan_in``) and set biases to zero. PyTorch's ``nn.Linear`` and
``nn.Conv2d`` (``reset_parameters``) draw both kernel and bias uniformly on
``[-1/sqrt(fan_in), 1/sqrt(fan_in)]`` (Kaiming-uniform with ``a = sqrt(5)``,
whose bound ``gain * sqrt(3 / fan_in)`` is ``1 / sqrt(fan_in)``). The two
start federated training visibly differently
(``experiments/results/fedftg_reference_fmnist.md``); :func:`torch_default`
lets a run start as a PyTorch reference does.
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp

PyTree = Any


def _layer_key(key: jax.Array, path: tuple[str, ...]) -> jax.Array:
  # One key per layer, by its name: adding a layer elsewhere in the tree
  # leaves every other layer's draw unchanged.
  return jax.random.fold_in(key, zlib.crc32("/".join(path).encode()))


def torch_default(params: PyTree, key: jax.Array) -> PyTree:
  """Re-draws every kernel and its bias as PyTorch's defaults do.

  A layer is a dict holding a ``kernel`` of rank >= 2 (Dense ``[in, out]``,
  Conv ``[kh, kw, in / groups, out]``); ``fan_in = prod(kernel.shape[:-1])``.
  Its kernel and ``bias`` (if any) become ``U(-1/sqrt(fan_in),
  1/sqrt(fan_in))``; everything else (BatchNorm's scale 1 and bias 0, as in
  PyTorch) is unchanged.

  Args:
    params: a model's ``params`` tree (as from ``module.init(...)["params"]``).
    key: PRNG key; each layer draws from ``fold_in(key, crc32(path))``.

  Returns:
    A tree of the same structure, shapes and dtypes.
  """
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params))
  out = dict(flat)
  for path, kernel in flat.items():
    if path[-1] != "kernel" or jnp.ndim(kernel) < 2:
      continue
    fan_in = math.prod(kernel.shape[:-1])
    bound = 1.0 / math.sqrt(fan_in)
    k_w, k_b = jax.random.split(_layer_key(key, path[:-1]))
    out[path] = jax.random.uniform(k_w, kernel.shape, kernel.dtype,
                                   -bound, bound)
    bias_path = (*path[:-1], "bias")
    if bias_path in flat:
      bias = flat[bias_path]
      out[bias_path] = jax.random.uniform(k_b, bias.shape, bias.dtype,
                                          -bound, bound)
  return flax.traverse_util.unflatten_dict(out)


# ``model.init`` values: "" keeps the layers' own (Flax's) initialisation.
INIT_SCHEMES: dict[str, Callable[[PyTree, jax.Array], PyTree] | None] = {
    "": None,
    "torch": torch_default,
}


def init_scheme(name: str) -> Callable[[PyTree, jax.Array], PyTree] | None:
  """The re-initialisation of ``model.init = name`` (None: the layers' own).

  Raises:
    ValueError: an unknown name.
  """
  if name not in INIT_SCHEMES:
    raise ValueError(f"Unknown initialisation {name!r}; known: "
                     f"{sorted(INIT_SCHEMES)} ('' = Flax's).")
  return INIT_SCHEMES[name]
