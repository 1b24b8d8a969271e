"""Runner ``"fedseq"``: FedSeq superclients through the shared rounds loop.

Clients are grouped into ``config.num_groups`` superclients; with
``config.group_by_similarity`` the groups mix the homogeneous clusters of
HFLDD's label-knowledge stage (same pretraining, ``D_g`` and KMeans), else
they are random. Traffic follows HFLDD Eq. 19 (the label-knowledge upload
used for grouping is not charged, as in Eq. 19).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_dd import clustering
from fedjax_dd.algorithms import fedseq
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.algorithm import ExperimentState
from fedjax_dd.core.checkpoint import CheckpointStore
from fedjax_dd.core.evaluate import make_evaluator
from fedjax_dd.core.local import steps_for
from fedjax_dd.core.metrics import MetricsWriter, write_json
from fedjax_dd.experiments import common
from fedjax_dd.experiments import run_hfldd


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs FedSeq as described by ``config``."""
  start = time.time()
  prepared = common.load_and_prepare(config)
  ds, task = prepared.dataset, prepared.task
  parts = common.partition(config, ds.y_train)
  data = common.client_data(ds, parts)
  root = common.model_key(config)
  params, batch_stats = task.init(jax.random.fold_in(root, run_hfldd._INIT))  # pylint: disable=protected-access

  times: dict[str, float] = {}
  if config.group_by_similarity:
    homo, times, _ = run_hfldd.label_knowledge_clusters(
        config, prepared, data, params, batch_stats,
        jax.random.fold_in(root, run_hfldd._PRETRAIN))  # pylint: disable=protected-access
  else:
    homo = np.zeros(data.num_clients, np.int64)
  groups = clustering.diverse_groups(homo, config.num_groups,
                                     np.random.default_rng([config.seed, 3]))
  num_steps = steps_for(data.num_examples, config.batch_size,
                        epochs=config.local_epochs)
  max_steps = int(jnp.max(num_steps))
  grouped, grouped_steps, member_ids = fedseq.group_data(
      jax.device_get(data), np.asarray(num_steps), groups)
  del data
  group_size = grouped.x.shape[1]

  t0 = time.time()
  algorithm = fedseq.fedseq(task, common.make_optimizer(config),
                            batch_size=config.batch_size, max_steps=max_steps,
                            group_size=group_size, mapper=common.mapper(config))
  server, client_states = algorithm.init(params, batch_stats, len(groups))
  state = ExperimentState(server=server, clients=client_states,
                          key=jax.random.fold_in(root, run_hfldd._ROUNDS),  # pylint: disable=protected-access
                          round=jnp.asarray(0, jnp.int32))
  writer = MetricsWriter(common.workdir_path(workdir, "metrics.jsonl"))
  store = CheckpointStore(common.workdir_path(workdir, "checkpoints"),
                          max_to_keep=config.get("keep_checkpoints", 2),
                          save_every=config.get("checkpoint_every", 1))
  resumed = rounds_lib.resume(store, state, writer)
  ledger = None
  if resumed is not None:
    state, ledger = resumed
  else:
    writer.truncate_after(0)
  options = rounds_lib.RoundsOptions(
      num_rounds=config.rounds, clients_per_round=len(groups),
      eval_every=config.get("eval_every", 1),
      checkpoint_every=config.get("checkpoint_every", 1),
      progress=config.get("progress", True),
      initial_model_as_seed=config.get("initial_model_as_seed", True))
  evaluate = make_evaluator(task, ds.x_test, ds.y_test)
  state, ledger, _ = rounds_lib.run_rounds(
      algorithm, state, jax.device_put(grouped), jnp.asarray(grouped_steps),
      options, evaluate=evaluate, ledger=ledger, writer=writer, store=store)
  store.close()
  times["training"] = time.time() - t0

  rows = writer.rows()
  accs = [r["test_accuracy"] for r in rows if "test_accuracy" in r]
  totals = ledger.cumulative()
  param_count = rounds_lib.num_params(state.server.params)
  summary = {
      "method": config.method,
      "dataset": config.dataset,
      "model": config.model,
      "final_test_accuracy": accs[-1] if accs else None,
      "best_test_accuracy": max(accs) if accs else None,
      "rounds": int(state.round),
      "num_clients": int(config.num_clients),
      "num_groups": len(groups),
      "group_size": int(group_size),
      "groups": member_ids.tolist(),
      "homogeneous": np.asarray(homo).tolist(),
      "num_classes": int(ds.num_classes),
      "param_count": param_count,
      "bytes_uploaded": totals["bytes_uploaded"],
      "bytes_downloaded": totals["bytes_downloaded"],
      "bytes_total": totals["bytes_total"],
      "eq19_bytes": fedseq.eq19_bits(
          num_groups=len(groups), group_size=group_size,
          num_params=param_count, rounds=int(state.round)) / 8,
      "stage_seconds": times,
      "wall_seconds": time.time() - start,
      "accuracy_by_round": [[r["round"], r["test_accuracy"]] for r in rows
                            if "test_accuracy" in r],
      "config": config.to_dict(),
  }
  write_json(common.workdir_path(workdir, "summary.json"), summary)
  return summary
