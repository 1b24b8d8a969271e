"""Infinite-width NTK/NNGP kernels in pure JAX (no neural-tangents).

The architectures, arguments and call signature of
:mod:`fedjax_dd.kernels.ntk`, computed with neural-tangents' (``stax``)
layer recursions, so values agree to rounding (``tests/kernels/
test_native.py`` checks float64 golden values):

* :func:`fc_kernel`: ``Flatten -> depth x [Dense + ReLU] -> Dense``.
* :func:`conv_kernel`: ``depth x [Conv(3x3, SAME) + ReLU + AvgPool(2x2,
  stride 2, VALID)] -> Flatten -> Dense``.

Recursions (one client; ``nngp`` is the readout's Gaussian-process kernel,
``ntk`` the neural tangent kernel, ``v`` the per-input variances):

* input: ``nngp = <x1, x2> / Ch`` per pair of positions (``/ D`` for FC).
* Dense / Conv, NTK parameterisation: ``nngp' = W_std**2 A(nngp) + b_std**2``
  and ``ntk' = W_std**2 A(ntk) + nngp'``; standard parameterisation:
  ``ntk' = fan_in A(nngp) + W_std**2 A(ntk) + 1`` with the fan-in of the
  width-1 layers of ``ntk.py`` (``D`` or ``Ch * 9`` for the first layer,
  1 or 9 after it). ``A`` is the identity for Dense and, for the 3x3 SAME
  convolution, the mean over the 9 filter offsets applied to both positions
  of the spatial covariance ``[..., H, H, W, W]`` (zero padding).
* ReLU (Cho & Saul 2009, arc-cosine kernel of degree 1): with
  ``prod = v1 v2``, ``s = sqrt(prod - nngp**2)`` and ``theta =
  arctan2(s, nngp)``, ``nngp' = (s + (pi - theta) nngp) / (2 pi)`` and
  ``ntk' = ntk (pi - theta) / (2 pi)``.
* AvgPool 2x2: the mean over the 2x2 windows of both positions.
* Flatten: the mean over the spatial diagonal ``nngp[..., p, p]``.

Gradients. ``theta`` has an infinite derivative at ``cos = +-1`` (identical
inputs, every spatial diagonal entry) and the variances vanish on all-zero
inputs without biases. :func:`_relu_map`'s custom JVP uses ``d nngp' = (pi -
theta) / (2 pi) d nngp + s / (4 pi prod) d prod`` (bounded) and ``d theta =
(nngp d prod / (2 prod) - d nngp) / s``, set to 0 where ``s**2 <= 64 eps
prod`` (the symmetric subgradient of the kink, as neural-tangents gives at
``s = 0``), so input gradients stay finite for duplicate and all-zero
images.

Memory. The conv kernel keeps ``[n1, n2, H, H, W, W]`` covariances, as
neural-tangents does; the memory guard and blocked evaluation are
:mod:`fedjax_dd.kernels.blocking`'s, with ``impl="native"``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.kernels import blocking
from fedjax_dd.kernels.blocking import DEFAULT_MEMORY_BUDGET_BYTES
from fedjax_dd.kernels.blocking import estimate_kernel_bytes
from fedjax_dd.kernels.blocking import KernelFn

__all__ = ["DEFAULT_MEMORY_BUDGET_BYTES", "KernelFn", "conv_kernel",
           "estimate_kernel_bytes", "fc_kernel", "relu_map"]

_TWO_PI = 2 * np.pi


# ---------------------------------------------------------------------------
# ReLU arc-cosine map with safe derivatives.


def _sin_and_angle(c, prod):
  s2 = jnp.maximum(prod - c * c, 0)
  s = jnp.sqrt(s2)
  # arctan2(0, 0) is 0; neural-tangents fills pi / 2 (both inputs zero).
  theta = jnp.where((s == 0) & (c == 0), np.pi / 2, jnp.arctan2(s, c))
  return s2, s, theta


@jax.custom_jvp
def _relu_map(c: jax.Array, prod: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(nngp', dot)``: ReLU's output covariance and derivative kernel.

  ``c`` is the input covariance of a pair, ``prod`` the product of the two
  variances. ``dot = (pi - theta) / (2 pi)`` multiplies the NTK.
  """
  _, s, theta = _sin_and_angle(c, prod)
  dot = (np.pi - theta) / _TWO_PI
  return s / _TWO_PI + dot * c, dot


