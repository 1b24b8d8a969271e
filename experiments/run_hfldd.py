"""Runner ``"hfldd"``: HFLDD end to end (and its "w/o DD" ablation).

Stages (HFLDD Alg. 2, Shi et al. 2024), each timed in ``summary.json``:

1. ``label_knowledge``: all clients pretrain from one init, label ``D_g``,
   the server computes ``M`` (Eq. 4);
2. ``clustering``: KMeans on ``M`` and ClusterSampling (Alg. 1);
3. ``dataset_generation``: members send ``config.hfldd.member_data``
   (:class:`HFLDDOptions`; KIP for a fixed ``kip.max_iterations``); heads
   build ``D_h``;
4. ``training``: FedAvg among the heads through the shared rounds loop.

``summary.json`` also holds ``privacy`` (the members' uploads against their
own raw images, :func:`fedjax_dd.algorithms.hfldd.sent_privacy`) and, for
KIP, ``kip_loss`` (first / last iteration, min and median over members).

Stages 1-3 (:mod:`fedjax_dd.algorithms.hfldd_stages`) are deterministic
given the seeds and cached as stage ``"hfldd"`` of the run's
:class:`~fedjax_dd.core.stage_cache.StageCache` (fingerprint: the config
without the keys marked ``-hfldd_stages`` in
``experiments/configs/base.py``); a resumed run loads them and continues
from the newest checkpoint, and a cache of other settings is refused with
the differing fields. The members' KIP state is saved after each segment
(``WORKDIR/stages/hfldd_kip``), so a run stopped there continues from it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_dd.algorithms import hfldd
from fedjax_dd.algorithms import hfldd_stages
from fedjax_dd.core import checks as core_checks
from fedjax_dd.core import keys
from fedjax_dd.core.stage_cache import StageCache
from fedjax_dd.distill import privacy as privacy_lib
from fedjax_dd.experiments import common
from fedjax_dd.experiments import registry
from fedjax_dd.experiments import runners
from fedjax_dd.experiments.configs.hfldd import MEMBER_DATA
from fedjax_dd.utils import figures


def _sender(config, prepared, root, segment_store=None
            ) -> hfldd_stages.Sender:
  """Stage 3's uploads named by ``config.hfldd.member_data`` (KIP keeps its
  state between segments in ``segment_store`` when given)."""
  h, num_classes = config.hfldd, prepared.dataset.num_classes
  senders = {
      "kip": lambda: hfldd_stages.kip_sender(
          keys.stage_key(root, keys.Stage.DISTILL),
          kernel_fn=common.kip_kernel(config), mean=prepared.mean,
          std=prepared.std, num_classes=num_classes,
          support_size=h.support_size, options=common.kip_options(config),
          mapper=common.mapper(config, workload="kip"),
          log_progress=config.run.progress,
          allow_raw_upload=h.allow_raw_upload, segment_store=segment_store),
      "random": lambda: hfldd_stages.random_sender(
          num_classes=num_classes, sample_size=h.support_size,
          rng=keys.numpy_stream(config.seed, keys.Stream.RANDOM_MEMBERS)),
      "raw": lambda: hfldd_stages.raw_sender(num_classes=num_classes),
  }
  if h.member_data not in senders:
    raise ValueError(f"member_data must be one of {MEMBER_DATA}, got "
                     f"{h.member_data!r}.")
  return senders[h.member_data]()


def _stages(config, prepared, data, params, batch_stats, root,
            segment_store=None):
  """Stages 1-3 computed in memory."""
  return hfldd_stages.run_stages(
      data, num_classes=prepared.dataset.num_classes,
      cluster=lambda: common.label_knowledge_clusters(
          config, prepared, data, params, batch_stats, root),
      send=_sender(config, prepared, root, segment_store),
      topology_rng=keys.numpy_stream(config.seed, keys.Stream.TOPOLOGY))


def sent_label_bits(config: ml_collections.ConfigDict) -> int:
  """:func:`fedjax_dd.algorithms.hfldd.sent_label_bits` of the config."""
  return hfldd.sent_label_bits(
      config.hfldd.sent_label_bits,
      learned_labels=(config.hfldd.member_data == "kip"
                      and config.kip.learn_labels))


def heads_data(config: ml_collections.ConfigDict):
  """The heads' training data of an HFLDD run (stages 1-3), computed in
  memory without a workdir or stage cache (``bench_engine --padding``).

  Returns:
    ``(prepared, hybrid)``: the prepared dataset and task, and the heads'
    ``ClientData`` ``[H, N_max, ...]`` with their counts.
  """
  prepared, data, root, params, batch_stats = common.initialised_clients(
      config)
  return prepared, _stages(config, prepared, data, params, batch_stats,
                           root).hybrid


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs HFLDD (or HFLDD w/o DD) as described by ``config``."""
  start = time.time()
  prepared, data, root, params, batch_stats = common.initialised_clients(
      config)
  cache = StageCache.for_workdir(workdir)
  fingerprint = common.fingerprint(config, "hfldd_stages")
  # The members' KIP state after each segment, removed once cached.
  in_progress = hfldd_stages.kip_checkpoint(cache, fingerprint)
  try:
    stages = hfldd_stages.stages_or_load(
        cache, fingerprint,
        lambda: _stages(config, prepared, data, params, batch_stats, root,
                        in_progress),
        data=data, num_classes=prepared.dataset.num_classes,
        in_progress=in_progress)
  except privacy_lib.RawUploadError as e:
    raise common.InputError("hfldd: " + str(e).replace(
        "set allow_raw_upload=True",
        "set --config.hfldd.allow_raw_upload=True")) from None
  # DP-KIP's epsilon at the rate of the client with the fewest examples.
  dp_fields = common.dp_kip_fields(config, data.num_examples)
  audit = None
  if "audit" in config and config.audit.enabled:
    # Every client's data is kept for the audit (the members); a holdout
    # the test split cannot give is refused now, before the rounds.
    from fedjax_dd.experiments import auditing as audit  # pylint: disable=g-import-not-at-top
    audit.attacker_data(config, prepared)
    audit_data = data
  data = None  # the heads train on stages.hybrid only
  num_classes = prepared.dataset.num_classes
  ledger0 = hfldd.setup_ledger(
      stages.topology, stages.counts, aux_size=config.data.aux_size,
      num_classes=num_classes, pixels_per_sample=stages.pixels_per_sample,
      bits_per_sent_label=sent_label_bits(config))
  t = stages.topology
  figure = figures.plot_topology(
      t.homogeneous, t.heterogeneous, t.heads,
      common.workdir_path(workdir, "topology.png"),
      title=f"{config.method}: {t.num_heads} heads")
  t0 = time.time()
  head_steps = common.local_steps(config, stages.hybrid.num_examples)
  algorithm = hfldd.head_training(common.local_training(
      config, prepared.task, int(jnp.max(head_steps))))

  def finalize(summary: dict[str, Any]) -> dict[str, Any]:
    config_dict = summary.pop("config")
    summary.update(hfldd_stages.stage_fields(
        stages, aux_size=config.data.aux_size, num_classes=num_classes,
        member_data=config.hfldd.member_data,
        num_params=summary["param_count"], rounds=summary["rounds"],
        bytes_by_tag=summary["bytes_by_tag"],
        training_seconds=time.time() - t0, topology_figure_path=figure))
    summary.update(dp_fields)
    if audit is not None:  # the members' uploads and the final model
      summary["audit"] = audit.audit_run(
          config, workdir, prepared=prepared, data=audit_data, stages=stages,
          algorithm=algorithm)
    summary["config"] = config_dict
    return summary

  return runners.fit_and_summarize(
      config, workdir, prepared=prepared, algorithm=algorithm,
      data=jax.device_put(stages.hybrid), num_steps=head_steps,
      ledger=ledger0, start_time=start, initial_model=(params, batch_stats),
      run_key=keys.stage_key(root, keys.Stage.ROUNDS), finalize=finalize)


