"""Infinite-width NTK/NNGP kernels in pure JAX (no neural-tangents).

The same two architectures, arguments and call signature as
:mod:`fedjax_dd.kernels.ntk`, computed with the layer recursions that
neural-tangents 0.6.5 (``stax``) applies for them, so the values agree to
rounding (``tests/kernels/test_native.py`` checks float64 golden values):

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
  of the spatial covariance ``[..., H, W, H, W]`` (zero padding).
* ReLU (Cho & Saul 2009, arc-cosine kernel of degree 1): with
  ``prod = v1 v2``, ``s = sqrt(prod - nngp**2)`` and ``theta =
  arctan2(s, nngp)``, ``nngp' = (s + (pi - theta) nngp) / (2 pi)`` and
  ``ntk' = ntk (pi - theta) / (2 pi)``.
* AvgPool 2x2: the mean over the 2x2 windows of both positions.
* Flatten: the mean over the spatial diagonal ``nngp[..., p, p]``.

Gradients. ``theta`` has an infinite derivative in the correlation at
``cos = +-1`` (identical inputs, every spatial diagonal entry) and the
variances vanish on all-zero inputs without biases. :func:`_relu_map` has a
custom JVP with the analytic derivatives: ``d nngp' = (pi - theta) / (2 pi)
d nngp + s / (4 pi prod) d prod`` (bounded everywhere) and, for the NTK's
``(pi - theta) / (2 pi)``, ``d theta = (nngp d prod / (2 prod) - d nngp) /
s``, which is set to 0 where ``s**2 <= 64 eps prod`` (the symmetric
subgradient of the kink at coinciding inputs; neural-tangents' ``_sqrt`` /
``_arctan2`` give the same 0 at ``s = 0`` exactly). Gradients with respect
to the inputs therefore stay finite for duplicate and all-zero images.

Memory. The conv kernel keeps ``[n1, n2, H, W, H, W]`` covariances, as
neural-tangents does; the memory guard and blocked evaluation are the shared
ones of :mod:`fedjax_dd.kernels.blocking` (the estimate bounds this
implementation's peak too).
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


def _affine(nngp, ntk, W_std, b_std, parameterization, fan_in, a_nngp,
            a_ntk):
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
  del nngp
  return new_nngp, new_ntk


def _conv3x3_same(cov: jax.Array) -> jax.Array:
  """``[..., H, W, H, W]``: mean over the 9 offsets shared by both positions.

  Separable: 3 diagonal offsets on the (H, H) pair, then on the (W, W) pair,
  with zero padding (SAME).
  """
  nd = cov.ndim
  h, w = cov.shape[-4], cov.shape[-3]

  def along(x, ax1, ax2, n):
    pad = [(0, 0)] * nd
    pad[ax1] = pad[ax2] = (1, 1)
    p = jnp.pad(x, pad)
    out = None
    for a in range(3):
      idx = [slice(None)] * nd
      idx[ax1] = idx[ax2] = slice(a, a + n)
      term = p[tuple(idx)]
      out = term if out is None else out + term
    return out

  cov = along(cov, nd - 4, nd - 2, h)
  cov = along(cov, nd - 3, nd - 1, w)
  return cov / 9.0


def _avg_pool2(cov: jax.Array) -> jax.Array:
  """``[..., H, W, H, W]`` -> ``[..., H//2, W//2, H//2, W//2]`` (2x2 VALID)."""
  h, w = cov.shape[-4] // 2, cov.shape[-3] // 2
  lead = cov.shape[:-4]
  cov = cov[..., :2 * h, :2 * w, :2 * h, :2 * w]
  cov = cov.reshape(lead + (h, 2, w, 2, h, 2, w, 2))
  n = len(lead)
  return jnp.mean(cov, axis=(n + 1, n + 3, n + 5, n + 7))


def _spatial_diag(cov: jax.Array) -> jax.Array:
  """``[..., H, W, H, W]`` -> ``[..., H, W]`` (entries at equal positions)."""
  h, w = cov.shape[-4], cov.shape[-3]
  flat = cov.reshape(cov.shape[:-4] + (h * w, h * w))
  return jnp.diagonal(flat, axis1=-2, axis2=-1).reshape(cov.shape[:-4] +
                                                        (h, w))


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
      nngp, ntk = _affine(nngp, ntk, W_std, b_std, parameterization, fan_in,
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
    nngp, ntk = _affine(nngp, ntk, W_std, b_std, parameterization, fan_in,
                        nngp, a_ntk)
    return ntk if track_ntk else nngp

  return one_block


def _conv_self(x: jax.Array, depth: int, W_std: float, b_std: float
               ) -> list[jax.Array]:
  """Per-input spatial variances ``[n, H_l, W_l]`` before each ReLU.

  Needs each input's own covariance ``[n, H, W, H, W]`` (average pooling
  mixes positions), i.e. the pair recursion on the batch diagonal.
  """
  ch = x.shape[-1]
  cov = jnp.einsum("ahwc,axyc->ahwxy", x, x) / ch
  variances = []
  for _ in range(depth):
    cov = W_std**2 * _conv3x3_same(cov) + b_std**2
    var = _spatial_diag(cov)
    variances.append(var)
    cov, _ = relu_map(cov, var[:, :, :, None, None], var[:, None, None, :, :])
    cov = _avg_pool2(cov)
  return variances


def _conv_block(depth, W_std, b_std, kind, parameterization):
  track_ntk = kind == "ntk"

  def one_block(x1, x2):
    x1, x2 = _input_dtype(x1), _input_dtype(x2)
    ch = x1.shape[-1]
    var1 = _conv_self(x1, depth, W_std, b_std)
    var2 = _conv_self(x2, depth, W_std, b_std)
    nngp = jnp.einsum("ahwc,bxyc->abhwxy", x1, x2) / ch
    ntk = None if track_ntk else False
    fan_in = ch * 9
    for layer in range(depth):
      a_nngp = _conv3x3_same(nngp)
      a_ntk = (None if ntk is None or ntk is False else _conv3x3_same(ntk))
      nngp, ntk = _affine(nngp, ntk, W_std, b_std, parameterization, fan_in,
                          a_nngp, a_ntk)
      v1, v2 = var1[layer], var2[layer]
      nngp, dot = relu_map(nngp, v1[:, None, :, :, None, None],
                           v2[None, :, None, None, :, :])
      nngp = _avg_pool2(nngp)
      if ntk is not False:
        ntk = _avg_pool2(ntk * dot)
      fan_in = 9
    # Flatten: the mean over the spatial diagonal; then the Dense readout.
    hf, wf = nngp.shape[-4], nngp.shape[-3]
    flat = jnp.mean(_spatial_diag(nngp), axis=(-2, -1))
    a_ntk = (None if ntk is None or ntk is False else
             jnp.mean(_spatial_diag(ntk), axis=(-2, -1)))
    nngp, ntk = _affine(flat, ntk, W_std, b_std, parameterization, hf * wf,
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

  Same architecture, arguments and return value as
  :func:`fedjax_dd.kernels.ntk.fc_kernel`: ``Flatten -> depth x [Dense +
  ReLU] -> Dense`` with width-1 layers (which only matter for the standard
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

  Same architecture, arguments, memory guard and return value as
  :func:`fedjax_dd.kernels.ntk.conv_kernel`: ``depth x [Conv(3x3, stride 1,
  SAME) + ReLU + AvgPool(2x2, stride 2, VALID)] -> Flatten -> Dense``.

  Args:
    depth: number of conv blocks, >= 1.
    W_std: weight standard deviation.
    b_std: bias standard deviation.
    kind: ``"ntk"`` or ``"nngp"``.
    parameterization: ``"ntk"`` or ``"standard"``.
    batch_size: if set, compute the Gram matrix in blocks of at most
      ``batch_size`` x ``batch_size`` inputs.
    memory_budget_bytes: at trace time, raise ``ValueError`` if
      :func:`estimate_kernel_bytes` of one block exceeds this; None disables
      the check.
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
                                                 budget_for_grad))
