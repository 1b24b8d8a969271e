"""Shared building blocks for the model zoo.

Pooling with window equal to stride is reshape + reduction rather than
``lax.reduce_window``, whose max-pool gradient (select-and-scatter) is slow
on CPU (experiments/perf_notes.md). Values equal VALID pooling: trailing
rows/columns that do not fill a window are cropped.

Convolutions have three formulations, picked by a model's layer set's
``conv_impl`` (:class:`LayerSet`, :func:`conv`): ``"lax"``
(``lax.conv_general_dilated``, flax's default), ``"patches"``
(:func:`patches_conv_general_dilated`, im2col + one matmul) and
``"forward"`` (:func:`forward_conv_general_dilated`, both gradients as
forward convolutions). All compute the same function with the same
parameters; which is faster depends on platform and jax version. With
``lax`` a layer can also choose its kernel gradient
(:func:`lax_conv_custom_weight_grad`). Defaults (``"auto"`` and the
``None`` fields here) are decided only by :mod:`fedjax_dd.policy`.

:class:`Conv` and :class:`InstanceNorm` have the parameters of ``nn.Conv``
and ``nn.InstanceNorm`` (names, shapes, initial values) and compute the same
functions in forms faster on CPU.
"""

import dataclasses
import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fedjax_dd import policy

# PyTorch's BatchNorm defaults (momentum 0.1 for the *new* batch, eps 1e-5),
# which the reference implementations of FedD3/HFLDD/FedHydra use. Flax's
# default momentum 0.99 would make running statistics lag badly behind the few
# local steps a federated client takes per round.
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5


# The layout of every convolution here: NHWC input, HWIO kernel, NHWC output.
_NHWC = ("NHWC", "HWIO", "NHWC")

# Names accepted by a model's ``conv_impl`` field and ``model.conv_impl``.
CONV_IMPLS = ("auto", "lax", "patches", "forward")


def resolve_conv_impl(conv_impl: str = "auto",
                      platform: str | None = None,
                      jax_version: str | None = None,
                      model: str | None = None) -> str:
  """The concrete convolution formulation for ``conv_impl``.

  Args:
    conv_impl: One of :data:`CONV_IMPLS`; all but ``"auto"`` are returned
      unchanged.
    platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``; default JAX's default
      backend. Only read for ``"auto"``.
    jax_version: e.g. ``"0.10.2"``; default the running ``jax.__version__``.
    model: The class name of the model whose convolutions these are; some
      models have their own form (:func:`fedjax_dd.policy.conv_form`).

  Returns:
    ``"lax"``, ``"patches"`` or ``"forward"``; for ``"auto"`` the policy's
    form.

  Raises:
    ValueError: If ``conv_impl`` is not one of :data:`CONV_IMPLS`.
  """
  if conv_impl not in CONV_IMPLS:
    raise ValueError(f"Unknown conv_impl {conv_impl!r}; expected one of "
                     f"{CONV_IMPLS}.")
  if conv_impl != "auto":
    return conv_impl
  return policy.conv_form(model, policy.lookup(platform, jax_version))


def patches_conv_general_dilated(
    lhs: jax.Array,
    rhs: jax.Array,
    window_strides: Sequence[int],
    padding: str | Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    dimension_numbers: Any = None,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
    precision: Any = None,
    preferred_element_type: Any = None,
) -> jax.Array:
  """``lax.conv_general_dilated`` as patch extraction + one matmul (im2col).

  A drop-in for flax's ``nn.Conv(conv_general_dilated=...)``: receptive
  fields ``[B, Ho, Wo, kh * kw * Ch]`` dotted with the kernel
  ``[kh * kw * Ch, O]``. Why: on XLA:CPU of newer jax the direct (above all
  the vmapped, grouped) convolution is much slower than a matmul of the same
  FLOPs. Agrees with ``lax.conv_general_dilated`` to float rounding.

  Args:
    lhs: Input ``[B, H, W, Ch]`` (NHWC).
    rhs: Kernel ``[kh, kw, Ch, O]`` (HWIO).
    window_strides: Strides ``(sh, sw)``.
    padding: ``"SAME"``, ``"VALID"`` (any string ``lax`` accepts) or explicit
      ``((lo_h, hi_h), (lo_w, hi_w))``.
    lhs_dilation: Input dilation ``(dh, dw)`` or None (1).
    rhs_dilation: Kernel dilation ``(dh, dw)`` or None (1).
    dimension_numbers: NHWC/HWIO/NHWC, as flax passes (None, lax's NCHW
      default, is refused).
    feature_group_count: Must be 1.
    batch_group_count: Must be 1.
    precision: ``lax.Precision`` of the matmul.
    preferred_element_type: Accumulation/output dtype of the matmul.

  Returns:
    Output ``[B, Ho, Wo, O]`` as ``lax.conv_general_dilated`` would give.

  Raises:
    NotImplementedError: For grouped convolutions, layouts other than
      NHWC/HWIO/NHWC or spatial ranks other than 2.
  """
  if feature_group_count != 1 or batch_group_count != 1:
    raise NotImplementedError(
        "patches_conv_general_dilated supports only feature_group_count=1 "
        f"and batch_group_count=1, got {feature_group_count} and "
        f"{batch_group_count}; use conv_impl='lax'.")
  if lhs.ndim != 4 or rhs.ndim != 4:
    raise NotImplementedError(
        "patches_conv_general_dilated supports only 2-D convolutions (rank-4 "
        f"input and kernel), got shapes {lhs.shape} and {rhs.shape}; use "
        "conv_impl='lax'.")
  if not _is_nhwc(lhs, rhs, dimension_numbers):
    raise NotImplementedError(
        "patches_conv_general_dilated supports only NHWC inputs, HWIO "
        f"kernels and NHWC outputs, got dimension_numbers "
        f"{dimension_numbers!r}; use conv_impl='lax'.")
  kh, kw, ch, out = rhs.shape
  if lhs.shape[-1] != ch:
    raise ValueError(f"Input has {lhs.shape[-1]} channels, the kernel "
                     f"{rhs.shape} expects {ch}.")
  strides = tuple(int(v) for v in window_strides)
  kdil = tuple(int(v) for v in (rhs_dilation or (1, 1)))
  if tuple(lhs_dilation or (1, 1)) == (1, 1):
    patches = slice_patches(lhs, (kh, kw), strides, padding, kdil)
    # Features ordered [kh, kw, Ch], as HWIO flattens.
    kernel = rhs.reshape(kh * kw * ch, out)
  else:
    # Input dilation (unused by the models here). HIGHEST keeps the one-hot
    # patch convolution an exact copy on accelerators (default: bfloat16).
    patches = lax.conv_general_dilated_patches(
        lhs, (kh, kw), strides, padding,
        lhs_dilation=lhs_dilation, rhs_dilation=kdil,
        dimension_numbers=("NHWC", "OIHW", "NHWC"),
        precision=lax.Precision.HIGHEST)
    # Its features are ordered channel-major, [Ch, kh, kw].
    kernel = jnp.transpose(rhs, (2, 0, 1, 3)).reshape(ch * kh * kw, out)
  if preferred_element_type is None and _low_precision(patches, kernel):
    # bfloat16 inputs: sum in float32, as XLA's own convolution does.
    return jnp.dot(patches, kernel, precision=precision,
                   preferred_element_type=jnp.float32).astype(
                       jnp.result_type(patches, kernel))
  return jnp.dot(patches, kernel, precision=precision,
                 preferred_element_type=preferred_element_type)


