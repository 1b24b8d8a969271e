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
  t = temperature
  p_log = jax.nn.log_softmax(teacher_logits / t)
  s_log = jax.nn.log_softmax(student_logits / t)
  kl = jnp.sum(jnp.exp(p_log) * (p_log - s_log), axis=-1)
  return jnp.mean(kl) * t * t


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
  key: jax.Array
  epoch: jax.Array


@dataclasses.dataclass(frozen=True)
class DFKDHyperParams:
  """Hyper-parameters of :func:`make_dfkd` (paper defaults in brackets).

  Attributes:
    batch_size: synthetic images per generator/student step.
    generator_steps: ``T_G`` generator steps per epoch [30].
    student_steps: student steps per epoch. Algorithm 1 alternates one
      generator phase with one student phase; this is the student phase's
      length.
    pool_size: ``S``, synthetic batches kept for the student. Each epoch
      stores its batch ``(G(z), y)`` after the generator phase; every student
      step uses one stored batch drawn uniformly from those kept (DENSE's
      reference implementation keeps such a data pool). ``S = 1`` trains the
      student on the current epoch's batch only.
    lambda_bn: ``λ1`` [1].
    lambda_adv: ``λ2`` [1; DENSE uses 0.5].
    beta: ``β`` of the student's hard-label CE [1].
    temperature: KD temperature ``T`` of both KL terms [1].
  """
  batch_size: int = 128
  generator_steps: int = 30
  student_steps: int = 1
  pool_size: int = 1
  lambda_bn: float = 1.0
  lambda_adv: float = 1.0
  beta: float = 1.0
  temperature: float = 1.0

  def __post_init__(self):
    for name in ("batch_size", "generator_steps", "student_steps",
                 "pool_size"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
    if self.temperature <= 0:
      raise ValueError(f"temperature must be > 0, got {self.temperature}.")


class DataFreeKD(NamedTuple):
  """The distillation loop as pure functions.

  Attributes:
    init: ``(key, params, batch_stats) -> DFKDState``: a fresh generator and
      the given student.
    epoch: ``(state, teacher_vars, ctx) -> (state, metrics)``: one epoch of
      Algorithm 1 (``T_G`` generator steps on one ``(z, y)`` batch, then the
      student steps), jitted.
    generate: ``(state, z [B, nz], y [B]) -> images [B, H, W, Ch]`` in
      ``[0, 1]``, e.g. for sample grids.
    student_loss: ``(params, batch_stats, teacher_vars, ctx, x01, y) -> (loss,
      (new_stats, metrics))``; shared with FedDF.
    teachers: the teacher function of :func:`make_teacher_fn`.
  """
  init: Callable[..., DFKDState]
  epoch: Callable[..., tuple[DFKDState, dict[str, jax.Array]]]
  generate: Callable[..., jax.Array]
  student_loss: Callable[..., Any]
  teachers: Callable[..., tuple[jax.Array, jax.Array]]


def make_student_loss(teachers: Callable[..., tuple[jax.Array, jax.Array]],
                      combine: CombineFn, student: Classifier,
                      student_input: InputFn, *, beta: float,
                      temperature: float) -> Callable[..., Any]:
  """``L_Glo = KL(σ(P/T) ‖ σ(F_g(x̂)/T)) + β·CE(F_g(x̂), argmax P)`` (Eqs. 17–19).

  Returns:
    ``loss(params, batch_stats, teacher_vars, ctx, x01 [B, ...], y [B]) ->
    (loss, (new_batch_stats, metrics))``; the student runs in training mode.
  """

  def loss(params, batch_stats, teacher_vars, ctx, x01, y):
    t_logits, _ = teachers(teacher_vars, jax.lax.stop_gradient(x01))
    p = jax.lax.stop_gradient(combine(t_logits, y, ctx))
    s_logits, new_stats = student.apply(params, batch_stats, student_input(x01),
                                        train=True)
    kl = kl_divergence(p, s_logits, temperature)
    hard = jnp.argmax(p, -1)
    ce = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(s_logits, hard))
    agree = jnp.mean((jnp.argmax(s_logits, -1) == hard).astype(jnp.float32))
    return kl + beta * ce, (new_stats, {"student_kl": kl, "student_ce": ce,
                                        "student_agreement": agree})

  return loss


