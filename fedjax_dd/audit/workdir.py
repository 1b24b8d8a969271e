"""The audits of a finished run: what the server kept, attacked at once.

A run's workdir keeps what its server saw (``docs/privacy.md``): FedD3's
uploads in the stage cache (:data:`fedjax_dd.algorithms.fedd3_stages.STAGE`),
a rounds run's final global model in its checkpoint. This module audits them
for every client at once and returns a JSON-ready summary (means over
clients and per-client arrays) for :func:`write_audit`:

* :func:`audit_image_uploads` (FedD3): image membership inference in pixel
  and random-feature space, reconstruction and label leakage, per client;
* :func:`audit_global_model` (the FedAvg family): loss-threshold membership
  inference of the final global model on each client's training data.

The attacker's population data is a held-out slice of the **test** split
(:func:`holdout_indices`), since carving one out of the training split
would change the partition and so the run. Each client's non-members are
drawn from it in the client's label mix (:func:`nonmember_parts`). The
clients' data is the caller's (``fedjax_dd.experiments.audit`` rebuilds it);
the library reads only what the server kept.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.algorithms import fedd3 as fedd3_lib
from fedjax_dd.algorithms import fedd3_stages
from fedjax_dd.audit import image_mia as image_mia_lib
from fedjax_dd.audit import model_mia as model_mia_lib
from fedjax_dd.audit import reconstruction as rc
from fedjax_dd.audit.membership import FPRS, MIAResult
from fedjax_dd.core import checks
from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core.algorithm import Cohort
from fedjax_dd.core.checkpoint import CheckpointStore
from fedjax_dd.core.clients import ClientMapper, client_stage
from fedjax_dd.core.local import LocalTraining, make_local_update
from fedjax_dd.core.metrics import to_jsonable, write_json
from fedjax_dd.core.stage_cache import StageCache
from fedjax_dd.core.task import Classifier
from fedjax_dd.data.stacked import ClientData, stack_clients
from fedjax_dd.distill import kip as kip_lib

AUDIT_FILE = "audit.json"
"""The file :func:`write_audit` writes in a workdir."""

FEATURE_DIM = 2048
"""Features of the image audit's random-feature space
(:func:`fedjax_dd.audit.image_mia.random_projection`)."""


def _advisor(prefix: str, fix: str | None):
  """``name -> fix`` with ``{name}`` filled (``None`` without a fix)."""
  return lambda name: fix.format(name=prefix + name) if fix else None


def check_settings(holdout: Any, psnr_threshold: Any, fprs: Any, *,
                   prefix: str = "", fix: str | None = None
                   ) -> tuple[int, float, tuple[float, ...]]:
  """The audit's settings, refused with one line before any data loads.

  Args:
    holdout: test examples the attacker holds, an int ``>= 0`` (0: the
      whole test split; the upper bound is checked by
      :func:`holdout_indices`).
    psnr_threshold: finite dB at or above which an image is reconstructed.
    fprs: the FPRs of the reported TPRs, a non-empty sequence in ``(0, 1)``.
    prefix: how the names are spelled in a refusal (``"config.audit."``).
    fix: the advice that ends a refusal, with ``{name}`` for the setting's
      path (``"set --config.{name}"``).

  Returns:
    ``(holdout, psnr_threshold, fprs)`` in plain Python types.

  Raises:
    fedjax_dd.core.checks.SettingError: naming the setting and its value.
  """
  advice = _advisor(prefix, fix)
  h = checks.check_int(prefix + "holdout", holdout, 0,
                       fix=advice("holdout"))
  t = checks.check_number(prefix + "psnr_threshold", psnr_threshold,
                          fix=advice("psnr_threshold"))
  if isinstance(fprs, (str, bytes)) or not isinstance(fprs, Sequence) or (
      not fprs):
    checks.refuse(prefix + "fprs", "a non-empty sequence of rates in (0, 1)",
                  fprs, advice("fprs"))
  f = tuple(checks.check_number(prefix + "fprs", v, 0.0, 1.0, low_open=True,
                                high_open=True, fix=advice("fprs"))
            for v in fprs)
  return h, t, f


def check_lira(shadows: Any, pool: Any, *, prefix: str = "",
               fix: str | None = None) -> tuple[int, int]:
  """Offline LiRA's settings: ``shadows`` 0 (no LiRA) or an int ``>= 2``
  (a variance is fitted over them), ``pool`` an int ``>= 0`` (0: every
  test example outside the holdout).

  Raises:
    fedjax_dd.core.checks.SettingError: naming the setting and its value.
  """
  advice = _advisor(prefix, fix)
  k = checks.check_int(prefix + "lira_shadows", shadows, 0,
                       fix=advice("lira_shadows"))
  if k == 1:
    checks.refuse(prefix + "lira_shadows", "0 (no LiRA) or at least 2 "
                  "shadows (LiRA fits a variance over them)", k,
                  advice("lira_shadows"))
  return k, checks.check_int(prefix + "lira_pool", pool, 0,
                             fix=advice("lira_pool"))


def holdout_indices(num_test: int, holdout: int, rng: np.random.Generator, *,
                    name: str = "holdout", fix: str | None = None
                    ) -> np.ndarray:
  """The attacker's slice of the test split: ``holdout`` indices drawn
  without replacement (all ``num_test``, in order, for ``holdout=0``).

  Raises:
    fedjax_dd.core.checks.SettingError: ``holdout`` above ``num_test``.
  """
  h = checks.check_int(name, holdout, 0, num_test,
                       fix=fix or f"the test split holds {num_test} examples")
  if h == 0 or h == num_test:
    return np.arange(num_test)
  return np.sort(rng.choice(num_test, size=h, replace=False))


def shadow_pool_indices(num_test: int, holdout: np.ndarray, size: int,
                        rng: np.random.Generator) -> np.ndarray:
  """LiRA's shadow pool: ``size`` sorted test indices outside the
  attacker's ``holdout`` (all for ``size=0``), so no shadow has seen a
  member or a non-member.

  Raises:
    fedjax_dd.core.checks.SettingError: fewer than 2 indices, or than
      ``size``, lie outside the holdout.
  """
  rest = np.setdiff1d(np.arange(num_test), np.asarray(holdout))
  want = int(size) or rest.size
  if rest.size < max(2, want):
    checks.refuse("lira_pool", f"at most the {rest.size} test examples "
                  f"outside the holdout of {np.size(holdout)} (and 2 at "
                  "least)", max(2, want), "lower the holdout or the pool")
  return np.sort(rng.choice(rest, size=want, replace=False))


def nonmember_parts(holdout_y: np.ndarray, data: ClientData,
                    rng: np.random.Generator) -> list[np.ndarray]:
  """Each client's non-members: indices into the holdout in its label mix.

  For each class ``k`` with ``n_k`` client examples it gets ``min(n_k,
  H_k)`` of the holdout's ``H_k`` examples of ``k``, without replacement;
  clients draw independently, so two may share a non-member.

  Args:
    holdout_y: ``[H]`` the holdout's labels.
    data: the clients' data (host or device).
    rng: the draw.

  Returns:
    ``C`` sorted index arrays into the holdout.

  Raises:
    fedjax_dd.core.checks.SettingError: a client none of whose classes
      occurs in the holdout (no non-member to compare with).
  """
  y = np.asarray(jax.device_get(data.y))
  n = np.asarray(jax.device_get(data.num_examples))
  holdout_y = np.asarray(holdout_y)
  by_class = {int(k): np.flatnonzero(holdout_y == k)
              for k in np.unique(holdout_y)}
  parts = []
  for c in range(y.shape[0]):
    classes, counts = np.unique(y[c, :n[c]], return_counts=True)
    picks = [rng.choice(by_class[int(k)], size=min(int(m), by_class[int(k)]
                                                   .size), replace=False)
             for k, m in zip(classes, counts) if int(k) in by_class]
    part = np.sort(np.concatenate(picks)) if picks else np.zeros(0, np.int64)
    if part.size == 0:
      checks.refuse("holdout", "a slice holding a class of every client",
                    f"no example of client {c}'s classes "
                    f"{classes.tolist()} among {holdout_y.size}",
                    "raise it (0: the whole test split)")
    parts.append(part)
  return parts


def nonmembers(holdout_x: np.ndarray, holdout_y: np.ndarray,
               data: ClientData, rng: np.random.Generator) -> ClientData:
  """:func:`nonmember_parts` stacked as a padded
  :class:`~fedjax_dd.data.stacked.ClientData` (host arrays)."""
  parts = nonmember_parts(holdout_y, data, rng)
  return stack_clients(holdout_x, holdout_y, parts, allow_shared=True)


def _mia_fields(results: Sequence[MIAResult],
                fprs: Sequence[float]) -> dict[str, Any]:
  """Means over clients and per-client arrays of ``MIAResult`` s."""
  auc = [r.auc for r in results]
  tpr = {str(f): [r.tpr_at_fpr[f] for r in results] for f in fprs}
  return {"auc_mean": float(np.mean(auc)),
          "tpr_at_fpr_mean": {f: float(np.mean(v)) for f, v in tpr.items()},
          "auc": auc, "tpr_at_fpr": tpr}


def _host(data: ClientData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  d = jax.device_get(data)
  return np.asarray(d.x), np.asarray(d.y), np.asarray(d.num_examples)


def upload_images(uploads: fedd3_lib.Uploads) -> np.ndarray:
  """``[C, S, H, W, Ch]`` the uploads as the audits compare them: uint8 as
  sent, a float upload's pixels scaled to ``[0, 1]`` (not clipped)."""
  x = np.asarray(uploads.x)
  return x if x.dtype == np.uint8 else (x / 255.0).astype(np.float32)


