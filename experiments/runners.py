"""Runners: build an algorithm from a config and drive the shared rounds loop.

Each FedAvg-family method is declared here once
(:func:`fedjax_dd.experiments.registry.declare`) with a small builder
``(config, training) -> FederatedAlgorithm`` that calls the library factory
with ``training``, the run's one :class:`~fedjax_dd.core.local.
LocalTraining` (:func:`fedjax_dd.experiments.common.local_training`), and
the method's own settings from the config; :func:`run_federated` runs any
rounds method. The ``run_*`` modules of the other runners use the glue
here (:func:`fit_and_summarize`, :func:`run_server`, :func:`summarize`).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_dd.algorithms.centralized import centralized
from fedjax_dd.algorithms.cfl import CFLHyperParams, cfl
from fedjax_dd.algorithms.cfl_gp import CFLGPHyperParams, cfl_gp
from fedjax_dd.algorithms.cluster_models import ClusterServing
from fedjax_dd.algorithms.disue import (DisUEHyperParams, affinity_grouping,
                                        disue)
from fedjax_dd.algorithms.dp_fedavg import DPFedAvgHyperParams, dp_fedavg
from fedjax_dd.algorithms.fedftg import feddf_hparams, fedftg
from fedjax_dd.algorithms.dynafed import DynaFedHyperParams, dynafed
from fedjax_dd.algorithms.ifca import IFCAHyperParams, ifca
from fedjax_dd.algorithms.pacfl import (PACFLHyperParams, cluster_clients,
                                         pacfl)
from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.algorithms.feddyn import FedDynHyperParams, feddyn
from fedjax_dd.algorithms.fednova import fednova
from fedjax_dd.algorithms.moon import MOONHyperParams, moon
from fedjax_dd.algorithms.fedprox import fedprox
from fedjax_dd.algorithms.scaffold import scaffold
from fedjax_dd.core import fit as fit_lib
from fedjax_dd.core import keys
from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core import server as server_lib
from fedjax_dd.core import summary as summary_lib
from fedjax_dd.core.algorithm import FederatedAlgorithm
from fedjax_dd.core.task import Classifier
from fedjax_dd.core.workdir import Workdir
from fedjax_dd.distill.iga import make_iga
from fedjax_dd.experiments import common
from fedjax_dd.experiments import registry
from fedjax_dd.experiments import sections
from fedjax_dd.models.cgenerator import CGeneratorA
from fedjax_dd.models.layers import LayerSet
from fedjax_dd import versions

def _iga(config, task: Classifier, *, feddf: bool = False):
  """IGA from ``config.iga`` (None when disabled), the cohort's size of
  teachers."""
  i = config.iga
  if not i.enabled:
    return None
  hparams = sections.iga(i)
  if feddf:
    hparams = feddf_hparams(hparams)
  generator = CGeneratorA(out_shape=tuple(task.input_shape), nz=i.nz,
                          ngf=i.ngf, num_classes=task.num_classes,
                          layers=LayerSet.from_policy(
                              common.conv_impl(config, CGeneratorA.__name__),
                              common.compute_dtype(config),
                              model=CGeneratorA.__name__))
  n = config.data.num_clients
  return make_iga(task, generator,
                  num_teachers_max=common.cohort(config, n).size_bound(n),
                  hparams=hparams,
                  mapper=common.mapper(config))


def _generator_key(config):
  return keys.stage_key(keys.model_root(config.seed), keys.Stage.GENERATOR)


def _disue(config, training, hparams):
  d = hparams
  return disue(training, iga=_iga(config, training.task),
               generator_key=_generator_key(config),
               evaluate_before_iga=bool(config.iga.evaluate_before),
               grouping=affinity_grouping(
                   similarity=d.similarity, protocol=d.similarity_protocol,
                   damping=d.damping, preference=d.preference))


def _needs_iga(config) -> None:
  if not config.iga.enabled:
    raise ValueError(f"{config.method} is FedAvg plus IGA: iga.enabled must "
                     "stay True (use method=fedavg for FedAvg).")


def _fedftg(config, training, *, feddf=False):
  return fedftg(training, iga=_iga(config, training.task, feddf=feddf),
                generator_key=_generator_key(config),
                evaluate_before_iga=bool(config.iga.evaluate_before))


def _ifca(config, training, hparams):
  return ifca(training, num_clusters=hparams.num_clusters,
              init_key=keys.stage_key(keys.model_root(config.seed),
                                      keys.Stage.CLUSTER_MODELS),
              serving=_serving(config, hparams, training.task))


def _serving(config, hparams, task) -> ClusterServing:
  """The reported model of a clustered baseline: ``hparams.global_model``,
  or IGA on its cluster models (``+iga`` presets)."""
  return ClusterServing(global_model=hparams.global_model,
                        iga=_iga(config, task),
                        generator_key=_generator_key(config))


def _cfl(config, training, hparams):
  f = hparams
  return cfl(training, eps1=f.eps1, eps2=f.eps2, warmup=f.warmup,
             max_clusters=f.max_clusters,
             serving=_serving(config, f, training.task))


def _cfl_gp(config, training, hparams):
  f = hparams
  return cfl_gp(training, num_clusters=f.num_clusters,
                compression=f.compression, period=f.period,
                stop_round=f.stop_round, cluster_seed=f.cluster_seed,
                subset_key=keys.stage_key(
                    keys.model_root(config.seed),
                    keys.Stage.GRADIENT_SUBSET),
                serving=_serving(config, f, training.task))


def _pacfl(config, training, data, hparams):
  f = hparams
  clusters = cluster_clients(
      data, num_classes=training.task.num_classes, rank=f.rank,
      threshold=f.threshold if f.threshold > 0 else None,
      num_clusters=f.num_clusters if f.threshold <= 0 else None,
      linkage=f.linkage, proximity=f.proximity, per_class=f.per_class,
      mapper=common.mapper(config))
  return pacfl(training, clusters=clusters,
               serving=_serving(config, f, training.task))


def _dp_fedavg(config, training, hparams):
  d = hparams
  return dp_fedavg(training, clip=d.clip, noise_multiplier=d.noise_multiplier,
                   expected_clients=common.expected_clients(
                       config, config.data.num_clients))


# The FedAvg-family methods, each declared once (experiments/registry.py):
# the shared rounds loop drives each (run_federated).
for _method in (
    registry.Method("disue", rounds=_disue, hparams=DisUEHyperParams),
    registry.Method("fedftg", rounds=_fedftg, check=_needs_iga),
    registry.Method("feddf_datafree", rounds=lambda c, training: _fedftg(
        c, training, feddf=True), check=_needs_iga),
    registry.Method("ifca", rounds=_ifca, hparams=IFCAHyperParams),
    registry.Method("cfl", rounds=_cfl, hparams=CFLHyperParams),
    registry.Method("cfl_gp", rounds=_cfl_gp, hparams=CFLGPHyperParams),
    registry.Method("centralized",
                    rounds=lambda c, training: centralized(training)),
    registry.Method("fedavg", rounds=lambda c, training: fedavg(training)),
    # (os_fedavg's rounds form is declared with its server form in
    # stage_builders.)
    registry.Method("fedprox", rounds=lambda c, training: fedprox(
        training, mu=c.client.mu)),
    registry.Method("fednova", rounds=lambda c, training: fednova(
        training, momentum=c.client.momentum)),
    registry.Method("scaffold", rounds=lambda c, training: scaffold(
        training, learning_rate=c.client.lr,
        server_learning_rate=c.server.lr)),
    registry.Method("moon", hparams=MOONHyperParams,
                    rounds=lambda c, training, hparams: moon(
                        training, mu=hparams.mu,
                        temperature=hparams.temperature)),
    registry.Method("feddyn", hparams=FedDynHyperParams,
                    rounds=lambda c, training, hparams: feddyn(
                        training, alpha=hparams.alpha)),
    registry.Method("dynafed", hparams=DynaFedHyperParams,
                    rounds=lambda c, training, hparams: dynafed(
                        training, hparams=hparams)),
    registry.Method("dp_fedavg", rounds=_dp_fedavg, group="dp",
                    hparams=DPFedAvgHyperParams,
                    summary_fields=common.dp_fedavg_fields),
    # PACFL's server sees something of every client's data before round 1
    # (its subspaces).
    registry.Method("pacfl", rounds=_pacfl, hparams=PACFLHyperParams,
                    needs=("client_data",)),
):
  registry.declare(_method)
del _method


def _client_partition(config, prepared):
  if config.method == "centralized":
    return [np.arange(prepared.dataset.x_train.shape[0])]
  return common.partition(config, prepared.dataset.y_train)


def remaining_budget(config: ml_collections.ConfigDict, start: float) -> float:
  """Seconds left of ``config.run.max_wall_seconds`` (0: no budget).

  The budget counts from the run's start, so stages before the rounds (HFLDD's
  clustering and KIP, a one-shot upload) use it too. When they used it up, the
  loop still runs one round (a tiny positive budget).
  """
  budget = float(config.run.max_wall_seconds)
  if budget <= 0:
    return 0.0
  return max(budget - (time.time() - start), 1e-6)


def loop_settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The rounds loop's settings of ``config`` (``run`` and the server's
  seed option), as :func:`fedjax_dd.fit` and :func:`fedjax_dd.fit_runs`
  both take them."""
  r = config.run
  return dict(eval_every=r.eval_every, checkpoint_every=r.checkpoint_every,
              keep_checkpoints=r.keep_checkpoints, progress=r.progress,
              class_accuracy=r.class_accuracy,
              stop_on_nonfinite=r.stop_on_nonfinite,
              initial_model_as_seed=config.server.initial_model_as_seed)


