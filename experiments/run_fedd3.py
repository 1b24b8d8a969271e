"""FedD3 runner: distill on every client, upload once, train on the server.

``config.method`` is ``"fedd3"`` (one-shot: the server trains on the union for
``rounds`` epochs) or ``"fedd3_hybrid"`` (App. F: ``rounds`` FedAvg rounds on
local plus received distilled data). ``config.distiller`` picks KIP, GMM or
``"random"`` (random real images at KIP's budget, the control). With
``learn_labels`` the server (and the hybrid's clients) train on the learned
soft labels as sent.

The distilled set is cached in ``workdir/distilled.npz`` so that a resumed
run does not distill again. ``config.distilled_from`` names the
``distilled.npz`` of another run to train on instead of distilling, so that
server-side variants reuse one distillation. A cache is used only if its
fingerprint (the :data:`DISTILL_KEYS` settings plus :data:`CACHE_FORMAT`)
matches: a cache written under other settings is refused; a stale one (an
older format, missing fields this runner now records) is recomputed in the
run's own workdir and refused as ``distilled_from``.

The ledger records each client's upload as its own message, so
``summary.json["gce"]`` is FedD3's Table 2 GCE (one client's message,
:func:`fedjax_dd.core.ledger.gce_summary`) and ``gce_cohort`` the
cohort-total variant. The summary also reports ``privacy``
(:func:`fedjax_dd.distill.privacy.upload_privacy` of the uploaded uint8
images against their sender's raw data) and, for KIP, ``kip_loss`` and
``kip_iterations`` over clients.
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
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import kip as kip_lib
from fedjax_dd.distill import privacy as privacy_lib
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
      "random": lambda: fedd3.random_distiller(
          num_classes=num_classes, images_per_class=config.images_per_class),
  }
  if config.distiller not in builders:
    raise ValueError(f"Unknown distiller {config.distiller!r}; expected one of "
                     f"{sorted(builders)}.")
  return builders[config.distiller]()


# Config keys that determine the distilled set (the upload); every other key
# (server optimiser, epochs, evaluation, backend) may differ from the run that
# wrote a cached ``distilled.npz``.
DISTILL_KEYS = (
    "dataset", "resplit", "model", "input_shape", "resize_method",
    "num_clients", "data_seed", "seed", "partition", "distiller", "kernel",
    "kernel_depth", "kernel_kind", "images_per_class", "kip_lr",
    "kip_max_iterations", "kip_target_batch", "kip_reg", "learn_labels",
    "centered_labels", "stop_accuracy", "min_iterations", "allow_raw_upload")

# Version of what ``distilled.npz`` holds. 2: per-client KIP statistics
# (iterations, converged, first/last loss) and ``centered_labels``.
CACHE_FORMAT = 2

# Arrays every cache of the current format holds (optional ones are empty).
_CACHE_FIELDS = ("x", "y", "y_soft", "owner", "learned_labels",
                 "centered_labels", "x_float", "iterations", "converged",
                 "first_loss", "last_loss", "seconds", "fingerprint")


def _settings(config) -> dict[str, Any]:
  d = config.to_dict()
  return {k: d.get(k) for k in DISTILL_KEYS}


def distill_fingerprint(config) -> str:
  """The distillation settings of ``config`` and the cache format, as JSON."""
  return json.dumps({**_settings(config), "cache_format": CACHE_FORMAT},
                    sort_keys=True, default=str)


class StaleCacheError(ValueError):
  """A ``distilled.npz`` of an older format (same or unknown settings)."""


def _optional(z, name):
  a = z[name]
  return a if a.size else None


def _load_distilled(path, config) -> tuple[fedd3.DistilledSet, float]:
  """Reads a cache written by :func:`_save_distilled` under ``config``'s settings.

  Raises:
    ValueError: if it was distilled under other settings.
    StaleCacheError: if it has an older format (no fingerprint, an older
      ``cache_format`` or missing fields).
  """
  with np.load(path) as z:
    if "fingerprint" not in z:
      raise StaleCacheError(f"{path} has no distillation fingerprint (an "
                            "older cache format).")
    cached = json.loads(str(z["fingerprint"]))
    version = cached.pop("cache_format", 1)
    current = json.loads(json.dumps(_settings(config), sort_keys=True,
                                    default=str))
    for k, v in current.items():
      # A key added to DISTILL_KEYS after the cache was written: its off
      # value (0, None, "", False) is what the older run did.
      if k not in cached and not v:
        cached[k] = v
    if cached != current:
      raise ValueError(
          f"{path} was distilled with different settings; use a fresh "
          "workdir or matching distillation keys.\n"
          f"  cached:  {z['fingerprint']}\n"
          f"  current: {distill_fingerprint(config)}")
    missing = [f for f in _CACHE_FIELDS if f not in z]
    if version != CACHE_FORMAT or missing:
      raise StaleCacheError(
          f"{path} has cache format {version} (current {CACHE_FORMAT}); "
          f"missing fields: {missing}.")
    distilled = fedd3.DistilledSet(
        x=z["x"], y=z["y"], y_soft=z["y_soft"], owner=z["owner"],
        learned_labels=bool(z["learned_labels"]),
        centered_labels=bool(z["centered_labels"]),
        x_float=_optional(z, "x_float"),
        iterations=_optional(z, "iterations"),
        converged=_optional(z, "converged"),
        first_loss=_optional(z, "first_loss"),
        last_loss=_optional(z, "last_loss"))
    return distilled, float(z["seconds"])


def _save_distilled(path, config, distilled: fedd3.DistilledSet,
                    seconds: float) -> None:
  empty = lambda a, dtype: (np.zeros((0,), dtype) if a is None
                            else np.asarray(a))
  np.savez_compressed(
      path, x=distilled.x, y=distilled.y, y_soft=distilled.y_soft,
      owner=distilled.owner, learned_labels=distilled.learned_labels,
      centered_labels=distilled.centered_labels,
      x_float=empty(distilled.x_float, np.float32),
      iterations=empty(distilled.iterations, np.int32),
      converged=empty(distilled.converged, bool),
      first_loss=empty(distilled.first_loss, np.float32),
      last_loss=empty(distilled.last_loss, np.float32),
      seconds=seconds, fingerprint=np.asarray(distill_fingerprint(config)))


def _distill_or_load(config, workdir, prepared, data) -> tuple[fedd3.DistilledSet, float]:
  source = config.get("distilled_from") or ""
  if source:
    try:
      return _load_distilled(source, config)
    except StaleCacheError as e:
      raise ValueError(f"distilled_from: {e} Re-run the distillation that "
                       "wrote it.") from e
  path = common.workdir_path(workdir, "distilled.npz")
  if os.path.exists(path):
    try:
      return _load_distilled(path, config)
    except StaleCacheError as e:
      # Same (or unrecorded) settings and the same key: distilling again
      # gives the same upload, now with every field recorded.
      logging.warning("%s Distilling again.", e)
  start = time.time()
  key = jax.random.fold_in(common.model_key(config), 1)
  distilled = _distiller(config, prepared, prepared.dataset.num_classes)(key, data)
  seconds = time.time() - start
  _save_distilled(path, config, distilled, seconds)
  return distilled, seconds


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

  # One message per client, so the ledger knows each client's upload (GCE).
  ledger = ledger_lib.Ledger().record_messages(
      1, kind="upload", tag="distilled_data",
      bits=fedd3.client_upload_bits(distilled, data.num_clients))
  grid = save_image_grid(
      common.workdir_path(workdir, "distilled_grid.png"), distilled.x,
      distilled.y, distilled.owner, title=f"{config.distiller} distilled data")
  host = jax.device_get(data)
  privacy = privacy_lib.upload_privacy(distilled.x, distilled.owner,
                                       np.asarray(host.x),
                                       np.asarray(host.num_examples))

  if config.method == "fedd3_hybrid":
    hybrid = jax.device_put(fedd3.hybrid_client_data(data, distilled))
    ledger = ledger.record_messages(
        1, kind="download", tag="distilled_data",
        bits=fedd3.hybrid_client_download_bits(distilled, hybrid.num_clients))
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
      "learned_labels": distilled.learned_labels,
      "distilled_grid": os.path.basename(grid),
      "privacy": privacy,
      **kip_statistics(distilled),
      **quantisation_cost(config, prepared, distilled),
  }
  return runners.train_rounds(
      config, workdir, prepared=prepared, algorithm=algorithm,
      data=server_data, num_steps=num_steps, ledger=ledger, start_time=start,
      extra_summary=extra)
