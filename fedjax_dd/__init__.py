"""fedjax-dd: federated learning with dataset and data-free distillation in JAX.

No process-wide XLA flag is set. The engine's hot per-client programs carry
their measured compiler options themselves (``fedjax_dd.core.clients``).
"""

__version__ = "0.1.0"
