"""FedHydra's model stratification (Alg. 2) and stratified aggregation (Alg. 3).

Stratification measures how well each client model ``k`` "knows" each class
``j``: a freshly initialised generator is trained for ``T_G`` steps to make
client ``k`` predict ``j`` and its cross-entropy curve ``L_kj`` is recorded.
A client that learned class ``j`` is easy to drive there, so its loss falls a
long way relative to where it ends (Eq. 2):

    ``u_kj = (max L_kj − min L_kj) / min L_kj``.

The ``c × m`` matrix ``U[j, k] = u_kj`` is normalised two ways:

* ``U_r`` by rows (Eqs. 4–5): ``U_r[j, k] = u_kj / Σ_k' u_k'j``, how much
  of class ``j``'s expertise sits with client ``k``;
* ``U_c`` by columns (Eqs. 6–7): ``U_c[j, k] = u_kj / Σ_j' u_kj'``, how
  client ``k``'s expertise is spread over the classes.

Stratified aggregation (SA, Eqs. 8–11) of teacher logits ``P_k [B, c]`` on
samples with target labels ``y``:

    ``P̂_k = P_k ⊙ U_c[:, k]``  and  ``P_i = Σ_k U_r[y_i, k] · P̂_k[i]``.

Reference: Bai et al., "A Unified Solution to Diverse Heterogeneities in
One-Shot Federated Learning" (FedHydra), Sec. 3.2–3.3, Algs. 2–3, Eqs. 2–11.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dd.core.clients import ClientMapper, once_jit
from fedjax_dd.distill.ensemble import TeacherGroup, TeacherVars, check_groups
from fedjax_dd.distill.ensemble import average_ensemble, make_teacher_fn

PyTree = Any
tree_map = jax.tree_util.tree_map

MIN_LOSS_FLOOR = 1e-6
"""Lower bound on ``min L_kj`` in Eq. 2.