def sent_labels(uploads: fedd3_lib.Uploads) -> np.ndarray:
  """The labels the server received: learned label rows mapped to
  targets ``[C, S, K]``, else the hard labels ``[C, S]``."""
  y_soft = np.asarray(uploads.y_soft)
  if uploads.learned_labels:
    return np.asarray(kip_lib.labels_to_targets(
        y_soft, centered=uploads.centered_labels), np.float32)
  return np.argmax(y_soft, -1).astype(np.int32)


def ssim_window(image_hw: Sequence[int]) -> int:
  """SSIM's Gaussian window: Wang et al.'s 11, or the largest odd size
  that fits in smaller images (7 for 8 x 8 digits)."""
  size = min(11, *(int(s) for s in image_hw))
  return size if size % 2 else size - 1


def audit_image_uploads(data: ClientData, nonmember_data: ClientData,
                        uploads: fedd3_lib.Uploads, *, num_classes: int,
                        psnr_threshold: float = rc.PSNR_THRESHOLD,
                        fprs: Sequence[float] = FPRS,
                        projection_key: jax.Array | None = None,
                        mapper: ClientMapper | None = None
                        ) -> dict[str, Any]:
  """Every client's image upload audited, batched over clients.

  Clients that uploaded nothing are left out (see ``audited_clients``).

  Args:
    data: the clients' training data, the members.
    nonmember_data: each client's non-members (:func:`nonmembers`).
    uploads: the clients' padded uploads
      (:func:`fedjax_dd.algorithms.fedd3.pad_uploads`).
    num_classes: ``K``.
    psnr_threshold: dB at or above which an image counts as reconstructed.
    fprs: FPRs of the reported TPRs.
    projection_key: the feature space's key (default ``key(0)``).
    mapper: the client-axis backend (default ``ClientMapper()``).

  Returns:
    ``{"kind": "image_uploads", "num_clients", "audited_clients",
    "num_members", "num_nonmembers", "num_uploads", "image_mia_pixels",
    "image_mia_features", "reconstruction", "label_leakage"}``; the MIA
    groups as ``{"auc_mean", "tpr_at_fpr_mean", "auc", "tpr_at_fpr"}``.
  """
  mapper = mapper or ClientMapper()
  x, y, n = _host(data)
  nx, ny, nn = _host(nonmember_data)
  ux, uy_sent = upload_images(uploads), sent_labels(uploads)
  uy = np.argmax(np.asarray(uploads.y_soft), -1).astype(np.int32)
  m = np.asarray(uploads.count, np.int32)
  keep = np.flatnonzero(m > 0)
  x, y, n, nx, ny, nn, ux, uy, uy_sent, m = (
      a[keep] for a in (x, y, n, nx, ny, nn, ux, uy, uy_sent, m))
  key = jax.random.key(0) if projection_key is None else projection_key
  projection = image_mia_lib.random_projection(key, x.shape[2:],
                                               FEATURE_DIM)
  mia = {}
  for name, proj in (("image_mia_pixels", None),
                     ("image_mia_features", projection)):
    mia[name] = _mia_fields(image_mia_lib.image_mia_batched(
        x, y, n, nx, ny, nn, ux, uy, m, projection=proj, fprs=fprs,
        mapper=mapper), fprs)
  window = ssim_window(x.shape[2:4])
  rec = jax.device_get(rc.reconstruction_batched(
      x, n, ux, m, psnr_threshold=psnr_threshold, window=window,
      mapper=mapper))
  psnr, ssim = np.asarray(rec.best_psnr), np.asarray(rec.best_ssim)
  valid = np.arange(psnr.shape[1])[None, :] < n[:, None]
  per = lambda fn, a: [float(fn(a[i][valid[i]])) for i in range(len(keep))]
  copies = per(lambda v: np.mean(np.isposinf(v)), psnr)
  fraction = np.asarray(rec.fraction_above, np.float64).tolist()
  tv = np.asarray(rc.label_leakage_batched(uy_sent, m, y, n, num_classes,
                                           mapper=mapper),
                  np.float64).tolist()
  return {
      "kind": "image_uploads",
      "num_clients": int(np.asarray(uploads.count).shape[0]),
      "audited_clients": keep.tolist(),
      "num_members": n.tolist(), "num_nonmembers": nn.tolist(),
      "num_uploads": m.tolist(),
      **mia,
      "reconstruction": {
          "psnr_threshold": float(psnr_threshold),
          "ssim_window": window,
          "fraction_above_mean": float(np.mean(fraction)),
          "exact_copy_fraction_mean": float(np.mean(copies)),
          "best_psnr_median_mean": float(np.mean(per(np.median, psnr))),
          "best_ssim_mean": float(np.mean(per(np.mean, ssim))),
          "fraction_above": fraction,
          "exact_copy_fraction": copies,
          "best_psnr_max": per(np.max, psnr),
          "best_psnr_median": per(np.median, psnr),
          "best_ssim_max": per(np.max, ssim),
          "best_ssim_client_mean": per(np.mean, ssim),
      },
      "label_leakage": {"tv_mean": float(np.mean(tv)), "tv": tv},
  }


