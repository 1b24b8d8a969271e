"""HFLDD stages 1-3 chained on the host, cached, and their report.

Reference: Shi et al., "Dataset Distillation-based Hybrid Federated Learning
on Non-IID Data", 2024 (Alg. 2). :mod:`fedjax_dd.algorithms.hfldd` holds each
stage over explicit arrays; this module chains them the way a run does:

1. :func:`label_knowledge_clusters`: every client pretrains from one init
   and labels ``D_g``, the server computes ``M`` (Eq. 4) and KMeans groups
   the rows of ``M`` into homogeneous clusters (Sec. IV-B);
2. ClusterSampling (Alg. 1) builds the heterogeneous clusters and heads;
3. the members send what a :data:`Sender` makes of their data
   (:func:`kip_sender`, :func:`random_sender`, :func:`raw_sender`), the
   uploads' privacy is measured, and every head builds ``D_h``.

:func:`run_stages` returns them as :class:`Stages`, each stage timed;
:func:`stages_or_load` caches them (stage :data:`STAGE`, no raw image a head
did not receive) so a resumed run does not compute them again;
:func:`stage_fields` reports them after the run.

Host-side (KMeans is scikit-learn), hence apart from
:mod:`fedjax_dd.algorithms.hfldd`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import numpy as np

from fedjax_dd.algorithms import hfldd
from fedjax_dd.cluster import sampling
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import LocalTraining, steps_for
from fedjax_dd.core.stage_cache import (StageCache, StaleStageError,
                                        TreeCheckpoint)
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import kip
from fedjax_dd.distill import soft_labels

STAGE = "hfldd"
"""The name of stages 1-3 in a run's stage cache."""

KIP_STAGE = "hfldd_kip"
"""The members' KIP state between segments in a run's stage cache (while
stage 3 runs; :func:`kip_checkpoint`)."""

Sender = Callable[[ClientData, sampling.Topology],
                  tuple[hfldd.SentData, dict[str, Any]]]
"""``(data, topology) -> (sent, info)``: stage 3's uploads of the members."""


def label_knowledge_clusters(
    training: LocalTraining, params, batch_stats, data: ClientData,
    load_aux: Callable[[], np.ndarray], key: jax.Array, *,
    num_homogeneous: int, kmeans_seed: int, kmeans_n_init: int = 10,
    pretrain_epochs: float = 0.0, pretrain_steps: int = 0
) -> tuple[np.ndarray, dict[str, float], dict[str, Any]]:
  """Label knowledge (Eq. 4) and homogeneous KMeans (Sec. IV-B).

  Args:
    training: the clients' pretraining; its ``max_steps`` is set from the
      step counts below.
    params: the common initial parameters every client pretrains from.
    batch_stats: their BatchNorm statistics.
    data: all clients' data ``[N, N_max, ...]``.
    load_aux: ``() -> D_g`` images ``[M, H, W, Ch]`` uint8 (called here so
      its time counts in the stage).
    key: the pretraining key.
    num_homogeneous: ``K`` clusters.
    kmeans_seed: KMeans' ``random_state``.
    kmeans_n_init: KMeans restarts.
    pretrain_epochs: > 0: pretrain this many local epochs of
      ``training.batch_size`` ...
    pretrain_steps: ... else this many steps.

  Returns:
    ``(homogeneous [N], stage_seconds, info)``; ``info`` holds ``aux_size``,
    ``soft_labels_shape``, ``kl_mean_offdiag`` (mean off-diagonal ``M``)
    and ``soft_labels`` ``[N, M, K]`` (moved to :attr:`Stages.soft_labels`).
  """
  times = {}
  t0 = time.time()
  x_aux = load_aux()
  if pretrain_epochs:
    steps = steps_for(data.num_examples, training.batch_size,
                      epochs=pretrain_epochs)
  else:
    steps = steps_for(data.num_examples, training.batch_size,
                      steps=pretrain_steps)
  s, m, _ = soft_labels.collect_label_knowledge(
      training, params, batch_stats, data, x_aux, steps, key)
  m_host = np.asarray(jax.device_get(m))
  times["label_knowledge"] = time.time() - t0
  t0 = time.time()
  homo = sampling.homogeneous_clusters(m_host, num_homogeneous,
                                       seed=kmeans_seed, n_init=kmeans_n_init)
  times["homogeneous_clustering"] = time.time() - t0
  off_diagonal = max(m_host.size - m_host.shape[0], 1)
  info = {"aux_size": int(x_aux.shape[0]),
          "soft_labels_shape": list(s.shape),
          "kl_mean_offdiag": float(m_host.sum() / off_diagonal),
          "soft_labels": np.asarray(jax.device_get(s), np.float32)}
  return homo, times, info


