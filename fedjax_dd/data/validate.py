"""Host-side argument checks shared by the library's public entry points.

Every check runs before any compute and raises a one-line ``ValueError``
naming the argument, what was expected and what was given, e.g.
``"y must be [C, N_max] integer class indices, got shape (2, 5, 1)."``.

Shapes and dtypes are always checked (they are static, also under tracing).
Value ranges are checked only on host arrays, or on concrete device arrays
with ``fetch=True``; traced values are never read.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax
import numpy as np

__all__ = [
    "shape_str", "is_concrete", "host_values", "positive_int",
    "finite_number", "client_stack", "labels_in_range", "channel_stats",
    "images", "step_counts", "client_fields", "image_shape", "split",
    "disjoint_indices",
]

# Offending values shown in a message (the count is always given).
_SHOWN = 5


def _dtype(a: Any) -> np.dtype:
  """``a``'s dtype without reading its values (``np.asarray`` would copy
  a device array and fail on a tracer)."""
  return np.dtype(a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype)


def shape_str(shape) -> str:
  """``(2, 5, 1)`` as ``"(2, 5, 1)"``."""
  return str(tuple(int(s) for s in shape))


def is_concrete(a: Any) -> bool:
  """Whether ``a``'s values can be read without tracing (not a Tracer)."""
  return not isinstance(a, jax.core.Tracer)


def host_values(a: Any, *, fetch: bool) -> np.ndarray | None:
  """``a`` as a host array if it is one (or ``fetch`` and it is concrete)."""
  if isinstance(a, (np.ndarray, np.generic, list, tuple, numbers.Number)):
    return np.asarray(a)
  if fetch and is_concrete(a):
    return np.asarray(jax.device_get(a))
  return None


def _examples(values: np.ndarray) -> str:
  vals = np.unique(values)
  shown = ", ".join(str(v.item()) for v in vals[:_SHOWN])
  return shown + (", ..." if vals.size > _SHOWN else "")


