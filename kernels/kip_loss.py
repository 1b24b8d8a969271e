"""The Kernel Inducing Points (KIP) loss for ONE client.

KIP (Nguyen et al., "Dataset Meta-Learning from Kernel Ridge-Regression",
ICLR 2021; "Dataset Distillation with Infinitely Wide Convolutional
Networks", NeurIPS 2021) learns a small support set ``(x_s, y_s)`` whose
kernel ridge regression predicts a target set ``(x_t, y_t)`` well. FedD3
(Song et al., Eq. 4) and HFLDD (Eq. 1) run it on every client's data.
:func:`kip_loss` is pure, jit-able, ``jax.vmap``-able over a client axis
and differentiable in ``x_support`` and ``y_support`` (learned labels).

Padding. Per-client sets are padded to a common size; ``support_mask`` and
``target_mask`` keep padded rows out of the regression and of the loss
exactly (the masked result equals the unpadded one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import flax
import jax
import jax.numpy as jnp

from fedjax_dd.kernels import krr


@flax.struct.dataclass
class KIPAux:
  """Auxiliary outputs of :func:`kip_loss` (leading ``[C]`` under vmap).

  Attributes:
    pred: KRR prediction on the target set ``[n_t, K]``.
    accuracy: fraction of (unmasked) targets whose ``argmax`` of ``pred``
      equals the ``argmax`` of ``y_target``; scalar.
    krr: diagnostics of the KRR solve (:class:`krr.KRRInfo`).
  """
  pred: jax.Array
  accuracy: jax.Array
  krr: krr.KRRInfo


def one_hot_labels(
    y: jax.Array,
    num_classes: int,
    centered: bool = False,
    *,
    dtype=jnp.float32,
) -> jax.Array:
  """Integer labels to one-hot regression targets.

  ``centered=True`` is KIP's convention, ``one_hot - 1 / num_classes`` (rows
  sum to 0). Labels outside ``[0, num_classes)`` are not checked (this stays
  jit-able) and give rows of zeros, or ``-1 / num_classes`` centred.

  Args:
    y: integer labels ``[n]`` (any leading shape ``[...]``).
    num_classes: number of classes K, >= 1.
    centered: subtract ``1 / num_classes``.
    dtype: output float dtype.

  Returns:
    ``[..., K]`` array of ``dtype``.

  Raises:
    ValueError: if ``num_classes < 1`` or ``y`` is not integer.
  """
  if not isinstance(num_classes, int) or num_classes < 1:
    raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}.")
  y = jnp.asarray(y)
  if not jnp.issubdtype(y.dtype, jnp.integer):
    raise ValueError(f"y must hold integer labels, got dtype {y.dtype}.")
  out = jax.nn.one_hot(y, num_classes, dtype=dtype)
  if centered:
    out = out - jnp.asarray(1.0 / num_classes, dtype)
  return out


def _check_mask(mask, n: int, name: str) -> jax.Array | None:
  if mask is None:
    return None
  mask = jnp.asarray(mask)
  if mask.shape != (n,):
    raise ValueError(f"{name} must have shape [{n}], got {mask.shape}.")
  return mask.astype(bool)


def kip_loss(
    kernel_fn: Callable[[jax.Array, jax.Array], jax.Array],
    x_support: jax.Array,
    y_support: jax.Array,
    x_target: jax.Array,
    y_target: jax.Array,
    reg: float | jax.Array = 1e-6,
    *,
    support_mask: jax.Array | None = None,
    target_mask: jax.Array | None = None,
    use_float64: bool = False,
    jitter_ladder: Sequence[float] = krr.DEFAULT_JITTER_LADDER,
) -> tuple[jax.Array, KIPAux]:
  """KIP loss of a support set on a target set, for one client.

  ``pred = K_ts (K_ss + reg * tr(K_ss) / n_s * I)^{-1} y_s`` (see
  :func:`krr.krr_predict`, including its NaN-safe jitter ladder) and

      loss = 0.5 * mean_t ||y_t - pred_t||_2^2,

  the squared error summed over the K labels and averaged over the
  (unmasked) targets: K times the KIP reference code's ``0.5 * mean((y -
  pred)**2)``, with the same minimiser.

  Masks. Masked support points are removed exactly: their rows/columns of
  ``K_ss`` become an identity block scaled by the mean valid diagonal (so
  ``tr(K_ss) / n_s`` is the unpadded value), their ``K_ts`` columns and
  labels are zeroed. Masked targets get weight 0; with no valid target the
  loss and accuracy are 0.

  Args:
    kernel_fn: ``k(x1, x2) -> [n1, n2]``, e.g. from
      :func:`fedjax_dd.kernels.ntk.fc_kernel`; differentiable for
      gradients w.r.t. ``x_support``.
    x_support: support inputs ``[n_s, ...]`` (e.g. ``[n_s, H, W, Ch]``).
    y_support: support labels ``[n_s, K]`` (one-hot, centred or learned).
    x_target: target inputs ``[n_t, ...]``, same per-example shape.
    y_target: target labels ``[n_t, K]``.
    reg: relative ridge, >= 0.
    support_mask: optional ``[n_s]`` bool, True for real support points.
    target_mask: optional ``[n_t]`` bool, True for real targets.
    use_float64: solve in float64 (needs ``jax_enable_x64``).
    jitter_ladder: see :func:`krr.krr_predict`.

  Returns:
    ``(loss, aux)``: scalar loss and a :class:`KIPAux`.

  Raises:
    ValueError: on inconsistent shapes (at trace time).
  """
  x_support, x_target = jnp.asarray(x_support), jnp.asarray(x_target)
  y_support, y_target = jnp.asarray(y_support), jnp.asarray(y_target)
  if y_support.ndim != 2 or y_target.ndim != 2:
    raise ValueError(f"y_support and y_target must be [n, K], got "
                     f"{y_support.shape} and {y_target.shape}; convert "
                     f"integer labels with one_hot_labels.")
  n_s, n_t = x_support.shape[0], x_target.shape[0]
  if y_support.shape[0] != n_s or y_target.shape[0] != n_t:
    raise ValueError(f"inputs and labels disagree: x_support {n_s} vs "
                     f"y_support {y_support.shape[0]}, x_target {n_t} vs "
                     f"y_target {y_target.shape[0]}.")
  if y_support.shape[1] != y_target.shape[1]:
    raise ValueError(f"y_support has {y_support.shape[1]} label dims but "
                     f"y_target has {y_target.shape[1]}.")
  if x_support.shape[1:] != x_target.shape[1:]:
    raise ValueError(f"x_support and x_target per-example shapes differ: "
                     f"{x_support.shape[1:]} vs {x_target.shape[1:]}.")
  s_mask = _check_mask(support_mask, n_s, "support_mask")
  t_mask = _check_mask(target_mask, n_t, "target_mask")

  k_ss = kernel_fn(x_support, x_support)
  k_ts = kernel_fn(x_target, x_support)
  if k_ss.shape != (n_s, n_s) or k_ts.shape != (n_t, n_s):
    raise ValueError(f"kernel_fn returned {k_ss.shape} and {k_ts.shape}, "
                     f"expected ({n_s}, {n_s}) and ({n_t}, {n_s}).")
  y_s = y_support.astype(jnp.result_type(k_ss.dtype, y_support.dtype))

  if s_mask is not None:
    pair = s_mask[:, None] & s_mask[None, :]
    diag = jnp.diagonal(k_ss)
    valid = jnp.sum(s_mask)
    diag_mean = (jnp.sum(jnp.where(s_mask, diag, 0)) /
                 jnp.maximum(valid, 1).astype(k_ss.dtype))
    fill = jnp.where(s_mask, 0, diag_mean).astype(k_ss.dtype)
    # `where`, not multiplication, so a NaN kernel value on a padded point
    # cannot leak into the solve.
    k_ss = jnp.where(pair, k_ss, 0) + jnp.diag(fill)
    k_ts = jnp.where(s_mask[None, :], k_ts, 0)
    y_s = jnp.where(s_mask[:, None], y_s, 0)

  pred, info = krr.krr_predict(k_ss, k_ts, y_s, reg, use_float64=use_float64,
                               jitter_ladder=jitter_ladder, return_info=True)

  sq = 0.5 * jnp.sum((y_target - pred) ** 2, axis=-1)
  correct = (jnp.argmax(pred, axis=-1) ==
             jnp.argmax(y_target, axis=-1)).astype(sq.dtype)
  if t_mask is None:
    loss, accuracy = jnp.mean(sq), jnp.mean(correct)
  else:
    denom = jnp.maximum(jnp.sum(t_mask), 1).astype(sq.dtype)
    loss = jnp.sum(jnp.where(t_mask, sq, 0)) / denom
    accuracy = jnp.sum(jnp.where(t_mask, correct, 0)) / denom
  return loss, KIPAux(pred=pred, accuracy=accuracy, krr=info)
