"""``--seeds=... --config.engine.run_axis=True``: a seed sweep as one program.

Glue from a ``federated`` config and its seeds to
:func:`fedjax_dd.core.run_axis.fit_runs`: each seed's partition
(``data.seed = seed``), the method's builder from
:data:`fedjax_dd.experiments.runners.BUILDERS` per seed, then each seed's
``summary.json`` in ``WORKDIR/seed_S`` and the sweep's report, as the
process-per-seed sweep (:func:`fedjax_dd.experiments.sweep.run_seeds`)
writes them, so ``fedjax-dd-sweep`` reads both alike::

  fedjax-dd --config=experiments/configs/fedavg.py:smoke --workdir=/tmp/sw \
      --seeds=0,1,2 --config.engine.run_axis=True
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax.numpy as jnp
import ml_collections

from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core import metrics as metrics_lib
from fedjax_dd.core import run_axis as run_axis_lib
from fedjax_dd.core import workdir as workdir_lib
from fedjax_dd.core.workdir import Workdir
from fedjax_dd.experiments import common
from fedjax_dd.experiments import runners
from fedjax_dd.experiments import sweep
from fedjax_dd.utils import sweep as sweep_lib

# Raised by fit_runs when the runs cannot share one program.
RunAxisError = run_axis_lib.RunAxisError

def _get(config: ml_collections.ConfigDict, path: str) -> Any:
  """The value at dotted ``path``, None where the config lacks a group."""
  node = config
  for part in path.split("."):
    if not hasattr(node, "keys") or part not in node:
      return None
    node = node[part]
  return node


# Settings that make the runs of a seed sweep differ in more than traced
# values or the partition: refused on the run axis, with the reason.
_REFUSED = (
    (lambda c: c.runner != "federated",
     "only runner 'federated' (FedAvg-family rounds) runs on the run axis"),
    (lambda c: c.method in runners.DATA_BUILDERS,
     "its server is built from each seed's data (PACFL's subspaces)"),
    (lambda c: float(_get(c, "data.resplit") or 0.0) != 0.0,
     "data.resplit draws each seed's own train/test split"),
    (lambda c: bool(_get(c, "eval.personal")),
     "personalized evaluation is not on the run axis yet"),
    (lambda c: bool(_get(c, "client.activity")),
     "a Bernoulli cohort (client.activity) varies in size per run"),
    (lambda c: bool(_get(c, "engine.multihost")),
     "a multi-host run is one run"),
)


def check(config: ml_collections.ConfigDict) -> None:
  """Refuses, before the data loads, a config the run axis cannot run.

  Raises:
    ValueError: one line naming the setting and the fix.
  """
  for refused, why in _REFUSED:
    if refused(config):
      raise ValueError(
          f"--config.engine.run_axis=True: {config.method} cannot run its "
          f"seeds on one run axis: {why}. Drop --config.engine.run_axis to "
          "run one process per seed.")


def run_seeds(config: ml_collections.ConfigDict, workdir: str,
              seeds: Sequence[int], *, argv: Sequence[str]
              ) -> dict[str, Any]:
  """Runs ``config`` for ``seeds`` on one run axis and writes the report.

  Args:
    config: the resolved config (its own ``seed`` and ``data.seed`` are
      replaced by each seed).
    workdir: the sweep's workdir: ``checkpoints/`` and ``config.json`` of
      the sweep, ``seed_S/`` of each run.
    seeds: the seeds.
    argv: the sweep's command line, for each seed's ``command.txt``.

  Returns:
    The report of :func:`fedjax_dd.utils.sweep.write_report`.
  """
  check(config)
  start = time.time()
  configs = [sweep.seed_config(config, s) for s in seeds]
  prepared = common.load_and_prepare(config)
  datas, steps = [], []
  for c in configs:
    parts = runners._client_partition(c, prepared)  # pylint: disable=protected-access
    data = common.client_data(prepared.dataset, parts)
    datas.append(data)
    steps.append(common.local_steps(c, data.num_examples))
  training = common.local_training(
      config, prepared.task, max(int(jnp.max(s)) for s in steps))
  by_seed = dict(zip(seeds, configs))
  build = runners.BUILDERS[config.method]

  def algorithm(seed, hparams):
    del hparams
    return build(by_seed[seed], training)

  # Each seed's directory records its own settings, as a seed's process
  # of the process-per-seed sweep does.
  for seed, c in zip(seeds, configs):
    workdir_lib.record_fingerprint(sweep_lib.seed_dir(workdir, seed),
                                   common.fingerprint(c))
  wall = loop_lib.WallClock(start=start)
  n = datas[0].num_clients
  definition = {"seeds": list(seeds), **{
      k: v for k, v in common.fingerprint(config).items()
      if k not in sweep_lib.SEED_KEYS}}
  result = run_axis_lib.fit_runs(
      algorithm, prepared, datas, steps, seeds=seeds, rounds=config.rounds,
      clients_per_round=common.cohort(config, n), workdir=workdir,
      names=[f"seed_{s}" for s in seeds],
      eval_every=config.run.eval_every,
      checkpoint_every=config.run.checkpoint_every,
      keep_checkpoints=config.run.keep_checkpoints,
      max_seconds=runners.remaining_budget(config, start),
      progress=config.run.progress,
      class_accuracy=config.run.class_accuracy,
      stop_on_nonfinite=config.run.stop_on_nonfinite,
      initial_model_as_seed=config.server.initial_model_as_seed,
      wall=wall, definition=definition)
  fields = runners.SUMMARY_FIELDS.get(config.method)
  dirs = []
  for i, (seed, c) in enumerate(zip(seeds, configs)):
    d = sweep_lib.seed_dir(workdir, seed)
    state = result.run_state(i)
    summary = runners.summarize(
        c, rows=result.rows[i], ledger=result.ledgers[i],
        params=state.server.params, rounds=int(state.round), wall=wall)
    if fields is not None:
      summary = {**summary, **fields(c, n, summary["rounds"])}
    Workdir(d).write_summary(summary)
    metrics_lib.write_text(
        f"{d}/command.txt", sweep.seed_command(argv, workdir, seed) + "\n")
    dirs.append(d)
  return sweep_lib.write_report(
      {config.method: dirs}, workdir, name="sweep",
      title=f"{config.method} on {config.data.dataset}, seeds {list(seeds)} "
            "(run axis)", ignore=sweep.IGNORED)
