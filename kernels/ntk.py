"""Infinite-width NTK/NNGP kernels built with ``neural_tangents.stax``.

Two architectures are provided:

* :func:`fc_kernel`, the fully-connected kernel FedD3 distils with (Song et
  al., "Federated Learning via Decentralized Dataset Distillation in
  Resource-Constrained Edge Environments", Eq. 4, following the KIP setup of
  Nguyen et al., ICLR 2021).
* :func:`conv_kernel`, the ConvNet kernel of KIP-ConvNet (Nguyen et al.,
  NeurIPS 2021): ``depth`` x [Conv 3x3 SAME + ReLU + AvgPool 2] then Flatten
  and a Dense readout.

:mod:`fedjax_dd.kernels.native` computes the same kernels in pure JAX, with
the same arguments (golden values: ``tests/kernels/golden_ntk.npz``).

Both factories return a pure ``k(x1, x2) -> [n1, n2]`` for ONE client:
jit-able, ``jax.vmap``-able over a client axis and differentiable in both
inputs (KIP differentiates w.r.t. the support set).

Memory. The ConvNet kernel keeps ``n1 * n2 * (H * W)**2`` floats per layer;
it refuses (``ValueError``, at trace time) a block whose
:func:`estimate_kernel_bytes` exceeds ``memory_budget_bytes`` and can
evaluate the Gram matrix in blocks of ``batch_size`` (see :func:`conv_kernel`).
"""

from __future__ import annotations

import math

import jax

try:
  from neural_tangents import stax
except ImportError as e:  # An optional extra since the native kernels.
  raise ImportError(
      "fedjax_dd.kernels.ntk needs neural-tangents, an optional extra that "
      "imports only with jax < 0.6: pip install \"fedjax-dd[nt]\". The "
      "native kernels (fedjax_dd.kernels.native, kip.kernel_impl=native, "
      "the default) compute the same kernels without it.") from e

from fedjax_dd.kernels import blocking
# Re-exported: the memory model and the kernel type are kernel-agnostic.
from fedjax_dd.kernels.blocking import DEFAULT_MEMORY_BUDGET_BYTES
from fedjax_dd.kernels.blocking import estimate_kernel_bytes
from fedjax_dd.kernels.blocking import KernelFn

__all__ = ["DEFAULT_MEMORY_BUDGET_BYTES", "KernelFn", "conv_kernel",
           "estimate_kernel_bytes", "fc_kernel"]


def _finalize(kernel_fn, kind: str, batch_size: int | None, prepare, check
              ) -> KernelFn:
  """Wraps an nt ``kernel_fn`` into ``k(x1, x2=None) -> [n1, n2]``."""

  def one_block(x1: jax.Array, x2: jax.Array) -> jax.Array:
    return kernel_fn(x1, x2, kind)

  return blocking.finalize(one_block, batch_size, prepare, check)


