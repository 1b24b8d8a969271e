"""FedProx: FedAvg with a proximal term ``μ/2 ‖w − w_global‖²`` in local losses.

Reference: Li et al., "Federated Optimization in Heterogeneous Networks",
MLSys 2020.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.core import checks
from fedjax_dd.core.algorithm import FederatedAlgorithm
from fedjax_dd.core.local import LocalTraining


def proximal_term(mu: Any):
  """``(params, ctx) -> μ/2 ‖params − ctx.start_params‖²``, the distance to
  the server model the client started from (Li et al., Eq. 2)."""

  def reg(params, ctx):
    sq = jax.tree_util.tree_map(lambda a, b: jnp.sum((a - b) ** 2), params,
                                ctx.start_params)
    return 0.5 * mu * sum(jax.tree_util.tree_leaves(sq))

  return reg


def fedprox(training: LocalTraining, *, mu: Any,
            **kwargs) -> FederatedAlgorithm:
  """FedAvg with the proximal regulariser; ``kwargs`` go to :func:`fedavg`.

  Args:
    training: the clients' local training.
    mu: ``μ >= 0``: a number, or a traced scalar (a per-run value on the
      run axis, :func:`fedjax_dd.fit_runs`).
    **kwargs: to :func:`fedavg`.

  Raises:
    ValueError: a concrete ``mu`` below 0.
  """
  if not checks.is_traced(mu) and mu < 0:
    raise ValueError(f"FedProx mu must be >= 0, got {mu}.")
  return fedavg(training, regularizer=proximal_term(mu), **kwargs)
