"""Shared stages of the FedAvg family: client training and server update.

Every multi-round algorithm here is ``client_stage`` (one batched program over
the cohort) followed by an aggregation rule and ``server_step``. The
algorithms differ only in the hooks they pass and in how they aggregate.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjax_dd.core.aggregate import weighted_mean  # noqa: F401  (re-exported)
from fedjax_dd.core.algorithm import Cohort, ServerState
# ``client_stage`` lives in the core (distill/ uses it too); re-exported here.
from fedjax_dd.core.clients import client_span_stage  # noqa: F401
from fedjax_dd.core.clients import client_stage  # noqa: F401
from fedjax_dd.core.local import LocalResult

PyTree = Any

tree_map = jax.tree_util.tree_map


def class_counts(cohort: Cohort, num_classes: int) -> jax.Array:
  """``[S, C]`` int32 examples per class of each client (padding excluded)."""
  valid = jnp.arange(cohort.y.shape[1])[None, :] < cohort.num_examples[:, None]
  one_hot = jax.nn.one_hot(cohort.y, num_classes, dtype=jnp.int32)
  return jnp.sum(one_hot * valid[..., None].astype(jnp.int32), axis=1)


def deltas(client_params: PyTree, server_params: PyTree) -> PyTree:
  """``y_i − x`` for stacked client params ``[S, ...]``."""
  return tree_map(lambda y, x: y - x[None], client_params, server_params)


def server_step(server_opt: optax.GradientTransformation, server: ServerState,
                delta: PyTree, batch_stats: PyTree, *,
                extra: dict[str, Any] | None = None) -> ServerState:
  """Applies an aggregated update through the server optimizer.

  The server treats ``−delta`` as a pseudo-gradient, so ``optax.sgd(1.0)``
  gives plain FedAvg (``x ← x + delta``) and other optimizers give FedOpt.

  Args:
    server_opt: the server optimizer.
    server: the state before the round.
    delta: the aggregated update.
    batch_stats: the new BatchNorm statistics.
    extra: entries of ``server.extra`` this round replaces (SCAFFOLD's
      ``c``, FedDyn's ``h``); the others are kept.

  Returns:
    The new server state.
  """
  pseudo_grad = tree_map(jnp.negative, delta)
  updates, opt_state = server_opt.update(pseudo_grad, server.opt_state,
                                         server.params)
  params = optax.apply_updates(server.params, updates)
  return server.replace(params=params, opt_state=opt_state,
                        batch_stats=batch_stats,
                        extra={**server.extra, **extra} if extra
                        else server.extra)


def cohort_metrics(result: LocalResult, weights: jax.Array) -> dict[str, jax.Array]:
  """Train loss/accuracy averaged over clients, weighted by active steps."""
  w = result.steps * (weights > 0)
  total = jnp.maximum(w.sum(), 1.0)
  return {
      "train_loss": (result.loss * w).sum() / total,
      "train_accuracy": (result.accuracy * w).sum() / total,
      "local_steps_mean": result.steps.mean(),
  }


