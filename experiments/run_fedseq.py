"""Runner ``"fedseq"``: FedSeq superclients through the shared rounds loop.

Clients are grouped into ``config.hfldd.num_groups`` superclients; with
``config.hfldd.group_by_similarity`` the groups mix the homogeneous clusters of
HFLDD's label-knowledge stage (same pretraining, ``D_g`` and KMeans), else
they are random. Traffic follows HFLDD Eq. 19 as printed (``J`` transfers
per superclient and round; ``config.hfldd.fedseq_traffic="physical"`` counts the
``J - 1`` hand-offs made); the label-knowledge upload used for grouping is
not charged, as in Eq. 19. Members train ``config.client.local_steps`` steps
when set, else ``config.client.local_epochs`` epochs.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_dd.cluster import sampling as clustering
from fedjax_dd.algorithms import fedseq
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


registry.declare(registry.Method("fedseq", pipeline=run))
