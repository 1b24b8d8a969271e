"""Runner of the one-shot data-free methods: FedHydra, DENSE, FedDF, OS-FedAvg.

``run(config, workdir) -> summary`` (registered as ``runner="fedhydra"``).
All methods share the same client stage, so under one config and seed they
distil bit-identical client models (and every summary also reports one-shot
FedAvg on those clients). ``config.method`` picks the server stage from
:data:`SERVER_STAGES`.

Per round ``r`` (one round unless ``config.rounds > 1``, the multi-round
variant of FedHydra's Tab. 5) the runner

1. trains the clients once from the global model (round key
   ``fold_in(run_key, r)`` split as in :func:`fedjax_dd.core.rounds.run_rounds`,
   so the clients equal ``os_fedavg``'s) and records their uploads in the
   ledger;
2. runs the server stage (stratification + HASA, DENSE, FedDF, or nothing);
3. evaluates the global model every ``eval_every`` distillation epochs.

Heterogeneous clients: with ``config.client_models`` (comma-separated
registry names) client ``k`` uses architecture ``client_models[k % len]`` and
``config.model`` is only the server (student) model, freshly initialised.
The clients of one architecture form one group: one local-training program,
one :class:`fedjax_dd.distill.dfkd.TeacherGroup` and one checkpoint
(``r<r>/clients_<arch>``) per group; each client keeps the key of its id, so
its model does not depend on the grouping. Every architecture is fed the
dataset's images (``input_shape``); one that cannot take them is refused.
Parameter averaging is undefined across architectures, so
``os_fedavg_test_accuracy`` is null, ``method=os_fedavg`` is refused, and so
is ``rounds > 1`` (the global model cannot seed other architectures).

Resume: the client models (``r<r>/clients``), the stratification
(``r<r>/stratification.npz``) and the distillation state (``r<r>/distill``:
generator, student, synthetic pool and RNG key as ONE pytree) are
checkpointed; re-running with the same ``workdir`` continues where it stopped.
``config.teachers_from`` may name an earlier workdir with the same client
protocol (checked) whose round-1 client models are reused.

Outputs: ``metrics.jsonl`` (one row per evaluated epoch), ``summary.json``,
``u_r.png``, ``samples.png``, ``accuracy.png``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from fedjax_dd import models
from fedjax_dd.algorithms import stages
from fedjax_dd.algorithms import stratify as stratify_lib
from fedjax_dd.algorithms.dense import dense
from fedjax_dd.algorithms.feddf import feddf
from fedjax_dd.algorithms.fedhydra import fedhydra, local_stage
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core.algorithm import Cohort
from fedjax_dd.core.checkpoint import CheckpointStore
from fedjax_dd.core.evaluate import make_client_evaluator, make_evaluator
from fedjax_dd.core.local import steps_for
from fedjax_dd.core.metrics import MetricsWriter, write_json
from fedjax_dd.data import preprocess
from fedjax_dd.data import sources
from fedjax_dd.distill import dfkd
from fedjax_dd.experiments import common

PyTree = Any
tree_map = jax.tree_util.tree_map

# Config fields that determine the client models (checked by teachers_from).
_PROTOCOL_FIELDS = ("dataset", "model", "input_shape", "num_clients", "seed",
                    "data_seed", "batch_size", "local_epochs", "local_steps",
                    "optimizer", "lr", "momentum", "weight_decay", "partition")


@dataclasses.dataclass
class RoundContext:
  """What a server stage needs for one round (experiments-side glue)."""
  config: ml_collections.ConfigDict
  task: Any
  input_fn: dfkd.InputFn
  groups: tuple[dfkd.TeacherGroup, ...]
  teacher_vars: dfkd.TeacherVars
  average: tuple[PyTree, PyTree] | None  # one-shot FedAvg; None if heterogeneous
  global_params: PyTree
  global_stats: PyTree
  key: jax.Array
  round: int
  workdir: str
  evaluate: Callable[[PyTree, PyTree], dict[str, float]]
  writer: MetricsWriter
  timings: dict[str, float]


def _protocol(config) -> str:
  # client_models only when heterogeneous, so homogeneous protocols of older
  # workdirs still match.
  fields = _PROTOCOL_FIELDS + (("client_models",) if common.client_models(config)
                               else ())
  return json.dumps({k: (config.get(k).to_dict() if hasattr(config.get(k), "to_dict")
                         else config.get(k)) for k in fields},
                    sort_keys=True, default=str)


def _hparams(config) -> dfkd.DFKDHyperParams:
  return dfkd.DFKDHyperParams(
      batch_size=config.synthetic_batch_size,
      generator_steps=config.generator_steps,
      student_steps=config.student_steps,
      pool_size=config.pool_size or config.distill_epochs,
      lambda_bn=config.lambda_bn,
      lambda_adv=config.lambda_adv,
      beta=config.beta,
      temperature=config.temperature,
      reset_generator=config.reset_generator,
      learn_noise=config.learn_noise,
      keep_best=config.keep_best,
      adv_mask=config.adv_mask)


def _generator_optimizer(config) -> optax.GradientTransformation:
  return optax.adam(config.generator_lr, b1=config.generator_b1)


def _generator(config, task) -> models.Generator:
  return models.Generator(out_shape=tuple(task.input_shape), nz=config.nz,
                          ngf=config.ngf)


def _student_optimizer(config) -> optax.GradientTransformation:
  return optax.sgd(config.student_lr, momentum=config.student_momentum or None)


def _distill_loop(ctx: RoundContext, distiller: dfkd.DataFreeKD,
                  ensemble_ctx: PyTree) -> tuple[PyTree, PyTree, dict[str, Any]]:
  """Runs (or resumes) ``config.distill_epochs`` epochs of ``distiller``."""
  config = ctx.config
  num_epochs = config.distill_epochs
  key = jax.random.fold_in(ctx.key, 1)
  state = distiller.init(key, ctx.global_params, ctx.global_stats)
  store = CheckpointStore(common.workdir_path(ctx.workdir, f"r{ctx.round}", "distill"),
                          max_to_keep=2, save_every=config.checkpoint_every)
  restored = store.restore(state)
  if restored is not None:
    state = restored[1]
  offset = (ctx.round - 1) * num_epochs
  ctx.writer.truncate_after(offset + int(state.epoch), key="step")
  t0 = time.time()
  for e in range(int(state.epoch) + 1, num_epochs + 1):
    state, metrics = distiller.epoch(state, ctx.teacher_vars, ensemble_ctx)
    if e % config.eval_every == 0 or e == num_epochs:
      row = {"step": offset + e, "round": ctx.round, "epoch": e}
      row.update({k: float(v) for k, v in jax.device_get(metrics).items()})
      ev = ctx.evaluate(state.params, state.batch_stats)
      row["test_accuracy"] = ev["accuracy"]
      row["test_loss"] = ev["loss"]
      ctx.writer.write(row)
      if config.progress:
        print(f"round {ctx.round} epoch {e}: acc {ev['accuracy']:.4f} "
              f"gen_ce {row['gen_ce']:.3f} bn {row['gen_bn']:.3f}", flush=True)
    store.save(e, state, {"round": ctx.round}, force=(e == num_epochs))
  store.close()
  ctx.timings["distillation_seconds"] = (
      ctx.timings.get("distillation_seconds", 0.0) + time.time() - t0)
  pool_x, pool_y = jax.device_get((state.pool_x, state.pool_y))
  last = (int(state.epoch) - 1) % state.pool_x.shape[0]
  return state.params, state.batch_stats, {"samples": (pool_x[last], pool_y[last])}


def _stage_fedhydra(ctx: RoundContext):
  config = ctx.config
  algo = fedhydra(ctx.groups, _generator(config, ctx.task), ctx.task,
                  ctx.input_fn, _hparams(config),
                  generator_optimizer=_generator_optimizer(config),
                  stratify_steps=config.stratify_steps,
                  stratify_batch_size=config.stratify_batch_size,
                  combine=AGGREGATIONS[config.aggregation],
                  student_optimizer=_student_optimizer(config),
                  mapper=common.mapper(config))
  path = common.workdir_path(ctx.workdir, f"r{ctx.round}", "stratification.npz")
  if os.path.exists(path):
    with np.load(path) as f:
      strat = stratify_lib.stratification_from_curves(jnp.asarray(f["curves"]))
  else:
    t0 = time.time()
    strat = algo.stratify(ctx.teacher_vars, jax.random.fold_in(ctx.key, 0))
    ctx.timings["stratification_seconds"] = (
        ctx.timings.get("stratification_seconds", 0.0) + time.time() - t0)
    tmp = path + ".tmp.npz"
    np.savez(tmp, curves=np.asarray(strat.curves))
    os.replace(tmp, path)
  params, stats, info = _distill_loop(
      ctx, algo.distill,
      algo.ensemble_context(strat,
                            average_scale=config.get("sa_average_scale", True)))
  info.update({"U": strat.u, "U_r": strat.u_r, "U_c": strat.u_c})
  return params, stats, info


def _stage_dense(ctx: RoundContext):
  config = ctx.config
  distiller = dense(ctx.groups, _generator(config, ctx.task), ctx.task,
                    ctx.input_fn, _hparams(config),
                    generator_optimizer=_generator_optimizer(config),
                    student_optimizer=_student_optimizer(config),
                    mapper=common.mapper(config))
  return _distill_loop(ctx, distiller, ())


def _public_images(config, shape) -> np.ndarray:
  """The FedDF public set: ``config.public_data`` resized to the model input."""
  rng = np.random.default_rng(config.data_seed + 1)
  x = sources.load_unlabeled(config.public_data, num=config.public_size,
                             rng=rng)
  if x.shape[-1] == 3 and shape[-1] == 1:
    gray = x.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    x = np.clip(np.round(gray), 0, 255).astype(np.uint8)[..., None]
  if x.shape[1:] != tuple(shape):
    x = preprocess.resize_images(x, tuple(shape))
  return x


def _stage_feddf(ctx: RoundContext):
  config = ctx.config
  algo = feddf(ctx.groups, ctx.task, ctx.input_fn,
               optimizer=optax.adam(config.feddf_lr),
               batch_size=config.synthetic_batch_size,
               steps_per_epoch=config.feddf_steps,
               temperature=config.temperature, mapper=common.mapper(config))
  public = jax.device_put(_public_images(config, ctx.task.input_shape))
  # The student starts from the one-shot FedAvg average if there is one.
  params, stats = ctx.average or (ctx.global_params, ctx.global_stats)
  state = algo.init(jax.random.fold_in(ctx.key, 1), params, stats)
  offset = (ctx.round - 1) * config.distill_epochs
  ctx.writer.truncate_after(offset, key="step")
  t0 = time.time()
  for e in range(1, config.distill_epochs + 1):
    state, metrics = algo.epoch(state, ctx.teacher_vars, public)
    if e % config.eval_every == 0 or e == config.distill_epochs:
      row = {"step": offset + e, "round": ctx.round, "epoch": e}
      row.update({k: float(v) for k, v in jax.device_get(metrics).items()})
      ev = ctx.evaluate(state.params, state.batch_stats)
      row["test_accuracy"] = ev["accuracy"]
      row["test_loss"] = ev["loss"]
      ctx.writer.write(row)
  ctx.timings["distillation_seconds"] = (
      ctx.timings.get("distillation_seconds", 0.0) + time.time() - t0)
  return state.params, state.batch_stats, {}


def _stage_os_fedavg(ctx: RoundContext):
  params, stats = ctx.average
  ev = ctx.evaluate(params, stats)
  ctx.writer.truncate_after((ctx.round - 1) * ctx.config.distill_epochs,
                            key="step")
  ctx.writer.write({"step": ctx.round * ctx.config.distill_epochs,
                    "round": ctx.round, "epoch": 0,
                    "test_accuracy": ev["accuracy"], "test_loss": ev["loss"]})
  return params, stats, {}


SERVER_STAGES: dict[str, Callable[[RoundContext], tuple[PyTree, PyTree, dict]]] = {
    "fedhydra": _stage_fedhydra,
    "dense": _stage_dense,
    "feddf": _stage_feddf,
    "os_fedavg": _stage_os_fedavg,
}

AGGREGATIONS: dict[str, dfkd.CombineFn] = {
    "sa": stratify_lib.stratified_ensemble,
    "ae": dfkd.average_ensemble,
}


def _client_groups(config, task: Any, input_fn: dfkd.InputFn, m: int
                   ) -> tuple[tuple[str, ...], tuple[dfkd.TeacherGroup, ...]]:
  """One teacher group per client architecture, in order of first client.

  Returns:
    ``(names, groups)``: homogeneous clients form one group ``config.model``
    with the server ``task``; otherwise client ``k`` joins the group of
    ``client_models[k % len(client_models)]``.

  Raises:
    ValueError: an architecture does not accept ``task.input_shape``.
  """
  names = common.client_models(config)
  if not names:
    return (config.model,), (dfkd.TeacherGroup(task, input_fn, tuple(range(m))),)
  arch = [names[k % len(names)] for k in range(m)]
  archs = tuple(dict.fromkeys(arch))
  groups = []
  for name in archs:
    g_task = task if name == config.model else dataclasses.replace(
        task, module=models.get_model(name).build(task.num_classes))
    try:
      jax.eval_shape(g_task.init, jax.random.PRNGKey(0))
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(
          f"Client model {name!r} does not accept the input shape "
          f"{tuple(task.input_shape)} of dataset {config.dataset!r}; every "
          "client architecture is fed the same images, so set input_shape to "
          "a shape all of client_models accept.") from e
    groups.append(dfkd.TeacherGroup(
        g_task, input_fn, tuple(k for k, a in enumerate(arch) if a == name)))
  return archs, tuple(groups)


def _record_models(ledger, r: int, kind: str, groups, bits) -> ledger_lib.Ledger:
  """One model per client, each of its own architecture's size."""
  for g, b in zip(groups, bits):
    ledger = ledger.record(r, kind=kind, bits=b, count=len(g.client_ids),
                           tag="model")
  return ledger


