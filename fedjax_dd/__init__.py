"""fedjax-dd: federated learning with dataset and data-free distillation in JAX."""

from fedjax_dd import _xla_flags

# Must run before anything imports jax and initialises a backend.
_xla_flags.apply()

__version__ = "0.1.0"
