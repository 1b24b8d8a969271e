"""Host-side client clustering: homogeneous KMeans and HFLDD's ClusterSampling.

HFLDD (Shi et al., "Dataset Distillation-based Hybrid Federated Learning on
Non-IID Data", 2024) groups clients in two steps:

1. **Homogeneous clusters** (Sec. IV-B, :func:`homogeneous_clusters`):
   KMeans on the rows of the label-knowledge similarity matrix ``M``
   (Eq. 4), so clients with similar label distributions share a cluster.
2. **Heterogeneous clusters** (Alg. 1, :func:`cluster_sampling`): each
   takes one client from every homogeneous cluster, and gets a random head
   (:func:`choose_heads`).

FedSeq's superclients (:func:`diverse_groups`) mix the homogeneous clusters
in fixed-size groups. Host-side: NumPy inputs, a ``np.random.Generator``.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any

import numpy as np
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning

_log = logging.getLogger(__name__)


def _check_rng(rng: Any) -> None:
  if not isinstance(rng, np.random.Generator):
    raise TypeError(
        f"rng must be a np.random.Generator, got {type(rng).__name__}.")


def homogeneous_clusters(features: np.ndarray, num_clusters: int, *, seed: int,
                         n_init: int = 10) -> np.ndarray:
  """KMeans on the rows of ``features`` (HFLDD: the rows of ``M``).

  ``num_clusters`` is capped by the number of distinct rows (with a warning),
  since KMeans would otherwise get duplicate centres. Ids are relabelled
  ``0..K'-1`` by each cluster's smallest client id, so equal partitions
  give equal labels.

  Args:
    features: ``[N, D]`` host array, e.g. ``jax.device_get(M)``.
    num_clusters: ``K``, >= 1.
    seed: KMeans ``random_state``.
    n_init: KMeans restarts.

  Returns:
    ``[N]`` int64 cluster ids in ``[0, K')``, ``K' <= K``.
  """
  x = np.asarray(features, np.float64)
  if x.ndim != 2 or x.shape[0] < 1:
    raise ValueError(f"features must be [N, D] with N >= 1, got {x.shape}.")
  if not np.isfinite(x).all():
    raise ValueError("features must be finite.")
  if num_clusters < 1:
    raise ValueError(f"num_clusters must be >= 1, got {num_clusters}.")
  distinct = np.unique(x, axis=0).shape[0]
  k = min(num_clusters, distinct)
  if k < num_clusters:
    _log.warning(
        "homogeneous_clusters: %d clusters requested but only %d distinct "
        "rows; using %d.", num_clusters, distinct, k)
  if k == 1:
    return np.zeros(x.shape[0], np.int64)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", ConvergenceWarning)
    raw = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(x)
  _, first = np.unique(raw, return_index=True)
  order = np.argsort(first)
  relabel = np.empty(raw.max() + 1, np.int64)
  relabel[np.unique(raw)[order]] = np.arange(order.size)
  return relabel[raw]


@dataclasses.dataclass(frozen=True)
class Topology:
  """The HFLDD client topology (host-side, NumPy).

  Attributes:
    homogeneous: ``[N]`` homogeneous cluster id of each client.
    heterogeneous: ``[N]`` heterogeneous cluster id of each client, ``[0, H)``.
    heads: ``[H]`` client id of each heterogeneous cluster's head.
  """
  homogeneous: np.ndarray
  heterogeneous: np.ndarray
  heads: np.ndarray

  @property
  def num_clients(self) -> int:
    return int(self.homogeneous.shape[0])

  @property
  def num_heads(self) -> int:
    return int(self.heads.shape[0])

  @property
  def is_head(self) -> np.ndarray:
    """``[N]`` bool."""
    mask = np.zeros(self.num_clients, bool)
    mask[self.heads] = True
    return mask

  @property
  def members(self) -> np.ndarray:
    """Sorted ids of the non-head clients."""
    return np.flatnonzero(~self.is_head)

  def cluster(self, h: int) -> np.ndarray:
    """Sorted client ids of heterogeneous cluster ``h`` (head included)."""
    return np.flatnonzero(self.heterogeneous == h)

  def head_of(self) -> np.ndarray:
    """``[N]`` the head client id each client sends to (itself for heads)."""
    return self.heads[self.heterogeneous]

  def to_dict(self) -> dict[str, Any]:
    """JSON-able form for ``summary.json``."""
    return {
        "homogeneous": self.homogeneous.tolist(),
        "heterogeneous": self.heterogeneous.tolist(),
        "heads": self.heads.tolist(),
        "num_homogeneous": int(np.unique(self.homogeneous).size),
        "num_heterogeneous": self.num_heads,
        "heterogeneous_sizes": np.bincount(
            self.heterogeneous, minlength=self.num_heads).tolist(),
    }


def cluster_sampling(homogeneous: np.ndarray, rng: np.random.Generator
                     ) -> list[np.ndarray]:
  """HFLDD Alg. 1: heterogeneous clusters from homogeneous ones.

  While at least two homogeneous clusters are non-empty, a new heterogeneous
  cluster takes one uniformly random client from each non-empty homogeneous
  cluster (visited in increasing cluster id). Once one homogeneous cluster is
  left, each of its remaining clients forms a singleton heterogeneous
  cluster (in random order).

  Args:
    homogeneous: ``[N]`` homogeneous cluster ids.
    rng: source of randomness.

  Returns:
    The heterogeneous clusters, each a sorted array of client ids, in
    creation order.
  """
  _check_rng(rng)
  labels = np.asarray(homogeneous)
  if labels.ndim != 1 or labels.size == 0:
    raise ValueError(f"homogeneous must be a non-empty [N] array, got {labels.shape}.")
  pools = [list(rng.permutation(np.flatnonzero(labels == k)))
           for k in np.unique(labels)]
  clusters: list[np.ndarray] = []
  while sum(bool(p) for p in pools) > 1:
    # Each pool is shuffled once, so popping its end is a uniform draw.
    clusters.append(np.sort(np.array([p.pop() for p in pools if p], np.int64)))
  for p in pools:
    clusters.extend(np.array([c], np.int64) for c in p)
  return clusters


def choose_heads(clusters: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
  """One uniformly random head per heterogeneous cluster, ``[H]``."""
  _check_rng(rng)
  return np.array([int(rng.choice(c)) for c in clusters], np.int64)


def build_topology(homogeneous: np.ndarray, rng: np.random.Generator) -> Topology:
  """ClusterSampling plus head selection, as a :class:`Topology`."""
  homogeneous = np.asarray(homogeneous, np.int64)
  clusters = cluster_sampling(homogeneous, rng)
  heads = choose_heads(clusters, rng)
  hetero = np.full(homogeneous.shape[0], -1, np.int64)
  for h, c in enumerate(clusters):
    hetero[c] = h
  return Topology(homogeneous=homogeneous, heterogeneous=hetero, heads=heads)


def diverse_groups(homogeneous: np.ndarray, num_groups: int,
                   rng: np.random.Generator) -> list[np.ndarray]:
  """Fixed-size groups that each mix the homogeneous clusters (FedSeq).

  The clients are dealt into one sequence, each pass drawing a random
  client from every non-empty homogeneous cluster (in random order), then
  cut into ``num_groups`` near-equal consecutive pieces. With ``K``
  balanced clusters and groups of ``J <= K``, every group holds ``J``
  different clusters.

  Args:
    homogeneous: ``[N]`` cluster ids (all zeros gives random groups).
    num_groups: ``O``, in ``[1, N]``.
    rng: source of randomness.

  Returns:
    ``O`` arrays of client ids, in the order they train in.
  """
  _check_rng(rng)
  labels = np.asarray(homogeneous)
  n = labels.shape[0]
  if not 1 <= num_groups <= n:
    raise ValueError(f"num_groups must be in [1, {n}], got {num_groups}.")
  pools = [list(rng.permutation(np.flatnonzero(labels == k)))
           for k in np.unique(labels)]
  sequence: list[int] = []
  while any(pools):
    for k in rng.permutation(len(pools)):
      if pools[k]:
        sequence.append(int(pools[k].pop()))
  return [np.asarray(g, np.int64)
          for g in np.array_split(np.asarray(sequence), num_groups)]
