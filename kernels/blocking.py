"""Kernel-agnostic plumbing shared by the NTK/NNGP kernel implementations.

Both :mod:`fedjax_dd.kernels.ntk` (neural-tangents) and
:mod:`fedjax_dd.kernels.native` (pure JAX) build a per-block function
``block(x1, x2) -> [n1, n2]`` and wrap it with :func:`finalize`, which adds
input checks and casting, the conv-kernel memory guard
(:func:`estimate_kernel_bytes`) and blocked evaluation (:func:`blocked`).
Nothing here imports neural-tangents.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import math

import jax
import jax.numpy as jnp

from fedjax_dd import policy

KernelFn = Callable[..., jax.Array]

KINDS = ("ntk", "nngp")
PARAMETERIZATIONS = ("ntk", "standard")

DEFAULT_MEMORY_BUDGET_BYTES = 4 * 2**30

# Calibration of the conv-kernel memory model (`estimate_kernel_bytes`):
# peak temporary bytes / (itemsize * (H * W)**2), fitted to XLA's compiled
# memory analysis on CPU (jax 0.5.3) and rounded up, so the estimate
# over-predicts. The pairwise coefficient multiplies n1 * n2, the per-input
# one n1 + n2. Per implementation: (forward pair, forward single, gradient
# pair for depth >= 2, gradient pair for depth 1, gradient single); the
# native kernel's gradient keeps fewer residuals. Fit data:
# experiments/perf_notes.md.
_COEFS = {
    "neural_tangents": (3.1, 1.5, 8.2, 4.3, 1.7),
    "native": (3.1, 1.5, 5.0, 4.3, 1.7),
}
# Newer XLA keeps more residuals in the backward pass: the gradient
# coefficients are scaled by the policy's ``ntk_grad_memory_factor``.


def _grad_memory_factor() -> float:
  """The gradient coefficients' scale for this platform and jax."""
  return policy.current().ntk_grad_memory_factor


def check_kind(kind: str) -> None:
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")


def check_common(depth: int, W_std: float, b_std: float,
                 parameterization: str, batch_size: int | None) -> None:
  if not isinstance(depth, int) or depth < 1:
    raise ValueError(f"depth must be an int >= 1, got {depth!r}.")
  if not W_std > 0:
    raise ValueError(f"W_std must be > 0, got {W_std!r}.")
  if not b_std >= 0:
    raise ValueError(f"b_std must be >= 0, got {b_std!r}.")
  if parameterization not in PARAMETERIZATIONS:
    raise ValueError(f"parameterization must be one of {PARAMETERIZATIONS}, "
                     f"got {parameterization!r}.")
  if batch_size is not None and (not isinstance(batch_size, int)
                                 or batch_size < 1):
    raise ValueError(f"batch_size must be None or an int >= 1, "
                     f"got {batch_size!r}.")


def check_budget(memory_budget_bytes: int | None) -> None:
  if memory_budget_bytes is not None and memory_budget_bytes <= 0:
    raise ValueError(f"memory_budget_bytes must be None or > 0, got "
                     f"{memory_budget_bytes!r}.")


def estimate_kernel_bytes(
    n1: int,
    n2: int,
    image_shape: Sequence[int],
    depth: int,
    *,
    with_grad: bool = True,
    itemsize: int = 4,
    impl: str = "neural_tangents",
) -> int:
  """Estimates the peak temporary memory of one conv-kernel block.

  Model: ``itemsize * (H * W)**2 * (a * n1 * n2 + b * (n1 + n2))``. The first
  layer dominates (every AvgPool divides ``(H * W)**2`` by 16), so depth only
  matters through ``a`` for a gradient with ``depth == 1``. The coefficients
  are fitted to XLA's memory analysis and rounded up, so the estimate
  over-predicts the peak; gradient coefficients are scaled by the policy's
  ``ntk_grad_memory_factor`` (:mod:`fedjax_dd.policy`). Input channels do
  not enter: the first layer contracts them.

  Largest square blocks under a 4 GiB budget (float32, ``depth=3``, factor
  1; gradient blocks ~1.6x smaller at factor 2.6):

  ==========  ==============  ============
  images      with gradients  forward only
  ==========  ==============  ============
  28x28       14 x 14         23 x 23
  32x32x3     10 x 10         17 x 17
  12x12       79 x 79         128 x 128
  8x8         178 x 178       290 x 290
  ==========  ==============  ============

  A Gram matrix evaluated block by block (``batch_size``) peaks at one
  block's memory, not the whole matrix's.

  Args:
    n1: rows of the block (number of ``x1`` inputs).
    n2: columns of the block (number of ``x2`` inputs).
    image_shape: ``(H, W)`` or ``(H, W, Ch)`` of one input.
    depth: number of conv blocks of the kernel.
    with_grad: estimate for the gradient (reverse mode through the kernel,
      as in KIP) instead of a forward evaluation.
    itemsize: bytes per float (4 for float32, 8 for float64).
    impl: the implementation whose calibration to use, "neural_tangents"
      (:mod:`fedjax_dd.kernels.ntk`) or "native"
      (:mod:`fedjax_dd.kernels.native`).

  Returns:
    Estimated peak temporary bytes of one block evaluation for ONE client.
    Under ``jax.vmap`` over ``C`` clients the peak is ``C`` times larger.

  Raises:
    ValueError: on a non-positive size, an image shape of the wrong rank or
      an unknown ``impl``.
  """
  if impl not in _COEFS:
    raise ValueError(f"impl must be one of {sorted(_COEFS)}, got {impl!r}.")
  if n1 < 1 or n2 < 1:
    raise ValueError(f"n1 and n2 must be >= 1, got {n1}, {n2}.")
  if len(image_shape) not in (2, 3):
    raise ValueError(f"image_shape must be (H, W) or (H, W, Ch), "
                     f"got {tuple(image_shape)}.")
  if depth < 1:
    raise ValueError(f"depth must be >= 1, got {depth}.")
  h, w = int(image_shape[0]), int(image_shape[1])
  spatial = float(h * w) ** 2
  pair_fwd, single_fwd, pair_grad, pair_grad_depth1, single_grad = (
      _COEFS[impl])
  if with_grad:
    pair = pair_grad if depth >= 2 else pair_grad_depth1
    single = single_grad
    factor = _grad_memory_factor()
    pair, single = factor * pair, factor * single
  else:
    pair, single = pair_fwd, single_fwd
  return int(math.ceil(itemsize * spatial * (pair * n1 * n2 + single *
                                             (n1 + n2))))


