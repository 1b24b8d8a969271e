"""Stages shared by the methods that keep one model per cluster.

IFCA, CFL, CFL-GP and PACFL hold ``K`` cluster models stacked ``[K, ...]``;
every sampled client trains the model of its cluster, and the server sets each
cluster's model to the example-weighted mean of the models its clients
returned (a model nobody trained keeps its weights): :func:`aggregate`.
What differs is how a client's cluster is found (IFCA: the lowest loss;
CFL: recursive bi-partitioning; CFL-GP: spectral partitions of accumulated
updates; PACFL: principal angles of the data).

Each client deploys its cluster's model (:func:`deploy_assigned`; IFCA:
the model of lowest loss on its data), which personalized evaluation
scores (:mod:`fedjax_dd.core.personal`). The evaluated global model
(``ServerState.params``) is the model picked by
the most training examples this round or the example-weighted average of the
cluster models (:func:`global_model`), unless IGA is plugged in
(:class:`IGAPlugin`, DisUE Tab. 2): then the round's trained cluster models
teach the global model through DisUE's inter-group aggregation
(:mod:`fedjax_dd.distill.iga`). As in DisUE's round (:mod:`fedjax_dd.
algorithms.clustered`), the student starts from the example-weighted mean of
the round's teachers (the cohort's FedAvg) and the teachers are weighted by
the class counts their clients reported (once, the first time each is
sampled; ``traffic/upload/class_counts``). The clients keep training their
cluster models; only the evaluated model changes.

References: Ghosh et al., "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020; Leng et al., "Distilling A Universal Expert from
Clustered Federated Learning" (DisUE), Sec. 4.2 and Tab. 2.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_dd.algorithms import stages
from fedjax_dd.algorithms.stages import class_counts, round_factor
from fedjax_dd.core import aggregate as aggregate_lib
from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core.algorithm import Cohort, ServerState
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import make_local_update
from fedjax_dd.core.rounds import TRAFFIC_PREFIX
from fedjax_dd.core.task import Classifier
from fedjax_dd.distill.iga import IGA

PyTree = Any
tree_map = jax.tree_util.tree_map

GLOBAL_MODELS = ("largest", "average")


def check_global_model(global_model: str) -> None:
  if global_model not in GLOBAL_MODELS:
    raise ValueError(f"global_model must be one of {GLOBAL_MODELS}, got "
                     f"{global_model!r}.")


def stack(trees: list[PyTree]) -> PyTree:
  """``[K, ...]`` stack of ``K`` pytrees of one structure."""
  return tree_map(lambda *xs: jnp.stack(xs), *trees)


def aggregate(models: PyTree, stacked: PyTree, picks: jax.Array,
              weights: jax.Array, num_clusters: int
              ) -> tuple[PyTree, jax.Array]:
  """Per-cluster example-weighted means of the cohort's models.

  Args:
    models: the cluster models ``[K, ...]`` before the round.
    stacked: the cohort's returned models ``[S, ...]``.
    picks: ``[S]`` int32 cluster of each cohort client.
    weights: ``[S]`` examples of each cohort client.
    num_clusters: ``K`` (static).

  Returns:
    ``(models [K, ...], sizes [K])``: cluster ``k``'s model is
    ``Σ_{i: pick_i = k} n_i ω_i / Σ n_i``, or its old model when no client
    picked it; ``sizes`` are the examples behind each cluster this round.
  """
  onehot = jax.nn.one_hot(picks, num_clusters, dtype=jnp.float32)  # [S, K]
  w = onehot * weights.astype(jnp.float32)[:, None]
  sizes = w.sum(axis=0)
  denom = jnp.maximum(sizes, 1e-12)

  def per_cluster(new, old):
    s = jnp.tensordot(w.T, new.astype(jnp.float32), axes=1)  # [K, ...]
    s = s / denom.reshape((-1,) + (1,) * (s.ndim - 1))
    keep = (sizes > 0).reshape((-1,) + (1,) * (s.ndim - 1))
    return jnp.where(keep, s.astype(old.dtype), old)

  return tree_map(per_cluster, stacked, models), sizes


def global_model(models: PyTree, stats: PyTree, sizes: jax.Array,
                 mode: str) -> tuple[PyTree, PyTree]:
  """The evaluated model: the cluster of most examples (``"largest"``, ties:
  the lowest index) or the ``sizes``-weighted mean (``"average"``)."""
  if mode == "largest":
    j = jnp.argmax(sizes)
    return tree_map(lambda m: m[j], models), tree_map(lambda s: s[j], stats)
  w = jnp.where(sizes.sum() > 0, sizes, jnp.ones_like(sizes))
  return stages.weighted_mean(models, w), stages.weighted_mean(stats, w)


def deploy_assigned(server: ServerState, data: Any
                    ) -> tuple[PyTree, PyTree, jax.Array]:
  """What each client deploys in a method that assigns clusters (CFL,
  CFL-GP, PACFL): its cluster's model, ``extra["models"][extra["clusters"]
  [i]]`` (a :data:`fedjax_dd.core.algorithm.Deploy`; ``data`` must hold the
  run's clients in their order). The papers score each client with it."""
  clusters = server.extra["clusters"]
  if clusters.shape[0] != data.num_clients:
    raise ValueError(f"deploy: the server assigned {clusters.shape[0]} "
                     f"clients, the data holds {data.num_clients}.")
  return server.extra["models"], server.extra["batch_stats"], clusters


def compact_labels(picks: jax.Array, num_clusters: int) -> jax.Array:
  """``[S]`` cluster ids renumbered ``0 .. k-1`` in id order over the ``k``
  clusters present, so ``S`` teacher slots hold them whatever ``K`` is."""
  present = jnp.zeros((num_clusters,), jnp.int32).at[picks].set(1)
  return (jnp.cumsum(present) - 1)[picks]


def make_trainer(task: Classifier,
                 client_optimizer: optax.GradientTransformation,
                 *,
                 batch_size: int,
                 max_steps: int,
                 mapper: ClientMapper,
                 augment: Callable[[jax.Array, jax.Array], jax.Array] | None,
                 lr_decay: float) -> Callable[..., Any]:
  """Local training of each sampled client from its cluster's model.

  Returns:
    ``train(server, cohort, key) -> (result, picks)``: every client of the
    cohort trains ``server.extra["models"][picks[i]]`` (its cluster, from
    ``server.extra["clusters"]``) at ``lr·γ^(t-1)`` in round ``t``;
    ``result`` is the stacked local result ``[C, ...]``.
  """
  if not (lr_decay > 0 and math.isfinite(lr_decay)):
    raise ValueError(f"lr_decay must be a positive finite number, got "
                     f"{lr_decay}.")
  local = make_local_update(task, client_optimizer, batch_size=batch_size,
                            max_steps=max_steps, augment=augment,
                            lr_scale=(lambda ctx: ctx)
                            if lr_decay != 1.0 else None)

  def one_client(models, stats, pick, x, y, n, num_steps, key, scale):
    params = tree_map(lambda m: m[pick], models)
    batch_stats = tree_map(lambda s: s[pick], stats)
    return local.run(params, batch_stats, local.optimizer.init(params), x, y,
                     n, num_steps, key, scale)

  mapped = mapper.map(one_client, in_axes=(None, None, 0, 0, 0, 0, 0, 0, 0),
                      work_argnum=6)

  def train(server: ServerState, cohort: Cohort, key: jax.Array):
    keys = keys_lib.client_keys(key, cohort.client_ids)
    scale = jnp.full(cohort.client_ids.shape,
                     round_factor(lr_decay, server.extra["round"]),
                     jnp.float32)
    picks = server.extra["clusters"][cohort.client_ids]
    result = mapped(server.extra["models"], server.extra["batch_stats"],
                    picks, cohort.x, cohort.y, cohort.num_examples,
                    cohort.num_steps, keys, scale)
    return result, picks

  return train


def make_aggregate(num_models: int, mode: str) -> Callable[..., Any]:
  """The server's step after training (jitted): each cluster's model is the
  example-weighted mean of its clients' (:func:`aggregate`, models and batch
  statistics), the evaluated model is :func:`global_model` of them (``mode``
  ``"largest"`` or ``"average"``), and the
  round counter advances.

  Returns:
    ``aggregate(server, result, picks, cohort) -> (server, metrics)``;
    metrics are the cohort's training metrics and ``clusters_trained``.
  """
  check_global_model(mode)

  @jax.jit
  def step(server: ServerState, result, picks, cohort: Cohort):
    models, sizes = aggregate(server.extra["models"], result.params, picks,
                              cohort.num_examples, num_models)
    stats, _ = aggregate(server.extra["batch_stats"], result.batch_stats,
                         picks, cohort.num_examples, num_models)
    params, batch_stats = global_model(models, stats, sizes, mode)
    extra = {**server.extra, "models": models, "batch_stats": stats,
             "sizes": sizes, "round": server.extra["round"] + 1}
    metrics = stages.cohort_metrics(result, cohort.num_examples)
    metrics["clusters_trained"] = jnp.sum(sizes > 0)
    return server.replace(params=params, batch_stats=batch_stats,
                          extra=extra), metrics

  return step


class IGAPlugin:
  """IGA on the round's cluster models (module doc; DisUE Tab. 2).

  Its state lives in the server's ``extra``: ``"iga"`` (the generator,
  :class:`~fedjax_dd.distill.iga.IGAState`, whose ``rounds`` is the ``t``
  of the learning-rate decays) and ``"reported"`` (``[N]`` clients that sent
  their class counts).
  """

  def __init__(self, task: Classifier, iga: IGA, generator_key: jax.Array,
               *, bits_per_count: int = 32):
    if generator_key is None:
      raise ValueError("IGA needs generator_key to initialise its generator.")
    self._iga = iga
    self._key = generator_key
    self._num_classes = task.num_classes
    self._bits = bits_per_count

    @jax.jit
    def _teachers(params, batch_stats, labels, weights, counts):
      s = weights.shape[0]
      gp, gw = aggregate_lib.segment_weighted_mean(params, labels, weights, s)
      gs, _ = aggregate_lib.segment_weighted_mean(batch_stats, labels,
                                                  weights, s)
      group_counts = jax.ops.segment_sum(counts, labels, num_segments=s)
      return (gp, gs, group_counts, stages.weighted_mean(gp, gw),
              stages.weighted_mean(gs, gw))

    self._teachers = _teachers

  def init(self, params: PyTree, batch_stats: PyTree,
           num_clients: int) -> dict[str, Any]:
    return {"iga": self._iga.init(self._key, params, batch_stats),
            "reported": jnp.zeros((num_clients,), bool)}

  def round(self, server: ServerState, result, picks: jax.Array,
            num_clusters: int, cohort: Cohort
            ) -> tuple[ServerState, dict[str, Any]]:
    """One IGA round after the cluster aggregation.

    Args:
      server: the aggregated server state (its ``extra`` holds the
        plug-in's state).
      result: the cohort's local results (``params``, ``batch_stats`` stacked
        ``[S, ...]``).
      picks: ``[S]`` cluster of each cohort client.
      num_clusters: ``K`` (static).
      cohort: the round's cohort.

    Returns:
      ``(server, metrics)``: the server with the distilled global model and
      the plug-in's new state, and the ``iga_*`` metrics with the class
      counts' traffic.
    """
    extra = server.extra
    labels = compact_labels(picks, num_clusters)
    counts = class_counts(cohort, self._num_classes)
    gp, gs, group_counts, params, batch_stats = self._teachers(
        result.params, result.batch_stats, labels, cohort.num_examples,
        counts)
    state = extra["iga"]
    state, params, batch_stats, m = self._iga.round(
        state, params, batch_stats, gp, gs, group_counts, state.rounds)
    reported = extra["reported"]
    new_reports = jnp.sum(~reported[cohort.client_ids])
    extra = {**extra, "iga": state,
             "reported": reported.at[cohort.client_ids].set(True)}
    metrics = {f"iga_{k}": v for k, v in m.items()}
    metrics[f"{TRAFFIC_PREFIX}upload/class_counts"] = (
        new_reports * self._num_classes * self._bits)
    return server.replace(params=params, batch_stats=batch_stats,
                          extra=extra), metrics