def audit_global_model(task: Classifier, params: Any, batch_stats: Any,
                       data: ClientData, nonmember_data: ClientData, *,
                       fprs: Sequence[float] = FPRS,
                       mapper: ClientMapper | None = None) -> dict[str, Any]:
  """The loss-threshold attack (Yeom et al. 2018) on one global model
  against every client's training data, batched over clients.

  Args:
    task: the classifier.
    params: the global model's parameters.
    batch_stats: its BatchNorm statistics (``{}`` without BN).
    data: the clients' training data, the members.
    nonmember_data: each client's non-members (:func:`nonmembers`).
    fprs: FPRs of the reported TPRs.
    mapper: the client-axis backend (default ``ClientMapper()``).

  Returns:
    ``{"kind": "global_model", "num_clients", "num_members",
    "num_nonmembers", "model_mia_loss": {"auc_mean", "tpr_at_fpr_mean",
    "auc", "tpr_at_fpr"}}``.
  """
  x, y, n = _host(data)
  nx, ny, nn = _host(nonmember_data)
  results = model_mia_lib.loss_threshold_mia_batched(
      task, params, batch_stats, x, y, n, nx, ny, nn, shared_model=True,
      fprs=fprs, mapper=mapper)
  return {"kind": "global_model", "num_clients": int(x.shape[0]),
          "num_members": n.tolist(), "num_nonmembers": nn.tolist(),
          "model_mia_loss": _mia_fields(results, fprs)}