def _train_clients(config, workdir, r, store_name, group, mapper, data,
                   num_steps, params, stats, train_key, timings):
  """The client stage of round ``r`` for one architecture group.

  Restored from the checkpoint ``r<r>/<store_name>`` if present (or, in round
  1, from ``config.teachers_from``).

  Returns:
    ``(params, batch_stats)`` stacked ``[m_g, ...]`` in the order of
    ``group.client_ids``.
  """
  ids = jnp.asarray(group.client_ids)
  m_g = len(group.client_ids)
  template = {"params": tree_map(lambda a: jnp.zeros((m_g, *a.shape), a.dtype), params),
              "batch_stats": tree_map(lambda a: jnp.zeros((m_g, *a.shape), a.dtype), stats)}
  store = CheckpointStore(common.workdir_path(workdir, f"r{r}", store_name),
                          max_to_keep=1)
  restored = own = store.restore(template)
  protocol = _protocol(config)
  if restored is None and r == 1 and config.get("teachers_from"):
    other = CheckpointStore(os.path.join(config.teachers_from, "r1", store_name),
                            max_to_keep=1)
    restored = other.restore(template)
    other.close()
    if restored is None:
      raise ValueError(f"teachers_from={config.teachers_from!r} holds no "
                       f"client checkpoint {store_name!r}.")
    if restored[2].get("protocol") != protocol:
      raise ValueError(
          "teachers_from was trained under another client protocol:\n"
          f"  theirs: {restored[2].get('protocol')}\n  ours:   {protocol}")
  if restored is not None:
    models_ = restored[1]
  else:
    t0 = time.time()
    steps = num_steps[ids]
    train = local_stage(group.task, common.make_optimizer(config),
                        batch_size=config.batch_size,
                        max_steps=int(jnp.max(steps)), mapper=mapper)
    # Client ids are kept, so each client's key is that of its id.
    cohort = Cohort(x=data.x[ids], y=data.y[ids],
                    num_examples=data.num_examples[ids], num_steps=steps,
                    client_ids=ids)
    result = train(params, stats, cohort, train_key)
    models_ = {"params": result.params, "batch_stats": result.batch_stats}
    jax.block_until_ready(models_)
    timings["local_training_seconds"] = (
        timings.get("local_training_seconds", 0.0) + time.time() - t0)
  if own is None:  # Trained here or copied from teachers_from.
    store.save(r, models_, {"protocol": protocol}, force=True)
  store.close()
  return models_["params"], models_["batch_stats"]