def make_dfkd(groups: Sequence[TeacherGroup],
              generator: nn.Module,
              student: Classifier,
              student_input: InputFn,
              combine: CombineFn,
              hparams: DFKDHyperParams = DFKDHyperParams(),
              *,
              generator_optimizer: optax.GradientTransformation = optax.adam(1e-3),
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
    hparams: loss weights and step counts.
    generator_optimizer: [Adam, lr 1e-3].
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

  def gen_loss(gen_params, gen_stats, params, batch_stats, teacher_vars, ctx,
               z, y):
    x01, new_stats = gen_apply(gen_params, gen_stats, z, y, True)
    t_logits, bn = teachers(teacher_vars, x01)
    p = combine(t_logits, y, ctx)
    ce = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(p, y))
    bn = jnp.mean(bn)
    s_logits, _ = student.apply(params, batch_stats, student_input(x01),
                                train=False)
    adv = -kl_divergence(p, s_logits, hp.temperature)
    loss = ce + hp.lambda_bn * bn + hp.lambda_adv * adv
    acc = jnp.mean((jnp.argmax(p, -1) == y).astype(jnp.float32))
    return loss, (new_stats, {"gen_loss": loss, "gen_ce": ce, "gen_bn": bn,
                              "gen_adv": adv, "ensemble_accuracy": acc})

  gen_grad = jax.value_and_grad(gen_loss, has_aux=True)
  student_grad = jax.value_and_grad(student_loss, has_aux=True)

  def sample_zy(key):
    kz, ky = jax.random.split(key)
    z = jax.random.normal(kz, (hp.batch_size, nz), jnp.float32)
    y = jax.random.randint(ky, (hp.batch_size,), 0, num_classes)
    return z, y

  def init(key, params, batch_stats) -> DFKDState:
    init_key, run_key = jax.random.split(key)
    z = jnp.zeros((1, nz), jnp.float32)
    extra = (jnp.zeros((1,), jnp.int32),) if conditional else ()
    variables = generator.init(init_key, z, *extra, train=False)
    gp, gs = variables["params"], variables.get("batch_stats", {})
    image = jax.eval_shape(
        lambda: gen_apply(gp, gs, z, jnp.zeros((1,), jnp.int32), False)[0])
    pool_x = jnp.zeros((hp.pool_size, hp.batch_size, *image.shape[1:]),
                       jnp.float32)
    pool_y = jnp.zeros((hp.pool_size, hp.batch_size), jnp.int32)
    return DFKDState(gen_params=gp, gen_stats=gs,
                     gen_opt_state=generator_optimizer.init(gp),
                     params=params, batch_stats=batch_stats,
                     opt_state=student_optimizer.init(params), pool_x=pool_x,
                     pool_y=pool_y, key=run_key,
                     epoch=jnp.zeros((), jnp.int32))

  @jax.jit
  def draw(key, epoch_index):
    gen_key, student_key = jax.random.split(jax.random.fold_in(key, epoch_index))
    z, y = sample_zy(gen_key)
    filled = jnp.minimum(epoch_index + 1, hp.pool_size)
    slots = jax.random.randint(student_key, (hp.student_steps,), 0, filled)
    return z, y, slots

  def epoch(state: DFKDState, teacher_vars: TeacherVars, ctx: PyTree):
    # The noise is drawn by a separate program: XLA:CPU's oneDNN rewriter
    # tries to constant-fold dot operands and aborts on values computed from
    # PRNG bits inside the same program (jax 0.5.3).
    z, y, slots = draw(state.key, state.epoch)
    return epoch_core(state, teacher_vars, ctx, z, y, slots)

  @jax.jit
  def epoch_core(state, teacher_vars, ctx, z, y, slots):

    def gen_step(carry, _):
      gp, gs, go = carry
      (_, (gs_new, m)), g = gen_grad(gp, gs, state.params, state.batch_stats,
                                     teacher_vars, ctx, z, y)
      updates, go = generator_optimizer.update(g, go, gp)
      return (optax.apply_updates(gp, updates), gs_new, go), m

    (gp, gs, go), gen_metrics = jax.lax.scan(
        gen_step, (state.gen_params, state.gen_stats, state.gen_opt_state),
        None, length=hp.generator_steps)

    x_new, _ = gen_apply(gp, gs, z, y, True)
    slot = state.epoch % hp.pool_size
    pool_x = state.pool_x.at[slot].set(jax.lax.stop_gradient(x_new))
    pool_y = state.pool_y.at[slot].set(y)

    def student_step(carry, i):
      p, s, o = carry
      (_, (s_new, m)), g = student_grad(p, s, teacher_vars, ctx, pool_x[i],
                                        pool_y[i])
      updates, o = student_optimizer.update(g, o, p)
      return (optax.apply_updates(p, updates), s_new, o), m

    (p, s, o), student_metrics = jax.lax.scan(
        student_step, (state.params, state.batch_stats, state.opt_state),
        slots)
    metrics = {k: v[-1] for k, v in gen_metrics.items()}
    metrics.update({k: jnp.mean(v) for k, v in student_metrics.items()})
    new_state = DFKDState(gen_params=gp, gen_stats=gs, gen_opt_state=go,
                          params=p, batch_stats=s, opt_state=o, pool_x=pool_x,
                          pool_y=pool_y, key=state.key, epoch=state.epoch + 1)
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
