"""FedFTG and data-free FedDF: FedAvg whose global model is fine-tuned on
generated data, with the round's clients as teachers.

References:
  Zhang et al., "Fine-tuning Global Model via Data-Free Knowledge
  Distillation for Non-IID Federated Learning", CVPR 2022 (FedFTG);
  Lin et al., "Ensemble Distillation for Robust Model Fusion in Federated
  Learning", NeurIPS 2020 (FedDF).

Both are the clustered round of :mod:`fedjax_dd.algorithms.clustered` with
every client its own group (:func:`~fedjax_dd.algorithms.clustered.
singletons`): the FedAvg of the cohort is fine-tuned by IGA
(:mod:`fedjax_dd.distill.iga`) with the ``S`` client models as teachers.

* **FedFTG** uses IGA as its code does: labels drawn from the cohort's class
  counts, per-class teacher weights ``n_y^k / Σ_k n_y^k``
  (``IGAHyperParams()`` defaults).
* **Data-free FedDF**, as DisUE's Tab. 1 runs FedDF without public data: the
  student distils the *plain* ensemble of the clients on samples of the same
  conditional generator (:func:`feddf_hparams`). FedDF's own server with
  public data is :mod:`fedjax_dd.algorithms.feddf`.
"""

from __future__ import annotations

import dataclasses

import jax

from fedjax_dd.algorithms.clustered import clustered_distillation, singletons
from fedjax_dd.core.algorithm import FederatedAlgorithm
from fedjax_dd.core.local import LocalTraining
from fedjax_dd.distill.iga import IGA, IGAHyperParams


def feddf_hparams(hparams: IGAHyperParams = IGAHyperParams()
                  ) -> IGAHyperParams:
  """IGA settings of data-free FedDF: the plain ensemble average.

  Uniform labels (no GLS) and equal weights ``1/K`` for the ``K`` client
  teachers (no GWF); everything else as ``hparams``.
  """
  return dataclasses.replace(hparams, use_gls=False, use_gwf=False)


def fedftg(training: LocalTraining, *, iga: IGA, generator_key: jax.Array,
           evaluate_before_iga: bool = False) -> FederatedAlgorithm:
  """Builds FedFTG (or data-free FedDF, with :func:`feddf_hparams` in
  ``iga``): FedAvg, then IGA with the cohort's clients as teachers.

  Args are those of :func:`~fedjax_dd.algorithms.clustered.
  clustered_distillation`; ``iga`` is built with ``num_teachers_max`` = the
  cohort size.
  """
  return clustered_distillation(
      training, grouping=singletons, iga=iga, generator_key=generator_key,
      evaluate_before_iga=evaluate_before_iga)