def fit_and_summarize(
    config: ml_collections.ConfigDict, workdir: str, *,
    prepared: common.Prepared, algorithm: FederatedAlgorithm,
    data, num_steps, ledger=None, start_time: float | None = None,
    extra_summary: dict[str, Any] | None = None,
    initial_model: tuple[Any, Any] | None = None,
    run_key: jax.Array | None = None,
    finalize: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    personal: Callable[..., dict[str, Any]] | None = None
) -> dict[str, Any]:
  """Drives ``algorithm`` through the shared rounds loop and writes the summary.

  Resumes from ``workdir/checkpoints`` when possible. ``ledger`` holds traffic
  recorded before the rounds (e.g. a one-shot upload); it is checkpointed with
  the state. ``initial_model`` (``(params, batch_stats)``) and ``run_key``
  default to a split of the config's model key. With
  ``config.server.gce_gammas`` the summary adds the final ledger's GCE.
  ``finalize(summary) -> summary`` adds what depends on the finished run
  (e.g. HFLDD's Eq. 3 traffic) before the one write of ``summary.json``.
  ``personal``: the rounds' personalized evaluation
  (:func:`fedjax_dd.experiments.common.personal_evaluation`).
  """
  start = time.time() if start_time is None else start_time
  wall = loop_lib.WallClock(start=start)
  result = fit_lib.fit(
      algorithm, prepared, data, num_steps, rounds=config.rounds,
      clients_per_round=common.cohort(config, data.num_clients),
      workdir=workdir, seed=config.seed,
      max_seconds=remaining_budget(config, start),
      initial_model=initial_model, ledger=ledger, run_key=run_key,
      tensorboard=config.run.tensorboard, wall=wall, personal=personal,
      **loop_settings(config),
      # What the entry point recorded in config.json: fit checks the same.
      definition=common.fingerprint(config))
  state, ledger = result.state, result.ledger

  summary = summarize(
      config, rows=result.rows, ledger=ledger, params=state.server.params,
      rounds=int(state.round), wall=wall, extra=extra_summary)
  if finalize is not None:
    summary = finalize(summary)
  Workdir(workdir).write_summary(summary)
  return summary