def blocked(fn: KernelFn, batch_size: int | None) -> KernelFn:
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

  def blocked_fn(x1, x2):
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

  return blocked_fn


def as_float(x) -> jax.Array:
  """Casts integer inputs (e.g. uint8 images) to the default float dtype."""
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    x = x.astype(jnp.result_type(float))
  return x


def prepare_flat(x: jax.Array) -> jax.Array:
  """FC kernels: ``[n, ...] -> [n, D]``."""
  if x.ndim < 2:
    raise ValueError(f"inputs must be [n, ...] with at least 2 dims, got "
                     f"shape {x.shape}.")
  return x.reshape(x.shape[0], -1)


def prepare_images(depth: int) -> Callable[[jax.Array], jax.Array]:
  """Conv kernels: checks NHWC inputs large enough for ``depth`` pools."""

  def prepare(x):
    if x.ndim != 4:
      raise ValueError(f"conv_kernel inputs must be NHWC [n, H, W, Ch], got "
                       f"shape {x.shape}.")
    h, w = x.shape[1], x.shape[2]
    if (h >> depth) < 1 or (w >> depth) < 1:
      raise ValueError(f"images of {h}x{w} are too small for depth={depth}: "
                       f"each block halves H and W, need >= {2**depth}.")
    return x

  return prepare


def no_check(n1: int, n2: int, shape: tuple[int, ...], itemsize: int) -> None:
  del n1, n2, shape, itemsize


def budget_check(depth: int, memory_budget_bytes: int | None,
                 budget_for_grad: bool, impl: str = "neural_tangents"
                 ) -> Callable[[int, int, tuple[int, ...], int], None]:
  """The conv kernels' trace-time guard on one block's estimated memory."""

  def check(n1, n2, shape, itemsize):
    if memory_budget_bytes is None:
      return
    est = estimate_kernel_bytes(n1, n2, shape, depth,
                                with_grad=budget_for_grad, itemsize=itemsize,
                                impl=impl)
    if est > memory_budget_bytes:
      raise ValueError(
          f"conv kernel block of {n1} x {n2} images of shape {tuple(shape)} "
          f"needs ~{est / 2**30:.2f} GiB (estimate_kernel_bytes, "
          f"with_grad={budget_for_grad}, impl={impl!r}), over memory_budget_bytes="
          f"{memory_budget_bytes / 2**30:.2f} GiB. Pass a smaller batch_size "
          f"or raise memory_budget_bytes.")

  return check


def finalize(one_block: Callable[[jax.Array, jax.Array], jax.Array],
             batch_size: int | None,
             prepare: Callable[[jax.Array], jax.Array],
             check: Callable[[int, int, tuple[int, ...], int], None]
             ) -> KernelFn:
  """Wraps ``one_block(x1, x2) -> [n1, n2]`` into ``k(x1, x2=None)``.

  ``k`` casts integer inputs to float, applies ``prepare`` (reshape and
  shape checks), checks matching per-example shapes, returns an empty
  ``[n1, n2]`` for empty inputs, runs ``check(n1, n2, shape, itemsize)`` on
  the block size (the memory guard) and evaluates in blocks of
  ``batch_size`` (:func:`blocked`).
  """
  # Jitted so eager calls do not dispatch many small ops one by one; inside
  # an outer jit/vmap/grad this is inlined.
  blocked_fn = jax.jit(blocked(one_block, batch_size))

  def k(x1: jax.Array, x2: jax.Array | None = None) -> jax.Array:
    x1 = prepare(as_float(x1))
    x2 = x1 if x2 is None else prepare(as_float(x2))
    if x1.shape[1:] != x2.shape[1:]:
      raise ValueError(f"x1 and x2 must have the same per-example shape, got "
                       f"{x1.shape[1:]} and {x2.shape[1:]}.")
    if x1.shape[0] == 0 or x2.shape[0] == 0:
      return jnp.zeros((x1.shape[0], x2.shape[0]), x1.dtype)
    n1, n2 = x1.shape[0], x2.shape[0]
    if batch_size is not None:
      n1, n2 = min(n1, batch_size), min(n2, batch_size)
    check(n1, n2, x1.shape[1:], x1.dtype.itemsize)
    return blocked_fn(x1, x2)

  return k