def _low_precision(*arrays: jax.Array) -> bool:
  """Whether the arrays' common dtype is a float narrower than float32."""
  dtype = jnp.result_type(*arrays)
  return jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4


def _is_nhwc(lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any) -> bool:
  """Whether a convolution is 2-D with NHWC/HWIO/NHWC ``dimension_numbers``
  (None, lax's NCHW default, is not)."""
  if lhs.ndim != 4 or rhs.ndim != 4 or dimension_numbers is None:
    return False
  return (lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
          == lax.conv_dimension_numbers(lhs.shape, rhs.shape, _NHWC))


def _explicit_pads(spatial: Sequence[int], window: tuple[int, int],
                   strides: tuple[int, int],
                   padding: str | Sequence[tuple[int, int]],
                   rhs_dilation: tuple[int, int]
                   ) -> tuple[tuple[int, int], ...]:
  """``((lo_h, hi_h), (lo_w, hi_w))`` of ``padding`` (a string ``lax``
  accepts, resolved for the dilated window, or explicit pads) over an
  input's ``spatial`` ``(H, W)``."""
  if isinstance(padding, str):
    padding = lax.padtype_to_pads(
        spatial, tuple((k - 1) * d + 1 for k, d in zip(window, rhs_dilation)),
        strides, padding)
  return tuple((int(lo), int(hi)) for lo, hi in padding)


def _tap_slices(x: jax.Array, window: tuple[int, int],
                strides: tuple[int, int],
                padding: str | Sequence[tuple[int, int]],
                rhs_dilation: tuple[int, int]) -> list[jax.Array]:
  """The padded input's ``kh * kw`` shifted slices, each ``[B, Ho, Wo, Ch]``.

  Slice ``i * kw + j`` holds, at output pixel ``(p, q)``, the input that
  kernel tap ``(i, j)`` multiplies there.
  """
  (kh, kw), (sh, sw), (dh, dw) = window, strides, rhs_dilation
  pads = _explicit_pads(x.shape[1:3], window, strides, padding, rhs_dilation)
  x = lax.pad(x, jnp.zeros((), x.dtype),
              ((0, 0, 0), (pads[0][0], pads[0][1], 0),
               (pads[1][0], pads[1][1], 0), (0, 0, 0)))
  ho = (x.shape[1] - (kh - 1) * dh - 1) // sh + 1
  wo = (x.shape[2] - (kw - 1) * dw - 1) // sw + 1
  return [
      lax.slice(x, (0, i * dh, j * dw, 0),
                (x.shape[0], i * dh + (ho - 1) * sh + 1,
                 j * dw + (wo - 1) * sw + 1, x.shape[3]), (1, sh, sw, 1))
      for i in range(kh) for j in range(kw)]


def slice_patches(x: jax.Array, window: tuple[int, int],
                  strides: tuple[int, int],
                  padding: str | Sequence[tuple[int, int]],
                  rhs_dilation: tuple[int, int]) -> jax.Array:
  """Receptive fields ``[B, Ho, Wo, kh * kw * Ch]`` from shifted slices.

  :func:`_tap_slices` concatenated in [kh, kw, Ch] order. Unlike
  ``conv_general_dilated_patches`` (a one-hot convolution, slow on XLA:CPU)
  this is pure data movement, exact on every platform.
  """
  return jnp.concatenate(
      _tap_slices(x, window, strides, padding, rhs_dilation), axis=-1)


def conv(
    conv_impl: str,
    features: int,
    kernel_size: Sequence[int],
    weight_grad: str = "lax",
    **kwargs: Any,
) -> nn.Conv:
  """``nn.Conv`` computed with the formulation ``conv_impl`` (same
  parameters in every formulation).

  Args:
    conv_impl: One of :data:`CONV_IMPLS` (resolved now with
      :func:`resolve_conv_impl` for JAX's default backend).
    features: Output channels.
    kernel_size: ``(kh, kw)``.
    weight_grad: How the kernel's gradient is computed with ``lax``
      (:func:`conv_function`).
    **kwargs: Other ``nn.Conv`` fields (``padding``, ``strides``, ...).

  Returns:
    The ``nn.Conv`` module.
  """
  return nn.Conv(features, kernel_size,
                 conv_general_dilated=conv_function(conv_impl, weight_grad),
                 **kwargs)


# How a ``lax`` convolution's kernel gradient is computed (conv_function).
WEIGHT_GRADS = ("lax", "gemm", "taps")


def _check_weight_grad(weight_grad: str) -> None:
  if weight_grad not in WEIGHT_GRADS:
    raise ValueError(f"Unknown weight_grad {weight_grad!r}; expected one of "
                     f"{WEIGHT_GRADS}.")


