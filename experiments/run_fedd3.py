"""FedD3 runner: distill on every client, upload once, train on the server.

``config.method`` is ``"fedd3"`` (one-shot: the server trains on the union for
``rounds`` epochs) or ``"fedd3_hybrid"`` (App. F: ``rounds`` FedAvg rounds on
local plus received distilled data). ``config.distiller`` picks KIP or GMM.
The distilled set is cached in ``workdir/distilled.npz`` so that a resumed
run does not distill again. ``config.distilled_from`` names the
``distilled.npz`` of another run to train on instead of distilling, so that
server-side variants reuse one distillation; both caches are refused if they
were written under different distillation settings (:data:`DISTILL_KEYS`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm

from fedjax_dd.algorithms import fedd3
from fedjax_dd.algorithms.centralized import centralized
from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core.metrics import write_json
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.experiments import common
from fedjax_dd.experiments import runners
from fedjax_dd.kernels import krr as krr_lib
from fedjax_dd.kernels import ntk
from fedjax_dd.utils.image_grid import save_image_grid

KERNELS: dict[str, Callable[..., Any]] = {"fc": ntk.fc_kernel,
                                          "conv": ntk.conv_kernel}


def _kernel(config):
  return KERNELS[config.kernel](depth=config.kernel_depth,
                                kind=config.kernel_kind)


def _distiller(config, prepared, num_classes):
  progress_bar = None
  if config.get("progress", True):
    progress_bar = tqdm.tqdm(total=config.kip_max_iterations, desc="KIP",
                             disable=None)

  def progress(done, converged):
    if progress_bar is not None:
      progress_bar.n = done
      progress_bar.set_postfix(converged=converged)
      progress_bar.refresh()

  builders = {
      "kip": lambda: fedd3.kip_distiller(
          _kernel(config), num_classes=num_classes, mean=prepared.mean,
          std=prepared.std, images_per_class=config.images_per_class,
          lr=config.kip_lr, max_iterations=config.kip_max_iterations,
          target_batch_size=config.kip_target_batch, reg=config.kip_reg,
          learn_labels=config.learn_labels,
          centered_labels=config.centered_labels,
          stop_accuracy=config.stop_accuracy,
          min_iterations=config.min_iterations,
          mapper=common.mapper(config, workload="kip"),
          allow_raw_upload=config.allow_raw_upload, progress=progress),
      "gmm": lambda: fedd3.gmm_distiller(
          num_classes=num_classes, images_per_class=config.images_per_class,
          allow_raw_upload=config.allow_raw_upload),
  }
  if config.distiller not in builders:
    raise ValueError(f"Unknown distiller {config.distiller!r}; expected one of "
                     f"{sorted(builders)}.")
  return builders[config.distiller]()


# Config keys that determine the distilled set (the upload); every other key
# (server optimiser, epochs, evaluation, backend) may differ from the run that
# wrote a cached ``distilled.npz``.
DISTILL_KEYS = (
    "dataset", "model", "input_shape", "resize_method", "num_clients",
    "data_seed", "seed", "partition", "distiller", "kernel", "kernel_depth",
    "kernel_kind", "images_per_class", "kip_lr", "kip_max_iterations",
    "kip_target_batch", "kip_reg", "learn_labels", "centered_labels",
    "stop_accuracy", "min_iterations", "allow_raw_upload")


def distill_fingerprint(config) -> str:
  """The distillation settings of ``config`` as canonical JSON."""
  d = config.to_dict()
  return json.dumps({k: d.get(k) for k in DISTILL_KEYS}, sort_keys=True,
                    default=str)


def _load_distilled(path, config) -> tuple[fedd3.DistilledSet, float]:
  with np.load(path) as z:
    if "fingerprint" in z:
      if str(z["fingerprint"]) != distill_fingerprint(config):
        raise ValueError(
            f"{path} was distilled with different settings; use a fresh "
            "workdir or matching distillation keys.\n"
            f"  cached:  {z['fingerprint']}\n"
            f"  current: {distill_fingerprint(config)}")
    else:
      logging.warning("%s has no distillation fingerprint; trusting it.", path)
    distilled = fedd3.DistilledSet(
        x=z["x"], y=z["y"], y_soft=z["y_soft"], owner=z["owner"],
        learned_labels=bool(z["learned_labels"]),
        x_float=z["x_float"] if z["x_float"].size else None)
    return distilled, float(z["seconds"])


def _distill_or_load(config, workdir, prepared, data) -> tuple[fedd3.DistilledSet, float]:
  source = config.get("distilled_from") or ""
  if source:
    return _load_distilled(source, config)
  path = common.workdir_path(workdir, "distilled.npz")
  if os.path.exists(path):
    return _load_distilled(path, config)
  start = time.time()
  key = jax.random.fold_in(common.model_key(config), 1)
  distilled = _distiller(config, prepared, prepared.dataset.num_classes)(key, data)
  seconds = time.time() - start
  np.savez_compressed(
      path, x=distilled.x, y=distilled.y, y_soft=distilled.y_soft,
      owner=distilled.owner, learned_labels=distilled.learned_labels,
      x_float=(distilled.x_float if distilled.x_float is not None
               else np.zeros((0,), np.float32)), seconds=seconds,
      fingerprint=np.asarray(distill_fingerprint(config)))
  return distilled, seconds


def quantisation_cost(config, prepared, distilled: fedd3.DistilledSet,
                      num_test: int = 2000) -> dict[str, float]:
  """KRR test accuracy of the union support before and after uint8 quantisation."""
  if distilled.x_float is None:
    return {}
  kernel = KERNELS[config.kernel](depth=config.kernel_depth,
                                  kind=config.kernel_kind,
                                  batch_size=config.get("kernel_batch") or None)
  mean, std = jnp.asarray(prepared.mean), jnp.asarray(prepared.std)
  norm = lambda x: (jnp.asarray(x, jnp.float32) / 255.0 - mean) / std
  x_test = prepared.dataset.x_test[:num_test]
  y_test = prepared.dataset.y_test[:num_test]
  out = {}
  for name, xs in [("float", distilled.x_float), ("uint8", distilled.x)]:
    k_ss = kernel(norm(xs), norm(xs))
    k_ts = kernel(norm(x_test), norm(xs))
    pred, _ = krr_lib.krr_predict_checked(
        k_ss, k_ts, jnp.asarray(distilled.y_soft), config.kip_reg)
    out[f"krr_test_accuracy_{name}"] = float(
        np.mean(np.argmax(np.asarray(pred), -1) == y_test))
  return out


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  start = time.time()
  prepared = common.load_and_prepare(config)
  parts = common.partition(config, prepared.dataset.y_train)
  data = common.client_data(prepared.dataset, parts)
  distilled, distill_seconds = _distill_or_load(config, workdir, prepared, data)

  ledger = ledger_lib.Ledger().record(1, kind="upload",
                                      bits=fedd3.upload_bits(distilled),
                                      tag="distilled_data")
  grid = save_image_grid(
      common.workdir_path(workdir, "distilled_grid.png"), distilled.x,
      distilled.y, distilled.owner, title=f"{config.distiller} distilled data")

  if config.method == "fedd3_hybrid":
    hybrid = jax.device_put(fedd3.hybrid_client_data(data, distilled))
    ledger = ledger.record(
        1, kind="download", tag="distilled_data",
        bits=fedd3.hybrid_download_bits(distilled, hybrid.num_clients))
    server_data: ClientData = hybrid
    num_steps = runners.local_steps(config, hybrid.num_examples)
    algorithm = fedavg(prepared.task, common.make_optimizer(config),
                       batch_size=config.batch_size,
                       max_steps=int(jnp.max(num_steps)),
                       mapper=common.mapper(config))
  else:
    server_data = jax.device_put(fedd3.server_dataset(distilled))
    num_steps = runners.local_steps(config, server_data.num_examples)
    algorithm = centralized(prepared.task, common.make_optimizer(config),
                            batch_size=config.batch_size,
                            max_steps=int(jnp.max(num_steps)),
                            classic_runtime=common.classic_runtime(config))

  extra = {
      "distiller": config.distiller,
      "distilled_images_total": distilled.size,
      "distill_seconds": distill_seconds,
      "distilled_from": config.get("distilled_from") or "",
      "pixels_per_sample": int(np.prod(distilled.x.shape[1:])),
      "distilled_grid": os.path.basename(grid),
      **quantisation_cost(config, prepared, distilled),
  }
  summary = runners.train_rounds(
      config, workdir, prepared=prepared, algorithm=algorithm,
      data=server_data, num_steps=num_steps, ledger=ledger, start_time=start,
      extra_summary=extra)
  rows = ledger_lib.load_metrics(common.workdir_path(workdir, "metrics.jsonl"))
  bits_per_round = [r["bytes_total_round"] * 8 for r in rows
                    if r.get("bytes_total_round")]
  acc = summary["final_test_accuracy"]
  summary["gce"] = {str(g): ledger_lib.gce(acc, bits_per_round, g)
                    for g in config.gce_gammas}
  write_json(common.workdir_path(workdir, "summary.json"), summary)
  return summary
