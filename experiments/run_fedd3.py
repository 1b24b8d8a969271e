"""FedD3 runner: distill on every client, upload once, train on the server.

``config.method`` is ``"fedd3"`` (one-shot: the server trains on the union for
``rounds`` epochs) or ``"fedd3_hybrid"`` (App. F: ``rounds`` FedAvg rounds on
local plus received distilled data). ``config.fedd3.distiller`` picks KIP, GMM
or ``"random"`` (random real images at KIP's budget, the control). With
``kip.learn_labels`` the server (and the hybrid's clients) train on the learned
soft labels as sent.

The distilled set is the stage ``"distilled"`` of the run's
:class:`~fedjax_dd.core.stage_cache.StageCache` (``workdir/stages``), so a
resumed run does not distill again. ``config.fedd3.distilled_from`` names the
workdir of another run to train on its distilled set instead of
distilling, so that server-side variants reuse one distillation. Either is
used only if its fingerprint (:func:`distill_fingerprint`: the
:data:`DISTILL_KEYS` settings plus :data:`CACHE_FORMAT`) matches; an entry
written under other settings is refused with the differing fields.

The one-shot method is :func:`fedjax_dd.algorithms.fedd3.one_shot`, driven
by :func:`fedjax_dd.core.server.run_server_rounds` (one round of ``rounds``
server epochs; checkpoints ``r1/clients``, ``r1/setup``, ``r1/server``); the
hybrid is FedAvg on :func:`fedjax_dd.core.rounds.train`.

The ledger records each client's upload as its own message, so
``summary.json["gce"]`` is FedD3's Table 2 GCE (one client's message,
:func:`fedjax_dd.core.ledger.gce_summary`) and ``gce_cohort`` the
cohort-total variant. The summary also reports ``privacy``
(:func:`fedjax_dd.distill.privacy.upload_privacy` of the uploaded uint8
images against their sender's raw data) and, for KIP, ``kip_loss`` and
``kip_iterations`` over clients.
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm

from fedjax_dd.algorithms import fedd3
from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.core import keys
from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core import server as server_lib
from fedjax_dd.core.evaluate import make_evaluator
from fedjax_dd.core.stage_cache import StageCache
from fedjax_dd.core.workdir import Workdir
from fedjax_dd.distill import kip as kip_lib
from fedjax_dd.distill import privacy as privacy_lib
from fedjax_dd.experiments import common
from fedjax_dd.experiments import runners
from fedjax_dd.experiments.configs import base as base_config
from fedjax_dd.kernels import krr as krr_lib
from fedjax_dd.utils.image_grid import save_image_grid


def _distiller(config, prepared, num_classes):
  progress_bar = None
  options = common.kip_options(config)
  if config.run.progress:
    progress_bar = tqdm.tqdm(total=options.max_iterations, desc="KIP",
                             disable=None)

  def progress(done, converged):
    if progress_bar is not None:
      progress_bar.n = done
      progress_bar.set_postfix(converged=converged)
      progress_bar.refresh()

  f = config.fedd3
  builders = {
      "kip": lambda: fedd3.kip_distiller(
          common.kip_kernel(config), num_classes=num_classes,
          mean=prepared.mean, std=prepared.std,
          images_per_class=f.images_per_class, options=options,
          mapper=common.mapper(config, workload="kip"),
          allow_raw_upload=f.allow_raw_upload, progress=progress),
      "gmm": lambda: fedd3.gmm_distiller(
          num_classes=num_classes, images_per_class=f.images_per_class,
          allow_raw_upload=f.allow_raw_upload),
      "random": lambda: fedd3.random_distiller(
          num_classes=num_classes, images_per_class=f.images_per_class),
  }
  if f.distiller not in builders:
    raise ValueError(f"Unknown distiller {f.distiller!r}; expected one of "
                     f"{sorted(builders)}.")
  return builders[f.distiller]()


# Config keys (dotted paths) that determine the distilled set (the upload);
# every other key (server optimiser, epochs, evaluation, backend) may differ
# from the run that cached it. KIP's segment length only paces progress
# reports; kip.kernel_impl only picks which implementation computes the same
# kernel (equal to rounding), so it is left out too.
DISTILL_KEYS = (
    "data.dataset", "data.num_classes", "data.resplit", "model.name",
    "data.input_shape",
    "data.resize_method", "data.num_clients", "data.seed", "seed",
    "data.partition", "fedd3.distiller", "fedd3.images_per_class",
    "fedd3.allow_raw_upload", "kip.kernel", "kip.kernel_depth",
    "kip.kernel_kind",
    *(f"kip.{k}" for k in base_config.KIP_OPTION_KEYS
      if k != "segment_iterations"))

# Version of what the "distilled" stage holds (in its fingerprint).
CACHE_FORMAT = 2  # 2: data.num_classes joined the fingerprint

STAGE = "distilled"


def distill_fingerprint(config) -> dict[str, Any]:
  """The distillation settings of ``config`` and the cache format."""
  return {**{k: common.config_value(config, k) for k in DISTILL_KEYS},
          "cache_format": CACHE_FORMAT}


def _distill_or_load(config, workdir, prepared, data
                     ) -> tuple[fedd3.DistilledSet, float, bool]:
  """The distilled set, the seconds its distillation took, and whether it
  came from a cache (this run's or ``fedd3.distilled_from``'s).

  Raises:
    ValueError: if ``fedd3.distilled_from`` holds no distilled set, or a cached
      set was distilled under other settings.
  """
  fingerprint = distill_fingerprint(config)
  source = config.fedd3.distilled_from

  def distill():
    start = time.time()
    key = keys.stage_key(keys.model_root(config.seed), keys.FEDD3_DISTILL)
    out = _distiller(config, prepared, prepared.dataset.num_classes)(key, data)
    if out.first_loss is not None:  # KIP: stop a diverged set, uncached.
      loop_lib.check_not_diverged(
          out.first_loss, out.last_loss, what="fedd3: KIP",
          advice=f"Lower --config.kip.lr (now {config.kip.lr:g}).")
    return out.arrays(), {"learned_labels": out.learned_labels,
                          "centered_labels": out.centered_labels,
                          "seconds": time.time() - start}

  if source:  # Another run's set: never computed into its workdir.
    cache = StageCache.for_workdir(source)
    stage, computed = cache.load(STAGE, fingerprint), False
    if stage is None:
      raise ValueError(f"fedd3.distilled_from: {source!r} holds no distilled "
                       f"set ({cache.path(STAGE)}).")
  else:
    try:
      stage, computed = StageCache.for_workdir(workdir).get_or_compute(
          STAGE, fingerprint, distill)
    except privacy_lib.RawUploadError as e:
      raise common.InputError("fedd3: " + str(e).replace(
          "set allow_raw_upload=True",
          "set --config.fedd3.allow_raw_upload=True")) from None
  distilled = fedd3.DistilledSet.from_arrays(
      stage.arrays, learned_labels=stage.info["learned_labels"],
      centered_labels=stage.info["centered_labels"])
  return distilled, float(stage.info["seconds"]), not computed


def kip_statistics(distilled: fedd3.DistilledSet) -> dict[str, Any]:
  """KIP loss at the first and last iteration, and iterations, over clients.

  Clients that ran no iteration (no data) are left out. Every value is
  ``None`` for a distiller other than KIP.

  Returns:
    ``{"kip_loss": {"first_min", "first_median", "last_min",
    "last_median"}, "kip_iterations": {"min", "median", "max",
    "converged_fraction"}}``.
  """
  if distilled.iterations is None:
    return {"kip_loss": None, "kip_iterations": None}
  it = np.asarray(distilled.iterations)
  ran = it > 0
  if not ran.any():
    return {"kip_loss": None, "kip_iterations": None}
  return {
      "kip_loss": kip_lib.loss_summary(it, distilled.first_loss,
                                       distilled.last_loss),
      "kip_iterations": {
          "min": int(it[ran].min()), "median": float(np.median(it[ran])),
          "max": int(it[ran].max()),
          "converged_fraction": float(np.asarray(distilled.converged)[ran].mean())},
  }


def quantisation_cost(config, prepared, distilled: fedd3.DistilledSet,
                      num_test: int = 2000) -> dict[str, float]:
  """KRR test accuracy of the union support before and after uint8 quantisation."""
  if distilled.x_float is None:
    return {}
  kernel = common.kip_kernel(config, batched=True)
  mean, std = jnp.asarray(prepared.mean), jnp.asarray(prepared.std)
  norm = lambda x: (jnp.asarray(x, jnp.float32) / 255.0 - mean) / std
  x_test = prepared.dataset.x_test[:num_test]
  y_test = prepared.dataset.y_test[:num_test]
  out = {}
  for name, xs in [("float", distilled.x_float), ("uint8", distilled.x)]:
    k_ss = kernel(norm(xs), norm(xs))
    k_ts = kernel(norm(x_test), norm(xs))
    pred, _ = krr_lib.krr_predict_checked(
        k_ss, k_ts, jnp.asarray(distilled.y_soft), config.kip.reg)
    out[f"krr_test_accuracy_{name}"] = float(
        np.mean(np.argmax(np.asarray(pred), -1) == y_test))
  return out


def _summary_extra(config, prepared, data, distilled, distill_seconds, cached,
                   workdir) -> dict[str, Any]:
  """FedD3's own summary fields: the upload, its privacy and KIP figures."""
  grid = save_image_grid(
      common.workdir_path(workdir, "distilled_grid.png"), distilled.x,
      distilled.y, distilled.owner,
      title=f"{config.fedd3.distiller} distilled data")
  host = jax.device_get(data)
  return {
      "distiller": config.fedd3.distiller,
      "distilled_images_total": distilled.size,
      "distill_seconds": distill_seconds,
      "distilled_cached": cached,
      "distilled_from": config.fedd3.distilled_from,
      "pixels_per_sample": int(np.prod(distilled.x.shape[1:])),
      "learned_labels": distilled.learned_labels,
      "distilled_grid": os.path.basename(grid),
      "privacy": privacy_lib.upload_privacy(
          distilled.x, distilled.owner, np.asarray(host.x),
          np.asarray(host.num_examples)),
      **kip_statistics(distilled),
      **quantisation_cost(config, prepared, distilled),
  }


