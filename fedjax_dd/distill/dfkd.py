"""Data-free knowledge distillation (DFKD) from an ensemble of client models.

The server holds ``m`` uploaded client models (teachers) and no data. A
generator ``G`` learns to synthesise images ``x̂ = G(z)`` on which the teacher
ensemble is confident and whose intermediate statistics match the teachers'
BatchNorm running statistics; the global model (student) ``F_g`` is then
distilled from the ensemble on ``x̂``. The two steps alternate for ``T_g``
epochs (FedHydra's HASA, Alg. 1; DENSE's training loop).

Everything here is parameterised by a **combine function**

    ``combine(logits [m, B, K], y [B], ctx) -> [B, K]``

which turns the stacked teacher logits on a batch with target labels ``y``
into the ensemble logits ``P``. ``ctx`` is a pytree of traced parameters of
the rule (FedHydra's ``(U_r, U_c)``, DisUE's per-class cluster weights, or
``()``), so changing it never recompiles. This module ships the plain logit
average (:func:`average_ensemble`, DENSE / FedHydra's "AE"); FedHydra's
stratified aggregation lives in :mod:`fedjax_dd.algorithms.stratify`.

Losses (FedHydra Eqs. 13–19, DENSE Eqs. 4–8):

* generator: ``L_Gen = CE(P, y) + λ1·L_BN + λ2·L_AD`` with
  ``L_AD = −KL(σ(P/T) ‖ σ(F_g(x̂)/T))``, which pushes the generator to samples
  where student and ensemble disagree;
* student: ``L_Glo = KL(σ(P/T) ‖ σ(F_g(x̂)/T)) + β·CE(F_g(x̂), argmax P)``.

``L_BN`` (FedHydra Eq. 14) is read in the DeepInversion / DENSE form: for
teacher ``k`` and each of its BatchNorm layers ``l`` with running statistics
``(μ_kl, σ²_kl)``, let ``μ_l(x̂), σ²_l(x̂)`` be the per-channel batch mean and
(biased) variance of the features *entering* that layer when the teacher runs
in inference mode on ``x̂``; then

    ``L_BN = (1/m) Σ_k Σ_l ‖μ_l(x̂) − μ_kl‖₂ + ‖σ²_l(x̂) − σ²_kl‖₂``.

The paper writes the sum over layers for one model; we average it over the
teachers so that ``λ1`` does not scale with ``m``. The BatchNorm inputs are
captured with ``flax.linen.intercept_methods``, so any Flax model with
``nn.BatchNorm`` layers works unchanged; models without BatchNorm contribute 0.

Synthesis protocol. The papers' text leaves it open; the authors' released
code (DENSE's ``AdvSynthesizer``, which FedHydra's code extends) fixes it, and
the defaults of :class:`DFKDHyperParams` follow that code:

* every epoch starts from a **freshly initialised generator** and fresh
  noise ``z``, and Adam optimises the generator **and** ``z`` for ``T_G``
  steps (so one batch of ``B`` images of random classes ``y`` can be reached
  in ``T_G`` steps; a persistent generator fed fresh noise cannot learn a new
  noise-to-label assignment each epoch, and with these settings the student
  stayed at chance);
* the batch with the **lowest generator loss** over those steps is kept;
* ``L_AD`` is masked to the samples on which student and ensemble disagree;
* every kept batch joins a **data pool** and the student makes one pass over
  the whole pool per epoch (shuffled across batches).

The ensemble logits ``P`` of a pooled image never change (the teachers are
frozen), so they are stored with the image instead of recomputing ``m``
teacher passes per student step; the result is the same.

Teachers of one architecture are stacked on a client axis and evaluated with
ONE mapped call (:class:`fedjax_dd.core.clients.ClientMapper`); teachers of
several architectures form one group per architecture (:class:`TeacherGroup`).

References:
  Bai et al., "A Unified Solution to Diverse Heterogeneities in One-Shot
  Federated Learning" (FedHydra), Alg. 1 and Eqs. 12–19.
  Zhang et al., "DENSE: Data-Free One-Shot Federated Learning", NeurIPS 2022.
  Yin et al., "Dreaming to Distill: Data-free Knowledge Transfer via
  DeepInversion", CVPR 2020.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.task import Classifier

PyTree = Any
# (teacher logits [m, B, K], target labels [B], ctx) -> ensemble logits [B, K].
CombineFn = Callable[[jax.Array, jax.Array, PyTree], jax.Array]
# Images in (0, 1) [B, H, W, Ch] -> the model's float input.
InputFn = Callable[[jax.Array], jax.Array]
# One group's stacked variables: (params [m_g, ...], batch_stats [m_g, ...]).
TeacherVars = tuple[tuple[PyTree, PyTree], ...]

tree_map = jax.tree_util.tree_map


def unit_normalizer(mean: Any, std: Any) -> InputFn:
  """``x ↦ (x − mean) / std`` for images in ``[0, 1]``.

  The differentiable counterpart of :func:`fedjax_dd.data.preprocess.normalize`
  (which takes uint8): generated images are float, and gradients must flow
  through the normalisation into the generator.

  Args:
    mean: per-channel mean ``[Ch]`` on the ``[0, 1]`` scale.
    std: per-channel standard deviation ``[Ch]``.
  """
  mean = jnp.asarray(np.asarray(mean, np.float32))
  std = jnp.asarray(np.asarray(std, np.float32))
  return lambda x: (x - mean) / std


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


def _check_groups(groups: Sequence[TeacherGroup]) -> tuple[int, np.ndarray]:
  ids = [i for g in groups for i in g.client_ids]
  m = len(ids)
  if m == 0 or sorted(ids) != list(range(m)):
    raise ValueError(
        f"Teacher client_ids over all groups must be a permutation of "
        f"range(m); got {ids}.")
  # Position of client k in the concatenation of the groups.
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
                    mapper: ClientMapper = ClientMapper()
                    ) -> Callable[[TeacherVars, jax.Array], tuple[jax.Array, jax.Array]]:
  """Evaluates every teacher on one batch: one mapped call per architecture.

  Returns:
    ``teachers(teacher_vars, x01) -> (logits [m, B, K], bn [m])`` in client
    order, where ``teacher_vars[g] = (params, batch_stats)`` stacked
    ``[m_g, ...]`` for group ``g`` and ``x01`` are images ``[B, H, W, Ch]`` in
    ``[0, 1]``.
  """
  groups = tuple(groups)
  _, order = _check_groups(groups)
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


def average_ensemble(logits: jax.Array, y: jax.Array, ctx: PyTree) -> jax.Array:
  """Plain logit average ``(1/m) Σ_k P_k`` (DENSE; FedHydra's "AE")."""
  del y, ctx
  return jnp.mean(logits, axis=0)


def kl_divergence(teacher_logits: jax.Array, student_logits: jax.Array,
                  temperature: float) -> jax.Array:
  """Mean over the batch of ``KL(σ(P/T) ‖ σ(S/T))``, scaled by ``T²``.

  The ``T²`` factor (Hinton et al.) keeps gradient magnitudes independent of
  the temperature; with ``T = 1`` it is the plain KL.
  """
  return jnp.mean(_kl_per_sample(teacher_logits, student_logits, temperature))


def _kl_per_sample(teacher_logits: jax.Array, student_logits: jax.Array,
                   temperature: float) -> jax.Array:
  """``[B]`` ``KL_i(σ(P/T) ‖ σ(S/T))·T²``."""
  t = temperature
  p_log = jax.nn.log_softmax(teacher_logits / t)
  s_log = jax.nn.log_softmax(student_logits / t)
  return jnp.sum(jnp.exp(p_log) * (p_log - s_log), axis=-1) * t * t


@flax.struct.dataclass
class DFKDState:
  """Everything the distillation loop needs to resume, checkpointed as one unit.

  Attributes:
    gen_params: generator parameters.
    gen_stats: generator BatchNorm statistics.
    gen_opt_state: generator optimizer (Adam) state.
    params: student (global model) parameters.
    batch_stats: student BatchNorm statistics.
    opt_state: student optimizer state.
    pool_x: ``[S, B, H, W, Ch]`` the last ``S`` synthetic batches in
      ``[0, 1]`` (a ring buffer; slot ``e % S`` holds epoch ``e``'s batch).
    pool_y: ``[S, B]`` their target labels.
    pool_p: ``[S, B, K]`` the ensemble logits ``P`` of the pooled images.
    key: root PRNG key; epoch ``e`` uses ``fold_in(key, e)``.
    epoch: completed distillation epochs.
  """
  gen_params: PyTree
  gen_stats: PyTree
  gen_opt_state: PyTree
  params: PyTree
  batch_stats: PyTree
  opt_state: PyTree
  pool_x: jax.Array
  pool_y: jax.Array
  pool_p: jax.Array
  key: jax.Array
  epoch: jax.Array


ADV_MASKS = ("disagree", "agree", "none")


@dataclasses.dataclass(frozen=True)
class DFKDHyperParams:
  """Hyper-parameters of :func:`make_dfkd` (paper defaults in brackets).

  Attributes:
    batch_size: synthetic images per generator/student step.
    generator_steps: ``T_G`` generator steps per epoch [30].
    student_steps: student steps per epoch. ``0`` (default) is one pass over
      the filled part of the pool, shuffled across batches (the reference
      code's ``kd_train`` over its data pool; the pass grows by one batch per
      epoch until the pool is full). ``n > 0`` makes exactly ``n`` steps over
      that shuffled order, wrapping around.
    pool_size: ``S``, synthetic batches kept for the student; a ring buffer
      (slot ``e % S`` holds epoch ``e``'s batch). ``S = T_g`` keeps every
      batch, as the reference's unbounded pool does.
    lambda_bn: ``λ1`` [1].
    lambda_adv: ``λ2`` [1; DENSE uses 0.5].
    beta: ``β`` of the student's hard-label CE [1].
    temperature: KD temperature ``T`` of both KL terms [1].
    reset_generator: re-initialise the generator at the start of every epoch
      (reference code) instead of carrying it over.
    learn_noise: optimise the noise ``z`` together with the generator
      (reference code) instead of keeping it fixed during the epoch.
    keep_best: pool the batch of lowest generator loss over the ``T_G``
      steps (reference code) instead of the batch after the last step.
    adv_mask: samples that enter ``L_AD``: ``"disagree"`` (student and
      ensemble predict different classes; FedHydra's and DENSE's released
      code), ``"agree"``, or ``"none"`` (all).
  """
  batch_size: int = 128
  generator_steps: int = 30
  student_steps: int = 0
  pool_size: int = 1
  lambda_bn: float = 1.0
  lambda_adv: float = 1.0
  beta: float = 1.0
  temperature: float = 1.0
  reset_generator: bool = True
  learn_noise: bool = True
  keep_best: bool = True
  adv_mask: str = "disagree"

  def __post_init__(self):
    for name in ("batch_size", "generator_steps", "pool_size"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
    if self.student_steps < 0:
      raise ValueError(
          f"student_steps must be >= 0 (0 = one pass over the pool), got "
          f"{self.student_steps}.")
    if self.temperature <= 0:
      raise ValueError(f"temperature must be > 0, got {self.temperature}.")
    if self.adv_mask not in ADV_MASKS:
      raise ValueError(f"adv_mask must be one of {ADV_MASKS}, got "
                       f"{self.adv_mask!r}.")


class DataFreeKD(NamedTuple):
  """The distillation loop as pure functions.

  Attributes:
    init: ``(key, params, batch_stats) -> DFKDState``: a fresh generator and
      the given student.
    epoch: ``(state, teacher_vars, ctx) -> (state, metrics)``: one epoch of
      Algorithm 1 (``T_G`` generator steps on one ``(z, y)`` batch, then the
      student steps): a host loop over a few jitted programs (noise draw,
      one generator step, pool insert, one student step), each compiled
      once.
    generate: ``(state, z [B, nz], y [B]) -> images [B, H, W, Ch]`` in
      ``[0, 1]`` from the last epoch's generator, e.g. for sample grids (the
      pool holds the images the student actually saw).
    student_loss: ``(params, batch_stats, teacher_vars, ctx, x01, y) -> (loss,
      (new_stats, metrics))``; shared with FedDF.
    teachers: the teacher function of :func:`make_teacher_fn`.
  """
  init: Callable[..., DFKDState]
  epoch: Callable[..., tuple[DFKDState, dict[str, jax.Array]]]
  generate: Callable[..., jax.Array]
  student_loss: Callable[..., Any]
  teachers: Callable[..., tuple[jax.Array, jax.Array]]


def kd_objective(p: jax.Array, s_logits: jax.Array, *, beta: float,
                 temperature: float) -> tuple[jax.Array, dict[str, jax.Array]]:
  """``KL(σ(P/T) ‖ σ(S/T)) + β·CE(S, argmax P)`` and its parts (Eqs. 17–19).

  Args:
    p: ensemble logits ``[B, K]`` (constants).
    s_logits: student logits ``[B, K]``.
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

  Returns:
    ``objective(params, batch_stats, x01 [B, ...], p [B, K]) -> (loss,
    (new_batch_stats, metrics))`` with the loss of :func:`kd_objective`.
  """

  def objective(params, batch_stats, x01, p):
    s_logits, new_stats = student.apply(params, batch_stats, student_input(x01),
                                        train=True)
    value, metrics = kd_objective(p, s_logits, beta=beta,
                                  temperature=temperature)
    return value, (new_stats, metrics)

  return objective


def make_student_loss(teachers: Callable[..., tuple[jax.Array, jax.Array]],
                      combine: CombineFn, student: Classifier,
                      student_input: InputFn, *, beta: float,
                      temperature: float) -> Callable[..., Any]:
  """``L_Glo`` (:func:`kd_objective`) with the teachers evaluated on ``x̂``.

  Returns:
    ``loss(params, batch_stats, teacher_vars, ctx, x01 [B, ...], y [B]) ->
    (loss, (new_batch_stats, metrics))``; the student runs in training mode.
  """

  objective = make_student_objective(student, student_input, beta=beta,
                                     temperature=temperature)

  def loss(params, batch_stats, teacher_vars, ctx, x01, y):
    t_logits, _ = teachers(teacher_vars, jax.lax.stop_gradient(x01))
    p = jax.lax.stop_gradient(combine(t_logits, y, ctx))
    return objective(params, batch_stats, x01, p)

  return loss


def adversarial_kl(p: jax.Array, s_logits: jax.Array, temperature: float,
                   mask: str) -> jax.Array:
  """``L_AD = −mean_i w_i · KL_i(σ(P/T) ‖ σ(S/T))·T²`` with the sample mask ``w``.

  ``w_i`` is 1 for every sample (``"none"``), where the arg-maxes of ``P``
  and ``S`` differ (``"disagree"``) or agree (``"agree"``); the mean is over
  all ``B`` samples, as in the reference code.
  """
  kl = _kl_per_sample(p, s_logits, temperature)
  same = jnp.argmax(p, -1) == jnp.argmax(s_logits, -1)
  w = {"none": jnp.ones_like(kl), "agree": same.astype(kl.dtype),
       "disagree": (~same).astype(kl.dtype)}[mask]
  return -jnp.mean(w * kl)


def make_dfkd(groups: Sequence[TeacherGroup],
              generator: nn.Module,
              student: Classifier,
              student_input: InputFn,
              combine: CombineFn,
              hparams: DFKDHyperParams = DFKDHyperParams(),
              *,
              generator_optimizer: optax.GradientTransformation = optax.adam(1e-3, b1=0.5),
              student_optimizer: optax.GradientTransformation = optax.sgd(0.01),
              mapper: ClientMapper = ClientMapper()) -> DataFreeKD:
  """Builds the generator/student alternation of FedHydra's HASA and DENSE.

  Args:
    groups: the teachers, one :class:`TeacherGroup` per architecture.
    generator: a Flax generator called as ``generator.apply(vars, z, [y],
      train=)`` returning images in ``[0, 1]``, e.g.
      :class:`fedjax_dd.models.Generator`. A label-conditional generator
      (attribute ``conditional=True``) receives the target labels.
    student: the global model.
    student_input: maps generated images in ``[0, 1]`` to the student's input.
    combine: the ensemble rule ``(logits [m, B, K], y [B], ctx) -> [B, K]``.
    hparams: loss weights, step counts and the synthesis protocol.
    generator_optimizer: optimises the generator and, with
      ``hparams.learn_noise``, the noise [Adam, lr 1e-3, β1 = 0.5 as in the
      reference code]. Re-initialised every epoch with
      ``hparams.reset_generator``.
    student_optimizer: [SGD, lr 0.01].
    mapper: how each architecture's stacked teachers are batched.

  Returns:
    A :class:`DataFreeKD`.
  """
  hp = hparams
  num_classes = student.num_classes
  nz = int(getattr(generator, "nz"))
  conditional = bool(getattr(generator, "conditional", False))
  teachers = make_teacher_fn(groups, mapper)
  student_loss = make_student_loss(teachers, combine, student, student_input,
                                   beta=hp.beta, temperature=hp.temperature)

  def gen_apply(gen_params, gen_stats, z, y, train):
    variables = {"params": gen_params, "batch_stats": gen_stats}
    args = (z, y) if conditional else (z,)
    if train:
      x, upd = generator.apply(variables, *args, train=True,
                               mutable=["batch_stats"])
      return x, upd["batch_stats"]
    return generator.apply(variables, *args, train=False), gen_stats

  def gen_loss(opt_vars, gen_stats, params, batch_stats, teacher_vars, ctx, y):
    gen_params, z = opt_vars
    x01, new_stats = gen_apply(gen_params, gen_stats, z, y, True)
    t_logits, bn = teachers(teacher_vars, x01)
    p = combine(t_logits, y, ctx)
    ce = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(p, y))
    bn = jnp.mean(bn)
    s_logits, _ = student.apply(params, batch_stats, student_input(x01),
                                train=False)
    adv = adversarial_kl(p, s_logits, hp.temperature, hp.adv_mask)
    loss = ce + hp.lambda_bn * bn + hp.lambda_adv * adv
    acc = jnp.mean((jnp.argmax(p, -1) == y).astype(jnp.float32))
    return loss, (new_stats, x01, {"gen_loss": loss, "gen_ce": ce,
                                   "gen_bn": bn, "gen_adv": adv,
                                   "ensemble_accuracy": acc})

  gen_grad = jax.value_and_grad(gen_loss, has_aux=True)

  student_grad = jax.value_and_grad(
      make_student_objective(student, student_input, beta=hp.beta,
                             temperature=hp.temperature), has_aux=True)

  def fresh_generator(key):
    z = jnp.zeros((1, nz), jnp.float32)
    extra = (jnp.zeros((1,), jnp.int32),) if conditional else ()
    variables = generator.init(key, z, *extra, train=False)
    return variables["params"], variables.get("batch_stats", {})

  def init(key, params, batch_stats) -> DFKDState:
    init_key, run_key = jax.random.split(key)
    gp, gs = fresh_generator(init_key)
    z = jnp.zeros((1, nz), jnp.float32)
    image = jax.eval_shape(
        lambda: gen_apply(gp, gs, z, jnp.zeros((1,), jnp.int32), False)[0])
    pool_x = jnp.zeros((hp.pool_size, hp.batch_size, *image.shape[1:]),
                       jnp.float32)
    pool_y = jnp.zeros((hp.pool_size, hp.batch_size), jnp.int32)
    pool_p = jnp.zeros((hp.pool_size, hp.batch_size, num_classes), jnp.float32)
    return DFKDState(gen_params=gp, gen_stats=gs,
                     gen_opt_state=generator_optimizer.init(
                         (gp, jnp.zeros((hp.batch_size, nz), jnp.float32))),
                     params=params, batch_stats=batch_stats,
                     opt_state=student_optimizer.init(params), pool_x=pool_x,
                     pool_y=pool_y, pool_p=pool_p, key=run_key,
                     epoch=jnp.zeros((), jnp.int32))

  @jax.jit
  def draw(key, epoch_index):
    gen_key, order_key, init_key = jax.random.split(
        jax.random.fold_in(key, epoch_index), 3)
    kz, ky = jax.random.split(gen_key)
    z = jax.random.normal(kz, (hp.batch_size, nz), jnp.float32)
    y = jax.random.randint(ky, (hp.batch_size,), 0, num_classes)
    # A random order of the pool's filled entries (this epoch's slot
    # included): unfilled entries sort last.
    filled = jnp.minimum(epoch_index + 1, hp.pool_size)
    slot_of = jnp.arange(hp.pool_size * hp.batch_size) // hp.batch_size
    u = jax.random.uniform(order_key, slot_of.shape)
    order = jnp.argsort(jnp.where(slot_of < filled, u, 2.0))
    gp, gs = fresh_generator(init_key)
    return z, y, order, filled, gp, gs

  def epoch(state: DFKDState, teacher_vars: TeacherVars, ctx: PyTree):
    # The noise, the pool order and a fresh generator are drawn by a separate
    # program: XLA:CPU's oneDNN rewriter tries to constant-fold dot operands
    # and aborts on values computed from PRNG bits inside the same program
    # (jax 0.5.3).
    z, y, order, filled, gp, gs = draw(state.key, state.epoch)
    carry = gen_begin(state, z, gp, gs)
    # A host loop over one jitted step: XLA:CPU (jax 0.5.3) ran this step
    # about 14x slower inside a rolled while loop (lax.scan) than as one
    # program (MNIST, 5 CNN2 teachers, batch 64: 6.0 vs 0.42 s per step), and
    # unrolling T_G = 30 steps took minutes to compile.
    for _ in range(hp.generator_steps):
      carry, gen_metrics = gen_step(carry, state.params, state.batch_stats,
                                    teacher_vars, ctx, y)
    return epoch_end(state, teacher_vars, ctx, carry, gen_metrics, y, order,
                     filled)

  @jax.jit
  def gen_begin(state, z, fresh_gp, fresh_gs):
    if hp.reset_generator:
      gp0, gs0 = fresh_gp, fresh_gs
      go0 = generator_optimizer.init((gp0, z))
    else:
      gp0, gs0 = state.gen_params, state.gen_stats
      # The noise is new every epoch; so is its optimizer state.
      go0 = (generator_optimizer.init((gp0, z)) if hp.learn_noise
             else state.gen_opt_state)
    return ((gp0, z), gs0, go0, jnp.array(jnp.inf, jnp.float32),
            jnp.zeros(state.pool_x.shape[1:], jnp.float32))

  @jax.jit
  def gen_step(carry, params, batch_stats, teacher_vars, ctx, y):
    (gp, z_cur), gs, go, best_loss, best_x = carry
    (loss, (gs_new, x01, m)), (g_gen, g_z) = gen_grad(
        (gp, z_cur), gs, params, batch_stats, teacher_vars, ctx, y)
    if not hp.learn_noise:
      g_z = jnp.zeros_like(g_z)
    updates, go = generator_optimizer.update((g_gen, g_z), go, (gp, z_cur))
    new_vars = optax.apply_updates((gp, z_cur), updates)
    better = loss < best_loss
    best_x = jnp.where(better, jax.lax.stop_gradient(x01), best_x)
    return (new_vars, gs_new, go, jnp.minimum(loss, best_loss), best_x), m

  @jax.jit
  def pool_insert(state, teacher_vars, ctx, carry, y):
    (gp, z_end), gs, _, _, best_x = carry
    if hp.keep_best:
      x_new = best_x
    else:
      x_new, _ = gen_apply(gp, gs, z_end, y, True)
      x_new = jax.lax.stop_gradient(x_new)
    t_logits, _ = teachers(teacher_vars, x_new)
    p_new = jax.lax.stop_gradient(combine(t_logits, y, ctx))
    slot = state.epoch % hp.pool_size
    return (state.pool_x.at[slot].set(x_new), state.pool_y.at[slot].set(y),
            state.pool_p.at[slot].set(p_new))

  @jax.jit
  def student_step(params, batch_stats, opt_state, pool_x, pool_p, order,
                   start):
    x_shape = pool_x.shape[2:]
    idx = jax.lax.dynamic_slice_in_dim(order, start, hp.batch_size)
    flat_x = pool_x.reshape((-1, *x_shape))
    flat_p = pool_p.reshape((-1, num_classes))
    (_, (new_stats, m)), g = student_grad(params, batch_stats, flat_x[idx],
                                          flat_p[idx])
    updates, opt_state = student_optimizer.update(g, opt_state, params)
    return optax.apply_updates(params, updates), new_stats, opt_state, m

  def epoch_end(state, teacher_vars, ctx, carry, gen_metrics, y, order,
                filled):
    pool_x, pool_y, pool_p = pool_insert(state, teacher_vars, ctx, carry, y)
    filled = int(filled)
    num_steps = filled if hp.student_steps == 0 else hp.student_steps
    # A host loop over one jitted step, for the reason given in ``epoch``
    # (the student's rolled loop cost ~14x on XLA:CPU as well).
    p, s, o = state.params, state.batch_stats, state.opt_state
    step_metrics = []
    for i in range(num_steps):
      start = (i % filled) * hp.batch_size
      p, s, o, m = student_step(p, s, o, pool_x, pool_p, order, start)
      step_metrics.append(m)
    metrics = dict(gen_metrics)
    metrics.update({k: jnp.mean(jnp.stack([m[k] for m in step_metrics]))
                    for k in step_metrics[0]})
    metrics["student_steps"] = jnp.asarray(num_steps, jnp.float32)
    (gp, _), gs, go, _, _ = carry
    new_state = DFKDState(gen_params=gp, gen_stats=gs, gen_opt_state=go,
                          params=p, batch_stats=s, opt_state=o, pool_x=pool_x,
                          pool_y=pool_y, pool_p=pool_p, key=state.key,
                          epoch=state.epoch + 1)
    return new_state, metrics

  @jax.jit
  def generate(state: DFKDState, z: jax.Array, y: jax.Array) -> jax.Array:
    return gen_apply(state.gen_params, state.gen_stats, z, y, True)[0]

  return DataFreeKD(init=init, epoch=epoch, generate=generate,
                    student_loss=student_loss, teachers=teachers)


def stack_teachers(params: PyTree, batch_stats: PyTree,
                   groups: Sequence[TeacherGroup]) -> TeacherVars:
  """Splits client models stacked ``[m, ...]`` (one architecture) into groups.

  Only for the homogeneous case where every client shares one pytree
  structure; heterogeneous clients are stacked per group by the caller.
  """
  out = []
  for g in groups:
    idx = jnp.asarray(g.client_ids)
    out.append((tree_map(lambda a: a[idx], params),
                tree_map(lambda a: a[idx], batch_stats)))
  return tuple(out)
