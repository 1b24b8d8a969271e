"""Centralized training: one model on the pooled training set.

The upper-bound baseline every paper reports. It reuses the engine's local
update unchanged: the pooled data is a single "client" whose optimizer state
persists across rounds, where one round is one epoch. Nothing is
communicated (``CommSpec(0, 0)``).

The one client still goes through the client axis (a vmap over a stack of
one): XLA:CPU runs an un-vmapped convolutional scan far slower
(``experiments/perf_notes.md``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_dd.core.algorithm import CommSpec, FederatedAlgorithm, ServerState
from fedjax_dd.core.local import (LocalTraining, RoundContext,
                                  make_local_update)


def centralized(training: LocalTraining) -> FederatedAlgorithm:
  """Builds centralized training on a cohort of exactly one client.

  Args:
    training: the one client's training: ``training.optimizer``'s state
      persists across rounds (epochs); ``max_steps`` is the steps of a
      round (one epoch: ``ceil(N / B)``); of ``training.mapper`` only the
      compile settings count (the one client is always vmapped).

  Returns:
    A :class:`FederatedAlgorithm`; ``apply`` expects a one-client cohort.
  """
  optimizer = training.optimizer
  local = make_local_update(training)
  run = dataclasses.replace(training.mapper, backend="vmap").map(local.run)
  stack = lambda tree: jax.tree_util.tree_map(lambda a: a[None], tree)
  unstack = lambda tree: jax.tree_util.tree_map(lambda a: a[0], tree)

  def init(params, batch_stats, num_clients):
    if num_clients != 1:
      raise ValueError(
          f"Centralized training pools all data into one client, got "
          f"{num_clients} clients.")
    return ServerState(params, batch_stats, optimizer.init(params)), {}

  def apply(server, clients, cohort, key):
    if cohort.x.shape[0] != 1:
      raise ValueError("Centralized training expects a one-client cohort.")
    ctx = RoundContext(round=jnp.asarray(cohort.round, jnp.int32),
                       start_params=server.params,
                       start_batch_stats=server.batch_stats)
    result = unstack(run(
        *stack((server.params, server.batch_stats, server.opt_state)),
        cohort.x, cohort.y, cohort.num_examples, cohort.num_steps, key[None],
        stack(ctx)))
    server = ServerState(result.params, result.batch_stats, result.opt_state,
                         server.extra)
    metrics = {"train_loss": result.loss, "train_accuracy": result.accuracy,
               "local_steps_mean": result.steps}
    return server, clients, metrics

  return FederatedAlgorithm(init=init, apply=apply, comm=CommSpec(0, 0))
