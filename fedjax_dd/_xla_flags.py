"""XLA flags chosen by measurement, applied before JAX initialises its backend.

On the CPU backend of jax 0.5.x the thunk runtime runs the small, many-op
programs of per-client training several times slower than the classic
runtime (see ``experiments/bench_engine.py``; LeNet-5, batch 64, vmapped over
100 clients: 29.5 -> ~4 ms per client-step). The flag only affects the CPU
backend, so it is harmless on GPU/TPU hosts.

Users keep control: a flag already present in ``XLA_FLAGS`` is never
overridden, and ``FEDJAX_DD_NO_XLA_FLAGS=1`` disables this module entirely.
"""

import os

# Flag -> value. Each entry must be justified by a benchmark figure.
_CPU_FLAGS = {
    "--xla_cpu_use_thunk_runtime": "false",
}


def apply() -> None:
  """Adds the measured defaults to ``XLA_FLAGS`` unless the user set them."""
  if os.environ.get("FEDJAX_DD_NO_XLA_FLAGS"):
    return
  current = os.environ.get("XLA_FLAGS", "")
  extra = [f"{k}={v}" for k, v in _CPU_FLAGS.items() if k not in current]
  if extra:
    os.environ["XLA_FLAGS"] = " ".join([current, *extra]).strip()