def _model_audit(task: Classifier, params: Any, batch_stats: Any,
                 ids: np.ndarray, host: tuple, probe_x: Any, fprs, mapper,
                 shadows=None):
  """Loss threshold, label leakage and (with ``shadows``) offline LiRA of
  the models ``[m, ...]`` of clients ``ids``, each on its own data."""
  (x, y, n), (nx, ny, nn) = host
  args = (x[ids], y[ids], n[ids], nx[ids], ny[ids], nn[ids])
  loss = model_mia_lib.loss_threshold_mia_batched(
      task, params, batch_stats, *args, fprs=fprs, mapper=mapper)
  tv = np.asarray(rc.model_label_leakage_batched(
      task, params, batch_stats, probe_x, y[ids], n[ids], mapper=mapper))
  lira = None if shadows is None else model_mia_lib.lira_mia_batched(
      task, params, batch_stats, shadows, *args, fprs=fprs, mapper=mapper)
  return loss, tv, lira


def _client_model_summary(num: int, host: tuple, parts, fprs
                          ) -> dict[str, Any]:
  """Per-client results of :func:`_model_audit` over ``parts`` (``(ids,
  (loss, tv, lira))`` per architecture group) in client order."""
  loss: list[Any] = [None] * num
  lira: list[Any] = [None] * num
  tv = np.zeros(num)
  for ids, (group_loss, group_tv, group_lira) in parts:
    for j, k in enumerate(ids):
      loss[k] = group_loss[j]
      if group_lira is not None:
        lira[k] = group_lira[j]
    tv[ids] = group_tv
  (_, _, n), (_, _, nn) = host
  out = {"kind": "client_models", "num_clients": num,
         "num_members": n.tolist(), "num_nonmembers": nn.tolist(),
         "model_mia_loss": _mia_fields(loss, fprs),
         "label_leakage": {"tv_mean": float(np.mean(tv)), "tv": tv.tolist()}}
  if lira[0] is not None:
    out["model_mia_lira"] = _mia_fields(lira, fprs)
  return out


