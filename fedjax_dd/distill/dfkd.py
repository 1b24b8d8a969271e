"""DENSE / HASA data-free distillation: a fresh generator per epoch and a pool.

The server holds ``m`` uploaded client models (teachers) and no data. A
generator learns images ``x̂ = G(z)`` on which the teacher ensemble is
confident and whose BatchNorm statistics match the teachers'; the student
``F_g`` is then distilled from the ensemble on ``x̂``, alternating for
``T_g`` epochs (FedHydra's HASA, Alg. 1; DENSE's training loop). Teachers
and losses come from :mod:`fedjax_dd.distill.ensemble`.

Synthesis protocol. The papers' text leaves it open; the defaults of
:class:`DFKDHyperParams` follow the authors' code (DENSE's
``AdvSynthesizer``, which FedHydra's code extends):

* every epoch, Adam optimises a **freshly initialised generator** and
  fresh noise ``z`` for ``T_G`` steps (a persistent generator fed fresh
  noise cannot learn a new noise-to-label assignment each epoch);
* the batch with the **lowest generator loss** is kept;
* ``L_AD`` is masked to the samples on which student and ensemble disagree;
* kept batches form a **data pool**, with their (fixed) ensemble logits
  ``P``; the student makes one shuffled pass over it per epoch.

Where this loop departs from DENSE's released code (``zj-jayzhang/DENSE``,
``helpers/synthesizers.py`` and ``loop_df_fl.py``, read at commit 237c5dd):

* ``L_BN`` is the *mean* over teachers (FedHydra's Eq. 14), not DENSE's
  sum: DENSE's ``λ1 = 1`` is ``λ1 = m`` here.
* Augmentation (DENSE: random crop and mirror) is the generator's only,
  off by default (``augment_shift`` / ``augment_flip``).
* The student's loss adds FedHydra's ``β·CE`` (Eqs. 17–19) to DENSE's KL.
* The student inside ``L_AD`` runs in inference mode (DENSE: training).
* Flax's default initialisers, a float32 pool (DENSE: N(0, 0.02) weights,
  8-bit PNG files).

Two protocols (:attr:`DFKDHyperParams.protocol`, :data:`PROTOCOLS`):

* ``"dense"`` (the default, the loop above), each of DENSE's additions to
  the papers' text a field of its own;
* ``"paper"``: FedHydra's Alg. 1 as printed (:data:`PAPER_LOOP`): one
  generator initialised once (line 11) and carried with its Adam state;
  per epoch one fixed batch of noise and labels (lines 13–14) for the
  ``T_G`` generator steps (lines 16–21, Eq. 16), then ONE student step
  (lines 23–24, Eq. 19) on the generator's final images, with no pool. The
  student's optimiser is the caller's (Sec. 4.1.5: SGD, lr 0.01).

An epoch runs on :mod:`fedjax_dd.distill.gen_student`'s host loop.

References:
  Zhang et al., "DENSE: Data-Free One-Shot Federated Learning", NeurIPS 2022.
  Bai et al., "A Unified Solution to Diverse Heterogeneities in One-Shot
  Federated Learning" (FedHydra), Alg. 1 (HASA) and Eqs. 12–19.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill import ensemble, gen_student
from fedjax_dd.distill.ensemble import CombineFn, InputFn, TeacherVars

PyTree = Any

PROTOCOLS = ("dense", "paper")
"""The synthesis loops of :class:`DFKDHyperParams` (module docstring)."""

PAPER_LOOP: Mapping[str, Any] = {
    "reset_generator": False,  # Alg. 1, line 11: initialised once
    "learn_noise": False,      # lines 13-14: z drawn, not optimised
    "keep_best": False,        # line 23: the generator after its T_G steps
    "adv_mask": "none",        # Eq. 15 on every sample
    "augment_shift": 0,        # no augmentation in the text
    "augment_flip": False,
    "pool_size": 1,            # no data pool: this epoch's batch
    "student_steps": 1,        # line 24: one student step per epoch
}
"""The fields :attr:`DFKDHyperParams.protocol` ``"paper"`` fixes: FedHydra's
Alg. 1 as printed."""


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
      ``[0, 1]``; slot ``e % S`` holds epoch ``e``'s.
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


@dataclasses.dataclass(frozen=True)
class DFKDHyperParams:
  """Hyper-parameters of :func:`make_dfkd` (paper defaults in brackets).

  Attributes:
    batch_size: synthetic images per generator/student step.
    generator_steps: ``T_G`` generator steps per epoch [30].
    student_steps: student steps per epoch; ``0`` (default): one shuffled
      pass over the filled pool (the reference's ``kd_train``); ``n > 0``:
      ``n`` steps over that order, wrapping around.
    pool_size: ``S``, synthetic batches kept for the student in a ring
      buffer; ``S = T_g`` keeps every batch, as the reference does.
    lambda_bn: ``λ1`` [1].
    lambda_adv: ``λ2`` [1; DENSE uses 0.5].
    beta: ``β`` of the student's hard-label CE [1].
    temperature: KD temperature ``T`` of the student's KL [1], and of
      ``L_AD`` unless ``adv_temperature`` is set.
    adv_temperature: ``T`` of ``L_AD`` alone; ``0`` (default): the same
      ``temperature`` (DENSE's code uses ``T = 1``).
    reset_generator: re-initialise the generator every epoch (reference).
    learn_noise: optimise the noise ``z`` with the generator (reference).
    keep_best: pool the epoch's lowest-loss batch, not the last (reference).
    adv_mask: samples that enter ``L_AD`` (:func:`ensemble.adversarial_kl`;
      ``"disagree"`` is the released code's).
    augment_shift: the generator's loss sees each image shifted by a random
      ``(dy, dx)`` in ``[-s, s]²`` with zero fill (DENSE's code: ``s = 4``);
      ``0``: none (the papers' text). The pool keeps the unshifted images.
    augment_flip: the generator's loss also sees a random half of the
      images mirrored left-right (DENSE's code, on every dataset).
    protocol: one of :data:`PROTOCOLS`. ``"dense"`` (default): the fields
      above as given. ``"paper"``: the fields of :data:`PAPER_LOOP` are
      overridden with its values whatever was passed.
  """
  batch_size: int = 128
  generator_steps: int = 30
  student_steps: int = 0
  pool_size: int = 1
  lambda_bn: float = 1.0
  lambda_adv: float = 1.0
  beta: float = 1.0
  temperature: float = 1.0
  adv_temperature: float = 0.0
  reset_generator: bool = True
  learn_noise: bool = True
  keep_best: bool = True
  adv_mask: str = "disagree"
  augment_shift: int = 0
  augment_flip: bool = False
  protocol: str = "dense"

  def __post_init__(self):
    if self.protocol not in PROTOCOLS:
      raise ValueError(f"protocol must be one of {PROTOCOLS}, got "
                       f"{self.protocol!r}.")
    if self.protocol == "paper":
      for name, value in PAPER_LOOP.items():
        object.__setattr__(self, name, value)
    for name in ("batch_size", "generator_steps", "pool_size"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
    if self.student_steps < 0:
      raise ValueError(
          f"student_steps must be >= 0 (0 = one pass over the pool), got "
          f"{self.student_steps}.")
    if self.temperature <= 0:
      raise ValueError(f"temperature must be > 0, got {self.temperature}.")
    if self.adv_temperature < 0:
      raise ValueError(f"adv_temperature must be >= 0 (0: temperature), got "
                       f"{self.adv_temperature}.")
    if self.augment_shift < 0:
      raise ValueError(
          f"augment_shift must be >= 0, got {self.augment_shift}.")
    if self.adv_mask not in ensemble.ADV_MASKS:
      raise ValueError(f"adv_mask must be one of {ensemble.ADV_MASKS}, got "
                       f"{self.adv_mask!r}.")



def pool_samples(state: DFKDState) -> tuple[np.ndarray, np.ndarray]:
  """The last epoch's synthetic batch ``([B, H, W, Ch] in [0, 1], [B])``."""
  pool_x, pool_y = jax.device_get((state.pool_x, state.pool_y))
  last = (int(state.epoch) - 1) % pool_x.shape[0]
  return pool_x[last], pool_y[last]


class DataFreeKD(NamedTuple):
  """The distillation loop as pure functions.

  Attributes:
    init: ``(key, params, batch_stats) -> DFKDState``: a fresh generator, an
      empty pool and the given student.
    epoch: ``(state, teacher_vars, ctx) -> (state, metrics)``: one epoch
      for the teachers' stacked variables and the combine rule's ``ctx``.
  """
  init: Callable[..., DFKDState]
  epoch: Callable[..., tuple[DFKDState, dict[str, jax.Array]]]


# ----------------------------------------------------------------------------
# The static parts of one loop and the values passed between its programs.


@dataclasses.dataclass(frozen=True)
class _Loop(gen_student.Loop):
  """What :func:`make_dfkd` fixes: the models, the rule, the optimizers."""
  hp: DFKDHyperParams
  teachers: ensemble.TeacherFn
  combine: CombineFn
  student_input: InputFn
  generator_optimizer: optax.GradientTransformation
  student_optimizer: optax.GradientTransformation


class _Draw(NamedTuple):
  """The random inputs of one epoch (:func:`_draw`)."""
  z: jax.Array            # [B, nz] initial noise.
  y: jax.Array            # [B] target labels.
  order: jax.Array        # [S·B] the student's visiting order of the pool.
  filled: jax.Array       # () filled pool slots after this epoch's insert.
  gen_params: PyTree      # a freshly initialised generator.
  gen_stats: PyTree
  shifts: jax.Array       # [T_G, B, 2] int32 offsets in [0, 2s] (augment).
  flips: jax.Array        # [T_G, B] bool mirror flags (augment).


# params: (generator params, noise z [B, nz]); best: (lowest L_Gen so far,
# its images [B, H, W, Ch]).
_GenCarry = gen_student.GenCarry


class _Programs(NamedTuple):
  """The jitted programs of one epoch."""
  draw: Callable[..., _Draw]
  generator_begin: Callable[..., _GenCarry]
  generator_step: Callable[..., tuple[_GenCarry, dict[str, jax.Array]]]
  pool_insert: Callable[..., tuple[jax.Array, jax.Array, jax.Array]]
  student_step: Callable[..., Any]


# ----------------------------------------------------------------------------
# The pieces of an epoch (pure; jitted by make_dfkd).


def _init_state(loop: _Loop, key: jax.Array, params: PyTree,
                batch_stats: PyTree) -> DFKDState:
  """A fresh generator, an all-zero pool ``[S, B, ...]`` and the student."""
  hp = loop.hp
  gp, gs, run_key = gen_student.init_generator(loop, key)
  z = jnp.zeros((1, loop.nz), jnp.float32)
  image = jax.eval_shape(
      lambda: ensemble.apply_generator(loop.generator, gp, gs, z,
                                       jnp.zeros((1,), jnp.int32), False)[0])
  pool_x = jnp.zeros((hp.pool_size, hp.batch_size, *image.shape[1:]),
                     jnp.float32)
  pool_y = jnp.zeros((hp.pool_size, hp.batch_size), jnp.int32)
  pool_p = jnp.zeros((hp.pool_size, hp.batch_size, loop.num_classes),
                     jnp.float32)
  gen_opt_state = loop.generator_optimizer.init(
      (gp, jnp.zeros((hp.batch_size, loop.nz), jnp.float32)))
  return DFKDState(gen_params=gp, gen_stats=gs, gen_opt_state=gen_opt_state,
                   params=params, batch_stats=batch_stats,
                   opt_state=loop.student_optimizer.init(params),
                   pool_x=pool_x, pool_y=pool_y, pool_p=pool_p, key=run_key,
                   epoch=jnp.zeros((), jnp.int32))


def _pool_order(key: jax.Array, epoch_index: jax.Array, pool_size: int,
                batch_size: int) -> tuple[jax.Array, jax.Array]:
  """A random order of the pool's filled entries, this epoch's slot included.

  Returns:
    ``(order [S·B], filled)``: flat pool indices with the unfilled entries
    sorted last, and the number of filled slots.
  """
  filled = jnp.minimum(epoch_index + 1, pool_size)
  slot_of = jnp.arange(pool_size * batch_size) // batch_size
  u = jax.random.uniform(key, slot_of.shape)
  order = jnp.argsort(jnp.where(slot_of < filled, u, 2.0))
  return order, filled


def _draw(loop: _Loop, key: jax.Array, epoch_index: jax.Array) -> _Draw:
  """Epoch ``e``'s noise, labels, pool order and fresh generator.

  All from ``fold_in(key, e)`` (:func:`gen_student.split_keys`).
  """
  hp = loop.hp
  gen_key, order_key, init_key = gen_student.split_keys(key, epoch_index, 3)
  kz, ky = jax.random.split(gen_key)
  z = jax.random.normal(kz, (hp.batch_size, loop.nz), jnp.float32)
  y = jax.random.randint(ky, (hp.batch_size,), 0, loop.num_classes)
  order, filled = _pool_order(order_key, epoch_index, hp.pool_size,
                              hp.batch_size)
  gp, gs = ensemble.init_generator(loop.generator, init_key)
  # A separate stream, so that switching augmentation on leaves z, y, the
  # pool order and the fresh generator as they were.
  k_shift, k_flip = jax.random.split(jax.random.fold_in(gen_key, 1))
  steps = (hp.generator_steps, hp.batch_size)
  shifts = jax.random.randint(k_shift, (*steps, 2), 0,
                              2 * hp.augment_shift + 1)
  flips = jax.random.bernoulli(k_flip, 0.5, steps) & hp.augment_flip
  return _Draw(z=z, y=y, order=order, filled=filled, gen_params=gp,
               gen_stats=gs, shifts=shifts, flips=flips)


def augment(x: jax.Array, shifts: jax.Array, flips: jax.Array,
            max_shift: int) -> jax.Array:
  """Shifted and mirrored copies of ``x [B, H, W, Ch]`` (differentiable).

  Args:
    x: images.
    shifts: ``[B, 2]`` crop offsets in ``[0, 2·max_shift]`` into ``x``
      zero-padded by ``max_shift`` (``RandomCrop(padding=max_shift)``).
    flips: ``[B]`` whether to mirror the image left-right (after the shift).
    max_shift: the padding ``s``; ``0`` leaves the positions alone.

  Returns:
    ``[B, H, W, Ch]``.
  """
  if max_shift:
    _, h, w, ch = x.shape
    s = max_shift
    padded = jnp.pad(x, ((0, 0), (s, s), (s, s), (0, 0)))
    x = jax.vmap(lambda im, o: jax.lax.dynamic_slice(
        im, (o[0], o[1], 0), (h, w, ch)))(padded, shifts)
  return jnp.where(flips[:, None, None, None], x[:, :, ::-1], x)


def _generator_begin(loop: _Loop, state: DFKDState, z: jax.Array,
                     fresh_params: PyTree, fresh_stats: PyTree) -> _GenCarry:
  """The generator, its optimizer and the noise at the start of an epoch."""
  hp, opt = loop.hp, loop.generator_optimizer
  if hp.reset_generator:
    gp, gs = fresh_params, fresh_stats
    opt_state = opt.init((gp, z))
  else:
    gp, gs = state.gen_params, state.gen_stats
    # The noise is new every epoch; so is its optimizer state.
    opt_state = opt.init((gp, z)) if hp.learn_noise else state.gen_opt_state
  return _GenCarry(params=(gp, z), stats=gs, opt_state=opt_state,
                   best=(jnp.array(jnp.inf, jnp.float32),
                         jnp.zeros(state.pool_x.shape[1:], jnp.float32)))


def _generator_loss(loop: _Loop, gen_vars: tuple[PyTree, jax.Array],
                    gen_stats: PyTree, params: PyTree, batch_stats: PyTree,
                    teacher_vars: TeacherVars, ctx: PyTree, y: jax.Array,
                    shifts: jax.Array, flips: jax.Array):
  """``L_Gen`` of :func:`ensemble.generator_objective` on ``x̂ = G(z)``.

  The teachers and the student see ``x̂`` through :func:`augment` (the
  identity unless ``augment_shift`` or ``augment_flip``).

  Returns:
    ``(loss, (new_gen_stats, (x̂ [B, H, W, Ch], metrics)))``; ``x̂``
    unaugmented.
  """
  hp = loop.hp
  gen_params, z = gen_vars
  x01, new_stats = ensemble.apply_generator(loop.generator, gen_params,
                                            gen_stats, z, y, True)
  view = x01
  if hp.augment_shift or hp.augment_flip:
    view = augment(x01, shifts, flips, hp.augment_shift)
  t_logits, bn = loop.teachers(teacher_vars, view)
  p = loop.combine(t_logits, y, ctx)
  s_logits, _ = loop.student.apply(params, batch_stats,
                                   loop.student_input(view), train=False)
  loss, metrics = ensemble.generator_objective(
      p, y, bn, s_logits, lambda_bn=hp.lambda_bn, lambda_adv=hp.lambda_adv,
      temperature=hp.adv_temperature or hp.temperature, adv_mask=hp.adv_mask)
  return loss, (new_stats, (x01, metrics))


def _generator_update(loop: _Loop, grads, opt_state, gen_vars):
  """Adam on the generator and, with ``learn_noise``, the noise."""
  g_gen, g_z = grads
  if not loop.hp.learn_noise:
    g_z = jnp.zeros_like(g_z)
  updates, opt_state = loop.generator_optimizer.update(
      (g_gen, g_z), opt_state, gen_vars)
  return optax.apply_updates(gen_vars, updates), opt_state


def _generator_step(loop: _Loop, carry: _GenCarry, params: PyTree,
                    batch_stats: PyTree, teacher_vars: TeacherVars,
                    ctx: PyTree, y: jax.Array, shifts: jax.Array,
                    flips: jax.Array
                    ) -> tuple[_GenCarry, dict[str, jax.Array]]:
  """One optimizer step on the generator (and the noise); tracks the best.

  ``shifts [B, 2]`` and ``flips [B]`` are this step's augmentation.
  """
  new, loss, (x01, metrics) = gen_student.generator_step(
      functools.partial(_generator_loss, loop),
      functools.partial(_generator_update, loop), carry, params, batch_stats,
      teacher_vars, ctx, y, shifts, flips)
  best_loss, best_x = carry.best
  better = loss < best_loss
  best_x = jnp.where(better, jax.lax.stop_gradient(x01), best_x)
  return new._replace(best=(jnp.minimum(loss, best_loss), best_x)), metrics


def _pool_insert(loop: _Loop, state: DFKDState, teacher_vars: TeacherVars,
                 ctx: PyTree, carry: _GenCarry, y: jax.Array
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Writes the epoch's batch and its ensemble logits into slot ``e % S``.

  Returns:
    The new ``(pool_x, pool_y, pool_p)``.
  """
  hp = loop.hp
  if hp.keep_best:
    x_new = carry.best[1]
  else:
    gp, z_end = carry.params
    x_new, _ = ensemble.apply_generator(loop.generator, gp, carry.stats,
                                        z_end, y, True)
    x_new = jax.lax.stop_gradient(x_new)
  t_logits, _ = loop.teachers(teacher_vars, x_new)
  p_new = jax.lax.stop_gradient(loop.combine(t_logits, y, ctx))
  slot = state.epoch % hp.pool_size
  return (state.pool_x.at[slot].set(x_new), state.pool_y.at[slot].set(y),
          state.pool_p.at[slot].set(p_new))


def _student_step(loop: _Loop, params: PyTree, batch_stats: PyTree,
                  opt_state: PyTree, pool_x: jax.Array, pool_p: jax.Array,
                  order: jax.Array, start: jax.Array):
  """One student step on pool entries ``order[start : start + B]``.

  Returns:
    ``(params, batch_stats, opt_state, metrics)``.
  """
  hp = loop.hp
  objective = ensemble.make_student_objective(
      loop.student, loop.student_input, beta=hp.beta,
      temperature=hp.temperature)
  idx = jax.lax.dynamic_slice_in_dim(order, start, hp.batch_size)
  flat_x = pool_x.reshape((-1, *pool_x.shape[2:]))
  flat_p = pool_p.reshape((-1, loop.num_classes))
  (_, (new_stats, metrics)), grads = jax.value_and_grad(
      objective, has_aux=True)(params, batch_stats, flat_x[idx], flat_p[idx])
  updates, opt_state = loop.student_optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), new_stats, opt_state, metrics


def _epoch(loop: _Loop, programs: _Programs, state: DFKDState,
           teacher_vars: TeacherVars, ctx: PyTree
           ) -> tuple[DFKDState, dict[str, jax.Array]]:
  """One epoch: ``T_G`` generator steps, pool insert, the student steps
  (one iteration of :func:`gen_student.alternate`)."""
  hp = loop.hp
  draw = programs.draw(state.key, state.epoch)
  carry = programs.generator_begin(state, draw.z, draw.gen_params,
                                   draw.gen_stats)
  filled = int(draw.filled)
  pool = {}

  def generator(carry, student, i, t):
    carry, m = programs.generator_step(
        carry, state.params, state.batch_stats, teacher_vars, ctx, draw.y,
        draw.shifts[t], draw.flips[t])
    return carry, [m]

  def student_steps(carry, i):
    pool["x"], pool["y"], pool["p"] = programs.pool_insert(
        state, teacher_vars, ctx, carry, draw.y)
    return filled if hp.student_steps == 0 else hp.student_steps

  def student_step(student, carry, i, s):
    p, s_, o, m = programs.student_step(
        *student, pool["x"], pool["p"], draw.order,
        (s % filled) * hp.batch_size)
    return (p, s_, o), m

  carry, (p, s, o), gen_ms, step_metrics = gen_student.alternate(
      carry, (state.params, state.batch_stats, state.opt_state),
      iterations=1, generator_steps=hp.generator_steps, generator=generator,
      student_steps=student_steps, student_step=student_step)
  num_steps = len(step_metrics)
  metrics = dict(gen_ms[-1])
  metrics.update(gen_student.mean_metrics(step_metrics))
  metrics["student_steps"] = jnp.asarray(num_steps, jnp.float32)
  gen_params, _ = carry.params
  new_state = DFKDState(gen_params=gen_params, gen_stats=carry.stats,
                        gen_opt_state=carry.opt_state, params=p,
                        batch_stats=s, opt_state=o, pool_x=pool["x"],
                        pool_y=pool["y"], pool_p=pool["p"], key=state.key,
                        epoch=state.epoch + 1)
  return new_state, metrics


def make_dfkd(groups: Sequence[ensemble.TeacherGroup],
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
    groups: the teachers, one :class:`~fedjax_dd.distill.ensemble.TeacherGroup`
      per architecture.
    generator: a Flax generator (calling convention of
      :mod:`fedjax_dd.distill.ensemble`), e.g.
      :class:`fedjax_dd.models.Generator`.
    student: the global model.
    student_input: maps generated images in ``[0, 1]`` to the student's input.
    combine: the ensemble rule ``(logits [m, B, K], y [B], ctx) -> [B, K]``.
    hparams: loss weights, step counts and the synthesis protocol.
    generator_optimizer: for the generator and, with ``learn_noise``, the
      noise; re-initialised with them [Adam, lr 1e-3, β1 = 0.5, as DENSE].
    student_optimizer: [SGD, lr 0.01].
    mapper: how each architecture's stacked teachers are batched.

  Returns:
    A :class:`DataFreeKD`.
  """
  loop = _Loop(hp=hparams, generator=generator,
               teachers=ensemble.make_teacher_fn(groups, mapper),
               combine=combine, student=student, student_input=student_input,
               generator_optimizer=generator_optimizer,
               student_optimizer=student_optimizer)
  # An epoch's draws run once and compute little: compiling is their cost.
  programs = gen_student.jit_programs(
      _Programs, loop, once=("draw",), draw=_draw,
      generator_begin=_generator_begin,
      generator_step=_generator_step, pool_insert=_pool_insert,
      student_step=_student_step)
  return DataFreeKD(init=functools.partial(_init_state, loop),
                    epoch=functools.partial(_epoch, loop, programs))