@_relu_map.defjvp
def _relu_map_jvp(primals, tangents):
  c, prod = primals
  dc, dprod = tangents
  s2, s, theta = _sin_and_angle(c, prod)
  dot = (np.pi - theta) / _TWO_PI
  out = (s / _TWO_PI + dot * c, dot)
  pos = prod > 0
  safe_prod = jnp.where(pos, prod, 1)
  d_prod_coef = jnp.where(pos, s / (2 * _TWO_PI * safe_prod), 0)
  d_nngp = dot * dc + d_prod_coef * dprod
  rtol = 64 * jnp.finfo(jnp.result_type(c)).eps
  live = (s2 > rtol * prod) & pos
  safe_s = jnp.where(live, s, 1)
  d_theta = jnp.where(live, (c * dprod / (2 * safe_prod) - dc) / safe_s, 0)
  return out, (d_nngp, -d_theta / _TWO_PI)


def relu_map(c: jax.Array, var1: jax.Array, var2: jax.Array
             ) -> tuple[jax.Array, jax.Array]:
  """The ReLU arc-cosine map of a covariance ``c`` given the variances.

  Args:
    c: covariances of pre-activations of a pair of inputs / positions.
    var1: variances of the first member (broadcastable to ``c``).
    var2: variances of the second member (broadcastable to ``c``).

  Returns:
    ``(E[relu(u) relu(v)], E[relu'(u) relu'(v)])`` for centred Gaussian
    ``(u, v)`` with that covariance, i.e. ``|x||y| (sin t + (pi - t) cos t) /
    (2 pi)`` and ``(pi - t) / (2 pi)``.
  """
  return _relu_map(c, var1 * var2)


# ---------------------------------------------------------------------------
# Layers on covariances.


def _affine(ntk, W_std, b_std, parameterization, fan_in, a_nngp, a_ntk):
  """Dense/Conv layer on (already spatially mapped) ``a_nngp``, ``a_ntk``.

  ``a_ntk`` None stands for an all-zero NTK (the input layer); ``ntk`` False
  means the NTK is not tracked.
  """
  new_nngp = W_std**2 * a_nngp + b_std**2
  if ntk is False:
    return new_nngp, False
  if parameterization == "ntk":
    new_ntk = new_nngp if a_ntk is None else W_std**2 * a_ntk + new_nngp
  else:
    new_ntk = fan_in * a_nngp + 1.0
    if a_ntk is not None:
      new_ntk = new_ntk + W_std**2 * a_ntk
  return new_nngp, new_ntk


# Spatial covariances are kept as ``[..., P, P', Q, Q']``: the two positions'
# coordinates along one image axis are adjacent, as in neural-tangents. Each
# convolution swaps which image axis comes first (``(P, Q)`` is ``(H, W)`` or
# ``(W, H)``); pooling, ReLU (whose variances ``[n, P, Q]`` are read off the
# same layout), the diagonal and Flatten are indifferent to the order.


def _conv3_last_pair(x: jax.Array) -> jax.Array:
  """Mean over the 3 shared offsets of the trailing axis pair (SAME)."""
  lead, (n, m) = x.shape[:-2], x.shape[-2:]
  rhs = (jnp.eye(3, dtype=x.dtype) / 3).reshape(1, 1, 3, 3)
  y = jax.lax.conv_general_dilated(
      x.reshape(-1, 1, n, m), rhs, (1, 1), "SAME",
      dimension_numbers=("NCHW", "OIHW", "NCHW"))
  return y.reshape(lead + (n, m))


def _conv3x3_same(cov: jax.Array) -> jax.Array:
  """``[..., P, P', Q, Q'] -> [..., Q, Q', P, P']``: mean over the 9 offsets.

  ``out[p, q] = mean_d cov[p + d, q + d]`` over ``d`` in ``{-1, 0, 1}**2``
  with zero padding (SAME): a diagonal 3x3 filter on each axis pair.
  """
  cov = _conv3_last_pair(cov)
  cov = jnp.moveaxis(cov, (-4, -3), (-2, -1))
  return _conv3_last_pair(cov)


def _patches3x3(x: jax.Array) -> jax.Array:
  """``[n, H, W, C] -> [n, H, W, 9 C]``: zero-padded 3x3 neighbourhoods."""
  h, w = x.shape[1], x.shape[2]
  p = jnp.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)])
  return jnp.concatenate([p[:, a:a + h, b:b + w, :] for a in range(3)
                          for b in range(3)], axis=-1)


