"""FedProx: FedAvg with a proximal term ``μ/2 ‖w − w_global‖²`` in every local loss.

Reference: Li et al., "Federated Optimization in Heterogeneous Networks",
MLSys 2020.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.core.algorithm import FederatedAlgorithm
from fedjax_dd.core.local import LocalTraining


def proximal_term(mu: float):
  """``(params, ctx) -> μ/2 ‖params − ctx.start_params‖²``, the distance to
  the server model the client started from (Li et al., Eq. 2)."""

  def reg(params, ctx):
    sq = jax.tree_util.tree_map(lambda a, b: jnp.sum((a - b) ** 2), params,
                                ctx.start_params)
    return 0.5 * mu * sum(jax.tree_util.tree_leaves(sq))

  return reg


def fedprox(training: LocalTraining, *, mu: float,
            **kwargs) -> FederatedAlgorithm:
  """FedAvg with the proximal regulariser; ``kwargs`` go to :func:`fedavg`."""
  if mu < 0:
    raise ValueError(f"FedProx mu must be >= 0, got {mu}.")
  return fedavg(training, regularizer=proximal_term(mu), **kwargs)
