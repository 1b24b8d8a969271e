"""CFL-GP: clustered FL by spectral partitioning of accumulated gradients.

Kim, Kim, de Veciana, "Clustered Federated Learning via Gradient-based
Partitioning", ICML 2024: the server accumulates the updates clients compute
for the cluster models into a gradient profile matrix ``G`` and partitions
the clients periodically by spectral clustering of ``G``. The steps follow
the authors' released code (github.com/Heasung-Kim/clustered-federated-
learning-via-gradient-based-partitioning, ``run_CFLGP`` and
``spectral_clustering_and_matching``), not the paper's equations, so none
are cited; every constant is a config value (``cfl_gp.*``):

* Profile. Each sampled client's update ``Δθ_i`` (returned model minus its
  cluster's model) is reduced to a fixed random subset of
  ``D = max(P // compression, 1)`` of its ``P`` coordinates and averaged
  into its row ``g_i`` of ``features [N, D]`` (``G^T``) with the code's
  cumulative weight: ``g_i ← (1 − β_t) g_i + β_t Δθ_i[idx]``,
  ``β_t = 1 / (⌊t / (K·period)⌋ + 1)`` in round ``t``.
* Schedule. The server partitions in rounds ``t`` with
  ``(t − 1) % period == 0`` while ``t <= stop_round``; ``stop_round = 0``
  never stops.
* Partition. K-Means of the projections of ``G`` on its top ``K`` singular
  vectors (:func:`partition`), as the code does. The new clusters take the
  ids of the old ones they overlap most (Hungarian matching). Clients
  without an update keep their cluster.
* Models. New cluster ``j`` starts from the model of the old cluster that
  holds most of its members (ties: the lowest id), so a split-off cluster
  does not start from an untrained slot. Before the first partition every
  client is in cluster 0, as in the code's round 0.

Departure, because the DisUE protocol samples a cohort each round where
the code queries every client: the profile takes a client's update in
every round it is sampled (the code, in partition rounds only). The server
reads ``Δθ_i`` off the uploaded model, so the profile costs no extra message.

Training, aggregation and the evaluated model are the shared stages of
:mod:`fedjax_dd.algorithms.cluster_models`. The state (``extra``) holds the
``K`` models, ``clusters`` ``[N]``, ``features`` ``[N, D]``, ``has_feature``
``[N]``, the coordinate subset and the round, so a checkpoint resumes
bit-identically.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.algorithms import cluster_models
from fedjax_dd.algorithms.cluster_models import ClusterServing
from fedjax_dd.algorithms import clustered
from fedjax_dd.core import checks
from fedjax_dd.cluster.similarity import flatten_params
from fedjax_dd.core.algorithm import (CommSpec, Cohort, FederatedAlgorithm,
                                      ServerState)
from fedjax_dd.core.local import LocalTraining

PyTree = Any
tree_map = jax.tree_util.tree_map


@dataclasses.dataclass(frozen=True)
class CFLGPHyperParams:
  """CFL-GP's settings, the ``cfl_gp`` config group; defaults from the
  authors' code (``num_clusters``: DisUE's protocol's choice).

  Attributes:
    num_clusters: ``K >= 1``.
    compression: ``P / D``: coordinates of each update kept.
    period: rounds between partitions.
    stop_round: the last round that may partition; ``0``: none.
    cluster_seed: K-Means' ``random_state``.
    global_model: the reported model, ``"largest"`` or ``"average"``
      (:class:`~fedjax_dd.algorithms.cluster_models.ClusterServing`).
  """
  num_clusters: int = 4
  compression: int = 100
  period: int = 2
  stop_round: int = 10
  cluster_seed: int = 0
  global_model: str = "largest"

  def __post_init__(self):
    for name, low in (("num_clusters", 1), ("compression", 1), ("period", 1),
                      ("stop_round", 0), ("cluster_seed", 0)):
      checks.check_int(name, getattr(self, name), low)
    checks.check_choice("global_model", self.global_model,
                        cluster_models.GLOBAL_MODELS)


def profile_weight(t, num_clusters: int, period: int):
  """``β_t = 1 / (⌊t / (K·period)⌋ + 1)``, the weight of round ``t``'s
  update in the profile (the code's cumulative average)."""
  return 1.0 / (jnp.floor(t / (num_clusters * period)) + 1.0)


def partition(features: np.ndarray, num_clusters: int, *,
              seed: int = 0, n_init: int = 10) -> np.ndarray:
  """The code's spectral clustering of the profile (host): K-Means
  (k-means++) of ``U_K Σ_K`` of the SVD of ``features``.

  Args:
    features: ``[M, D]`` rows ``g_i`` (``G^T``), ``M > K``.
    num_clusters: ``K``.
    seed: K-Means' ``random_state``.
    n_init: K-Means restarts.

  Returns:
    ``[M]`` int32 labels in ``[0, K)``.
  """
  from sklearn.cluster import KMeans  # pylint: disable=g-import-not-at-top
  u, s, _ = np.linalg.svd(np.asarray(features, np.float64),
                          full_matrices=False)
  # P_K^T G in the code's terms; column signs do not change distances.
  reduced = u[:, :num_clusters] * s[:num_clusters]
  km = KMeans(n_clusters=num_clusters, init="k-means++", n_init=n_init,
              random_state=seed)
  return km.fit(reduced).labels_.astype(np.int32)


def _overlap(old: np.ndarray, new: np.ndarray, num_clusters: int
             ) -> np.ndarray:
  """``[K, K]`` counts: entry ``[j, i]`` is how many clients moved from old
  cluster ``i`` to new cluster ``j``."""
  counts = np.zeros((num_clusters, num_clusters), np.int64)
  np.add.at(counts, (new, old), 1)
  return counts


def align(old: np.ndarray, new: np.ndarray, num_clusters: int
          ) -> np.ndarray:
  """``new`` relabelled so that each new cluster takes the id of the old
  cluster it overlaps most, one to one (Hungarian matching of the overlap
  counts; spectral labels are arbitrary)."""
  from scipy.optimize import linear_sum_assignment  # pylint: disable=g-import-not-at-top
  rows, cols = linear_sum_assignment(-_overlap(old, new, num_clusters))
  ids = np.empty(num_clusters, np.int32)
  ids[rows] = cols
  return ids[new]


def inherit(old: np.ndarray, new: np.ndarray, num_clusters: int
            ) -> np.ndarray:
  """``[K]`` the old cluster whose model each new cluster starts from: the
  one holding most of its members (ties: lowest id); itself when empty."""
  counts = _overlap(old, new, num_clusters)
  sources = np.argmax(counts, axis=1).astype(np.int32)
  empty = counts.sum(axis=1) == 0
  sources[empty] = np.arange(num_clusters, dtype=np.int32)[empty]
  return sources


def cfl_gp(training: LocalTraining,
           *,
           num_clusters: int,
           subset_key: jax.Array,
           compression: int = 100,
           period: int = 2,
           stop_round: int = 10,
           cluster_seed: int = 0,
           serving: ClusterServing = ClusterServing()) -> FederatedAlgorithm:
  """Builds CFL-GP (module doc; defaults from the authors' code).

  Args:
    training: the clients' local training (``training.task`` is every
      cluster's classifier; optimizer re-initialised every round).
    num_clusters: ``K >= 1`` (static).
    subset_key: the key of the fixed coordinate subset of the profile.
    compression: ``P / D``: the profile keeps ``max(P // compression, 1)``
      coordinates of each update.
    period: rounds between partitions.
    stop_round: the last round that may partition; ``0``: no last round.
    cluster_seed: K-Means' ``random_state``.
    serving: the model reported on the global test split
      (:class:`~fedjax_dd.algorithms.cluster_models.ClusterServing`).

  Returns:
    A :class:`FederatedAlgorithm`; metrics add ``num_clusters`` (``K``),
    ``clusters_trained``, ``cfl_gp_partitioned`` (1 in a partition round),
    ``cfl_gp_moved`` (clients whose cluster changed) and
    ``clustering_converged`` (1 once no later round partitions).
  """
  serving.check()
  global_model = serving.global_model
  for name, v in (("num_clusters", num_clusters), ("compression", compression),
                  ("period", period)):
    if not isinstance(v, int) or v < 1:
      raise ValueError(f"{name} must be an int >= 1, got {v}.")
  if not isinstance(stop_round, int) or stop_round < 0:
    raise ValueError(f"stop_round must be an int >= 0, got {stop_round}.")
  k = num_clusters
  aggregate = cluster_models.make_aggregate(k, global_model)
  task = training.task
  train = cluster_models.make_trainer(training)

  def init(params, batch_stats, num_clients):
    p = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    d = max(p // compression, 1)
    index = jnp.sort(jax.random.permutation(subset_key, p)[:d])
    extra = serving.initial_extra(
        params, batch_stats, num_models=k, num_clients=num_clients,
        clusters=jnp.zeros((num_clients,), jnp.int32),
        features=jnp.zeros((num_clients, d), jnp.float32),
        has_feature=jnp.zeros((num_clients,), bool),
        feature_index=index.astype(jnp.int32))
    return ServerState(params, batch_stats, (), extra=extra), {}

  @jax.jit
  def record(extra, result, picks, cohort: Cohort):
    starts = tree_map(lambda m: m[picks], extra["models"])
    delta = flatten_params(result.params) - flatten_params(starts)  # [S, P]
    # The weight of a new update halves, thirds, ... every K·period rounds.
    beta = profile_weight(jnp.asarray(cohort.round, jnp.int32) + 1, k,
                          period)
    ids = cohort.client_ids
    g = ((1.0 - beta) * extra["features"][ids]
         + beta * delta[:, extra["feature_index"]])
    return {**extra, "features": extra["features"].at[ids].set(g),
            "has_feature": extra["has_feature"].at[ids].set(True)}

  @jax.jit
  def reassign(extra, sources, clusters):
    # One program, so that the new arrays land where the state's are.
    return {**extra,
            "models": tree_map(lambda m: m[sources], extra["models"]),
            "batch_stats": tree_map(lambda s: s[sources],
                                    extra["batch_stats"]),
            "clusters": clusters}

  def scheduled(t):
    return (k > 1 and (t - 1) % period == 0
            and (stop_round == 0 or t <= stop_round))

  def apply(server, clients, cohort, key):
    t = int(cohort.round) + 1
    result, picks = train(server, cohort, key)
    extra = record(server.extra, result, picks, cohort)
    moved, partitioned = 0, 0
    if scheduled(t):
      host = jax.device_get({n: extra[n] for n in
                             ("clusters", "features", "has_feature")})
      members = np.flatnonzero(host["has_feature"])
      if members.size > k:
        partitioned = 1
        old = np.asarray(host["clusters"], np.int32)
        new = old.copy()
        new[members] = align(
            old[members],
            partition(host["features"][members], k, seed=cluster_seed), k)
        sources = inherit(old[members], new[members], k)
        moved = int(np.sum(new != old))
        extra = reassign(extra, sources, new)
        picks = extra["clusters"][cohort.client_ids]
    server, metrics = aggregate(server.replace(extra=extra), result, picks,
                                cohort)
    server, metrics = serving.serve(server, metrics, result, picks,
                                    k, cohort,
                                    num_classes=task.num_classes)
    metrics["num_clusters"] = k
    metrics["cfl_gp_partitioned"] = partitioned
    metrics["cfl_gp_moved"] = moved
    metrics["clustering_converged"] = int(
        k == 1 or (stop_round > 0 and t >= stop_round))
    return server, clients, metrics

  return FederatedAlgorithm(init=init, apply=apply, comm=CommSpec(),
                            deploy=cluster_models.deploy_assigned)
