"""DENSE: data-free one-shot FL by ensemble distillation through a generator.

DENSE trains a generator against the *plain average* of the client models'
logits (with the BatchNorm-statistics and adversarial terms) and distils that
ensemble into the global model. It is FedHydra's pipeline without model
stratification, with average aggregation ("AE") in place of SA; both share
:mod:`fedjax_dd.distill.dfkd`, so the comparison isolates SA.

Reference: Zhang et al., "DENSE: Data-Free One-Shot Federated Learning",
NeurIPS 2022.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import optax

from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill import dfkd


def dense(groups: Sequence[dfkd.TeacherGroup],
          generator: nn.Module,
          student: Classifier,
          student_input: dfkd.InputFn,
          hparams: dfkd.DFKDHyperParams = dfkd.DFKDHyperParams(lambda_adv=0.5),
          *,
          generator_optimizer: optax.GradientTransformation = optax.adam(1e-3, b1=0.5),
          student_optimizer: optax.GradientTransformation = optax.sgd(0.01),
          mapper: ClientMapper = ClientMapper()) -> dfkd.DataFreeKD:
  """DENSE's distillation loop; ``epoch`` takes ``ctx = ()``.

  Args:
    groups: the uploaded client models, one group per architecture.
    generator: the generator module.
    student: the global model.
    student_input: maps generated images in ``[0, 1]`` to the student input.
    hparams: loss weights and step counts (DENSE's adversarial weight 0.5).
    generator_optimizer: [Adam, lr 1e-3, β1 = 0.5 as in the reference code].
    student_optimizer: [SGD, lr 0.01].
    mapper: how each architecture's teachers are batched.
  """
  return dfkd.make_dfkd(groups, generator, student, student_input,
                        dfkd.average_ensemble, hparams,
                        generator_optimizer=generator_optimizer,
                        student_optimizer=student_optimizer, mapper=mapper)
