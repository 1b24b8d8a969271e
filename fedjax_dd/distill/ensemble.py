"""Teacher ensembles and knowledge-distillation losses shared by KD loops.

The server of a one-shot (or data-free) federated method distils the
ensemble of ``m`` uploaded client models (*teachers*) into one global model
(the *student*); the loops (:mod:`fedjax_dd.distill.dfkd`,
:mod:`fedjax_dd.distill.iga`, :mod:`fedjax_dd.algorithms.feddf`) share:

* **teachers**: one :class:`TeacherGroup` per architecture, all evaluated
  on one batch by :func:`make_teacher_fn`;
* **combine rules** ``combine(logits [m, B, K], y [B], ctx) -> [B, K]``
  (:data:`CombineFn`, e.g. :func:`average_ensemble`) giving the ensemble
  logits ``P``; ``ctx`` is a pytree of the rule's traced parameters (or
  ``()``), so changing it never recompiles;
* **KD losses** (below);
* **the generator calling convention** (:func:`apply_generator`):
  ``generator.apply(vars, z, [y], train=)`` returns images in ``[0, 1]``;
  one with ``conditional=True`` also receives the labels, one with
  ``output_space = "normalised"`` returns classifier inputs
  (:func:`generator_input_fn`).

Losses (FedHydra Eqs. 13–19, DENSE Eqs. 4–8), with ``F_g`` the student and
``x̂`` the distillation inputs:

* generator: ``L_Gen = CE(P, y) + λ1·L_BN + λ2·L_AD`` with
  ``L_AD = −KL(σ(P/T) ‖ σ(F_g(x̂)/T))``, which pushes the generator to samples
  where student and ensemble disagree (:func:`generator_objective`,
  :func:`adversarial_kl`);
* student: ``L_Glo = KL(σ(P/T) ‖ σ(F_g(x̂)/T)) + β·CE(F_g(x̂), argmax P)``
  (:func:`kd_objective`, :func:`make_student_loss`).

``L_BN`` (FedHydra Eq. 14) is read in the DeepInversion / DENSE form, with
``(μ_kl, σ²_kl)`` the running statistics of teacher ``k``'s BatchNorm layer
``l`` and ``μ_l(x̂), σ²_l(x̂)`` the batch mean and (biased) variance of the
features entering it in inference mode:

    ``L_BN = (1/m) Σ_k Σ_l ‖μ_l(x̂) − μ_kl‖₂ + ‖σ²_l(x̂) − σ²_kl‖₂``.

We average over the teachers so that ``λ1`` does not scale with ``m``. The
BatchNorm inputs are captured with ``flax.linen.intercept_methods``, so any
Flax model works unchanged; models without BatchNorm contribute 0.

References:
  Bai et al., "A Unified Solution to Diverse Heterogeneities in One-Shot
  Federated Learning" (FedHydra), Algs. 1–3 and Eqs. 12–19.
  Zhang et al., "DENSE: Data-Free One-Shot Federated Learning", NeurIPS 2022.
  Yin et al., "Dreaming to Distill: Data-free Knowledge Transfer via
  DeepInversion", CVPR 2020.
  Hinton et al., "Distilling the Knowledge in a Neural Network", 2015.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dd.core.clients import ClientMapper, once_jit
from fedjax_dd.core.task import Classifier

PyTree = Any
# (teacher logits [m, B, K], target labels [B], ctx) -> ensemble logits [B, K].
CombineFn = Callable[[jax.Array, jax.Array, PyTree], jax.Array]
# Images in (0, 1) [B, H, W, Ch] -> the model's float input.
InputFn = Callable[[jax.Array], jax.Array]
# One group's stacked variables: (params [m_g, ...], batch_stats [m_g, ...]).
TeacherVars = tuple[tuple[PyTree, PyTree], ...]
# (teacher_vars, x01 [B, H, W, Ch]) -> (logits [m, B, K], bn [m]).
TeacherFn = Callable[[TeacherVars, jax.Array], tuple[jax.Array, jax.Array]]


def unit_normalizer(mean: Any, std: Any) -> InputFn:
  """``x ↦ (x − mean) / std`` for images in ``[0, 1]``.

  The float, differentiable counterpart of
  :func:`fedjax_dd.data.preprocess.normalize`, so gradients reach the
  generator.

  Args:
    mean: per-channel mean ``[Ch]`` on the ``[0, 1]`` scale.
    std: per-channel standard deviation ``[Ch]``.

  Returns:
    The normaliser ``[B, H, W, Ch] -> [B, H, W, Ch]``.
  """
  mean = jnp.asarray(np.asarray(mean, np.float32))
  std = jnp.asarray(np.asarray(std, np.float32))
  return lambda x: (x - mean) / std


# ----------------------------------------------------------------------------
# Teachers.


@dataclasses.dataclass(frozen=True)
class TeacherGroup:
  """The static description of the teachers sharing one architecture.

  Their variables are passed separately, stacked ``[m_g, ...]``, in the
  same order as ``client_ids``.

  Attributes:
    task: the classifier (module) of this architecture.
    input_fn: maps generated images in ``[0, 1]`` to the model's input.
    client_ids: the global client index of each stacked teacher; over all
      groups they must be a permutation of ``range(m)``.
  """
  task: Classifier
  input_fn: InputFn
  client_ids: tuple[int, ...]


def check_groups(groups: Sequence[TeacherGroup]) -> tuple[int, np.ndarray]:
  """Validates the client ids of the groups.

  Args:
    groups: the teacher groups.

  Returns:
    ``(m, order)``: the number of teachers and, for each client ``k``, its
    position ``order[k]`` in the concatenation of the groups.

  Raises:
    ValueError: if the ids are not a permutation of ``range(m)``.
  """
  ids = [i for g in groups for i in g.client_ids]
  m = len(ids)
  if m == 0 or sorted(ids) != list(range(m)):
    raise ValueError(
        f"Teacher client_ids over all groups must be a permutation of "
        f"range(m); got {ids}.")
  return m, np.argsort(np.asarray(ids))


def _safe_norm(v: jax.Array) -> jax.Array:
  # ‖v‖₂ whose gradient stays finite at v = 0 (sqrt'(0) is infinite).
  return jnp.sqrt(jnp.maximum(jnp.sum(jnp.square(v)), 1e-20))


def apply_with_bn_loss(task: Classifier, params: PyTree, batch_stats: PyTree,
                       x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """One teacher in inference mode: logits and its BatchNorm-statistics loss.

  Args:
    task: the teacher's classifier.
    params: its parameters.
    batch_stats: its BatchNorm running statistics (``{}`` if none).
    x: model inputs ``[B, H, W, Ch]``.

  Returns:
    ``(logits [B, K], Σ_l ‖μ_l(x) − μ_l‖₂ + ‖σ²_l(x) − σ²_l‖₂)``; the second is
    0 for a model without BatchNorm.
  """
  terms = []

  def capture(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    module = context.module
    if isinstance(module, nn.BatchNorm) and context.method_name == "__call__":
      feats = args[0]
      feature_axes = {a % feats.ndim for a in np.atleast_1d(module.axis)}
      axes = tuple(a for a in range(feats.ndim) if a not in feature_axes)
      running = module.variables["batch_stats"]
      mean = jnp.mean(feats, axes)
      var = jnp.mean(jnp.square(feats - jnp.mean(feats, axes, keepdims=True)),
                     axes)
      terms.append(_safe_norm(mean - running["mean"]) +
                   _safe_norm(var - running["var"]))
    return out

  with nn.intercept_methods(capture):
    logits, _ = task.apply(params, batch_stats, x, train=False)
  bn = sum(terms) if terms else jnp.zeros((), jnp.float32)
  return logits, bn


def make_teacher_fn(groups: Sequence[TeacherGroup],
                    mapper: ClientMapper = ClientMapper()) -> TeacherFn:
  """Evaluates every teacher on one batch: one mapped call per architecture.

  Args:
    groups: the teachers, one :class:`TeacherGroup` per architecture.
    mapper: how each architecture's stacked teachers are batched.

  Returns:
    ``teachers(teacher_vars, x01) -> (logits [m, B, K], bn [m])`` in client
    order (:data:`TeacherFn`; ``x01`` in ``[0, 1]``), ``bn`` from
    :func:`apply_with_bn_loss`.
  """
  groups = tuple(groups)
  _, order = check_groups(groups)
  mapped = tuple(
      mapper.map(lambda p, s, x, task=g.task: apply_with_bn_loss(task, p, s, x),
                 in_axes=(0, 0, None)) for g in groups)

  def teachers(teacher_vars: TeacherVars, x01: jax.Array):
    if len(teacher_vars) != len(groups):
      raise ValueError(f"Expected variables for {len(groups)} teacher groups, "
                       f"got {len(teacher_vars)}.")
    outs = [fn(p, s, g.input_fn(x01))
            for fn, g, (p, s) in zip(mapped, groups, teacher_vars)]
    logits = jnp.concatenate([o[0] for o in outs])[order]
    bn = jnp.concatenate([o[1] for o in outs])[order]
    return logits, bn

  return teachers


# ----------------------------------------------------------------------------
# Combine rules.


def average_ensemble(logits: jax.Array, y: jax.Array, ctx: PyTree) -> jax.Array:
  """Plain logit average ``(1/m) Σ_k P_k`` (DENSE; FedHydra's "AE").

  Args:
    logits: teacher logits ``[m, B, K]``.
    y: target labels ``[B]`` (unused).
    ctx: rule parameters (unused).

  Returns:
    Ensemble logits ``[B, K]``.
  """
  del y, ctx
  return jnp.mean(logits, axis=0)


# ----------------------------------------------------------------------------
# KD losses.


def kl_divergence(teacher_logits: jax.Array, student_logits: jax.Array,
                  temperature: float) -> jax.Array:
  """Mean over the batch of ``KL(σ(P/T) ‖ σ(S/T))``, scaled by ``T²``.

  ``T²`` (Hinton et al.) keeps gradient magnitudes independent of ``T``.

  Args:
    teacher_logits: ``P [B, K]``.
    student_logits: ``S [B, K]``.
    temperature: ``T > 0``.

  Returns:
    A scalar.
  """
  return jnp.mean(kl_per_sample(teacher_logits, student_logits, temperature))


def kl_per_sample(teacher_logits: jax.Array, student_logits: jax.Array,
                  temperature: float) -> jax.Array:
  """``[B]`` ``KL_i(σ(P/T) ‖ σ(S/T))·T²`` for logits ``P, S [B, K]``."""
  t = temperature
  p_log = jax.nn.log_softmax(teacher_logits / t)
  s_log = jax.nn.log_softmax(student_logits / t)
  return jnp.sum(jnp.exp(p_log) * (p_log - s_log), axis=-1) * t * t


def kd_objective(p: jax.Array, s_logits: jax.Array, *, beta: float,
                 temperature: float) -> tuple[jax.Array, dict[str, jax.Array]]:
  """``L_Glo = KL(σ(P/T) ‖ σ(S/T)) + β·CE(S, argmax P)`` (FedHydra Eqs. 17–19).

  Args:
    p: ensemble logits ``[B, K]`` (constants).
    s_logits: student logits ``[B, K]``.
    beta: weight ``β`` of the hard-label cross-entropy.
    temperature: KD temperature ``T``.

  Returns:
    ``(loss, metrics)`` with ``student_kl``, ``student_ce`` and
    ``student_agreement`` (fraction of samples with ``argmax S = argmax P``).
  """
  kl = kl_divergence(p, s_logits, temperature)
  hard = jnp.argmax(p, -1)
  ce = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(s_logits, hard))
  agree = jnp.mean((jnp.argmax(s_logits, -1) == hard).astype(jnp.float32))
  return kl + beta * ce, {"student_kl": kl, "student_ce": ce,
                          "student_agreement": agree}


def make_student_objective(student: Classifier, student_input: InputFn, *,
                           beta: float, temperature: float
                           ) -> Callable[..., Any]:
  """The student in training mode against given ensemble logits.

  Args:
    student: the global model.
    student_input: maps images in ``[0, 1]`` to the student's input.
    beta: see :func:`kd_objective`.
    temperature: see :func:`kd_objective`.

  Returns:
    ``objective(params, batch_stats, x01 [B, H, W, Ch], p [B, K]) -> (loss,
    (new_batch_stats, metrics))`` with the loss of :func:`kd_objective`.
  """

  def objective(params, batch_stats, x01, p):
    s_logits, new_stats = student.apply(params, batch_stats, student_input(x01),
                                        train=True)
    value, metrics = kd_objective(p, s_logits, beta=beta,
                                  temperature=temperature)
    return value, (new_stats, metrics)

  return objective


def make_student_loss(teachers: TeacherFn, combine: CombineFn,
                      student: Classifier, student_input: InputFn, *,
                      beta: float, temperature: float) -> Callable[..., Any]:
  """``L_Glo`` (:func:`kd_objective`) with the teachers evaluated on ``x̂``.

  Args:
    teachers: the teacher function of :func:`make_teacher_fn`.
    combine: the ensemble rule.
    student: the global model.
    student_input: maps images in ``[0, 1]`` to the student's input.
    beta: see :func:`kd_objective`.
    temperature: see :func:`kd_objective`.

  Returns:
    ``loss(params, batch_stats, teacher_vars, ctx, x01 [B, H, W, Ch], y [B])
    -> (loss, (new_batch_stats, metrics))``; the student runs in training
    mode and no gradient flows into the teachers or ``x01``'s producer.
  """

  objective = make_student_objective(student, student_input, beta=beta,
                                     temperature=temperature)

  def loss(params, batch_stats, teacher_vars, ctx, x01, y):
    t_logits, _ = teachers(teacher_vars, jax.lax.stop_gradient(x01))
    p = jax.lax.stop_gradient(combine(t_logits, y, ctx))
    return objective(params, batch_stats, x01, p)

  return loss


ADV_MASKS = ("disagree", "agree", "none")


def adversarial_kl(p: jax.Array, s_logits: jax.Array, temperature: float,
                   mask: str) -> jax.Array:
  """``L_AD = −mean_i w_i · KL_i(σ(P/T) ‖ σ(S/T))·T²`` with the sample mask ``w``.

  ``w_i`` is 1 for every sample (``"none"``), or where the arg-maxes of
  ``P`` and ``S`` differ (``"disagree"``) / agree (``"agree"``); the mean is
  over all ``B`` samples, as in DENSE's code.

  Args:
    p: ensemble logits ``[B, K]``.
    s_logits: student logits ``[B, K]``.
    temperature: KD temperature ``T``.
    mask: one of :data:`ADV_MASKS`.

  Returns:
    A scalar (``≤ 0``).
  """
  kl = kl_per_sample(p, s_logits, temperature)
  same = jnp.argmax(p, -1) == jnp.argmax(s_logits, -1)
  w = {"none": jnp.ones_like(kl), "agree": same.astype(kl.dtype),
       "disagree": (~same).astype(kl.dtype)}[mask]
  return -jnp.mean(w * kl)


def generator_objective(p: jax.Array, y: jax.Array, bn: jax.Array,
                        s_logits: jax.Array, *, lambda_bn: float,
                        lambda_adv: float, temperature: float, adv_mask: str
                        ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """``L_Gen = CE(P, y) + λ1·L_BN + λ2·L_AD`` (FedHydra Eqs. 13–16; DENSE).

  Args:
    p: ensemble logits ``[B, K]`` on the generated images.
    y: target labels ``[B]``.
    bn: ``[m]`` each teacher's BatchNorm-statistics loss (``L_BN``: mean).
    s_logits: student logits ``[B, K]`` (inference mode).
    lambda_bn: ``λ1``.
    lambda_adv: ``λ2``.
    temperature: KD temperature ``T`` of ``L_AD``.
    adv_mask: samples entering ``L_AD`` (:func:`adversarial_kl`).

  Returns:
    ``(loss, metrics)`` with ``gen_loss``, ``gen_ce``, ``gen_bn``,
    ``gen_adv`` and ``ensemble_accuracy`` (fraction with ``argmax P = y``).
  """
  ce = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(p, y))
  bn = jnp.mean(bn)
  adv = adversarial_kl(p, s_logits, temperature, adv_mask)
  loss = ce + lambda_bn * bn + lambda_adv * adv
  acc = jnp.mean((jnp.argmax(p, -1) == y).astype(jnp.float32))
  return loss, {"gen_loss": loss, "gen_ce": ce, "gen_bn": bn, "gen_adv": adv,
                "ensemble_accuracy": acc}


# ----------------------------------------------------------------------------
# Generators.


def generator_nz(generator: nn.Module) -> int:
  """The noise dimension ``nz`` of a generator (its ``nz`` attribute)."""
  return int(getattr(generator, "nz"))


def is_conditional(generator: nn.Module) -> bool:
  """Whether the generator takes the target labels (``conditional=True``)."""
  return bool(getattr(generator, "conditional", False))


OUTPUT_SPACES = ("unit", "normalised")


def generator_output_space(generator: nn.Module) -> str:
  """Where a generator's images live (its ``output_space`` attribute).

  ``"unit"`` (the default): images in ``[0, 1]``; ``"normalised"``: images
  already in the classifiers' input space.

  Raises:
    ValueError: for any other value.
  """
  space = getattr(generator, "output_space", "unit")
  if space not in OUTPUT_SPACES:
    raise ValueError(f"Generator output_space must be one of {OUTPUT_SPACES}, "
                     f"got {space!r}.")
  return space


def generator_input_fn(generator: nn.Module,
                       input_fn: InputFn | None) -> InputFn:
  """The function mapping this generator's images to the classifiers' input.

  Args:
    generator: the Flax generator.
    input_fn: the normaliser of images in ``[0, 1]`` (e.g.
      :func:`unit_normalizer` of the data's statistics).

  Returns:
    ``input_fn`` for a ``"unit"`` generator; the identity for a
    ``"normalised"`` one (``input_fn`` is then not applied).

  Raises:
    ValueError: if a ``"unit"`` generator gets no ``input_fn``.
  """
  if generator_output_space(generator) == "normalised":
    return lambda x: x
  if input_fn is None:
    raise ValueError("A generator with output in [0, 1] needs an input_fn "
                     "mapping its images to the classifiers' input.")
  return input_fn


def init_generator(generator: nn.Module, key: jax.Array
                   ) -> tuple[PyTree, PyTree]:
  """Freshly initialised generator variables.

  Args:
    generator: the Flax generator.
    key: PRNG key.

  Returns:
    ``(params, batch_stats)`` (``{}`` for a generator without BatchNorm),
    from one jitted program per generator, bit-identical to op by op.
  """
  return _init_generator_program()(generator, key)


def _init_generator(generator: nn.Module, key: jax.Array
                    ) -> tuple[PyTree, PyTree]:
  z = jnp.zeros((1, generator_nz(generator)), jnp.float32)
  extra = (jnp.zeros((1,), jnp.int32),) if is_conditional(generator) else ()
  variables = generator.init(key, z, *extra, train=False)
  return variables["params"], variables.get("batch_stats", {})


@functools.cache
def _init_generator_program() -> Callable[..., tuple[PyTree, PyTree]]:
  """Built on first use: the policy reads the platform, which importing must
  not start."""
  return once_jit(_init_generator, op_by_op=True, static_argnums=0)


def apply_generator(generator: nn.Module, params: PyTree, batch_stats: PyTree,
                    z: jax.Array, y: jax.Array, train: bool
                    ) -> tuple[jax.Array, PyTree]:
  """``x̂ = G(z[, y])``.

  Args:
    generator: the Flax generator.
    params: its parameters.
    batch_stats: its BatchNorm statistics.
    z: noise ``[B, nz]``.
    y: target labels ``[B]``; only a conditional generator receives them.
    train: BatchNorm on batch statistics, updating the running ones.

  Returns:
    ``(images [B, H, W, Ch], batch_stats)``: images in ``[0, 1]`` or the
    classifiers' input space (:func:`generator_output_space`).
  """
  variables = {"params": params, "batch_stats": batch_stats}
  args = (z, y) if is_conditional(generator) else (z,)
  if train:
    x, upd = generator.apply(variables, *args, train=True,
                             mutable=["batch_stats"])
    return x, upd["batch_stats"]
  return generator.apply(variables, *args, train=False), batch_stats
