"""MOON: model-contrastive federated learning.

Each sampled client trains from the global model ``w^t`` on

  ``ℓ = ℓ_sup(w; (x, y)) + μ · ℓ_con(w; w^t, w_i^{t-1}; x)``      (Eq. 3)

with the model-contrastive loss on the projections ``z = R_w(x)``,
``z_glob = R_{w^t}(x)``, ``z_prev = R_{w_i^{t-1}}(x)``:

  ``ℓ_con = −log( exp(sim(z, z_glob)/τ) /
                  (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) )``  (Eq. 2)

``sim`` the cosine similarity, ``τ`` the temperature. The server averages the
clients' models weighted by ``|D_i|`` as FedAvg (Alg. 1). Defaults follow
the paper (Sec. 4.1): ``μ = 1`` (5 on CIFAR-100), ``τ = 0.5``.

From the authors' code, where the paper leaves it open: ``R_w`` is a
projection head to 256 dimensions on the base model less its output layer,
and the logits come from an output layer on ``z`` (a ``<name>_proj``
model); the global and previous models run in evaluation mode without
gradient; a client keeps its last local model until it is sampled again.

A never-sampled client's previous model is the initial global model (the
authors' code initialises it separately), so its first ``ℓ_con`` has zero
gradient and its first round is FedAvg's.

Per-client state: the previous local model ``(params, batch_stats)`` of all
``N`` clients, stacked ``[N, ...]`` in ``ExperimentState.clients``: ``N``
models of memory (:func:`client_state_bytes`). Messages are FedAvg's
(``CommSpec(1, 1)``); the previous model never travels.

Reference: Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjax_dd.algorithms import stages
from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core import checks
from fedjax_dd.core.algorithm import CommSpec, FederatedAlgorithm, ServerState
from fedjax_dd.core.local import LocalTraining, make_local_update

PyTree = Any
tree_map = jax.tree_util.tree_map

@dataclasses.dataclass(frozen=True)
class MOONHyperParams:
  """MOON's settings (Sec. 4.1), the ``moon`` config group.

  Attributes:
    mu: ``μ >= 0``, the weight of the model-contrastive loss (Eq. 3).
    temperature: ``τ > 0`` (Eq. 2).
  """
  mu: float = 1.0
  temperature: float = 0.5

  def __post_init__(self):
    checks.check_number("mu", self.mu, 0.0)
    checks.check_number("temperature", self.temperature, 0.0, low_open=True)


# torch.nn.CosineSimilarity's default eps (the authors' ``sim``).
_COS_EPS = 1e-8


def cosine(a: jax.Array, b: jax.Array) -> jax.Array:
  """Row-wise cosine similarity of ``[B, D]`` arrays, ``[B]``."""
  norms = jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1)
  return jnp.sum(a * b, axis=-1) / jnp.maximum(norms, _COS_EPS)


def contrastive_loss(z: jax.Array, z_glob: jax.Array, z_prev: jax.Array,
                     temperature: float) -> jax.Array:
  """MOON's ``ℓ_con`` (Eq. 2) per example ``[B]``, projections ``[B, D]``."""
  logits = jnp.stack([cosine(z, z_glob), cosine(z, z_prev)], -1) / temperature
  return -jax.nn.log_softmax(logits, axis=-1)[:, 0]


def client_state_bytes(algorithm: FederatedAlgorithm, params: PyTree,
                       batch_stats: PyTree, num_clients: int) -> int:
  """Bytes of ``algorithm``'s per-client state for ``num_clients`` clients,
  from the shapes ``init`` gives (nothing is allocated)."""
  _, clients = jax.eval_shape(
      lambda p, s: algorithm.init(p, s, num_clients), params, batch_stats)
  return sum(math.prod(x.shape) * x.dtype.itemsize
             for x in jax.tree_util.tree_leaves(clients))


def moon(training: LocalTraining,
         *,
         mu: float = 1.0,
         temperature: float = 0.5) -> FederatedAlgorithm:
  """Builds MOON over a projection model.

  Args:
    training: the clients' local training; ``training.task`` is a
      classifier whose module has ``project(x, train) -> (z, logits)`` (a
      ``<name>_proj`` model, :class:`fedjax_dd.models.ProjectionNet`).
    mu: weight ``μ`` of ``ℓ_con`` (Eq. 3), >= 0.
    temperature: ``τ`` (Eq. 2), > 0.

  Returns:
    A :class:`FederatedAlgorithm` whose client state is ``{"prev":
    (params, batch_stats)}`` stacked ``[N, ...]``.
  """
  if mu < 0:
    raise ValueError(f"MOON mu must be >= 0, got {mu}.")
  if not temperature > 0:
    raise ValueError(f"MOON temperature must be > 0, got {temperature}.")
  task = training.task
  project = getattr(type(task.module), "project", None)
  if project is None:
    raise ValueError(
        f"MOON needs a model with a projection head (a '<name>_proj' model); "
        f"{type(task.module).__name__} has no project method.")

  def local_loss(params, batch_stats, xb, yb, ctx):
    # The client's start is the global model; ctx.client its previous one.
    g_params, g_stats = ctx.start_params, ctx.start_batch_stats
    p_params, p_stats = ctx.client
    x = task.preprocess(xb)
    (z, logits), new_stats = task.apply(params, batch_stats, x, train=True,
                                        method=project)
    (z_glob, _), _ = task.apply(g_params, g_stats, x, train=False,
                                method=project)
    (z_prev, _), _ = task.apply(p_params, p_stats, x, train=False,
                                method=project)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, yb)
    con = contrastive_loss(z, jax.lax.stop_gradient(z_glob),
                           jax.lax.stop_gradient(z_prev), temperature)
    acc = (jnp.argmax(logits, -1) == yb).astype(jnp.float32).mean()
    return ce.mean() + mu * con.mean(), (new_stats, acc)

  local = make_local_update(training, loss=local_loss)
  train = stages.client_stage(local, training.mapper)
  server_opt = optax.sgd(1.0)

  def init(params, batch_stats, num_clients):
    stack = lambda t: tree_map(
        lambda x: jnp.broadcast_to(x, (num_clients, *x.shape)), t)
    server = ServerState(params, batch_stats, server_opt.init(params))
    return server, {"prev": (stack(params), stack(batch_stats))}

  @jax.jit
  def aggregate(server, result, cohort):
    weights = cohort.num_examples
    delta = stages.weighted_mean(stages.deltas(result.params, server.params),
                                 weights)
    batch_stats = stages.weighted_mean(result.batch_stats, weights)
    server = stages.server_step(server_opt, server, delta, batch_stats)
    # This round's local models are the sampled clients' next w_i^{t-1}.
    clients = {"prev": (result.params, result.batch_stats)}
    return server, clients, stages.cohort_metrics(result, weights)

  def apply(server, clients, cohort, key):
    keys = keys_lib.client_keys(key, cohort.client_ids)
    result = train(server.params, server.batch_stats, (), cohort, keys,
                   clients["prev"])
    return aggregate(server, result, cohort)

  return FederatedAlgorithm(init=init, apply=apply, comm=CommSpec(1, 1))
