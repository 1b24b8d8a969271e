"""FedD3's client stage as a run uses it: distil or load, then report.

Reference: Song et al., "Federated Learning via Decentralized Dataset
Distillation in Resource-Constrained Edge Environments", IJCNN 2023.
:mod:`fedjax_dd.algorithms.fedd3` holds the distillers and the method; this
module caches the distilled set (:func:`distill_or_load`, so a resumed run
or a variant reading another run's cache does not distil again) and reports
on it (:func:`kip_statistics`, :func:`quantisation_cost`,
:func:`upload_fields`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.algorithms.fedd3 import DistilledSet
from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core.stage_cache import StageCache, TreeCheckpoint
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import kip as kip_lib
from fedjax_dd.distill import privacy as privacy_lib
from fedjax_dd.kernels import krr as krr_lib

STAGE = "distilled"
"""The name of the distilled set in a run's stage cache."""

KIP_STAGE = "distilled_kip"
"""KIP's state between segments in a run's stage cache, while the clients
distil (:func:`kip_checkpoint`)."""

CACHE_FORMAT = 2
"""Version of what stage :data:`STAGE` holds; part of its fingerprint
(2: ``data.num_classes`` joined the fingerprint)."""


def kip_checkpoint(cache: StageCache, fingerprint: Mapping[str, Any], *,
                   every: int = 1) -> TreeCheckpoint:
  """KIP's state between segments, entry :data:`KIP_STAGE` of ``cache``
  under the set's ``fingerprint`` (one saved under another is refused, as
  the set is); ``every``: save every ``every``-th segment. It holds each
  client's unsent, part-distilled support and Adam's moments over it."""
  return TreeCheckpoint(cache, KIP_STAGE, fingerprint, every=every)


def progress_bar(total: int, desc: str = "KIP"
                 ) -> Callable[[int, int], None]:
  """KIP's ``progress(done, converged)`` callback: a tqdm bar on a TTY, a
  line per report elsewhere (:func:`fedjax_dd.core.loop.progress_counter`)."""
  counter = loop_lib.progress_counter(total, f"{desc} iteration")
  return lambda done, converged: counter(done, converged=converged)


def distill_or_load(distill: Callable[[], DistilledSet], *,
                    cache: StageCache, fingerprint: Mapping[str, Any],
                    source: StageCache | None = None,
                    source_name: str = "the source",
                    diverged_advice: str = "", allow_rise: bool = False,
                    in_progress: TreeCheckpoint | None = None
                    ) -> tuple[DistilledSet, float, bool]:
  """The distilled set from ``cache`` (or ``source``), else distilled.

  Args:
    distill: ``() -> DistilledSet``, run only on a miss of ``cache``.
    cache: this run's stage cache; a distilled set is saved there.
    fingerprint: the settings that determine the set (with
      :data:`CACHE_FORMAT`); an entry saved under others is refused.
    source: another run's cache to read the set from instead (never
      distilled into).
    source_name: how the refusal of a ``source`` without a set names it.
    diverged_advice: the sentence that ends the message when KIP's median
      loss rose past its start (:func:`fedjax_dd.core.loop.check_not_diverged`).
    allow_rise: stop only a non-finite KIP loss, not one that rose (DP-KIP,
      whose noised steps may end above the start).
    in_progress: KIP's checkpoint between segments (:func:`kip_checkpoint`,
      the one ``distill`` saves to), removed once the set is cached.

  Returns:
    ``(distilled, seconds its distillation took, whether it came from a
    cache)``.

  Raises:
    ValueError: ``source`` holds no distilled set.
    fedjax_dd.core.stage_cache.StaleStageError: a cached set was distilled
      under another fingerprint.
    fedjax_dd.core.loop.DivergedError: KIP diverged (nothing is cached).
  """
  def compute():
    start = time.time()
    out = distill()
    if out.first_loss is not None:  # KIP: stop a diverged set, uncached.
      loop_lib.check_not_diverged(out.first_loss, out.last_loss,
                                  what="fedd3: KIP", advice=diverged_advice,
                                  allow_rise=allow_rise)
    return out.arrays(), {"learned_labels": out.learned_labels,
                          "centered_labels": out.centered_labels,
                          "seconds": time.time() - start}

  if source is not None:
    stage, computed = source.load(STAGE, fingerprint), False
    if stage is None:
      raise ValueError(f"{source_name} holds no distilled set "
                       f"({source.path(STAGE)}).")
  else:
    stage, computed = cache.get_or_compute(STAGE, fingerprint, compute)
    if in_progress is not None:
      in_progress.clear()  # superseded by the cached set
  distilled = DistilledSet.from_arrays(
      stage.arrays, learned_labels=stage.info["learned_labels"],
      centered_labels=stage.info["centered_labels"])
  return distilled, float(stage.info["seconds"]), not computed


