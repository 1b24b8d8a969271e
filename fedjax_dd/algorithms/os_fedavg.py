"""One-shot FedAvg (OS-FedAvg): E local epochs, then a single aggregation.

The one-shot baseline of FedD3 and FedHydra. It is FedAvg run for exactly one
round with all clients participating and ``E`` local epochs; the initial model
travels as a seed, so the only traffic is the single upload.
"""

from __future__ import annotations

import optax

from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.core.algorithm import CommSpec, FederatedAlgorithm


def os_fedavg(task, client_optimizer: optax.GradientTransformation,
              **kwargs) -> FederatedAlgorithm:
  """FedAvg whose one round uploads each model once (``kwargs`` → fedavg)."""
  return fedavg(task, client_optimizer, comm=CommSpec(download=1, upload=1),
                **kwargs)