def conv_function(conv_impl: str,
                  weight_grad: str = "lax") -> Callable[..., jnp.ndarray]:
  """The ``conv_general_dilated`` that computes ``conv_impl``.

  Args:
    conv_impl: One of :data:`CONV_IMPLS` (:func:`resolve_conv_impl`).
    weight_grad: Where ``conv_impl`` resolves to ``"lax"``, how the
      kernel's gradient is computed (:func:`lax_conv_custom_weight_grad`):
      ``"lax"``, ``"gemm"`` or ``"taps"``. Models take theirs from
      :func:`fedjax_dd.policy.kernel_grads`.

  Returns:
    ``lax.conv_general_dilated``, :func:`patches_conv_general_dilated`,
    :func:`forward_conv_general_dilated` or
    :func:`lax_conv_custom_weight_grad` bound to ``weight_grad``.

  Raises:
    ValueError: For an unknown ``conv_impl`` or ``weight_grad``.
  """
  _check_weight_grad(weight_grad)
  impl = resolve_conv_impl(conv_impl)
  if impl == "patches":
    return patches_conv_general_dilated
  if impl == "forward":
    return forward_conv_general_dilated
  if weight_grad == "lax":
    return lax.conv_general_dilated
  return functools.partial(lax_conv_custom_weight_grad,
                           weight_grad=weight_grad)



def lax_conv_custom_weight_grad(
    lhs: jax.Array,
    rhs: jax.Array,
    window_strides: Sequence[int],
    padding: str | Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    dimension_numbers: Any = None,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
    precision: Any = None,
    preferred_element_type: Any = None,
    *,
    weight_grad: str = "gemm",
) -> jax.Array:
  """``lax.conv_general_dilated`` with another kernel gradient.

  The value and the input's gradient are ``lax``'s. The kernel's gradient
  is, by ``weight_grad``:

  * ``"gemm"``: ``dW [kh * kw * Ch, O] = patches(x)^T dy``, the receptive
    fields (:func:`slice_patches`) contracted with ``dy [B, Ho, Wo, O]`` by
    a matmul per example, summed over the batch. Why: with few input and
    many output channels (ConvNet-3's first layer) XLA:CPU's
    weight-gradient convolution runs far below matmul rate.
  * ``"taps"``: ``dW[i, j] = x_ij^T dy``, one matmul per kernel tap, where
    ``x_ij [B * Ho * Wo, Ch]`` is the slice the tap multiplies
    (:func:`_tap_slices`). Why: with many channels these matmuls run near
    peak, and the slices are 9x smaller than ``"gemm"``'s receptive fields
    (experiments/perf_notes.md).

  Same values as ``lax``'s to float rounding. Args and returns are those of
  ``lax.conv_general_dilated``; inputs other than 2-D NHWC/HWIO
  convolutions without input dilation or groups go to it unchanged.
  """
  _check_weight_grad(weight_grad)
  if (weight_grad == "lax" or not _is_nhwc(lhs, rhs, dimension_numbers)
      or feature_group_count != 1
      or batch_group_count != 1 or tuple(lhs_dilation or (1, 1)) != (1, 1)
      or preferred_element_type is not None):
    return lax.conv_general_dilated(
        lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
        dimension_numbers, feature_group_count, batch_group_count,
        precision, preferred_element_type)
  if not isinstance(padding, str):
    padding = tuple(tuple(int(v) for v in p) for p in padding)
  return _custom_wgrad_conv(
      lhs, rhs, tuple(int(v) for v in window_strides), padding,
      tuple(int(v) for v in (rhs_dilation or (1, 1))), precision,
      weight_grad)


def _nhwc_conv(lhs, rhs, strides, padding, rhs_dilation, precision):
  return lax.conv_general_dilated(lhs, rhs, strides, padding,
                                  rhs_dilation=rhs_dilation,
                                  dimension_numbers=_NHWC,
                                  precision=precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6))
def _custom_wgrad_conv(lhs, rhs, strides, padding, rhs_dilation, precision,
                       weight_grad):
  del weight_grad
  return _nhwc_conv(lhs, rhs, strides, padding, rhs_dilation, precision)


def _custom_wgrad_conv_fwd(lhs, rhs, strides, padding, rhs_dilation,
                           precision, weight_grad):
  del weight_grad
  y = _nhwc_conv(lhs, rhs, strides, padding, rhs_dilation, precision)
  return y, (lhs, rhs)


def _custom_wgrad_conv_bwd(strides, padding, rhs_dilation, precision,
                           weight_grad, res, dy):
  lhs, rhs = res
  conv = functools.partial(_nhwc_conv, strides=strides, padding=padding,
                           rhs_dilation=rhs_dilation, precision=precision)
  _, lhs_vjp = jax.vjp(lambda x: conv(x, rhs), lhs)
  (dlhs,) = lhs_vjp(dy)
  if weight_grad == "gemm":
    kh, kw, _, _ = rhs.shape
    patches = slice_patches(lhs, (kh, kw), strides, padding, rhs_dilation)
    # [B, Ho, Wo, kh*kw*Ch] x [B, Ho, Wo, O] -> [B, kh*kw*Ch, O] -> summed
    # over B, in HWIO order. Batched rather than one 2-D matmul: oneDNN on
    # old jax tries to pre-evaluate a 2-D matmul's operand as constant
    # weights, which aborted the process here.
    drhs = jnp.sum(lax.dot_general(
        patches, dy, (((1, 2), (1, 2)), ((0,), (0,))), precision=precision),
                   axis=0).reshape(rhs.shape)
  else:
    drhs = _taps_weight_grad(lhs, dy, rhs.shape, strides, padding,
                             rhs_dilation, precision)
  return dlhs, drhs.astype(rhs.dtype)


_custom_wgrad_conv.defvjp(_custom_wgrad_conv_fwd, _custom_wgrad_conv_bwd)


