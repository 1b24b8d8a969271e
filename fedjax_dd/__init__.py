"""fedjax-dd: federated learning with dataset and data-free distillation in JAX.

Importing the package has no side effects. On a CPU machine, call
:func:`configure_cpu` before the first JAX computation to expose one XLA host
device per core, which the engine's default CPU backend shards clients over
(the ``fedjax-dd`` entry point and the benchmarks do this themselves)::

  import fedjax_dd
  fedjax_dd.configure_cpu()   # first, before any JAX computation
  import jax

The public API, as one flat namespace (loaded on first use, so importing the
package stays cheap)::

  algorithms   fedavg, fedprox, fednova, scaffold, moon, feddyn,
               centralized, os_fedavg,
               fedseq, ifca, fedhydra, dense, feddf, one_shot (client stage
               and one-shot averaging), fedd3 and hfldd (their stages),
               fedd3_stages and hfldd_stages (chained as a run, cached)
  clustered    disue, fedftg, clustered_distillation, affinity_grouping,
               make_iga, IGAHyperParams, update_similarity,
               affinity_propagation, cfl, pacfl (cluster_clients: its
               signatures and clusters); ClusterServing (the model IFCA,
               CFL, CFL-GP and PACFL report: largest cluster's, average,
               or IGA's)
  shapes       FederatedAlgorithm, ServerDistillation, ServerState,
               ExperimentState, Cohort, Teachers, CommSpec,
               SpannedClientStage, ClientProgress
  loops        run_loop (under fit, the one rounds driver),
               run_server_rounds and their options; CheckpointStore,
               StageCache, Workdir, run_summary (a finished run's
               summary.json fields)
  notebook     prepare (dataset + model -> task), local_steps, fit (R rounds
               with a workdir: checkpoints, metrics, resume), fit_runs
               (several seeds as one program on a run axis), plot_history,
               plot_partition; personal_evaluation (each client scored with
               the model it deploys, on its own test data)
  clients      ClientMapper, client_stage, LocalTraining (what every
               algorithm factory takes: task, optimizer, batch size, step
               bound, ...), make_local_update, Classifier
  distillation distill_kip (batched KIP), KipOptions, gmm_coreset_clients,
               collect_label_knowledge, make_dfkd, DFKDHyperParams,
               TeacherGroup, upload_privacy
  data         load_dataset, load_unlabeled, resplit, iid, dirichlet,
               pathological, disjoint_classes, quantity_skew, class_counts,
               personal_test_split, stratified_split, stack_clients,
               ClientData
  ledger       Ledger, gce, num_params, model_bits
  keys         keys (the module of named key derivations)

See ``docs/architecture.md`` for how they fit together.
"""

import importlib
from typing import Any

from fedjax_dd import _xla_setup

__version__ = "0.1.0"