def as_uint8(x: np.ndarray) -> np.ndarray:
  """An upload's images as uint8: as they are, or a float upload's pixels
  rounded (:func:`fedjax_dd.distill.kip.quantize`), so that the privacy
  measures read a float upload at its rounding."""
  x = np.asarray(x)
  return x if x.dtype == np.uint8 else np.asarray(kip_lib.quantize(x))


def kip_statistics(distilled: DistilledSet) -> dict[str, Any]:
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
  converged = np.asarray(distilled.converged)[ran]
  return {
      "kip_loss": kip_lib.loss_summary(it, distilled.first_loss,
                                       distilled.last_loss),
      "kip_iterations": {
          "min": int(it[ran].min()), "median": float(np.median(it[ran])),
          "max": int(it[ran].max()),
          "converged_fraction": float(converged.mean())},
  }


def quantisation_cost(distilled: DistilledSet, *,
                      kernel_fn: kip_lib.KernelFn, mean, std,
                      x_test: np.ndarray, y_test: np.ndarray, reg: float
                      ) -> dict[str, float]:
  """KRR test accuracy of the union support before and after quantisation.

  Kernel ridge regression (FedD3 Eq. 4) from the float support and from the
  uint8 upload, each normalised as KIP saw it.

  Args:
    distilled: the set (``x_float`` present: KIP only; else ``{}``).
    kernel_fn: the KIP kernel, e.g. batched over test images.
    mean: ``[Ch]`` channel mean on the ``[0, 1]`` scale.
    std: ``[Ch]`` channel std.
    x_test: ``[T, H, W, Ch]`` uint8.
    y_test: ``[T]`` int labels.
    reg: KRR's regulariser.

  Returns:
    ``{"krr_test_accuracy_float", "krr_test_accuracy_uint8"}``.
  """
  if distilled.x_float is None:
    return {}
  mean, std = jnp.asarray(mean), jnp.asarray(std)
  norm = lambda x: (jnp.asarray(x, jnp.float32) / 255.0 - mean) / std
  out = {}
  for name, xs in [("float", distilled.x_float),
                   ("uint8", as_uint8(distilled.x))]:
    k_ss = kernel_fn(norm(xs), norm(xs))
    k_ts = kernel_fn(norm(x_test), norm(xs))
    pred, _ = krr_lib.krr_predict_checked(
        k_ss, k_ts, jnp.asarray(distilled.y_soft), reg)
    out[f"krr_test_accuracy_{name}"] = float(
        np.mean(np.argmax(np.asarray(pred), -1) == y_test))
  return out


def upload_fields(distilled: DistilledSet, data: ClientData, *,
                  distiller: str, distill_seconds: float, cached: bool,
                  distilled_from: str = "", distilled_grid: str = "",
                  quantisation: Mapping[str, float] | None = None
                  ) -> dict[str, Any]:
  """FedD3's own summary fields.

  Args:
    distilled: the uploaded set.
    data: the clients' raw data ``[C, N_max, ...]`` (privacy reference).
    distiller: its name (``"kip"``, ``"gmm"``, ``"random"``).
    distill_seconds: what the distillation took.
    cached: whether the set came from a cache.
    distilled_from: the workdir whose cached set was used ("" : this run's).
    distilled_grid: the file name of the upload's image grid, drawn by the
      caller ("": none).
    quantisation: :func:`quantisation_cost`'s figures, placed last.
  """
  host = jax.device_get(data)
  return {
      "distiller": distiller,
      "distilled_images_total": distilled.size,
      "distill_seconds": distill_seconds,
      "distilled_cached": cached,
      "distilled_from": distilled_from,
      "pixels_per_sample": int(np.prod(distilled.x.shape[1:])),
      "learned_labels": distilled.learned_labels,
      "distilled_grid": distilled_grid,
      "privacy": privacy_lib.upload_privacy(
          as_uint8(distilled.x), distilled.owner, np.asarray(host.x),
          np.asarray(host.num_examples)),
      **kip_statistics(distilled),
      **(quantisation or {}),
  }
