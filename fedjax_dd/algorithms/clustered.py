"""Clustered FL with data-free inter-group distillation (DisUE's round).

One round on a cohort of ``S`` clients (DisUE, Leng et al., Alg. 1):

1. **L-phase.** Every client trains from the global model ``ω_G``.
2. **Grouping** (host). A :data:`Grouping` splits the cohort into ``K``
   groups (DisUE: :func:`fedjax_dd.algorithms.disue.affinity_grouping`,
   Eqs. 3–4; FedFTG: :func:`singletons`; any clustering, Tab. 2).
3. **Intra-group aggregation** (Eq. 2). ``ω_{C_k}`` is the sample-weighted
   FedAvg inside group ``k``, over a static ``S`` segments so nothing
   recompiles when ``K`` changes.
4. **G-phase.** ``ω_G`` is the sample-weighted FedAvg of the group models
   (the FedAvg of the cohort).
5. **IGA** (Eqs. 5–13, optional). The group models, padded to ``S`` with
   zero class counts, teach ``ω_G`` through a persistent conditional
   generator (:mod:`fedjax_dd.distill.iga`); without it ("−IGA") ``ω_G``
   stays step 4's.

Clients report their class counts once, the first time they are sampled
(``traffic/upload/class_counts``); a grouping may report its own traffic.
The server state's ``extra`` holds every client's last group (``-1``: never
sampled), who reported counts, and the IGA generator, so a checkpoint
resumes bit-identically. With ``evaluate_before_iga`` it also holds step 4's
``ω_G``, which the rounds loop evaluates as ``test_accuracy_before_iga``
(:data:`fedjax_dd.core.rounds.EVAL_MODELS`), to show what IGA adds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.algorithms import stages
from fedjax_dd.core import aggregate
from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core.algorithm import Cohort, CommSpec, FederatedAlgorithm
from fedjax_dd.core.algorithm import ServerState
from fedjax_dd.core.local import LocalResult, LocalTraining, make_local_update
from fedjax_dd.core.rounds import EVAL_MODELS, TRAFFIC_PREFIX
from fedjax_dd.distill.iga import IGA

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Groups:
  """A partition of the cohort (host values).

  Attributes:
    labels: ``[S]`` int32 group of each cohort client, in ``0..K-1``.
    num_groups: ``K``.
    converged: the clustering converged (a fallback was not needed).
    traffic: ``{(kind, tag): bits}`` the grouping sent this round.
  """
  labels: np.ndarray
  num_groups: int
  converged: bool = True
  traffic: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)


# (client_params [S, ...], global_params, num_examples [S], rng) -> Groups.
Grouping = Callable[[PyTree, PyTree, jax.Array, np.random.Generator], Groups]


def singletons(client_params: PyTree, global_params: PyTree,
               num_examples: jax.Array, rng: np.random.Generator) -> Groups:
  """Every client is its own group (FedFTG: the clients are the teachers)."""
  del client_params, global_params, rng
  s = int(np.shape(num_examples)[0])
  return Groups(labels=np.arange(s, dtype=np.int32), num_groups=s)


def one_group(client_params: PyTree, global_params: PyTree,
              num_examples: jax.Array, rng: np.random.Generator) -> Groups:
  """The whole cohort is one group (its FedAvg is the only teacher)."""
  del client_params, global_params, rng
  s = int(np.shape(num_examples)[0])
  return Groups(labels=np.zeros(s, np.int32), num_groups=1)


@jax.jit
def group_models(params: PyTree, batch_stats: PyTree, labels: jax.Array,
                 weights: jax.Array, counts: jax.Array):
  """Eq. 2: each group's sample-weighted FedAvg and class counts.

  Args:
    params, batch_stats: the cohort's models ``[S, ...]``.
    labels: ``[S]`` int32 group of each client, in ``0..K-1``.
    weights: ``[S]`` examples of each client.
    counts: ``[S, C]`` class counts of each client.

  Returns:
    ``(group_params [S, ...], group_stats [S, ...], group_weights [S],
    group_counts [S, C])``; rows ``k >= K`` are empty, so one program
    serves every ``K`` (the segments are the cohort's positions).
  """
  s = weights.shape[0]
  gp, gw = aggregate.segment_weighted_mean(params, labels, weights, s)
  gs, _ = aggregate.segment_weighted_mean(batch_stats, labels, weights, s)
  group_counts = jax.ops.segment_sum(counts, labels, num_segments=s)
  return gp, gs, gw, group_counts


@jax.jit
def fedavg_of_groups(gp: PyTree, gs: PyTree, gw: jax.Array):
  """The G-phase: the sample-weighted FedAvg of the group models."""
  return stages.weighted_mean(gp, gw), stages.weighted_mean(gs, gw)


def check_iga(iga: IGA | None, generator_key: jax.Array | None) -> None:
  """Raises ValueError for ``iga`` without ``generator_key`` (build time)."""
  if iga is not None and generator_key is None:
    raise ValueError("IGA needs generator_key to initialise its generator.")


def init_iga(iga: IGA | None, generator_key: jax.Array | None,
             params: PyTree, batch_stats: PyTree,
             num_clients: int) -> dict[str, Any]:
  """The server-``extra`` entries :func:`iga_round` reads: ``"reported"``
  (``[N]`` clients that sent their class counts) and, with ``iga``,
  ``"iga"`` (the generator state; :func:`check_iga` first)."""
  extra = {"reported": jnp.zeros((num_clients,), bool)}
  if iga is not None:
    extra["iga"] = iga.init(generator_key, params, batch_stats)
  return extra


def iga_round(iga: IGA | None, server: ServerState, result: LocalResult,
              labels: jax.Array, cohort: Cohort, *, num_classes: int,
              bits_per_count: int = 32
              ) -> tuple[ServerState, dict[str, Any], tuple[PyTree, PyTree]]:
  """Steps 3–5 of the module doc on the round's grouped cohort.

  The group models (Eq. 2) teach their FedAvg through IGA (Eqs. 5–13),
  weighted by their clients' class counts. Also used by IFCA, CFL, CFL-GP
  and PACFL with IGA plugged in (DisUE Tab. 2).

  Args:
    iga: the IGA (``num_teachers_max`` = the cohort size), or ``None``:
      the global model is the FedAvg of the groups.
    server: the server state; its ``extra`` holds :func:`init_iga`'s
      entries.
    result: the cohort's local results (``params``, ``batch_stats``
      stacked ``[S, ...]``).
    labels: ``[S]`` int32 group of each cohort client, in ``0..K-1``.
    cohort: the round's cohort.
    num_classes: ``C``.
    bits_per_count: bits of one reported class count in the ledger.

  Returns:
    ``(server, metrics, fedavg)``: the server with the new global model
    and ``extra``; the ``iga_*`` metrics and the class counts' traffic; the
    G-phase model ``(params, batch_stats)`` before IGA.
  """
  counts = stages.class_counts(cohort, num_classes)
  gp, gs, gw, group_counts = group_models(result.params, result.batch_stats,
                                          labels, cohort.num_examples, counts)
  fedavg = params, batch_stats = fedavg_of_groups(gp, gs, gw)
  extra = dict(server.extra)
  metrics = {}
  if iga is not None:
    state = extra["iga"]
    extra["iga"], params, batch_stats, iga_metrics = iga.round(
        state, params, batch_stats, gp, gs, group_counts, state.rounds)
    metrics.update({f"iga_{k}": v for k, v in iga_metrics.items()})
  reported = extra["reported"]
  new_reports = jnp.sum(~reported[cohort.client_ids])
  extra["reported"] = reported.at[cohort.client_ids].set(True)
  metrics[f"{TRAFFIC_PREFIX}upload/class_counts"] = (
      new_reports * num_classes * bits_per_count)
  return (server.replace(params=params, batch_stats=batch_stats, extra=extra),
          metrics, fedavg)


class ClusteredPrograms(NamedTuple):
  """The device programs of one clustered round (see module doc).

  Attributes:
    train: the L-phase, :func:`fedjax_dd.algorithms.stages.client_stage`:
      ``(params, batch_stats, (), cohort, keys [S]) ->`` stacked results.
    group_models: Eq. 2, :func:`group_models`.
    fedavg_of_groups: the G-phase, :func:`fedavg_of_groups`.
  """
  train: Callable[..., Any]
  group_models: Callable[..., Any]
  fedavg_of_groups: Callable[..., Any]


def clustered_programs(training: LocalTraining) -> ClusteredPrograms:
  """The jitted stages :func:`clustered_distillation` runs every round.

  ``training`` as in :func:`clustered_distillation`.
  """
  local = make_local_update(training)
  return ClusteredPrograms(train=stages.client_stage(local, training.mapper),
                           group_models=group_models,
                           fedavg_of_groups=fedavg_of_groups)


def clustered_distillation(
    training: LocalTraining,
    *,
    grouping: Grouping,
    iga: IGA | None,
    generator_key: jax.Array | None = None,
    bits_per_count: int = 32,
    evaluate_before_iga: bool = False,
) -> FederatedAlgorithm:
  """Builds the clustered-FL round with optional IGA (see module doc).

  Args:
    training: the clients' local training from ``ω_G`` (``training.task``
      is also the server's model; the optimizer is re-initialised every
      round; e.g. :func:`fedjax_dd.core.local.round_decay` ``(0.998)``,
      DisUE Sec. 5.1).
    grouping: how the cohort is split into groups (host side).
    iga: the inter-group distillation (:func:`fedjax_dd.distill.iga.
      make_iga` with ``num_teachers_max`` = the cohort size), or ``None``
      for FedAvg of the groups.
    generator_key: key of the generator's initialisation (required with
      ``iga``).
    bits_per_count: bits of one reported class count in the ledger.
    evaluate_before_iga: keep the round's ``ω_G`` before IGA in the state
      for the rounds loop to evaluate (one more model per checkpoint).

  Returns:
    A :class:`~fedjax_dd.core.algorithm.FederatedAlgorithm` (one model down
    and one up per sampled client; class counts and the grouping's traffic
    as ``traffic/`` metrics).

  Raises:
    ValueError: ``iga`` without ``generator_key``, or
      ``evaluate_before_iga`` without ``iga``.
  """
  check_iga(iga, generator_key)
  if evaluate_before_iga and iga is None:
    raise ValueError("evaluate_before_iga needs an IGA: without it the "
                     "global model is the model before IGA.")

  def before_iga(params, batch_stats):
    return {"before_iga": {"params": params, "batch_stats": batch_stats}}

  train = clustered_programs(training).train
  num_classes = training.task.num_classes

  def init(params, batch_stats, num_clients):
    extra = {"groups": jnp.full((num_clients,), -1, jnp.int32),
             **init_iga(iga, generator_key, params, batch_stats, num_clients)}
    if evaluate_before_iga:
      extra[EVAL_MODELS] = before_iga(params, batch_stats)
    return ServerState(params, batch_stats, {}, extra), {}

  def apply(server, clients, cohort, key):
    keys = keys_lib.client_keys(key, cohort.client_ids)
    result = train(server.params, server.batch_stats, (), cohort, keys)
    weights = cohort.num_examples
    rng = keys_lib.numpy_from_key(keys_lib.server_key(key))
    groups = grouping(result.params, server.params, weights, rng)
    labels = jnp.asarray(groups.labels, jnp.int32)
    metrics = stages.cohort_metrics(result, weights)
    server, iga_metrics, fedavg = iga_round(
        iga, server, result, labels, cohort, num_classes=num_classes,
        bits_per_count=bits_per_count)
    metrics.update(iga_metrics)
    extra = dict(server.extra)
    if evaluate_before_iga:
      extra[EVAL_MODELS] = before_iga(*fedavg)
    extra["groups"] = extra["groups"].at[cohort.client_ids].set(labels)
    metrics["num_clusters"] = groups.num_groups
    metrics["clustering_converged"] = int(groups.converged)
    for (kind, tag), bits in groups.traffic.items():
      metrics[f"{TRAFFIC_PREFIX}{kind}/{tag}"] = int(bits)
    return server.replace(extra=extra), clients, metrics

  return FederatedAlgorithm(init=init, apply=apply, comm=CommSpec())