def kip_sender(key: jax.Array, *, kernel_fn: kip.KernelFn, mean, std,
               num_classes: int, support_size: int,
               options: kip.KipOptions = hfldd.HFLDD_KIP,
               mapper: ClientMapper = ClientMapper(workload="kip"),
               log_progress: bool = False,
               allow_raw_upload: bool = False,
               segment_store: kip.SegmentStore | None = None) -> Sender:
  """Members distil ``support_size`` images each with the batched KIP
  (:func:`fedjax_dd.algorithms.hfldd.distill_members`, which documents the
  arguments; ``segment_store`` e.g. :func:`kip_checkpoint`).

  ``info`` reports the members, support size, iterations, final target
  accuracy and :func:`fedjax_dd.distill.kip.loss_summary`.
  """
  progress = None
  if log_progress:
    counter = loop_lib.progress_counter(options.max_iterations,
                                        "KIP (members) iteration")
    progress = lambda done, converged: counter(done, converged=converged)

  def send(data, topology):
    sent, res = hfldd.distill_members(
        key, data, topology, kernel_fn=kernel_fn, mean=mean, std=std,
        num_classes=num_classes, support_size=support_size, options=options,
        mapper=mapper, progress=progress, allow_raw_upload=allow_raw_upload,
        segment_store=segment_store)
    return sent, {
        "kip_members": int(sent.senders.size),
        "kip_support_size": int(sent.x.shape[1]),
        "kip_iterations_mean": float(np.mean(res.iterations)),
        "kip_iterations_max": int(np.max(res.iterations)),
        "kip_final_accuracy_mean": float(np.mean(res.accuracy)),
        "kip_loss": kip.loss_summary(res.iterations, res.first_loss,
                                     res.loss),
    }

  return send


def kip_checkpoint(cache: StageCache, fingerprint: dict[str, Any], *,
                   every: int = 1) -> TreeCheckpoint:
  """The members' KIP state between segments, entry :data:`KIP_STAGE` of
  ``cache`` under the stages' ``fingerprint`` (a state saved under another
  is refused, as the stages are): pass it to :func:`kip_sender` and to
  :func:`stages_or_load`, which removes it once the stages are cached.
  ``every``: save every ``every``-th segment. It holds each member's
  unsent, part-distilled support and Adam's moments over it.
  """
  return TreeCheckpoint(cache, KIP_STAGE, fingerprint, every=every)


def random_sender(*, num_classes: int, sample_size: int,
                  rng: np.random.Generator) -> Sender:
  """Members send ``sample_size`` random raw samples (the control,
  :func:`fedjax_dd.algorithms.hfldd.random_members`)."""
  return lambda data, topology: (hfldd.random_members(
      data, topology, num_classes=num_classes, sample_size=sample_size,
      rng=rng), {})


def raw_sender(*, num_classes: int) -> Sender:
  """Members send all their raw data (the "w/o DD" ablation, Fig. 5)."""
  return lambda data, topology: (hfldd.raw_members(
      data, topology, num_classes=num_classes), {})


