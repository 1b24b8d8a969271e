"""Infinite-width kernels, kernel ridge regression and the KIP loss.

Modules:
  native: NTK/NNGP kernels of FC and ConvNet architectures in pure JAX.
  ntk: the same kernels through neural-tangents (the optional `nt` extra).
  blocking: what both share: input checks, the conv-kernel memory estimate
    and guard, blocked evaluation.
  krr: kernel ridge regression with a NaN-safe Cholesky solve.
  kip_loss: the KIP loss of a support set on a target set.

Everything works on ONE client and is pure, jit-able and ``jax.vmap``-able;
the client axis is added by the caller.

``fedjax_dd.kernels.kip_loss`` is the module, not the function. ``ntk`` is
imported lazily: neural-tangents is an optional extra (``pip install
"fedjax-dd[nt]"``, jax < 0.6 only) and slow to import. ``fc_kernel`` and
``conv_kernel`` at package level are the native ones; :func:`kernel_builder`
picks either implementation's.
"""

import importlib

from fedjax_dd.kernels import kip_loss
from fedjax_dd.kernels import krr
from fedjax_dd.kernels.blocking import DEFAULT_MEMORY_BUDGET_BYTES
from fedjax_dd.kernels.blocking import estimate_kernel_bytes
from fedjax_dd.kernels.kip_loss import KIPAux
from fedjax_dd.kernels.kip_loss import one_hot_labels
from fedjax_dd.kernels.krr import DEFAULT_JITTER_LADDER
from fedjax_dd.kernels.krr import KRRInfo
from fedjax_dd.kernels.krr import krr_predict
from fedjax_dd.kernels.krr import krr_predict_checked

_NTK_NAMES = ("fc_kernel", "conv_kernel")

# Implementations of the same kernels: module of each.
KERNEL_IMPLS = {"neural_tangents": "fedjax_dd.kernels.ntk",
                "native": "fedjax_dd.kernels.native"}
KERNEL_ARCHS = ("fc", "conv")

__all__ = [
    "DEFAULT_JITTER_LADDER",
    "DEFAULT_MEMORY_BUDGET_BYTES",
    "KERNEL_ARCHS",
    "KERNEL_IMPLS",
    "KIPAux",
    "KRRInfo",
    "blocking",
    "estimate_kernel_bytes",
    "kernel_builder",
    "kip_loss",
    "krr",
    "krr_predict",
    "krr_predict_checked",
    "native",
    "ntk",
    "one_hot_labels",
    *_NTK_NAMES,
]


def kernel_builder(arch: str, impl: str = "native"):
  """``fc_kernel`` or ``conv_kernel`` (``arch`` "fc" | "conv") of ``impl``.

  Both implementations take the same arguments and return the same
  ``k(x1, x2=None) -> [n1, n2]``; only "neural_tangents" imports it.

  Raises:
    ValueError: on an unknown ``arch`` or ``impl``.
  """
  if arch not in KERNEL_ARCHS:
    raise ValueError(f"Unknown kernel architecture {arch!r}; expected one of "
                     f"{list(KERNEL_ARCHS)}.")
  if impl not in KERNEL_IMPLS:
    raise ValueError(f"Unknown kernel implementation {impl!r}; expected one "
                     f"of {sorted(KERNEL_IMPLS)}.")
  return getattr(importlib.import_module(KERNEL_IMPLS[impl]),
                 f"{arch}_kernel")


def __getattr__(name):
  if name in ("ntk", "native", "blocking"):
    return importlib.import_module(f"fedjax_dd.kernels.{name}")
  if name in _NTK_NAMES:
    return getattr(importlib.import_module("fedjax_dd.kernels.native"), name)
  raise AttributeError(f"module 'fedjax_dd.kernels' has no attribute {name!r}")
