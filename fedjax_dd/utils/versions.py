"""Version numbers as comparable tuples (per-version choices of the engine)."""

import jax


def version_tuple(version: str | None = None) -> tuple[int, ...]:
  """``"0.10.2"`` -> ``(0, 10, 2)``; a non-numeric tail (``rc1``) is dropped.

  Args:
    version: a dotted version string; default the running ``jax.__version__``.
  """
  parts = []
  for part in (version or jax.__version__).split("."):
    digits = ""
    for ch in part:
      if not ch.isdigit():
        break
      digits += ch
    if not digits:
      break
    parts.append(int(digits))
    if digits != part:
      break
  return tuple(parts)
