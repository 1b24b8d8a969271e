"""Shared stages of the FedAvg family: client training and server update.

Every multi-round algorithm here is ``client_stage`` (one batched program over
the cohort) followed by an aggregation rule and ``server_step``. The
algorithms differ only in the hooks they pass and in how they aggregate.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_dd.core.algorithm import Cohort, ServerState
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import LocalResult, LocalUpdate

PyTree = Any

tree_map = jax.tree_util.tree_map


def client_stage(local: LocalUpdate, mapper: ClientMapper) -> Callable[..., LocalResult]:
  """Local training of a cohort from the broadcast server model.

  Each client starts a fresh local optimizer from the server parameters.

  Returns:
    ``train(params, batch_stats, shared_ctx, cohort, keys [S], client_ctx)``
    returning a :class:`LocalResult` stacked ``[S, ...]``. ``shared_ctx`` is
    broadcast to every client, ``client_ctx`` is per client; the local hooks
    receive ``(shared_ctx, client_ctx)``.
  """

  def one_client(params, batch_stats, shared_ctx, x, y, n, num_steps, key,
                 client_ctx):
    opt_state = local.optimizer.init(params)
    return local.run(params, batch_stats, opt_state, x, y, n, num_steps, key,
                     (shared_ctx, client_ctx))

  mapped = mapper.map(one_client,
                      in_axes=(None, None, None, 0, 0, 0, 0, 0, 0))

  def train(params, batch_stats, shared_ctx, cohort: Cohort, keys, client_ctx):
    return mapped(params, batch_stats, shared_ctx, cohort.x, cohort.y,
                  cohort.num_examples, cohort.num_steps, keys, client_ctx)

  return train


def weighted_mean(tree: PyTree, weights: jax.Array) -> PyTree:
  """``Σ_i w_i · tree[i] / Σ_i w_i`` over the leading axis ``[S, ...]``."""
  w = weights.astype(jnp.float32)
  w = w / jnp.maximum(w.sum(), 1e-12)

  def avg(x):
    return jnp.tensordot(w, x.astype(jnp.float32), axes=1).astype(x.dtype)

  return tree_map(avg, tree)


def deltas(client_params: PyTree, server_params: PyTree) -> PyTree:
  """``y_i − x`` for stacked client params ``[S, ...]``."""
  return tree_map(lambda y, x: y - x[None], client_params, server_params)


def server_step(server_opt: optax.GradientTransformation, server: ServerState,
                delta: PyTree, batch_stats: PyTree) -> ServerState:
  """Applies an aggregated update through the server optimizer.

  The server treats ``−delta`` as a pseudo-gradient, so ``optax.sgd(1.0)``
  gives plain FedAvg (``x ← x + delta``) and other optimizers give FedOpt.
  """
  pseudo_grad = tree_map(jnp.negative, delta)
  updates, opt_state = server_opt.update(pseudo_grad, server.opt_state,
                                         server.params)
  params = optax.apply_updates(server.params, updates)
  return server.replace(params=params, opt_state=opt_state,
                        batch_stats=batch_stats)


def cohort_metrics(result: LocalResult, weights: jax.Array) -> dict[str, jax.Array]:
  """Train loss/accuracy averaged over clients, weighted by active steps."""
  w = result.steps * (weights > 0)
  total = jnp.maximum(w.sum(), 1.0)
  return {
      "train_loss": (result.loss * w).sum() / total,
      "train_accuracy": (result.accuracy * w).sum() / total,
      "local_steps_mean": result.steps.mean(),
  }


def client_keys(key: jax.Array, client_ids: jax.Array) -> jax.Array:
  """One key per client, derived from the round key and the client's id.

  Deriving from the id (not the cohort position) keeps a client's randomness
  the same whatever the cohort composition, and identical across backends.
  """
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(client_ids)
