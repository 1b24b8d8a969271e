"""fedjax-dd: federated learning with dataset and data-free distillation in JAX.

Importing the package has no side effects. On a CPU machine, call
:func:`configure_cpu` before the first JAX computation to expose one XLA host
device per core, which the engine's default CPU backend shards clients over
(the ``fedjax-dd`` entry point and the benchmarks do this themselves)::

  import fedjax_dd
  fedjax_dd.configure_cpu()   # first, before any JAX computation
  import jax

The engine's hot per-client programs carry their other measured compiler
options themselves (:mod:`fedjax_dd.core.clients`).
"""

from fedjax_dd import _xla_setup

__version__ = "0.1.0"


def configure_cpu() -> bool:
  """Exposes one XLA host device per CPU core (at most 8) to JAX.

  Appends ``--xla_force_host_platform_device_count`` to ``XLA_FLAGS``. It
  takes effect only before JAX initialises a backend (the first computation
  or ``jax.devices()``), so call it first. It leaves ``XLA_FLAGS`` alone when
  the count is already set, when a backend is already initialised, or with
  ``FEDJAX_DD_NO_XLA_FLAGS=1``; ``FEDJAX_DD_HOST_DEVICES=N`` overrides the
  count.

  Returns:
    True if it changed ``XLA_FLAGS``.
  """
  return _xla_setup.configure()
