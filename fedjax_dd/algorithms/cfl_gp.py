"""CFL-GP: clustered FL by spectral partitioning of accumulated gradients.

Kim, Kim, de Veciana, "Clustered Federated Learning via Gradient-based
Partitioning", ICML 2024. The idea (paper abstract): group the clients whose
model updates are alike by periodically accumulating the gradients clients
compute and clustering them. Only the paper's abstract and introduction
were reachable when this module was written, not its algorithm box or
equations, so the details below are this module's choices; every constant
is an argument (and a config value, ``cfl_gp.*``):

* Features. After each round, every sampled client's update ``Δθ_i``
  (returned model minus its cluster's model) is reduced to ``D`` numbers by
  a fixed Gaussian random projection ``R ∈ R^{P×D}`` (``R_pd ~ N(0, 1/D)``,
  Johnson-Lindenstrauss, drawn from ``projection_key``) and accumulated:
  ``g_i ← β g_i + R^T Δθ_i`` (``decay`` ``β``; 1: a plain sum). The server
  computes ``R^T Δθ_i`` from the uploaded model, so the features cost no
  message beyond the models.
* Schedule. Every ``period`` rounds from round ``warmup + period`` on
  (rounds ``t`` with ``t > warmup`` and ``(t − warmup) % period == 0``),
  the server partitions the clients that have a feature.
* Partition. Affinity ``A_ij = (1 + cos(g_i, g_j)) / 2 ∈ [0, 1]`` and
  scikit-learn's ``SpectralClustering(K, affinity="precomputed")`` with
  ``assign_labels="cluster_qr"`` (no k-means restarts, so a resumed run
  repeats the labels). Clients without a feature keep their cluster.
* Models. The new clusters take the ids of the old ones they overlap most
  (one to one, Hungarian matching), and new cluster ``j`` starts from the
  model of the old cluster that holds most of its members (ties: the
  lowest id): a cluster split off cluster 0 starts from cluster 0's model,
  not from a slot's untrained one; an empty slot keeps its model. Before the first partition every client is in
  cluster 0, as in CFL's start from one cluster.

Training and aggregation are the shared stages of
:mod:`fedjax_dd.algorithms.cluster_models`: each sampled client trains its
cluster's model, each cluster's model becomes the example-weighted FedAvg of
its clients'. The state (``extra``) holds the ``K`` models, ``clusters``
``[N]``, ``features`` ``[N, D]``, ``has_feature`` ``[N]`` and the round, so
a checkpoint resumes bit-identically. The evaluated model is the cluster
model of most examples this round, their average, or, with ``iga``, the
model DisUE's IGA distils from the round's cluster models (DisUE Tab. 2;
:class:`fedjax_dd.algorithms.cluster_models.IGAPlugin`).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dd.algorithms import cluster_models
from fedjax_dd.cluster.similarity import flatten_params
from fedjax_dd.core.algorithm import (CommSpec, Cohort, FederatedAlgorithm,
                                      ServerState)
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill.iga import IGA

PyTree = Any
tree_map = jax.tree_util.tree_map


def affinity(features: np.ndarray) -> np.ndarray:
  """``[M, M]`` affinity ``(1 + cos(g_i, g_j)) / 2`` of ``[M, D]`` features
  (a zero feature has cosine 0 with every other)."""
  g = np.asarray(features, np.float64)
  unit = g / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-30)
  a = (1.0 + unit @ unit.T) / 2.0
  a = np.clip((a + a.T) / 2.0, 0.0, 1.0)
  np.fill_diagonal(a, 1.0)
  return a


def partition(features: np.ndarray, num_clusters: int, *,
              seed: int = 0) -> np.ndarray:
  """Spectral clustering of the features' :func:`affinity` (host).

  Args:
    features: ``[M, D]`` accumulated gradient features, ``M > K``.
    num_clusters: ``K``.
    seed: the eigensolver's ``random_state``.

  Returns:
    ``[M]`` int32 labels in ``[0, K)``.
  """
  from sklearn.cluster import SpectralClustering  # pylint: disable=g-import-not-at-top
  sc = SpectralClustering(n_clusters=num_clusters, affinity="precomputed",
                          assign_labels="cluster_qr", random_state=seed)
  return sc.fit(affinity(features)).labels_.astype(np.int32)


def align(old: np.ndarray, new: np.ndarray, num_clusters: int
          ) -> np.ndarray:
  """``new`` relabelled so that each new cluster takes the id of the old
  cluster it overlaps most, one to one (Hungarian matching of the overlap
  counts; spectral labels are arbitrary)."""
  from scipy.optimize import linear_sum_assignment  # pylint: disable=g-import-not-at-top
  counts = np.zeros((num_clusters, num_clusters), np.int64)
  np.add.at(counts, (new, old), 1)
  rows, cols = linear_sum_assignment(-counts)
  ids = np.empty(num_clusters, np.int32)
  ids[rows] = cols
  return ids[new]


def inherit(old: np.ndarray, new: np.ndarray, num_clusters: int
            ) -> np.ndarray:
  """``[K]`` the old cluster whose model each new cluster starts from: the
  one holding most of its members (ties: lowest id); itself when empty."""
  counts = np.zeros((num_clusters, num_clusters), np.int64)
  np.add.at(counts, (new, old), 1)
  sources = np.argmax(counts, axis=1).astype(np.int32)
  empty = counts.sum(axis=1) == 0
  sources[empty] = np.arange(num_clusters, dtype=np.int32)[empty]
  return sources


def cfl_gp(task: Classifier,
           client_optimizer: optax.GradientTransformation,
           *,
           num_clusters: int,
           batch_size: int,
           max_steps: int,
           projection_key: jax.Array,
           feature_dim: int = 64,
           period: int = 5,
           warmup: int = 0,
           decay: float = 1.0,
           cluster_seed: int = 0,
           mapper: ClientMapper = ClientMapper(),
           global_model: str = "largest",
           augment: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
           lr_decay: float = 1.0,
           iga: IGA | None = None,
           generator_key: jax.Array | None = None) -> FederatedAlgorithm:
  """Builds CFL-GP (module doc).

  Args:
    task: the classifier of every cluster.
    client_optimizer: local optimizer, re-initialised every round.
    num_clusters: ``K >= 1`` (static).
    batch_size: local batch size.
    max_steps: static local scan length.
    projection_key: the key of the random projection ``R`` (fixed for the
      run).
    feature_dim: ``D``, numbers per client feature.
    period: rounds between partitions.
    warmup: rounds before the schedule starts.
    decay: ``β`` in ``g_i ← β g_i + R^T Δθ_i``, in ``(0, 1]``.
    cluster_seed: the spectral clustering's ``random_state``.
    mapper: the client-axis backend.
    global_model: ``"largest"`` or ``"average"``.
    augment: optional per-batch augmentation of the local update.
    lr_decay: ``γ``: round ``t`` trains at ``lr·γ^(t-1)``; ``1.0``: off.
    iga: DisUE's IGA (``num_teachers_max`` = the cohort size) distilling
      the round's cluster models into the global model; ``None``: off.
    generator_key: the IGA generator's initialisation key.

  Returns:
    A :class:`FederatedAlgorithm`; metrics add ``num_clusters`` (``K``),
    ``clusters_trained``, ``cfl_gp_partitioned`` (1 in a partition round),
    ``cfl_gp_moved`` (clients whose cluster changed) and
    ``clustering_converged`` (always 1).
  """
  cluster_models.check_global_model(global_model)
  for name, v in (("num_clusters", num_clusters), ("feature_dim", feature_dim),
                  ("period", period)):
    if not isinstance(v, int) or v < 1:
      raise ValueError(f"{name} must be an int >= 1, got {v}.")
  if not isinstance(warmup, int) or warmup < 0:
    raise ValueError(f"warmup must be an int >= 0, got {warmup}.")
  if not 0.0 < decay <= 1.0:
    raise ValueError(f"decay must lie in (0, 1], got {decay}.")
  k = num_clusters
  aggregate = cluster_models.make_aggregate(k, global_model)
  train = cluster_models.make_trainer(
      task, client_optimizer, batch_size=batch_size, max_steps=max_steps,
      mapper=mapper, augment=augment, lr_decay=lr_decay)
  plugin = (None if iga is None
            else cluster_models.IGAPlugin(task, iga, generator_key))

  def init(params, batch_stats, num_clients):
    extra = {"models": cluster_models.stack([params] * k),
             "batch_stats": cluster_models.stack([batch_stats] * k),
             "clusters": jnp.zeros((num_clients,), jnp.int32),
             "features": jnp.zeros((num_clients, feature_dim), jnp.float32),
             "has_feature": jnp.zeros((num_clients,), bool),
             "sizes": jnp.zeros((k,), jnp.float32),
             "round": jnp.zeros((), jnp.int32)}
    if plugin is not None:
      extra.update(plugin.init(params, batch_stats, num_clients))
    return ServerState(params, batch_stats, (), extra=extra), {}

  @jax.jit
  def record(extra, result, picks, cohort: Cohort, projection_key):
    starts = tree_map(lambda m: m[picks], extra["models"])
    delta = flatten_params(result.params) - flatten_params(starts)  # [S, P]
    # R is regenerated from its key rather than stored: [P, D] would be
    # the largest array of the checkpoint. The key is an argument, not a
    # closure constant, so XLA does not fold R into the program.
    r = jax.random.normal(projection_key, (delta.shape[1], feature_dim),
                          jnp.float32) / np.sqrt(feature_dim)
    ids = cohort.client_ids
    g = decay * extra["features"][ids] + delta @ r
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

  def apply(server, clients, cohort, key):
    t = int(server.extra["round"]) + 1
    result, picks = train(server, cohort, key)
    extra = record(server.extra, result, picks, cohort, projection_key)
    moved, partitioned = 0, 0
    if k > 1 and t > warmup and (t - warmup) % period == 0:
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
    if plugin is not None:
      extra, params, batch_stats, iga_metrics = plugin.round(
          server.extra, result, picks, k, cohort)
      server = server.replace(params=params, batch_stats=batch_stats,
                              extra=extra)
      metrics.update(iga_metrics)
    metrics["num_clusters"] = k
    metrics["cfl_gp_partitioned"] = partitioned
    metrics["cfl_gp_moved"] = moved
    metrics["clustering_converged"] = 1
    return server, clients, metrics

  return FederatedAlgorithm(init=init, apply=apply, comm=CommSpec())
