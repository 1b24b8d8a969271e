"""One XLA host device per CPU core, set before JAX initialises a backend.

The engine's default CPU backend (``sharded``, see
:mod:`fedjax_dd.core.clients`) lays the client axis over host devices so that
each core runs its own stream of small per-client programs. XLA exposes one
host device unless ``--xla_force_host_platform_device_count`` is in
``XLA_FLAGS`` when the CPU backend starts. Importing the package changes
nothing: the ``fedjax-dd`` entry point and the benchmarks call
:func:`configure` (public as :func:`fedjax_dd.configure_cpu`) before any JAX
computation, and a notebook calls it itself, first. On a GPU/TPU machine the
flag only shapes the (unused) host platform.

Nothing is changed when:

* ``FEDJAX_DD_NO_XLA_FLAGS=1`` (all of fedjax-dd's XLA options off);
* ``XLA_FLAGS`` already sets the host device count (e.g. tests that force 4);
* a JAX backend is already initialised (the flag would have no effect; the
  engine then works with the devices it finds).

``FEDJAX_DD_HOST_DEVICES=N`` overrides the count (default: the usable cores,
at most 8).
"""

from __future__ import annotations

import os

_FLAG = "--xla_force_host_platform_device_count"
MAX_HOST_DEVICES = 8


def _usable_cores() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    return os.cpu_count() or 1


# Values of FEDJAX_DD_NO_XLA_FLAGS (case-insensitive); unset or "" is off.
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def no_xla_flags() -> bool:
  """Whether ``FEDJAX_DD_NO_XLA_FLAGS`` turns fedjax-dd's XLA options off.

  Raises:
    ValueError: a value that is neither on (1, true, yes, on) nor off (0,
      false, no, off, empty); "0" once meant on, as any non-empty value did.
  """
  value = os.environ.get("FEDJAX_DD_NO_XLA_FLAGS", "").strip().lower()
  if value in _TRUE:
    return True
  if value in _FALSE:
    return False
  raise ValueError(
      f"FEDJAX_DD_NO_XLA_FLAGS must be 1 (fedjax-dd's XLA options off) or 0 "
      f"(on, as when unset), got {os.environ['FEDJAX_DD_NO_XLA_FLAGS']!r}.")


def host_device_count() -> int:
  """How many host devices fedjax-dd asks XLA for.

  Raises:
    ValueError: ``FEDJAX_DD_HOST_DEVICES`` is set but not an int >= 1.
  """
  override = os.environ.get("FEDJAX_DD_HOST_DEVICES", "").strip()
  if override:
    try:
      count = int(override)
    except ValueError:
      count = 0
    if count < 1:
      raise ValueError(
          f"FEDJAX_DD_HOST_DEVICES must be an int >= 1 (host devices for the "
          f"client axis), got {override!r}; unset it for one per core.")
    return count
  return max(1, min(_usable_cores(), MAX_HOST_DEVICES))


def _backend_initialised() -> bool:
  try:
    from jax._src import xla_bridge
  except ImportError:  # jax not importable: nothing to configure.
    return True
  return bool(xla_bridge.backends_are_initialized())


def configure() -> bool:
  """Appends the host device count to ``XLA_FLAGS``; True if it did."""
  if no_xla_flags():
    return False
  flags = os.environ.get("XLA_FLAGS", "")
  if _FLAG in flags or _backend_initialised():
    return False
  count = host_device_count()
  if count == 1:
    return False
  os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={count}".strip()
  return True