@dataclasses.dataclass(frozen=True)
class Stages:
  """HFLDD's stages 1-3 (host arrays).

  Attributes:
    topology: homogeneous and heterogeneous clusters, heads.
    counts: ``[M]`` samples each member sent (``|D~_i|``).
    hybrid: the heads' ``D_h``: ``x [H, D_max, H, W, Ch]`` uint8, ``y
      [H, D_max, K]`` targets, ``num_examples [H]``.
    sent: the members' uploads (what :func:`stages_or_load` caches).
    soft_labels: ``[N, M, K]`` every client's soft labels on ``D_g`` (its
      Eq. 4 upload); ``None`` if the cache or ``cluster`` lacks them.
    times: seconds per stage.
    info: the stages' statistics (label knowledge, KIP, ``privacy``).
    cached: whether they came from the stage cache.
  """
  topology: sampling.Topology
  counts: np.ndarray
  hybrid: ClientData
  times: dict[str, float]
  info: dict[str, Any]
  cached: bool = False
  sent: hfldd.SentData | None = None
  soft_labels: np.ndarray | None = None

  @property
  def pixels_per_sample(self) -> int:
    """``H * W * Ch`` of one image."""
    return int(np.prod(np.shape(self.hybrid.x)[2:]))

  @property
  def distilled_samples(self) -> int:
    """``sum_i |D~_i|``: every sample the members sent."""
    return int(np.sum(self.counts))


def run_stages(data: ClientData, *, num_classes: int,
               cluster: Callable[[], tuple[np.ndarray, dict[str, float],
                                           dict[str, Any]]],
               send: Sender, topology_rng: np.random.Generator) -> Stages:
  """Stages 1-3: clusters, heads, the members' uploads and the heads' data.

  Args:
    data: all clients' data ``[N, N_max, ...]``.
    num_classes: ``N_c``.
    cluster: ``() -> (homogeneous [N], seconds, info)``, e.g.
      :func:`label_knowledge_clusters` with its arguments bound.
    send: the members' uploads (:func:`kip_sender`, :func:`random_sender`,
      :func:`raw_sender`).
    topology_rng: ClusterSampling's draws.
  """
  homo, times, info = cluster()
  soft = info.pop("soft_labels", None)  # an array: the cache, not the JSON
  t0 = time.time()
  topology = sampling.build_topology(homo, topology_rng)
  times["cluster_sampling"] = time.time() - t0
  t0 = time.time()
  sent, gen_info = send(data, topology)
  times["dataset_generation"] = time.time() - t0
  t0 = time.time()
  # The stage cache stores exactly these uploads: every image in the workdir.
  gen_info["privacy"] = dict(hfldd.sent_privacy(data, sent),
                             stored_in_workdir=int(np.sum(sent.mask)))
  times["privacy"] = time.time() - t0
  hybrid = hfldd.build_hybrid_data(data, topology, sent,
                                   num_classes=num_classes)
  return Stages(topology=topology, counts=sent.counts, hybrid=hybrid,
                times=times, info={**info, **gen_info}, sent=sent,
                soft_labels=soft)


