"""FedAvg: local SGD on sampled clients, server averages weighted by |D_i|.

Reference: McMahan et al., "Communication-Efficient Learning of Deep Networks
from Decentralized Data", AISTATS 2017.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import optax

from fedjax_dd.algorithms import stages
from fedjax_dd.core import checks
from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core.algorithm import (CommSpec, Cohort, FederatedAlgorithm,
                                      ServerState)
from fedjax_dd.core.local import LocalResult, LocalTraining, make_local_update

PyTree = Any
# (stacked deltas [S, ...], cohort, local result) -> aggregated delta.
Aggregator = Callable[[PyTree, Cohort, LocalResult], PyTree]


class KeyedAggregator(NamedTuple):
  """An aggregator that draws randomness (DP-FedAvg's noise).

  ``fn(deltas [S, ...], cohort, result, key) -> delta``: :func:`fedavg`
  hands it the round's ``keys.server_key``, apart from every client's, so a
  resumed run draws the noise of an uninterrupted one.
  """
  fn: Callable[[PyTree, Cohort, LocalResult, jax.Array], PyTree]


def example_weighted(delta: PyTree, cohort: Cohort, result: LocalResult) -> PyTree:
  """FedAvg's rule: deltas averaged with weights ``num_examples``."""
  del result
  return stages.weighted_mean(delta, cohort.num_examples)


def fedavg(training: LocalTraining,
           *,
           server_optimizer: optax.GradientTransformation = optax.sgd(1.0),
           regularizer: Callable[[PyTree, PyTree], jax.Array] | None = None,
           aggregator: Aggregator | KeyedAggregator = example_weighted,
           comm: CommSpec = CommSpec()) -> FederatedAlgorithm:
  """Builds FedAvg (and, through the hooks, FedProx / FedNova / FedOpt).

  Args:
    training: the clients' local training (optimizer re-initialised every
      round; its schedule follows the engine's round index).
    server_optimizer: applied to the aggregated delta; ``sgd(1.0)`` is FedAvg.
    regularizer: ``(params, ctx) -> scalar`` added to every local loss;
      ``ctx`` is the client's :class:`~fedjax_dd.core.local.RoundContext`
      (FedProx reads ``ctx.start_params``, the server model).
    aggregator: how client deltas ``[S, ...]`` become one delta; a
      :class:`KeyedAggregator` also receives the round's server key.
    comm: model-sized tensors per client per round, for the ledger.

  Returns:
    A :class:`FederatedAlgorithm`.

  Raises:
    fedjax_dd.core.checks.SettingError: ``server_optimizer`` not an optax
      transformation (a name such as ``"sgd"``).
  """
  checks.check_transformation("fedavg server_optimizer", server_optimizer)
  local = make_local_update(training, regularizer=regularizer)
  train = stages.client_stage(local, training.mapper)

  @jax.jit
  def aggregate(server: ServerState, result: LocalResult, cohort: Cohort,
                key: jax.Array):
    weights = cohort.num_examples
    delta = _combine(aggregator, stages.deltas(result.params, server.params),
                     cohort, result, key)
    batch_stats = stages.weighted_mean(result.batch_stats, weights)
    server = stages.server_step(server_optimizer, server, delta, batch_stats)
    return server, stages.cohort_metrics(result, weights)

  def init(params, batch_stats, num_clients):
    del num_clients
    return ServerState(params, batch_stats, server_optimizer.init(params)), {}

  def apply(server, clients, cohort, key):
    keys = keys_lib.client_keys(key, cohort.client_ids)
    result = train(server.params, server.batch_stats, (), cohort, keys)
    server, metrics = aggregate(server, result, cohort,
                                keys_lib.server_key(key))
    return server, clients, metrics

  return FederatedAlgorithm(init=init, apply=apply, comm=comm)


def _combine(aggregator: Aggregator | KeyedAggregator, deltas: PyTree,
             cohort: Cohort, result: LocalResult, key: jax.Array) -> PyTree:
  """The round's delta: a :class:`KeyedAggregator` also gets the round's
  server key (a plain aggregator draws nothing, and XLA drops the key)."""
  if isinstance(aggregator, KeyedAggregator):
    return aggregator.fn(deltas, cohort, result, key)
  return aggregator(deltas, cohort, result)
