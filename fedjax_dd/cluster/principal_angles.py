"""PACFL's client signatures and their principal-angle proximity.

Each client summarises its data by the top-``p`` left singular vectors of its
data matrix (Vahidian et al., PACFL, AAAI 2023, Sec. 3 "the clients' data
subspaces"); the server measures how far two clients' subspaces are apart by
the angles between them and clusters the proximity matrix hierarchically.

* :func:`client_subspace` (ONE client): ``U_c = svd(X_c^T)[:, :p]`` for
  each class present, stacked, as the authors' ``main_pacfl.py`` does on
  raw pixels (``per_class=False``: one SVD of all the data, the paper's
  wording). Columns beyond a class's rank, of absent classes and of padding
  are zero, with a mask.
* :func:`proximity`: the ``[N, N]`` angles in degrees between signatures.
  ``"basis"`` is the authors' ``calculating_adjacency``, ``min arccos
  |U_iᵀ U_j|`` over entries (the absolute value because a singular vector's
  sign is arbitrary). ``"smallest"`` is PACFL Eq. 2's smallest principal
  angle ``Θ_1 = arccos σ_max(Q_iᵀ Q_j)``, ``Q`` an orthonormal basis. With
  one subspace per class, two clients' spans share directions common to
  all images (e.g. near the mean image), so ``"smallest"`` is near 0 for
  every pair, while ``"basis"`` separates them.
* :func:`agglomerative`: scikit-learn's ``AgglomerativeClustering`` on the
  matrix with a distance threshold ``β`` (the paper's) or a fixed number of
  clusters. Its ``"average"`` is UPGMA, while the authors' own loop is
  WPGMA, so a threshold can give different clusters on the same matrix.
* :func:`assign` places new clients by the same angles: the cluster of the
  lowest linkage distance (average / complete / single over its members).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

PROXIMITIES = ("smallest", "basis")
LINKAGES = ("average", "complete", "single")


def _top_left_vectors(mat: jax.Array, rank: int, iterations: int,
                      oversample: int) -> tuple[jax.Array, jax.Array]:
  """Top ``rank`` left singular vectors and values of ``mat`` [D, M].

  ``iterations < 0``: LAPACK's full SVD. Otherwise randomized subspace
  iteration (Halko, Martinsson, Tropp 2011, Alg. 4.4) on ``rank +
  oversample`` columns, error shrinking as ``(σ_{k+1}/σ_j)^(2q+1)``, with a
  fixed Gaussian test matrix so the result depends on the data alone; it
  is far cheaper than full SVDs (see experiments/perf_notes.md).
  """
  if iterations < 0:
    u, s, _ = jnp.linalg.svd(mat, full_matrices=False)
    return u[:, :rank], s[:rank]
  k = min(rank + oversample, *mat.shape)
  omega = jax.random.normal(jax.random.PRNGKey(0), (mat.shape[1], k))
  q, _ = jnp.linalg.qr(mat @ omega)
  for _ in range(iterations):
    z, _ = jnp.linalg.qr(mat.T @ q)
    q, _ = jnp.linalg.qr(mat @ z)
  ub, s, _ = jnp.linalg.svd(q.T @ mat, full_matrices=False)
  return (q @ ub)[:, :rank], s[:rank]


def client_subspace(x: jax.Array, y: jax.Array, n: jax.Array, *,
                    num_classes: int, rank: int,
                    per_class: bool = True, iterations: int = 6,
                    oversample: int = 7) -> tuple[jax.Array, jax.Array]:
  """ONE client's signature: top-``rank`` left singular vectors per class.

  Args:
    x: ``[N_max, H, W, Ch]`` images (raw pixels; angles are scale-free).
    y: ``[N_max]`` labels.
    n: valid examples; rows ``>= n`` are padding.
    num_classes: ``C`` (static).
    rank: ``p`` (static).
    per_class: one SVD per class (the authors' code) or of all the data.
    iterations: randomized SVD power iterations; ``-1``: full SVD.
    oversample: extra columns of the randomized SVD.

  Returns:
    ``(U [D, G·p], mask [G·p])`` with ``G = C`` per class or ``1``;
    column ``g·p + j`` is the ``j``-th singular vector of group ``g`` when
    ``j`` is below the group's rank (mask True), zero otherwise.
  """
  n_max = x.shape[0]
  m = x.reshape(n_max, -1).astype(jnp.float32)
  valid = jnp.arange(n_max) < n

  def one(rows):
    mat = jnp.where(rows[:, None], m, 0.0).T  # [D, N_max]
    u, s = _top_left_vectors(mat, rank, iterations, oversample)
    # A column past the group's rank spans nothing of its data.
    tol = jnp.max(s) * max(mat.shape) * jnp.finfo(jnp.float32).eps
    keep = (s > tol) & (jnp.arange(rank) < jnp.sum(rows))
    return u * keep[None, :], keep

  if per_class:
    groups = valid[None, :] & (y[None, :] == jnp.arange(num_classes)[:, None])
  else:
    groups = valid[None, :]
  u, keep = jax.vmap(one)(groups)  # [G, D, p], [G, p]
  g = u.shape[0]
  return (jnp.transpose(u, (1, 0, 2)).reshape(u.shape[1], g * rank),
          keep.reshape(g * rank))


@functools.partial(jax.jit, static_argnames=("form",))
def proximity(u: jax.Array, mask: jax.Array, form: str = "smallest"
              ) -> jax.Array:
  """``[N, N]`` angles in degrees between the clients' signatures.

  Args:
    u: ``[N, D, R]`` stacked :func:`client_subspace` bases.
    mask: ``[N, R]`` their valid columns.
    form: ``"smallest"`` principal angle or ``"basis"`` (module doc).

  Returns:
    ``[N, N]`` float32; the diagonal is 0 (up to rounding, clipped).
  """
  if form not in PROXIMITIES:
    raise ValueError(f"form must be one of {PROXIMITIES}, got {form!r}.")
  u = u * mask[:, None, :]
  if form == "basis":
    gram = jnp.abs(jnp.einsum("idr,jds->ijrs", u, u))  # [N, N, R, R]
    cos = jnp.max(gram, axis=(2, 3))
  else:
    # Principal angles need orthonormal bases: the classes' vectors together
    # are not (the first vectors of two classes are close).
    def orthonormal(b):
      q, s, _ = jnp.linalg.svd(b, full_matrices=False)
      return q * (s > jnp.max(s) * 1e-4)[None, :]

    q = jax.vmap(orthonormal)(u)
    gram = jnp.einsum("idr,jds->ijrs", q, q)
    cos = jax.vmap(jax.vmap(lambda g: jnp.linalg.svd(g, compute_uv=False)[0])
                   )(gram)
  angles = jnp.degrees(jnp.arccos(jnp.clip(cos, 0.0, 1.0)))
  return jnp.where(jnp.eye(u.shape[0], dtype=bool), 0.0, angles)


class Clusters(NamedTuple):
  """Host result of :func:`agglomerative`.

  Attributes:
    labels: ``[N]`` int32 cluster of each client, ``0 .. K-1``.
    num_clusters: ``K``.
  """
  labels: np.ndarray
  num_clusters: int


def agglomerative(a: np.ndarray, *, threshold: float | None = None,
                  num_clusters: int | None = None,
                  linkage: str = "average") -> Clusters:
  """Hierarchical clustering of a precomputed proximity matrix.

  Args:
    a: ``[N, N]`` symmetric distances (host array).
    threshold: ``β``: clusters at a linkage distance ``>= β`` are not merged.
    num_clusters: a fixed ``K`` instead (exactly one of the two).
    linkage: ``"average"``, ``"complete"`` or ``"single"``.

  Returns:
    :class:`Clusters`, numbered by each cluster's first client.
  """
  from sklearn.cluster import AgglomerativeClustering  # pylint: disable=g-import-not-at-top
  if (threshold is None) == (num_clusters is None):
    raise ValueError("give exactly one of threshold= or num_clusters=.")
  if linkage not in LINKAGES:
    raise ValueError(f"linkage must be one of {LINKAGES}, got {linkage!r}.")
  a = np.asarray(a, np.float64)
  a = (a + a.T) / 2
  np.fill_diagonal(a, 0.0)
  if a.shape[0] == 1:
    return Clusters(np.zeros(1, np.int32), 1)
  model = AgglomerativeClustering(
      n_clusters=num_clusters, distance_threshold=threshold,
      metric="precomputed", linkage=linkage).fit(a)
  # scikit-learn's numbering is arbitrary: renumber by first member.
  _, first = np.unique(model.labels_, return_index=True)
  order = np.argsort(first)
  relabel = np.empty_like(order)
  relabel[order] = np.arange(order.shape[0])
  labels = relabel[model.labels_].astype(np.int32)
  return Clusters(labels, int(labels.max()) + 1)


def assign(a_new: np.ndarray, labels: np.ndarray, num_clusters: int,
           linkage: str = "average") -> np.ndarray:
  """Clusters of new clients from their angles to the clustered ones.

  Args:
    a_new: ``[M, N]`` angles of ``M`` new clients to the ``N`` clustered
      ones (:func:`proximity`'s new rows).
    labels: ``[N]`` clusters of the clustered clients.
    num_clusters: ``K``.
    linkage: the distance of a client to a cluster: the mean
      (``"average"``), largest (``"complete"``) or smallest (``"single"``)
      angle to its members.

  Returns:
    ``[M]`` int32 cluster of each new client (ties: the lowest id).
  """
  if linkage not in LINKAGES:
    raise ValueError(f"linkage must be one of {LINKAGES}, got {linkage!r}.")
  a_new = np.asarray(a_new, np.float64)
  reduce = {"average": np.mean, "complete": np.max, "single": np.min}[linkage]
  dist = np.stack([reduce(a_new[:, labels == k], axis=1)
                   for k in range(num_clusters)], axis=1)
  return np.argmin(dist, axis=1).astype(np.int32)
