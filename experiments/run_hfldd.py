"""Runner ``"hfldd"``: HFLDD end to end (and its "w/o DD" ablation).

Stages (HFLDD Alg. 2, Shi et al. 2024), each timed in ``summary.json``:

1. ``label_knowledge``: all clients pretrain from one init, label ``D_g``,
   the server computes ``M`` (Eq. 4);
2. ``clustering``: KMeans on ``M`` and ClusterSampling (Alg. 1);
3. ``dataset_generation``: what members send is ``config.member_data``:
   ``"kip"`` (distilled with the batched KIP for a fixed budget of
   ``config.kip_iterations``), ``"random"`` (``config.support_size`` random
   raw samples, the control) or ``"raw"`` (all raw data, the "w/o DD"
   ablation); heads build ``D_h``;
4. ``training``: FedAvg among the heads through the shared rounds loop
   (``config.local_steps`` or ``config.local_epochs`` per head and round).

``summary.json`` also holds ``privacy`` (the members' uploads against their
own raw images, :func:`fedjax_dd.algorithms.hfldd.sent_privacy`) and, for
KIP, ``kip_loss`` (first / last iteration, min and median over members).

Stages 1-3 are deterministic given the seeds and are cached in
``WORKDIR/hfldd_stages.npz``; a resumed run loads them and continues the
rounds from the newest checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_dd import clustering
from fedjax_dd.algorithms import hfldd
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core.local import steps_for
from fedjax_dd.core.metrics import write_json
from fedjax_dd.data import preprocess
from fedjax_dd.data import sources
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import kip
from fedjax_dd.distill import soft_labels
from fedjax_dd.experiments import common
from fedjax_dd.experiments import runners
from fedjax_dd.experiments.configs.hfldd import MEMBER_DATA
from fedjax_dd.kernels import ntk
from fedjax_dd.utils import figures

_log = logging.getLogger(__name__)

# Stage keys: fold_in(model_key, STAGE) so stages never share randomness.
_INIT, _PRETRAIN, _KIP, _ROUNDS = 0, 1, 2, 3
# NumPy streams default_rng([seed, STREAM]) (FedSeq's grouping uses 3).
_TOPOLOGY_STREAM, _RANDOM_MEMBERS_STREAM = 2, 4
_STAGES_FILE = "hfldd_stages.npz"

KERNELS = {
    "fc": lambda c: ntk.fc_kernel(depth=c.get("kip_depth", 4)),
    "conv": lambda c: ntk.conv_kernel(depth=c.get("kip_depth", 3)),
}


def aux_images(config: ml_collections.ConfigDict,
               input_shape: tuple[int, int, int]) -> np.ndarray:
  """``D_g``: ``config.aux_size`` unlabelled images in the model's shape."""
  rng = np.random.default_rng([config.data_seed, 1])
  x = sources.load_unlabeled(config.aux_dataset, num=config.aux_size, rng=rng,
                             data_dir=config.get("data_dir") or None)
  if x.shape[1:] != tuple(input_shape):
    x = preprocess.resize_images(x, tuple(input_shape),
                                 method=config.get("resize_method", "bilinear"))
  return x


def label_knowledge_clusters(config: ml_collections.ConfigDict,
                             prepared: common.Prepared, data: ClientData,
                             params, batch_stats, key: jax.Array
                             ) -> tuple[np.ndarray, dict[str, float], dict[str, Any]]:
  """Stages 1-2 shared by HFLDD and FedSeq's similarity grouping.

  Returns:
    ``(homogeneous [N], stage_seconds, info)``.
  """
  times = {}
  t0 = time.time()
  x_aux = aux_images(config, prepared.task.input_shape)
  if config.get("pretrain_epochs"):
    steps = steps_for(data.num_examples, config.pretrain_batch_size,
                      epochs=config.pretrain_epochs)
  else:
    steps = steps_for(data.num_examples, config.pretrain_batch_size,
                      steps=config.pretrain_steps)
  s, m, _ = soft_labels.collect_label_knowledge(
      prepared.task, params, batch_stats, data, x_aux, steps, key,
      optimizer=common.make_optimizer(config),
      batch_size=config.pretrain_batch_size, mapper=common.mapper(config))
  m_host = np.asarray(jax.device_get(m))
  times["label_knowledge"] = time.time() - t0
  t0 = time.time()
  homo = clustering.homogeneous_clusters(
      m_host, config.num_homogeneous, seed=config.seed,
      n_init=config.kmeans_n_init)
  times["homogeneous_clustering"] = time.time() - t0
  info = {"aux_size": int(x_aux.shape[0]),
          "soft_labels_shape": list(s.shape),
          "kl_mean_offdiag": float(m_host.sum() / max(m_host.size - m_host.shape[0], 1))}
  return homo, times, info


