"""Infinite-width kernels, kernel ridge regression and the KIP loss.

Modules:
  ntk: NTK/NNGP kernels of FC and ConvNet architectures (neural-tangents).
  krr: kernel ridge regression with a NaN-safe Cholesky solve.
  kip_loss: the KIP loss of a support set on a target set.

Everything works on ONE client and is pure, jit-able and ``jax.vmap``-able;
the client axis is added by the caller.

``fedjax_dd.kernels.kip_loss`` is the module, not the function, so both
``from fedjax_dd.kernels import kip_loss`` (module) and
``from fedjax_dd.kernels.kip_loss import kip_loss`` (function) keep their usual
meaning. ``ntk`` is imported lazily because importing neural-tangents takes
seconds (it pulls in TensorFlow); ``krr`` and ``kip_loss`` do not need it.
"""

import importlib

from fedjax_dd.kernels import kip_loss
from fedjax_dd.kernels import krr
from fedjax_dd.kernels.kip_loss import KIPAux
from fedjax_dd.kernels.kip_loss import one_hot_labels
from fedjax_dd.kernels.krr import DEFAULT_JITTER_LADDER
from fedjax_dd.kernels.krr import KRRInfo
from fedjax_dd.kernels.krr import krr_predict
from fedjax_dd.kernels.krr import krr_predict_checked

_NTK_NAMES = ("fc_kernel", "conv_kernel", "estimate_kernel_bytes",
              "DEFAULT_MEMORY_BUDGET_BYTES")

__all__ = [
    "DEFAULT_JITTER_LADDER",
    "KIPAux",
    "KRRInfo",
    "kip_loss",
    "krr",
    "krr_predict",
    "krr_predict_checked",
    "ntk",
    "one_hot_labels",
    *_NTK_NAMES,
]


def __getattr__(name):
  if name == "ntk":
    return importlib.import_module("fedjax_dd.kernels.ntk")
  if name in _NTK_NAMES:
    return getattr(importlib.import_module("fedjax_dd.kernels.ntk"), name)
  raise AttributeError(f"module 'fedjax_dd.kernels' has no attribute {name!r}")
