"""DisUE's inter-group aggregation (IGA): a persistent conditional generator.

The server holds ``K`` teachers (DisUE: the cluster models ``ω_{C_k}``;
FedFTG: the round's client models) with their per-class sample counts
``n_y^k``, and the global model ``ω_G`` (the student). A server-side
conditional generator ``x̂ = G(z, y)`` and the student play a min–max game
on its samples, pulling the student towards the teachers' class-weighted
predictions. DisUE Sec. 4.2, Eqs. 5–13; the protocol follows FedFTG's
released code (Zhang et al.), on which DisUE builds.

**Label sampler (GLS, Eq. 5).** ``p̂(y) ∝ Σ_k n_y^k``
(:func:`label_prior`), each batch holding the classes in exact proportion
(:func:`sample_labels`, as FedFTG's ``generate_labels``). Ablation "−GLS":
uniform ``p̂`` (``use_gls=False``).

**Weights (GWF, Eq. 6).** ``α_y^k = n_y^k / Σ_k' n_y^k'``
(:func:`class_weights`; FedFTG's ``cls_clnt_weight``). Ablation "−GWF":
:func:`equal_weights` (``use_gwf=False``). Sample ``i`` weights teacher ``k``
by ``w_ki = α_{y_i}^k``.

**Losses**, with teacher logits ``P_k = C_k(x̂)``, student's ``S = C_G(x̂)``:

* ``L_cd = mean_i Σ_k w_ki · D(σ(P_ki) ‖ σ(S_i))`` (Eqs. 8–9,
  :func:`cluster_distillation_loss`); ``D`` is the paper's KL or an L1
  form (:func:`discrepancy_per_sample`).
* ``L_cf = mean_i Σ_k w_ki · CE(P_ki, y_i)`` (Eqs. 10–11,
  :func:`cluster_fidelity_loss`). Eqs. 10 and 11 both apply ``α_y^k``
  (weighting by ``α²``, each teacher ``K`` times); it is applied once here,
  as in FedFTG's code.
* ``L_div = exp(−mean_{i,j} d_x(i, j) · d_z(i, j))`` (Eq. 12,
  :func:`diversity_loss`). Eq. 12 writes ``d = ‖·‖₂``, whose product is so
  large that ``exp`` underflows to 0 with no gradient; the default is
  FedGen's mean-based form (Zhu et al. 2021, copied by FedFTG's code).

**Min–max (Eq. 13).** The generator minimises
``β_cf·L_cf + β_div·L_div − L_cd`` and the student minimises ``L_cd``. Eq. 13
writes ``min_ω max_θ (L_cd + β_cf L_cf + β_div L_div)``, but maximising
``L_cf`` and ``L_div`` contradicts Eq. 10 and the text; only ``L_cd`` is
adversarial, as in FedFTG's code. Ablations "−L_cf" / "−L_div": ``β = 0``.

**Schedule** (FedFTG's ``train_global_model_cgan_bs_weight_iloop_fz_dis``;
DisUE Sec. 5.1): per round ``I`` iterations of generator steps (Adam) then
student steps (SGD), both learning rates decayed by ``0.998^t``
(:class:`IGAHyperParams`). The generator persists across rounds; its Adam
state is new every round, as FedFTG's. Teachers run in inference mode; the
student and the generator each train only in their own step.

Where our defaults differ from FedFTG's code (each a field of
:class:`IGAHyperParams`): one generator step on Eq. 13's summed objective,
not one per client, so the cost does not grow with ``K``
(``generator_per_teacher``); per-sample ``L_cf`` weights, as Eq. 10
(``cf_weighting``); ``L_cd`` differentiated through the teachers too, as
Eq. 13 (``cd_through_teachers``); new ``(z, y)`` every step
(``fresh_samples``). FedFTG's student loss has the gradient of our ``"kl"``
``L_cd`` divided by ``C``, the scale its learning rate 0.1 was set for, so
the student minimises ``L_cd / C`` (``student_class_mean``,
experiments/perf_notes.md). FedFTG's generator/student pair is
``discrepancy="l1_logits", student_discrepancy="kl"``.

Padding. Teachers are stacked ``[K_max, ...]``; a padded teacher has an
all-zero count row, hence zero weight. Its variables are replaced by the
first real teacher's and weighted sums select (rather than multiply)
zero-weight terms, so the result is bit-identical whatever the padding
holds, and a changing ``K`` never recompiles. A round runs on
:mod:`fedjax_dd.distill.gen_student`'s host loop.

References:
  Leng et al., "Distilling A Universal Expert from Clustered Federated
  Learning" (DisUE), Sec. 4.2, Eqs. 5–13, Sec. 4.4 / Alg. 1, Sec. 5.1.
  Zhang et al., "Fine-tuning Global Model via Data-Free Knowledge
  Distillation for Non-IID Federated Learning" (FedFTG), CVPR 2022, and its
  code (github.com/ZhangLin-PKU/FedFTG).
  Zhu et al., "Data-Free Knowledge Distillation for Heterogeneous Federated
  Learning" (FedGen), ICML 2021 (the diversity loss).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill import ensemble, gen_student
from fedjax_dd.distill.ensemble import InputFn, TeacherVars

PyTree = Any

DISCREPANCIES = ("kl", "l1", "l1_logits")
DIVERSITY_FORMS = ("fedgen", "euclidean")
CF_WEIGHTINGS = ("per_sample", "batch_mean")


# ----------------------------------------------------------------------------
# GLS and GWF (Eqs. 5–6).


def teacher_mask(class_counts: jax.Array) -> jax.Array:
  """``[K]`` True for the real teachers: those with any class count."""
  return jnp.sum(jnp.asarray(class_counts, jnp.float32), axis=1) > 0


def label_prior(class_counts: jax.Array) -> jax.Array:
  """GLS (Eq. 5): ``p̂(y) ∝ Σ_k n_y^k``.

  Args:
    class_counts: ``[K, C]`` samples of class ``y`` behind teacher ``k``
      (zero rows for padded teachers).

  Returns:
    ``[C]`` probabilities; uniform if every count is 0.
  """
  n = jnp.sum(jnp.asarray(class_counts, jnp.float32), axis=0)
  total = jnp.sum(n)
  uniform = jnp.full_like(n, 1.0 / n.shape[0])
  return jnp.where(total > 0, n / jnp.maximum(total, 1e-30), uniform)


def allocate_labels(p: jax.Array, batch_size: int) -> jax.Array:
  """How many of ``batch_size`` labels each class gets: largest remainder.

  Class ``c`` gets ``⌊p_c·B⌋`` labels; those left over go one each to the
  classes with the largest fractional parts (ties to the lower index).

  Args:
    p: ``[C]`` probabilities (normalised here).
    batch_size: ``B``.

  Returns:
    ``[C]`` int32 counts summing to ``B``.
  """
  p = jnp.asarray(p, jnp.float32)
  p = p / jnp.sum(p)
  quota = p * batch_size
  base = jnp.floor(quota)
  left = batch_size - jnp.sum(base)
  order = jnp.argsort(-(quota - base), stable=True)
  rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0]))
  return (base + (rank < left)).astype(jnp.int32)


def sample_labels(key: jax.Array, p: jax.Array, batch_size: int) -> jax.Array:
  """``B`` labels in exact proportion ``p`` (:func:`allocate_labels`), shuffled.

  Args:
    key: PRNG key of the shuffle.
    p: ``[C]`` class probabilities.
    batch_size: ``B``.

  Returns:
    ``[B]`` int32 labels.
  """
  counts = allocate_labels(p, batch_size)
  labels = jnp.repeat(jnp.arange(counts.shape[0], dtype=jnp.int32), counts,
                      total_repeat_length=batch_size)
  return jax.random.permutation(key, labels)


def class_weights(class_counts: jax.Array) -> jax.Array:
  """GWF (Eq. 6): ``α_y^k = n_y^k / Σ_k' n_y^k'``.

  Args:
    class_counts: ``[K, C]``.

  Returns:
    ``[K, C]``; each held class's column sums to 1, others are 0.
  """
  n = jnp.asarray(class_counts, jnp.float32)
  col = jnp.sum(n, axis=0, keepdims=True)
  return jnp.where(col > 0, n / jnp.maximum(col, 1e-30), 0.0)


def equal_weights(class_counts: jax.Array) -> jax.Array:
  """Ablation "−GWF": ``1/K`` for each of the ``K`` real teachers, every class.

  Args:
    class_counts: ``[K_max, C]``; a zero row marks a padded teacher.

  Returns:
    ``[K_max, C]``; zero rows for padded teachers.
  """
  mask = teacher_mask(class_counts).astype(jnp.float32)
  w = mask / jnp.maximum(jnp.sum(mask), 1.0)
  return jnp.broadcast_to(w[:, None], jnp.shape(class_counts)).astype(
      jnp.float32)


def sample_weights(alpha: jax.Array, y: jax.Array) -> jax.Array:
  """``w [K, B]`` with ``w_ki = α_{y_i}^k`` for ``alpha [K, C]``, ``y [B]``."""
  return alpha[:, y]


# ----------------------------------------------------------------------------
# Losses (Eqs. 8–12).


def _weighted_mean(values: jax.Array, w: jax.Array) -> jax.Array:
  """``mean_i Σ_k w_ki · v_ki``; zero-weight terms are selected away, not
  multiplied, so a non-finite value there cannot leak in."""
  return jnp.mean(jnp.sum(jnp.where(w != 0, w * values, 0.0), axis=0))


def discrepancy_per_sample(teacher_logits: jax.Array,
                           student_logits: jax.Array, discrepancy: str,
                           temperature: float = 1.0) -> jax.Array:
  """``D(σ(P_ki) ‖ σ(S_i))`` for every teacher and sample.

  Args:
    teacher_logits: ``P [K, B, C]``.
    student_logits: ``S [B, C]``.
    discrepancy: ``"kl"``: ``KL(σ(P/T) ‖ σ(S/T))·T²``; ``"l1"``:
      ``Σ_c |σ(P/T)_c − σ(S/T)_c|``; ``"l1_logits"``: ``mean_c |P_c − S_c|``
      (FedFTG's generator term; no temperature).
    temperature: ``T``.

  Returns:
    ``[K, B]``.
  """
  if discrepancy == "kl":
    return jax.vmap(ensemble.kl_per_sample, in_axes=(0, None, None))(
        teacher_logits, student_logits, temperature)
  if discrepancy == "l1":
    pt = jax.nn.softmax(teacher_logits / temperature, axis=-1)
    ps = jax.nn.softmax(student_logits / temperature, axis=-1)
    return jnp.sum(jnp.abs(pt - ps[None]), axis=-1)
  if discrepancy == "l1_logits":
    return jnp.mean(jnp.abs(teacher_logits - student_logits[None]), axis=-1)
  raise ValueError(f"discrepancy must be one of {DISCREPANCIES}, got "
                   f"{discrepancy!r}.")


def cluster_distillation_loss(teacher_logits: jax.Array,
                              student_logits: jax.Array, w: jax.Array, *,
                              discrepancy: str = "kl",
                              temperature: float = 1.0) -> jax.Array:
  """``L_cd = mean_i Σ_k w_ki · D(σ(P_ki) ‖ σ(S_i))`` (Eqs. 8–9).

  Args:
    teacher_logits: ``P [K, B, C]``.
    student_logits: ``S [B, C]``.
    w: ``[K, B]`` per-sample teacher weights (:func:`sample_weights`).
    discrepancy: see :func:`discrepancy_per_sample`.
    temperature: ``T``.

  Returns:
    A scalar.
  """
  d = discrepancy_per_sample(teacher_logits, student_logits, discrepancy,
                             temperature)
  return _weighted_mean(d, w)


def cluster_fidelity_loss(teacher_logits: jax.Array, y: jax.Array,
                          w: jax.Array, weighting: str = "per_sample"
                          ) -> jax.Array:
  """``L_cf = mean_i Σ_k w_ki · CE(P_ki, y_i)`` (Eqs. 10–11, ``α`` once).

  Args:
    teacher_logits: ``P [K, B, C]``.
    y: ``[B]`` target labels.
    w: ``[K, B]`` per-sample teacher weights.
    weighting: ``"per_sample"`` (Eq. 10) or ``"batch_mean"`` (FedFTG's
      code: ``Σ_k mean_i(w_ki) · mean_i CE(P_ki, y_i)``).

  Returns:
    A scalar.
  """
  ce = jax.vmap(optax.softmax_cross_entropy_with_integer_labels,
                in_axes=(0, None))(teacher_logits, y)
  if weighting == "per_sample":
    return _weighted_mean(ce, w)
  if weighting == "batch_mean":
    wk = jnp.mean(w, axis=1)
    return jnp.sum(jnp.where(wk != 0, wk * jnp.mean(ce, axis=1), 0.0))
  raise ValueError(f"weighting must be one of {CF_WEIGHTINGS}, got "
                   f"{weighting!r}.")


def _safe_sqrt(x: jax.Array) -> jax.Array:
  # sqrt with a finite gradient at 0 (the i = j pairs).
  return jnp.sqrt(jnp.maximum(x, 1e-20))


def diversity_loss(z: jax.Array, x: jax.Array, form: str = "fedgen"
                   ) -> jax.Array:
  """``L_div = exp(−mean_{i,j} d_x(i, j) · d_z(i, j))`` over all ``B²`` pairs (Eq. 12).

  Args:
    z: noise ``[B, nz]``.
    x: generated samples ``[B, ...]`` (flattened per sample).
    form: ``"fedgen"``: ``d_x`` the mean absolute difference over the
      features, ``d_z`` the mean squared difference over the noise dimensions
      (FedGen's and FedFTG's ``DiversityLoss(metric='l1')``); ``"euclidean"``:
      ``d_x = ‖x_i − x_j‖₂``, ``d_z = ‖z_i − z_j‖₂`` (Eq. 12 as printed).

  Returns:
    A scalar in ``(0, 1]``.
  """
  x = x.reshape((x.shape[0], -1))
  dx = x[:, None, :] - x[None, :, :]
  dz = z[:, None, :] - z[None, :, :]
  if form == "fedgen":
    prod = jnp.mean(jnp.abs(dx), -1) * jnp.mean(jnp.square(dz), -1)
  elif form == "euclidean":
    prod = (_safe_sqrt(jnp.sum(jnp.square(dx), -1)) *
            _safe_sqrt(jnp.sum(jnp.square(dz), -1)))
  else:
    raise ValueError(f"form must be one of {DIVERSITY_FORMS}, got {form!r}.")
  return jnp.exp(-jnp.mean(prod))


# ----------------------------------------------------------------------------
# State, hyper-parameters, the factory's result.


@flax.struct.dataclass
class IGAState:
  """What persists across IGA rounds, checkpointed as one unit.

  Attributes:
    gen_params: generator parameters.
    gen_stats: generator BatchNorm statistics.
    key: root PRNG key; IGA round ``r`` draws from ``fold_in(key, r)``.
    rounds: completed IGA rounds (the ``r`` above).
  """
  gen_params: PyTree
  gen_stats: PyTree
  key: jax.Array
  rounds: jax.Array


@dataclasses.dataclass(frozen=True)
class IGAHyperParams:
  """Hyper-parameters of :func:`make_iga` (FedFTG code / DisUE defaults).

  Attributes:
    iterations: ``I``, generator/student alternations per round [10].
    generator_steps: generator steps per iteration [1; see
      ``generator_per_teacher``].
    student_steps: student steps per iteration [5].
    batch_size: samples per step [50].
    generator_lr: Adam learning rate at round 0 [0.01].
    student_lr: SGD learning rate at round 0 [0.1].
    lr_decay: both learning rates are scaled by ``lr_decay^t`` in round
      ``t`` [0.998].
    student_weight_decay: the student's SGD ``weight_decay`` [1e-3].
    beta_cf: ``β_cf`` [1]; 0 is the "−L_cf" ablation.
    beta_div: ``β_div`` [1]; 0 is the "−L_div" ablation.
    discrepancy: ``D`` of ``L_cd`` in the generator objective, one of
      :data:`DISCREPANCIES` [``"kl"``, the paper's Eq. 9].
    student_discrepancy: ``D`` of the student's ``L_cd``; ``""`` (or
      ``None``) for ``discrepancy``.
    diversity: form of ``L_div``, one of :data:`DIVERSITY_FORMS`
      [``"fedgen"``].
    temperature: softmax temperature of ``"kl"`` / ``"l1"`` [1; the paper
      and FedFTG have none].
    use_gls: sample labels by :func:`label_prior` (else uniformly) [True].
    use_gwf: weight teachers by :func:`class_weights` (else
      :func:`equal_weights`) [True].
    fresh_samples: new ``(z, y)`` for every generator and student step [True];
      False reuses one ``(z, y)`` per iteration (FedFTG's code).
    student_class_mean: average the student's ``"kl"`` / ``"l1"``
      discrepancy over the ``C`` classes instead of summing it, FedFTG's
      scale (module docstring) [True].
    generator_per_teacher: each of the ``generator_steps`` becomes one step
      per real teacher ``k`` on its own terms ``β_cf·L_cf^k + β_div·L_div/K −
      L_cd^k`` (FedFTG's code) [False: one step on the sum].
    cf_weighting: how ``L_cf`` weights the teachers, one of
      :data:`CF_WEIGHTINGS` [``"per_sample"``] (:func:`cluster_fidelity_loss`).
    cd_through_teachers: whether the generator's ``L_cd`` gradient flows
      through the teachers' logits as well as the student's [True, Eq. 13];
      False stops it at the teachers (FedFTG's ``t_logit.detach()``).
      ``L_cf`` always reaches the generator through the teachers.
  """
  iterations: int = 10
  generator_steps: int = 1
  student_steps: int = 5
  batch_size: int = 50
  generator_lr: float = 0.01
  student_lr: float = 0.1
  lr_decay: float = 0.998
  student_weight_decay: float = 1e-3
  beta_cf: float = 1.0
  beta_div: float = 1.0
  discrepancy: str = "kl"
  student_discrepancy: str = ""
  diversity: str = "fedgen"
  temperature: float = 1.0
  use_gls: bool = True
  use_gwf: bool = True
  fresh_samples: bool = True
  student_class_mean: bool = True
  generator_per_teacher: bool = False
  cf_weighting: str = "per_sample"
  cd_through_teachers: bool = True

  def __post_init__(self):
    for name in ("iterations", "generator_steps", "student_steps",
                 "batch_size"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
    for name in ("generator_lr", "student_lr", "lr_decay", "temperature"):
      if not getattr(self, name) > 0:
        raise ValueError(f"{name} must be > 0, got {getattr(self, name)}.")
    for name in ("student_weight_decay", "beta_cf", "beta_div"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")
    for name in ("discrepancy", "student_discrepancy"):
      value = getattr(self, name)
      if value and value not in DISCREPANCIES:
        raise ValueError(f"{name} must be one of {DISCREPANCIES}, got "
                         f"{value!r}.")
    if self.cf_weighting not in CF_WEIGHTINGS:
      raise ValueError(f"cf_weighting must be one of {CF_WEIGHTINGS}, got "
                       f"{self.cf_weighting!r}.")
    if self.diversity not in DIVERSITY_FORMS:
      raise ValueError(f"diversity must be one of {DIVERSITY_FORMS}, got "
                       f"{self.diversity!r}.")

  @property
  def student_d(self) -> str:
    return self.student_discrepancy or self.discrepancy



class IGA(NamedTuple):
  """The IGA loop as functions over pytrees.

  Attributes:
    init: ``(key, student_params, student_batch_stats) -> IGAState``: a fresh
      generator (the student's variables only check its samples fit).
    round: ``(state, student_params, student_batch_stats, teacher_params
      [K, ...], teacher_batch_stats [K, ...], class_counts [K, C], t) ->
      (state, student_params, student_batch_stats, metrics)``: one round
      over ``K <= K_max`` teachers; ``t`` is the communication round of the
      learning-rate decay.
  """
  init: Callable[..., IGAState]
  round: Callable[..., tuple[IGAState, PyTree, PyTree, dict[str, jax.Array]]]


# ----------------------------------------------------------------------------
# The static parts of the loop and the values passed between its programs.


@dataclasses.dataclass(frozen=True)
class _Loop(gen_student.Loop):
  hp: IGAHyperParams
  input_fn: InputFn
  teachers: ensemble.TeacherFn
  num_teachers_max: int

  @property
  def draws_per_iteration(self) -> int:
    hp = self.hp
    return hp.generator_steps + hp.student_steps if hp.fresh_samples else 1

  def student_loss_scale(self) -> float:
    hp = self.hp
    if hp.student_class_mean and hp.student_d in ("kl", "l1"):
      return 1.0 / self.num_classes
    return 1.0


class _Draw(NamedTuple):
  """A round's random inputs: slot ``(i, j)`` of iteration ``i``."""
  z: jax.Array  # [I, J, B, nz]
  y: jax.Array  # [I, J, B]


class _Setup(NamedTuple):
  """A round's constants."""
  teacher_vars: TeacherVars  # padding replaced by the first real teacher.
  alpha: jax.Array           # [K_max, C]
  generator_lr: jax.Array    # ()
  student_lr: jax.Array      # ()
  num_teachers: jax.Array    # () real teachers, K.


# The generator's carry across a round: its params, stats and Adam state.
_GenCarry = gen_student.GenCarry


_ADAM = optax.scale_by_adam()  # PyTorch Adam defaults: (0.9, 0.999), 1e-8.


def _init_state(loop: _Loop, key: jax.Array, student_params: PyTree,
                student_batch_stats: PyTree) -> IGAState:
  gp, gs, run_key = gen_student.init_generator(loop, key)
  z = jnp.zeros((2, loop.nz), jnp.float32)
  y = jnp.zeros((2,), jnp.int32)
  # Fails early if the generator's samples do not fit the student.
  jax.eval_shape(
      lambda: loop.student.apply(
          student_params, student_batch_stats,
          loop.input_fn(ensemble.apply_generator(loop.generator, gp, gs, z, y,
                                                 False)[0]), train=False))
  return IGAState(gen_params=gp, gen_stats=gs, key=run_key,
                  rounds=jnp.zeros((), jnp.int32))


def _draw(loop: _Loop, key: jax.Array, rounds: jax.Array,
          class_counts: jax.Array) -> _Draw:
  hp = loop.hp
  c = loop.num_classes
  p = (label_prior(class_counts) if hp.use_gls
       else jnp.full((c,), 1.0 / c, jnp.float32))
  kz, ky = gen_student.split_keys(key, rounds, 2)
  n = (hp.iterations, loop.draws_per_iteration)
  z = jax.random.normal(kz, (*n, hp.batch_size, loop.nz), jnp.float32)
  keys = jax.random.split(ky, n[0] * n[1])
  y = jax.vmap(lambda k: sample_labels(k, p, hp.batch_size))(keys)
  return _Draw(z=z, y=y.reshape((*n, hp.batch_size)))


def _fill_padding(tree: PyTree, mask: jax.Array) -> PyTree:
  """Replaces the padded entries of a ``[K_max, ...]`` stack by the first real one."""
  first = jnp.argmax(mask)

  def fill(a):
    m = mask.reshape((-1,) + (1,) * (a.ndim - 1))
    return jnp.where(m, a, a[first][None])

  return jax.tree_util.tree_map(fill, tree)


def _setup(loop: _Loop, gen_params: PyTree, teacher_params: PyTree,
           teacher_batch_stats: PyTree, class_counts: jax.Array,
           t: jax.Array) -> tuple[_Setup, PyTree]:
  hp = loop.hp
  mask = teacher_mask(class_counts)
  alpha = class_weights(class_counts) if hp.use_gwf else equal_weights(
      class_counts)
  tv = ((_fill_padding(teacher_params, mask),
         _fill_padding(teacher_batch_stats, mask)),)
  decay = jnp.power(jnp.float32(hp.lr_decay), t)
  setup = _Setup(teacher_vars=tv, alpha=alpha,
                 generator_lr=jnp.float32(hp.generator_lr) * decay,
                 student_lr=jnp.float32(hp.student_lr) * decay,
                 num_teachers=jnp.sum(mask).astype(jnp.float32))
  return setup, _ADAM.init(gen_params)


def _ensemble_accuracy(t_logits: jax.Array, w: jax.Array,
                       y: jax.Array) -> jax.Array:
  q = jnp.sum(jnp.where(w[..., None] != 0,
                        w[..., None] * jax.nn.softmax(t_logits, -1), 0.0), 0)
  return jnp.mean((jnp.argmax(q, -1) == y).astype(jnp.float32))


def _one_teacher(loop: _Loop, setup: _Setup, x: jax.Array, k: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:
  """Teacher ``k``'s logits ``[1, B, C]`` and weight row ``[1, C]`` (``α^k``)."""
  (params, stats), = setup.teacher_vars
  pick = lambda a: jax.lax.dynamic_index_in_dim(a, k, keepdims=False)
  logits, _ = loop.student.apply(jax.tree_util.tree_map(pick, params),
                                 jax.tree_util.tree_map(pick, stats),
                                 loop.input_fn(x), train=False)
  return logits[None], jax.lax.dynamic_slice_in_dim(setup.alpha, k, 1)


def _generator_loss(loop: _Loop, gen_params: PyTree, gen_stats: PyTree,
                    student_params: PyTree, student_batch_stats: PyTree,
                    setup: _Setup, z: jax.Array, y: jax.Array,
                    k: jax.Array | None):
  """Eq. 13's generator objective; with a teacher index ``k``, teacher
  ``k``'s share of it (``L_div / K``)."""
  hp = loop.hp
  x, new_stats = ensemble.apply_generator(loop.generator, gen_params,
                                          gen_stats, z, y, True)
  if k is None:
    t_logits, _ = loop.teachers(setup.teacher_vars, x)
    alpha, div_share = setup.alpha, 1.0
  else:
    t_logits, alpha = _one_teacher(loop, setup, x, k)
    div_share = 1.0 / setup.num_teachers
  s_logits, _ = loop.student.apply(student_params, student_batch_stats,
                                   loop.input_fn(x), train=False)
  w = sample_weights(alpha, y)
  cd = cluster_distillation_loss(
      t_logits if hp.cd_through_teachers else jax.lax.stop_gradient(t_logits),
      s_logits, w, discrepancy=hp.discrepancy, temperature=hp.temperature)
  cf = cluster_fidelity_loss(t_logits, y, w, hp.cf_weighting)
  div = diversity_loss(z, x, hp.diversity)
  loss = hp.beta_cf * cf + hp.beta_div * div_share * div - cd
  metrics = {"gen_loss": loss, "gen_cd": cd, "gen_cf": cf, "gen_div": div}
  if k is None:  # One teacher's argmax says nothing of the ensemble's.
    metrics["ensemble_accuracy"] = _ensemble_accuracy(t_logits, w, y)
  return loss, (new_stats, metrics)


def _generator_step(loop: _Loop, carry: _GenCarry, student_params: PyTree,
                    student_batch_stats: PyTree, setup: _Setup, draw: _Draw,
                    i: jax.Array, j: jax.Array, k: jax.Array | None = None
                    ) -> tuple[_GenCarry, dict[str, jax.Array]]:
  """One Adam step of the generator on slot ``(i, j)`` of the draw (on
  teacher ``k``'s terms when ``k`` is given)."""
  z, y = draw.z[i, j], draw.y[i, j]

  def update(grads, adam, params):
    updates, adam = _ADAM.update(grads, adam)
    return jax.tree_util.tree_map(lambda p, u: p - setup.generator_lr * u,
                                  params, updates), adam

  carry, _, metrics = gen_student.generator_step(
      functools.partial(_generator_loss, loop), update, carry,
      student_params, student_batch_stats, setup, z, y, k)
  return carry, metrics


def _student_step(loop: _Loop, student_params: PyTree,
                  student_batch_stats: PyTree, gen_params: PyTree,
                  gen_stats: PyTree, setup: _Setup, draw: _Draw, i: jax.Array,
                  j: jax.Array):
  """One SGD step of the student on ``L_cd`` over slot ``(i, j)``'s samples.

  Returns:
    ``(student_params, student_batch_stats, metrics)``.
  """
  hp = loop.hp
  z, y = draw.z[i, j], draw.y[i, j]
  x, _ = ensemble.apply_generator(loop.generator, gen_params, gen_stats, z, y,
                                  False)
  x = jax.lax.stop_gradient(x)
  t_logits = jax.lax.stop_gradient(loop.teachers(setup.teacher_vars, x)[0])
  w = sample_weights(setup.alpha, y)

  def objective(params):
    s_logits, new_stats = loop.student.apply(params, student_batch_stats,
                                             loop.input_fn(x), train=True)
    cd = cluster_distillation_loss(t_logits, s_logits, w,
                                   discrepancy=hp.student_d,
                                   temperature=hp.temperature)
    return loop.student_loss_scale() * cd, (new_stats, cd)

  (_, (new_stats, cd)), grads = jax.value_and_grad(objective, has_aux=True)(
      student_params)
  wd, lr = hp.student_weight_decay, setup.student_lr
  params = jax.tree_util.tree_map(lambda p, g: p - lr * (g + wd * p),
                                  student_params, grads)
  return params, new_stats, {"student_cd": cd}


def _mean(ms: list[dict[str, jax.Array]]) -> dict[str, jax.Array]:
  """Per-key mean of the steps' metrics, as a running sum: a stack would
  compile anew for each count of steps (per-teacher steps vary with K)."""
  total = functools.reduce(
      lambda a, b: jax.tree_util.tree_map(jnp.add, a, b), ms)
  return {k: v / len(ms) for k, v in total.items()}


class _Programs(NamedTuple):
  draw: Callable[..., _Draw]
  setup: Callable[..., tuple[_Setup, PyTree]]
  generator_step: Callable[..., tuple[_GenCarry, dict[str, jax.Array]]]
  student_step: Callable[..., Any]


def _round(loop: _Loop, programs: _Programs, state: IGAState,
           student_params: PyTree, student_batch_stats: PyTree,
           teacher_params: PyTree, teacher_batch_stats: PyTree,
           class_counts: jax.Array, t: Any):
  hp = loop.hp
  k_max, c = loop.num_teachers_max, loop.num_classes
  shape = tuple(jnp.shape(class_counts))
  if len(shape) != 2 or shape[1] != c or not 1 <= shape[0] <= k_max:
    raise ValueError(f"class_counts must be [K, C={c}] with 1 <= K <= "
                     f"K_max={k_max}, got {shape}.")
  k = shape[0]
  for leaf in jax.tree_util.tree_leaves((teacher_params, teacher_batch_stats)):
    if leaf.shape[:1] != (k,):
      raise ValueError(f"Teacher variables must be stacked [K={k}, ...] as "
                       f"class_counts; got a leaf of shape {leaf.shape}.")
  class_counts = jnp.asarray(class_counts, jnp.float32)
  if k < k_max:
    # A smaller cohort (a Bernoulli draw): zero count rows are padded
    # teachers, so every K runs the programs compiled for K_max.
    pad = lambda a: jnp.pad(a, [(0, k_max - k)] + [(0, 0)] * (a.ndim - 1))
    class_counts = pad(class_counts)
    teacher_params, teacher_batch_stats = jax.tree_util.tree_map(
        pad, (teacher_params, teacher_batch_stats))
  t = jnp.asarray(t, jnp.float32)
  draw = programs.draw(state.key, state.rounds, class_counts)
  setup, adam = programs.setup(state.gen_params, teacher_params,
                               teacher_batch_stats, class_counts, t)
  carry = _GenCarry(params=state.gen_params, stats=state.gen_stats,
                    opt_state=adam)
  # FedFTG's order: one generator step per real teacher; the indices are
  # traced, so a changing K never recompiles.
  per_teacher = ([jnp.int32(k) for k in np.flatnonzero(
      np.asarray(jax.device_get(class_counts)).sum(axis=1) > 0)]
                 if hp.generator_per_teacher else [None])
  if not per_teacher:
    raise ValueError("generator_per_teacher needs a teacher with a class "
                     "count; every row of class_counts is 0.")

  def generator(carry, student, i, g):
    j = g if hp.fresh_samples else 0
    ms = []
    for k in per_teacher:
      carry, m = programs.generator_step(carry, *student, setup, draw, i, j,
                                         k)
      ms.append(m)
    return carry, ms

  def student_step(student, carry, i, s):
    j = hp.generator_steps + s if hp.fresh_samples else 0
    sp, ss, m = programs.student_step(*student, carry.params, carry.stats,
                                      setup, draw, i, j)
    return (sp, ss), m

  carry, (sp, ss), gen_ms, stu_ms = gen_student.alternate(
      carry, (student_params, student_batch_stats), iterations=hp.iterations,
      generator_steps=hp.generator_steps, generator=generator,
      student_steps=lambda carry, i: hp.student_steps,
      student_step=student_step)
  metrics = {k: v for ms in (gen_ms, stu_ms) for k, v in _mean(ms).items()}
  metrics["num_teachers"] = jnp.sum(teacher_mask(class_counts))
  new_state = state.replace(gen_params=carry.params, gen_stats=carry.stats,
                            rounds=state.rounds + 1)
  return new_state, sp, ss, metrics


def make_iga(student: Classifier, generator: nn.Module, *,
             num_teachers_max: int,
             hparams: IGAHyperParams = IGAHyperParams(),
             input_fn: InputFn | None = None,
             mapper: ClientMapper = ClientMapper()) -> IGA:
  """Builds DisUE's inter-group aggregation (FedFTG's server fine-tuning).

  Args:
    student: the global model; the teachers share its architecture.
    generator: a conditional Flax generator (``conditional=True``), e.g.
      :class:`fedjax_dd.models.cgenerator.CGeneratorA`.
    num_teachers_max: ``K_max``, the length of the stacked teacher axis
      (e.g. the largest cohort); ``round`` pads fewer real teachers.
    hparams: schedule, loss weights and ablations.
    input_fn: maps generator images in ``[0, 1]`` to the classifiers' input
      (:func:`ensemble.generator_input_fn`).
    mapper: how the stacked teachers are batched.

  Returns:
    An :class:`IGA`.

  Raises:
    ValueError: for an unconditional generator, ``num_teachers_max < 1``,
      or a ``"unit"`` generator without ``input_fn``.
  """
  if not ensemble.is_conditional(generator):
    raise ValueError("IGA needs a conditional generator (conditional=True).")
  gen_classes = getattr(generator, "num_classes", student.num_classes)
  if gen_classes != student.num_classes:
    raise ValueError(f"The generator has {gen_classes} classes, the student "
                     f"{student.num_classes}.")
  if num_teachers_max < 1:
    raise ValueError(f"num_teachers_max must be >= 1, got "
                     f"{num_teachers_max}.")
  fn = ensemble.generator_input_fn(generator, input_fn)
  group = ensemble.TeacherGroup(student, fn, tuple(range(num_teachers_max)))
  loop = _Loop(hp=hparams, generator=generator, student=student, input_fn=fn,
               teachers=ensemble.make_teacher_fn((group,), mapper),
               num_teachers_max=num_teachers_max)
  # A round's draws run once per round and compute little (as DFKD's).
  programs = gen_student.jit_programs(
      _Programs, loop, once=("draw",), draw=_draw, setup=_setup,
      generator_step=_generator_step, student_step=_student_step)
  return IGA(init=functools.partial(_init_state, loop),
             round=functools.partial(_round, loop, programs))