def audit_client_models(groups: Sequence[Any], teachers: Any,
                        data: ClientData, nonmember_data: ClientData,
                        probe_x: Any, *, fprs: Sequence[float] = FPRS,
                        mapper: ClientMapper | None = None,
                        shadows: Sequence[Any] | None = None
                        ) -> dict[str, Any]:
  """What each client's uploaded model reveals to the server: the
  loss-threshold attack (Yeom et al. 2018) of its model on its own data
  against its non-members, and the model's label leakage
  (:func:`fedjax_dd.audit.reconstruction.model_label_leakage_batched`).

  Args:
    groups: the clients' architecture groups
      (:class:`fedjax_dd.distill.ensemble.TeacherGroup`: ``task`` and
      ``client_ids``).
    teachers: the uploads (:class:`fedjax_dd.core.algorithm.Teachers`), per
      group ``(params, batch_stats)`` stacked ``[m_g, ...]`` in the order of
      the group's client ids.
    data: every client's training data, the members.
    nonmember_data: each client's non-members (:func:`nonmembers`).
    probe_x: the attacker's images ``[P, H, W, Ch]`` (uint8, as the task's
      ``preprocess`` takes them).
    fprs: FPRs of the reported TPRs.
    mapper: the client-axis backend (default ``ClientMapper()``).
    shadows: per group, offline LiRA's OUT shadows of its architecture
      (:func:`fedjax_dd.audit.model_mia.train_shadows`); ``None``: no LiRA.

  Returns:
    ``{"kind": "client_models", "num_clients", "num_members",
    "num_nonmembers", "model_mia_loss": {"auc_mean", "tpr_at_fpr_mean",
    "auc", "tpr_at_fpr"}, "label_leakage": {"tv_mean", "tv"}}``, the
    per-client lists in client order, and ``"model_mia_lira"`` (as
    ``"model_mia_loss"``) with ``shadows``.
  """
  host = (_host(data), _host(nonmember_data))
  shadows = shadows or (None,) * len(groups)
  parts = []
  for g, (params, batch_stats), sh in zip(groups, teachers.vars, shadows):
    ids = np.asarray(g.client_ids, np.int64)
    parts.append((ids, _model_audit(g.task, params, batch_stats, ids, host,
                                    probe_x, fprs, mapper, sh)))
  return _client_model_summary(host[0][0].shape[0], host, parts, fprs)


