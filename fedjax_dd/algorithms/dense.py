"""DENSE: data-free one-shot FL by ensemble distillation through a generator.

DENSE trains a generator against the *plain average* of the client models'
logits (with the BatchNorm-statistics and adversarial terms) and distils that
ensemble into the global model: FedHydra's pipeline without stratification
and with average aggregation ("AE") for SA, on the shared
:mod:`fedjax_dd.distill.dfkd`, so the comparison isolates SA.

Reference: Zhang et al., "DENSE: Data-Free One-Shot Federated Learning",
NeurIPS 2022.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import optax

from fedjax_dd.core.algorithm import ServerDistillation, Teachers, no_setup
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill import dfkd
from fedjax_dd.distill import ensemble


def dense(client_stage: Callable[..., Teachers],
          groups: Sequence[ensemble.TeacherGroup],
          generator: nn.Module,
          student: Classifier,
          student_input: ensemble.InputFn,
          hparams: dfkd.DFKDHyperParams = dfkd.DFKDHyperParams(lambda_adv=0.5),
          *,
          generator_optimizer: optax.GradientTransformation = optax.adam(1e-3, b1=0.5),
          student_optimizer: optax.GradientTransformation = optax.sgd(0.01),
          mapper: ClientMapper = ClientMapper()) -> ServerDistillation:
  """Builds DENSE.

  Args:
    client_stage: the one-shot client stage
      (:func:`fedjax_dd.algorithms.one_shot.client_stage`).
    groups: the uploaded client models, one group per architecture.
    generator: the generator module.
    student: the global model.
    student_input: maps generated images in ``[0, 1]`` to the student input.
    hparams: loss weights and step counts (DENSE's adversarial weight 0.5).
    generator_optimizer: [Adam, lr 1e-3, β1 = 0.5 as in the reference code].
    student_optimizer: [SGD, lr 0.01].
    mapper: how each architecture's teachers are batched.

  Returns:
    A :class:`~fedjax_dd.core.algorithm.ServerDistillation` whose state is a
    :class:`~fedjax_dd.distill.dfkd.DFKDState`.
  """
  distill = dfkd.make_dfkd(groups, generator, student, student_input,
                           ensemble.average_ensemble, hparams,
                           generator_optimizer=generator_optimizer,
                           student_optimizer=student_optimizer, mapper=mapper)

  def init(key, setup, teachers, params, batch_stats) -> dfkd.DFKDState:
    del setup, teachers
    return distill.init(key, params, batch_stats)

  def epoch(state: dfkd.DFKDState, teachers: Teachers):
    return distill.epoch(state, teachers.vars, ())

  def report(state: dfkd.DFKDState, setup) -> dict[str, Any]:
    del setup
    return {"samples": dfkd.pool_samples(state)}

  return ServerDistillation(
      client_stage=client_stage, setup=no_setup, init=init, epoch=epoch,
      model=lambda state: (state.params, state.batch_stats), report=report)
