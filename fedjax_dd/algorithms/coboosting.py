"""Co-Boosting: hard synthetic samples and a re-weighted ensemble, co-boosted.

DENSE's one-shot server (a generator against the client ensemble, the
ensemble distilled into the global model on a pool of synthetic batches),
with the data and the ensemble improving each other every epoch ``e``:

1. **Hard-sample synthesis**: a fresh generator and its noise are optimised
   for ``T_G`` Adam steps on ``L_G = L_H + β·L_A (+ λ_BN·L_BN)`` with the
   weighted ensemble ``A_w(x̂) = Σ_k w_k f_k(x̂) / Σ_k w_k``:
   ``L_H = mean_i (1 − p_{y_i}(x̂_i))^γ · CE(A_w(x̂_i), y_i)`` (``p`` held
   constant: hard samples weigh more) and ``L_A = −KL(σ(A_w/τ_A) ‖
   σ(S/τ_A))`` (the student ``S`` in inference mode). The batch of lowest
   ``L_G`` joins the pool.
2. **Ensemble re-weighting**: from the second epoch on, before the new batch
   joins, one signed-gradient pass over the pool,
   ``w ← clip(w − μ·δ^e·sign(∇_w CE(A_w(x̂), y)), 0, 1)``.
3. **Hard-sample enhancement**: every pool batch the student sees is first
   pushed by ``x̂' = x̂ + ε·sign(∇_x Σ r ⊙ σ(A_w(x̂)/4))`` with
   ``r ~ U(−1, 1)^K`` (output-diversified sampling).
4. **Distillation**: the student minimises
   ``KL(σ(A_w(x̂')/τ) ‖ σ(S(x̂')/τ))·τ²`` over the pool, the learning rate
   cosine-annealed over the epochs.

Defaults follow the authors' code (``rong-dai/Co-Boosting`` at b95d715;
:class:`CoBoostingHyperParams`): the generator is re-initialised every epoch
with learned noise and the ensemble weights start at ``1/m``.

Departures from that code: the ε step is taken on images in ``[0, 1]``
(the code adds ε to normalised tensors); the fresh generator has Flax's
default initialisers, as in :mod:`fedjax_dd.distill.dfkd`; the
re-weighting's clamp to ``w_start ± 1`` is dropped (it never binds for
``w`` in ``[0, 1]``); the pool is a ring buffer of ``S`` batches (``S = T_g``
keeps every batch, as the code does); and a pooled batch stores the frozen
teachers' logits, so re-weighting needs no teacher forward passes.

One epoch is a host loop over jitted programs, each compiled once, following
:mod:`fedjax_dd.distill.dfkd`'s generator protocol. The random inputs are
drawn from ``fold_in(key, e)`` by a separate program, so a resumed epoch
draws what an uninterrupted one does.

The formulas are written from the authors' code, which they match term by
term, with the paper's step names; no equation numbers are cited.

Reference: Dai et al., "Enhancing One-Shot Federated Learning Through Data
and Ensemble Co-Boosting", ICLR 2024; compared against in FedHydra (Bai et
al.), Tabs. 1-4.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fedjax_dd.core.algorithm import ServerDistillation, Teachers, no_setup
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill import ensemble
from fedjax_dd.distill import gen_student

PyTree = Any


@flax.struct.dataclass
class CoBoostingState:
  """Everything Co-Boosting's server loop resumes from.

  Attributes:
    params: student (global model) parameters.
    batch_stats: its BatchNorm statistics.
    opt_state: student optimizer state.
    weights: ``[m]`` ensemble weights ``w`` (client order).
    pool_x: ``[S, B, H, W, Ch]`` synthetic batches in ``[0, 1]`` (slot
      ``e % S`` holds epoch ``e``'s).
    pool_y: ``[S, B]`` their generator labels.
    pool_t: ``[S, B, m, K]`` the teachers' logits on them.
    key: root key; epoch ``e`` draws from ``fold_in(key, e)``.
    epoch: completed epochs.
  """
  params: PyTree
  batch_stats: PyTree
  opt_state: PyTree
  weights: jax.Array
  pool_x: jax.Array
  pool_y: jax.Array
  pool_t: jax.Array
  key: jax.Array
  epoch: jax.Array


@dataclasses.dataclass(frozen=True)
class CoBoostingHyperParams:
  """Hyper-parameters (the authors' code's defaults in brackets).

  Attributes:
    batch_size: synthetic images per generator / student step [128].
    generator_steps: ``T_G`` per epoch [30, ``co_boosting.sh``].
    student_steps: student steps per epoch; 0 is one pass over the pool
      (the code), ``n > 0`` exactly ``n`` steps over its shuffled order.
    pool_size: ``S`` batches kept (ring buffer).
    num_epochs: ``T_g``, the length of the cosine schedule [200]; 0 keeps
      the learning rate constant.
    hardness: ``γ`` of ``L_H`` [1].
    lambda_hard: weight of ``L_H`` [1].
    lambda_adv: ``β``, weight of ``L_A`` [1].
    lambda_bn: weight of the BatchNorm-statistics term [0].
    adv_temperature: ``τ_A`` of ``L_A`` [3].
    temperature: the student's KD temperature ``τ`` [4].
    perturb_temperature: softmax temperature of the enhancement [4].
    epsilon: the enhancement step ``ε`` on ``[0, 1]`` images [8/255].
    weight_lr: ``μ`` of the re-weighting [0.01].
    weight_decay: ``δ``, ``μ``'s decay per epoch [0.99].
    weight_passes: re-weighting passes over the pool per epoch [1].
    generator_clip: the generator's gradient-norm clip [10].
  """
  batch_size: int = 128
  generator_steps: int = 30
  student_steps: int = 0
  pool_size: int = 1
  num_epochs: int = 0
  hardness: float = 1.0
  lambda_hard: float = 1.0
  lambda_adv: float = 1.0
  lambda_bn: float = 0.0
  adv_temperature: float = 3.0
  temperature: float = 4.0
  perturb_temperature: float = 4.0
  epsilon: float = 8.0 / 255.0
  weight_lr: float = 0.01
  weight_decay: float = 0.99
  weight_passes: int = 1
  generator_clip: float = 10.0

  def __post_init__(self):
    for name in ("batch_size", "generator_steps", "pool_size"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
    for name in ("student_steps", "num_epochs", "weight_passes"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")
    for name in ("adv_temperature", "temperature", "perturb_temperature"):
      if getattr(self, name) <= 0:
        raise ValueError(f"{name} must be > 0, got {getattr(self, name)}.")



def weighted_ensemble(logits: jax.Array, y: jax.Array, w: jax.Array
                      ) -> jax.Array:
  """``A_w = Σ_k w_k P_k / Σ_k w_k`` for logits ``[m, B, K]``, weights ``[m]``
  (a :data:`~fedjax_dd.distill.ensemble.CombineFn` with ``ctx = w``)."""
  del y
  w = w.astype(logits.dtype)
  return jnp.tensordot(w, logits, axes=1) / jnp.maximum(jnp.sum(w), 1e-12)


def hard_sample_loss(p: jax.Array, y: jax.Array, hardness: float) -> jax.Array:
  """``L_H = mean_i (1 − σ(p_i)_{y_i})^γ · CE(p_i, y_i)``, the weight held
  constant (the code's ``loss_oh``)."""
  conf = jnp.take_along_axis(jax.nn.softmax(p), y[:, None], 1)[:, 0]
  weight = jax.lax.stop_gradient((1.0 - conf) ** hardness)
  return jnp.mean(weight *
                  optax.softmax_cross_entropy_with_integer_labels(p, y))


def enhance(x01: jax.Array, logits_fn: Callable[[jax.Array], jax.Array],
            r: jax.Array, epsilon: float, temperature: float) -> jax.Array:
  """``x + ε·sign(∇_x Σ r ⊙ σ(A(x)/T))`` for ``x [B, H, W, Ch]``, ``r [B, K]``
  (the code's ``cb_kd_train``)."""
  g = jax.grad(lambda x: jnp.sum(r * jax.nn.softmax(logits_fn(x) / temperature,
                                                    -1)))(x01)
  return jax.lax.stop_gradient(x01 + epsilon * jnp.sign(g))


class _Draw(NamedTuple):
  z: jax.Array             # [B, nz]
  y: jax.Array             # [B]
  order: jax.Array         # [S·B] the student's visiting order
  weight_order: jax.Array  # [S·B] the re-weighting's (this batch excluded)
  gen_params: PyTree       # a fresh generator
  gen_stats: PyTree
  r: jax.Array             # [N_s, B, K] enhancement directions per step


class _Gen(NamedTuple):
  gen_vars: tuple[PyTree, jax.Array]  # (generator params, z)
  gen_stats: PyTree
  opt_state: PyTree
  best_loss: jax.Array
  best_x: jax.Array


def _order(key, filled, pool_size, batch_size):
  """A random order of the first ``filled`` slots' entries, the rest last."""
  slot_of = jnp.arange(pool_size * batch_size) // batch_size
  u = jax.random.uniform(key, slot_of.shape)
  return jnp.argsort(jnp.where(slot_of < filled, u, 2.0))


def coboosting(client_stage: Callable[..., Teachers],
               groups: Sequence[ensemble.TeacherGroup],
               generator: nn.Module,
               student: Classifier,
               student_input: ensemble.InputFn,
               hparams: CoBoostingHyperParams = CoBoostingHyperParams(),
               *,
               generator_optimizer: optax.GradientTransformation = optax.adam(1e-3, b1=0.5),
               student_optimizer: optax.GradientTransformation = optax.chain(
                   optax.clip_by_global_norm(10.0),
                   optax.add_decayed_weights(1e-4),
                   optax.sgd(0.01, momentum=0.9)),
               mapper: ClientMapper = ClientMapper()) -> ServerDistillation:
  """Builds Co-Boosting.

  Args:
    client_stage: the one-shot client stage
      (:func:`fedjax_dd.algorithms.one_shot.client_stage`).
    groups: the uploaded client models, one group per architecture.
    generator: the (unconditional) generator, images in ``[0, 1]``.
    student: the global model.
    student_input: maps images in ``[0, 1]`` to the student's input.
    hparams: see :class:`CoBoostingHyperParams`.
    generator_optimizer: the generator's and its noise's, fresh every epoch
      [Adam lr 1e-3, β1 = 0.5].
    student_optimizer: the student's [clip 10, weight decay 1e-4, SGD lr
      0.01 momentum 0.9], scaled by the cosine schedule.
    mapper: how each architecture's teachers are batched.

  Returns:
    A :class:`~fedjax_dd.core.algorithm.ServerDistillation` with state
    :class:`CoBoostingState`; ``report`` gives the ensemble weights and the
    last synthetic batch.
  """
  hp = hparams
  m, _ = ensemble.check_groups(groups)
  teachers_fn = ensemble.make_teacher_fn(groups, mapper)
  nz = ensemble.generator_nz(generator)
  k = student.num_classes
  b, s = hp.batch_size, hp.pool_size
  max_student = hp.student_steps or s

  def init(key, setup, teachers, params, batch_stats) -> CoBoostingState:
    del setup, teachers
    gp, gs = ensemble.init_generator(generator, key)
    shape = jax.eval_shape(lambda: ensemble.apply_generator(
        generator, gp, gs, jnp.zeros((1, nz)), jnp.zeros((1,), jnp.int32),
        False)[0]).shape[1:]
    return CoBoostingState(
        params=params, batch_stats=batch_stats,
        opt_state=student_optimizer.init(params),
        weights=jnp.full((m,), 1.0 / m, jnp.float32),
        pool_x=jnp.zeros((s, b, *shape), jnp.float32),
        pool_y=jnp.zeros((s, b), jnp.int32),
        pool_t=jnp.zeros((s, b, m, k), jnp.float32),
        key=jax.random.fold_in(key, 1), epoch=jnp.zeros((), jnp.int32))

  @jax.jit
  def draw(key, e) -> _Draw:
    kz, ky, ko, kw, kg, kr = jax.random.split(jax.random.fold_in(key, e), 6)
    gp, gs = ensemble.init_generator(generator, kg)
    return _Draw(
        z=jax.random.normal(kz, (b, nz), jnp.float32),
        y=jax.random.randint(ky, (b,), 0, k),
        order=_order(ko, jnp.minimum(e + 1, s), s, b),
        weight_order=_order(kw, jnp.minimum(e, s), s, b),
        gen_params=gp, gen_stats=gs,
        r=jax.random.uniform(kr, (max_student, b, k), jnp.float32, -1.0, 1.0))

  def gen_loss(gen_vars, gen_stats, params, batch_stats, tv, w, y):
    gp, z = gen_vars
    x01, new_stats = ensemble.apply_generator(generator, gp, gen_stats, z, y,
                                              True)
    t_logits, bn = teachers_fn(tv, x01)
    p = weighted_ensemble(t_logits, y, w)
    s_logits, _ = student.apply(params, batch_stats, student_input(x01),
                                train=False)
    hard = hard_sample_loss(p, y, hp.hardness)
    adv = ensemble.adversarial_kl(p, s_logits, hp.adv_temperature, "none")
    bn = jnp.mean(bn)
    loss = hp.lambda_hard * hard + hp.lambda_adv * adv + hp.lambda_bn * bn
    acc = jnp.mean((jnp.argmax(p, -1) == y).astype(jnp.float32))
    return loss, (new_stats, x01, {"gen_loss": loss, "gen_hard": hard,
                                   "gen_adv": adv, "gen_bn": bn,
                                   "ensemble_accuracy": acc})

  @jax.jit
  def generator_begin(z, gp, gs, pool_x) -> _Gen:
    return _Gen((gp, z), gs, generator_optimizer.init((gp, z)),
                jnp.array(jnp.inf, jnp.float32), jnp.zeros_like(pool_x[0]))

  @jax.jit
  def generator_step(c: _Gen, params, batch_stats, tv, w, y):
    (loss, (stats, x01, metrics)), (g_gen, g_z) = jax.value_and_grad(
        gen_loss, has_aux=True)(c.gen_vars, c.gen_stats, params, batch_stats,
                                tv, w, y)
    # The code clips the generator's gradients, not the noise's.
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(v))
                        for v in jax.tree_util.tree_leaves(g_gen)))
    g_gen = jax.tree_util.tree_map(
        lambda g: g * jnp.minimum(1.0, hp.generator_clip / (norm + 1e-6)),
        g_gen)
    updates, opt_state = generator_optimizer.update((g_gen, g_z), c.opt_state,
                                                    c.gen_vars)
    better = loss < c.best_loss
    return _Gen(optax.apply_updates(c.gen_vars, updates), stats, opt_state,
                jnp.minimum(loss, c.best_loss),
                jnp.where(better, jax.lax.stop_gradient(x01), c.best_x)
                ), metrics

  @jax.jit
  def weight_step(w, pool_t, pool_y, order, start, lr):
    idx = jax.lax.dynamic_slice_in_dim(order, start, b)
    logits = pool_t.reshape((-1, m, k))[idx]          # [B, m, K]
    y = pool_y.reshape(-1)[idx]

    def ce(w):
      p = weighted_ensemble(jnp.swapaxes(logits, 0, 1), y, w)
      return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(p, y))

    return jnp.clip(w - lr * jnp.sign(jax.grad(ce)(w)), 0.0, 1.0)

  @jax.jit
  def pool_insert(state: CoBoostingState, tv, x_new, y):
    t_logits, _ = teachers_fn(tv, x_new)                # [m, B, K]
    slot = state.epoch % s
    return (state.pool_x.at[slot].set(x_new), state.pool_y.at[slot].set(y),
            state.pool_t.at[slot].set(jnp.swapaxes(t_logits, 0, 1)))

  @jax.jit
  def student_step(params, batch_stats, opt_state, pool_x, tv, w, order,
                   start, r, step, lr_scale):
    idx = jax.lax.dynamic_slice_in_dim(order, start, b)
    r = r[step]
    x = pool_x.reshape((-1, *pool_x.shape[2:]))[idx]
    ens = lambda v: weighted_ensemble(teachers_fn(tv, v)[0], None, w)
    x = enhance(x, ens, r, hp.epsilon, hp.perturb_temperature)
    p = jax.lax.stop_gradient(ens(x))

    def loss(params):
      s_logits, stats = student.apply(params, batch_stats, student_input(x),
                                      train=True)
      kl = ensemble.kl_divergence(p, s_logits, hp.temperature)
      agree = jnp.mean((jnp.argmax(s_logits, -1) == jnp.argmax(p, -1)
                        ).astype(jnp.float32))
      return kl, (stats, {"student_kl": kl, "student_agreement": agree})

    (_, (stats, metrics)), g = jax.value_and_grad(loss, has_aux=True)(params)
    updates, opt_state = student_optimizer.update(g, opt_state, params)
    updates = jax.tree_util.tree_map(lambda u: u * lr_scale, updates)
    return optax.apply_updates(params, updates), stats, opt_state, metrics

  def lr_scale(e: int) -> float:
    # PyTorch's CosineAnnealingLR stepped once per epoch.
    if not hp.num_epochs:
      return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * min(e, hp.num_epochs) /
                                 hp.num_epochs))

  def epoch(state: CoBoostingState, teachers: Teachers):
    tv = teachers.vars
    e = int(state.epoch)
    d = draw(state.key, state.epoch)
    g = generator_begin(d.z, d.gen_params, d.gen_stats, state.pool_x)
    for _ in range(hp.generator_steps):
      g, gen_metrics = generator_step(g, state.params, state.batch_stats, tv,
                                      state.weights, d.y)
    w = state.weights
    if e > 0:
      lr = jnp.asarray(hp.weight_lr * hp.weight_decay ** e, jnp.float32)
      for _ in range(hp.weight_passes):
        for i in range(min(e, s)):
          w = weight_step(w, state.pool_t, state.pool_y, d.weight_order,
                          jnp.asarray(i * b, jnp.int32), lr)
    pool_x, pool_y, pool_t = pool_insert(state, tv, g.best_x, d.y)
    filled = min(e + 1, s)
    scale = jnp.asarray(lr_scale(e), jnp.float32)
    p, bs, o = state.params, state.batch_stats, state.opt_state
    step_metrics = []
    for i in range(hp.student_steps or filled):
      p, bs, o, sm = student_step(p, bs, o, pool_x, tv, w, d.order,
                                  jnp.asarray((i % filled) * b, jnp.int32),
                                  d.r, jnp.asarray(i % max_student, jnp.int32),
                                  scale)
      step_metrics.append(sm)
    metrics = dict(gen_metrics)
    metrics.update(gen_student.mean_metrics(step_metrics))
    metrics["ensemble_weight_min"] = jnp.min(w)
    metrics["ensemble_weight_max"] = jnp.max(w)
    return CoBoostingState(params=p, batch_stats=bs, opt_state=o, weights=w,
                           pool_x=pool_x, pool_y=pool_y, pool_t=pool_t,
                           key=state.key, epoch=state.epoch + 1), metrics

  def report(state: CoBoostingState, setup) -> dict[str, Any]:
    del setup
    pool_x, pool_y, w = jax.device_get((state.pool_x, state.pool_y,
                                        state.weights))
    last = (int(state.epoch) - 1) % pool_x.shape[0]
    return {"samples": (pool_x[last], pool_y[last]),
            "ensemble_weights": w.tolist()}

  return ServerDistillation(
      client_stage=client_stage, setup=no_setup, init=init, epoch=epoch,
      model=lambda state: (state.params, state.batch_stats), report=report)