def summarize(config: ml_collections.ConfigDict, *, rows, ledger, params,
              rounds: int, wall: loop_lib.WallClock,
              extra: dict[str, Any] | None = None, **fields) -> dict[str, Any]:
  """:func:`fedjax_dd.core.summary.run_summary` with the config's fields.

  Args:
    config: the run's config.
    rows: the metrics rows, each with ``round`` (for one-shot FedD3 a
      "round" of the config is a server epoch).
    ledger: the final ledger.
    params: the final global parameters.
    rounds: rounds (or epochs) completed.
    wall: the run's wall clock.
    extra: method-specific fields, added before ``config``.
    **fields: other arguments of ``run_summary``.
  """
  fields.setdefault("num_clients", int(config.data.num_clients))
  return summary_lib.run_summary(
      method=config.method, dataset=config.data.dataset,
      model=config.model.name, rows=rows, ledger=ledger, params=params,
      rounds=rounds, planned_rounds=int(config.rounds), wall=wall,
      paper_departures=config.paper_departures,
      gce_gammas=tuple(config.server.gce_gammas), extra=extra,
      config=config.to_dict(), code=versions.source_commit(), **fields)


def run_server(config: ml_collections.ConfigDict, workdir: str, algorithm,
               data, *, start: float, run_key: jax.Array, evaluate,
               initial_models, global_model,
               group_sizes, num_rounds: int, num_epochs: int,
               tensorboard: bool = False, on_clients=None, **options):
  """Drives a server-side method through
  :func:`fedjax_dd.core.server.run_server_rounds` with the config's
  evaluation, checkpoint, progress, non-finite and time-budget settings
  (``options``: other :class:`~fedjax_dd.core.server.ServerOptions` fields).

  Returns:
    ``(result, rows, wall, work)``: the driver's result, the metrics rows,
    the run's wall clock and its :class:`~fedjax_dd.core.workdir.Workdir`.
  """
  work = Workdir(workdir, tensorboard=tensorboard)
  wall = loop_lib.WallClock(start=start)
  result = server_lib.run_server_rounds(
      algorithm, data, run_key=run_key, initial_models=initial_models,
      global_model=global_model, group_sizes=group_sizes,
      options=server_lib.ServerOptions(
          num_rounds=num_rounds, num_epochs=num_epochs,
          eval_every=config.run.eval_every,
          checkpoint_every=config.run.checkpoint_every,
          progress=config.run.progress,
          stop_on_nonfinite=config.run.stop_on_nonfinite,
          max_seconds=remaining_budget(config, start), **options),
      directory=work.directory, evaluate=evaluate, writer=work.writer,
      wall=wall, on_clients=on_clients)
  return result, work.writer.rows(), wall, work