Cross-entropy in float32 can underflow to exactly 0 when a teacher becomes
certain; the ratio then tends to infinity, i.e. client ``k`` is the expert for
class ``j``. Flooring the denominator keeps that meaning (``u_kj`` becomes
very large, so ``U_r`` gives client ``k`` nearly all of class ``j``) while
staying finite.
"""


class Stratification(NamedTuple):
  """The result of Algorithm 2.

  Attributes:
    curves: ``[m, c, T_G]`` generator CE loss of client ``k`` towards class
      ``j`` before each step.
    u: ``[c, m]`` the matrix ``U`` (Eq. 2, transposed to classes × clients).
    u_r: ``[c, m]`` row-normalised ``U`` (Eqs. 4–5).
    u_c: ``[c, m]`` column-normalised ``U`` (Eqs. 6–7).
  """
  curves: jax.Array
  u: jax.Array
  u_r: jax.Array
  u_c: jax.Array


def uncertainty(curves: jax.Array, *, floor: float = MIN_LOSS_FLOOR) -> jax.Array:
  """``U [c, m]`` from loss curves ``[m, c, T]`` (Eq. 2).

  ``min L`` is floored at ``floor`` (see :data:`MIN_LOSS_FLOOR`); a
  non-finite curve (a diverged training) gives ``u_kj = 0``, i.e. no
  evidence that client ``k`` knows class ``j``.
  """
  hi = jnp.max(curves, axis=-1)
  lo = jnp.min(curves, axis=-1)
  u = (hi - lo) / jnp.maximum(lo, floor)
  u = jnp.where(jnp.isfinite(u), u, 0.0)
  return jnp.transpose(u)


def normalise_rows(u: jax.Array) -> jax.Array:
  """``U_r``: each class row sums to 1 over clients (Eqs. 4–5).

  An all-zero row (no client shows any expertise for the class) becomes the
  uniform ``1/m``, i.e. SA falls back to the plain average for that class.
  """
  m = u.shape[1]
  s = jnp.sum(u, axis=1, keepdims=True)
  return jnp.where(s > 0, u / jnp.where(s > 0, s, 1.0), 1.0 / m)


def normalise_cols(u: jax.Array) -> jax.Array:
  """``U_c``: each client column sums to 1 over classes (Eqs. 6–7).

  An all-zero column becomes the uniform ``1/c``, which scales that client's
  logits uniformly.
  """
  c = u.shape[0]
  s = jnp.sum(u, axis=0, keepdims=True)
  return jnp.where(s > 0, u / jnp.where(s > 0, s, 1.0), 1.0 / c)


def stratification_from_curves(curves: jax.Array,
                                floor: float = MIN_LOSS_FLOOR) -> Stratification:
  """``U``, ``U_r`` and ``U_c`` from the loss curves ``[m, c, T]``."""
  u = uncertainty(curves, floor=floor)
  return Stratification(curves=curves, u=u, u_r=normalise_rows(u),
                        u_c=normalise_cols(u))


def class_shares(class_counts: np.ndarray) -> np.ndarray:
  """The ``U_r`` an oracle would give: ``S[j, k] = n_kj / Σ_k' n_k'j``.

  Args:
    class_counts: ``[m, c]`` examples of class ``j`` held by client ``k``.

  Returns:
    ``[c, m]`` float64; a class nobody holds gets an all-zero row.
  """
  counts = np.asarray(class_counts, np.float64).T
  return counts / np.maximum(counts.sum(1, keepdims=True), 1.0)


def agreement_with_class_shares(u_r: np.ndarray, class_counts: np.ndarray
                                 ) -> dict[str, float]:
  """How well ``U_r`` recovers the clients' true class shares (host side).

  A diagnostic on simulated partitions, against :func:`class_shares`.

  Args:
    u_r: ``[c, m]`` from :func:`normalise_rows`.
    class_counts: ``[m, c]`` examples of class ``j`` held by client ``k``.

  Returns:
    ``correlation``: Pearson correlation of ``U_r`` and ``S`` over all
    entries (NaN if either is constant); ``argmax_agreement``: fraction of
    the classes held by anyone whose largest ``U_r`` entry is a client
    holding the most examples of that class.
  """
  u_r = np.asarray(u_r, np.float64)
  share = class_shares(class_counts)  # [c, m]
  if share.shape != u_r.shape:
    raise ValueError(f"class_counts {np.shape(class_counts)} does not match "
                     f"U_r {u_r.shape} (expected [m, c] for U_r [c, m]).")
  held = share.sum(1) > 0
  share = share[held]
  a, b = u_r[held].ravel(), share.ravel()
  corr = (float(np.corrcoef(a, b)[0, 1]) if a.std() > 0 and b.std() > 0
          else float("nan"))
  top = share == share.max(1, keepdims=True)
  hit = top[np.arange(share.shape[0]), u_r[held].argmax(1)]
  return {"correlation": corr, "argmax_agreement": float(hit.mean())}


def stratified_ensemble(logits: jax.Array, y: jax.Array,
                        ctx: tuple[jax.Array, jax.Array]) -> jax.Array:
  """Stratified aggregation (Eqs. 8–11), a ``combine`` function for DFKD.

  Args:
    logits: teacher logits ``[m, B, c]`` in client order.
    y: target labels ``[B]``.
    ctx: ``(U_r [c, m], U_c [c, m])``.

  Returns:
    Ensemble logits ``[B, c]`` (module doc).
  """
  u_r, u_c = ctx
  scaled = logits * jnp.transpose(u_c)[:, None, :]  # P̂_k [m, B, c]
  weights = jnp.transpose(u_r[y])                   # [m, B]
  # A weighted sum, not an einsum: XLA:CPU's oneDNN rewriter crashes
  # constant-folding a dot operand that depends on in-program random labels.
  return jnp.sum(weights[:, :, None] * scaled, axis=0)


def stratified_ensemble_predicted(logits: jax.Array, y: jax.Array,
                                  ctx: tuple[jax.Array, jax.Array]
                                  ) -> jax.Array:
  """SA whose Eq. 10 rows follow the ensemble's prediction, not the target.

  Eq. 10 weights client ``k`` by ``U_r(y(i), k)``, the row of the
  generator's *target* label, so under strong skew the ensemble can name
  ``y(i)`` whatever the image and the generator needs no class content
  (``experiments/results/fedhydra_tab1_mnist_a0.01_gpu.md``).
  Here the row is ``V(i) = σ(mean_k P_k(i)) · U_r`` (held constant like the
  paper's ``U_r(y(i))``), so nothing reads ``y``. Not the paper's rule:
  ``dfkd.aggregation=sa_predicted``.

  Args:
    logits: teacher logits ``[m, B, c]`` in client order.
    y: target labels ``[B]`` (unused).
    ctx: ``(U_r [c, m], U_c [c, m])``.

  Returns:
    Ensemble logits ``[B, c]``: ``P_i = Σ_k V[i, k] · (P_k ⊙ U_c[:, k])[i]``.
  """
  del y
  u_r, u_c = ctx
  probs = jax.lax.stop_gradient(jax.nn.softmax(jnp.mean(logits, 0), -1))
  # A weighted sum rather than a dot, as in stratified_ensemble.
  weights = jnp.sum(probs[:, :, None] * u_r[None], axis=1)  # [B, m]
  scaled = logits * jnp.transpose(u_c)[:, None, :]           # [m, B, c]
  return jnp.sum(jnp.transpose(weights)[:, :, None] * scaled, axis=0)


def target_naming_rate(combine: Callable[..., jax.Array], logits: jax.Array,
                       labels: jax.Array, ctx: Any, num_classes: int
                       ) -> jax.Array:
  """How often an ensemble rule names a target label that is not the truth.

  For every sample ``i`` and target ``t != labels[i]``, whether
  ``argmax combine(logits, t) == t``; a rule that reads the target (Eq. 10's
  rows) names it more often than one that ignores it.

  Args:
    combine: an ensemble rule ``(logits [m, B, c], y [B], ctx) -> [B, c]``.
    logits: teacher logits ``[m, B, c]`` on real, labelled samples.
    labels: their true labels ``[B]``.
    ctx: the rule's context.
    num_classes: ``c``.

  Returns:
    The fraction over the ``B · (c − 1)`` (sample, wrong target) pairs.
  """
  return (_naming_hits(combine, logits, labels, ctx, num_classes)
          / (labels.shape[0] * (num_classes - 1)))


def _naming_hits(combine, logits, labels, ctx, num_classes):
  """:func:`target_naming_rate`'s numerator: the (sample, wrong target)
  pairs on which the rule names the target."""
  def named(t):
    target = jnp.full(labels.shape, t, labels.dtype)
    hit = jnp.argmax(combine(logits, target, ctx), -1) == t
    return jnp.sum(jnp.where(labels != t, hit, False))

  return jnp.sum(jnp.stack([named(t) for t in range(num_classes)]))


def target_naming_rates(groups: Sequence[TeacherGroup],
                        teacher_vars: TeacherVars, u_r: Any, u_c: Any,
                        x01: jax.Array, labels: jax.Array,
                        mapper: ClientMapper = ClientMapper()
                        ) -> dict[str, float]:
  """:func:`target_naming_rate` of SA, SA-predicted and the plain average.

  Args:
    groups: the teachers' architecture groups.
    teacher_vars: their stacked variables, one ``(params, batch_stats)`` per
      group.
    u_r: ``U_r [c, m]``.
    u_c: ``U_c [c, m]`` (its scale does not change an arg-max).
    x01: images ``[P, H, W, Ch]`` in ``[0, 1]``.
    labels: their labels ``[P]``.
    mapper: batching of the teachers.

  Returns:
    ``{"sa": ..., "sa_predicted": ..., "ae": ...}``.
  """
  logits, _ = jax.jit(make_teacher_fn(groups, mapper))(
      teacher_vars, jnp.asarray(x01))
  ctx = (jnp.asarray(u_r, jnp.float32), jnp.asarray(u_c, jnp.float32))
  labels = jnp.asarray(labels, jnp.int32)
  rules = {"sa": stratified_ensemble,
           "sa_predicted": stratified_ensemble_predicted,
           "ae": average_ensemble}
  # The counts in one program (op by op compiles dozens of small ones); the
  # division op by op as in target_naming_rate (a compiled division by a
  # constant may round differently).
  hits = jax.jit(lambda logits, labels, ctx: {
      name: _naming_hits(rule, logits, labels, ctx, logits.shape[-1])
      for name, rule in rules.items()})(logits, labels, ctx)
  pairs = labels.shape[0] * (logits.shape[-1] - 1)
  return {name: float(hits[name] / pairs) for name in rules}


def sa_context(s: Stratification, *, average_scale: bool = True
               ) -> tuple[jax.Array, jax.Array]:
  """The ``ctx`` of :func:`stratified_ensemble` for a stratification.

  Taken literally, Eqs. 6–11 shrink the ensemble logits by about ``c``
  (``U_c``'s columns sum to 1), which keeps the generator's ``CE(P, y)``
  high (``experiments/results/fedhydra_cpu_presets.md``). With
  ``average_scale`` (default) ``U_c`` is multiplied by ``c``: a
  uniform rescale that keeps every ratio and arg-max of Eqs. 8–11 and makes
  SA equal the plain average when ``U`` is uninformative.

  Args:
    s: the result of Alg. 2.
    average_scale: rescale ``U_c`` by ``c`` (``False``: Eqs. 6–7 literally).

  Returns:
    ``(U_r, U_c')``, both ``[c, m]``.
  """
  c = s.u_c.shape[0]
  return (s.u_r, s.u_c * c if average_scale else s.u_c)


def make_stratifier(groups: Sequence[TeacherGroup],
                    generator: nn.Module,
                    *,
                    num_classes: int,
                    steps: int = 30,
                    batch_size: int = 64,
                    optimizer: optax.GradientTransformation = optax.adam(1e-3, b1=0.5),
                    mapper: ClientMapper = ClientMapper(workload="stratify")
                    ) -> Callable[[TeacherVars, jax.Array], Stratification]:
  """Builds Algorithm 2 over all ``(client, class)`` pairs.

  For each pair a generator is initialised from its own key, one noise batch
  ``z [batch_size, nz]`` is drawn, and ``steps`` Adam steps minimise
  ``CE(F_k(G(z)), j)``; the loss before each step is recorded. Each step of
  all pairs of one architecture is ONE mapped program, called ``steps``
  times from the host. Every backend computes the same curves, up to float
  rounding.

  Args:
    groups: the client models, one :class:`TeacherGroup` per architecture.
    generator: an unconditional generator module (``nz`` attribute).
    num_classes: ``c``.
    steps: ``T_G`` [30].
    batch_size: noise samples per step.
    optimizer: [Adam, lr 1e-3, β1 = 0.5 as in the reference code].
    mapper: how the pairs are batched (its ``workload`` picks the ``"auto"``
      backend; ``"stratify"`` by default).

  Returns:
    ``stratify(teacher_vars, key) -> Stratification``; pair ``(k, j)`` uses
    ``fold_in(key, k * c + j)``, so the result does not depend on grouping or
    backend.

  Raises:
    ValueError: ``steps < 2`` (a loss curve needs a slope) or
      ``batch_size < 1``.
  """
  if steps < 2:
    raise ValueError(f"A loss curve needs steps >= 2, got {steps}.")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
  groups = tuple(groups)
  m, _ = check_groups(groups)
  nz = int(getattr(generator, "nz"))
  c = num_classes

  def draw(key):
    init_key, z_key = jax.random.split(key)
    z = jax.random.normal(z_key, (batch_size, nz), jnp.float32)
    variables = generator.init(init_key, z[:1], train=False)
    return z, variables["params"], variables.get("batch_stats", {})

  # Noise and fresh generators come from a separate program: XLA:CPU's
  # oneDNN rewriter aborts on dot operands computed from PRNG bits.
  draw_all = once_jit(jax.vmap(draw))

  def pair_step(params, batch_stats, label, z, gp, gs, opt_state, task,
                input_fn):
    """One Adam step of one pair's generator; returns the loss before it."""
    y = jnp.full((batch_size,), label, jnp.int32)

    def loss_fn(gp):
      x, upd = generator.apply({"params": gp, "batch_stats": gs}, z,
                               train=True, mutable=["batch_stats"])
      logits, _ = task.apply(params, batch_stats, input_fn(x), train=False)
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
      return ce, upd["batch_stats"]

    (loss, gs), g = jax.value_and_grad(loss_fn, has_aux=True)(gp)
    updates, opt_state = optimizer.update(g, opt_state, gp)
    return optax.apply_updates(gp, updates), gs, opt_state, loss

  # The T_G steps are a host loop: XLA:CPU runs generator steps slower in a
  # lax.scan and unrolling is slow to compile (experiments/perf_notes.md).
  mapped = tuple(
      mapper.map(lambda p, s, j, z, gp, gs, o, g=g: pair_step(
          p, s, j, z, gp, gs, o, g.task, g.input_fn),
                 in_axes=(0, 0, 0, 0, 0, 0, 0)) for g in groups)
  init_opt = jax.jit(jax.vmap(optimizer.init))

  def stratify(teacher_vars: TeacherVars, key: jax.Array) -> Stratification:
    curves = np.zeros((m, c, steps), np.float32)
    for fn, g, (params, stats) in zip(mapped, groups, teacher_vars):
      mg = len(g.client_ids)
      ids = np.asarray(g.client_ids)
      # Pair p = (teacher p // c, class p % c) of this group.
      rep = lambda a: jnp.repeat(a, c, axis=0)
      labels = jnp.tile(jnp.arange(c, dtype=jnp.int32), mg)
      pair_ids = jnp.asarray((ids[:, None] * c + np.arange(c)).reshape(-1))
      keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(pair_ids)
      z, gp, gs = draw_all(keys)
      opt_state = init_opt(gp)
      params_r, stats_r = tree_map(rep, params), tree_map(rep, stats)
      losses = []
      for _ in range(steps):
        gp, gs, opt_state, loss = fn(params_r, stats_r, labels, z, gp, gs,
                                     opt_state)
        losses.append(loss)
      out = jnp.stack(jax.device_get(losses), axis=-1)  # [mg * c, steps]
      curves[ids] = np.asarray(out).reshape(mg, c, steps)
    return stratification_from_curves(jnp.asarray(curves))

  return stratify
