"""Membership inference on model uploads: loss threshold and offline LiRA.

Threat model (``docs/privacy.md``): the server holds every uploaded model
and population data disjoint from every client's.

* Loss threshold (Yeom et al. 2018): a candidate is a member when the
  model's cross-entropy on it is below a threshold; the score is ``-loss``.
* Offline LiRA (Carlini et al. 2022): "OUT" shadow models are trained with the
  engine's local update on random subsets of the attacker's population data,
  which must be disjoint from the candidates. A candidate's score is the
  standardised ``(phi - mu_out) / sigma_out`` of the target's logit-scaled
  confidence ``phi = log p_y - log(1 - p_y)`` under the shadows' fitted
  ``N(mu_out, sigma_out^2)``; it ranks as the paper's one-sided test does.
  With few shadows the paper fits one global ``sigma_out``.

The ``*_batched`` forms add the client axis through
:class:`fedjax_dd.core.clients.ClientMapper`.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.audit import _inputs
from fedjax_dd.audit.membership import FPRS, MIAResult, mia_metrics
from fedjax_dd.audit.membership import mia_metrics_batched
from fedjax_dd.core import checks
from fedjax_dd.core.clients import ClientMapper, RoundContext
from fedjax_dd.core.local import LocalTraining, make_local_update
from fedjax_dd.core.task import Classifier

PyTree = Any
BATCH = 256
"""Candidates per forward pass (bounds the activations' memory)."""


def _per_example(fn, task, params, batch_stats, x, y, batch):
  """``fn(log_probs [B, K], y [B]) -> [B]`` over ``x [N, ...]`` in batches."""

  def one(xy):
    logits, _ = task.apply(params, batch_stats, task.preprocess(xy[0][None]),
                           train=False)
    return fn(jax.nn.log_softmax(logits, -1), xy[1][None])[0]

  return jax.lax.map(one, (x, y), batch_size=batch)


def example_losses(task: Classifier, params: PyTree, batch_stats: PyTree,
                   x: jax.Array, y: jax.Array, *,
                   batch: int = BATCH) -> jax.Array:
  """``[N]`` the model's cross-entropy on each candidate (evaluation mode).

  Args:
    task: the classifier.
    params: its parameters.
    batch_stats: its BatchNorm statistics (``{}`` without BN).
    x: ``[N, H, W, Ch]`` uint8 candidates.
    y: ``[N]`` their labels.
    batch: candidates per forward pass.
  """
  nll = lambda lp, yb: -jnp.take_along_axis(lp, yb[:, None], -1)[:, 0]
  return _per_example(nll, task, params, batch_stats, x, y, batch)


def loss_scores(task: Classifier, params: PyTree, batch_stats: PyTree,
                x: jax.Array, y: jax.Array, *, batch: int = BATCH) -> jax.Array:
  """``[N]`` Yeom et al.'s membership scores, ``-loss`` (arguments as
  :func:`example_losses`): higher means more likely a member."""
  return -example_losses(task, params, batch_stats, x, y, batch=batch)


def confidence_logit(task: Classifier, params: PyTree, batch_stats: PyTree,
                     x: jax.Array, y: jax.Array, *,
                     batch: int = BATCH) -> jax.Array:
  """``[N]`` LiRA's ``phi = log p_y - log(1 - p_y)``, computed from the
  log-probabilities as ``log p_y - logsumexp_{k != y} log p_k`` (stable
  where ``p_y`` rounds to 1); arguments as :func:`example_losses`."""

  def phi(lp, yb):
    own = jnp.take_along_axis(lp, yb[:, None], -1)[:, 0]
    others = jnp.where(jax.nn.one_hot(yb, lp.shape[-1], dtype=bool), -jnp.inf,
                       lp)
    return own - jax.nn.logsumexp(others, -1)

  return _per_example(phi, task, params, batch_stats, x, y, batch)


def lira_offline_scores(target_phi: jax.Array, shadow_phi: jax.Array,
                        valid: jax.Array | None = None, *,
                        global_variance: bool = True) -> jax.Array:
  """``[N]`` offline LiRA scores ``(phi - mu_out) / sigma_out``.

  Args:
    target_phi: ``[N]`` :func:`confidence_logit` under the target model.
    shadow_phi: ``[K, N]`` the same under ``K >= 2`` OUT shadow models.
    valid: ``[N]`` bool, the candidates that pool into the global variance
      (default: all); padding rows.
    global_variance: one ``sigma_out`` for all candidates (from the mean
      of their variances), as Carlini et al. do with few shadows; else
      each candidate's own.

  Returns:
    ``[N]`` scores, higher meaning more likely a member.
  """
  mu = shadow_phi.mean(0)
  var = shadow_phi.var(0, ddof=1)
  if global_variance:
    w = (jnp.ones_like(var) if valid is None
         else valid.astype(var.dtype))
    var = jnp.full_like(var, (var * w).sum() / jnp.maximum(w.sum(), 1.0))
  return (target_phi - mu) / jnp.sqrt(var + 1e-12)


# Checks ----------------------------------------------------------------------


def _check_candidates(task, name, x, y, lead):
  sx = _inputs.shape(f"{name}_x", x, 4 + lead,
                     "images [" + "C, " * lead + "N, H, W, Ch]")
  _inputs.same(f"{name}_x", sx[lead + 1:], task.input_shape,
               "images of the task's input shape")
  _inputs.same(f"{name}_y", np.shape(y), sx[:lead + 1],
               "one label per candidate, shape")
  _inputs.labels(f"{name}_y", y, task.num_classes)
  if sx[lead] == 0:
    checks.refuse(f"{name}_x", "a non-empty set of images", sx)
  return sx


def _check_sets(task, members_x, members_y, nonmembers_x, nonmembers_y,
                num_members, num_nonmembers, lead):
  sm = _check_candidates(task, "members", members_x, members_y, lead)
  sn = _check_candidates(task, "nonmembers", nonmembers_x, nonmembers_y, lead)
  if not lead:
    return None
  if sn[0] != sm[0]:
    checks.refuse("nonmembers_x", f"[C, N', H, W, Ch] with the members' "
                  f"C = {sm[0]}", sn)
  return (_inputs.counts("num_members", num_members, sm[0], sm[1]),
          _inputs.counts("num_nonmembers", num_nonmembers, sm[0], sn[1]))


# Loss threshold --------------------------------------------------------------


def loss_threshold_mia(task: Classifier, params: PyTree, batch_stats: PyTree,
                       members_x: Any, members_y: Any, nonmembers_x: Any,
                       nonmembers_y: Any, *,
                       fprs: Sequence[float] = FPRS) -> MIAResult:
  """One model audited with the loss-threshold attack (Yeom et al. 2018).

  Args:
    task: the classifier.
    params: the uploaded (or global) model's parameters.
    batch_stats: its BatchNorm statistics (``{}`` without BN).
    members_x: ``[N, H, W, Ch]`` uint8 training images of the client.
    members_y: ``[N]`` their labels.
    nonmembers_x: ``[N', H, W, Ch]`` held-out images of the same classes.
    nonmembers_y: ``[N']`` their labels.
    fprs: FPRs of the reported TPRs, each in ``(0, 1)``.

  Returns:
    The :class:`~fedjax_dd.audit.membership.MIAResult`.

  Raises:
    fedjax_dd.core.checks.SettingError: an empty member or non-member set,
      images of another shape than the task's, labels outside ``[0, K)``, an
      FPR outside ``(0, 1)``.
  """
  fprs = _inputs.fprs(fprs)
  _check_sets(task, members_x, members_y, nonmembers_x, nonmembers_y, None,
              None, 0)
  scores = jax.jit(functools.partial(loss_scores, task))
  return mia_metrics(scores(params, batch_stats, members_x, members_y),
                     scores(params, batch_stats, nonmembers_x, nonmembers_y),
                     fprs=fprs)


def loss_threshold_mia_batched(task: Classifier, params: PyTree,
                               batch_stats: PyTree, members_x: Any,
                               members_y: Any, num_members: Any,
                               nonmembers_x: Any, nonmembers_y: Any,
                               num_nonmembers: Any, *,
                               shared_model: bool = False,
                               fprs: Sequence[float] = FPRS,
                               mapper: ClientMapper | None = None
                               ) -> list[MIAResult]:
  """:func:`loss_threshold_mia` of every client of padded stacks.

  Args:
    task: the classifier.
    params: the clients' uploaded models, leaves ``[C, ...]``; with
      ``shared_model``, one (global) model audited for every client.
    batch_stats: as ``params`` (``{}`` without BN).
    members_x: ``[C, N_max, H, W, Ch]`` the clients' training images.
    members_y: ``[C, N_max]`` their labels.
    num_members: ``[C]`` valid member rows.
    nonmembers_x: ``[C, N'_max, H, W, Ch]`` held-out images per client.
    nonmembers_y: ``[C, N'_max]`` their labels.
    num_nonmembers: ``[C]`` valid non-member rows.
    shared_model: ``params`` is one model broadcast to every client.
    fprs: as :func:`loss_threshold_mia`.
    mapper: the client-axis backend (default ``ClientMapper()``).

  Returns:
    ``C`` :class:`~fedjax_dd.audit.membership.MIAResult`, in client order.

  Raises:
    fedjax_dd.core.checks.SettingError: as :func:`loss_threshold_mia`, and
      counts outside ``[1, N_max]``.
  """
  fprs = _inputs.fprs(fprs)
  nm, nn = _check_sets(task, members_x, members_y, nonmembers_x,
                       nonmembers_y, num_members, num_nonmembers, 1)
  m = None if shared_model else 0
  scores = (mapper or ClientMapper()).map(functools.partial(loss_scores, task),
                                          (m, m, 0, 0))
  return mia_metrics_batched(
      scores(params, batch_stats, members_x, members_y), nm,
      scores(params, batch_stats, nonmembers_x, nonmembers_y), nn, fprs=fprs)


# Offline LiRA ----------------------------------------------------------------


def train_shadows(training: LocalTraining, key: jax.Array, pool_x: Any,
                  pool_y: Any, *, num_shadows: int, shadow_size: int,
                  num_steps: int, start: tuple[PyTree, PyTree] | None = None,
                  round_index: int = 0) -> tuple[PyTree, PyTree]:
  """Trains LiRA's OUT shadow models on the attacker's population data.

  Each shadow trains on ``shadow_size`` pool examples drawn without
  replacement, for ``num_steps`` steps of
  :func:`fedjax_dd.core.local.make_local_update`, as a cohort through
  ``training.mapper``.

  Args:
    training: the clients' local training (task, optimizer, batch size);
      shadows should train as the audited models did.
    key: the shadows' root key (shadow ``k``: ``fold_in(key, k)``).
    pool_x: ``[P, H, W, Ch]`` uint8 population images, disjoint from every
      candidate.
    pool_y: ``[P]`` their labels.
    num_shadows: ``K >= 2``.
    shadow_size: examples per shadow, ``<= P``.
    num_steps: local steps per shadow, ``<= training.max_steps``.
    start: ``(params, batch_stats)`` every shadow starts from, as a client
      starts from the server model; ``None``: each shadow's own init.
    round_index: the round the shadows train in (the schedule's argument).

  Returns:
    ``(params, batch_stats)`` with leaves ``[K, ...]``.

  Raises:
    fedjax_dd.core.checks.SettingError: counts out of range, images of
      another shape than the task's, labels outside ``[0, K)``.
  """
  task = training.task
  k = checks.check_int("num_shadows", num_shadows, 2)
  sp = _check_candidates(task, "pool", pool_x, pool_y, 0)
  size = checks.check_int("shadow_size", shadow_size, 1, sp[0],
                          fix="a shadow draws from the pool without "
                          "replacement")
  steps = checks.check_int("num_steps", num_steps, 1, training.max_steps,
                           fix="raise the LocalTraining's max_steps")
  local = make_local_update(training)

  def one_shadow(shadow_key, x, y, start):
    params, batch_stats = (task.init(jax.random.fold_in(shadow_key, 0))
                           if start is None else start)
    idx = jax.random.choice(jax.random.fold_in(shadow_key, 1), x.shape[0],
                            (size,), replace=False)
    ctx = RoundContext(round=jnp.int32(round_index), start_params=params,
                       start_batch_stats=batch_stats)
    result = local.run(params, batch_stats, local.optimizer.init(params),
                       x[idx], y[idx], jnp.int32(size), jnp.int32(steps),
                       jax.random.fold_in(shadow_key, 2), ctx)
    return result.params, result.batch_stats

  keys = jnp.stack([jax.random.fold_in(key, i) for i in range(k)])
  return training.mapper.map(one_shadow, (0, None, None, None))(
      keys, jnp.asarray(pool_x), jnp.asarray(pool_y), start)


def _shadow_phi(task, shadows, x, y, mapper):
  """``[K, N]`` :func:`confidence_logit` of ``x [N]`` under every shadow."""
  params, batch_stats = shadows
  return mapper.map(functools.partial(confidence_logit, task),
                    (0, 0, None, None))(params, batch_stats, x, y)


def lira_mia(task: Classifier, params: PyTree, batch_stats: PyTree,
             shadows: tuple[PyTree, PyTree], members_x: Any, members_y: Any,
             nonmembers_x: Any, nonmembers_y: Any, *,
             global_variance: bool = True, fprs: Sequence[float] = FPRS,
             mapper: ClientMapper | None = None) -> MIAResult:
  """One model audited with offline LiRA (Carlini et al. 2022).

  Args:
    task: the classifier.
    params: the target model's parameters.
    batch_stats: its BatchNorm statistics (``{}`` without BN).
    shadows: :func:`train_shadows`' ``(params, batch_stats)``, leaves
      ``[K, ...]``.
    members_x: ``[N, H, W, Ch]`` uint8 training images of the client.
    members_y: ``[N]`` their labels.
    nonmembers_x: ``[N', H, W, Ch]`` held-out images of the same classes.
    nonmembers_y: ``[N']`` their labels.
    global_variance: as :func:`lira_offline_scores`.
    fprs: FPRs of the reported TPRs, each in ``(0, 1)``.
    mapper: the backend over the shadows (default ``ClientMapper()``).

  Returns:
    The :class:`~fedjax_dd.audit.membership.MIAResult`.

  Raises:
    fedjax_dd.core.checks.SettingError: as :func:`loss_threshold_mia`, and
      fewer than 2 shadows.
  """
  fprs = _inputs.fprs(fprs)
  _check_sets(task, members_x, members_y, nonmembers_x, nonmembers_y, None,
              None, 0)
  _check_shadows(shadows)
  n = np.shape(members_x)[0]
  x = jnp.concatenate([jnp.asarray(members_x), jnp.asarray(nonmembers_x)])
  y = jnp.concatenate([jnp.asarray(members_y), jnp.asarray(nonmembers_y)])
  target = jax.jit(functools.partial(confidence_logit, task))(
      params, batch_stats, x, y)
  shadow = _shadow_phi(task, shadows, x, y, mapper or ClientMapper())
  scores = jax.jit(functools.partial(lira_offline_scores,
                                     global_variance=global_variance))(
                                         target, shadow)
  return mia_metrics(scores[:n], scores[n:], fprs=fprs)


def _check_shadows(shadows):
  leaves = jax.tree_util.tree_leaves(shadows)
  if not leaves or leaves[0].ndim == 0 or leaves[0].shape[0] < 2:
    checks.refuse("shadows", "train_shadows' (params, batch_stats) of at "
                  "least 2 shadows", [np.shape(a) for a in leaves[:1]])


def lira_mia_batched(task: Classifier, params: PyTree, batch_stats: PyTree,
                     shadows: tuple[PyTree, PyTree], members_x: Any,
                     members_y: Any, num_members: Any, nonmembers_x: Any,
                     nonmembers_y: Any, num_nonmembers: Any, *,
                     shared_model: bool = False,
                     global_variance: bool = True,
                     fprs: Sequence[float] = FPRS,
                     mapper: ClientMapper | None = None) -> list[MIAResult]:
  """:func:`lira_mia` of every client of padded stacks, one set of shadows.

  Args:
    task: the classifier.
    params: the clients' uploaded models, leaves ``[C, ...]`` (one model
      with ``shared_model``).
    batch_stats: as ``params``.
    shadows: :func:`train_shadows`' output, leaves ``[K, ...]``.
    members_x: ``[C, N_max, H, W, Ch]`` the clients' training images.
    members_y: ``[C, N_max]`` their labels.
    num_members: ``[C]`` valid member rows.
    nonmembers_x: ``[C, N'_max, H, W, Ch]`` held-out images per client.
    nonmembers_y: ``[C, N'_max]`` their labels.
    num_nonmembers: ``[C]`` valid non-member rows.
    shared_model: ``params`` is one model broadcast to every client.
    global_variance: as :func:`lira_offline_scores` (pooled per client,
      over its valid candidates).
    fprs: as :func:`lira_mia`.
    mapper: the backend over the clients and the shadows (default
      ``ClientMapper()``).

  Returns:
    ``C`` :class:`~fedjax_dd.audit.membership.MIAResult`, in client order.

  Raises:
    fedjax_dd.core.checks.SettingError: as :func:`lira_mia`, and counts
      outside ``[1, N_max]``.
  """
  fprs = _inputs.fprs(fprs)
  nm, nn = _check_sets(task, members_x, members_y, nonmembers_x,
                       nonmembers_y, num_members, num_nonmembers, 1)
  _check_shadows(shadows)
  mapper = mapper or ClientMapper()
  c, n_max = np.shape(members_x)[:2]
  x = jnp.concatenate([jnp.asarray(members_x), jnp.asarray(nonmembers_x)], 1)
  y = jnp.concatenate([jnp.asarray(members_y), jnp.asarray(nonmembers_y)], 1)
  rows = np.arange(x.shape[1])
  valid = (rows[None] < nm[:, None]) | (
      (rows[None] >= n_max) & (rows[None] - n_max < nn[:, None]))
  m = None if shared_model else 0
  target = mapper.map(functools.partial(confidence_logit, task),
                      (m, m, 0, 0))(params, batch_stats, x, y)
  shadow = _shadow_phi(task, shadows, x.reshape(-1, *x.shape[2:]),
                       y.reshape(-1), mapper)
  shadow = jnp.moveaxis(shadow.reshape(shadow.shape[0], c, -1), 0, 1)
  scores = mapper.map(functools.partial(lira_offline_scores,
                                        global_variance=global_variance),
                      (0, 0, 0))(target, shadow, jnp.asarray(valid))
  return mia_metrics_batched(scores[:, :n_max], nm, scores[:, n_max:], nn,
                             fprs=fprs)