def forward_conv_general_dilated(
    lhs: jax.Array,
    rhs: jax.Array,
    window_strides: Sequence[int],
    padding: str | Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    dimension_numbers: Any = None,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
    precision: Any = None,
    preferred_element_type: Any = None,
) -> jax.Array:
  """``lax.conv_general_dilated`` whose gradients are forward convolutions.

  For a stride-1 convolution with pads ``(lo, hi)`` per axis and kernel
  dilation ``d``, the input's gradient convolves ``dy [B, Ho, Wo, O]`` with
  the flipped kernel ``[kh, kw, O, Ch]``, padded ``((k-1)d - lo, (k-1)d -
  hi)``; the kernel's gradient convolves the padded input ``[Ch, Hp, Wp,
  B]`` with ``dy`` as kernel ``[Ho, Wo, B, O]``, window stride ``d``.

  Why: on XLA:CPU of jax >= 0.10 autodiff's transposed convolutions run on
  a slow path inside loops (the engine's local steps), forward ones do not
  (experiments/perf_notes.md).

  Same values as ``lax``'s to float rounding. Args and returns are those of
  ``lax.conv_general_dilated``; other convolutions (strided, input
  dilation, groups, other layouts, a ``preferred_element_type``) go to it
  with its own gradients.
  """
  strides = tuple(int(v) for v in window_strides)
  if (strides != (1, 1) or not _is_nhwc(lhs, rhs, dimension_numbers)
      or feature_group_count != 1 or batch_group_count != 1
      or tuple(lhs_dilation or (1, 1)) != (1, 1)
      or preferred_element_type is not None):
    return lax.conv_general_dilated(
        lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
        dimension_numbers, feature_group_count, batch_group_count,
        precision, preferred_element_type)
  kdil = tuple(int(v) for v in (rhs_dilation or (1, 1)))
  kh, kw = rhs.shape[:2]
  pads = _explicit_pads(lhs.shape[1:3], (kh, kw), strides, padding, kdil)
  if any(lo < 0 or hi < 0 or lo > (k - 1) * d or hi > (k - 1) * d
         for (lo, hi), k, d in zip(pads, (kh, kw), kdil)):
    # Cropping or padding past the kernel's reach: the input gradient would
    # need negative pads; lax's own gradients handle it.
    return lax.conv_general_dilated(
        lhs, rhs, strides, pads, None, kdil, dimension_numbers,
        precision=precision)
  return _forward_grads_conv(lhs, rhs, pads, kdil, precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _forward_grads_conv(lhs, rhs, pads, rhs_dilation, precision):
  return _nhwc_conv(lhs, rhs, (1, 1), pads, rhs_dilation, precision)


def _forward_grads_conv_fwd(lhs, rhs, pads, rhs_dilation, precision):
  return (_nhwc_conv(lhs, rhs, (1, 1), pads, rhs_dilation, precision),
          (lhs, rhs))


def _forward_grads_conv_bwd(pads, rhs_dilation, precision, res, dy):
  lhs, rhs = res
  kh, kw = rhs.shape[:2]
  # Input gradient: dy convolved with the flipped kernel [kh, kw, O, Ch].
  flipped = jnp.transpose(jnp.flip(rhs, (0, 1)), (0, 1, 3, 2))
  back = tuple(((k - 1) * d - lo, (k - 1) * d - hi)
               for (lo, hi), k, d in zip(pads, (kh, kw), rhs_dilation))
  dlhs = _nhwc_conv(dy, flipped, (1, 1), back, rhs_dilation, precision)
  # Kernel gradient: channels as the batch, the batch as the channels; tap
  # (i, j) reads the padded input at offset (i d, j d), so the window
  # moves by the kernel's dilation.
  padded = jnp.pad(lhs, ((0, 0), pads[0], pads[1], (0, 0)))
  drhs = lax.conv_general_dilated(
      jnp.transpose(padded, (3, 1, 2, 0)), jnp.transpose(dy, (1, 2, 0, 3)),
      rhs_dilation, "VALID", dimension_numbers=_NHWC, precision=precision)
  drhs = jnp.transpose(drhs, (1, 2, 0, 3))
  return dlhs.astype(lhs.dtype), drhs.astype(rhs.dtype)


_forward_grads_conv.defvjp(_forward_grads_conv_fwd, _forward_grads_conv_bwd)


def _taps_weight_grad(x: jax.Array, dy: jax.Array,
                      kernel_shape: tuple[int, ...],
                      strides: tuple[int, int],
                      padding: str | Sequence[tuple[int, int]],
                      rhs_dilation: tuple[int, int],
                      precision: Any) -> jax.Array:
  """``dW [kh, kw, Ch, O]``: tap ``(i, j)``'s slice ``[B*Ho*Wo, Ch]``
  contracted with ``dy [B*Ho*Wo, O]``, one matmul per tap."""
  kh, kw, ch, o = kernel_shape
  d = dy.reshape(-1, o)
  return jnp.stack([
      lax.dot_general(t.reshape(-1, ch), d, (((0,), (0,)), ((), ())),
                      precision=precision)
      for t in _tap_slices(x, (kh, kw), strides, padding, rhs_dilation)
  ]).reshape(kernel_shape)


@jax.custom_vjp
def add_bias(y: jax.Array, bias: jax.Array) -> jax.Array:
  """``y + bias`` over the last axis, its bias gradient reduced in two steps.

  ``y [B, ..., O]``, ``bias [O]``. The bias gradient sums over the middle
  axes, then (after an optimization barrier, so XLA does not merge them)
  over the batch. Why: XLA:CPU runs the one reduction keeping only the
  minor axis much slower than the two steps. Same value as ``y + bias``;
  the gradient to rounding.
  """
  return y + bias


def _add_bias_fwd(y, bias):
  return y + bias, None


def _add_bias_bwd(_, dy):
  per_example = jnp.sum(dy, axis=tuple(range(1, dy.ndim - 1)))
  return dy, jnp.sum(lax.optimization_barrier(per_example), axis=0)


add_bias.defvjp(_add_bias_fwd, _add_bias_bwd)


def conv_params(module: nn.Module, kernel_size: tuple[int, int],
                in_features: int, features: int) -> tuple[jax.Array, ...]:
  """``kernel [kh, kw, in, out]`` and ``bias [out]`` declared in ``module``
  with ``nn.Conv``'s names, shapes and initialisers (LeCun normal, zeros)."""
  kh, kw = kernel_size
  kernel = module.param("kernel", nn.initializers.lecun_normal(),
                        (kh, kw, in_features, features), jnp.float32)
  bias = module.param("bias", nn.initializers.zeros_init(), (features,),
                      jnp.float32)
  return kernel, bias


class Conv(nn.Module):
  """A 2-D convolution with ``nn.Conv``'s parameters, for the hot models.

  Parameters ``kernel [kh, kw, Ch, O]`` and ``bias [O]`` are those of
  ``nn.Conv(features, kernel_size, padding=padding)``, so variables are
  interchangeable with it. Computed by :func:`conv_function` (formulation
  and kernel gradient per layer) and :func:`add_bias`. Stride 1, inputs
  ``[B, H, W, Ch]``.

  Attributes:
    features: Output channels ``O``.
    kernel_size: ``(kh, kw)``.
    padding: ``"SAME"``, ``"VALID"`` or explicit pads, as for ``nn.Conv``.
    conv_impl: One of :data:`CONV_IMPLS` (``"auto"``: the policy's).
    weight_grad: How the kernel's gradient is computed with ``lax``:
      ``"lax"``, ``"gemm"`` or ``"taps"`` (:func:`conv_function`).
    apply_bias: False declares the bias (variables stay ``nn.Conv``'s) but
      does not add it. Only for a convolution followed by a per-channel
      mean subtraction (instance norm), where the bias cancels exactly.
    dtype: The compute dtype (Flax's ``dtype``); None: the inputs' and
      parameters' common dtype. The parameters are float32.
  """

  features: int
  kernel_size: tuple[int, int]
  padding: Any = "SAME"
  conv_impl: str = "auto"
  weight_grad: str = "lax"
  apply_bias: bool = True
  dtype: Any = None

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    kernel, bias = conv_params(self, self.kernel_size, x.shape[-1],
                               self.features)
    # As nn.Conv: compute in ``dtype``, or the inputs' common dtype.
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias,
                                              dtype=self.dtype)
    conv_fn = conv_function(self.conv_impl, self.weight_grad)
    y = conv_fn(x, kernel, (1, 1), self.padding, dimension_numbers=_NHWC)
    return add_bias(y, bias) if self.apply_bias else y


