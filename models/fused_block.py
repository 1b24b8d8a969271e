"""A first convolution block computed as one function with its own gradient.

``avg_pool(relu(instance_norm(conv(x))))`` for a convolution with few input
channels (ConvNet's first block, 3 -> 128 channels), the same function as
the four layers (:class:`layers.Conv` without its bias,
:class:`layers.InstanceNorm`, ReLU, :func:`layers.avg_pool`) to float
rounding, with the same variables. Why: XLA:CPU does not fuse an
element-wise producer into a reduction that keeps the channel axis, so the
four layers' gradient writes and re-reads the full-size activations
``[B, H, W, O]`` many times. Here:

* the statistics come from the receptive fields ``P [B, N, K]`` (``N = H *
  W`` pixels, ``K = kh * kw * Ch``, 27 for RGB) and the kernel ``W [K, O]``,
  since ``y = P W``: the spatial mean is ``(sum_n P) W / N`` and the mean
  square ``diag(W^T (P^T P) W) / N``, from a ``[K, K]`` Gram matrix per
  example, without a pass over ``y``;
* the pool is four strided slices of the normalised, rectified ``y``, added
  in one element-wise pass that writes a quarter of ``y``;
* the backward pass materialises one full-size array (the pool's gradient
  through the ReLU, ``g_z``), sums it over space, and contracts it with
  ``P`` per example (``M = P^T g_z``); the kernel's gradient ``P^T dy`` is
  assembled from ``M``, ``sum_n P`` and ``P^T P W`` without forming the
  norm's input gradient ``dy`` (formed only when the input's gradient
  is used, e.g. by data-free distillation through the model).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from fedjax_dd import policy
from fedjax_dd.models import layers


def fuses_first_block(platform: str | None = None) -> bool:
  """Whether ConvNet computes its first block with
  :func:`conv_instance_norm_relu_avg_pool` by default: the policy's
  ``fuse_first_block`` (:func:`fedjax_dd.policy.lookup`).

  True on CPU only: GPU and TPU compilers fuse element-wise producers into
  reductions, the problem this works around.

  Args:
    platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``; default JAX's default
      backend.
  """
  return policy.lookup(platform).fuse_first_block


class ConvVariables(nn.Module):
  """``kernel [kh, kw, Ch, O]`` and ``bias [O]`` with ``nn.Conv``'s names,
  shapes and initialisers, declared without computing anything."""

  features: int
  kernel_size: tuple[int, int]

  @nn.compact
  def __call__(self, in_features: int) -> tuple[jax.Array, jax.Array]:
    return layers.conv_params(self, self.kernel_size, in_features,
                              self.features)


class InstanceNormVariables(nn.Module):
  """``scale [Ch]`` and ``bias [Ch]`` with ``nn.InstanceNorm``'s names,
  shapes and initialisers, declared without computing anything."""

  @nn.compact
  def __call__(self, features: int) -> tuple[jax.Array, jax.Array]:
    return layers.instance_norm_params(self, features)


def conv_instance_norm_relu_avg_pool(x: jax.Array, kernel: jax.Array,
                                     scale: jax.Array, bias: jax.Array,
                                     epsilon: float = 1e-5) -> jax.Array:
  """``avg_pool(relu(instance_norm(conv(x, kernel))))`` with a custom VJP.

  A stride-1 SAME convolution without bias (instance norm cancels one),
  flax's instance norm and a 2x2 stride-2 VALID pool. See the module
  docstring.

  Args:
    x: Images ``[B, H, W, Ch]``.
    kernel: ``[kh, kw, Ch, O]`` (HWIO).
    scale: Instance norm scale ``[O]``.
    bias: Instance norm bias ``[O]``.
    epsilon: Added to the variance.

  Returns:
    ``[B, H // 2, W // 2, O]``.

  Raises:
    ValueError: If the shapes do not fit together or ``H, W < 2``.
  """
  if x.ndim != 4 or kernel.ndim != 4 or kernel.shape[2] != x.shape[3]:
    raise ValueError(
        f"Expected x [B, H, W, Ch] and kernel [kh, kw, Ch, O], got "
        f"{x.shape} and {kernel.shape}.")
  if scale.shape != (kernel.shape[3],) or bias.shape != scale.shape:
    raise ValueError(f"scale and bias must be [{kernel.shape[3]}], got "
                     f"{scale.shape} and {bias.shape}.")
  if min(x.shape[1:3]) < 2:
    raise ValueError(f"The 2x2 pool needs H, W >= 2, got {x.shape[1:3]}.")
  return _block(x, kernel, scale, bias, float(epsilon))


def _patches(x: jax.Array, window: tuple[int, int]) -> jax.Array:
  """Receptive fields ``[B, H * W, kh * kw * Ch]`` (SAME, stride 1)."""
  b, h, w, _ = x.shape
  return layers.slice_patches(x, window, (1, 1), "SAME", (1, 1)).reshape(
      b, h * w, -1)


def _pool(z: jax.Array) -> jax.Array:
  """2x2 average pool, stride 2, VALID, as four strided slices added: one
  element-wise pass (a reduction over the window axes would materialise
  ``z`` first on XLA:CPU)."""
  b, h, w, c = z.shape
  lim = (b, 2 * (h // 2), 2 * (w // 2), c)
  part = lambda i, j: lax.slice(z, (0, i, j, 0), lim, (1, 2, 2, 1))
  return (part(0, 0) + part(0, 1) + part(1, 0) + part(1, 1)) * 0.25


def _unpool(g: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """The pool's transpose: each pooled gradient / 4 over its 2x2 window,
  zeros on a dropped odd row or column."""
  b, h, w, c = shape
  ho, wo = h // 2, w // 2
  up = jnp.broadcast_to(g[:, :, None, :, None, :] * 0.25,
                        (b, ho, 2, wo, 2, c)).reshape(b, 2 * ho, 2 * wo, c)
  return jnp.pad(up, ((0, 0), (0, h - 2 * ho), (0, w - 2 * wo), (0, 0)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _block(x, kernel, scale, bias, epsilon):
  return _block_fwd(x, kernel, scale, bias, epsilon)[0]


def _block_fwd(x, kernel, scale, bias, epsilon):
  kh, kw, _, o = kernel.shape
  b, h, w, _ = x.shape
  n = h * w
  p = _patches(x, (kh, kw))                                   # [B, N, K]
  wf = kernel.reshape(-1, o)                                  # [K, O]
  y = lax.dot_general(p, wf, (((2,), (0,)), ((), ())))        # [B, N, O]
  p_sum = jnp.sum(p, axis=1)                                  # [B, K]
  gram = lax.dot_general(p, p, (((1,), (1,)), ((0,), (0,))))  # [B, K, K]
  gram_w = lax.dot_general(gram, wf, (((2,), (0,)), ((), ())))  # [B, K, O]
  mean = (p_sum @ wf) / n                                     # [B, O]
  mean_sq = jnp.sum(gram_w * wf, axis=1) / n                  # [B, O]
  var_raw = mean_sq - jnp.square(mean)
  rstd = lax.rsqrt(jnp.maximum(var_raw, 0.0) + epsilon)
  k = rstd * scale                                            # [B, O]
  c = bias - mean * k
  y = y.reshape(b, h, w, o)
  z = jnp.maximum(y * k[:, None, None] + c[:, None, None], 0.0)
  return _pool(z), (kernel, p, y, p_sum, gram_w, mean, rstd, k, c, var_raw)


def _block_bwd(epsilon, res, g):
  del epsilon
  kernel, p, y, p_sum, gram_w, mean, rstd, k, c, var_raw = res
  kh, kw, ch, o = kernel.shape
  b, h, w, _ = y.shape
  n = h * w
  wf = kernel.reshape(-1, o)
  # The pool's and the ReLU's gradient (z is recomputed, not stored).
  g_z = jnp.where(y * k[:, None, None] + c[:, None, None] > 0,
                  _unpool(g, y.shape), 0.0)                   # [B, H, W, O]
  # The barrier keeps XLA from merging this with the batch sum below into
  # one channel-only reduction, which XLA:CPU runs much slower.
  s_g = lax.optimization_barrier(jnp.sum(g_z, axis=(1, 2)))  # [B, O]
  m = lax.dot_general(p, g_z.reshape(b, n, o),
                      (((1,), (1,)), ((0,), (0,))))           # [B, K, O]
  s_gy = jnp.sum(m * wf, axis=1)                              # sum_n g_z y
  s_gx = rstd * (s_gy - mean * s_g)                           # sum_n g_z xhat
  # jnp.maximum's gradient where the variance was clipped: 1 above 0, 1/2
  # at 0 (a tie), 0 below.
  through_var = jnp.where(var_raw > 0, 1.0,
                          jnp.where(var_raw == 0, 0.5, 0.0))
  # The norm's input gradient, dy = k g_z - a1 - a2 (y - mean), with per
  # example and channel (the mean's and the variance's paths):
  a1 = k * s_g / n
  a2 = k * rstd * through_var * s_gx / n
  # dW = sum_b P_b^T dy_b, with P^T y = P^T P W (gram_w):
  d_wf = jnp.sum(m * k[:, None] - p_sum[:, :, None] * (a1 - a2 * mean)[:, None]
                 - gram_w * a2[:, None], axis=0)
  d_scale = jnp.sum(s_gx, axis=0)
  d_bias = jnp.sum(s_g, axis=0)
  # The input's gradient (unused, and removed by XLA, for data batches).
  dy = (g_z * k[:, None, None] - a1[:, None, None]
        - a2[:, None, None] * (y - mean[:, None, None])).reshape(b, n, o)
  d_p = lax.dot_general(dy, wf, (((2,), (1,)), ((), ())))     # [B, N, K]
  # The patches are linear in x (p has its dtype): their transpose needs
  # x's shape, not x, which is therefore not kept from the forward pass.
  x_like = jax.ShapeDtypeStruct((b, h, w, ch), p.dtype)
  (d_x,) = jax.linear_transpose(lambda v: _patches(v, (kh, kw)), x_like)(
      d_p.astype(p.dtype))
  return d_x, d_wf.reshape(kernel.shape), d_scale, d_bias


_block.defvjp(_block_fwd, _block_bwd)
