"""IFCA: K cluster models; each client trains the one that fits it best.

Every round the server sends all ``K`` models to the sampled clients. A
client picks the model of lowest loss on its own training data
(:func:`selection_losses`; ties: the lowest index), trains it and returns it
(model averaging, IFCA's Alg. 2 "option II"); the server aggregates per
model (:func:`fedjax_dd.algorithms.cluster_models.aggregate`).
Communication: ``CommSpec(K, 1)``.

The ``K`` models start from different initialisations (with equal starts
every client would pick model 0): model 0 is the ``params`` given to
``init`` and model ``j > 0`` is ``task.init(fold_in(init_key, j))``.

The paper evaluates each test group with its lowest-loss cluster model; a
single global test split has no groups, so the evaluated global model is
chosen by :class:`~fedjax_dd.algorithms.cluster_models.ClusterServing`
(``"average"`` is meaningful only while the models stay close). All ``K``
models are in ``ServerState.extra["models"]`` (``[K, ...]``, with
``extra["batch_stats"]``); each client deploys the one of lowest loss on
its own training data, which personalized evaluation scores, as the paper
does (:mod:`fedjax_dd.core.personal`).

Reference: Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for
Clustered Federated Learning", NeurIPS 2020.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_dd.algorithms import cluster_models, clustered, stages
from fedjax_dd.algorithms.cluster_models import ClusterServing
from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core import checks
from fedjax_dd.core.algorithm import (CommSpec, Cohort, FederatedAlgorithm,
                                      ServerState)
from fedjax_dd.core.local import (LocalTraining, RoundContext,
                                  make_local_update)
from fedjax_dd.core.task import Classifier

PyTree = Any
tree_map = jax.tree_util.tree_map

GLOBAL_MODELS = cluster_models.GLOBAL_MODELS


@dataclasses.dataclass(frozen=True)
class IFCAHyperParams:
  """IFCA's settings, the ``ifca`` config group.

  Attributes:
    num_clusters: ``K >= 1`` cluster models.
    global_model: the reported model, ``"largest"`` or ``"average"``
      (:class:`~fedjax_dd.algorithms.cluster_models.ClusterServing`).
  """
  num_clusters: int = 2
  global_model: str = "largest"

  def __post_init__(self):
    checks.check_int("num_clusters", self.num_clusters, 1)
    checks.check_choice("global_model", self.global_model, GLOBAL_MODELS)


def selection_losses(task: Classifier, models: PyTree, batch_stats: PyTree,
                     x: jax.Array, y: jax.Array, n: jax.Array) -> jax.Array:
  """``[K]`` losses of ``K`` stacked models on ONE client's padded data
  (masked mean, BatchNorm in evaluation mode).

  Args:
    task: the classifier.
    models: params stacked ``[K, ...]``.
    batch_stats: BatchNorm statistics stacked ``[K, ...]`` (``{}``: none).
    x: ``[N_max, H, W, Ch]`` uint8 images.
    y: ``[N_max]`` labels.
    n: valid examples; rows ``>= n`` are padding and never count.
  """
  mask = (jnp.arange(y.shape[0]) < n).astype(jnp.float32)

  def one(params, stats):
    loss, _ = task.loss(params, stats, x, y, train=False, weights=mask)
    return loss

  return jax.vmap(one)(models, batch_stats)


def ifca(training: LocalTraining,
         *,
         num_clusters: int,
         init_key: jax.Array,
         serving: ClusterServing = ClusterServing()) -> FederatedAlgorithm:
  """Builds IFCA with ``K = num_clusters`` models.

  Args:
    training: the clients' local training (``training.task`` is every
      cluster's classifier; optimizer re-initialised every round).
    num_clusters: ``K >= 1`` (static).
    init_key: key of the initialisations of models ``1 .. K-1``.
    serving: the model reported on the global test split
      (:class:`~fedjax_dd.algorithms.cluster_models.ClusterServing`).

  Returns:
    A :class:`FederatedAlgorithm`; its server state keeps
    ``extra["models"]`` and ``extra["batch_stats"]`` ``[K, ...]``,
    ``extra["sizes"]`` ``[K]`` (examples that picked each model in the
    latest round). Metrics add ``cluster_<j>_clients`` (clients that picked
    model ``j``) and ``selection_loss`` (mean of the clients' smallest loss).
  """
  if not isinstance(num_clusters, int) or num_clusters < 1:
    raise ValueError(f"num_clusters must be an int >= 1, got {num_clusters}.")
  serving.check()
  global_model = serving.global_model
  task, mapper = training.task, training.mapper
  k_models = num_clusters
  local = make_local_update(training)

  def one_client(models, stats, round_index, x, y, n, num_steps, key):
    losses = selection_losses(task, models, stats, x, y, n)
    pick = jnp.argmin(losses)
    params = tree_map(lambda m: m[pick], models)
    batch_stats = tree_map(lambda s: s[pick], stats)
    ctx = RoundContext(round=round_index, start_params=params,
                       start_batch_stats=batch_stats)
    result = local.run(params, batch_stats, local.optimizer.init(params), x,
                       y, n, num_steps, key, ctx)
    return result, pick, losses

  train = mapper.map(one_client, in_axes=(None, None, None, 0, 0, 0, 0, 0))
  choose = mapper.map(
      lambda models, stats, x, y, n: jnp.argmin(
          selection_losses(task, models, stats, x, y, n)).astype(jnp.int32),
      in_axes=(None, None, 0, 0, 0))

  def deploy(server, data):
    # A client deploys the model it would train: lowest loss on its data.
    models, stats = server.extra["models"], server.extra["batch_stats"]
    return models, stats, choose(models, stats, data.x, data.y,
                                 data.num_examples)

  def init(params, batch_stats, num_clients):
    starts = [(params, batch_stats)] + [
        task.init(jax.random.fold_in(init_key, j)) for j in range(1, k_models)]
    models = tree_map(lambda *ps: jnp.stack(ps), *[p for p, _ in starts])
    stats = tree_map(lambda *ss: jnp.stack(ss), *[s for _, s in starts])
    extra = {"models": models, "batch_stats": stats,
             "sizes": jnp.zeros((k_models,), jnp.float32)}
    extra.update(serving.iga_extra(params, batch_stats, num_clients))
    # Round 0's global model is model 0, the given start.
    return ServerState(params, batch_stats, (), extra=extra), {}

  @jax.jit
  def aggregate(server: ServerState, result, picks, losses, cohort: Cohort):
    models, sizes = cluster_models.aggregate(
        server.extra["models"], result.params, picks, cohort.num_examples,
        k_models)
    stats, _ = cluster_models.aggregate(
        server.extra["batch_stats"], result.batch_stats, picks,
        cohort.num_examples, k_models)
    params, batch_stats = cluster_models.global_model(models, stats, sizes,
                                                      global_model)
    extra = {**server.extra, "models": models, "batch_stats": stats,
             "sizes": sizes}
    server = server.replace(params=params, batch_stats=batch_stats,
                            extra=extra)
    metrics = stages.cohort_metrics(result, cohort.num_examples)
    counts = jax.nn.one_hot(picks, k_models, dtype=jnp.float32).sum(axis=0)
    for j in range(k_models):
      metrics[f"cluster_{j}_clients"] = counts[j]
    metrics["selection_loss"] = jnp.min(losses, axis=1).mean()
    return server, metrics

  def apply(server, clients, cohort, key):
    keys = keys_lib.client_keys(key, cohort.client_ids)
    result, picks, losses = train(
        server.extra["models"], server.extra["batch_stats"],
        jnp.asarray(cohort.round, jnp.int32), cohort.x, cohort.y,
        cohort.num_examples, cohort.num_steps, keys)
    server, metrics = aggregate(server, result, picks, losses, cohort)
    server, metrics = serving.serve(server, metrics, result, picks,
                                    k_models, cohort,
                                    num_classes=task.num_classes)
    return server, clients, metrics

  return FederatedAlgorithm(init=init, apply=apply,
                            comm=CommSpec(download=k_models, upload=1),
                            deploy=deploy)
