"""Normalisation and resizing of uint8 images.

All functions accept NumPy or JAX arrays. :func:`normalize` and
:func:`resize_images` on a JAX array use only ``jax.numpy`` and can run under
``jax.jit``, so images can stay uint8 on the device and be converted per
batch. :func:`channel_stats` is host-side: it reads the data in chunks.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

_RESIZE_METHODS = ("bilinear", "pad")


def _check_uint8_nhwc(x, what: str = "x") -> None:
  if x.dtype != np.uint8:
    raise ValueError(f"{what} must be uint8 images, got dtype {x.dtype}.")
  if x.ndim != 4:
    raise ValueError(f"{what} must have shape [N, H, W, C], got {x.shape}.")


def channel_stats(x_uint8, *, chunk_size: int = 1024
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Per-channel mean and standard deviation on the [0, 1] scale.

  Compute them on the train split only. Sums are accumulated in float64 over
  chunks of ``chunk_size`` images, bounding extra memory whatever N is.

  Args:
    x_uint8: Images ``[N, H, W, C]`` uint8 (NumPy or JAX).
    chunk_size: Images per chunk.

  Returns:
    ``(mean [C], std [C])`` float32; ``std`` is the population standard
    deviation (ddof=0).

  Raises:
    ValueError: Not uint8 ``[N, H, W, C]``, empty, or ``chunk_size < 1``.
  """
  _check_uint8_nhwc(x_uint8, "x_uint8")
  if x_uint8.shape[0] == 0:
    raise ValueError("channel_stats needs at least one image.")
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be positive, got {chunk_size}.")
  num_channels = x_uint8.shape[-1]
  total = np.zeros(num_channels, np.float64)
  total_sq = np.zeros(num_channels, np.float64)
  for start in range(0, x_uint8.shape[0], chunk_size):
    chunk = np.asarray(x_uint8[start:start + chunk_size]).astype(np.float64)
    chunk /= 255.0
    total += chunk.sum(axis=(0, 1, 2))
    total_sq += np.square(chunk).sum(axis=(0, 1, 2))
  count = x_uint8.shape[0] * x_uint8.shape[1] * x_uint8.shape[2]
  mean = total / count
  # Values lie in [0, 1], so E[x^2] - E[x]^2 loses nothing in float64; the
  # clamp only removes rounding below zero for constant channels.
  var = np.maximum(total_sq / count - np.square(mean), 0.0)
  return mean.astype(np.float32), np.sqrt(var).astype(np.float32)


def normalize(x_uint8, mean, std):
  """Maps uint8 images to float32 ``(x / 255 - mean) / std``.

  Jit-able: with JAX inputs it uses only ``jax.numpy``; with NumPy inputs it
  stays in NumPy.

  Args:
    x_uint8: Images ``[..., H, W, C]`` uint8, e.g. ``[B, H, W, C]``.
    mean: Per-channel mean ``[C]`` on the [0, 1] scale.
    std: Per-channel standard deviation ``[C]``, positive.

  Returns:
    Float32 images with the shape of ``x_uint8``.

  Raises:
    ValueError: ``x_uint8`` is not uint8 or ``mean``/``std`` do not match the
      channel axis (both checks are on static shapes and dtypes).
  """
  if x_uint8.dtype != np.uint8:
    raise ValueError(f"normalize expects uint8 images, got {x_uint8.dtype}.")
  channels = x_uint8.shape[-1]
  for what, v in (("mean", mean), ("std", std)):
    if np.shape(v) not in ((channels,), (1,), ()):
      raise ValueError(
          f"{what} must have shape [{channels}] to match the channel axis, "
          f"got {np.shape(v)}.")
  # Tracers are jax.Array too, so under jit this always picks jax.numpy.
  is_jax = any(isinstance(a, jax.Array) for a in (x_uint8, mean, std))
  xp = jnp if is_jax else np
  x = x_uint8.astype(xp.float32) / xp.float32(255.0)
  mean = xp.asarray(mean, xp.float32)
  std = xp.asarray(std, xp.float32)
  return (x - mean) / std


