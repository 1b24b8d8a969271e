"""The audits' argument checks: one-line refusals before any compute.

Every refusal goes through :func:`fedjax_dd.core.checks.refuse`, so it reads
``NAME must be WANT, got VALUE.`` like the library's other settings.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fedjax_dd.core import checks


def shape(name: str, x: Any, rank: int, what: str) -> tuple[int, ...]:
  """``x.shape`` if ``x`` has ``rank`` axes (``what`` names them)."""
  s = tuple(np.shape(x))
  if len(s) != rank:
    checks.refuse(name, f"{what} (rank {rank})", s)
  return s


def same(name: str, got: Sequence[int], want: Sequence[int],
         what: str) -> None:
  """Refuses ``got != want`` (two arrays' axes that must agree)."""
  if tuple(got) != tuple(want):
    checks.refuse(name, f"{what} {tuple(want)}", tuple(got))


def counts(name: str, n: Any, num: int | None, size: int,
           low: int = 1) -> np.ndarray:
  """``n`` as an int array ``[num]`` (``[]`` for ``num=None``) in
  ``[low, size]``: the valid rows of padded stacks of ``size`` rows."""
  a = np.asarray(n)
  want = () if num is None else (num,)
  if a.shape != want or not np.issubdtype(a.dtype, np.integer):
    checks.refuse(name, f"ints of shape {want}", f"{a.dtype} {a.shape}")
  if a.size and (a.min() < low or a.max() > size):
    checks.refuse(name, f"in [{low}, {size}] (valid rows of {size}; an "
                  "audit needs at least one)" if low else
                  f"in [0, {size}]", a.tolist() if a.ndim else int(a))
  return a.astype(np.int32)


def labels(name: str, y: Any, num_classes: int | None = None) -> None:
  """Integer class indices, within ``[0, num_classes)`` where known."""
  a = np.asarray(y)
  if not np.issubdtype(a.dtype, np.integer):
    checks.refuse(name, "integer class indices", f"dtype {a.dtype}")
  if a.size and (a.min() < 0 or (num_classes is not None
                                 and a.max() >= num_classes)):
    checks.refuse(name, f"class indices in [0, {num_classes})",
                  f"values in [{a.min()}, {a.max()}]")


def fprs(values: Sequence[float]) -> tuple[float, ...]:
  """False-positive rates, each in the open interval (0, 1)."""
  return tuple(checks.check_number("fpr", v, 0.0, 1.0, low_open=True,
                                   high_open=True) for v in values)
