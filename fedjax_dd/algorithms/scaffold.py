"""SCAFFOLD: control variates correct client drift.

Local steps use ``g − c_i + c``. After ``K_i`` steps with learning rate ``η``
a client updates ``c_i⁺ = c_i − c + (x − y_i)/(K_i η)`` (option II) and sends
``(Δy_i, Δc_i)``; the server sets ``x ← x + η_g · mean(Δy)`` and
``c ← c + (S/N) · mean(Δc)``. Client variates persist in the stacked client
state ``[N, ...]``. Communication: ``CommSpec(2, 2)``.

Reference: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", ICML 2020.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_dd.algorithms import stages
from fedjax_dd.core import checks
from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core.algorithm import CommSpec, FederatedAlgorithm, ServerState
from fedjax_dd.core.local import LocalTraining, make_local_update

tree_map = jax.tree_util.tree_map


def _correction(grads, ctx):
  """``g − c_i + c``: the shared context is ``c``, the client's ``c_i``."""
  return tree_map(lambda g, s, ci: g - ci + s, grads, ctx.shared, ctx.client)


def scaffold(training: LocalTraining,
             *,
             learning_rate: float,
             server_learning_rate: float = 1.0) -> FederatedAlgorithm:
  """Builds SCAFFOLD, whose clients step at ``learning_rate``.

  Args:
    training: the clients' local training. Its optimizer is fed the
      corrected gradient ``g − c_i + c``: ``optax.sgd(learning_rate)`` is
      the paper's; clipping and weight decay before SGD
      (``client.grad_clip``, ``client.weight_decay``) act on the corrected
      gradient, as in FedFTG's released SCAFFOLD (``methods/local_fn.py``
      at ``1e6347c``), DisUE's baseline. With a ``schedule``, round ``i``
      trains at ``learning_rate * schedule(i)`` and the variate update
      divides by that round's ``K_i * eta_i``.
    learning_rate: the local step size ``η`` of ``training.optimizer``,
      which the variate update divides by (``K_i · η``).
    server_learning_rate: ``η_g``.

  Either rate may be a traced scalar (a per-run value on the run axis,
  :func:`fedjax_dd.fit_runs`); ``learning_rate`` must then be the same
  value as ``training.optimizer``'s rate.

  Returns:
    A :class:`FederatedAlgorithm` whose client state is ``{"c": [N, ...]}``.

  Raises:
    fedjax_dd.core.checks.SettingError: ``learning_rate`` or
      ``server_learning_rate`` not a finite number > 0.
  """
  learning_rate = checks.check_scalar("SCAFFOLD learning_rate", learning_rate,
                                      0.0, low_open=True)
  server_learning_rate = checks.check_scalar(
      "SCAFFOLD server_learning_rate", server_learning_rate, 0.0,
      low_open=True)
  schedule = training.schedule
  local = make_local_update(training, grad_correction=_correction)
  train = stages.client_stage(local, training.mapper)
  server_opt = optax.sgd(server_learning_rate)

  def init(params, batch_stats, num_clients):
    zeros = tree_map(jnp.zeros_like, params)
    stacked = tree_map(lambda z: jnp.zeros((num_clients, *z.shape), z.dtype),
                       params)
    extra = {"c": zeros, "num_clients": jnp.int32(num_clients)}
    server = ServerState(params, batch_stats, server_opt.init(params),
                         extra=extra)
    return server, {"c": stacked}

  @jax.jit
  def aggregate(server, clients, result, cohort):
    c = server.extra["c"]
    k = result.steps
    # Clients that took no step keep their variate (no division by zero).
    eta = learning_rate
    if schedule is not None:
      eta = learning_rate * schedule(jnp.asarray(cohort.round, jnp.int32))
    inv = jnp.where(k > 0, 1.0 / (jnp.maximum(k, 1.0) * eta), 0.0)

    def new_variate(ci, cg, x, y):
      s = inv.reshape((-1,) + (1,) * (y.ndim - 1))
      return jnp.where(s > 0, ci - cg[None] + (x[None] - y) * s, ci)

    c_new = tree_map(new_variate, clients["c"], c, server.params,
                     result.params)
    uniform = jnp.ones_like(cohort.num_examples, jnp.float32)
    delta = stages.weighted_mean(stages.deltas(result.params, server.params),
                                 uniform)
    delta_c = stages.weighted_mean(
        tree_map(lambda a, b: a - b, c_new, clients["c"]), uniform)
    frac = cohort.num_examples.shape[0] / server.extra["num_clients"]
    c = tree_map(lambda cg, d: cg + frac * d, c, delta_c)
    batch_stats = stages.weighted_mean(result.batch_stats, cohort.num_examples)
    server = stages.server_step(server_opt, server, delta, batch_stats,
                                extra={"c": c})
    return server, {"c": c_new}, stages.cohort_metrics(result,
                                                       cohort.num_examples)

  def apply(server, clients, cohort, key):
    keys = keys_lib.client_keys(key, cohort.client_ids)
    result = train(server.params, server.batch_stats, server.extra["c"],
                   cohort, keys, clients["c"])
    return aggregate(server, clients, result, cohort)

  return FederatedAlgorithm(init=init, apply=apply, comm=CommSpec(2, 2))
