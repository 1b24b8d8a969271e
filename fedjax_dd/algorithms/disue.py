"""DisUE: a universal expert distilled from clustered federated learning.

Reference: Leng et al., "Distilling A Universal Expert from Clustered
Federated Learning" (DisUE), Algorithm 1.

DisUE is the clustered round of :mod:`fedjax_dd.algorithms.clustered` with
its grouping, :func:`affinity_grouping`: the cosine similarity of the
cohort's updates (Eq. 3), computed in the clear or through the PCSC protocol
(Sec. 4.3), then Affinity Propagation (Eq. 4) with scikit-learn's defaults.
``K`` is AP's, and changes every round; if AP does not converge the round
uses one group and counts it (``clustering_converged = 0``).

Eq. 3 names the parameter vectors ``ω_u``, but every client starts the
round from the same ``ω_G``, so raw parameters have cosines near 1; Sec. 4.1
speaks of "gradient updates", so the default compares updates
``Δ_u = ω_u − ω_G`` (``similarity="delta"``); ``"raw"`` is the literal
reading.

A client deploys the universal expert ``ω_G`` (the default ``deploy``): the
groups are re-formed every round, so no cluster model outlives its round.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from fedjax_dd.algorithms.clustered import Groups, Grouping
from fedjax_dd.algorithms.clustered import clustered_distillation
from fedjax_dd.cluster import affinity
from fedjax_dd.cluster import pcsc
from fedjax_dd.cluster import similarity as similarity_lib
from fedjax_dd.core import checks
from fedjax_dd.core.algorithm import FederatedAlgorithm
from fedjax_dd.core.local import LocalTraining
from fedjax_dd.distill.iga import IGA

PyTree = Any

SIMILARITIES = ("delta", "raw")
PROTOCOLS = ("plain", "pcsc")


@dataclasses.dataclass(frozen=True)
class DisUEHyperParams:
  """DisUE's CGA-Clustering settings (Eqs. 3-4), the ``disue`` config group
  (:func:`affinity_grouping`).

  Attributes:
    similarity: ``"delta"`` (cosine of updates, Sec. 4.1) or ``"raw"``
      (of the parameters, Eq. 3's literal reading).
    similarity_protocol: ``"plain"`` or ``"pcsc"`` (Sec. 4.3).
    damping: Affinity Propagation's damping in ``[0.5, 1)``
      (scikit-learn's default 0.5).
    preference: AP's preference; ``None``: the median similarity.
  """
  similarity: str = "delta"
  similarity_protocol: str = "plain"
  damping: float = 0.5
  preference: float | None = None

  def __post_init__(self):
    checks.check_choice("similarity", self.similarity, SIMILARITIES)
    checks.check_choice("similarity_protocol", self.similarity_protocol,
                        PROTOCOLS)
    checks.check_number("damping", self.damping, 0.5, 1.0, high_open=True)
    if self.preference is not None:
      checks.check_number("preference", self.preference)


def affinity_grouping(*, similarity: str = "delta", protocol: str = "plain",
                      damping: float = 0.5,
                      preference: float | None = None) -> Grouping:
  """DisUE's CGA-Clustering: AP on the cohort's update similarity.

  Args:
    similarity: ``"delta"`` (updates ``ω_u − ω_G``) or ``"raw"``
      (parameters ``ω_u``); parameters only, never BatchNorm statistics.
    protocol: ``"plain"`` (the server computes the cosines from the uploaded
      models) or ``"pcsc"`` (Sec. 4.3, relayed by the server; its
      ciphertexts go to the ledger under the tag ``pcsc``). PCSC hides
      nothing from the server and leaks the key holder's update to its
      partner (:mod:`fedjax_dd.cluster.pcsc`); it is here to measure its
      cost.
    damping: AP damping in ``[0.5, 1)``.
    preference: AP preference; ``None`` is the median similarity.

  Returns:
    A :data:`~fedjax_dd.algorithms.clustered.Grouping`.

  Raises:
    ValueError: an unknown ``similarity`` or ``protocol``.
  """
  if similarity not in SIMILARITIES:
    raise ValueError(f"similarity must be one of {SIMILARITIES}, got "
                     f"{similarity!r}.")
  if protocol not in PROTOCOLS:
    raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}.")

  def grouping(client_params, global_params, num_examples, rng) -> Groups:
    del num_examples
    traffic = {}
    if protocol == "plain":
      sim = np.asarray(jax.device_get(similarity_lib.update_similarity(
          client_params, global_params, mode=similarity)))
    else:
      vectors = np.asarray(jax.device_get(similarity_lib.update_vectors(
          client_params, global_params, mode=similarity)))
      sim, _, _ = pcsc.pcsc_similarity_matrix(vectors, rng=rng)
      # Every pair is relayed by the server: uploads and downloads.
      pairs = math.comb(vectors.shape[0], 2)
      pair_bits = pcsc.PCSCParams().relayed_pair_bits(vectors.shape[1])
      for kind in ("upload", "download"):
        traffic[(kind, "pcsc")] = pairs * pair_bits[kind]
    clusters = affinity.affinity_propagation(sim, rng=rng, damping=damping,
                                             preference=preference)
    return Groups(labels=np.asarray(clusters.labels, np.int32),
                  num_groups=int(clusters.num_clusters),
                  converged=bool(clusters.converged), traffic=traffic)

  return grouping


def disue(training: LocalTraining, *, iga: IGA | None,
          generator_key: jax.Array | None, grouping: Grouping | None = None,
          evaluate_before_iga: bool = False) -> FederatedAlgorithm:
  """Builds DisUE (Algorithm 1).

  Args:
    training, evaluate_before_iga: the L-phase and the reporting (see
      :func:`~fedjax_dd.algorithms.clustered.clustered_distillation`).
    iga: the IGA (``num_teachers_max`` = the cohort size); ``None`` is the
      "−IGA" ablation (FedAvg of the cluster models).
    generator_key: the generator's initialisation key.
    grouping: defaults to :func:`affinity_grouping` with its defaults.

  Returns:
    A :class:`~fedjax_dd.core.algorithm.FederatedAlgorithm`.
  """
  return clustered_distillation(
      training, grouping=grouping or affinity_grouping(), iga=iga,
      generator_key=generator_key, evaluate_before_iga=evaluate_before_iga)