@functools.partial(jax.jit, static_argnames=("out_shape", "method"))
def _resize_jax(x, out_shape: tuple[int, int, int], method: str):
  """Resizes uint8 ``[N, H, W, C]`` to ``[N, *out_shape]`` uint8 (checked)."""
  height, width, channels = out_shape
  if x.shape[-1] != channels:  # 1 -> 3: replicate the gray channel.
    x = jnp.repeat(x, channels, axis=-1)
  if method == "pad":
    top = (height - x.shape[1]) // 2
    left = (width - x.shape[2]) // 2
    return jnp.pad(x, ((0, 0), (top, height - x.shape[1] - top),
                       (left, width - x.shape[2] - left), (0, 0)))
  y = jax.image.resize(x.astype(jnp.float32),
                       (x.shape[0], height, width, channels), "bilinear")
  return jnp.clip(jnp.round(y), 0, 255).astype(jnp.uint8)


def resize_images(x, out_shape: tuple[int, int, int] = (32, 32, 3),
                  method: str = "bilinear", *, chunk_size: int = 4096):
  """Resizes uint8 images to ``out_shape``, e.g. MNIST 28x28x1 -> 32x32x3.

  Methods:

  * ``"bilinear"``: ``jax.image.resize(..., "bilinear")`` (half-pixel
    centres; antialiased when shrinking), rounded and clipped to uint8.
  * ``"pad"``: zero-pad, centred (an odd surplus goes to the bottom/right);
    only enlarges (MNIST 28x28 -> 32x32, the usual LeNet input).

  Equal channel counts are kept; 1 -> C repeats the gray channel; other
  changes are rejected. A JAX input is resized in one jitted call; a NumPy
  input in chunks of ``chunk_size`` images, bounding the float32
  intermediate.

  Args:
    x: Images ``[N, H, W, C]`` uint8.
    out_shape: Target ``(H, W, C)``.
    method: ``"bilinear"`` or ``"pad"``.
    chunk_size: Images per chunk for NumPy input.

  Returns:
    Images ``[N, *out_shape]`` uint8, same array kind as ``x``.

  Raises:
    ValueError: Unknown method, bad dtype/rank/out_shape, unsupported channel
      change, or ``"pad"`` asked to shrink.
  """
  _check_uint8_nhwc(x)
  if method not in _RESIZE_METHODS:
    raise ValueError(
        f"Unknown resize method {method!r}; use one of {_RESIZE_METHODS}.")
  out_shape = tuple(int(s) for s in out_shape)
  if len(out_shape) != 3 or min(out_shape) < 1:
    raise ValueError(
        f"out_shape must be (H, W, C) of positive ints, got {out_shape}.")
  in_c, out_c = x.shape[-1], out_shape[2]
  if in_c != out_c and in_c != 1:
    layout = ""
    if x.shape[1] in (1, 3, out_c) and in_c not in (1, 3):
      layout = (" They look channels-first (NCHW, channels on axis 1): "
                "transpose them with x.transpose(0, 2, 3, 1).")
    elif in_c == 3 and out_c == 1:
      layout = (" The model takes grayscale images: convert them (e.g. "
                "the channel mean) or give the model 3 input channels.")
    raise ValueError(
        f"Cannot map {in_c} channels to {out_c}: images must be NHWC "
        f"[N, H, W, Ch], got shape {tuple(x.shape)}, and only equal channel "
        f"counts or 1 -> C are supported.{layout}")
  if method == "pad" and (out_shape[0] < x.shape[1] or
                          out_shape[1] < x.shape[2]):
    raise ValueError(
        f"method='pad' only enlarges; cannot go from {x.shape[1:3]} to "
        f"{out_shape[:2]}. Use method='bilinear' to shrink.")
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be positive, got {chunk_size}.")
  if not isinstance(x, np.ndarray):
    return _resize_jax(x, out_shape, method)
  out = np.empty((x.shape[0], *out_shape), np.uint8)
  for start in range(0, x.shape[0], chunk_size):
    out[start:start + chunk_size] = np.asarray(
        _resize_jax(x[start:start + chunk_size], out_shape, method))
  return out
