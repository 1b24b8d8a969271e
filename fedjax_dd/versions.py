"""Version numbers as comparable tuples (per-version choices of the engine).

Imports nothing heavy: the test suite reads the installed jax's version
through :func:`installed_version` before jax is imported, since some
environment variables (the compilation cache) must be set first.
"""

import importlib.metadata
import os
import subprocess
import sys


def version_tuple(version: str | None = None) -> tuple[int, ...]:
  """``"0.10.2"`` -> ``(0, 10, 2)``; a non-numeric tail (``rc1``) is dropped.

  Args:
    version: a dotted version string; default the installed jax's
      (:func:`installed_version`).
  """
  parts = []
  for part in (version or installed_version()).split("."):
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


def installed_version(package: str = "jax") -> str:
  """The running module's ``__version__`` if it is imported, else the
  installed distribution's version, read without importing it."""
  module = sys.modules.get(package)
  if module is not None and hasattr(module, "__version__"):
    return module.__version__
  return importlib.metadata.version(package)


def source_commit(path: str | None = None) -> dict[str, object] | None:
  """The code a run computes with: ``{"commit": HEAD's hash, "modified":
  whether tracked files differ from it}`` of the git checkout holding
  ``path`` (default: this package), or ``None`` outside one (an installed
  wheel) or without git. Results record it beside each figure."""
  root = path or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

  def git(*args: str) -> str:
    return subprocess.run(["git", "-C", root, *args], capture_output=True,
                          text=True, timeout=30, check=True).stdout.strip()

  try:
    commit = git("rev-parse", "HEAD")
    modified = bool(git("status", "--porcelain", "--untracked-files=no"))
  except (OSError, subprocess.SubprocessError):
    return None
  return {"commit": commit, "modified": modified}