def _figures(workdir, u_r, samples, rows, num_classes,
             class_counts=None) -> list[str]:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  written = []
  if u_r is not None:
    u_r = np.asarray(u_r)
    # Next to U_r (paper Fig. 5b), the oracle it estimates: each class's
    # share held by each client, which stratification never sees.
    panels = [("U_r", u_r)]
    if class_counts is not None:
      panels.append(("class share n_kj / Σ_k n_kj (truth)",
                     stratify_lib.class_shares(class_counts)))
    fig, axes = plt.subplots(1, len(panels), squeeze=False, figsize=(
        len(panels) * (1.5 + 0.6 * u_r.shape[1]), 4))
    for ax, (title, mat) in zip(axes[0], panels):
      im = ax.imshow(mat, cmap="viridis", aspect="auto", vmin=0, vmax=1)
      ax.set_xlabel("client k")
      ax.set_ylabel("class j")
      ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=list(axes[0]))
    fig.savefig(os.path.join(workdir, "u_r.png"), dpi=100, bbox_inches="tight")
    plt.close(fig)
    written.append("u_r.png")
  if samples is not None:
    x, y = samples
    per = 8
    fig, axes = plt.subplots(num_classes, per, figsize=(per, num_classes))
    for j in range(num_classes):
      idx = np.flatnonzero(y == j)[:per]
      for i in range(per):
        ax = axes[j, i]
        ax.axis("off")
        if i < idx.size:
          img = x[idx[i]]
          ax.imshow(img[..., 0] if img.shape[-1] == 1 else img,
                    cmap="gray" if img.shape[-1] == 1 else None, vmin=0, vmax=1)
    fig.savefig(os.path.join(workdir, "samples.png"), dpi=80, bbox_inches="tight")
    plt.close(fig)
    written.append("samples.png")
  pts = [(r["step"], r["test_accuracy"]) for r in rows if "test_accuracy" in r]
  if pts:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(*zip(*pts), marker=".")
    ax.set_xlabel("distillation epoch")
    ax.set_ylabel("test accuracy")
    fig.savefig(os.path.join(workdir, "accuracy.png"), dpi=100, bbox_inches="tight")
    plt.close(fig)
    written.append("accuracy.png")
  return written


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs ``config.method`` in {fedhydra, dense, feddf, os_fedavg}."""
  if config.method not in SERVER_STAGES:
    raise ValueError(f"Unknown method {config.method!r} for the fedhydra runner; "
                     f"expected one of {sorted(SERVER_STAGES)}.")
  hetero = bool(common.client_models(config))
  if hetero and config.method == "os_fedavg":
    raise ValueError(
        "One-shot FedAvg averages parameters, which is undefined across the "
        f"client architectures client_models={config.client_models!r}; use "
        "fedhydra, dense or feddf, or homogeneous clients.")
  if hetero and config.rounds > 1:
    raise ValueError(
        "Heterogeneous clients (client_models) need rounds=1: the distilled "
        f"{config.model!r} cannot seed clients of other architectures.")
  start = time.time()
  prepared = common.load_and_prepare(config)
  task, ds = prepared.task, prepared.dataset
  parts = common.partition(config, ds.y_train)
  data = common.client_data(ds, parts)
  if config.get("local_steps"):
    num_steps = steps_for(data.num_examples, config.batch_size,
                          steps=config.local_steps)
  else:
    num_steps = steps_for(data.num_examples, config.batch_size,
                          epochs=config.local_epochs)
  mean, std = preprocess.channel_stats(ds.x_train)
  input_fn = dfkd.unit_normalizer(mean, std)
  m = data.num_clients
  names, groups = _client_groups(config, task, input_fn, m)
  mappers = [common.mapper(config, (name,)) for name in names]
  store_names = [f"clients_{n}" if hetero else "clients" for n in names]
  evaluate = make_evaluator(task, ds.x_test, ds.y_test)
  client_evaluators = [make_client_evaluator(g.task, ds.x_test, ds.y_test,
                                             mapper=mp)
                       for g, mp in zip(groups, mappers)]
  writer = MetricsWriter(common.workdir_path(workdir, "metrics.jsonl"))

  init_key, run_key = jax.random.split(common.model_key(config))
  global_params, global_stats = task.init(init_key)
  # Round-1 client models: one init per architecture from the same key.
  starts = [(global_params, global_stats) if g.task is task else
            g.task.init(init_key) for g in groups]
  bits = [ledger_lib.model_bits(p) for p, _ in starts]
  ledger = ledger_lib.Ledger()
  timings: dict[str, float] = {}
  per_round = []
  info: dict[str, Any] = {}
  for r in range(1, config.rounds + 1):
    round_key = jax.random.fold_in(run_key, r)
    _, train_key = jax.random.split(round_key)  # as run_rounds
    if config.get("server_seed", -1) >= 0:
      # Stratification and distillation randomness apart from the clients',
      # so the server stage can be repeated over fixed clients (with
      # teachers_from) to measure its own spread.
      server_key = jax.random.fold_in(
          jax.random.PRNGKey(config.server_seed), r)
    else:
      server_key = jax.random.fold_in(round_key, 2**20)
    if r > 1:  # Homogeneous only: the clients restart from the global model.
      starts = [(global_params, global_stats)]
    if r > 1 or not config.get("initial_model_as_seed", True):
      ledger = _record_models(ledger, r, "download", groups, bits)
    teacher_vars = tuple(
        _train_clients(config, workdir, r, sn, g, mp, data, num_steps, p, s,
                       train_key, timings)
        for sn, g, mp, (p, s) in zip(store_names, groups, mappers, starts))
    ledger = _record_models(ledger, r, "upload", groups, bits)
    client_acc = np.zeros(m)
    for g, ev, tv in zip(groups, client_evaluators, teacher_vars):
      client_acc[list(g.client_ids)] = ev(*tv)["accuracy"]
    average, os_fedavg_acc = None, None
    if not hetero:  # One group of all clients in client order.
      average = tuple(stages.weighted_mean(t, data.num_examples)
                      for t in teacher_vars[0])
      os_fedavg_acc = evaluate(*average)["accuracy"]
    if config.progress:
      fedavg = "n/a" if os_fedavg_acc is None else f"{os_fedavg_acc:.4f}"
      print(f"round {r}: client accuracies {np.round(client_acc, 4).tolist()}, "
            f"one-shot FedAvg {fedavg}, stages {timings}", flush=True)
    ctx = RoundContext(
        config=config, task=task, input_fn=input_fn, groups=groups,
        teacher_vars=teacher_vars, average=average,
        global_params=global_params, global_stats=global_stats,
        key=server_key, round=r, workdir=workdir, evaluate=evaluate,
        writer=writer, timings=timings)
    global_params, global_stats, info = SERVER_STAGES[config.method](ctx)
    per_round.append({"round": r,
                      "client_test_accuracy": [float(a) for a in client_acc],
                      "os_fedavg_test_accuracy": os_fedavg_acc,
                      "test_accuracy": evaluate(global_params, global_stats)["accuracy"]})

  rows = writer.rows()
  accs = [row["test_accuracy"] for row in rows if "test_accuracy" in row]
  totals = ledger.cumulative()
  samples = info.get("samples")
  class_counts = np.stack([np.bincount(ds.y_train[p], minlength=task.num_classes)
                           for p in parts])  # [m, c]
  figures = _figures(workdir, info.get("U_r"), samples, rows, task.num_classes,
                     class_counts)
  arch_of = {k: n for n, g in zip(names, groups) for k in g.client_ids}
  summary = {
      "method": config.method,
      "dataset": config.dataset,
      "model": config.model,
      "client_models": [arch_of[k] for k in range(m)],
      "paper_departures": list(config.get("paper_departures") or ()),
      "final_test_accuracy": per_round[-1]["test_accuracy"],
      "best_test_accuracy": max(accs) if accs else per_round[-1]["test_accuracy"],
      "client_test_accuracy": per_round[-1]["client_test_accuracy"],
      "os_fedavg_test_accuracy": per_round[-1]["os_fedavg_test_accuracy"],
      "per_round": per_round,
      "rounds": config.rounds,
      "num_clients": m,
      "client_sizes": np.asarray(data.num_examples).tolist(),
      "client_class_counts": class_counts.tolist(),
      "param_count": ledger_lib.num_params(global_params),
      "bytes_uploaded": totals["bytes_uploaded"],
      "bytes_downloaded": totals["bytes_downloaded"],
      "bytes_total": totals["bytes_total"],
      "ledger": ledger.to_dict(),
      "stage_seconds": timings,
      "wall_seconds": time.time() - start,
      "accuracy_by_epoch": [[row["step"], row["test_accuracy"]] for row in rows
                            if "test_accuracy" in row],
      "figures": figures,
      "config": config.to_dict(),
  }
  for k in ("U", "U_r", "U_c"):
    if k in info:
      summary[k] = np.asarray(info[k]).tolist()
  if "U_r" in info:
    summary["U_r_vs_class_share"] = stratify_lib.agreement_with_class_shares(
        np.asarray(info["U_r"]), class_counts)
  write_json(common.workdir_path(workdir, "summary.json"), summary)
  return summary
