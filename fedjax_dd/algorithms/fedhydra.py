"""FedHydra: one-shot data-free FL with model stratification and SA.

Pipeline (Alg. 1), in the :class:`~fedjax_dd.core.algorithm.ServerDistillation`
shape:

1. **Local training** (``client_stage``): every client trains its model once
   to convergence and uploads it (:mod:`fedjax_dd.algorithms.one_shot`).
2. **Model stratification** (``setup``, Alg. 2,
   :mod:`fedjax_dd.algorithms.stratify`): the loss curves ``L_kj`` of
   ``m · c`` short generator trainings give ``U``, ``U_r``, ``U_c``
   (Eqs. 2–7).
3. **HASA** (``init`` / ``epoch``, Alg. 1): ``T_g`` epochs of ``T_G``
   generator steps and a student phase, the teachers combined by stratified
   aggregation (Alg. 3, Eqs. 8–11) instead of DENSE's plain average
   (:mod:`fedjax_dd.distill.dfkd`).

Multi-round FedHydra (paper Tab. 5) repeats the stages for ``T`` rounds from
the distilled model (:func:`fedjax_dd.core.server.run_server_rounds`).

Reference: Bai et al., "A Unified Solution to Diverse Heterogeneities in
One-Shot Federated Learning" (FedHydra), Algs. 1–3, Eqs. 1–19.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import flax
import flax.linen as nn
import jax
import optax

from fedjax_dd.algorithms import stratify as stratify_lib
from fedjax_dd.core.algorithm import ServerDistillation, Teachers
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill import dfkd
from fedjax_dd.distill import ensemble

PyTree = Any


@flax.struct.dataclass
class FedHydraState:
  """The HASA state and the SA context it uses.

  Attributes:
    kd: the distillation state (generator, student, pool, key, epoch).
    sa: ``(U_r [c, m], U_c [c, m])``, the ``ctx`` of the ensemble rule.
  """
  kd: dfkd.DFKDState
  sa: tuple[jax.Array, jax.Array]


def fedhydra(client_stage: Callable[..., Teachers],
             groups: Sequence[ensemble.TeacherGroup],
             generator: nn.Module,
             student: Classifier,
             student_input: ensemble.InputFn,
             hparams: dfkd.DFKDHyperParams = dfkd.DFKDHyperParams(),
             *,
             stratify_steps: int = 30,
             stratify_batch_size: int = 64,
             combine: ensemble.CombineFn = stratify_lib.stratified_ensemble,
             sa_average_scale: bool = True,
             generator_optimizer: optax.GradientTransformation = optax.adam(1e-3, b1=0.5),
             student_optimizer: optax.GradientTransformation = optax.sgd(0.01),
             mapper: ClientMapper = ClientMapper(),
             stratify_mapper: ClientMapper | None = None
             ) -> ServerDistillation:
  """Builds FedHydra.

  Args:
    client_stage: the one-shot client stage
      (:func:`fedjax_dd.algorithms.one_shot.client_stage`).
    groups: the client models, one group per architecture.
    generator: the generator module (unconditional for stratification).
    student: the global model.
    student_input: maps generated images in ``[0, 1]`` to the student input.
    hparams: HASA hyper-parameters (``T_G``, ``λ1``, ``λ2``, ``β``, ``T``).
    stratify_steps: ``T_G`` of Alg. 2 [30].
    stratify_batch_size: noise samples per stratification step.
    combine: the ensemble rule; SA by default. Passing
      :func:`ensemble.average_ensemble` gives the "AE" ablation (Tab. 6).
    sa_average_scale: see :func:`stratify.sa_context`.
    generator_optimizer: [Adam, lr 1e-3, β1 = 0.5 as in the reference code].
    student_optimizer: [SGD, lr 0.01].
    mapper: batching of the teachers.
    stratify_mapper: batching of Alg. 2's (client, class) pairs; None:
      ``mapper`` with ``workload="stratify"``.

  Returns:
    A :class:`~fedjax_dd.core.algorithm.ServerDistillation`; ``setup`` is
    ``{"curves": [m, c, T_G]}`` and ``report`` gives ``U``, ``U_r``, ``U_c``
    and the last synthetic batch.
  """
  if stratify_mapper is None:
    stratify_mapper = dataclasses.replace(mapper, workload="stratify")
  stratify = stratify_lib.make_stratifier(
      groups, generator, num_classes=student.num_classes,
      steps=stratify_steps, batch_size=stratify_batch_size,
      optimizer=generator_optimizer, mapper=stratify_mapper)
  distill = dfkd.make_dfkd(groups, generator, student, student_input, combine,
                           hparams, generator_optimizer=generator_optimizer,
                           student_optimizer=student_optimizer, mapper=mapper)

  def setup(teachers: Teachers, key: jax.Array) -> dict[str, jax.Array]:
    return {"curves": stratify(teachers.vars, key).curves}

  def init(key, setup, teachers, params, batch_stats) -> FedHydraState:
    del teachers
    s = stratify_lib.stratification_from_curves(setup["curves"])
    return FedHydraState(
        kd=distill.init(key, params, batch_stats),
        sa=stratify_lib.sa_context(s, average_scale=sa_average_scale))

  def epoch(state: FedHydraState, teachers: Teachers):
    kd, metrics = distill.epoch(state.kd, teachers.vars, state.sa)
    return dataclasses.replace(state, kd=kd), metrics

  def report(state: FedHydraState, setup) -> dict[str, Any]:
    s = stratify_lib.stratification_from_curves(setup["curves"])
    return {"U": s.u, "U_r": s.u_r, "U_c": s.u_c,
            "samples": dfkd.pool_samples(state.kd)}

  return ServerDistillation(
      client_stage=client_stage, setup=setup, init=init, epoch=epoch,
      model=lambda state: (state.kd.params, state.kd.batch_stats),
      report=report)
