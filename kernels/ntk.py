"""Infinite-width NTK/NNGP kernels built with ``neural_tangents.stax``.

Two architectures are provided:

* :func:`fc_kernel`, the fully-connected kernel FedD3 distils with (Song et
  al., "Federated Learning via Decentralized Dataset Distillation in
  Resource-Constrained Edge Environments", Eq. 4, following the KIP setup of
  Nguyen et al., ICLR 2021).
* :func:`conv_kernel`, the ConvNet kernel of KIP-ConvNet (Nguyen et al.,
  NeurIPS 2021): ``depth`` x [Conv 3x3 SAME + ReLU + AvgPool 2] then Flatten
  and a Dense readout.

Both factories return a pure function ``k(x1, x2) -> [n1, n2]`` for ONE
client. It is jit-able, ``jax.vmap``-able over a leading client axis and
differentiable with respect to both inputs (KIP differentiates through it with
respect to the support set).

Memory. The infinite-width ConvNet kernel keeps the full spatial covariance of
every pair of inputs, i.e. arrays of ``n1 * n2 * (H * W)**2`` floats per
layer. :func:`estimate_kernel_bytes` gives a calibrated estimate; the conv
kernel refuses (``ValueError``, at trace time) a block whose estimate exceeds
``memory_budget_bytes`` and can evaluate the Gram matrix in blocks of
``batch_size`` rows and columns with ``jax.lax.map``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import math

import jax
import jax.numpy as jnp
from neural_tangents import stax

KernelFn = Callable[..., jax.Array]

_KINDS = ("ntk", "nngp")
_PARAMETERIZATIONS = ("ntk", "standard")

DEFAULT_MEMORY_BUDGET_BYTES = 4 * 2**30

# Calibration of the conv-kernel memory model (see `estimate_kernel_bytes`):
# peak temporary bytes / (itemsize * (H * W)**2), fitted to XLA's compiled
# memory analysis on the CPU backend (jax 0.5.3, neural-tangents 0.6.5) for
# n in {1, 4, 8, 16}, H in {8, 16, 28, 32}, depth in {1, 2, 3}. The pairwise
# coefficient multiplies n1 * n2, the per-input one n1 + n2 (the
# per-input spatial covariances `cov1`, `cov2`). Rounded up; the estimate
# over-predicts the measured peak by 10-25%.
_PAIR_COEF_FWD = 3.1
_SINGLE_COEF_FWD = 1.5
_PAIR_COEF_GRAD = 8.2
_PAIR_COEF_GRAD_DEPTH1 = 4.3
_SINGLE_COEF_GRAD = 1.7


def _check_kind(kind: str) -> None:
  if kind not in _KINDS:
    raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}.")


def _check_common(depth: int, W_std: float, b_std: float,
                  parameterization: str, batch_size: int | None) -> None:
  if not isinstance(depth, int) or depth < 1:
    raise ValueError(f"depth must be an int >= 1, got {depth!r}.")
  if not W_std > 0:
    raise ValueError(f"W_std must be > 0, got {W_std!r}.")
  if not b_std >= 0:
    raise ValueError(f"b_std must be >= 0, got {b_std!r}.")
  if parameterization not in _PARAMETERIZATIONS:
    raise ValueError(f"parameterization must be one of {_PARAMETERIZATIONS}, "
                     f"got {parameterization!r}.")
  if batch_size is not None and (not isinstance(batch_size, int)
                                 or batch_size < 1):
    raise ValueError(f"batch_size must be None or an int >= 1, "
                     f"got {batch_size!r}.")


def estimate_kernel_bytes(
    n1: int,
    n2: int,
    image_shape: Sequence[int],
    depth: int,
    *,
    with_grad: bool = True,
    itemsize: int = 4,
) -> int:
  """Estimates the peak temporary memory of one conv-kernel block.

  Model: ``itemsize * (H * W)**2 * (a * n1 * n2 + b * (n1 + n2))``. The first
  layer dominates (every AvgPool divides ``(H * W)**2`` by 16), so depth only
  matters through ``a`` for a gradient with ``depth == 1``. The coefficients
  were fitted to XLA's compiled memory analysis on CPU (module constants);
  the estimate over-predicts the measured peak by 10-25%. Input channels do
  not enter: the first layer contracts them.

  Largest square blocks under a 4 GiB budget (float32, ``depth=3``):

  ==========  ==============  ============
  images      with gradients  forward only
  ==========  ==============  ============
  28x28       14 x 14         23 x 23
  32x32x3     10 x 10         17 x 17
  12x12       79 x 79         128 x 128
  8x8         178 x 178       290 x 290
  ==========  ==============  ============

  Measured peaks for 28x28, ``depth=3``: an 8 x 8 block takes 1.1 GiB with
  gradients (estimate 1.26 GiB); a 16 x 16 Gram matrix takes 4.3 GiB with
  gradients in one block but 0.30 GiB with ``batch_size=4``.

  Args:
    n1: rows of the block (number of ``x1`` inputs).
    n2: columns of the block (number of ``x2`` inputs).
    image_shape: ``(H, W)`` or ``(H, W, Ch)`` of one input.
    depth: number of conv blocks of the kernel.
    with_grad: estimate for the gradient (reverse mode through the kernel,
      as in KIP) instead of a forward evaluation.
    itemsize: bytes per float (4 for float32, 8 for float64).

  Returns:
    Estimated peak temporary bytes of one block evaluation for ONE client.
    Under ``jax.vmap`` over ``C`` clients the peak is ``C`` times larger.

  Raises:
    ValueError: on a non-positive size or an image shape of the wrong rank.
  """
  if n1 < 1 or n2 < 1:
    raise ValueError(f"n1 and n2 must be >= 1, got {n1}, {n2}.")
  if len(image_shape) not in (2, 3):
    raise ValueError(f"image_shape must be (H, W) or (H, W, Ch), "
                     f"got {tuple(image_shape)}.")
  if depth < 1:
    raise ValueError(f"depth must be >= 1, got {depth}.")
  h, w = int(image_shape[0]), int(image_shape[1])
  spatial = float(h * w) ** 2
  if with_grad:
    pair = _PAIR_COEF_GRAD if depth >= 2 else _PAIR_COEF_GRAD_DEPTH1
    single = _SINGLE_COEF_GRAD
  else:
    pair, single = _PAIR_COEF_FWD, _SINGLE_COEF_FWD
  return int(math.ceil(itemsize * spatial * (pair * n1 * n2 + single *
                                             (n1 + n2))))


def _blocked(fn: KernelFn, batch_size: int | None) -> KernelFn:
  """Evaluates ``fn(x1, x2)`` in ``batch_size`` x ``batch_size`` blocks.

  Rows and columns are padded (edge-repeated, so no degenerate all-zero
  inputs reach the kernel) to a multiple of ``batch_size``, mapped over with
  nested ``jax.lax.map`` and sliced back. Each block is wrapped in
  ``jax.checkpoint`` so the backward pass stores only block inputs, not the
  spatial covariances of every block. Decisions depend on static shapes only.
  """
  if batch_size is None:
    return fn
  block = jax.checkpoint(fn)

  def _split(x, bs):
    n = x.shape[0]
    nb = -(-n // bs)
    pad = nb * bs - n
    if pad:
      x = jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)], axis=0)
    return x.reshape((nb, bs) + x.shape[1:])

  def blocked(x1, x2):
    n1, n2 = x1.shape[0], x2.shape[0]
    if n1 <= batch_size and n2 <= batch_size:
      return fn(x1, x2)
    b1, b2 = min(batch_size, n1), min(batch_size, n2)
    x1b, x2b = _split(x1, b1), _split(x2, b2)
    # out[i, j] = block (x1b[i], x2b[j]) of shape [b1, b2].
    out = jax.lax.map(
        lambda a: jax.lax.map(lambda b: block(a, b), x2b), x1b)
    nb1, nb2 = out.shape[0], out.shape[1]
    out = out.transpose(0, 2, 1, 3).reshape(nb1 * b1, nb2 * b2)
    return out[:n1, :n2]

  return blocked


def _as_float(x) -> jax.Array:
  """Casts integer inputs (e.g. uint8 images) to the default float dtype."""
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    x = x.astype(jnp.result_type(float))
  return x


def _finalize(kernel_fn, kind: str, batch_size: int | None,
              prepare: Callable[[jax.Array], jax.Array],
              check: Callable[[int, int, tuple[int, ...], int], None]
              ) -> KernelFn:
  """Wraps an nt ``kernel_fn`` into ``k(x1, x2=None) -> [n1, n2]``."""

  def one_block(x1, x2):
    return kernel_fn(x1, x2, kind)

  # Jitted so eager calls do not dispatch neural-tangents' many small ops one
  # by one; inside an outer jit/vmap/grad this is inlined.
  blocked = jax.jit(_blocked(one_block, batch_size))

  def k(x1: jax.Array, x2: jax.Array | None = None) -> jax.Array:
    x1 = prepare(_as_float(x1))
    x2 = x1 if x2 is None else prepare(_as_float(x2))
    if x1.shape[1:] != x2.shape[1:]:
      raise ValueError(f"x1 and x2 must have the same per-example shape, got "
                       f"{x1.shape[1:]} and {x2.shape[1:]}.")
    if x1.shape[0] == 0 or x2.shape[0] == 0:
      return jnp.zeros((x1.shape[0], x2.shape[0]), x1.dtype)
    n1, n2 = x1.shape[0], x2.shape[0]
    if batch_size is not None:
      n1, n2 = min(n1, batch_size), min(n2, batch_size)
    check(n1, n2, x1.shape[1:], x1.dtype.itemsize)
    return blocked(x1, x2)

  return k


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

  Architecture: ``Flatten -> depth x [Dense + ReLU] -> Dense`` readout, i.e.
  ``depth`` counts the hidden (Dense, ReLU) pairs; the readout Dense is extra,
  so the network has ``depth + 1`` weight layers. ``depth=4`` with
  ``W_std=sqrt(2)``, ``b_std=0.1`` and NTK parameterisation is the FC kernel
  of KIP used by FedD3. Layer widths do not enter the infinite-width kernel.

  Memory is ``O(n1 * n2 + (n1 + n2) * D)`` for ``D`` input features, so no
  budget check is needed; ``batch_size`` is available for very large Gram
  matrices.

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
    ``k(x1, x2=None) -> [n1, n2]`` with ``x1`` of shape ``[n1, ...]`` (NHWC
    images ``[n1, H, W, Ch]`` or flat ``[n1, D]``; flattened inside) and
    ``x2`` of shape ``[n2, ...]`` with the same per-example size; ``x2=None``
    means ``x2 = x1``.

  Raises:
    ValueError: on an invalid argument (at construction) or mismatched input
      shapes (at trace time).
  """
  _check_kind(kind)
  _check_common(depth, W_std, b_std, parameterization, batch_size)
  layers = []
  for _ in range(depth):
    layers += [stax.Dense(1, W_std=W_std, b_std=b_std,
                          parameterization=parameterization),
               stax.Relu()]
  layers += [stax.Dense(1, W_std=W_std, b_std=b_std,
                        parameterization=parameterization)]
  _, _, kernel_fn = stax.serial(*layers)

  def prepare(x):
    if x.ndim < 2:
      raise ValueError(f"inputs must be [n, ...] with at least 2 dims, got "
                       f"shape {x.shape}.")
    return x.reshape(x.shape[0], -1)

  return _finalize(kernel_fn, kind, batch_size, prepare,
                   lambda n1, n2, shape, itemsize: None)


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
  Channel counts do not enter the infinite-width kernel.

  Memory limits. neural-tangents keeps ``[n1, n2, H, H, W, W]`` covariances;
  one block of ``n1`` x ``n2`` inputs needs about
  :func:`estimate_kernel_bytes` bytes. Measured (CPU, float32, ``depth=3``):
  an 8 x 8 block of 28x28 images peaks at 0.44 GiB forward and 1.1 GiB with
  gradients, so a 4 GiB budget admits blocks of about 14 x 14 28x28 images
  with gradients (23 x 23 forward only), 10 x 10 32x32 images. Use
  ``batch_size`` to evaluate larger Gram matrices block by block: the peak
  then stays at one block (plus the ``[n1, n2]`` output), at the cost of
  sequential blocks. Under ``jax.vmap`` over ``C`` clients the peak is ``C``
  times the per-client figure; the check below sees one client only.

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
    budget_for_grad: estimate the block for a gradient pass (KIP) rather than
      a forward evaluation.

  Returns:
    ``k(x1, x2=None) -> [n1, n2]`` for ``x1 [n1, H, W, Ch]`` and
    ``x2 [n2, H, W, Ch]`` (NHWC); ``x2=None`` means ``x2 = x1``.

  Raises:
    ValueError: on an invalid argument (at construction), and at trace time
      on non-4D inputs, images too small for ``depth`` or a block over the
      memory budget.
  """
  _check_kind(kind)
  _check_common(depth, W_std, b_std, parameterization, batch_size)
  if memory_budget_bytes is not None and memory_budget_bytes <= 0:
    raise ValueError(f"memory_budget_bytes must be None or > 0, got "
                     f"{memory_budget_bytes!r}.")
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

  def prepare(x):
    if x.ndim != 4:
      raise ValueError(f"conv_kernel inputs must be NHWC [n, H, W, Ch], got "
                       f"shape {x.shape}.")
    h, w = x.shape[1], x.shape[2]
    if (h >> depth) < 1 or (w >> depth) < 1:
      raise ValueError(f"images of {h}x{w} are too small for depth={depth}: "
                       f"each block halves H and W, need >= {2**depth}.")
    return x

  def check(n1, n2, shape, itemsize):
    if memory_budget_bytes is None:
      return
    est = estimate_kernel_bytes(n1, n2, shape, depth,
                                with_grad=budget_for_grad, itemsize=itemsize)
    if est > memory_budget_bytes:
      raise ValueError(
          f"conv kernel block of {n1} x {n2} images of shape {tuple(shape)} "
          f"needs ~{est / 2**30:.2f} GiB (estimate_kernel_bytes, "
          f"with_grad={budget_for_grad}), over memory_budget_bytes="
          f"{memory_budget_bytes / 2**30:.2f} GiB. Pass a smaller batch_size "
          f"or raise memory_budget_bytes.")

  return _finalize(kernel_fn, kind, batch_size, prepare, check)
