"""FedDyn: federated learning with dynamic regularisation.

Each sampled client ``k`` minimises (Alg. 1, the client step)

  ``L_k(θ) − ⟨∇L_k(θ_k^{t-1}), θ⟩ + (α/2) ‖θ − θ^{t-1}‖²``

from the server model ``θ^{t-1}``, then updates its linear term

  ``∇L_k(θ_k^t) = ∇L_k(θ_k^{t-1}) − α (θ_k^t − θ^{t-1})``

and the server (Alg. 1, the server step) keeps ``h``:

  ``h^t = h^{t-1} − α (1/m) Σ_{k∈P_t} (θ_k^t − θ^{t-1})``,
  ``θ^t = (1/|P_t|) Σ_{k∈P_t} θ_k^t − (1/α) h^t``,

with ``m`` the number of all clients (``N``). ``α = 0.01`` is FedDyn's
default (the authors' ``example_cifar_10.py``, ``alpha_coef = 1e-2``).

Per-client state: the linear terms ``∇L_k`` of all ``N`` clients stacked
``[N, ...]`` in ``ExperimentState.clients`` (``{"grad": ...}``), zero at the
start; ``N`` models of memory. ``h`` lives in the server state. Messages:
``CommSpec(1, 1)``; neither ``∇L_k`` nor ``h`` travels.

The authors' code computes the same client loss and server model in another
parametrisation. Departures from it: its ``α`` is divided per client by the
client's data share (equal to ``α`` on equal-size clients), and its
gradient is always clipped to norm 10 (here ``client.grad_clip``). Its
models have no BatchNorm; here running statistics are averaged by ``|D_k|``
as FedAvg's.

Reference: Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, "Federated
Learning Based on Dynamic Regularization", ICLR 2021.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax

from fedjax_dd.algorithms import stages
from fedjax_dd.core import checks
from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core.algorithm import CommSpec, FederatedAlgorithm, ServerState
from fedjax_dd.core.local import LocalTraining, make_local_update

tree_map = jax.tree_util.tree_map


@dataclasses.dataclass(frozen=True)
class FedDynHyperParams:
  """FedDyn's settings, the ``feddyn`` config group.

  Attributes:
    alpha: ``α > 0``, a number, or a traced scalar (a run's value on the
      run axis, whose values are checked where the grid is read).
  """
  alpha: float = 0.01

  def __post_init__(self):
    if not checks.is_traced(self.alpha):
      checks.check_number("alpha", self.alpha, 0.0, low_open=True)


def dynamic_regularizer(alpha: float):
  """``(θ, ctx) -> −⟨∇L_k, θ⟩ + α/2 ‖θ − θ^{t-1}‖²``: ``θ^{t-1}`` is
  ``ctx.start_params`` (the server model) and ``∇L_k`` the client's
  ``ctx.client``."""

  def reg(params, ctx):
    terms = tree_map(
        lambda p, s, g: 0.5 * alpha * jnp.sum((p - s) ** 2) - jnp.sum(g * p),
        params, ctx.start_params, ctx.client)
    return sum(jax.tree_util.tree_leaves(terms))

  return reg


def feddyn(training: LocalTraining,
           *,
           alpha: float = 0.01) -> FederatedAlgorithm:
  """Builds FedDyn.

  Args:
    training: the clients' local training (optimizer re-initialised every
      round).
    alpha: ``α`` > 0: a number, or a traced scalar (a per-run value on the
      run axis, :func:`fedjax_dd.fit_runs`).

  Returns:
    A :class:`FederatedAlgorithm` whose client state is ``{"grad": [N, ...]}``
    and whose server state holds ``extra["h"]``.
  """
  if not checks.is_traced(alpha) and not (alpha > 0 and
                                          math.isfinite(alpha)):
    raise ValueError(f"FedDyn alpha must be a positive finite number, got "
                     f"{alpha}.")
  local = make_local_update(training, regularizer=dynamic_regularizer(alpha))
  train = stages.client_stage(local, training.mapper)
  server_opt = optax.sgd(1.0)

  def init(params, batch_stats, num_clients):
    extra = {"h": tree_map(jnp.zeros_like, params),
             "num_clients": jnp.int32(num_clients)}
    server = ServerState(params, batch_stats, server_opt.init(params),
                         extra=extra)
    grads = tree_map(lambda z: jnp.zeros((num_clients, *z.shape), z.dtype),
                     params)
    return server, {"grad": grads}

  @jax.jit
  def aggregate(server, clients, result, cohort):
    d = stages.deltas(result.params, server.params)  # θ_k^t − θ^{t-1}, [S, ...]
    grad = tree_map(lambda g, dk: g - alpha * dk, clients["grad"], d)
    num = server.extra["num_clients"].astype(jnp.float32)
    h = tree_map(lambda hh, dk: hh - alpha * dk.sum(0) / num,
                 server.extra["h"], d)
    uniform = jnp.ones_like(cohort.num_examples, jnp.float32)
    # θ^t − θ^{t-1} = mean_P(θ_k^t − θ^{t-1}) − h^t/α.
    delta = tree_map(lambda m, hh: m - hh / alpha,
                     stages.weighted_mean(d, uniform), h)
    batch_stats = stages.weighted_mean(result.batch_stats, cohort.num_examples)
    server = stages.server_step(server_opt, server, delta, batch_stats,
                                extra={"h": h})
    return server, {"grad": grad}, stages.cohort_metrics(result,
                                                         cohort.num_examples)

  def apply(server, clients, cohort, key):
    keys = keys_lib.client_keys(key, cohort.client_ids)
    result = train(server.params, server.batch_stats, (), cohort, keys,
                   clients["grad"])
    return aggregate(server, clients, result, cohort)

  return FederatedAlgorithm(init=init, apply=apply, comm=CommSpec(1, 1))