# name -> (module, attribute); attribute None exports the module itself.
_API: dict[str, tuple[str, str | None]] = {
    # Algorithms (FederatedAlgorithm factories).
    "fedavg": ("fedjax_dd.algorithms.fedavg", "fedavg"),
    "fedprox": ("fedjax_dd.algorithms.fedprox", "fedprox"),
    "fednova": ("fedjax_dd.algorithms.fednova", "fednova"),
    "scaffold": ("fedjax_dd.algorithms.scaffold", "scaffold"),
    "moon": ("fedjax_dd.algorithms.moon", "moon"),
    "feddyn": ("fedjax_dd.algorithms.feddyn", "feddyn"),
    "dp_fedavg": ("fedjax_dd.algorithms.dp_fedavg", "dp_fedavg"),
    "centralized": ("fedjax_dd.algorithms.centralized", "centralized"),
    "os_fedavg": ("fedjax_dd.algorithms.one_shot", "os_fedavg"),
    "fedseq": ("fedjax_dd.algorithms.fedseq", "fedseq"),
    "ifca": ("fedjax_dd.algorithms.ifca", "ifca"),
    "ClusterServing": ("fedjax_dd.algorithms.cluster_models",
                       "ClusterServing"),
    # Clustered FL with data-free inter-group distillation.
    "disue": ("fedjax_dd.algorithms.disue", "disue"),
    "fedftg": ("fedjax_dd.algorithms.fedftg", "fedftg"),
    "clustered_distillation": ("fedjax_dd.algorithms.clustered",
                               "clustered_distillation"),
    "affinity_grouping": ("fedjax_dd.algorithms.disue", "affinity_grouping"),
    "make_iga": ("fedjax_dd.distill.iga", "make_iga"),
    "IGAHyperParams": ("fedjax_dd.distill.iga", "IGAHyperParams"),
    "update_similarity": ("fedjax_dd.cluster.similarity",
                          "update_similarity"),
    "affinity_propagation": ("fedjax_dd.cluster.affinity",
                             "affinity_propagation"),
    "cfl": ("fedjax_dd.algorithms.cfl", "cfl"),
    "pacfl": ("fedjax_dd.algorithms.pacfl", "pacfl"),
    "cluster_clients": ("fedjax_dd.algorithms.pacfl", "cluster_clients"),
    # Server-side distillation (ServerDistillation factories).
    "fedhydra": ("fedjax_dd.algorithms.fedhydra", "fedhydra"),
    "dense": ("fedjax_dd.algorithms.dense", "dense"),
    "feddf": ("fedjax_dd.algorithms.feddf", "feddf"),
    "one_shot": ("fedjax_dd.algorithms.one_shot", None),
    # Stage modules of FedD3 and HFLDD, and the stages chained as a run
    # does (with the stage cache and the summary fields).
    "fedd3": ("fedjax_dd.algorithms.fedd3", None),
    "hfldd": ("fedjax_dd.algorithms.hfldd", None),
    "fedd3_stages": ("fedjax_dd.algorithms.fedd3_stages", None),
    "hfldd_stages": ("fedjax_dd.algorithms.hfldd_stages", None),
    # Shapes and state.
    "FederatedAlgorithm": ("fedjax_dd.core.algorithm", "FederatedAlgorithm"),
    "ServerDistillation": ("fedjax_dd.core.algorithm", "ServerDistillation"),
    "ServerState": ("fedjax_dd.core.algorithm", "ServerState"),
    "ExperimentState": ("fedjax_dd.core.algorithm", "ExperimentState"),
    "Cohort": ("fedjax_dd.core.algorithm", "Cohort"),
    "Teachers": ("fedjax_dd.core.algorithm", "Teachers"),
    "CommSpec": ("fedjax_dd.core.algorithm", "CommSpec"),
    "SpannedClientStage": ("fedjax_dd.core.algorithm", "SpannedClientStage"),
    "ClientProgress": ("fedjax_dd.core.algorithm", "ClientProgress"),
    # Loops, checkpoints, run directory.
    "run_loop": ("fedjax_dd.core.loop", "run_loop"),
    "LoopOptions": ("fedjax_dd.core.loop", "LoopOptions"),
    "RoundsOptions": ("fedjax_dd.core.rounds", "RoundsOptions"),
    "FixedCohort": ("fedjax_dd.core.cohorts", "FixedCohort"),
    "BernoulliCohort": ("fedjax_dd.core.cohorts", "BernoulliCohort"),
    "run_server_rounds": ("fedjax_dd.core.server", "run_server_rounds"),
    "ServerOptions": ("fedjax_dd.core.server", "ServerOptions"),
    "CheckpointStore": ("fedjax_dd.core.checkpoint", "CheckpointStore"),
    "StageCache": ("fedjax_dd.core.stage_cache", "StageCache"),
    "run_summary": ("fedjax_dd.core.summary", "run_summary"),
    "Workdir": ("fedjax_dd.core.workdir", "Workdir"),
    # The client axis and local training.
    "ClientMapper": ("fedjax_dd.core.clients", "ClientMapper"),
    "client_stage": ("fedjax_dd.core.clients", "client_stage"),
    "make_local_update": ("fedjax_dd.core.local", "make_local_update"),
    "LocalTraining": ("fedjax_dd.core.local", "LocalTraining"),
    "Classifier": ("fedjax_dd.core.task", "Classifier"),
    "make_evaluator": ("fedjax_dd.core.evaluate", "make_evaluator"),
    "make_personal_evaluator": ("fedjax_dd.core.personal",
                                "make_personal_evaluator"),
    "personal_evaluation": ("fedjax_dd.core.personal",
                            "personal_evaluation"),
    # A notebook's path: a task from a dataset, R rounds with a workdir.
    "prepare": ("fedjax_dd.core.prepare", "prepare"),
    "Prepared": ("fedjax_dd.core.prepare", "Prepared"),
    "fit": ("fedjax_dd.core.fit", "fit"),
    # R seeds (or traced hyperparameters) as one program on a run axis.
    "fit_runs": ("fedjax_dd.core.run_axis", "fit_runs"),
    "local_steps": ("fedjax_dd.core.fit", "local_steps"),
    "plot_history": ("fedjax_dd.utils.figures", "plot_history"),
    "plot_partition": ("fedjax_dd.utils.figures", "plot_partition"),
    # Batched distillation.
    "distill_kip": ("fedjax_dd.distill.kip", "distill_clients"),
    "KipOptions": ("fedjax_dd.distill.kip", "KipOptions"),
    "gmm_coreset_clients": ("fedjax_dd.distill.gmm", "gmm_coreset_clients"),
    "collect_label_knowledge": ("fedjax_dd.distill.soft_labels",
                                "collect_label_knowledge"),
    "make_dfkd": ("fedjax_dd.distill.dfkd", "make_dfkd"),
    "DFKDHyperParams": ("fedjax_dd.distill.dfkd", "DFKDHyperParams"),
    "TeacherGroup": ("fedjax_dd.distill.ensemble", "TeacherGroup"),
    "upload_privacy": ("fedjax_dd.distill.privacy", "upload_privacy"),
    # Data and partitions.
    "load_dataset": ("fedjax_dd.data.sources", "load_dataset"),
    "load_unlabeled": ("fedjax_dd.data.sources", "load_unlabeled"),
    "resplit": ("fedjax_dd.data.sources", "resplit"),
    "iid": ("fedjax_dd.data.partition", "iid"),
    "dirichlet": ("fedjax_dd.data.partition", "dirichlet"),
    "pathological": ("fedjax_dd.data.partition", "pathological"),
    "disjoint_classes": ("fedjax_dd.data.partition", "disjoint_classes"),
    "quantity_skew": ("fedjax_dd.data.partition", "quantity_skew"),
    "class_counts": ("fedjax_dd.data.partition", "class_counts"),
    "personal_test_split": ("fedjax_dd.data.partition",
                            "personal_test_split"),
    "stratified_split": ("fedjax_dd.data.partition", "stratified_split"),
    "stack_clients": ("fedjax_dd.data.stacked", "stack_clients"),
    "ClientData": ("fedjax_dd.data.stacked", "ClientData"),
    # The ledger.
    "Ledger": ("fedjax_dd.core.ledger", "Ledger"),
    "gce": ("fedjax_dd.core.ledger", "gce"),
    "num_params": ("fedjax_dd.core.ledger", "num_params"),
    "model_bits": ("fedjax_dd.core.ledger", "model_bits"),
    # Named key derivations.
    "keys": ("fedjax_dd.core.keys", None),
}

__all__ = sorted(_API) + ["configure_cpu", "__version__"]


def __getattr__(name: str) -> Any:
  """Loads a public name on first use (PEP 562)."""
  if name not in _API:
    raise AttributeError(f"module 'fedjax_dd' has no attribute {name!r}")
  module, attr = _API[name]
  value = importlib.import_module(module)
  if attr is not None:
    value = getattr(value, attr)
  globals()[name] = value  # later lookups skip __getattr__
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_API))


def configure_cpu() -> bool:
  """Exposes one XLA host device per CPU core (at most 8) to JAX.

  Appends ``--xla_force_host_platform_device_count`` to ``XLA_FLAGS``. It
  takes effect only before JAX initialises a backend (the first computation
  or ``jax.devices()``), so call it first. It leaves ``XLA_FLAGS`` alone when
  the count is already set, when a backend is already initialised, or with
  ``FEDJAX_DD_NO_XLA_FLAGS=1``; ``FEDJAX_DD_HOST_DEVICES=N`` overrides the
  count.

  Returns:
    True if it changed ``XLA_FLAGS``.
  """
  return _xla_setup.configure()
