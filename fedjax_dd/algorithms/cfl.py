"""CFL: clustered FL by recursive bi-partitioning on update cosines.

Sattler, Müller, Samek, "Clustered Federated Learning: Model-Agnostic
Distributed Multitask Optimization Under Privacy Constraints", IEEE TNNLS
2020, Algorithm 1. Training starts with one cluster of all clients. Each
round every sampled client trains its cluster's model and uploads its update
``Δθ_i``. After the round the server checks every cluster ``c``:

* it is near a stationary point of the clients' joint objective,
  ``‖Σ_{i∈c} |D_i|/|D_c| Δθ_i‖ < ε_1`` (Eq. 30's mean update norm), while
* some client is far from its own, ``max_{i∈c} ‖Δθ_i‖ > ε_2`` (Eq. 31),

and the cluster has more than 2 members; then it splits ``c`` in two by the
cosines of the members' updates (Eq. 25; :func:`bipartition`, Sec. III-C).
Both children start from the parent's model; then every cluster's model
moves by the example-weighted mean of its members' updates (Alg. 1).

From the authors' code (github.com/felisat/clustered-federated-learning):
the criterion is checked from round ``warmup + 1`` on, and ``ε_1 = 0.4``,
``ε_2 = 1.6`` are their EMNIST values. That code has every client in every
round; with a sampled cohort the server keeps each client's latest update
(``extra["updates"]`` ``[N, P]``), as PACFL's CFL baseline does, and judges
the members that have one; members without one follow the first child.
``max_clusters`` bounds the clusters, so the checkpointed state has one
shape.

The cluster tree is in the server state: ``extra["clusters"]`` ``[N]``
(each client's leaf), ``extra["parent"]`` ``[K_max]`` (``-1`` for the root
and unused slots) and ``extra["split_round"]`` ``[K_max]``. The evaluated
model is chosen as in :mod:`fedjax_dd.algorithms.cluster_models`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

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
class CFLHyperParams:
  """CFL's settings, the ``cfl`` config group; defaults from the authors'
  code.

  Attributes:
    eps1: ``ε_1``, the mean update norm below which a cluster is stationary.
    eps2: ``ε_2``, the largest update norm above which it splits.
    warmup: rounds before the first split may happen.
    max_clusters: ``K_max >= 1``, the most clusters.
    global_model: the reported model, ``"largest"`` or ``"average"``
      (:class:`~fedjax_dd.algorithms.cluster_models.ClusterServing`).
  """
  eps1: float = 0.4
  eps2: float = 1.6
  warmup: int = 20
  max_clusters: int = 8
  global_model: str = "largest"

  def __post_init__(self):
    checks.check_number("eps1", self.eps1, 0.0)
    checks.check_number("eps2", self.eps2, 0.0)
    checks.check_int("warmup", self.warmup, 0)
    checks.check_int("max_clusters", self.max_clusters, 1)
    checks.check_choice("global_model", self.global_model,
                        cluster_models.GLOBAL_MODELS)


class ClusterStats(NamedTuple):
  """Per-cluster split statistics (host arrays).

  Attributes:
    mean_norm: ``[K_max]`` ``‖Σ |D_i|/|D_c| Δθ_i‖`` over members with updates.
    max_norm: ``[K_max]`` largest member update norm.
    count: ``[K_max]`` members with an update.
    similarity: ``[N, N]`` cosines of the clients' latest updates.
  """
  mean_norm: np.ndarray
  max_norm: np.ndarray
  count: np.ndarray
  similarity: np.ndarray


@jax.jit
def _statistics(updates, has, weights, clusters, num_slots_like):
  k_max = num_slots_like.shape[0]
  w = jnp.where(has, weights.astype(jnp.float32), 0.0)
  seg_w = jax.ops.segment_sum(w, clusters, num_segments=k_max)
  mean = jax.ops.segment_sum(updates * w[:, None], clusters,
                             num_segments=k_max)
  mean = mean / jnp.maximum(seg_w, 1e-30)[:, None]
  norms = jnp.linalg.norm(updates, axis=1)
  max_norm = jax.ops.segment_max(jnp.where(has, norms, 0.0), clusters,
                                 num_segments=k_max)
  count = jax.ops.segment_sum(has.astype(jnp.int32), clusters,
                              num_segments=k_max)
  unit = updates / (norms[:, None] + 1e-12)
  return (jnp.linalg.norm(mean, axis=1), jnp.maximum(max_norm, 0.0), count,
          unit @ unit.T)


def statistics(updates: jax.Array, has: jax.Array, weights: jax.Array,
               clusters: jax.Array, max_clusters: int) -> ClusterStats:
  """The criterion's norms and the update cosines (one device program).

  Args:
    updates: ``[N, P]`` each client's latest update.
    has: ``[N]`` the client has one.
    weights: ``[N]`` its examples ``|D_i|``.
    clusters: ``[N]`` its cluster.
    max_clusters: ``K_max``.
  """
  out = _statistics(updates, has, weights, clusters,
                    jnp.zeros((max_clusters,), jnp.int8))
  return ClusterStats(*(np.asarray(a) for a in jax.device_get(out)))


def bipartition(similarity: np.ndarray) -> np.ndarray:
  """CFL's optimal bi-partition (Sec. III-C): complete-linkage
  agglomerative clustering of ``1 − α`` into 2 clusters (as the authors'
  code), ``α_ij`` the cosine of updates ``i`` and ``j``.

  Args:
    similarity: ``[M, M]`` cosines, ``M >= 2``.

  Returns:
    ``[M]`` bool: True for the members of the second child (the child
    without the first member).
  """
  from sklearn.cluster import AgglomerativeClustering  # pylint: disable=g-import-not-at-top
  d = 1.0 - np.asarray(similarity, np.float64)
  d = np.maximum((d + d.T) / 2, 0.0)
  np.fill_diagonal(d, 0.0)
  labels = AgglomerativeClustering(n_clusters=2, metric="precomputed",
                                   linkage="complete").fit(d).labels_
  return labels != labels[0]


def split_clusters(stats: ClusterStats, clusters: np.ndarray,
                   has: np.ndarray, num_clusters: int, *, eps1: float,
                   eps2: float, max_clusters: int
                   ) -> tuple[np.ndarray, list[tuple[int, int]]]:
  """One pass of the criterion over the clusters (host).

  Returns:
    ``(clusters [N], splits)``: the new assignment and ``(parent, child)``
    for each split; the child takes the next free id, the parent's id stays
    with the part holding its first member.
  """
  clusters = np.array(clusters, np.int32)
  splits = []
  k = num_clusters
  for c in range(num_clusters):
    if k >= max_clusters:
      break
    if not (stats.mean_norm[c] < eps1 and stats.max_norm[c] > eps2
            and stats.count[c] > 2):
      continue
    members = np.flatnonzero((clusters == c) & has)
    second = bipartition(stats.similarity[np.ix_(members, members)])
    if not second.any():
      continue
    clusters[members[second]] = k
    splits.append((c, k))
    k += 1
  return clusters, splits


def cfl(training: LocalTraining,
        *,
        eps1: float = 0.4,
        eps2: float = 1.6,
        warmup: int = 20,
        max_clusters: int = 8,
        serving: ClusterServing = ClusterServing()) -> FederatedAlgorithm:
  """Builds CFL (module doc).

  Args:
    training: the clients' local training (``training.task`` is every
      cluster's classifier; optimizer re-initialised every round).
    eps1, eps2, warmup: as in :class:`CFLHyperParams`.
    max_clusters: ``K_max >= 1``, the most clusters (static).
    serving: the model reported on the global test split
      (:class:`~fedjax_dd.algorithms.cluster_models.ClusterServing`).

  Returns:
    A :class:`FederatedAlgorithm`; metrics add ``num_clusters``,
    ``cfl_splits`` (this round), ``clusters_trained`` and
    ``clustering_converged`` (always 1).

  Raises:
    fedjax_dd.core.checks.SettingError: ``eps1`` or ``eps2`` negative or not
      finite.
  """
  serving.check()
  # Negative thresholds never hold (a norm is >= 0): CFL would never split.
  eps1 = checks.check_number("CFL eps1", eps1, 0.0)
  eps2 = checks.check_number("CFL eps2", eps2, 0.0)
  global_model = serving.global_model
  if not isinstance(max_clusters, int) or max_clusters < 1:
    raise ValueError(f"max_clusters must be an int >= 1, got {max_clusters}.")
  k_max = max_clusters
  aggregate = cluster_models.make_aggregate(k_max, global_model)
  task = training.task
  train = cluster_models.make_trainer(training)

  def init(params, batch_stats, num_clients):
    p = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    extra = serving.initial_extra(
        params, batch_stats, num_models=k_max, num_clients=num_clients,
        clusters=jnp.zeros((num_clients,), jnp.int32),
        num_clusters=jnp.ones((), jnp.int32),
        parent=jnp.full((k_max,), -1, jnp.int32),
        split_round=jnp.full((k_max,), -1, jnp.int32),
        updates=jnp.zeros((num_clients, p), jnp.float32),
        has_update=jnp.zeros((num_clients,), bool),
        weights=jnp.zeros((num_clients,), jnp.float32))
    return ServerState(params, batch_stats, (), extra=extra), {}

  @jax.jit
  def record(extra, result, picks, cohort: Cohort):
    starts = tree_map(lambda m: m[picks], extra["models"])
    delta = flatten_params(result.params) - flatten_params(starts)
    ids = cohort.client_ids
    return {**extra,
            "updates": extra["updates"].at[ids].set(delta),
            "has_update": extra["has_update"].at[ids].set(True),
            "weights": extra["weights"].at[ids].set(
                cohort.num_examples.astype(jnp.float32))}

  @jax.jit
  def apply_splits(extra, sources, clusters, num_clusters, parent,
                   split_round):
    # Slot j takes cluster sources[j]'s model. One program, so the new
    # arrays land where the state's are (keeps later programs' signature).
    return {**extra,
            "models": tree_map(lambda m: m[sources], extra["models"]),
            "batch_stats": tree_map(lambda s: s[sources],
                                    extra["batch_stats"]),
            "clusters": clusters, "num_clusters": num_clusters,
            "parent": parent, "split_round": split_round}

  def apply(server, clients, cohort, key):
    t = cohort.round
    result, picks = train(server, cohort, key)
    extra = record(server.extra, result, picks, cohort)
    num_clusters = int(extra["num_clusters"])
    splits = []
    if int(t) + 1 > warmup and num_clusters < k_max:
      host = jax.device_get({k: extra[k] for k in ("clusters", "has_update")})
      stats = statistics(extra["updates"], extra["has_update"],
                         extra["weights"], extra["clusters"], k_max)
      new, splits = split_clusters(
          stats, host["clusters"], host["has_update"], num_clusters,
          eps1=eps1, eps2=eps2, max_clusters=k_max)
      if splits:
        sources = np.arange(k_max, dtype=np.int32)
        parent = np.asarray(jax.device_get(extra["parent"])).copy()
        split_round = np.asarray(jax.device_get(extra["split_round"])).copy()
        for p, c in splits:
          sources[c], parent[c], split_round[c] = p, p, int(t) + 1
        extra = apply_splits(
            extra, sources, np.asarray(new, np.int32),
            np.asarray(num_clusters + len(splits), np.int32), parent,
            split_round)
        picks = extra["clusters"][cohort.client_ids]
    server, metrics = aggregate(server.replace(extra=extra), result, picks,
                                cohort)
    server, metrics = serving.serve(server, metrics, result, picks,
                                    k_max, cohort,
                                    num_classes=task.num_classes)
    metrics["num_clusters"] = num_clusters + len(splits)
    metrics["cfl_splits"] = len(splits)
    metrics["clustering_converged"] = 1
    return server, clients, metrics

  return FederatedAlgorithm(init=init, apply=apply, comm=CommSpec(),
                            deploy=cluster_models.deploy_assigned)