def run_federated(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs any FedAvg-family method (or centralized) described by ``config``."""
  start = time.time()
  prepared = common.load_and_prepare(config)
  parts, personal_test = common.personal_split(
      config, prepared, _client_partition(config, prepared))
  data = common.client_data(prepared.dataset, parts)
  num_steps = common.local_steps(config, data.num_examples)
  training = common.local_training(config, prepared.task,
                                   int(jnp.max(num_steps)))
  algorithm = registry.build_rounds(config, training, data)
  fields = registry.get(config.method).summary_fields
  audit = None
  if "audit" in config and config.audit.enabled:
    # The audit's glue (experiments/auditing.py); a holdout the test split
    # cannot give is refused now, before the rounds.
    from fedjax_dd.experiments import auditing as audit  # pylint: disable=g-import-not-at-top
    audit.attacker_data(config, prepared)
    if config.audit.lira_shadows:  # and a shadow pool outside the holdout
      audit.lira_shadows(config, prepared, data)

  def finalize(summary):
    if fields is not None:
      summary = {**summary,
                 **fields(config, data.num_clients, summary["rounds"])}
    if audit is not None:  # the final global model, from its checkpoint
      summary["audit"] = audit.audit_run(config, workdir, prepared=prepared,
                                         data=data, algorithm=algorithm)
    return summary

  return fit_and_summarize(
      config, workdir, prepared=prepared, algorithm=algorithm, data=data,
      num_steps=num_steps, start_time=start, finalize=finalize,
      personal=common.personal_evaluation(config, algorithm, prepared.task,
                                          data, personal_test))