# HFLDD and its two controls (random raw samples, no distillation) share
# this pipeline; hfldd.member_data tells them apart.
@dataclasses.dataclass(frozen=True)
class HFLDDOptions:
  """HFLDD's stages (Alg. 2): the ``hfldd`` group of its presets.

  Attributes:
    num_homogeneous: ``K``, the KMeans clusters of stage 2 (Sec. IV-B).
    kmeans_n_init: KMeans restarts.
    member_data: what members send their head (stage 5): ``"kip"`` (HFLDD),
      ``"random"`` (``support_size`` random raw samples, the control) or
      ``"raw"`` (all raw data, the "w/o DD" ablation).
    support_size: ``|D~_i|``, images per member (``kip`` and ``random``).
    allow_raw_upload: send KIP images byte-identical to a raw image of their
      member (a short KIP budget); False refuses them.
    sent_label_bits: bits per label entry of the uploads; -1: what is sent
      (32 for learned KIP labels, 0 for fixed ones, which Eq. 18 leaves
      out).
  """
  num_homogeneous: int = 10
  kmeans_n_init: int = 10
  member_data: str = "kip"
  support_size: int = 400
  allow_raw_upload: bool = False
  sent_label_bits: int = -1

  def __post_init__(self):
    if self.member_data not in MEMBER_DATA:
      raise ValueError(f"member_data must be one of {list(MEMBER_DATA)}, "
                       f"got {self.member_data!r}.")
    for name, low in (("num_homogeneous", 1), ("kmeans_n_init", 1),
                      ("sent_label_bits", -1)):
      core_checks.check_int(name, getattr(self, name), low)
    if self.member_data != "raw":
      core_checks.check_int("support_size", self.support_size, 1)


for _name in ("hfldd", "hfldd_random", "hfldd_wodd"):
  registry.declare(registry.Method(_name, pipeline=run, runner="hfldd",
                                   hparams=HFLDDOptions, group="hfldd"))
del _name
