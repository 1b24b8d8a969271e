"""fedjax-dd: federated learning with dataset and data-free distillation in JAX.

Importing the package exposes one XLA host device per CPU core (before JAX
initialises; see :mod:`fedjax_dd._xla_setup`), which the engine's default CPU
backend shards clients over. The engine's hot per-client programs carry their
other measured compiler options themselves (:mod:`fedjax_dd.core.clients`).
"""

from fedjax_dd import _xla_setup as _xla_setup  # noqa: F401  (before any JAX use)

__version__ = "0.1.0"
