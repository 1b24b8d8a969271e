"""Runner ``"fedseq"``: FedSeq superclients through the shared rounds loop.

Clients are grouped into superclients (:class:`FedSeqOptions`), mixing the
homogeneous clusters of HFLDD's label-knowledge stage or at random. Traffic
follows HFLDD Eq. 19 (``hfldd.fedseq_traffic``); the label-knowledge upload
used for grouping is not charged, as in Eq. 19.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_dd.cluster import sampling as clustering
from fedjax_dd.algorithms import fedseq
from fedjax_dd.core import checks as core_checks
from fedjax_dd.core import keys
from fedjax_dd.experiments import common
from fedjax_dd.experiments import registry
from fedjax_dd.experiments import runners


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs FedSeq as described by ``config``."""
  start = time.time()
  prepared, data, root, params, batch_stats = common.initialised_clients(
      config)
  ds, task = prepared.dataset, prepared.task

  times: dict[str, float] = {}
  if config.hfldd.group_by_similarity:
    homo, times, _ = common.label_knowledge_clusters(
        config, prepared, data, params, batch_stats, root)
  else:
    homo = np.zeros(data.num_clients, np.int64)
  groups = clustering.diverse_groups(
      homo, config.hfldd.num_groups,
      keys.numpy_stream(config.seed, keys.Stream.FEDSEQ_GROUPS))
  num_steps = common.local_steps(config, data.num_examples)
  max_steps = int(jnp.max(num_steps))
  grouped, grouped_steps, member_ids = fedseq.group_data(
      jax.device_get(data), np.asarray(num_steps), groups)
  del data
  group_size = grouped.x.shape[1]

  traffic = config.hfldd.fedseq_traffic
  t0 = time.time()
  algorithm = fedseq.fedseq(common.local_training(config, task, max_steps),
                            group_size=group_size, traffic=traffic)

  def finalize(summary: dict[str, Any]) -> dict[str, Any]:
    """FedSeq's grouping and Eq. 19 figures of the finished run."""
    times["training"] = time.time() - t0
    config_dict = summary.pop("config")
    summary.update({
        "num_groups": len(groups),
        "group_size": int(group_size),
        "groups": member_ids.tolist(),
        "homogeneous": np.asarray(homo).tolist(),
        "num_classes": int(ds.num_classes),
        # bytes_total equals the count named by fedseq_traffic.
        "fedseq_traffic": traffic,
        **fedseq.traffic_bytes(
            num_groups=len(groups), group_size=group_size,
            num_params=summary["param_count"], rounds=summary["rounds"]),
        "stage_seconds": times,
        "config": config_dict,
    })
    return summary

  return runners.fit_and_summarize(
      config, workdir, prepared=prepared, algorithm=algorithm,
      data=jax.device_put(grouped), num_steps=jnp.asarray(grouped_steps),
      start_time=start, initial_model=(params, batch_stats),
      run_key=keys.stage_key(root, keys.Stage.ROUNDS), finalize=finalize)


@dataclasses.dataclass(frozen=True)
class FedSeqOptions:
  """FedSeq's superclients: the ``hfldd`` group of its presets.

  Attributes:
    num_homogeneous: ``K``, the KMeans clusters of HFLDD's label-knowledge
      stage the grouping uses.
    kmeans_n_init: KMeans restarts.
    num_groups: ``O`` superclients (``J = data.num_clients / O``).
    group_by_similarity: group across the homogeneous clusters (else at
      random).
    fedseq_traffic: ``"eq19"`` (HFLDD Eq. 19 as printed, ``J`` transfers per
      superclient and round) or ``"physical"`` (the ``J - 1`` hand-offs the
      ring makes).
  """
  num_homogeneous: int = 10
  kmeans_n_init: int = 10
  num_groups: int = 10
  group_by_similarity: bool = True
  fedseq_traffic: str = "eq19"

  def __post_init__(self):
    for name in ("num_homogeneous", "kmeans_n_init", "num_groups"):
      core_checks.check_int(name, getattr(self, name), 1)
    if self.fedseq_traffic not in fedseq.TRAFFIC:
      raise ValueError(f"fedseq_traffic must be one of {list(fedseq.TRAFFIC)}, got "
                       f"{self.fedseq_traffic!r}.")


registry.declare(registry.Method("fedseq", pipeline=run, hparams=FedSeqOptions,
                                 group="hfldd"))