def positive_int(name: str, value: Any, *, minimum: int = 1) -> int:
  """``value`` as an int ``>= minimum`` (bools and floats refused)."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(
      value, (int, np.integer)):
    raise ValueError(f"{name} must be an int >= {minimum}, got "
                     f"{type(value).__name__} {value!r}.")
  if value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {value}.")
  return int(value)


def finite_number(name: str, value: Any, *, low: float | None = None,
                  inclusive: bool = True, high: float | None = None) -> float:
  """``value`` as a finite float in ``[low, high]`` (``(low, ...`` if not
  ``inclusive``)."""
  try:
    number = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a finite number, got "
                     f"{type(value).__name__} {value!r}.") from None
  rng = ""
  if low is not None:
    rng = f" {'>=' if inclusive else '>'} {low:g}"
  if high is not None:
    rng += f"{' and' if rng else ''} <= {high:g}"
  bad = not math.isfinite(number)
  if low is not None:
    bad |= number < low if inclusive else number <= low
  if high is not None:
    bad |= number > high
  if bad:
    raise ValueError(f"{name} must be a finite number{rng}, got {value!r}.")
  return number


def images(name: str, x: Any, *, rank: int, layout: str,
           fetch: bool = False) -> None:
  """uint8 images of rank ``rank`` (``layout`` e.g. ``"[C, N_max, H, W, Ch]"``).

  Float images are refused with their value range, which tells ``[0, 1]``
  images (that uint8 conversion would turn near-black) from ``[0, 255]``.
  """
  shape = np.shape(x)
  dtype = _dtype(x)
  if len(shape) != rank:
    hint = ""
    if len(shape) == rank - 1 and layout.startswith("[C,"):
      hint = (" (one client's images? stack clients with "
              "fedjax_dd.data.stack_clients)")
    raise ValueError(f"{name} must be {layout} uint8 images, got shape "
                     f"{shape_str(shape)}{hint}.")
  if dtype != np.uint8:
    got = f"dtype {dtype}"
    host = host_values(x, fetch=fetch)
    if host is not None and host.size and np.issubdtype(dtype, np.floating):
      lo, hi = float(np.nanmin(host)), float(np.nanmax(host))
      got += f" with values in [{lo:g}, {hi:g}]"
      if hi <= 1.0:
        got += ("; images in [0, 1] must be scaled first: "
                "np.round(x * 255).astype(np.uint8)")
    raise ValueError(f"{name} must be {layout} uint8 pixels in 0..255, got "
                     f"{got}.")


def labels_in_range(name: str, y: np.ndarray, num_classes: int) -> None:
  """Host labels ``y`` all in ``[0, num_classes)``; the message gives how
  many are not and a few of them."""
  y = np.asarray(y)
  bad = (y < 0) | (y >= num_classes)
  if bad.any():
    raise ValueError(
        f"{name} must hold class indices in [0, {num_classes}), got "
        f"{int(bad.sum())} outside it ({_examples(y[bad])}).")


def client_stack(x: Any, y: Any, num_examples: Any, *,
                 num_classes: int | None = None, fetch: bool = False,
                 allow_empty_clients: bool = True) -> None:
  """Checks a padded client stack ``x [C, N_max, H, W, Ch]`` uint8,
  ``y [C, N_max]`` integer, ``num_examples [C]`` integer in ``[0, N_max]``.

  Labels of real rows must be in ``[0, num_classes)`` when ``num_classes``
  is given; padding rows are not read.

  Raises:
    ValueError: naming the argument, the expected shape/dtype/range and
      what was given.
  """
  images("x", x, rank=5, layout="[C, N_max, H, W, Ch]", fetch=fetch)
  c, n_max = np.shape(x)[:2]
  y_shape = np.shape(y)
  y_dtype = _dtype(y)
  if len(y_shape) != 2 or not np.issubdtype(y_dtype, np.integer):
    hint = ""
    if len(y_shape) == 3 and y_shape[-1] == 1:
      hint = "; drop the last axis (y[..., 0])"
    elif len(y_shape) == 3:
      hint = "; one-hot or soft labels? pass class indices (y.argmax(-1))"
    raise ValueError(
        f"y must be [C, N_max] = [{c}, {n_max}] integer class indices, got "
        f"shape {shape_str(y_shape)} dtype {y_dtype}{hint}.")
  if tuple(y_shape) != (c, n_max):
    raise ValueError(
        f"y must be [C, N_max] = [{c}, {n_max}] (the first two axes of x), "
        f"got shape {shape_str(y_shape)}.")
  n_shape = np.shape(num_examples)
  n_dtype = _dtype(num_examples)
  if tuple(n_shape) != (c,) or not np.issubdtype(n_dtype, np.integer):
    raise ValueError(f"num_examples must be [C] = [{c}] integer counts, got "
                     f"shape {shape_str(n_shape)} dtype {n_dtype}.")
  n = host_values(num_examples, fetch=fetch)
  if n is not None:
    low = 0 if allow_empty_clients else 1
    bad = (n < low) | (n > n_max)
    if bad.any():
      raise ValueError(
          f"num_examples must lie in [{low}, N_max = {n_max}], got "
          f"{int(bad.sum())} outside it ({_examples(n[bad])}).")
  if num_classes is not None:
    positive_int("num_classes", num_classes)
    labels = host_values(y, fetch=fetch)
    if labels is not None and n is not None:
      valid = np.arange(n_max)[None, :] < n[:, None]
      labels_in_range("y", labels[valid], num_classes)


def channel_stats(mean: Any, std: Any, channels: int) -> None:
  """Per-channel ``mean`` and ``std``: ``[Ch]`` (or a scalar), finite, and
  ``std > 0``."""
  for name, value in (("mean", mean), ("std", std)):
    a = np.asarray(jax.device_get(value), np.float64)
    if a.ndim > 1 or (a.ndim == 1 and a.shape[0] not in (1, channels)):
      raise ValueError(
          f"{name} must be [Ch] = [{channels}] per-channel values (or a "
          f"scalar) for images with {channels} channels, got shape "
          f"{shape_str(a.shape)}.")
    if not np.all(np.isfinite(a)):
      raise ValueError(f"{name} must be finite, got {a.tolist()}.")
    if name == "std" and np.any(a <= 0):
      raise ValueError(
          f"std must be > 0 in every channel (it divides the pixels), got "
          f"{a.tolist()}.")


def step_counts(name: str, steps: Any, num_clients: int | tuple[int, ...],
                *, fetch: bool = False) -> None:
  """``steps [C]`` integer local step counts, ``>= 0`` (values on host
  arrays, or concrete device arrays with ``fetch``); ``num_clients`` may be
  a shape (grouped layouts: FedSeq's ``[G, M]``)."""
  want = ((num_clients,) if isinstance(num_clients, (int, np.integer))
          else tuple(num_clients))
  shape = np.shape(steps)
  dtype = _dtype(steps)
  if tuple(shape) != want or not np.issubdtype(dtype, np.integer):
    raise ValueError(f"{name} must be [C] = {list(want)} integer step "
                     f"counts, got shape {shape_str(shape)} dtype {dtype}.")
  host = host_values(steps, fetch=fetch)
  if host is not None and (host < 0).any():
    raise ValueError(f"{name} must be >= 0, got {int((host < 0).sum())} "
                     f"negative ({_examples(host[host < 0])}).")


def _is_array(a: Any) -> bool:
  return isinstance(a, np.ndarray) or (isinstance(a, jax.Array)
                                       and is_concrete(a))


def client_fields(x: Any, y: Any, num_examples: Any, *,
                  fetch: bool = False) -> None:
  """The fields of a :class:`fedjax_dd.data.stacked.ClientData`, checked
  as far as every producer allows: ``x [C, N_max, ...]``, ``y [C, N_max]``
  integer class indices ``>= 0`` on real rows (or ``[C, N_max, K]`` soft
  labels), ``num_examples [C]`` integers in ``[0, N_max]``, and no float
  images in ``[0, 1]`` (the models' normalisation would leave them
  near-constant). Tracers and the ``in_axes`` or sharding specs that share
  the dataclass are not checked.

  Raises:
    ValueError: naming the field, the expected shape, dtype or range and
      what was given.
  """
  if not all(_is_array(a) for a in (x, y, num_examples)):
    return
  if np.ndim(x) < 2:
    raise ValueError(f"x must be [C, N_max, H, W, Ch] images, got shape "
                     f"{shape_str(np.shape(x))}.")
  # Grouped layouts (FedSeq's [G, M, N_max, ...]) carry counts [G, M]: the
  # counts' axes lead, N_max follows them.
  lead = max(1, np.ndim(num_examples))
  if np.ndim(x) < lead + 1:
    raise ValueError(f"x must be [C, N_max, H, W, Ch] images, got shape "
                     f"{shape_str(np.shape(x))}.")
  clients = tuple(np.shape(x)[:lead])
  n_max = np.shape(x)[lead]
  y_shape = tuple(np.shape(y))
  y_dtype = np.dtype(y.dtype)
  if (y_shape[:lead + 1] != clients + (n_max,)
      or len(y_shape) not in (lead + 1, lead + 2)):
    axes = "two" if lead == 1 else str(lead + 1)
    raise ValueError(
        f"y must be [C, N_max] = {list(clients + (n_max,))} (the first "
        f"{axes} axes of x), got shape {shape_str(y_shape)}.")
  n_shape = tuple(np.shape(num_examples))
  n_dtype = np.dtype(num_examples.dtype)
  if n_shape != clients or not np.issubdtype(n_dtype, np.integer):
    raise ValueError(f"num_examples must be [C] = {list(clients)} integer "
                     f"counts, got shape {shape_str(n_shape)} dtype "
                     f"{n_dtype}.")
  n = host_values(num_examples, fetch=fetch)
  if n is not None:
    bad = (n < 0) | (n > n_max)
    if bad.any():
      raise ValueError(
          f"num_examples must lie in [0, N_max = {n_max}] (the padded length "
          f"of x), got {int(bad.sum())} outside it ({_examples(n[bad])}).")
  if len(y_shape) == lead + 1 and not np.issubdtype(y_dtype, np.integer):
    raise ValueError(f"y must be [C, N_max] integer class indices, got dtype "
                     f"{y_dtype}.")
  if len(y_shape) == lead + 1 and n is not None:
    labels = host_values(y, fetch=fetch)
    if labels is not None:
      real = labels[np.arange(n_max) < n[..., None]]
      if real.size and real.min() < 0:
        raise ValueError(
            f"y must hold class indices >= 0, got {int((real < 0).sum())} "
            f"negative ({_examples(real[real < 0])}).")
  if np.issubdtype(np.dtype(x.dtype), np.floating):
    pixels = host_values(x, fetch=fetch)
    if pixels is not None and pixels.size and float(np.nanmax(pixels)) <= 1.0:
      images("x", pixels, rank=np.ndim(x), layout="[C, N_max, H, W, Ch]")


def image_shape(name: str, x: Any, input_shape: Any, *, leading: int) -> None:
  """The image axes of ``x`` (after ``leading`` axes) equal the model's
  ``input_shape`` ``(H, W, Ch)``."""
  got = tuple(int(s) for s in np.shape(x)[leading:])
  want = tuple(int(s) for s in input_shape)
  if got != want:
    raise ValueError(
        f"{name} must hold images of the model's input shape [H, W, Ch] = "
        f"{list(want)}, got {list(got)} (shape {shape_str(np.shape(x))}); "
        "resize them with fedjax_dd.data.preprocess.resize_images.")


def split(x: Any, y: Any, *, num_classes: int, input_shape: Any) -> None:
  """An evaluation split: ``x [N, H, W, Ch]`` uint8 of the model's input
  shape, ``y [N]`` integer class indices in ``[0, num_classes)``, the same
  ``N``."""
  images("x", x, rank=4, layout="[N, H, W, Ch]", fetch=True)
  y_shape = np.shape(y)
  y_dtype = _dtype(y)
  if len(y_shape) != 1 or not np.issubdtype(y_dtype, np.integer):
    raise ValueError(f"y must be [N] integer class indices, got shape "
                     f"{shape_str(y_shape)} dtype {y_dtype}.")
  if y_shape[0] != np.shape(x)[0]:
    raise ValueError(
        f"x and y must hold the same number of examples N, got x "
        f"{shape_str(np.shape(x))} and y {shape_str(y_shape)}.")
  image_shape("x", x, input_shape, leading=1)
  labels = host_values(y, fetch=True)
  if labels is not None:
    labels_in_range("y", labels, num_classes)


def disjoint_indices(partition: Any) -> None:
  """No example index in two clients' index arrays (a partition, not a
  resampling: a shared example would be trained on twice and counted twice
  in the traffic)."""
  all_idx = [np.asarray(p).ravel() for p in partition]
  if not all_idx:
    return
  flat = np.concatenate(all_idx)
  values, counts = np.unique(flat, return_counts=True)
  shared = values[counts > 1]
  if shared.size:
    first = int(shared[0])
    clients = [k for k, idx in enumerate(all_idx) if np.any(idx == first)]
    raise ValueError(
        f"partition must give each example to one client, got "
        f"{shared.size} indices in more than one (e.g. index {first} in "
        f"clients {clients}); a client listing an index twice counts too.")
