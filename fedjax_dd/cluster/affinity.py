"""Affinity propagation on a client similarity matrix (DisUE, Sec. 4.1, Eq. 4).

DisUE (Leng et al., "Distilling A Universal Expert from Clustered Federated
Learning") partitions a round's clients by ``C = {C_1, ..., C_K} = AP(Sim)``
(Eq. 4), affinity propagation (Frey and Dueck, Science 2007) on the cosine
matrix of Eq. 3. AP chooses ``K`` itself through each client's preference
to be an exemplar.

Defaults, and why:

* ``damping = 0.5``: scikit-learn's default and smallest accepted value,
  damping the oscillations of undamped AP.
* ``preference = None``: the median of the *off-diagonal* similarities,
  Frey and Dueck's recommendation; scikit-learn's ``np.median(S)`` would be
  raised by a cosine matrix's diagonal of ones.
* ``max_iter = 200``, ``convergence_iter = 15``: scikit-learn's defaults.

If AP does not converge within ``max_iter`` (scikit-learn labels every
client -1), the result falls back to a single cluster with a warning and
``converged=False``, so a round always has at least one cluster model.

Host-side: the input is a NumPy array; an int drawn from the caller's
``np.random.Generator`` is scikit-learn's ``random_state`` (AP adds tiny
noise to break ties).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any

import numpy as np
from sklearn.cluster import AffinityPropagation
from sklearn.exceptions import ConvergenceWarning

__all__ = ["Clusters", "affinity_propagation", "default_preference"]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Clusters:
  """A partition of ``S`` clients into ``K`` clusters (host-side).

  Attributes:
    labels: ``[S]`` int32 cluster of each client, ``0..K-1`` numbered in
      order of first appearance (client 0 is in cluster 0).
    num_clusters: ``K``.
    exemplars: ``[K]`` int32 client id of each cluster's exemplar.
    converged: False when AP did not converge and the single-cluster
      fallback was used.
  """
  labels: np.ndarray
  num_clusters: int
  exemplars: np.ndarray
  converged: bool

  def members(self, k: int) -> np.ndarray:
    """Sorted client ids of cluster ``k``."""
    return np.flatnonzero(self.labels == k)

  @property
  def sizes(self) -> np.ndarray:
    """``[K]`` clients per cluster."""
    return np.bincount(self.labels, minlength=self.num_clusters)

  def to_dict(self) -> dict[str, Any]:
    """JSON-able form for metrics and ``summary.json``."""
    return {"labels": self.labels.tolist(),
            "num_clusters": self.num_clusters,
            "exemplars": self.exemplars.tolist(),
            "converged": self.converged}


def default_preference(sim: np.ndarray) -> float:
  """Median of the off-diagonal entries of ``sim [S, S]`` (``S >= 2``)."""
  s = sim.shape[0]
  return float(np.median(sim[~np.eye(s, dtype=bool)]))


def _check(sim: Any, rng: Any, damping: float, preference: float | None,
           max_iter: int, convergence_iter: int) -> np.ndarray:
  if not isinstance(rng, np.random.Generator):
    raise TypeError(
        f"rng must be a np.random.Generator, got {type(rng).__name__}.")
  x = np.asarray(sim)
  if x.ndim != 2 or x.shape[0] != x.shape[1] or x.shape[0] < 1:
    raise ValueError(
        f"sim must be a square [S, S] matrix with S >= 1, got shape "
        f"{x.shape}.")
  if not np.issubdtype(x.dtype, np.number) or np.issubdtype(
      x.dtype, np.complexfloating):
    raise ValueError(f"sim must be real numbers, got dtype {x.dtype}.")
  x = x.astype(np.float64)
  if not np.isfinite(x).all():
    bad = np.argwhere(~np.isfinite(x))[0]
    raise ValueError(
        f"sim must be finite; sim[{bad[0]}, {bad[1]}] = {x[tuple(bad)]}.")
  if not 0.5 <= damping < 1.0:
    raise ValueError(f"damping must be in [0.5, 1), got {damping}.")
  if preference is not None and not np.isfinite(preference):
    raise ValueError(f"preference must be finite, got {preference}.")
  if max_iter < 1 or convergence_iter < 1:
    raise ValueError(
        f"max_iter and convergence_iter must be >= 1, got {max_iter}, "
        f"{convergence_iter}.")
  return x


def _relabel(raw: np.ndarray, centers: np.ndarray) -> tuple[np.ndarray,
                                                            np.ndarray]:
  """Labels ``0..K-1`` by first appearance, and the exemplars in that order."""
  _, first = np.unique(raw, return_index=True)
  order = np.unique(raw)[np.argsort(first)]
  relabel = np.empty(int(raw.max()) + 1, np.int32)
  relabel[order] = np.arange(order.size, dtype=np.int32)
  return relabel[raw], np.asarray(centers, np.int32)[order]


def affinity_propagation(sim: np.ndarray, *, rng: np.random.Generator,
                         damping: float = 0.5,
                         preference: float | None = None,
                         max_iter: int = 200,
                         convergence_iter: int = 15) -> Clusters:
  """``C = AP(Sim)`` (Eq. 4) with scikit-learn's ``AffinityPropagation``.

  Args:
    sim: ``[S, S]`` finite host similarities (e.g. Eq. 3's cosines); the
      diagonal is ignored (AP replaces it with the preference).
    rng: draws scikit-learn's ``random_state``.
    damping: in ``[0.5, 1)``.
    preference: every client's exemplar preference (larger: more
      clusters); ``None``: the off-diagonal median (module docstring).
    max_iter: AP iterations at most.
    convergence_iter: iterations with unchanged exemplars that stop AP.

  Returns:
    :class:`Clusters`. If AP did not converge: one cluster, exemplar the
    client most similar to the others in total, ``converged=False``.

  Raises:
    ValueError: ``sim`` not square, empty or not finite, or a bad option.
    TypeError: ``rng`` not a ``np.random.Generator``.
  """
  x = _check(sim, rng, damping, preference, max_iter, convergence_iter)
  s = x.shape[0]
  seed = int(rng.integers(0, 2**31 - 1))
  if s == 1:
    return Clusters(labels=np.zeros(1, np.int32), num_clusters=1,
                    exemplars=np.zeros(1, np.int32), converged=True)
  pref = default_preference(x) if preference is None else float(preference)
  model = AffinityPropagation(affinity="precomputed", damping=damping,
                              preference=pref, max_iter=max_iter,
                              convergence_iter=convergence_iter,
                              random_state=seed)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model.fit(x)
  not_converged = any(issubclass(w.category, ConvergenceWarning)
                      for w in caught)
  raw = np.asarray(model.labels_)
  centers = np.asarray(model.cluster_centers_indices_)
  if not_converged or centers.size == 0 or (raw < 0).any():
    off = np.where(np.eye(s, dtype=bool), 0.0, x)
    exemplar = int(np.argmax(off.sum(axis=1)))
    _log.warning(
        "affinity_propagation: AP did not converge in %d iterations (S=%d, "
        "damping=%s, preference=%.4g); falling back to one cluster with "
        "exemplar %d.", max_iter, s, damping, pref, exemplar)
    return Clusters(labels=np.zeros(s, np.int32), num_clusters=1,
                    exemplars=np.array([exemplar], np.int32), converged=False)
  labels, exemplars = _relabel(raw, centers)
  return Clusters(labels=labels, num_clusters=int(exemplars.size),
                  exemplars=exemplars, converged=True)
