"""FedDF: ensemble distillation of the client models on unlabeled public data.

The server initialises the global model with one-shot FedAvg and then
fine-tunes it to match the averaged client logits on an unlabeled public set
it holds: ``min KL(σ(mean_k P_k(x)/T) ‖ σ(F_g(x)/T))`` with Adam. The
public set never leaves the server. The loss is
:func:`fedjax_dd.distill.ensemble.make_student_loss` with ``β = 0``, so
FedDF differs from DENSE only in its inputs (a public set, not a generator).

Reference: Lin et al., "Ensemble Distillation for Robust Model Fusion in
Federated Learning", NeurIPS 2020 (Alg. 1, the server's ensemble
distillation).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dd.algorithms import one_shot
from fedjax_dd.core.algorithm import ServerDistillation, Teachers, no_setup
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.task import Classifier
from fedjax_dd.data import preprocess
from fedjax_dd.distill import ensemble
from fedjax_dd.distill import gen_student

PyTree = Any


@flax.struct.dataclass
class FedDFState:
  """Student state of FedDF.

  Attributes:
    params: global model parameters.
    batch_stats: its BatchNorm statistics.
    opt_state: optimizer state.
    key: root key; epoch ``e`` uses ``fold_in(key, e)``.
    epoch: completed epochs.
  """
  params: PyTree
  batch_stats: PyTree
  opt_state: PyTree
  key: jax.Array
  epoch: jax.Array


def public_set(x: np.ndarray, input_shape: Sequence[int]) -> np.ndarray:
  """Fits an unlabeled public set ``[N, H', W', Ch'] uint8`` to the model input.

  RGB becomes grayscale (ITU-R 601 luma) for a one-channel model, and the
  images are resized to ``input_shape`` ``(H, W, Ch)``.
  """
  if x.shape[-1] == 3 and input_shape[-1] == 1:
    gray = x.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    x = np.clip(np.round(gray), 0, 255).astype(np.uint8)[..., None]
  if x.shape[1:] != tuple(input_shape):
    x = preprocess.resize_images(x, tuple(input_shape))
  return x


def feddf(client_stage: Callable[..., Teachers],
          groups: Sequence[ensemble.TeacherGroup],
          student: Classifier,
          student_input: ensemble.InputFn,
          public_x: jax.Array,
          *,
          optimizer: optax.GradientTransformation = optax.adam(1e-3),
          batch_size: int = 128,
          steps_per_epoch: int = 50,
          temperature: float = 1.0,
          mapper: ClientMapper = ClientMapper()) -> ServerDistillation:
  """Builds FedDF.

  Args:
    client_stage: the one-shot client stage
      (:func:`fedjax_dd.algorithms.one_shot.client_stage`).
    groups: the uploaded client models, one group per architecture.
    student: the global model. With homogeneous clients it starts from their
      average (one-shot FedAvg), otherwise from the given model.
    student_input: maps public images in ``[0, 1]`` to the student input.
    public_x: ``[N, H, W, Ch]`` uint8 unlabeled public set (see
      :func:`public_set`).
    optimizer: [Adam, lr 1e-3].
    batch_size: public images per step.
    steps_per_epoch: steps per epoch (batches drawn with replacement).
    temperature: KD temperature.
    mapper: how each architecture's teachers are batched.

  Returns:
    A :class:`~fedjax_dd.core.algorithm.ServerDistillation` whose state is a
    :class:`FedDFState`.
  """
  if steps_per_epoch < 1 or batch_size < 1:
    raise ValueError(f"steps_per_epoch and batch_size must be >= 1, got "
                     f"{steps_per_epoch} and {batch_size}.")
  public_x = jnp.asarray(public_x)
  teachers_fn = ensemble.make_teacher_fn(groups, mapper)
  loss = ensemble.make_student_loss(teachers_fn, ensemble.average_ensemble,
                                    student, student_input, beta=0.0,
                                    temperature=temperature)
  grad = jax.value_and_grad(loss, has_aux=True)

  def init(key, setup, teachers: Teachers, params, batch_stats) -> FedDFState:
    del setup
    if len(teachers.vars) == 1:
      params, batch_stats = one_shot.average(teachers)
    return FedDFState(params, batch_stats, optimizer.init(params), key,
                      jnp.zeros((), jnp.int32))

  @jax.jit
  def step(p, s, o, teacher_vars, public_x, key, t):
    idx = jax.random.randint(jax.random.fold_in(key, t), (batch_size,), 0,
                             public_x.shape[0])
    x01 = public_x[idx].astype(jnp.float32) / 255.0
    no_labels = jnp.zeros((batch_size,), jnp.int32)
    (_, (s, m)), g = grad(p, s, teacher_vars, (), x01, no_labels)
    updates, o = optimizer.update(g, o, p)
    return optax.apply_updates(p, updates), s, o, m

  def epoch(state: FedDFState, teachers: Teachers):
    key = jax.random.fold_in(state.key, state.epoch)
    p, s, o = state.params, state.batch_stats, state.opt_state
    # A host loop over one jitted step: XLA:CPU runs conv steps slower in a
    # lax.scan (experiments/perf_notes.md).
    step_metrics = []
    for t in range(steps_per_epoch):
      p, s, o, m = step(p, s, o, teachers.vars, public_x, key,
                        jnp.asarray(t, jnp.int32))
      step_metrics.append(m)
    metrics = gen_student.mean_metrics(step_metrics)
    return FedDFState(p, s, o, state.key, state.epoch + 1), metrics

  return ServerDistillation(
      client_stage=client_stage, setup=no_setup, init=init, epoch=epoch,
      model=lambda state: (state.params, state.batch_stats))
