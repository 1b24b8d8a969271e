"""The Gaussian mechanism on clipped rows, shared by the DP defences.

Both DP-FedAvg (McMahan et al., ICLR 2018: one row per client, its model
delta) and DP-KIP (Vinaroz & Park; Abadi et al. 2016, Alg. 1: one row per
example, its gradient) release ``sum_i clip_C(g_i) + N(0, (z C)^2 I)``,
with ``clip_C(g) = g min(1, C / ||g||)`` and the norm taken over every leaf
of row ``i`` together; they differ only in what a row is and what the sum
is divided by.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


def row_norms(rows: PyTree) -> jax.Array:
  """``[S]`` L2 norm of each row over all its leaves (leaves ``[S, ...]``)."""
  leaves = jax.tree_util.tree_leaves(rows)
  squares = [jnp.sum(jnp.square(d.astype(jnp.float32)).reshape(d.shape[0], -1),
                     axis=1) for d in leaves]
  return jnp.sqrt(sum(squares))


def _scales(norms: jax.Array, clip: float | jax.Array) -> jax.Array:
  return jnp.minimum(1.0, clip / jnp.maximum(norms, jnp.finfo(jnp.float32).tiny))


def clip_rows(rows: PyTree, clip: float | jax.Array
              ) -> tuple[PyTree, jax.Array]:
  """Each row scaled to L2 norm at most ``clip``: ``g min(1, C / ||g||)``
  (a row within the norm is kept exactly, a longer one keeps its
  direction).

  Args:
    rows: pytree whose leaves are stacked ``[S, ...]``.
    clip: ``C > 0``.

  Returns:
    ``(clipped, norms)``: the clipped rows (leaves ``[S, ...]``, in their
    dtypes) and the norms ``[S]`` before clipping.
  """
  norms = row_norms(rows)
  scale = _scales(norms, clip)

  def one(d):
    s = scale.reshape((-1,) + (1,) * (d.ndim - 1))
    return (d.astype(jnp.float32) * s).astype(d.dtype)

  return jax.tree_util.tree_map(one, rows), norms


def noised_sum(rows: PyTree, key: jax.Array, *, clip: float | jax.Array,
               noise_multiplier: float | jax.Array,
               valid: jax.Array | None = None) -> PyTree:
  """``sum_i clip_C(g_i) + N(0, (z C)^2 I)`` over the valid rows.

  Args:
    rows: pytree whose leaves are stacked ``[S, ...]``.
    key: the noise key; leaf ``j`` draws from ``fold_in(key, j)``.
    clip: ``C > 0``.
    noise_multiplier: ``z >= 0``.
    valid: ``[S]`` bool, False for rows that are none (padding, an example
      slot not taken): left out, whatever they hold. None: every row.

  Returns:
    The pytree without the row axis, leaves ``[...]`` in their dtypes.
  """
  scale = _scales(row_norms(rows), clip)
  if valid is not None:
    scale = jnp.where(valid, scale, 0.0)
  leaves, treedef = jax.tree_util.tree_flatten(rows)
  std = noise_multiplier * clip
  out = []
  for j, g in enumerate(leaves):
    s = scale.reshape((-1,) + (1,) * (g.ndim - 1))
    x = g.astype(jnp.float32)
    total = jnp.sum(jnp.where(s > 0, x * s, 0.0), axis=0)
    noise = jax.random.normal(jax.random.fold_in(key, j), total.shape,
                              jnp.float32)
    out.append((total + std * noise).astype(g.dtype))
  return jax.tree_util.tree_unflatten(treedef, out)
