"""Client clustering: DisUE's stages and HFLDD's.

DisUE (Leng et al., Sec. 4.1 and 4.3):

* :mod:`~fedjax_dd.cluster.similarity` (device): update cosines, Eq. 3.
* :mod:`~fedjax_dd.cluster.affinity` (host): affinity propagation, Eq. 4.
* :mod:`~fedjax_dd.cluster.pcsc` (host, exact integers): the PCSC protocol
  of the secure similarity computation, Sec. 4.3.

The cluster models themselves (Eq. 2) are
:func:`fedjax_dd.core.aggregate.segment_weighted_mean`.

* :mod:`~fedjax_dd.cluster.sampling` (host): HFLDD's homogeneous K-Means and
  ClusterSampling (Shi et al., Sec. IV-B, Alg. 1), and FedSeq's groups.
* :mod:`~fedjax_dd.cluster.principal_angles`: PACFL's (Vahidian et al.,
  AAAI 2023) subspace angles, agglomerative clustering and assignment.

Names load on first use, so importing the package imports neither JAX nor
scikit-learn.
"""

import importlib
from typing import Any

_API: dict[str, str] = {
    "flatten_params": "similarity",
    "update_vectors": "similarity",
    "cosine_matrix": "similarity",
    "update_similarity": "similarity",
    "Clusters": "affinity",
    "affinity_propagation": "affinity",
    "PCSCParams": "pcsc",
    "pcsc_cosine": "pcsc",
    "pcsc_similarity_matrix": "pcsc",
    "client_subspace": "principal_angles",
    "proximity": "principal_angles",
    "agglomerative": "principal_angles",
    "assign": "principal_angles",
    "homogeneous_clusters": "sampling",
    "Topology": "sampling",
    "cluster_sampling": "sampling",
    "choose_heads": "sampling",
    "build_topology": "sampling",
    "diverse_groups": "sampling",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
  """Loads a public name on first use (PEP 562)."""
  if name not in _API:
    raise AttributeError(
        f"module 'fedjax_dd.cluster' has no attribute {name!r}")
  value = getattr(importlib.import_module(f"fedjax_dd.cluster.{_API[name]}"),
                  name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_API))
