"""Client data stacked into padded arrays ``[C, N_max, ...]``.

Uneven clients are padded with zeros to the largest client, ``N_max``, so the
whole federation is one pytree that ``fedjax_dd.core.clients`` can map over.
``num_examples [C]`` records the true sizes; :func:`sample_batch` only draws
indices below it, so padding never reaches a loss.

Memory: images stay uint8, so the stack costs ``C * N_max * H * W * Ch``
bytes against ``N * H * W * Ch`` for the raw train set: close for balanced
schemes, several times more for skewed client sizes (e.g. ``dirichlet``
with small ``alpha``), since every client is padded to the largest.
"""

from __future__ import annotations

from typing import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.data import validate


@flax.struct.dataclass
class ClientData:
  """Padded per-client datasets.

  Attributes:
    x: Images ``[C, N_max, H, W, Ch]`` (uint8 from :func:`stack_clients`);
      rows at and beyond ``num_examples[c]`` are zero padding.
    y: Labels ``[C, N_max]`` int32; padding rows are 0.
    num_examples: True client sizes ``[C]`` int32, each >= 1.
  """

  x: jax.Array | np.ndarray
  y: jax.Array | np.ndarray
  num_examples: jax.Array | np.ndarray

  def __post_init__(self):
    # Checked on host arrays only; device/traced copies and specs are skipped.
    validate.client_fields(self.x, self.y, self.num_examples)

  @property
  def num_clients(self) -> int:
    """Number of clients ``C`` (static)."""
    return self.x.shape[0]

  @property
  def max_examples(self) -> int:
    """Padded length ``N_max`` (static)."""
    return self.x.shape[1]

  @property
  def mask(self) -> jax.Array | np.ndarray:
    """``[C, N_max]`` bool, True on real examples; NumPy in, NumPy out."""
    xp = np if isinstance(self.num_examples, np.ndarray) else jnp
    return xp.arange(self.max_examples)[None, :] < self.num_examples[:, None]


def stack_clients(x: np.ndarray, y: np.ndarray,
                  partition: Sequence[np.ndarray], *,
                  pad_to: int | None = None,
                  allow_shared: bool = False,
                  allow_empty: bool = False) -> ClientData:
  """Gathers each client's examples into zero-padded host arrays.

  Args:
    x: Train images ``[N, H, W, Ch]``; the dtype (uint8) is kept.
    y: Train labels ``[N]``, integer.
    partition: One index array into ``x``/``y`` per client (from
      :mod:`fedjax_dd.data.partition`), each non-empty.
    pad_to: Padded length ``N_max``, at least the largest client (default);
      a fixed value keeps shapes and compiled programs stable.
    allow_shared: accept an example in several clients (a resampling).
    allow_empty: accept a client without examples (for a per-client test
      set; training needs at least one example).

  Returns:
    ``ClientData`` with NumPy fields ``x [C, N_max, H, W, Ch]``,
    ``y [C, N_max]`` int32 and ``num_examples [C]`` int32.

  Raises:
    ValueError: Mismatched ``x``/``y``, empty partition or client, indices
      out of range or not integer, an index in two clients (unless
      ``allow_shared``), or ``pad_to`` too small.
  """
  x = np.asarray(x)
  y = np.asarray(y)
  if y.ndim != 1 or x.ndim < 1 or x.shape[0] != y.shape[0]:
    raise ValueError(
        f"x [N, ...] and y [N] must have the same N; got x {x.shape}, y "
        f"{y.shape}.")
  if not np.issubdtype(y.dtype, np.integer):
    raise ValueError(f"y must be integer labels, got dtype {y.dtype}.")
  if len(partition) == 0:
    raise ValueError("partition is empty (no clients).")
  parts = []
  for k, idx in enumerate(partition):
    idx = np.asarray(idx)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
      raise ValueError(
          f"client {k}: indices must be a 1-D integer array, got shape "
          f"{idx.shape} dtype {idx.dtype}.")
    if idx.size == 0 and not allow_empty:
      raise ValueError(
          f"client {k} has no examples; sample_batch needs at least one.")
    if idx.size and (idx.min() < 0 or idx.max() >= x.shape[0]):
      raise ValueError(
          f"client {k}: indices must lie in [0, {x.shape[0]}), got range "
          f"[{idx.min()}, {idx.max()}].")
    parts.append(idx)
  if not allow_shared:
    validate.disjoint_indices(parts)
  sizes = np.array([p.size for p in parts], np.int32)
  n_max = max(int(sizes.max()), 1)
  if pad_to is not None:
    if pad_to < n_max:
      raise ValueError(
          f"pad_to={pad_to} is smaller than the largest client ({n_max}).")
    n_max = int(pad_to)
  xs = np.zeros((len(parts), n_max, *x.shape[1:]), x.dtype)
  ys = np.zeros((len(parts), n_max), np.int32)
  for k, idx in enumerate(parts):
    xs[k, :idx.size] = x[idx]
    ys[k, :idx.size] = y[idx]
  return ClientData(x=xs, y=ys, num_examples=sizes)


def sample_batch(key: jax.Array, x: jax.Array, y: jax.Array,
                 num_examples: jax.Array, batch_size: int
                 ) -> tuple[jax.Array, jax.Array]:
  """Draws a batch, with replacement, from ONE client's padded data.

  Indices are ``randint(key, [B], 0, 2**31 - 1) % max(num_examples, 1)``,
  so padding is never touched (modulo bias below ``N_max / 2**31``).
  Jit-able with ``batch_size`` static; ``num_examples`` may be traced, so
  one compiled program serves every client.

  Args:
    key: PRNG key.
    x: One client's examples ``[N_max, H, W, Ch]``.
    y: One client's labels ``[N_max]``.
    num_examples: Scalar true size of this client.
    batch_size: Batch size ``B`` (static).

  Returns:
    ``(xb [B, H, W, Ch], yb [B])`` with the dtypes of ``x`` and ``y``.
  """
  raw = jax.random.randint(key, (batch_size,), 0, 2**31 - 1)
  idx = raw % jnp.maximum(num_examples, 1).astype(raw.dtype)
  return x[idx], y[idx]