def _kip_mean_std(ds: sources.Dataset):
  mean, std = preprocess.channel_stats(ds.x_train)
  return np.asarray(mean, np.float32), np.maximum(np.asarray(std, np.float32), 1e-3)


def _stages(config, prepared, data, params, batch_stats, root):
  """Stages 1-3: topology, the members' transmissions and the heads' data."""
  ds = prepared.dataset
  homo, times, info = label_knowledge_clusters(
      config, prepared, data, params, batch_stats,
      jax.random.fold_in(root, _PRETRAIN))
  t0 = time.time()
  topo = clustering.build_topology(
      homo, np.random.default_rng([config.seed, _TOPOLOGY_STREAM]))
  times["cluster_sampling"] = time.time() - t0
  t0 = time.time()
  gen_info = {}
  mode = config.member_data
  if mode == "kip":
    mean, std = _kip_mean_std(ds)
    total = int(config.kip_iterations)
    progress = None
    if config.get("progress", True):
      progress = lambda done, _: _log.info("KIP: %d / %d iterations", done,
                                           total)
    sent, res = hfldd.distill_members(
        jax.random.fold_in(root, _KIP), data, topo,
        kernel_fn=KERNELS[config.kip_kernel](config), mean=mean, std=std,
        num_classes=ds.num_classes, support_size=config.support_size,
        lr=config.kip_lr, max_iterations=total,
        target_batch_size=config.kip_target_batch_size, reg=config.kip_reg,
        learn_labels=config.kip_learn_labels,
        centered_labels=config.kip_centered_labels, stop_accuracy=None,
        segment_iterations=config.get("kip_segment_iterations", 100),
        mapper=common.mapper(config, workload="kip"), progress=progress)
    gen_info = {
        "kip_members": int(sent.senders.size),
        "kip_support_size": int(sent.x.shape[1]),
        "kip_iterations_mean": float(np.mean(res.iterations)),
        "kip_iterations_max": int(np.max(res.iterations)),
        "kip_final_accuracy_mean": float(np.mean(res.accuracy)),
        "kip_loss": kip.loss_summary(res.iterations, res.first_loss,
                                     res.loss),
    }
  elif mode == "random":
    sent = hfldd.random_members(
        data, topo, num_classes=ds.num_classes,
        sample_size=config.support_size,
        rng=np.random.default_rng([config.seed, _RANDOM_MEMBERS_STREAM]))
  elif mode == "raw":
    sent = hfldd.raw_members(data, topo, num_classes=ds.num_classes)
  else:
    raise ValueError(f"member_data must be one of {MEMBER_DATA}, got "
                     f"{mode!r}.")
  times["dataset_generation"] = time.time() - t0
  t0 = time.time()
  gen_info["privacy"] = hfldd.sent_privacy(data, sent)
  times["privacy"] = time.time() - t0
  hybrid = hfldd.build_hybrid_data(data, topo, sent,
                                   num_classes=ds.num_classes)
  return topo, sent.counts, hybrid, times, {**info, **gen_info}


def sent_label_bits(config: ml_collections.ConfigDict) -> int:
  """Bits charged per label entry of the members' uploads.

  ``config.sent_label_bits >= 0`` is used as given; ``-1`` (default) counts
  what is transmitted: float32 (32 bits) for learned KIP labels, else 0 (fixed
  labels are implied by the class, as in Eq. 18).
  """
  bits = int(config.get("sent_label_bits", -1))
  if bits >= 0:
    return bits
  learned = config.member_data == "kip" and config.kip_learn_labels
  return ledger_lib.BITS_PER_SOFT_LABEL if learned else 0


# Config keys that do not change stages 1-3 (a cached run may alter them).
_NOT_STAGE_KEYS = ("rounds", "max_wall_seconds", "progress", "eval_every",
                   "checkpoint_every", "keep_checkpoints", "backend",
                   "chunk_size", "multihost")


def _stage_fingerprint(config) -> str:
  d = {k: v for k, v in config.to_dict().items() if k not in _NOT_STAGE_KEYS}
  return json.dumps(d, sort_keys=True, default=str)


