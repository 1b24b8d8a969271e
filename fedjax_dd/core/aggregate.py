"""Sample-weighted averages of stacked client pytrees, per cohort or per cluster.

DisUE (Leng et al., "Distilling A Universal Expert from Clustered Federated
Learning") aggregates the members of each cluster ``C_k`` by FedAvg (Eq. 2,
Sec. 4.1 "Intra-group Aggregation"): ``ω_Ck = Σ_{i∈C_k} n_i ω_i / Σ_{i∈C_k}
n_i``. :func:`segment_weighted_mean` computes every cluster's average in one
jitted program with a fixed number of segments, so other cluster counts or
memberships reuse it.

Weights are the clients' sample counts ``n_i`` (any non-negative numbers).
A client with weight 0 (e.g. a padding row) contributes nothing, even with
NaN/Inf parameters: its rows are zeroed first, because ``0 · NaN`` is NaN.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["weighted_mean", "segment_weighted_mean"]


def _masked(leaf: jax.Array, weights: jax.Array) -> jax.Array:
  """``leaf [S, ...] * weights [S]`` with weight-0 rows exactly zero."""
  w = weights.reshape((-1,) + (1,) * (leaf.ndim - 1))
  x = leaf.astype(jnp.float32)
  return jnp.where(w > 0, x * w, 0.0)


def weighted_mean(tree: Any, weights: jax.Array) -> Any:
  """``Σ_i w_i x_i / Σ_i w_i`` over the leading client axis (FedAvg).

  Args:
    tree: pytree whose leaves are stacked ``[S, ...]``.
    weights: ``[S]`` non-negative weights, e.g. ``num_examples``.

  Returns:
    The pytree without the client axis, each leaf ``[...]`` in its input
    dtype. All-zero weights give zeros.
  """
  w = weights.astype(jnp.float32)
  w = w / jnp.maximum(w.sum(), 1e-12)

  def avg(x):
    # Weight-0 rows (padding) are zeroed first: 0 · NaN is NaN.
    x32 = jnp.where(w.reshape((-1,) + (1,) * (x.ndim - 1)) > 0,
                    x.astype(jnp.float32), 0.0)
    return jnp.tensordot(w, x32, axes=1).astype(x.dtype)

  return jax.tree_util.tree_map(avg, tree)


@functools.partial(jax.jit, static_argnames=("num_segments",))
def segment_weighted_mean(tree: Any, segment_ids: jax.Array, weights: jax.Array,
                          num_segments: int) -> tuple[Any, jax.Array]:
  """Per-segment weighted means: the cluster models ``ω_Ck`` (Eq. 2).

  ``out[k] = Σ_{i: ids_i = k} w_i x_i / Σ_{i: ids_i = k} w_i``.

  ``num_segments`` is static and should be the largest number of clusters
  a run can produce (e.g. the cohort size), not the current ``K``: the
  program then compiles once and rows ``k >= K`` come back empty.

  Args:
    tree: pytree whose leaves are stacked ``[S, ...]``.
    segment_ids: ``[S]`` int32 cluster id of each client; ids outside
      ``[0, num_segments)`` are dropped (as in ``jax.ops.segment_sum``).
    weights: ``[S]`` non-negative weights (sample counts); weight-0 clients
      contribute nothing, whatever their parameters.
    num_segments: static number of output rows.

  Returns:
    ``(means, segment_weight)``: a pytree with leaves ``[num_segments, ...]``
    in their input dtypes, and ``segment_weight [num_segments]`` float32,
    the total weight of each segment. An empty (or all-zero-weight) segment
    has zeros and weight 0.
  """
  ids = jnp.asarray(segment_ids, jnp.int32)
  w = jnp.asarray(weights, jnp.float32)
  w = jnp.where(w > 0, w, 0.0)
  seg_w = jax.ops.segment_sum(w, ids, num_segments=num_segments)
  safe = jnp.where(seg_w > 0, seg_w, 1.0)

  def mean(leaf):
    summed = jax.ops.segment_sum(_masked(leaf, w), ids,
                                 num_segments=num_segments)
    denom = safe.reshape((-1,) + (1,) * (leaf.ndim - 1))
    return (summed / denom).astype(leaf.dtype)

  return jax.tree_util.tree_map(mean, tree), seg_w
