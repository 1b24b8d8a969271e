"""PACFL: clusters of clients from the principal angles of their data.

Before training, every client sends once the top-``p`` left singular vectors
of its data, per class as in the authors' code (:func:`client_signatures`).
The server builds the proximity matrix of principal angles between the
clients' subspaces (PACFL Eq. 2, ``A_ij = Θ_1(U_i, U_j)``) and clusters it
hierarchically with a stopping threshold ``β`` (Sec. 3):
:func:`cluster_clients`. Then it keeps one model per cluster, all starting
from the same model; training and aggregation are
:mod:`fedjax_dd.algorithms.cluster_models`' (Alg. 1). A client that joins
later is placed by the same angles
(:func:`fedjax_dd.cluster.principal_angles.assign`).

The signatures are the only traffic beyond the models: ``D`` numbers per
valid column of each client's ``U``, recorded once, in round 1, under
``traffic/upload/pacfl_subspace``. The server state holds the clusters
(``extra["clusters"]`` ``[N]``) and the ``K`` models, so a checkpoint
resumes bit-identically. As in the paper, each client deploys its cluster's
model (:func:`fedjax_dd.algorithms.cluster_models.deploy_assigned`).

Defaults from the authors' code (``scripts/pacfl.sh``; ``β`` 3.5°-4.9° for
label-skew CIFAR-10 with the ``"basis"`` angle).

Reference: Vahidian, Morafah, Wang, Kungurtsev, Chen, Shah, Lin,
"Efficient Distribution Similarity Identification in Clustered Federated
Learning via Principal Angles Between Client Data Subspaces", AAAI 2023;
code github.com/MMorafah/PACFL.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.algorithms import cluster_models
from fedjax_dd.algorithms.cluster_models import ClusterServing
from fedjax_dd.algorithms import clustered
from fedjax_dd.cluster import principal_angles
from fedjax_dd.core import checks
from fedjax_dd.core.algorithm import (CommSpec, FederatedAlgorithm,
                                      ServerState)
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import LocalTraining
from fedjax_dd.core.rounds import TRAFFIC_PREFIX
from fedjax_dd.data.stacked import ClientData

PyTree = Any
tree_map = jax.tree_util.tree_map


@dataclasses.dataclass(frozen=True)
class PACFLHyperParams:
  """PACFL's settings, the ``pacfl`` config group; defaults from the
  authors' scripts.

  Attributes:
    rank: ``p``, singular vectors per class (or per client).
    per_class: one SVD per class (the code) or one per client.
    proximity: ``"basis"`` (the code) or ``"smallest"`` (principal angle).
    threshold: ``β`` in degrees (the code: 3.5-4.9); ``0``: cut at
      ``num_clusters`` instead.
    num_clusters: the clusters when ``threshold`` is 0.
    linkage: ``"average"``, ``"complete"`` or ``"single"``.
    global_model: the reported model, ``"largest"`` or ``"average"``
      (:class:`~fedjax_dd.algorithms.cluster_models.ClusterServing`).
  """
  rank: int = 3
  per_class: bool = True
  proximity: str = "basis"
  threshold: float = 4.9
  num_clusters: int = 0
  linkage: str = "average"
  global_model: str = "largest"

  def __post_init__(self):
    checks.check_int("rank", self.rank, 1)
    checks.check_choice("proximity", self.proximity,
                        principal_angles.PROXIMITIES)
    checks.check_choice("linkage", self.linkage, principal_angles.LINKAGES)
    checks.check_number("threshold", self.threshold, 0.0)
    checks.check_int("num_clusters", self.num_clusters, 0)
    if self.threshold == 0 and not self.num_clusters:
      checks.refuse("num_clusters", "at least 1 when threshold = 0", 0)
    checks.check_choice("global_model", self.global_model,
                        cluster_models.GLOBAL_MODELS)


class PacflClusters(NamedTuple):
  """The one-off clustering before round 1 (host values).

  Attributes:
    labels: ``[N]`` int32 cluster of each client.
    num_clusters: ``K``.
    proximity: ``[N, N]`` angles in degrees.
    upload_bits: total bits of the clients' signatures.
  """
  labels: np.ndarray
  num_clusters: int
  proximity: np.ndarray
  upload_bits: int


def client_signatures(data: ClientData, *, num_classes: int, rank: int,
                      per_class: bool = True,
                      mapper: ClientMapper = ClientMapper()
                      ) -> tuple[jax.Array, jax.Array]:
  """Every client's signature in one mapped program.

  Returns:
    ``(U [N, D, G·p], mask [N, G·p])``
    (:func:`fedjax_dd.cluster.principal_angles.client_subspace`).
  """
  one = functools.partial(principal_angles.client_subspace,
                          num_classes=num_classes, rank=rank,
                          per_class=per_class)
  return mapper.map(one, in_axes=(0, 0, 0))(
      jnp.asarray(data.x), jnp.asarray(data.y),
      jnp.asarray(data.num_examples))


def cluster_clients(data: ClientData, *, num_classes: int, rank: int = 3,
                    threshold: float | None = None,
                    num_clusters: int | None = None,
                    linkage: str = "average", proximity: str = "smallest",
                    per_class: bool = True,
                    mapper: ClientMapper = ClientMapper(),
                    bits_per_float: int = 32) -> PacflClusters:
  """PACFL's clustering: signatures, proximity matrix, agglomerative.

  Args:
    data: every client's padded data ``[N, N_max, ...]``.
    num_classes: ``C``.
    rank: ``p``, singular vectors per class (or per client).
    threshold: ``β`` in degrees (or ``num_clusters``, exactly one).
    num_clusters: a fixed ``K``.
    linkage: ``"average"``, ``"complete"`` or ``"single"``.
    proximity: ``"smallest"`` principal angle or the code's ``"basis"``.
    per_class: one SVD per class (code) or per client.
    mapper: the client-axis backend of the SVDs.
    bits_per_float: bits of one uploaded number.

  Returns:
    :class:`PacflClusters`.
  """
  u, mask = client_signatures(data, num_classes=num_classes, rank=rank,
                              per_class=per_class, mapper=mapper)
  a = np.asarray(jax.device_get(principal_angles.proximity(u, mask,
                                                           proximity)))
  clusters = principal_angles.agglomerative(
      a, threshold=threshold, num_clusters=num_clusters, linkage=linkage)
  columns = int(np.sum(jax.device_get(mask)))
  bits = columns * int(u.shape[1]) * bits_per_float
  return PacflClusters(clusters.labels, clusters.num_clusters, a, bits)


def pacfl(training: LocalTraining,
          *,
          clusters: PacflClusters,
          serving: ClusterServing = ClusterServing()) -> FederatedAlgorithm:
  """Builds PACFL's rounds over the clusters of :func:`cluster_clients`.

  Args:
    training: the clients' local training (``training.task`` is every
      cluster's classifier; optimizer re-initialised every round).
    clusters: the clustering (its ``labels`` cover all ``N`` clients).
    serving: the model reported on the global test split
      (:class:`~fedjax_dd.algorithms.cluster_models.ClusterServing`).

  Returns:
    A :class:`FederatedAlgorithm`; metrics add ``num_clusters`` (``K``),
    ``clusters_trained`` (clusters with a client this round) and
    ``clustering_converged`` (always 1).
  """
  serving.check()
  global_model = serving.global_model
  k_models = int(clusters.num_clusters)
  labels = np.asarray(clusters.labels, np.int32)
  if labels.min() < 0 or labels.max() >= k_models:
    raise ValueError(f"cluster labels must lie in [0, {k_models}).")
  aggregate = cluster_models.make_aggregate(k_models, global_model)
  task = training.task
  train = cluster_models.make_trainer(training)

  def init(params, batch_stats, num_clients):
    if num_clients != labels.shape[0]:
      raise ValueError(f"PACFL clustered {labels.shape[0]} clients, the run "
                       f"has {num_clients}.")
    extra = serving.initial_extra(
        params, batch_stats, num_models=k_models, num_clients=num_clients,
        clusters=jnp.asarray(labels))
    return ServerState(params, batch_stats, (), extra=extra), {}

  def apply(server, clients, cohort, key):
    t = cohort.round
    result, picks = train(server, cohort, key)
    server, metrics = aggregate(server, result, picks, cohort)
    server, metrics = serving.serve(server, metrics, result, picks,
                                    k_models, cohort,
                                    num_classes=task.num_classes)
    metrics["num_clusters"] = k_models
    metrics["clustering_converged"] = 1
    # The signatures go up once, before round 1's models.
    metrics[f"{TRAFFIC_PREFIX}upload/pacfl_subspace"] = (
        clusters.upload_bits if int(t) == 0 else 0)
    return server, clients, metrics

  return FederatedAlgorithm(init=init, apply=apply, comm=CommSpec(),
                            deploy=cluster_models.deploy_assigned)