def _avg_pool2(cov: jax.Array) -> jax.Array:
  """``[..., P, P, Q, Q]`` -> ``[..., P//2, P//2, Q//2, Q//2]`` (2x2 VALID)."""
  p, q = cov.shape[-4] // 2, cov.shape[-2] // 2
  lead = cov.shape[:-4]
  cov = cov[..., :2 * p, :2 * p, :2 * q, :2 * q]
  cov = cov.reshape(lead + (p, 2, p, 2, q, 2, q, 2))
  n = len(lead)
  return jnp.mean(cov, axis=(n + 1, n + 3, n + 5, n + 7))


def _spatial_diag(cov: jax.Array) -> jax.Array:
  """``[..., P, P, Q, Q]`` -> ``[..., P, Q]`` (entries at equal positions)."""
  return jnp.einsum("...ppqq->...pq", cov)


def _input_dtype(x: jax.Array) -> jax.Array:
  # As neural-tangents: the widest float enabled (float64 under x64).
  return x.astype(jax.dtypes.canonicalize_dtype(jnp.float64))


# ---------------------------------------------------------------------------
# Architectures.


def _fc_block(depth, W_std, b_std, kind, parameterization):
  track_ntk = kind == "ntk"

  def one_block(x1, x2):
    x1, x2 = _input_dtype(x1), _input_dtype(x2)
    d = x1.shape[1]
    nngp = x1 @ x2.T / d
    v1 = jnp.sum(x1 * x1, axis=1) / d
    v2 = jnp.sum(x2 * x2, axis=1) / d
    ntk = None if track_ntk else False
    fan_in = d
    for _ in range(depth):
      a_ntk = None if ntk is None or ntk is False else ntk
      nngp, ntk = _affine(ntk, W_std, b_std, parameterization, fan_in,
                          nngp, a_ntk)
      v1 = W_std**2 * v1 + b_std**2
      v2 = W_std**2 * v2 + b_std**2
      nngp, dot = relu_map(nngp, v1[:, None], v2[None, :])
      if ntk is not False:
        ntk = ntk * dot
      # The variances through the same map (cos = 1: v / 2).
      v1, _ = relu_map(v1, v1, v1)
      v2, _ = relu_map(v2, v2, v2)
      fan_in = 1
    a_ntk = None if ntk is None or ntk is False else ntk
    nngp, ntk = _affine(ntk, W_std, b_std, parameterization, fan_in,
                        nngp, a_ntk)
    return ntk if track_ntk else nngp

  return one_block


def _conv_self(x: jax.Array, depth: int, W_std: float, b_std: float
               ) -> list[jax.Array]:
  """Per-input spatial variances ``[n, P_l, Q_l]`` before each ReLU.

  Needs each input's own covariance ``[n, P, P, Q, Q]`` (average pooling
  mixes positions), i.e. the pair recursion on the batch diagonal.
  """
  variances = []
  cov = None
  for layer in range(depth):
    if layer == 0:
      # Conv of the input covariance <x_p, x_q> / Ch, in one contraction of
      # the 3x3 patches (the raw input covariance is never formed).
      pt = _patches3x3(x)
      a_cov = jnp.einsum("ahwk,axyk->ahxwy", pt, pt) / pt.shape[-1]
    else:
      a_cov = _conv3x3_same(cov)
    cov = W_std**2 * a_cov + b_std**2
    var = _spatial_diag(cov)
    variances.append(var)
    cov, _ = relu_map(cov, var[:, :, None, :, None], var[:, None, :, None, :])
    cov = _avg_pool2(cov)
  return variances


def _conv_block(depth, W_std, b_std, kind, parameterization):
  track_ntk = kind == "ntk"

  def one_block(x1, x2):
    x1, x2 = _input_dtype(x1), _input_dtype(x2)
    ch = x1.shape[-1]
    var1 = _conv_self(x1, depth, W_std, b_std)
    var2 = _conv_self(x2, depth, W_std, b_std)
    nngp = None
    ntk = None if track_ntk else False
    fan_in = ch * 9
    for layer in range(depth):
      if layer == 0:
        p1, p2 = _patches3x3(x1), _patches3x3(x2)
        a_nngp = jnp.einsum("ahwk,bxyk->abhxwy", p1, p2) / p1.shape[-1]
      else:
        a_nngp = _conv3x3_same(nngp)
      a_ntk = (None if ntk is None or ntk is False else _conv3x3_same(ntk))
      nngp, ntk = _affine(ntk, W_std, b_std, parameterization, fan_in,
                          a_nngp, a_ntk)
      v1, v2 = var1[layer], var2[layer]
      nngp, dot = relu_map(nngp, v1[:, None, :, None, :, None],
                           v2[None, :, None, :, None, :])
      nngp = _avg_pool2(nngp)
      if ntk is not False:
        ntk = _avg_pool2(ntk * dot)
      fan_in = 9
    # Flatten: the mean over the spatial diagonal; then the Dense readout.
    hf, wf = nngp.shape[-4], nngp.shape[-2]
    flat = jnp.mean(_spatial_diag(nngp), axis=(-2, -1))
    a_ntk = (None if ntk is None or ntk is False else
             jnp.mean(_spatial_diag(ntk), axis=(-2, -1)))
    nngp, ntk = _affine(ntk, W_std, b_std, parameterization, hf * wf,
                        flat, a_ntk)
    return ntk if track_ntk else nngp

  return one_block


