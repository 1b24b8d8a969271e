"""FedHydra: one-shot data-free FL with model stratification and SA.

Pipeline (Alg. 1):

1. **Local training.** Every client trains its model once to convergence
   (SGD lr 0.01, batch 128, ``E`` local epochs) and uploads it; this stage is
   the engine's client stage (:func:`local_stage`), the same program as
   one-shot FedAvg's round, so FedHydra, DENSE, FedDF and OS-FedAvg can share
   bit-identical client models.
2. **Model stratification** (Alg. 2, :mod:`fedjax_dd.algorithms.stratify`):
   ``U``, ``U_r``, ``U_c`` from ``m · c`` short generator trainings, one
   mapped program per architecture.
3. **HASA** (Alg. 1): ``T_g`` epochs of ``T_G`` generator steps followed by a
   student phase, with the teachers combined by stratified aggregation
   (Alg. 3) instead of the plain average of DENSE
   (:mod:`fedjax_dd.distill.dfkd`).

Multi-round FedHydra (paper Tab. 5) repeats the three stages for ``T``
rounds, the clients restarting local training from the distilled global model;
the round loop lives in ``experiments/run_fedhydra.py`` and calls the same
functions.

Reference: Bai et al., "A Unified Solution to Diverse Heterogeneities in
One-Shot Federated Learning" (FedHydra), Algs. 1–3, Eqs. 1–19.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fedjax_dd.algorithms import stages
from fedjax_dd.algorithms import stratify as stratify_lib
from fedjax_dd.core.algorithm import Cohort
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import LocalResult, make_local_update
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill import dfkd

PyTree = Any


def local_stage(task: Classifier,
                optimizer: optax.GradientTransformation,
                *,
                batch_size: int,
                max_steps: int,
                mapper: ClientMapper = ClientMapper()
                ) -> Callable[[PyTree, PyTree, Cohort, jax.Array], LocalResult]:
  """One-shot local training of every client of one architecture.

  Args:
    task: the client model.
    optimizer: local optimizer [SGD lr 0.01], fresh per client.
    batch_size: [128].
    max_steps: static scan length (``max(cohort.num_steps)``).
    mapper: how the clients are batched.

  Returns:
    ``train(params, batch_stats, cohort, key) -> LocalResult [S, ...]``.
    Client ``i`` uses ``fold_in(key, i)`` (:func:`stages.client_keys`), so
    with the rounds loop's round key the result equals one-shot FedAvg's
    client models.
  """
  local = make_local_update(task, optimizer, batch_size=batch_size,
                            max_steps=max_steps)
  train_all = stages.client_stage(local, mapper)

  def train(params, batch_stats, cohort: Cohort, key: jax.Array) -> LocalResult:
    keys = stages.client_keys(key, cohort.client_ids)
    no_ctx = jnp.zeros(cohort.client_ids.shape, jnp.float32)
    return train_all(params, batch_stats, (), cohort, keys, no_ctx)

  return train


class FedHydra(NamedTuple):
  """FedHydra's server side as pure functions.

  Attributes:
    stratify: ``(teacher_vars, key) -> Stratification`` (Alg. 2).
    distill: the HASA loop (:class:`fedjax_dd.distill.dfkd.DataFreeKD`); its
      ``epoch`` takes ``ctx = ensemble_context(stratification)``.
  """
  stratify: Callable[..., stratify_lib.Stratification]
  distill: dfkd.DataFreeKD

  @staticmethod
  def ensemble_context(s: stratify_lib.Stratification,
                       average_scale: bool = True
                       ) -> tuple[jax.Array, jax.Array]:
    """The ``ctx`` of :func:`stratify.stratified_ensemble`; see
    :func:`stratify.sa_context` for ``average_scale``."""
    return stratify_lib.sa_context(s, average_scale=average_scale)


def fedhydra(groups: Sequence[dfkd.TeacherGroup],
             generator: nn.Module,
             student: Classifier,
             student_input: dfkd.InputFn,
             hparams: dfkd.DFKDHyperParams = dfkd.DFKDHyperParams(),
             *,
             stratify_steps: int = 30,
             stratify_batch_size: int = 64,
             combine: dfkd.CombineFn = stratify_lib.stratified_ensemble,
             generator_optimizer: optax.GradientTransformation = optax.adam(1e-3, b1=0.5),
             student_optimizer: optax.GradientTransformation = optax.sgd(0.01),
             mapper: ClientMapper = ClientMapper()) -> FedHydra:
  """Builds FedHydra's stratification and HASA.

  Args:
    groups: the uploaded client models, one group per architecture.
    generator: the generator module (unconditional for stratification).
    student: the global model.
    student_input: maps generated images in ``[0, 1]`` to the student input.
    hparams: HASA hyper-parameters (``T_G``, ``λ1``, ``λ2``, ``β``, ``T``).
    stratify_steps: ``T_G`` of Alg. 2 [30].
    stratify_batch_size: noise samples per stratification step.
    combine: the ensemble rule; SA by default. Passing
      :func:`dfkd.average_ensemble` gives the "AE" ablation (Tab. 6).
    generator_optimizer: [Adam, lr 1e-3, β1 = 0.5 as in the reference code].
    student_optimizer: [SGD, lr 0.01].
    mapper: batching of teachers and of the (client, class) pairs.

  Returns:
    A :class:`FedHydra`.
  """
  strat = stratify_lib.make_stratifier(
      groups, generator, num_classes=student.num_classes,
      steps=stratify_steps, batch_size=stratify_batch_size,
      optimizer=generator_optimizer, mapper=mapper)
  distill = dfkd.make_dfkd(groups, generator, student, student_input, combine,
                           hparams, generator_optimizer=generator_optimizer,
                           student_optimizer=student_optimizer, mapper=mapper)
  return FedHydra(stratify=strat, distill=distill)
