"""The shared client stage of the one-shot methods, and one-shot FedAvg.

FedHydra, DENSE, FedDF and one-shot FedAvg share their client stage: every
client trains once, from the global model, to convergence and uploads its
model. :func:`client_stage` is that stage for any number of architecture
groups; client ``i`` keys from its id, so the models equal one round of
FedAvg's clients and the methods are compared on bit-identical clients.
:func:`os_fedavg` is the example-weighted average of the uploads.

Reference: Guha et al., "One-Shot Federated Learning", 2019 (one-shot
averaging); FedHydra (Bai et al.) Alg. 1 line 2-5 (local training).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.algorithms import stages
from fedjax_dd.core import keys
from fedjax_dd.core.algorithm import ClientProgress, Cohort
from fedjax_dd.core.algorithm import ServerDistillation, SpannedClientStage
from fedjax_dd.core.algorithm import Teachers
from fedjax_dd.core.algorithm import no_setup
from fedjax_dd.core.clients import ClientMapper, once_jit
from fedjax_dd.core.local import LocalResult, LocalTraining, make_local_update
from fedjax_dd.core.task import Classifier
from fedjax_dd.data import validate
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import ensemble

PyTree = Any


def local_stage(training: LocalTraining,
                *,
                per_client_start: bool = False
                ) -> Callable[[PyTree, PyTree, Cohort, jax.Array], LocalResult]:
  """One-shot local training of every client of one architecture.

  Args:
    training: the clients' local training (``training.task`` the client
      model; optimizer [SGD lr 0.01] fresh per client; batch size [128];
      ``max_steps`` = ``max(cohort.num_steps)``; one round: round 0 of its
      schedule).
    per_client_start: ``train`` takes one start per client, stacked
      ``[S, ...]`` (:func:`independent_starts`).

  Returns:
    ``train(params, batch_stats, cohort, key) -> LocalResult [S, ...]``;
    client ``i`` uses ``keys.client_keys(key, ids)[i]``, so with the rounds
    loop's train key it equals one-shot FedAvg's client models.
  """
  local = make_local_update(training)
  train_all = stages.client_stage(local, training.mapper,
                                  per_client_start=per_client_start)

  def train(params, batch_stats, cohort: Cohort, key: jax.Array) -> LocalResult:
    client_keys = keys.client_keys(key, cohort.client_ids)
    return train_all(params, batch_stats, (), cohort, client_keys)

  return train


def independent_starts(task: Classifier, init_key: jax.Array,
                       client_ids: jax.Array) -> tuple[PyTree, PyTree]:
  """One fresh initialisation per client, ``[S, ...]``.

  Client ``k`` starts from ``task.init(fold_in(init_key, k))``
  (:func:`fedjax_dd.core.keys.client_keys`): its id alone fixes its start.

  Args:
    task: the client model.
    init_key: the run's model-init key.
    client_ids: ``[S]`` the clients' ids.

  Returns:
    ``(params, batch_stats)`` stacked ``[S, ...]``.
  """
  # One top-level program for the whole cohort's initialisations.
  return once_jit(jax.vmap(task.init), op_by_op=True)(
      keys.client_keys(init_key, client_ids))


def client_stage(groups: Sequence[ensemble.TeacherGroup],
                 training: LocalTraining,
                 *,
                 num_steps: jax.Array,
                 mappers: Sequence[ClientMapper] | None = None,
                 independent_init: jax.Array | None = None
                 ) -> SpannedClientStage:
  """The one-shot client stage over architecture groups.

  Args:
    groups: one group per architecture (``group.task`` is the client model).
    training: the clients' local training (optimizer fresh per client;
      round 0 of its schedule). Each group trains its own ``group.task`` up
      to the largest of its clients' ``num_steps``, which replace
      ``training.task`` and ``training.max_steps``.
    num_steps: ``[m]`` local steps per client (client order).
    mappers: one client mapper per group (default: ``training.mapper``).
    independent_init: an init key: every client starts from its own
      initialisation (:func:`independent_starts`) and ``starts`` is ignored.
      ``None`` (default): all clients of a group start from its ``starts``
      entry, one-shot FedAvg's protocol (FedHydra's Alg. 1, lines 4–11,
      reads as clients that share no start).

  Returns:
    A :class:`~fedjax_dd.core.algorithm.SpannedClientStage`, called as
    ``stage(starts, data, key) -> Teachers``: ``starts`` per group the
    clients' start ``(params, batch_stats)``; ``data`` padded
    (``x [m, N_max, H, W, Ch]`` uint8, ``y [m, N_max]``, ``num_examples
    [m]``); ``key`` the round's train key. ``begin`` validates ``data``
    (``ValueError`` naming the field); ``advance`` runs a span of local
    steps for checkpointing, with the same models as one call.

  Raises:
    ValueError: ``num_steps`` not ``[m]`` integer step counts ``>= 0``
      (``m`` the clients of ``groups``), or negative on the host.
  """
  groups = tuple(groups)
  m = sum(len(g.client_ids) for g in groups)
  validate.step_counts("num_steps", num_steps, m)
  mappers = (tuple(mappers) if mappers is not None
             else (training.mapper,) * len(groups))
  optimizer = training.optimizer
  num_steps = jnp.asarray(num_steps)
  own = independent_init is not None
  maxima = tuple(int(jnp.max(num_steps[np.asarray(g.client_ids)]))
                 for g in groups)
  trains = tuple(
      stages.client_span_stage(make_local_update(dataclasses.replace(
          training, task=g.task, max_steps=max(n, 1))), mp)
      for g, mp, n in zip(groups, mappers, maxima))

  def cohort(g, data: ClientData) -> Cohort:
    ids = jnp.asarray(g.client_ids)
    # Client ids are kept, so each client's key is that of its id.
    return Cohort(x=data.x[ids], y=data.y[ids],
                  num_examples=data.num_examples[ids],
                  num_steps=num_steps[ids], client_ids=ids)

  def begin(starts, data: ClientData) -> ClientProgress:
    validate.client_stack(data.x, data.y, data.num_examples)
    if data.num_clients != m:
      raise ValueError(f"data must hold the {m} clients of the groups, got "
                       f"{data.num_clients} (x shape "
                       f"{validate.shape_str(data.x.shape)}).")
    out = []
    for g, (params, stats) in zip(groups, starts):
      ids = jnp.asarray(g.client_ids)
      if own:
        params, stats = independent_starts(g.task, independent_init, ids)
      else:  # One copy per client: each trains its own from here.
        params, stats = jax.tree_util.tree_map(
            lambda a: jnp.broadcast_to(a, (ids.shape[0], *a.shape)),
            (params, stats))
      out.append((params, stats, jax.vmap(optimizer.init)(params)))
    return ClientProgress(vars=tuple(out))

  def advance(progress: ClientProgress, data: ClientData, key: jax.Array,
              first, stop) -> ClientProgress:
    out = []
    for g, train, (params, stats, opt) in zip(groups, trains, progress.vars):
      c = cohort(g, data)
      r = train(params, stats, opt, (), c, keys.client_keys(key, c.client_ids),
                (), first, stop)
      out.append((r.params, r.batch_stats, r.opt_state))
    return ClientProgress(vars=tuple(out))

  def finish(progress: ClientProgress, data: ClientData) -> Teachers:
    return Teachers(vars=tuple((p, s) for p, s, _ in progress.vars),
                    num_examples=data.num_examples)

  return SpannedClientStage(begin=begin, advance=advance, finish=finish,
                            total_steps=max(maxima, default=0))


def average(teachers: Teachers) -> tuple[PyTree, PyTree]:
  """One-shot FedAvg: the example-weighted mean of one group's models.

  Raises:
    ValueError: with more than one architecture (parameter averaging is
      undefined across architectures).
  """
  if len(teachers.vars) != 1:
    raise ValueError(
        "Parameter averaging needs homogeneous clients; got "
        f"{len(teachers.vars)} architecture groups.")
  params, stats = teachers.vars[0]
  return (stages.weighted_mean(params, teachers.num_examples),
          stages.weighted_mean(stats, teachers.num_examples))


def os_fedavg(stage: Callable[..., Teachers]) -> ServerDistillation:
  """One-shot FedAvg in the server-side shape: the average, no epochs.

  Args:
    stage: the client stage (:func:`client_stage`).
  """

  def init(key, setup, teachers, params, batch_stats):
    del key, setup, params, batch_stats
    p, s = average(teachers)
    return {"params": p, "batch_stats": s}

  def epoch(state, teachers):
    del teachers
    return state, {}

  return ServerDistillation(
      client_stage=stage, setup=no_setup, init=init, epoch=epoch,
      model=lambda state: (state["params"], state["batch_stats"]))


def architecture_groups(task: Classifier,
                        client_archs: Sequence[str],
                        tasks: Mapping[str, Classifier],
                        num_clients: int,
                        input_fn: ensemble.InputFn
                        ) -> tuple[tuple[str, ...], tuple[ensemble.TeacherGroup, ...]]:
  """One teacher group per client architecture, in order of first client.

  Args:
    task: the server (student) model; the one group of homogeneous clients.
    client_archs: ``()`` for homogeneous clients; else client ``k`` uses
      architecture ``client_archs[k % len(client_archs)]``.
    tasks: the model of each architecture name in ``client_archs``.
    num_clients: ``m``.
    input_fn: maps images in ``[0, 1]`` to every model's input.

  Returns:
    ``(names, groups)``; each client keeps its id (and so its key).

  Raises:
    ValueError: an architecture does not accept ``task.input_shape``.
  """
  if not client_archs:
    return ("",), (ensemble.TeacherGroup(task, input_fn,
                                         tuple(range(num_clients))),)
  arch = [client_archs[k % len(client_archs)] for k in range(num_clients)]
  names = tuple(dict.fromkeys(arch))
  groups = []
  for name in names:
    g_task = tasks[name]
    try:
      jax.eval_shape(g_task.init, jax.random.PRNGKey(0))
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(
          f"Client model {name!r} does not accept the input shape "
          f"{tuple(task.input_shape)}; every client architecture is fed the "
          "same images, so choose an input shape all client models "
          "accept.") from e
    groups.append(ensemble.TeacherGroup(
        g_task, input_fn, tuple(k for k, a in enumerate(arch) if a == name)))
  return names, tuple(groups)


def client_report(groups: Sequence[ensemble.TeacherGroup],
                  client_evaluators: Sequence[Callable[..., dict[str, Any]]],
                  evaluate: Callable[..., dict[str, float]] | None
                  ) -> Callable[[int, Teachers], dict[str, Any]]:
  """The driver's ``on_clients``: every client's test accuracy and, for
  homogeneous clients, one-shot FedAvg's.

  Args:
    groups: the architecture groups.
    client_evaluators: per group, a mapped evaluator of its stacked models
      (:func:`fedjax_dd.core.evaluate.make_client_evaluator`).
    evaluate: the global model's evaluator, or ``None`` (no averaging).
  """
  m = sum(len(g.client_ids) for g in groups)

  def report(r: int, teachers: Teachers) -> dict[str, Any]:
    del r
    acc = np.zeros(m)
    for g, ev, tv in zip(groups, client_evaluators, teachers.vars):
      acc[list(g.client_ids)] = ev(*tv)["accuracy"]
    averaged = None
    if evaluate is not None and len(groups) == 1:
      averaged = evaluate(*average(teachers))["accuracy"]
    return {"client_test_accuracy": [float(a) for a in acc],
            "os_fedavg_test_accuracy": averaged}

  return report


def server_diagnostics(report: Mapping[str, Any], class_counts: np.ndarray
                       ) -> dict[str, Any]:
  """A finished one-shot run's server diagnostics, as JSON data (its
  figures: :func:`fedjax_dd.utils.figures.plot_one_shot`).

  Args:
    report: ``algorithm.report(state, setup)`` (``{}`` for a server without
      one).
    class_counts: ``[m, c]`` examples of class ``j`` held by client ``k``.

  Returns:
    The report's ``U``, ``U_r``, ``U_c``, ``ensemble_weights`` and
    ``transport_off_*`` fields it has, and ``U_r_vs_class_share``
    (:func:`fedjax_dd.algorithms.stratify.agreement_with_class_shares`).
  """
  from fedjax_dd.algorithms import stratify  # pylint: disable=g-import-not-at-top
  out: dict[str, Any] = {}
  # FedHydra's U; Co-Boosting's ensemble weights; OT fusion's transports.
  for k in ("U", "U_r", "U_c", "ensemble_weights",
            "transport_off_permutation", "transport_off_identity"):
    if k in report:
      out[k] = np.asarray(report[k]).tolist()
  if "U_r" in report:
    out["U_r_vs_class_share"] = stratify.agreement_with_class_shares(
        np.asarray(report["U_r"]), class_counts)
  return out


def run_fields(result, *, names: Sequence[str],
               groups: Sequence[ensemble.TeacherGroup], num_examples,
               class_counts: np.ndarray, report: Mapping[str, Any],
               probe: tuple[Any, Any] | None = None) -> dict[str, Any]:
  """A one-shot run's own summary fields (with :func:`server_diagnostics`).

  Args:
    result: :class:`fedjax_dd.core.server.ServerResult` of the run.
    names: each group's architecture name.
    groups: the architecture groups.
    num_examples: ``[m]`` examples per client.
    class_counts: ``[m, c]`` examples of class ``j`` held by client ``k``.
    report: ``algorithm.report(state, setup)`` (``{}`` without one).
    probe: real labelled images ``(x01 [P, H, W, Ch] in [0, 1], labels [P])``
      for ``sa_target_naming`` when the report has ``U_r`` and ``U_c``
      (:func:`fedjax_dd.algorithms.stratify.target_naming_rates`).

  Returns:
    Each client's architecture and test accuracy, one-shot FedAvg's
    accuracy, the per-round records, client sizes and class counts, the
    ledger, stage seconds and :func:`server_diagnostics`'s fields.
  """
  arch_of = {k: n for n, g in zip(names, groups) for k in g.client_ids}
  last = result.per_round[-1]
  extra = {}
  if probe is not None and "U_r" in report and "U_c" in report:
    from fedjax_dd.algorithms import stratify  # pylint: disable=g-import-not-at-top
    extra["sa_target_naming"] = stratify.target_naming_rates(
        groups, result.teachers.vars, report["U_r"], report["U_c"], *probe)
  return {
      "client_models": [arch_of[k] for k in range(len(arch_of))],
      "client_test_accuracy": last["client_test_accuracy"],
      "os_fedavg_test_accuracy": last["os_fedavg_test_accuracy"],
      "per_round": result.per_round,
      "client_sizes": np.asarray(num_examples).tolist(),
      "client_class_counts": np.asarray(class_counts).tolist(),
      "ledger": result.ledger.to_dict(),
      "stage_seconds": {"local_training_seconds": result.seconds["client"],
                        "setup_seconds": result.seconds["setup"],
                        "distillation_seconds": result.seconds["server"]},
      **server_diagnostics(report, class_counts),
      **extra,
  }
