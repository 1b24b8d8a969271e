"""Runner ``"hfldd"``: HFLDD end to end (and its "w/o DD" ablation).

Stages (HFLDD Alg. 2, Shi et al. 2024), each timed in ``summary.json``:

1. ``label_knowledge``: all clients pretrain from one init, label ``D_g``,
   the server computes ``M`` (Eq. 4);
2. ``clustering``: KMeans on ``M`` and ClusterSampling (Alg. 1);
3. ``dataset_generation``: what members send is ``config.hfldd.member_data``:
   ``"kip"`` (distilled with the batched KIP for a fixed budget of
   ``config.kip.max_iterations``), ``"random"`` (``config.hfldd.support_size``
   random raw samples, the control) or ``"raw"`` (all raw data, the "w/o DD"
   ablation); heads build ``D_h``;
4. ``training``: FedAvg among the heads through the shared rounds loop
   (``config.client.local_steps`` or ``client.local_epochs`` per head and
   round).

``summary.json`` also holds ``privacy`` (the members' uploads against their
own raw images, :func:`fedjax_dd.algorithms.hfldd.sent_privacy`) and, for
KIP, ``kip_loss`` (first / last iteration, min and median over members).

Stages 1-3 are deterministic given the seeds and are cached as the stage
``"hfldd"`` of the run's :class:`~fedjax_dd.core.stage_cache.StageCache`
(``WORKDIR/stages``; its fingerprint is the flattened config without the keys in
:data:`NOT_STAGE_KEYS`); a resumed run loads them and continues the rounds from
the newest checkpoint. A cache written under other settings is refused with the
differing fields.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_dd.cluster import sampling as clustering
from fedjax_dd.algorithms import hfldd
from fedjax_dd.core import keys
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core.local import steps_for
from fedjax_dd.core.stage_cache import StageCache
from fedjax_dd.data import sources
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import kip
from fedjax_dd.distill import soft_labels
from fedjax_dd.experiments import common
from fedjax_dd.experiments import runners
from fedjax_dd.experiments.configs.hfldd import MEMBER_DATA
from fedjax_dd.utils import figures

_log = logging.getLogger(__name__)

STAGE = "hfldd"


def aux_images(config: ml_collections.ConfigDict,
               input_shape: tuple[int, int, int]) -> np.ndarray:
  """``D_g``: ``config.data.aux_size`` unlabelled images in the model's
  shape."""
  rng = keys.numpy_stream(config.data.seed, keys.Stream.AUX_DATA)
  x = sources.load_unlabeled(config.data.aux_dataset, num=config.data.aux_size,
                             rng=rng, data_dir=common.data_dir(config))
  return common.resize(config, x, input_shape)


def label_knowledge_clusters(config: ml_collections.ConfigDict,
                             prepared: common.Prepared, data: ClientData,
                             params, batch_stats, root: jax.Array
                             ) -> tuple[np.ndarray, dict[str, float], dict[str, Any]]:
  """Stages 1-2 shared by HFLDD and FedSeq's similarity grouping.

  Pre-training draws from ``stage_key(root, Stage.PRETRAIN)``.

  Returns:
    ``(homogeneous [N], stage_seconds, info)``.
  """
  times = {}
  t0 = time.time()
  x_aux = aux_images(config, prepared.task.input_shape)
  c = config.client
  if c.pretrain_epochs:
    steps = steps_for(data.num_examples, c.pretrain_batch_size,
                      epochs=c.pretrain_epochs)
  else:
    steps = steps_for(data.num_examples, c.pretrain_batch_size,
                      steps=c.pretrain_steps)
  s, m, _ = soft_labels.collect_label_knowledge(
      prepared.task, params, batch_stats, data, x_aux, steps,
      keys.stage_key(root, keys.Stage.PRETRAIN),
      optimizer=common.make_optimizer(config),
      batch_size=c.pretrain_batch_size, mapper=common.mapper(config))
  m_host = np.asarray(jax.device_get(m))
  times["label_knowledge"] = time.time() - t0
  t0 = time.time()
  homo = clustering.homogeneous_clusters(
      m_host, config.hfldd.num_homogeneous, seed=config.seed,
      n_init=config.hfldd.kmeans_n_init)
  times["homogeneous_clustering"] = time.time() - t0
  info = {"aux_size": int(x_aux.shape[0]),
          "soft_labels_shape": list(s.shape),
          "kl_mean_offdiag": float(m_host.sum() / max(m_host.size - m_host.shape[0], 1))}
  return homo, times, info


def _stages(config, prepared, data, params, batch_stats, root):
  """Stages 1-3: topology, the members' transmissions and the heads' data."""
  ds = prepared.dataset
  homo, times, info = label_knowledge_clusters(
      config, prepared, data, params, batch_stats, root)
  t0 = time.time()
  topo = clustering.build_topology(
      homo, keys.numpy_stream(config.seed, keys.Stream.TOPOLOGY))
  times["cluster_sampling"] = time.time() - t0
  t0 = time.time()
  gen_info = {}
  mode = config.hfldd.member_data
  if mode == "kip":
    options = common.kip_options(config)
    progress = None
    if config.run.progress:
      progress = lambda done, _: _log.info("KIP: %d / %d iterations", done,
                                           options.max_iterations)
    sent, res = hfldd.distill_members(
        keys.stage_key(root, keys.Stage.DISTILL), data, topo,
        kernel_fn=common.kip_kernel(config), mean=prepared.mean,
        std=prepared.std, num_classes=ds.num_classes,
        support_size=config.hfldd.support_size, options=options,
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
        sample_size=config.hfldd.support_size,
        rng=keys.numpy_stream(config.seed, keys.Stream.RANDOM_MEMBERS))
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

  ``config.hfldd.sent_label_bits >= 0`` is used as given; ``-1`` (default)
  counts what is transmitted: :data:`~fedjax_dd.core.ledger.BITS_PER_SOFT_LABEL`
  for learned KIP labels, else 0 (fixed labels are implied by the class, as in
  Eq. 18).
  """
  bits = int(config.hfldd.sent_label_bits)
  if bits >= 0:
    return bits
  learned = config.hfldd.member_data == "kip" and config.kip.learn_labels
  return ledger_lib.BITS_PER_SOFT_LABEL if learned else 0