def audit_client_uploads(task: Classifier, params: Any, batch_stats: Any,
                         data: ClientData, nonmember_data: ClientData,
                         probe_x: Any, *, fprs: Sequence[float] = FPRS,
                         mapper: ClientMapper | None = None,
                         shadows: Any = None) -> dict[str, Any]:
  """:func:`audit_client_models` of one architecture's uploads, leaves
  ``[C, ...]`` in client order (:func:`client_uploads`)."""
  host = (_host(data), _host(nonmember_data))
  ids = np.arange(host[0][0].shape[0])
  parts = [(ids, _model_audit(task, params, batch_stats, ids, host, probe_x,
                              fprs, mapper, shadows))]
  return _client_model_summary(ids.size, host, parts, fprs)


def audit_soft_labels(soft_labels: Any, data: ClientData, *,
                      num_classes: int,
                      mapper: ClientMapper | None = None) -> dict[str, Any]:
  """The label leakage of soft-label uploads (HFLDD Eq. 4), per client
  (:func:`fedjax_dd.audit.reconstruction.label_leakage_batched`).

  Args:
    soft_labels: ``[C, M, K]`` each client's probability rows on the ``M``
      public images.
    data: the clients' training data.
    num_classes: ``K``.
    mapper: the client-axis backend (default ``ClientMapper()``).

  Returns:
    ``{"label_leakage": {"tv_mean", "tv"}}``, ``tv`` in client order.
  """
  _, y, n = _host(data)
  s = np.asarray(soft_labels, np.float32)
  if s.ndim != 3 or s.shape[0] != y.shape[0] or s.shape[2] != num_classes:
    checks.refuse("soft_labels", f"probability rows [C={y.shape[0]}, M, "
                  f"K={num_classes}]", s.shape)
  tv = np.asarray(rc.label_leakage_batched(
      s, np.full(s.shape[0], s.shape[1], np.int32), y, n, num_classes,
      mapper=mapper)).tolist()
  return {"label_leakage": {"tv_mean": float(np.mean(tv)), "tv": tv}}


def client_uploads(training: LocalTraining, params: Any, batch_stats: Any,
                   data: ClientData, num_steps: Any, key: jax.Array, *,
                   round_index: int = 0) -> tuple[Any, Any]:
  """The model each client uploads after FedAvg's local training
  (McMahan et al. 2017, Alg. 1, ClientUpdate) from ``(params,
  batch_stats)``: ``num_steps [C]`` steps of ``training``, client ``i``'s
  batches from :func:`fedjax_dd.core.keys.client_keys`.

  Returns:
    ``(params, batch_stats)`` with leaves ``[C, ...]``.
  """
  ids = jnp.arange(np.shape(data.num_examples)[0], dtype=jnp.int32)
  cohort = Cohort(x=data.x, y=data.y, num_examples=data.num_examples,
                  num_steps=jnp.asarray(num_steps, jnp.int32),
                  client_ids=ids, round=jnp.int32(round_index))
  train = client_stage(make_local_update(training), training.mapper)
  result = train(params, batch_stats, (), cohort,
                 keys_lib.client_keys(key, ids))
  return result.params, result.batch_stats


def audit_global_lira(task: Classifier, params: Any, batch_stats: Any,
                      shadows: Any, data: ClientData,
                      nonmember_data: ClientData, *,
                      fprs: Sequence[float] = FPRS,
                      mapper: ClientMapper | None = None) -> dict[str, Any]:
  """Offline LiRA (Carlini et al. 2022) on one global model against every
  client's training data: :func:`audit_global_model`'s fields, scored by
  :func:`fedjax_dd.audit.model_mia.lira_mia_batched` with ``shadows``."""
  x, y, n = _host(data)
  nx, ny, nn = _host(nonmember_data)
  results = model_mia_lib.lira_mia_batched(
      task, params, batch_stats, shadows, x, y, n, nx, ny, nn,
      shared_model=True, fprs=fprs, mapper=mapper)
  return _mia_fields(results, fprs)