def fc_kernel(
    depth: int = 4,
    W_std: float = math.sqrt(2.0),
    b_std: float = 0.1,
    kind: str = "ntk",
    *,
    parameterization: str = "ntk",
    batch_size: int | None = None,
) -> KernelFn:
  """Infinite-width fully-connected ReLU kernel (FedD3 Eq. 4 / KIP FC).

  Architecture: ``Flatten -> depth x [Dense + ReLU] -> Dense`` readout
  (``depth + 1`` weight layers). The defaults (NTK parameterisation) are
  KIP's FC kernel used by FedD3. Memory is ``O(n1 * n2 + (n1 + n2) * D)``,
  so there is no budget check.

  Args:
    depth: number of hidden Dense+ReLU layers, >= 1.
    W_std: weight standard deviation.
    b_std: bias standard deviation (0 disables biases' contribution).
    kind: ``"ntk"`` (neural tangent kernel) or ``"nngp"`` (Gaussian-process
      kernel of the readout).
    parameterization: ``"ntk"`` or ``"standard"``.
    batch_size: if set, the Gram matrix is computed in blocks of at most
      ``batch_size`` x ``batch_size`` (see :func:`conv_kernel`).

  Returns:
    ``k(x1, x2=None) -> [n1, n2]`` for ``x1 [n1, ...]`` and ``x2 [n2, ...]``
    of the same per-example size (flattened inside); ``x2=None`` means
    ``x2 = x1``.

  Raises:
    ValueError: on an invalid argument (at construction) or mismatched input
      shapes (at trace time).
  """
  blocking.check_kind(kind)
  blocking.check_common(depth, W_std, b_std, parameterization, batch_size)
  layers = []
  for _ in range(depth):
    layers += [stax.Dense(1, W_std=W_std, b_std=b_std,
                          parameterization=parameterization),
               stax.Relu()]
  layers += [stax.Dense(1, W_std=W_std, b_std=b_std,
                        parameterization=parameterization)]
  _, _, kernel_fn = stax.serial(*layers)

  return _finalize(kernel_fn, kind, batch_size, blocking.prepare_flat,
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
  """Infinite-width ConvNet kernel (KIP-ConvNet, Nguyen et al. NeurIPS 2021).

  Architecture: ``depth x [Conv(3x3, stride 1, SAME) + ReLU + AvgPool(2x2,
  stride 2, VALID)] -> Flatten -> Dense`` readout. Each block halves the
  spatial size (floor), so ``H >> depth`` and ``W >> depth`` must be >= 1.

  Memory. neural-tangents keeps ``[n1, n2, H, H, W, W]`` covariances; one
  block needs about :func:`estimate_kernel_bytes` bytes (its table lists the
  largest blocks under 4 GiB). ``batch_size`` evaluates larger Gram matrices
  block by block, peaking at one block plus the ``[n1, n2]`` output. Under
  ``jax.vmap`` over ``C`` clients the peak is ``C`` times larger; the check
  sees one client only.

  Args:
    depth: number of conv blocks, >= 1.
    W_std: weight standard deviation.
    b_std: bias standard deviation.
    kind: ``"ntk"`` or ``"nngp"``.
    parameterization: ``"ntk"`` or ``"standard"``.
    batch_size: if set, compute the Gram matrix in blocks of at most
      ``batch_size`` x ``batch_size`` inputs with ``jax.lax.map`` (padding the
      last block); if None, one block.
    memory_budget_bytes: at trace time, raise ``ValueError`` if the estimated
      peak of one block exceeds this; None disables the check.
    budget_for_grad: estimate the block for a gradient pass (KIP).

  Returns:
    ``k(x1, x2=None) -> [n1, n2]`` for ``x1 [n1, H, W, Ch]`` and
    ``x2 [n2, H, W, Ch]`` (NHWC); ``x2=None`` means ``x2 = x1``.

  Raises:
    ValueError: on an invalid argument (at construction), and at trace time
      on non-4D inputs, images too small for ``depth`` or a block over the
      memory budget.
  """
  blocking.check_kind(kind)
  blocking.check_common(depth, W_std, b_std, parameterization, batch_size)
  blocking.check_budget(memory_budget_bytes)
  layers = []
  for _ in range(depth):
    layers += [stax.Conv(1, (3, 3), strides=(1, 1), padding="SAME",
                         W_std=W_std, b_std=b_std,
                         dimension_numbers=("NHWC", "HWIO", "NHWC"),
                         parameterization=parameterization),
               stax.Relu(),
               stax.AvgPool((2, 2), strides=(2, 2), padding="VALID")]
  layers += [stax.Flatten(),
             stax.Dense(1, W_std=W_std, b_std=b_std,
                        parameterization=parameterization)]
  _, _, kernel_fn = stax.serial(*layers)

  return _finalize(kernel_fn, kind, batch_size,
                   blocking.prepare_images(depth),
                   blocking.budget_check(depth, memory_budget_bytes,
                                         budget_for_grad))