def fc_kernel(
    depth: int = 4,
    W_std: float = math.sqrt(2.0),
    b_std: float = 0.1,
    kind: str = "ntk",
    *,
    parameterization: str = "ntk",
    batch_size: int | None = None,
) -> KernelFn:
  """Infinite-width fully-connected ReLU kernel, pure JAX.

  As :func:`fedjax_dd.kernels.ntk.fc_kernel`: ``Flatten -> depth x [Dense +
  ReLU] -> Dense`` with width-1 layers (which matter only for the standard
  parameterisation's NTK).

  Args:
    depth: number of hidden Dense+ReLU layers, >= 1.
    W_std: weight standard deviation.
    b_std: bias standard deviation.
    kind: ``"ntk"`` or ``"nngp"``.
    parameterization: ``"ntk"`` or ``"standard"``.
    batch_size: if set, the Gram matrix is computed in blocks of at most
      ``batch_size`` x ``batch_size``.

  Returns:
    ``k(x1, x2=None) -> [n1, n2]`` for ``x1 [n1, ...]`` and ``x2 [n2, ...]``
    (flattened inside); ``x2=None`` means ``x2 = x1``.

  Raises:
    ValueError: on an invalid argument (at construction) or mismatched input
      shapes (at trace time).
  """
  blocking.check_kind(kind)
  blocking.check_common(depth, W_std, b_std, parameterization, batch_size)
  block = _fc_block(depth, float(W_std), float(b_std), kind, parameterization)
  return blocking.finalize(block, batch_size, blocking.prepare_flat,
                           blocking.no_check)


def conv_kernel(
    depth: int = 3,
    W_std: float = math.sqrt(2.0),
    b_std: float = 0.1,
    kind: str = "ntk",
    *,
    parameterization: str = "ntk",
    batch_size: int | None = None,
    memory_budget_bytes: int | None = DEFAULT_MEMORY_BUDGET_BYTES,
    budget_for_grad: bool = True,
) -> KernelFn:
  """Infinite-width ConvNet kernel (KIP-ConvNet), pure JAX.

  As :func:`fedjax_dd.kernels.ntk.conv_kernel`: ``depth x [Conv(3x3, SAME)
  + ReLU + AvgPool(2x2, stride 2, VALID)] -> Flatten -> Dense``.

  Args:
    depth: number of conv blocks, >= 1.
    W_std: weight standard deviation.
    b_std: bias standard deviation.
    kind: ``"ntk"`` or ``"nngp"``.
    parameterization: ``"ntk"`` or ``"standard"``.
    batch_size: if set, compute the Gram matrix in blocks of at most
      ``batch_size`` x ``batch_size`` inputs.
    memory_budget_bytes: at trace time, raise ``ValueError`` if one block's
      estimate (``impl="native"``) exceeds this; None: no check.
    budget_for_grad: estimate the block for a gradient pass (KIP).

  Returns:
    ``k(x1, x2=None) -> [n1, n2]`` for NHWC ``x1 [n1, H, W, Ch]`` and
    ``x2 [n2, H, W, Ch]``; ``x2=None`` means ``x2 = x1``.

  Raises:
    ValueError: on an invalid argument (at construction), and at trace time
      on non-4D inputs, images too small for ``depth`` or a block over the
      memory budget.
  """
  blocking.check_kind(kind)
  blocking.check_common(depth, W_std, b_std, parameterization, batch_size)
  blocking.check_budget(memory_budget_bytes)
  block = _conv_block(depth, float(W_std), float(b_std), kind,
                      parameterization)
  return blocking.finalize(block, batch_size, blocking.prepare_images(depth),
                           blocking.budget_check(depth, memory_budget_bytes,
                                                 budget_for_grad,
                                                 impl="native"))
