"""Glue of the one-shot data-free methods: FedHydra, DENSE, FedDF, OS-FedAvg.

``run(config, workdir) -> summary`` (``runner="fedhydra"``). It builds, from
the config, the shared one-shot client stage
(:func:`fedjax_dd.algorithms.one_shot.client_stage`) and the server method
``config.method`` (:data:`BUILDERS`), and hands them to the library's driver
:func:`fedjax_dd.core.server.run_server_rounds`, which owns the rounds, the
server epochs, checkpoints and resume (``r<r>/clients``, ``r<r>/setup``,
``r<r>/server``), metrics, the ledger and the time budget. All methods share
the client stage, so under one config and seed they distil bit-identical
client models, and every summary reports one-shot FedAvg on those clients.

Heterogeneous clients: with ``config.model.client_models`` (comma-separated
registry names) client ``k`` uses ``client_models[k % len]`` and
``config.model.name`` is only the server (student) model. Parameter averaging is
undefined across architectures, so ``os_fedavg_test_accuracy`` is null and
``method=os_fedavg`` is refused, and so is ``rounds > 1``.

``config.server.teachers_from`` may name an earlier workdir with the same client
protocol (checked) whose round-1 client models are reused.

Outputs: ``metrics.jsonl`` (one row per evaluated epoch), ``summary.json``,
``u_r.png``, ``samples.png``, ``accuracy.png``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable

import jax
import ml_collections
import numpy as np
import optax

from fedjax_dd import models
from fedjax_dd.algorithms import one_shot
from fedjax_dd.algorithms import stratify as stratify_lib
from fedjax_dd.algorithms.dense import dense
from fedjax_dd.algorithms.feddf import feddf, public_set
from fedjax_dd.algorithms.fedhydra import fedhydra
from fedjax_dd.core import keys
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core import server as server_lib
from fedjax_dd.core.evaluate import make_client_evaluator, make_evaluator
from fedjax_dd.core.workdir import Workdir
from fedjax_dd.data import partition as partition_lib
from fedjax_dd.data import sources
from fedjax_dd.distill import dfkd
from fedjax_dd.distill import ensemble
from fedjax_dd.experiments import common
from fedjax_dd.experiments import runners
from fedjax_dd.utils import figures

# Every setting that determines the round-1 client models (teachers_from).
# A field added later is compared only when it is on (server.
# protocol_differences), so older runs' clients stay reusable.
_PROTOCOL_FIELDS = ("data.dataset", "data.num_classes", "data.resplit",
                    "model.name", "data.input_shape",
                    "data.num_clients", "seed", "data.seed",
                    "client.batch_size", "client.local_epochs",
                    "client.local_steps", "client.optimizer", "client.lr",
                    "client.momentum", "client.weight_decay",
                    "client.grad_clip", "data.partition")


def _protocol(config) -> str:
  # model.client_models only when heterogeneous, so that a homogeneous
  # protocol does not depend on how "all clients use model.name" is spelled.
  # data.resize_method only when images are resized, for the same reason.
  fields = _PROTOCOL_FIELDS + (("model.client_models",)
                               if common.client_models(config) else ()) + (
      ("data.resize_method",) if config.data.input_shape else ())
  return json.dumps({k: common.config_value(config, k) for k in fields},
                    sort_keys=True, default=str)


def _hparams(config) -> dfkd.DFKDHyperParams:
  d = config.dfkd
  return dfkd.DFKDHyperParams(
      batch_size=d.synthetic_batch_size,
      generator_steps=d.generator_steps,
      student_steps=d.student_steps,
      pool_size=d.pool_size or d.distill_epochs,
      lambda_bn=d.lambda_bn,
      lambda_adv=d.lambda_adv,
      beta=d.beta,
      temperature=d.temperature,
      reset_generator=d.reset_generator,
      learn_noise=d.learn_noise,
      keep_best=d.keep_best,
      adv_mask=d.adv_mask,
      augment_shift=d.augment_shift,
      augment_flip=d.augment_flip)


def _synthesis(config, task) -> dict[str, Any]:
  """The generator and optimisers shared by FedHydra and DENSE."""
  d = config.dfkd
  return dict(
      generator=models.Generator(out_shape=tuple(task.input_shape),
                                 nz=d.nz, ngf=d.ngf,
                                 conv_impl=common.conv_impl(config)),
      generator_optimizer=optax.adam(d.generator_lr, b1=d.generator_b1),
      student_optimizer=optax.sgd(d.student_lr,
                                  momentum=d.student_momentum or None),
      mapper=common.mapper(config))


AGGREGATIONS: dict[str, ensemble.CombineFn] = {
    "sa": stratify_lib.stratified_ensemble,
    "ae": ensemble.average_ensemble,
}


def _fedhydra(config, stage, groups, task, input_fn):
  syn = _synthesis(config, task)
  return fedhydra(stage, groups, syn.pop("generator"), task, input_fn,
                  _hparams(config), stratify_steps=config.dfkd.stratify_steps,
                  stratify_batch_size=config.dfkd.stratify_batch_size,
                  combine=AGGREGATIONS[config.dfkd.aggregation],
                  sa_average_scale=config.dfkd.sa_average_scale, **syn)


def _dense(config, stage, groups, task, input_fn):
  syn = _synthesis(config, task)
  return dense(stage, groups, syn.pop("generator"), task, input_fn,
               _hparams(config), **syn)


def _feddf(config, stage, groups, task, input_fn):
  public = sources.load_unlabeled(
      config.data.public_data, num=config.data.public_size,
      rng=keys.numpy_stream(config.data.seed, keys.Stream.PUBLIC_DATA))
  d = config.dfkd
  return feddf(stage, groups, task, input_fn,
               jax.device_put(public_set(public, task.input_shape)),
               optimizer=optax.adam(d.feddf_lr),
               batch_size=d.synthetic_batch_size,
               steps_per_epoch=d.feddf_steps,
               temperature=d.temperature, mapper=common.mapper(config))


def _os_fedavg(config, stage, groups, task, input_fn):
  del config, groups, task, input_fn
  return one_shot.os_fedavg(stage)


# method -> (builder, whether it has server epochs)
BUILDERS: dict[str, tuple[Callable[..., Any], bool]] = {
    "fedhydra": (_fedhydra, True),
    "dense": (_dense, True),
    "feddf": (_feddf, True),
    "os_fedavg": (_os_fedavg, False),
}


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs ``config.method`` in {fedhydra, dense, feddf, os_fedavg}."""
  if config.method not in BUILDERS:
    raise ValueError(f"Unknown method {config.method!r} for the fedhydra runner; "
                     f"expected one of {sorted(BUILDERS)}.")
  archs = common.client_models(config)
  if archs and config.method == "os_fedavg":
    raise ValueError(
        "One-shot FedAvg averages parameters, which is undefined across the "
        f"client architectures model.client_models="
        f"{config.model.client_models!r}; use "
        "fedhydra, dense or feddf, or homogeneous clients.")
  if archs and config.rounds > 1:
    raise ValueError(
        "Heterogeneous clients (model.client_models) need rounds=1: the "
        f"distilled {config.model.name!r} cannot seed clients of other "
        "architectures.")
  start = time.time()
  prepared = common.load_and_prepare(config)
  task, ds = prepared.task, prepared.dataset
  parts = common.partition(config, ds.y_train)
  data = common.client_data(ds, parts)
  num_steps = common.local_steps(config, data.num_examples)
  input_fn = ensemble.unit_normalizer(prepared.mean, prepared.std)
  tasks = {name: task if name == config.model.name else dataclasses.replace(
      task, module=models.get_model(name).build(
          task.num_classes, conv_impl=common.conv_impl(config)))
           for name in archs}
  names, groups = one_shot.architecture_groups(task, archs, tasks,
                                               data.num_clients, input_fn)
  names = tuple(n or config.model.name for n in names)
  mappers = [common.mapper(config, (name,)) for name in names]
  stage = one_shot.client_stage(groups, common.make_optimizer(config),
                                batch_size=config.client.batch_size,
                                num_steps=num_steps, mappers=mappers)
  build, has_epochs = BUILDERS[config.method]
  algorithm = build(config, stage, groups, task, input_fn)

  init_key, run_key = keys.init_and_run(keys.model_root(config.seed))
  global_model = task.init(init_key)
  # Round-1 client models: one init per architecture from the same key.
  initial_models = [global_model if g.task is task else g.task.init(init_key)
                    for g in groups]
  evaluate = make_evaluator(task, ds.x_test, ds.y_test,
                            per_class=config.run.class_accuracy)
  client_evaluators = [make_client_evaluator(g.task, ds.x_test, ds.y_test,
                                             mapper=mp)
                       for g, mp in zip(groups, mappers)]
  work = Workdir(workdir)
  wall = loop_lib.WallClock(start=start)
  result = server_lib.run_server_rounds(
      algorithm, data, run_key=run_key, initial_models=initial_models,
      global_model=global_model,
      group_sizes=[len(g.client_ids) for g in groups],
      options=server_lib.ServerOptions(
          num_rounds=config.rounds,
          num_epochs=config.dfkd.distill_epochs if has_epochs else 0,
          eval_every=config.run.eval_every,
          checkpoint_every=config.run.checkpoint_every,
          progress=config.run.progress,
          stop_on_nonfinite=config.run.stop_on_nonfinite,
          max_seconds=runners.remaining_budget(config, start),
          initial_model_as_seed=config.server.initial_model_as_seed,
          server_seed=config.server.seed,
          teachers_from=config.server.teachers_from or None,
          protocol=_protocol(config),
          setup_fingerprint={k: common.config_value(config, k) for k in (
              "dfkd.stratify_steps", "dfkd.stratify_batch_size", "dfkd.nz",
              "dfkd.ngf", "dfkd.generator_lr", "dfkd.generator_b1",
              "server.seed")}),
      directory=work.directory, evaluate=evaluate, writer=work.writer,
      wall=wall,
      on_clients=one_shot.client_report(groups, client_evaluators,
                                        None if archs else evaluate))

  rows = work.writer.rows()
  accs = [row["test_accuracy"] for row in rows if "test_accuracy" in row]
  report = (algorithm.report(result.state, result.setup)
            if algorithm.report is not None else {})
  class_counts = partition_lib.class_counts(ds.y_train, parts,
                                      task.num_classes)  # [m, c]
  written = []
  if "U_r" in report:
    written.append(figures.plot_u_r(
        report["U_r"], work.path("u_r.png"),
        class_shares=stratify_lib.class_shares(class_counts)))
  if "samples" in report:
    written.append(figures.plot_class_samples(
        *report["samples"], task.num_classes, work.path("samples.png")))
  epoch_points = [[row["step"], row["test_accuracy"]] for row in rows
                  if "test_accuracy" in row]
  if epoch_points:
    written.append(figures.plot_accuracy(epoch_points,
                                         work.path("accuracy.png")))
  arch_of = {k: n for n, g in zip(names, groups) for k in g.client_ids}
  last = result.per_round[-1]
  totals = result.ledger.cumulative()
  summary = {
      "method": config.method,
      "dataset": config.data.dataset,
      "model": config.model.name,
      "client_models": [arch_of[k] for k in range(data.num_clients)],
      "paper_departures": list(config.paper_departures),
      "final_test_accuracy": last["test_accuracy"],
      "best_test_accuracy": max(accs) if accs else last["test_accuracy"],
      **runners.class_accuracy_summary(rows),
      "client_test_accuracy": last["client_test_accuracy"],
      "os_fedavg_test_accuracy": last["os_fedavg_test_accuracy"],
      "per_round": result.per_round,
      "rounds": result.rounds,
      "stopped_by_time_budget": result.out_of_time,
      "num_clients": data.num_clients,
      "client_sizes": np.asarray(data.num_examples).tolist(),
      "client_class_counts": class_counts.tolist(),
      "param_count": ledger_lib.num_params(result.params),
      "bytes_uploaded": totals["bytes_uploaded"],
      "bytes_downloaded": totals["bytes_downloaded"],
      "bytes_total": totals["bytes_total"],
      "ledger": result.ledger.to_dict(),
      "stage_seconds": {"local_training_seconds": result.seconds["client"],
                        "setup_seconds": result.seconds["setup"],
                        "distillation_seconds": result.seconds["server"]},
      # This process's seconds, and the run's over every resumed process.
      "wall_seconds": wall.process(),
      "wall_seconds_total": wall.total(),
      "accuracy_by_epoch": epoch_points,
      "figures": [w.rsplit("/", 1)[-1] for w in written],
      "config": config.to_dict(),
  }
  for k in ("U", "U_r", "U_c"):
    if k in report:
      summary[k] = np.asarray(report[k]).tolist()
  if "U_r" in report:
    summary["U_r_vs_class_share"] = stratify_lib.agreement_with_class_shares(
        np.asarray(report["U_r"]), class_counts)
  work.write_summary(summary)
  return summary