def stages_or_load(cache: StageCache, fingerprint: dict[str, Any],
                   compute: Callable[[], Stages], *, data: ClientData,
                   num_classes: int,
                   in_progress: TreeCheckpoint | None = None) -> Stages:
  """Stages 1-3 from ``cache`` (stage :data:`STAGE`), or computed and saved.

  The cache keeps what the server and heads received (topology, uploads,
  soft labels); ``D_h`` is rebuilt from them and ``data``, so no head's raw
  data is written to the workdir.

  Args:
    cache: the run's stage cache.
    fingerprint: the settings the stages depend on.
    compute: ``() -> Stages`` (:func:`run_stages` with its arguments).
    data: all clients' data ``[N, N_max, ...]`` (the heads' own rows).
    num_classes: ``N_c``.
    in_progress: the members' KIP checkpoint (:func:`kip_checkpoint`),
      removed once the stages are cached (or found cached).

  Raises:
    fedjax_dd.core.stage_cache.StaleStageError: the cache holds stages
      computed under another ``fingerprint``.
  """
  fresh = []  # the computed stages: their D_h is not built a second time

  def arrays_and_info():
    s = compute()
    fresh.append(s)
    if s.sent is None:
      raise ValueError("stages_or_load: the computed Stages carry no `sent` "
                       "uploads to cache (run_stages sets them).")
    return ({"homogeneous": s.topology.homogeneous,
             "heterogeneous": s.topology.heterogeneous,
             "heads": s.topology.heads, "counts": s.counts,
             "sent_x": s.sent.x, "sent_y": s.sent.y,
             "sent_mask": s.sent.mask, "senders": s.sent.senders,
             **({} if s.soft_labels is None
                else {"soft_labels": s.soft_labels})},
            {"times": s.times, "info": s.info})

  stage, computed = cache.get_or_compute(STAGE, fingerprint, arrays_and_info)
  if in_progress is not None:
    in_progress.clear()  # superseded by the cached stages
  if computed:
    return fresh[0]
  a = stage.arrays
  topology = sampling.Topology(homogeneous=a["homogeneous"],
                               heterogeneous=a["heterogeneous"],
                               heads=a["heads"])
  if "sent_x" not in a:
    # An old-format cache holds each head's D_h, raw images included.
    raise StaleStageError(
        f"{cache.path(STAGE)} was written by an older fedjax-dd and holds "
        "the heads' own raw images; delete that directory to have the "
        "stages computed again (the settings are unchanged).")
  sent = hfldd.SentData(x=a["sent_x"], y=a["sent_y"],
                        mask=np.asarray(a["sent_mask"], bool),
                        senders=a["senders"])
  hybrid = hfldd.build_hybrid_data(jax.device_get(data), topology, sent,
                                   num_classes=num_classes)
  return Stages(topology=topology, counts=a["counts"], hybrid=hybrid,
                times=stage.info["times"], info=stage.info["info"],
                cached=not computed, sent=sent,
                soft_labels=a.get("soft_labels"))


def stage_fields(stages: Stages, *, aux_size: int, num_classes: int,
                 member_data: str, num_params: int, rounds: int,
                 bytes_by_tag: dict[str, Any], training_seconds: float,
                 topology_figure_path: str) -> dict[str, Any]:
  """HFLDD's own fields of a finished run's summary (``topology_figure_path``:
  the caller's :func:`fedjax_dd.utils.figures.plot_topology`).

  ``stage_seconds`` adds ``training`` (the rounds' seconds) to the stages';
  ``eq18_bytes`` is :func:`fedjax_dd.algorithms.hfldd.eq18_bits` in bytes;
  ``sent_label_bytes`` is the ledger's ``distilled_labels`` charge.
  """
  t = stages.topology
  return {
      "num_clients": int(t.num_clients),
      "aux_size": int(aux_size),
      "num_classes": int(num_classes),
      "num_heads": int(t.num_heads),
      "member_data": member_data,
      "distilled_samples_total": stages.distilled_samples,
      "pixels_per_sample": stages.pixels_per_sample,
      "sent_label_bytes": bytes_by_tag.get("distilled_labels", 0),
      "privacy": stages.info.get("privacy"),
      "kip_loss": stages.info.get("kip_loss"),
      "head_dataset_sizes": np.asarray(stages.hybrid.num_examples).tolist(),
      "eq18_bytes": ledger_lib.bits_to_bytes(hfldd.eq18_bits(
          num_clients=t.num_clients, aux_size=aux_size,
          num_classes=num_classes, distilled_samples=stages.distilled_samples,
          pixels_per_sample=stages.pixels_per_sample, num_heads=t.num_heads,
          num_params=num_params, rounds=rounds)),
      "clusters": t.to_dict(),
      "stage_seconds": {**stages.times, "training": training_seconds},
      "stages_cached": stages.cached,
      "stage_info": stages.info,
      "topology_figure": topology_figure_path,
  }