# Config keys (dotted paths; a group stands for all its keys) that do not
# change stages 1-3 (a cached run may alter them): the rounds, the ``run``
# group (evaluation, checkpoints, logging, time budget), the ``engine``, the
# heads' local training (client.batch_size, client.local_*; pre-training has
# its own keys), client sampling, the summary's GCE, the label bits
# charged, which implementation computes the (same) KIP kernel and how the
# models' convolutions are computed (equal to rounding).
NOT_STAGE_KEYS = ("rounds", "run", "engine", "kip.kernel_impl",
                  "model.conv_impl",
                  "client.batch_size",
                  "client.local_epochs", "client.local_steps",
                  "client.clients_per_round", "client.client_fraction",
                  "server.initial_model_as_seed", "server.gce_gammas",
                  "paper_departures", "hfldd.sent_label_bits")


def _is_stage_key(path: str) -> bool:
  return not any(path == k or path.startswith(k + ".") for k in NOT_STAGE_KEYS)


def stage_fingerprint(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The settings that determine stages 1-3: the flattened config
  (:func:`~fedjax_dd.experiments.common.flat_config`) without
  :data:`NOT_STAGE_KEYS`."""
  return {k: v for k, v in common.flat_config(config).items()
          if _is_stage_key(k)}


def _stages_or_load(config, workdir, prepared, data, params, batch_stats,
                    root):
  """Stages 1-3 from the stage cache, or computed and cached.

  Returns:
    ``(topology, counts, hybrid, times, info, cached)``.
  """
  def compute():
    topo, counts, hybrid, times, info = _stages(config, prepared, data, params,
                                                batch_stats, root)
    return ({"homogeneous": topo.homogeneous,
             "heterogeneous": topo.heterogeneous, "heads": topo.heads,
             "counts": counts, "x": hybrid.x, "y": hybrid.y,
             "num_examples": hybrid.num_examples},
            {"times": times, "info": info})

  stage, computed = StageCache.for_workdir(workdir).get_or_compute(
      STAGE, stage_fingerprint(config), compute)
  a = stage.arrays
  topo = clustering.Topology(homogeneous=a["homogeneous"],
                             heterogeneous=a["heterogeneous"], heads=a["heads"])
  hybrid = ClientData(x=a["x"], y=a["y"], num_examples=a["num_examples"])
  return (topo, a["counts"], hybrid, stage.info["times"], stage.info["info"],
          not computed)


def setup(config: ml_collections.ConfigDict):
  """Data, partition and the common initial model shared with FedSeq.

  Returns:
    ``(prepared, data, root_key, params, batch_stats)``; the model is
    initialised from ``stage_key(root, Stage.INIT)``.
  """
  prepared = common.load_and_prepare(config)
  parts = common.partition(config, prepared.dataset.y_train)
  data = common.client_data(prepared.dataset, parts)
  root = keys.model_root(config.seed)
  params, batch_stats = prepared.task.init(
      keys.stage_key(root, keys.Stage.INIT))
  return prepared, data, root, params, batch_stats


def heads_data(config: ml_collections.ConfigDict):
  """The heads' training data of an HFLDD run (stages 1-3), computed in memory.

  For measurements of the heads' FedAvg workload (``bench_engine
  --padding``): no workdir, no stage cache.

  Returns:
    ``(prepared, hybrid)``: the prepared dataset and task, and the heads'
    ``ClientData`` ``[H, N_max, ...]`` with their counts.
  """
  prepared, data, root, params, batch_stats = setup(config)
  _, _, hybrid, _, _ = _stages(config, prepared, data, params, batch_stats,
                               root)
  return prepared, hybrid


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs HFLDD (or HFLDD w/o DD) as described by ``config``."""
  start = time.time()
  prepared, data, root, params, batch_stats = setup(config)
  ds, task = prepared.dataset, prepared.task

  topo, counts, hybrid, times, info, cached = _stages_or_load(
      config, workdir, prepared, data, params, batch_stats, root)
  del data

  pixels = int(np.prod(ds.x_train.shape[1:]))
  ledger0 = hfldd.setup_ledger(
      topo, counts, aux_size=config.data.aux_size, num_classes=ds.num_classes,
      pixels_per_sample=pixels, bits_per_sent_label=sent_label_bits(config))

  figure_path = common.workdir_path(workdir, "topology.png")
  figures.plot_topology(topo.homogeneous, topo.heterogeneous, topo.heads,
                        figure_path,
                        title=f"{config.method}: {topo.num_heads} heads")

  t0 = time.time()
  head_steps = common.local_steps(config, hybrid.num_examples)
  algorithm = hfldd.head_training(task, common.make_optimizer(config),
                                  batch_size=config.client.batch_size,
                                  max_steps=int(jnp.max(head_steps)),
                                  mapper=common.mapper(config))
  distilled_total = int(np.sum(counts))

  def finalize(summary: dict[str, Any]) -> dict[str, Any]:
    """HFLDD's figures, which need the finished run's rounds and model."""
    times["training"] = time.time() - t0
    config_dict = summary.pop("config")
    summary.update({
        "num_clients": int(topo.num_clients),
        "aux_size": int(config.data.aux_size),
        "num_classes": int(ds.num_classes),
        "num_heads": int(topo.num_heads),
        "member_data": config.hfldd.member_data,
        "distilled_samples_total": distilled_total,
        "pixels_per_sample": pixels,
        "sent_label_bytes": summary["bytes_by_tag"].get("distilled_labels", 0),
        "privacy": info.get("privacy"),
        "kip_loss": info.get("kip_loss"),
        "head_dataset_sizes": np.asarray(hybrid.num_examples).tolist(),
        "eq18_bytes": ledger_lib.bits_to_bytes(hfldd.eq18_bits(
            num_clients=topo.num_clients, aux_size=config.data.aux_size,
            num_classes=ds.num_classes, distilled_samples=distilled_total,
            pixels_per_sample=pixels, num_heads=topo.num_heads,
            num_params=summary["param_count"], rounds=summary["rounds"])),
        "clusters": topo.to_dict(),
        "stage_seconds": times,
        "stages_cached": cached,
        "stage_info": info,
        "topology_figure": figure_path,
        "config": config_dict,
    })
    return summary

  return runners.train_rounds(
      config, workdir, prepared=prepared, algorithm=algorithm,
      data=jax.device_put(hybrid), num_steps=head_steps, ledger=ledger0,
      start_time=start, initial_model=(params, batch_stats),
      run_key=keys.stage_key(root, keys.Stage.ROUNDS), finalize=finalize)
