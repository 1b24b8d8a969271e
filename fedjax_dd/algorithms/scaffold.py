"""SCAFFOLD: control variates correct client drift.

Local steps use ``g − c_i + c``. After ``K_i`` steps with learning rate ``η``
a client updates ``c_i⁺ = c_i − c + (x − y_i)/(K_i η)`` (option II) and sends
``(Δy_i, Δc_i)``; the server sets ``x ← x + η_g · mean(Δy)`` and
``c ← c + (S/N) · mean(Δc)``. Client variates persist across rounds in the
stacked client state ``[N, ...]``; only sampled clients change theirs. Both
directions carry two model-sized tensors (``CommSpec(2, 2)``).

Reference: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", ICML 2020.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_dd.algorithms import stages
from fedjax_dd.algorithms.stages import round_factor
from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core.algorithm import CommSpec, FederatedAlgorithm, ServerState
from fedjax_dd.core.local import LocalTraining, make_local_update

tree_map = jax.tree_util.tree_map


def _correction(grads, ctx):
  c, c_i = ctx
  return tree_map(lambda g, s, ci: g - ci + s, grads, c, c_i)


def scaffold(training: LocalTraining,
             *,
             learning_rate: float,
             server_learning_rate: float = 1.0) -> FederatedAlgorithm:
  """Builds SCAFFOLD, whose clients step at ``learning_rate``.

  Args:
    training: the clients' local training. Its optimizer is fed the
      corrected gradient ``g − c_i + c``: ``optax.sgd(learning_rate)`` is
      the paper's; a chain that clips the gradient and adds weight decay
      before SGD at ``learning_rate`` (``client.grad_clip``,
      ``client.weight_decay``) follows FedFTG's released SCAFFOLD
      (``methods/local_fn.py``, commit ``1e6347c``), the baseline of
      DisUE's protocol: the correction enters the loss, so clipping and
      decay act on the corrected gradient. With ``lr_decay = gamma != 1``
      round ``t`` (1-based) trains at ``learning_rate * gamma**(t - 1)``,
      the variate update divides by that round's ``K_i * eta_t`` and the
      finished rounds are counted in ``extra["round"]``.
    learning_rate: the local step size ``η`` of ``training.optimizer``,
      which the variate update divides by (``K_i · η``).
    server_learning_rate: ``η_g``.

  Returns:
    A :class:`FederatedAlgorithm` whose client state is ``{"c": [N, ...]}``.
  """
  lr_decay = training.lr_decay
  decay = training.decays
  if decay:
    # Each client's context is (c_i, this round's lr factor).
    correction = lambda g, ctx: _correction(g, (ctx[0], ctx[1][0]))
    lr_scale = lambda ctx: ctx[1][1]
  else:
    correction, lr_scale = _correction, None
  local = make_local_update(training, grad_correction=correction,
                            lr_scale=lr_scale)
  train = stages.client_stage(local, training.mapper)
  server_opt = optax.sgd(server_learning_rate)

  def init(params, batch_stats, num_clients):
    zeros = tree_map(jnp.zeros_like, params)
    stacked = tree_map(lambda z: jnp.zeros((num_clients, *z.shape), z.dtype),
                       params)
    extra = {"c": zeros, "num_clients": jnp.int32(num_clients)}
    if decay:
      extra["round"] = jnp.zeros((), jnp.int32)
    server = ServerState(params, batch_stats, server_opt.init(params),
                         extra=extra)
    return server, {"c": stacked}

  @jax.jit
  def aggregate(server, clients, result, cohort):
    c = server.extra["c"]
    k = result.steps
    # Clients that took no step keep their variate (no division by zero).
    eta = learning_rate
    if decay:
      eta = learning_rate * round_factor(lr_decay, server.extra["round"])
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
                                extra={"c": c}, advance_round=decay)
    return server, {"c": c_new}, stages.cohort_metrics(result,
                                                       cohort.num_examples)

  def apply(server, clients, cohort, key):
    keys = keys_lib.client_keys(key, cohort.client_ids)
    client_ctx = clients["c"]
    if decay:
      client_ctx = (client_ctx, jnp.full(
          cohort.client_ids.shape,
          round_factor(lr_decay, server.extra["round"])))
    result = train(server.params, server.batch_stats, server.extra["c"],
                   cohort, keys, client_ctx)
    return aggregate(server, clients, result, cohort)

  return FederatedAlgorithm(init=init, apply=apply, comm=CommSpec(2, 2))
