"""FedNova: normalised averaging that removes objective inconsistency.

Each client's update is divided by its normaliser ``a_i`` (the L1 norm of its
local step coefficients); the server rescales by ``τ_eff = Σ p_i a_i``:
``x ← x + τ_eff Σ_i p_i (y_i − x) / a_i`` with ``p_i = n_i / Σ n``.

For local SGD with momentum ``ρ`` and ``τ_i`` steps,
``a_i = [τ_i − ρ(1 − ρ^τ_i)/(1 − ρ)] / (1 − ρ)``; for plain SGD ``a_i = τ_i``.

Reference: Wang et al., "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.core.algorithm import FederatedAlgorithm
from fedjax_dd.core.local import LocalTraining


def normaliser(steps: jax.Array, momentum: float = 0.0) -> jax.Array:
  """``a_i`` for ``steps`` local SGD steps with heavy-ball ``momentum``."""
  steps = steps.astype(jnp.float32)
  if momentum == 0.0:
    return steps
  rho = momentum
  return (steps - rho * (1.0 - rho**steps) / (1.0 - rho)) / (1.0 - rho)


def nova_aggregator(momentum: float = 0.0):
  """The FedNova aggregation rule for :func:`fedavg`."""

  def aggregate(delta, cohort, result):
    p = cohort.num_examples.astype(jnp.float32)
    p = p / jnp.maximum(p.sum(), 1e-12)
    a = normaliser(result.steps, momentum)
    safe_a = jnp.where(a > 0, a, 1.0)
    scale = jnp.where(a > 0, p / safe_a, 0.0)
    tau_eff = jnp.sum(p * a)
    normalised = jax.tree_util.tree_map(
        lambda d: jnp.tensordot(scale, d, axes=1), delta)
    return jax.tree_util.tree_map(lambda d: tau_eff * d, normalised)

  return aggregate


def fednova(training: LocalTraining, *,
            momentum: float = 0.0, **kwargs) -> FederatedAlgorithm:
  """FedNova; ``momentum`` must match the local optimizer's momentum."""
  if not 0.0 <= momentum < 1.0:
    raise ValueError(f"momentum must be in [0, 1), got {momentum}.")
  return fedavg(training, aggregator=nova_aggregator(momentum), **kwargs)

