"""Glue of the one-shot data-free methods: FedHydra, DENSE, FedDF, OS-FedAvg.

``run(config, workdir) -> summary`` (``runner="fedhydra"``). It builds, from
the config, the shared one-shot client stage
(:func:`fedjax_dd.algorithms.one_shot.client_stage`) and the server method
``config.method`` (its declared server form,
:mod:`fedjax_dd.experiments.registry`), and hands them to the library's driver
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
``config.client.independent_init`` starts every client from its own
initialisation instead of the shared global model (one round only).
``config.run.client_span_steps`` trains the clients in checkpointed spans of
that many local steps (a long local training, e.g. FedHydra's 200 epochs,
resumes inside it; ``run.max_wall_seconds`` stops it between spans, with
``client_steps_done`` of ``client_steps_total`` in the summary).

Outputs: ``metrics.jsonl`` (one row per evaluated epoch), ``summary.json``,
``u_r.png``, ``samples.png``, ``accuracy.png``
(:func:`fedjax_dd.utils.figures.plot_one_shot`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import ml_collections
import numpy as np

from fedjax_dd import models
from fedjax_dd.algorithms import one_shot
from fedjax_dd.core import keys
from fedjax_dd.core.evaluate import make_client_evaluator, make_evaluator
from fedjax_dd.data import partition as partition_lib
from fedjax_dd.distill import ensemble
from fedjax_dd.experiments import checks
from fedjax_dd.experiments import common
from fedjax_dd.experiments import registry
from fedjax_dd.experiments import runners
from fedjax_dd.utils import figures

# Test images on which FedHydra's summary measures SA's target naming.
PROBE = 2000

def _protocol(config) -> str:
  """The ``client_protocol`` fingerprint (``experiments/configs/base.py``):
  every setting that determines the round-1 client models."""
  return json.dumps(common.fingerprint(config, "client_protocol"),
                    sort_keys=True, default=str)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs ``config.method`` in {fedhydra, dense, feddf, os_fedavg}."""
  archs = common.client_models(config)
  checks.check_one_shot(config, list(registry.methods(registry.ONE_SHOT)),
                       archs)
  start = time.time()
  prepared = common.load_and_prepare(config)
  task, ds = prepared.task, prepared.dataset
  parts = common.partition(config, ds.y_train)
  data = common.client_data(ds, parts)
  num_steps = common.local_steps(config, data.num_examples)
  input_fn = ensemble.unit_normalizer(prepared.mean, prepared.std)
  tasks = {name: task if name == config.model.name else dataclasses.replace(
      task, module=models.get_model(name).build(
          task.num_classes, conv_impl=common.conv_impl(config),
          compute_dtype=common.compute_dtype(config)))
           for name in archs}
  names, groups = one_shot.architecture_groups(task, archs, tasks,
                                               data.num_clients, input_fn)
  names = tuple(n or config.model.name for n in names)
  mappers = [common.mapper(config, (name,)) for name in names]
  audit = None
  if "audit" in config and config.audit.enabled:
    # The audit's glue; a holdout the test split cannot give is refused
    # now, before the clients train.
    from fedjax_dd.experiments import auditing as audit  # pylint: disable=g-import-not-at-top
    audit.attacker_data(config, prepared)
    if config.audit.lira_shadows:  # and a shadow pool outside the holdout
      audit.lira_shadows(config, prepared, data)
  init_key, run_key = keys.init_and_run(keys.model_root(config.seed))
  # Each group trains its own model up to its clients' largest count.
  training = common.local_training(config, task,
                                   max(int(num_steps.max()), 1))
  stage = one_shot.client_stage(
      groups, training, num_steps=num_steps, mappers=mappers,
      independent_init=init_key if config.client.independent_init else None)
  method = registry.get(config.method)
  algorithm = method.server(config, stage, groups, task, input_fn,
                            **registry.build_inputs(config, method))

  global_model = task.init(init_key)
  # Round-1 client models: one init per architecture from the same key.
  initial_models = [global_model if g.task is task else g.task.init(init_key)
                    for g in groups]
  evaluate = make_evaluator(task, ds.x_test, ds.y_test,
                            per_class=config.run.class_accuracy)
  client_evaluators = [make_client_evaluator(g.task, ds.x_test, ds.y_test,
                                             mapper=mp)
                       for g, mp in zip(groups, mappers)]
  result, rows, wall, work = runners.run_server(
      config, workdir, algorithm, data, start=start, run_key=run_key,
      evaluate=evaluate, initial_models=initial_models,
      global_model=global_model,
      group_sizes=[len(g.client_ids) for g in groups],
      num_rounds=config.rounds,
      num_epochs=config.dfkd.distill_epochs if method.server_epochs else 0,
      initial_model_as_seed=config.server.initial_model_as_seed,
      server_seed=config.server.seed,
      teachers_from=config.server.teachers_from or None,
      protocol=_protocol(config),
      setup_fingerprint=common.fingerprint(config, "server_setup"),
      client_span_steps=config.run.client_span_steps,
      on_clients=one_shot.client_report(groups, client_evaluators,
                                        None if archs else evaluate))
  if result.client_steps is not None:
    # The budget stopped the clients' spans: no model yet; the same command
    # resumes them.
    done, total = result.client_steps
    final, stopped = None, True
    extra = {"client_steps_done": done, "client_steps_total": total}
  else:
    class_counts = partition_lib.class_counts(ds.y_train, parts,
                                              task.num_classes)  # [m, c]
    report = (algorithm.report(result.state, result.setup)
              if algorithm.report is not None else {})
    final = result.per_round[-1]["test_accuracy"]
    stopped = result.out_of_time
    extra = {**one_shot.run_fields(
        result, names=names, groups=groups, num_examples=data.num_examples,
        class_counts=class_counts, report=report, probe=(
            np.asarray(ds.x_test[:PROBE], np.float32) / 255.0,
            ds.y_test[:PROBE])), "figures": figures.plot_one_shot(
                report, rows, class_counts=class_counts,
                num_classes=task.num_classes, directory=work.directory)}
  if audit is not None and result.client_steps is None:
    # Each client's uploaded model and the final global model.
    extra["audit"] = audit.audit_run(config, workdir, prepared=prepared,
                                     data=data, groups=groups, result=result)
  summary = runners.summarize(
      config, rows=rows, ledger=result.ledger, params=result.params,
      rounds=result.rounds, wall=wall, num_clients=data.num_clients,
      final_test_accuracy=final, stopped_by_time_budget=stopped,
      round_key="step", curve_name="accuracy_by_epoch", extra=extra)
  work.write_summary(summary)
  return summary