def _save_stages(path, config, topo, counts, hybrid, times, info):
  meta = {"times": times, "info": info, "config": _stage_fingerprint(config)}
  np.savez(path, homogeneous=topo.homogeneous, heterogeneous=topo.heterogeneous,
           heads=topo.heads, counts=counts, x=hybrid.x, y=hybrid.y,
           num_examples=hybrid.num_examples, meta=np.asarray(json.dumps(meta)))


def _load_stages(path, config):
  with np.load(path) as f:
    meta = json.loads(str(f["meta"]))
    if meta["config"] != _stage_fingerprint(config):
      raise ValueError(
          f"{path} was written by a run with a different configuration; use a "
          "new workdir (only rounds/evaluation/checkpoint options may change "
          "when resuming).")
    topo = clustering.Topology(homogeneous=f["homogeneous"],
                               heterogeneous=f["heterogeneous"],
                               heads=f["heads"])
    hybrid = ClientData(x=f["x"], y=f["y"], num_examples=f["num_examples"])
    return topo, f["counts"], hybrid, meta["times"], meta["info"]


def setup(config: ml_collections.ConfigDict):
  """Data, partition and the common initial model shared with FedSeq.

  Returns:
    ``(prepared, data, root_key, params, batch_stats)``.
  """
  prepared = common.load_and_prepare(config)
  parts = common.partition(config, prepared.dataset.y_train)
  data = common.client_data(prepared.dataset, parts)
  root = common.model_key(config)
  params, batch_stats = prepared.task.init(jax.random.fold_in(root, _INIT))
  return prepared, data, root, params, batch_stats


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs HFLDD (or HFLDD w/o DD) as described by ``config``."""
  start = time.time()
  prepared, data, root, params, batch_stats = setup(config)
  ds, task = prepared.dataset, prepared.task

  stages_path = common.workdir_path(workdir, _STAGES_FILE)
  if os.path.exists(stages_path):
    topo, counts, hybrid, times, info = _load_stages(stages_path, config)
    cached = True
  else:
    cached = False
    topo, counts, hybrid, times, info = _stages(config, prepared, data, params,
                                                batch_stats, root)
    _save_stages(stages_path, config, topo, counts, hybrid, times, info)
  del data

  pixels = int(np.prod(ds.x_train.shape[1:]))
  label_bits = sent_label_bits(config)
  ledger0 = hfldd.setup_ledger(
      topo, counts, aux_size=config.aux_size, num_classes=ds.num_classes,
      pixels_per_sample=pixels, bits_per_sent_label=label_bits)

  figure_path = common.workdir_path(workdir, "topology.png")
  figures.plot_topology(topo.homogeneous, topo.heterogeneous, topo.heads,
                        figure_path,
                        title=f"{config.method}: {topo.num_heads} heads")

  t0 = time.time()
  head_steps = runners.local_steps(config, hybrid.num_examples)
  algorithm = hfldd.head_training(task, common.make_optimizer(config),
                                  batch_size=config.batch_size,
                                  max_steps=int(jnp.max(head_steps)),
                                  mapper=common.mapper(config))
  summary = runners.train_rounds(
      config, workdir, prepared=prepared, algorithm=algorithm,
      data=jax.device_put(hybrid), num_steps=head_steps, ledger=ledger0,
      start_time=start, initial_model=(params, batch_stats),
      run_key=jax.random.fold_in(root, _ROUNDS))
  times["training"] = time.time() - t0
  distilled_total = int(np.sum(counts))
  config_dict = summary.pop("config")
  summary.update({
      "num_clients": int(topo.num_clients),
      "aux_size": int(config.aux_size),
      "num_classes": int(ds.num_classes),
      "num_heads": int(topo.num_heads),
      "member_data": config.member_data,
      "distilled_samples_total": distilled_total,
      "pixels_per_sample": pixels,
      "sent_label_bytes": distilled_total * ds.num_classes * label_bits / 8,
      "privacy": info.get("privacy"),
      "kip_loss": info.get("kip_loss"),
      "head_dataset_sizes": np.asarray(hybrid.num_examples).tolist(),
      "eq18_bytes": hfldd.eq18_bits(
          num_clients=topo.num_clients, aux_size=config.aux_size,
          num_classes=ds.num_classes, distilled_samples=distilled_total,
          pixels_per_sample=pixels, num_heads=topo.num_heads,
          num_params=summary["param_count"], rounds=summary["rounds"]) / 8,
      "clusters": topo.to_dict(),
      "stage_seconds": times,
      "stages_cached": cached,
      "stage_info": info,
      "topology_figure": figure_path,
      "wall_seconds": time.time() - start,
      "config": config_dict,
  })
  write_json(common.workdir_path(workdir, "summary.json"), summary)
  return summary
