"""Stages shared by the methods that keep one model per cluster.

IFCA, CFL, CFL-GP and PACFL hold ``K`` cluster models stacked ``[K, ...]``;
every sampled client trains the model of its cluster, and the server sets each
cluster's model to the example-weighted mean of the models its clients
returned (a model nobody trained keeps its weights): :func:`aggregate`.
What differs is how a client's cluster is found (IFCA: the lowest loss;
CFL: recursive bi-partitioning; CFL-GP: spectral partitions of accumulated
updates; PACFL: principal angles of the data).

Each client deploys its cluster's model (:func:`deploy_assigned`; IFCA:
the model of lowest loss on its data), which personalized evaluation
scores (:mod:`fedjax_dd.core.personal`). The evaluated global model is
:func:`global_model` of the cluster models, unless IGA is plugged in
(:func:`iga_round`, DisUE Tab. 2): then the round's trained cluster models
teach it as in DisUE's round (:mod:`fedjax_dd.algorithms.clustered`). The
clients keep training their cluster models; only the evaluated model
changes.

References: Ghosh et al., "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020; Leng et al., "Distilling A Universal Expert from
Clustered Federated Learning" (DisUE), Sec. 4.2 and Tab. 2.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from fedjax_dd.algorithms import clustered
from fedjax_dd.algorithms import stages
from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core.algorithm import Cohort, ServerState
from fedjax_dd.core.local import (LocalTraining, RoundContext,
                                  make_local_update)
from fedjax_dd.distill.iga import IGA

PyTree = Any
tree_map = jax.tree_util.tree_map

GLOBAL_MODELS = ("largest", "average")


def check_global_model(global_model: str) -> None:
  if global_model not in GLOBAL_MODELS:
    raise ValueError(f"global_model must be one of {GLOBAL_MODELS}, got "
                     f"{global_model!r}.")


@dataclasses.dataclass(frozen=True)
class ClusterServing:
  """Which model a method with cluster models reports on the global test
  split (each client still deploys its own cluster's model).

  Attributes:
    global_model: ``"largest"``, the cluster model holding the most
      training examples in the round (ties: lowest index), or
      ``"average"``, their example-weighted average.
    iga: DisUE's IGA (``num_teachers_max`` = the cohort size) distilling the
      round's cluster models into the reported model instead (DisUE Tab. 2,
      ``+iga``); ``None``: off.
    generator_key: the IGA generator's initialisation key (with ``iga``).
  """

  global_model: str = "largest"
  iga: IGA | None = None
  generator_key: jax.Array | None = None

  def check(self) -> None:
    """Raises ValueError for an unknown ``global_model`` or an ``iga``
    without its ``generator_key``."""
    check_global_model(self.global_model)
    clustered.check_iga(self.iga, self.generator_key)

  def iga_extra(self, params: PyTree, batch_stats: PyTree,
                num_clients: int) -> dict[str, Any]:
    """IGA's entries of ``server.extra`` at round 0
    (:func:`fedjax_dd.algorithms.clustered.init_iga`); none without IGA."""
    if self.iga is None:
      return {}
    return clustered.init_iga(self.iga, self.generator_key, params,
                              batch_stats, num_clients)

  def serve(self, server: ServerState, metrics: dict[str, Any], result,
            picks: jax.Array, num_models: int, cohort: Cohort, *,
            num_classes: int) -> tuple[ServerState, dict[str, Any]]:
    """After the round's aggregation: with IGA, :func:`iga_round` distils
    the cluster models into the reported model and its metrics join
    ``metrics``; without, ``(server, metrics)`` unchanged."""
    if self.iga is None:
      return server, metrics
    server, iga_metrics = iga_round(self.iga, server, result, picks,
                                    num_models, cohort,
                                    num_classes=num_classes)
    return server, {**metrics, **iga_metrics}

  def initial_extra(self, params: PyTree, batch_stats: PyTree, *,
                    num_models: int, num_clients: int,
                    **fields: jax.Array) -> dict[str, Any]:
    """``server.extra`` at round 0 of a method whose ``K = num_models``
    cluster models all start from ``params``: ``models`` and
    ``batch_stats`` ``[K, ...]``, the clusters' ``sizes [K]``, the
    method's own ``fields`` and IGA's entries."""
    return {"models": stack([params] * num_models),
            "batch_stats": stack([batch_stats] * num_models),
            **fields,
            "sizes": jnp.zeros((num_models,), jnp.float32),
            **self.iga_extra(params, batch_stats, num_clients)}


def stack(trees: list[PyTree]) -> PyTree:
  """``[K, ...]`` stack of ``K`` pytrees of one structure."""
  return tree_map(lambda *xs: jnp.stack(xs), *trees)


def aggregate(models: PyTree, stacked: PyTree, picks: jax.Array,
              weights: jax.Array, num_clusters: int
              ) -> tuple[PyTree, jax.Array]:
  """Per-cluster example-weighted means of the cohort's models.

  Args:
    models: the cluster models ``[K, ...]`` before the round.
    stacked: the cohort's returned models ``[S, ...]``.
    picks: ``[S]`` int32 cluster of each cohort client.
    weights: ``[S]`` examples of each cohort client.
    num_clusters: ``K`` (static).

  Returns:
    ``(models [K, ...], sizes [K])``: cluster ``k``'s model is
    ``Σ_{i: pick_i = k} n_i ω_i / Σ n_i``, or its old model when no client
    picked it; ``sizes`` are the examples behind each cluster this round.
  """
  onehot = jax.nn.one_hot(picks, num_clusters, dtype=jnp.float32)  # [S, K]
  w = onehot * weights.astype(jnp.float32)[:, None]
  sizes = w.sum(axis=0)
  denom = jnp.maximum(sizes, 1e-12)

  def per_cluster(new, old):
    s = jnp.tensordot(w.T, new.astype(jnp.float32), axes=1)  # [K, ...]
    s = s / denom.reshape((-1,) + (1,) * (s.ndim - 1))
    keep = (sizes > 0).reshape((-1,) + (1,) * (s.ndim - 1))
    return jnp.where(keep, s.astype(old.dtype), old)

  return tree_map(per_cluster, stacked, models), sizes


def global_model(models: PyTree, stats: PyTree, sizes: jax.Array,
                 mode: str) -> tuple[PyTree, PyTree]:
  """The evaluated model: the cluster of most examples (``"largest"``, ties:
  the lowest index) or the ``sizes``-weighted mean (``"average"``)."""
  if mode == "largest":
    j = jnp.argmax(sizes)
    return tree_map(lambda m: m[j], models), tree_map(lambda s: s[j], stats)
  w = jnp.where(sizes.sum() > 0, sizes, jnp.ones_like(sizes))
  return stages.weighted_mean(models, w), stages.weighted_mean(stats, w)


def deploy_assigned(server: ServerState, data: Any
                    ) -> tuple[PyTree, PyTree, jax.Array]:
  """What each client deploys in a method that assigns clusters (CFL,
  CFL-GP, PACFL): its cluster's model, ``extra["models"][extra["clusters"]
  [i]]`` (a :data:`fedjax_dd.core.algorithm.Deploy`; ``data`` must hold the
  run's clients in their order)."""
  clusters = server.extra["clusters"]
  if clusters.shape[0] != data.num_clients:
    raise ValueError(f"deploy: the server assigned {clusters.shape[0]} "
                     f"clients, the data holds {data.num_clients}.")
  return server.extra["models"], server.extra["batch_stats"], clusters


def compact_labels(picks: jax.Array, num_clusters: int) -> jax.Array:
  """``[S]`` cluster ids renumbered ``0 .. k-1`` in id order over the ``k``
  clusters present, so ``S`` teacher slots hold them whatever ``K`` is."""
  present = jnp.zeros((num_clusters,), jnp.int32).at[picks].set(1)
  return (jnp.cumsum(present) - 1)[picks]


def make_trainer(training: LocalTraining) -> Callable[..., Any]:
  """Local training of each sampled client from its cluster's model.

  Returns:
    ``train(server, cohort, key) -> (result, picks)``: every client of the
    cohort trains ``server.extra["models"][picks[i]]`` (its cluster, from
    ``server.extra["clusters"]``) under ``training``'s schedule of the
    cohort's round; ``result`` is the stacked local result ``[C, ...]``.
  """
  local = make_local_update(training)

  def one_client(models, stats, round_index, pick, x, y, n, num_steps, key):
    params = tree_map(lambda m: m[pick], models)
    batch_stats = tree_map(lambda s: s[pick], stats)
    ctx = RoundContext(round=round_index, start_params=params,
                       start_batch_stats=batch_stats)
    return local.run(params, batch_stats, local.optimizer.init(params), x, y,
                     n, num_steps, key, ctx)

  mapped = training.mapper.map(
      one_client, in_axes=(None, None, None, 0, 0, 0, 0, 0, 0),
      work_argnum=7)

  def train(server: ServerState, cohort: Cohort, key: jax.Array):
    keys = keys_lib.client_keys(key, cohort.client_ids)
    picks = server.extra["clusters"][cohort.client_ids]
    result = mapped(server.extra["models"], server.extra["batch_stats"],
                    jnp.asarray(cohort.round, jnp.int32), picks, cohort.x,
                    cohort.y, cohort.num_examples, cohort.num_steps, keys)
    return result, picks

  return train


def make_aggregate(num_models: int, mode: str) -> Callable[..., Any]:
  """The server's jitted step after training: :func:`aggregate` of models
  and batch statistics, then :func:`global_model` of them (``mode``).

  Returns:
    ``aggregate(server, result, picks, cohort) -> (server, metrics)``;
    metrics are the cohort's training metrics and ``clusters_trained``.
  """
  check_global_model(mode)

  @jax.jit
  def step(server: ServerState, result, picks, cohort: Cohort):
    models, sizes = aggregate(server.extra["models"], result.params, picks,
                              cohort.num_examples, num_models)
    stats, _ = aggregate(server.extra["batch_stats"], result.batch_stats,
                         picks, cohort.num_examples, num_models)
    params, batch_stats = global_model(models, stats, sizes, mode)
    extra = {**server.extra, "models": models, "batch_stats": stats,
             "sizes": sizes}
    metrics = stages.cohort_metrics(result, cohort.num_examples)
    metrics["clusters_trained"] = jnp.sum(sizes > 0)
    return server.replace(params=params, batch_stats=batch_stats,
                          extra=extra), metrics

  return step


def iga_round(iga: IGA, server: ServerState, result, picks: jax.Array,
              num_clusters: int, cohort: Cohort, *, num_classes: int
              ) -> tuple[ServerState, dict[str, Any]]:
  """IGA on the round's cluster models (DisUE Tab. 2):
  :func:`fedjax_dd.algorithms.clustered.iga_round` with the trained
  clusters as the groups, after :func:`make_aggregate`.

  Args:
    iga: the IGA; its state is ``server.extra["iga"]`` (and
      ``"reported"``), from :func:`fedjax_dd.algorithms.clustered.init_iga`.
    server: the aggregated server state.
    result: the cohort's local results (stacked ``[S, ...]``).
    picks: ``[S]`` cluster of each cohort client.
    num_clusters: ``K`` (static).
    cohort: the round's cohort.
    num_classes: ``C``.

  Returns:
    ``(server, metrics)``: the server with the distilled global model, and
    the ``iga_*`` metrics with the class counts' traffic.
  """
  labels = compact_labels(picks, num_clusters)
  server, metrics, _ = clustered.iga_round(
      iga, server, result, labels, cohort, num_classes=num_classes)
  return server, metrics