def instance_norm_params(module: nn.Module,
                         features: int) -> tuple[jax.Array, jax.Array]:
  """``scale [Ch]`` (ones) and ``bias [Ch]`` (zeros) declared in ``module``
  with ``nn.InstanceNorm``'s names, shapes and initialisers."""
  scale = module.param("scale", nn.initializers.ones_init(), (features,),
                       jnp.float32)
  bias = module.param("bias", nn.initializers.zeros_init(), (features,),
                      jnp.float32)
  return scale, bias


def instance_norm_folds(platform: str | None = None,
                        jax_version: str | None = None) -> bool:
  """Whether :class:`InstanceNorm` folds its affine map by default: the
  policy's ``fold_norm`` (:func:`fedjax_dd.policy.lookup`).

  Args:
    platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``; default JAX's default
      backend.
    jax_version: e.g. ``"0.5.3"``; default the running ``jax.__version__``.
  """
  return policy.lookup(platform, jax_version).fold_norm


class InstanceNorm(nn.Module):
  """Instance normalisation with ``nn.InstanceNorm``'s parameters.

  ``y = (x - mean) * k + bias``, ``k = scale * rsqrt(var + eps)`` ``[B, 1,
  1, Ch]``, with each example's and channel's spatial mean and variance
  ``mean(x^2) - mean(x)^2`` clipped at 0, as flax computes them. Folded,
  ``x * k + (bias - mean * k)``: the same values to rounding, and a
  backward pass without the full-size centred input (faster on XLA:CPU's
  classic runtime only).

  Attributes:
    epsilon: Added to the variance.
    fold: Fold the affine map; None: :func:`instance_norm_folds`.
  """

  epsilon: float = 1e-5
  fold: bool | None = None

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    scale, bias = instance_norm_params(self, x.shape[-1])
    x, scale, bias = nn.dtypes.promote_dtype(x, scale, bias)
    axes = tuple(range(1, x.ndim - 1))
    mean = jnp.mean(x, axes, keepdims=True)
    var = jnp.maximum(
        jnp.mean(jnp.square(x), axes, keepdims=True) - jnp.square(mean), 0.0)
    k = lax.rsqrt(var + self.epsilon) * scale
    fold = instance_norm_folds() if self.fold is None else self.fold
    if fold:
      return x * k + (bias - mean * k)
    return (x - mean) * k + bias


@functools.lru_cache(maxsize=None)
def _phase_selection(kh: int, kw: int) -> np.ndarray:
  """``S[u, v, p, q, r, s, a, b] = 1`` where kernel tap ``(a, b)`` lands.

  Output pixel ``(2I + r, 2J + s)`` of a stride-1 VALID convolution reads
  input ``(2I + r + a, 2J + s + b)``; writing ``r + a = 2u + p`` it is tap
  ``(u, v)`` of input phase ``(p, q)`` at space-to-depth position
  ``(I, J)``. Shape ``[U, V, 2, 2, 2, 2, kh, kw]`` with ``U = kh // 2 + 1``.
  """
  u_n, v_n = kh // 2 + 1, kw // 2 + 1
  sel = np.zeros((u_n, v_n, 2, 2, 2, 2, kh, kw), np.float32)
  for u in range(u_n):
    for v in range(v_n):
      for p in range(2):
        for q in range(2):
          for r in range(2):
            for t in range(2):
              a, b = 2 * u + p - r, 2 * v + q - t
              if 0 <= a < kh and 0 <= b < kw:
                sel[u, v, p, q, r, t, a, b] = 1.0
  return sel


def phase_split_applies(x_shape: Sequence[int],
                        kernel_shape: Sequence[int]) -> bool:
  """Whether :func:`phase_split_conv_max_pool` takes an input of
  ``x_shape [..., H, W, Ch]`` and a kernel of ``kernel_shape [kh, kw, ...]``:
  even ``H`` and ``W``, odd ``kh`` and ``kw``."""
  h, w = x_shape[-3], x_shape[-2]
  kh, kw = kernel_shape[0], kernel_shape[1]
  return h % 2 == 0 and w % 2 == 0 and kh % 2 == 1 and kw % 2 == 1