def load_uploads(cache_workdir: str | os.PathLike,
                 fingerprint: Mapping[str, Any], num_clients: int
                 ) -> fedd3_lib.Uploads:
  """FedD3's clients' uploads from a workdir's stage cache, padded.

  Args:
    cache_workdir: the workdir whose ``stages/`` holds the distilled set
      (a run's own, or the one its ``fedd3.distilled_from`` names).
    fingerprint: the run's distillation fingerprint; a set distilled under
      another is refused.
    num_clients: ``C``.

  Raises:
    FileNotFoundError: the cache holds no distilled set.
    fedjax_dd.core.stage_cache.StaleStageError: it was distilled under
      another fingerprint.
  """
  cache = StageCache.for_workdir(cache_workdir)
  stage = cache.load(fedd3_stages.STAGE, fingerprint)
  if stage is None:
    raise FileNotFoundError(
        f"{cache.path(fedd3_stages.STAGE)} holds no distilled set (the "
        "uploads of a FedD3 run); audit a FedD3 workdir whose run finished "
        "its client stage.")
  distilled = fedd3_lib.DistilledSet.from_arrays(
      stage.arrays, learned_labels=stage.info["learned_labels"],
      centered_labels=stage.info["centered_labels"])
  size = max(1, int(np.bincount(np.asarray(distilled.owner, np.int64),
                                minlength=num_clients).max(initial=0)))
  return fedd3_lib.pad_uploads(distilled, num_clients, size)


def load_global_model(workdir: str | os.PathLike, template: Any
                      ) -> tuple[Any, Any, int]:
  """The newest good checkpoint of a rounds run:
  ``(params, batch_stats, rounds done)``.

  Args:
    workdir: the run's directory (``checkpoints/`` under it).
    template: the run's initial
      :class:`~fedjax_dd.core.algorithm.ExperimentState`
      (:func:`fedjax_dd.core.fit.initial_state`).

  Raises:
    FileNotFoundError: no checkpoint passes the integrity check.
  """
  directory = os.path.join(os.fspath(workdir), "checkpoints")
  restored = None
  if os.path.isdir(directory):
    with CheckpointStore(directory, max_to_keep=None) as store:
      restored = store.restore(template)
  if restored is None:
    raise FileNotFoundError(
        f"{directory} holds no checkpoint of a finished round; audit a "
        "workdir whose run checkpointed its global model.")
  step, state, _ = restored
  return state.server.params, state.server.batch_stats, int(step)


def headline(summary: Mapping[str, Any]) -> dict[str, Any]:
  """The few figures of an audit summary that go into ``summary.json``
  (a rounds run's client uploads under ``client_uploads_*``)."""
  out: dict[str, Any] = {"file": AUDIT_FILE, "kind": summary["kind"]}
  for group in ("image_mia_pixels", "image_mia_features", "model_mia_loss",
                "model_mia_lira", "global_model_mia_loss",
                "global_model_mia_lira"):
    if group in summary:
      out[f"{group}_auc"] = summary[group]["auc_mean"]
      for f, v in summary[group]["tpr_at_fpr_mean"].items():
        out[f"{group}_tpr_at_fpr_{f}"] = v
  if "reconstruction" in summary:
    r = summary["reconstruction"]
    out["reconstructed_fraction"] = r["fraction_above_mean"]
    out["exact_copy_fraction"] = r["exact_copy_fraction_mean"]
    out["best_ssim_mean"] = r["best_ssim_mean"]
  if "label_leakage" in summary:
    out["label_tv"] = summary["label_leakage"]["tv_mean"]
  if "soft_labels" in summary:
    out["soft_label_tv"] = summary["soft_labels"]["label_leakage"]["tv_mean"]
  if "client_uploads" in summary:
    inner = headline({"kind": "", **summary["client_uploads"]})
    out.update({f"client_uploads_{k}": v for k, v in inner.items()
                if k not in ("file", "kind")})
  return out


def write_audit(workdir: str | os.PathLike, summary: Mapping[str, Any]
                ) -> str:
  """Writes ``summary`` (non-finite numbers as strings, ``"inf"``) to
  ``WORKDIR/audit.json``; returns the path."""
  path = os.path.join(os.fspath(workdir), AUDIT_FILE)
  write_json(path, to_jsonable(dict(summary)))
  return path


__all__ = ["AUDIT_FILE", "FEATURE_DIM", "audit_client_models",
           "audit_client_uploads", "audit_global_lira", "audit_global_model",
           "audit_soft_labels", "check_lira", "client_uploads",
           "audit_image_uploads", "check_settings", "headline",
           "holdout_indices", "load_global_model", "load_uploads",
           "shadow_pool_indices",
           "nonmember_parts", "nonmembers", "sent_labels", "ssim_window",
           "upload_images", "write_audit"]