def _hybrid(config, workdir, prepared, data, distilled, extra, start):
  """App. F: FedAvg rounds on local plus received distilled data."""
  ledger = fedd3.hybrid_ledger(distilled, data.num_clients)
  hybrid = jax.device_put(fedd3.hybrid_client_data(data, distilled))
  num_steps = common.local_steps(config, hybrid.num_examples)
  algorithm = fedavg(prepared.task, common.make_optimizer(config),
                     batch_size=config.client.batch_size,
                     max_steps=int(jnp.max(num_steps)),
                     mapper=common.mapper(config))
  return runners.train_rounds(
      config, workdir, prepared=prepared, algorithm=algorithm, data=hybrid,
      num_steps=num_steps, ledger=ledger, start_time=start,
      extra_summary=extra)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  start = time.time()
  prepared = common.load_and_prepare(config)
  parts = common.partition(config, prepared.dataset.y_train)
  data = common.client_data(prepared.dataset, parts)
  distilled, distill_seconds, cached = _distill_or_load(config, workdir,
                                                        prepared, data)
  extra = _summary_extra(config, prepared, data, distilled, distill_seconds,
                         cached, workdir)
  if config.method == "fedd3_hybrid":
    return _hybrid(config, workdir, prepared, data, distilled, extra, start)

  # The server-side method. Its client stage hands over the set distilled
  # above (the run's "distilled" stage, keyed by keys.FEDD3_DISTILL, so the
  # one-shot and the hybrid variant of a seed share one upload and
  # fedd3.distilled_from can reuse another run's).
  task = prepared.task
  algorithm = fedd3.one_shot(
      lambda key, data: distilled, task, common.make_optimizer(config),
      num_classes=task.num_classes,
      images_per_class=config.fedd3.images_per_class,
      batch_size=config.client.batch_size,
      local_epochs=float(config.client.local_epochs),
      local_steps=config.client.local_steps or None,
      learned_labels=distilled.learned_labels,
      centered_labels=distilled.centered_labels,
      mapper=common.mapper(config))
  init_key, run_key = keys.init_and_run(keys.model_root(config.seed))
  global_model = task.init(init_key)
  work = Workdir(workdir, tensorboard=config.run.tensorboard)
  wall = loop_lib.WallClock(start=start)
  result = server_lib.run_server_rounds(
      algorithm, data, run_key=run_key, initial_models=[global_model],
      global_model=global_model, group_sizes=[data.num_clients],
      options=server_lib.ServerOptions(
          num_rounds=1, num_epochs=config.rounds,
          eval_every=config.run.eval_every,
          checkpoint_every=config.run.checkpoint_every,
          progress=config.run.progress,
          stop_on_nonfinite=config.run.stop_on_nonfinite,
          max_seconds=runners.remaining_budget(config, start),
          setup_fingerprint={"distill": distill_fingerprint(config)}),
      directory=work.directory,
      evaluate=make_evaluator(task, prepared.dataset.x_test,
                              prepared.dataset.y_test,
                              per_class=config.run.class_accuracy),
      writer=work.writer, wall=wall)
  # FedD3's `rounds` are server epochs: report them as its rounds.
  rows = [{**row, "round": row["epoch"]} for row in work.writer.rows()]
  summary = runners.summarize(
      config, rows=rows, ledger=result.ledger, params=result.params,
      rounds=int(result.state.epoch), wall=wall,
      extra={**extra, "stage_seconds": {
          "server_training_seconds": result.seconds["server"]}})
  work.write_summary(summary)
  return summary