def phase_split_conv_max_pool(
    x: jnp.ndarray, kernel: jnp.ndarray,
    conv_general_dilated: Callable[..., jnp.ndarray] = lax.conv_general_dilated,
) -> jnp.ndarray:
  """2x2 max-pool of a stride-1 VALID convolution, computed phase-split.

  The input ``[B, H, W, Ch]`` is rearranged space-to-depth into
  ``[B, H/2, W/2, 4 Ch]`` and convolved with a ``[kh//2 + 1, kw//2 + 1,
  4 Ch, 4 O]`` kernel assembled from ``kernel`` (a fixed 0/1 map, so the
  gradient reaches ``kernel`` through it): output channel group ``(r, s)``
  holds the convolution's pixels ``(2I + r, 2J + s)``, and the pool is a max
  over the four groups. Same values as ``max_pool(conv(x))`` to float
  rounding. Why: with 1 or 3 input channels (LeNet-5's first layer)
  XLA:CPU's convolutions run far below peak; 4x the channels run faster.

  Args:
    x: ``[B, H, W, Ch]``, ``H`` and ``W`` even.
    kernel: ``[kh, kw, Ch, O]`` (HWIO), ``kh`` and ``kw`` odd.
    conv_general_dilated: The convolution (``lax``'s or
      :func:`patches_conv_general_dilated`).

  Returns:
    ``[B, (H - kh + 1) / 2, (W - kw + 1) / 2, O]``.

  Raises:
    ValueError: For odd input sizes or even kernel sizes.
  """
  b, h, w, ch = x.shape
  kh, kw, _, out = kernel.shape
  if not phase_split_applies(x.shape, kernel.shape):
    raise ValueError(
        "phase_split_conv_max_pool needs even input sizes and odd kernel "
        f"sizes, got input {x.shape} and kernel {kernel.shape}.")
  xs = x.reshape(b, h // 2, 2, w // 2, 2, ch).transpose(0, 1, 3, 2, 4, 5)
  xs = xs.reshape(b, h // 2, w // 2, 4 * ch)
  sel = jnp.asarray(_phase_selection(kh, kw), kernel.dtype)
  # [U, V, (p, q, Ch), (r, s, O)]: input phase-major as xs, output phase-major.
  k = jnp.einsum("uvpqrsab,abio->uvpqirso", sel, kernel)
  k = k.reshape(kh // 2 + 1, kw // 2 + 1, 4 * ch, 4 * out)
  y = conv_general_dilated(xs, k, (1, 1), "VALID",
                           dimension_numbers=_NHWC)
  return jnp.max(y.reshape(*y.shape[:3], 4, out), axis=3)


class ConvReluMaxPool(nn.Module):
  """``max_pool(relu(conv(x)))``: a VALID convolution, ReLU, 2x2 max-pool.

  The parameters are those of ``nn.Conv(features, kernel_size,
  padding="VALID")``, so variables are interchangeable with ``nn.Conv`` +
  :func:`max_pool`. With ``phase_split`` (where it applies) the convolution
  and pool are :func:`phase_split_conv_max_pool` and the ReLU and bias
  follow the pool (both commute with a max: same values, same gradients
  but for rounding and exact ties).

  Attributes:
    features: Output channels.
    kernel_size: ``(kh, kw)``.
    conv_impl: One of :data:`CONV_IMPLS` (:func:`conv`).
    phase_split: Use the phase-split form where it applies; None: the
      policy's ``phase_split`` (:func:`fedjax_dd.policy.current`: on CPU).
    dtype: The compute dtype (Flax's ``dtype``); None: the inputs' and
      parameters' common dtype. The parameters are float32.
  """

  features: int
  kernel_size: tuple[int, int]
  conv_impl: str = "auto"
  phase_split: bool | None = None
  dtype: Any = None

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    kernel, bias = conv_params(self, self.kernel_size, x.shape[-1],
                               self.features)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias,
                                              dtype=self.dtype)
    conv_fn = conv_function(self.conv_impl)
    phase_split = (policy.current().phase_split if self.phase_split is None
                   else self.phase_split)
    if phase_split and phase_split_applies(x.shape, kernel.shape):
      return nn.relu(phase_split_conv_max_pool(x, kernel, conv_fn) + bias)
    y = conv_fn(x, kernel, (1, 1), "VALID", dimension_numbers=_NHWC)
    return max_pool(nn.relu(y + bias))


def _check_pool_args(x: jnp.ndarray, window: int, stride: int) -> None:
  if not isinstance(window, int) or window < 1:
    raise ValueError(f"window must be a positive int, got {window!r}.")
  if not isinstance(stride, int) or stride < 1:
    raise ValueError(f"stride must be a positive int, got {stride!r}.")
  if x.ndim < 3:
    raise ValueError(
        f"Expected input [..., H, W, Ch] with rank >= 3, got shape {x.shape}.")
  h, w = x.shape[-3], x.shape[-2]
  if h < window or w < window:
    raise ValueError(
        f"Pooling window {window} is larger than the spatial size {(h, w)}.")


def _window_reduce(
    x: jnp.ndarray,
    window: int,
    reduce_fn: Callable[..., jnp.ndarray],
) -> jnp.ndarray:
  """Non-overlapping ``window x window`` reduction with VALID cropping."""
  return reduce_fn(_as_windows(x, window), axis=(-4, -2))


def _crop_to_windows(x: jnp.ndarray, window: int) -> jnp.ndarray:
  """Drops the rows and columns past the last whole window (VALID)."""
  h, w = x.shape[-3] // window * window, x.shape[-2] // window * window
  return x[..., :h, :w, :]


def _as_windows(x: jnp.ndarray, window: int) -> jnp.ndarray:
  """``[..., H, W, Ch]`` -> ``[..., H // window, window, W // window, window,
  Ch]`` after the VALID crop."""
  x = _crop_to_windows(x, window)
  h, w, ch = x.shape[-3:]
  return x.reshape(*x.shape[:-3], h // window, window, w // window, window, ch)


def max_pool(x: jnp.ndarray, window: int = 2, stride: int = 2) -> jnp.ndarray:
  """VALID max pooling over the two spatial axes.

  Args:
    x: Input ``[..., H, W, Ch]`` (usually ``[B, H, W, Ch]``).
    window: Square window size.
    stride: Stride in both spatial axes. When equal to ``window``, a
      reshape + max whose gradient goes to each window's first maximum;
      otherwise ``nn.max_pool`` with VALID padding.

  Returns:
    ``[..., (H - window) // stride + 1, (W - window) // stride + 1, Ch]``.

  Raises:
    ValueError: On non-positive window/stride, rank < 3 or a window larger
      than the input.
  """
  _check_pool_args(x, window, stride)
  if window != stride:
    return nn.max_pool(x, (window, window), strides=(stride, stride),
                       padding="VALID")
  # Our own max and gradient: reduce-max's gradient was wrong under jit
  # (see _window_max).
  return _window_max(_crop_to_windows(x, window), window)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _window_max(x: jnp.ndarray, window: int) -> jnp.ndarray:
  """Max over non-overlapping ``window x window`` windows of ``[..., H, W, Ch]``
  (``H``, ``W`` multiples of ``window``), its gradient routed to the first
  maximum of each window.

  Why not reduce-max's own gradient: its ``x == broadcast(max)`` mask was
  computed wrongly by XLA:CPU under jit when ``x``'s producer (a BatchNorm)
  was fused into it, so no entry matched (experiments/perf_notes.md). Here
  the forward pass records the winner as an int8 per window and the
  backward pass places ``g`` there. A tie goes to the first entry in
  row-major order, as PyTorch's and ``reduce_window``'s gradients do.
  """
  return _window_max_fwd(x, window)[0]


def _window_entries(x: jnp.ndarray, window: int) -> list[jnp.ndarray]:
  xr = _as_windows(x, window)
  return [xr[..., :, i, :, j, :] for i in range(window)
          for j in range(window)]


def _window_max_fwd(x, window):
  entries = _window_entries(x, window)
  best, index = entries[0], jnp.zeros(entries[0].shape, jnp.int8)
  for k, e in enumerate(entries[1:], start=1):
    wins = e > best  # strict: a tie keeps the earlier entry
    best = jnp.where(wins, e, best)
    index = jnp.where(wins, jnp.int8(k), index)
  return best, index


def _window_max_bwd(window, index, g):
  parts = [jnp.where(index == k, g, jnp.zeros_like(g))
           for k in range(window * window)]
  # [..., Ho, Wo, window*window, Ch] -> [..., Ho, window, Wo, window, Ch].
  *lead, ho, wo, ch = index.shape
  d = jnp.stack(parts, axis=-2).reshape(*lead, ho, wo, window, window, ch)
  d = jnp.moveaxis(d, -3, -4)
  return (d.reshape(*lead, ho * window, wo * window, ch),)


_window_max.defvjp(_window_max_fwd, _window_max_bwd)


def avg_pool(x: jnp.ndarray, window: int = 2, stride: int = 2) -> jnp.ndarray:
  """VALID average pooling over the two spatial axes.

  Args:
    x: Input ``[..., H, W, Ch]``.
    window: Square window size.
    stride: Stride in both spatial axes; reshape + mean when equal to
      ``window``, else ``nn.avg_pool`` with VALID padding.

  Returns:
    ``[..., (H - window) // stride + 1, (W - window) // stride + 1, Ch]``.

  Raises:
    ValueError: On non-positive window/stride, rank < 3 or a window larger
      than the input.
  """
  _check_pool_args(x, window, stride)
  if window != stride:
    return nn.avg_pool(x, (window, window), strides=(stride, stride),
                       padding="VALID")
  return _window_reduce(x, window, jnp.mean)


def batch_norm(train: bool, name: str | None = None) -> nn.BatchNorm:
  """BatchNorm with PyTorch-like momentum/epsilon.

  Args:
    train: If True, normalise with batch statistics and update the running
      averages (the caller must pass ``mutable=['batch_stats']``); if False,
      use the running averages.
    name: Optional submodule name.

  Returns:
    An ``nn.BatchNorm`` over the last axis with learned scale and bias.
  """
  return nn.BatchNorm(use_running_average=not train, momentum=BN_MOMENTUM,
                      epsilon=BN_EPSILON, name=name)


def local_response_norm(
    x: jnp.ndarray,
    size: int,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 1.0,
) -> jnp.ndarray:
  """Cross-channel local response normalisation, PyTorch semantics.

  ``out[c] = x[c] / (k + alpha / size * sum_{c' in window(c)} x[c']**2)**beta``
  where ``window(c)`` spans channels ``c - size // 2 .. c + (size - 1) // 2``
  (zero-padded at the edges, and the sum is always divided by ``size``).

  Args:
    x: Input ``[..., Ch]``.
    size: Number of neighbouring channels in the window.
    alpha: Multiplicative factor.
    beta: Exponent.
    k: Additive constant.

  Returns:
    Array with the shape of ``x``.

  Raises:
    ValueError: If ``size`` is not a positive int.
  """
  if not isinstance(size, int) or size < 1:
    raise ValueError(f"size must be a positive int, got {size!r}.")
  ch = x.shape[-1]
  sq = jnp.square(x)
  pad = [(0, 0)] * (x.ndim - 1) + [(size // 2, (size - 1) // 2)]
  sq = jnp.pad(sq, pad)
  window_sum = sum(sq[..., i:i + ch] for i in range(size))
  return x / (k + (alpha / size) * window_sum) ** beta


def check_images(x: jnp.ndarray, model: str) -> None:
  """Raises a clear error unless ``x`` is a ``[B, H, W, Ch]`` batch."""
  if x.ndim != 4:
    raise ValueError(
        f"{model} expects float NHWC input [B, H, W, Ch], got shape {x.shape}.")


def flatten(x: jnp.ndarray) -> jnp.ndarray:
  """``[B, ...] -> [B, prod(...)]``."""
  return x.reshape(x.shape[0], -1)


@dataclasses.dataclass(frozen=True)
class LayerSet:
  """The layer forms a model computes with, as one value.

  Every model carries one (its ``layers`` field) and builds its
  convolutions, dense layers and normalisations through it. Each form
  computes flax's plain layer's function with its parameters, to float
  rounding, so variables are interchangeable between sets. Defaults are
  :mod:`fedjax_dd.policy`'s: :meth:`from_policy` resolves them all (the
  registry's ``build`` does so); a field left ``"auto"`` or None is the
  policy's when the model runs. A run records the set
  (:func:`fedjax_dd.core.definition.forms_of`). Frozen and hashable, so
  models with equal sets share compiled programs
  (:func:`fedjax_dd.models.init_model`).

  Per-convolution kernel gradients depend on a model's layers, so they are
  a model's ``weight_grads`` field (:func:`fedjax_dd.policy.kernel_grads`).

  Attributes:
    conv_impl: How convolutions are computed, one of :data:`CONV_IMPLS`
      (module docstring); ``"auto"``: the policy's form for the model's
      class when it runs (:meth:`for_model`).
    dtype: The compute dtype of the convolutions and matmuls (Flax's
      ``dtype``, kept as a ``jnp.dtype``); None: the inputs' and
      parameters'. Parameters, statistics and losses stay float32.
    phase_split: LeNet-5's first convolution and its pool computed
      phase-split (:class:`ConvReluMaxPool`); None: the policy's.
    fuse_first_block: ConvNet's first block computed as one function
      (:mod:`fedjax_dd.models.fused_block`, whatever ``conv_impl``); None:
      the policy's.
    fold_norm: Instance norm with its affine map folded
      (:class:`InstanceNorm`); None: the policy's.

  Example::

    ls = LayerSet.from_policy("auto", "auto", model="LeNet5")
    module = LeNet5(num_classes=10, layers=ls)
    plain = LeNet5(num_classes=10, layers=LayerSet(conv_impl="lax",
                                                   phase_split=False))
  """

  conv_impl: str = "auto"
  dtype: Any = None
  phase_split: bool | None = None
  fuse_first_block: bool | None = None
  fold_norm: bool | None = None

  def __post_init__(self):
    if self.conv_impl not in CONV_IMPLS:
      raise ValueError(f"Unknown conv_impl {self.conv_impl!r}; expected one "
                       f"of {CONV_IMPLS}.")
    if self.dtype is not None:
      # One spelling per dtype (jnp.bfloat16, "bfloat16"), so equal sets
      # compare and hash equal.
      object.__setattr__(self, "dtype", jnp.dtype(self.dtype))

  @classmethod
  def from_policy(cls, conv_impl: str = "auto", compute_dtype: str = "auto",
                  model: str | None = None, *, platform: str | None = None,
                  jax_version: str | None = None) -> "LayerSet":
    """Every form resolved: explicit arguments, else the policy's row.

    Args:
      conv_impl: One of :data:`CONV_IMPLS`; ``"auto"``: the row's form for
        ``model`` (:func:`resolve_conv_impl`).
      compute_dtype: ``"auto"``, ``"float32"`` or ``"bfloat16"``
        (:func:`fedjax_dd.policy.resolve_compute_dtype`).
      model: The class name of the model the set is for; some classes have
        their own convolution form (:func:`fedjax_dd.policy.conv_form`).
      platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``; default JAX's default
        backend.
      jax_version: e.g. ``"0.10.2"``; default the running jax.

    Returns:
      A set with a concrete ``conv_impl`` and ``dtype`` and the row's
      ``phase_split``, ``fuse_first_block`` and ``fold_norm``.

    Raises:
      ValueError: For an unknown ``conv_impl`` or ``compute_dtype``.
    """
    row = policy.lookup(platform, jax_version)
    return cls(
        conv_impl=resolve_conv_impl(conv_impl, platform, jax_version, model),
        dtype=jnp.dtype(policy.resolve_compute_dtype(compute_dtype, platform,
                                                     jax_version)),
        phase_split=row.phase_split,
        fuse_first_block=row.fuse_first_block,
        fold_norm=row.fold_norm)

  def for_model(self, model: str) -> "LayerSet":
    """This set with ``conv_impl="auto"`` resolved for the class ``model``
    (:func:`resolve_conv_impl`); what a model whose class has its own
    form (:data:`fedjax_dd.policy.LAX_CONV_MODELS`,
    :data:`fedjax_dd.policy.FORWARD_CONV_MODELS`) builds with."""
    if self.conv_impl != "auto":
      return self
    return dataclasses.replace(
        self, conv_impl=resolve_conv_impl("auto", model=model))

  def conv(self, features: int, kernel_size: Sequence[int],
           weight_grad: str = "lax", **kwargs: Any) -> nn.Conv:
    """``nn.Conv(features, kernel_size, **kwargs)`` in this set's form and
    dtype (:func:`conv`)."""
    return conv(self.conv_impl, features, kernel_size, weight_grad,
                dtype=self.dtype, **kwargs)

  def hot_conv(self, features: int, kernel_size: tuple[int, int],
               **kwargs: Any) -> "Conv":
    """A stride-1 :class:`Conv` (``nn.Conv``'s parameters; per-layer kernel
    gradient, optional bias) in this set's form and dtype."""
    return Conv(features, kernel_size, conv_impl=self.conv_impl,
                dtype=self.dtype, **kwargs)

  def conv_relu_max_pool(self, features: int, kernel_size: tuple[int, int],
                         **kwargs: Any) -> "ConvReluMaxPool":
    """:class:`ConvReluMaxPool` in this set's form, phase split and
    dtype."""
    return ConvReluMaxPool(features, kernel_size, conv_impl=self.conv_impl,
                           phase_split=self.phase_split, dtype=self.dtype,
                           **kwargs)

  def instance_norm(self, **kwargs: Any) -> "InstanceNorm":
    """:class:`InstanceNorm` with this set's ``fold_norm``."""
    return InstanceNorm(fold=self.fold_norm, **kwargs)

  def dense(self, features: int, **kwargs: Any) -> nn.Dense:
    """``nn.Dense(features, **kwargs)`` in this set's dtype."""
    return nn.Dense(features, dtype=self.dtype, **kwargs)

  def fuses_first_block(self) -> bool:
    """``fuse_first_block``, or the policy's when None."""
    if self.fuse_first_block is None:
      return policy.current().fuse_first_block
    return self.fuse_first_block

  def promote(self, *arrays: jax.Array) -> tuple[jax.Array, ...]:
    """``arrays`` in this set's dtype, as flax's layers promote their
    inputs and parameters (None: their common dtype)."""
    return nn.dtypes.promote_dtype(*arrays, dtype=self.dtype)
