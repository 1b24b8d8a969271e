"""Pairwise cosine similarity of client updates (DisUE, Sec. 4.1, Eq. 3).

DisUE (Leng et al., "Distilling A Universal Expert from Clustered Federated
Learning") clusters the clients of a round by the cosine similarity of their
models, ``Sim(u, v) = ω_u · ω_v / (‖ω_u‖ ‖ω_v‖)`` (Eq. 3), then runs
affinity propagation on ``Sim`` (Eq. 4, :mod:`fedjax_dd.cluster.affinity`).

Eq. 3 names the parameter vectors ``ω_u``, but every client of a round starts
from the same ``ω_G``, so raw-parameter cosines sit near 1 whatever the
clients learned; Sec. 4.1 speaks of "gradient updates". The default is
therefore the update ``Δ_i = ω_i − ω_G`` (``mode="delta"``); ``mode="raw"``
is Eq. 3 read literally.

Callers pass parameters only, never BatchNorm ``batch_stats`` (running
statistics are not updates of a loss and would dominate the norms).
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp

__all__ = ["flatten_params", "update_vectors", "cosine_matrix",
           "update_similarity", "MODES"]

Mode = Literal["delta", "raw"]
MODES: tuple[str, ...] = ("delta", "raw")


def flatten_params(tree: Any) -> jax.Array:
  """Stacked parameters as one row per client.

  Args:
    tree: pytree of parameters whose leaves are stacked ``[S, ...]``.

  Returns:
    ``[S, P]`` float32, the leaves raveled per client and concatenated in
    ``jax.tree_util.tree_leaves`` order (``P`` = parameters per client).
  """
  leaves = jax.tree_util.tree_leaves(tree)
  if not leaves:
    raise ValueError("flatten_params got an empty pytree.")
  sizes = {leaf.shape[0] if leaf.ndim else None for leaf in leaves}
  if len(sizes) != 1 or None in sizes:
    raise ValueError(
        f"Every leaf must be stacked on the same leading client axis; got "
        f"leading sizes {sizes}.")
  s = sizes.pop()
  return jnp.concatenate(
      [jnp.reshape(leaf, (s, -1)).astype(jnp.float32) for leaf in leaves],
      axis=1)


def update_vectors(client_params: Any, global_params: Any, *,
                   mode: Mode = "delta") -> jax.Array:
  """The vectors whose cosines Eq. 3 takes.

  Args:
    client_params: pytree stacked ``[S, ...]``: each client's ``ω_i``.
    global_params: the same pytree unstacked: the round's ``ω_G``.
    mode: ``"delta"`` for ``Δ_i = ω_i − ω_G`` (the default, the "gradient
      updates" of Sec. 4.1) or ``"raw"`` for ``ω_i`` (Eq. 3 literally;
      ``global_params`` is then unused).

  Returns:
    ``[S, P]`` float32.
  """
  if mode == "raw":
    return flatten_params(client_params)
  if mode != "delta":
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
  # Subtract before casting: the difference is taken in the leaves' dtype.
  delta = jax.tree_util.tree_map(lambda c, g: c - g[None], client_params,
                                 global_params)
  return flatten_params(delta)


def cosine_matrix(v: jax.Array) -> jax.Array:
  """All pairwise cosines, one matmul on the device (Eq. 3).

  A zero row (a client whose update is zero) has similarity 0 with every
  client, itself included, instead of NaN; a non-zero row has exactly 1 on
  the diagonal.

  Args:
    v: ``[S, P]``.

  Returns:
    ``[S, S]`` float32 in ``[-1, 1]``, symmetric.
  """
  v = jnp.asarray(v, jnp.float32)
  norms = jnp.linalg.norm(v, axis=1)
  nonzero = norms > 0
  unit = v / jnp.where(nonzero, norms, 1.0)[:, None]
  # HIGHEST: on accelerators the default matmul precision (bf16 passes)
  # would cost cosines their third decimal.
  sim = jnp.matmul(unit, unit.T, precision=jax.lax.Precision.HIGHEST)
  sim = jnp.clip(sim, -1.0, 1.0)
  # Exact diagonal: rounding leaves it a few ulp off 1.
  eye = jnp.eye(v.shape[0], dtype=bool)
  return jnp.where(eye, nonzero.astype(jnp.float32)[:, None], sim)


@functools.partial(jax.jit, static_argnames=("mode",))
def update_similarity(client_params: Any, global_params: Any, *,
                      mode: Mode = "delta") -> jax.Array:
  """``Sim`` of Eq. 3 for one round's cohort, as one jitted program.

  ``mode="delta"`` by default; see the module docstring for why.

  Args:
    client_params: parameters stacked ``[S, ...]`` (no ``batch_stats``).
    global_params: the round's global parameters, unstacked.
    mode: ``"delta"`` or ``"raw"`` (static).

  Returns:
    ``[S, S]`` float32 cosine matrix (see :func:`cosine_matrix`).
  """
  return cosine_matrix(update_vectors(client_params, global_params, mode=mode))
