"""``--seeds=... --config.engine.run_axis=True``: a seed sweep as one program.

Glue from a ``federated`` config and its seeds to
:func:`fedjax_dd.core.run_axis.fit_runs`: each seed's partition
(``data.seed = seed``), the method's builder from
:mod:`fedjax_dd.experiments.registry` per seed, then each seed's
``summary.json`` in ``WORKDIR/seed_S`` and the sweep's report, as the
process-per-seed sweep (:func:`fedjax_dd.experiments.sweep.run_seeds`)
writes them, so ``fedjax-dd-sweep`` reads both alike::

  fedjax-dd --config=experiments/configs/fedavg.py:smoke --workdir=/tmp/sw \
      --seeds=0,1,2 --config.engine.run_axis=True
"""

from __future__ import annotations

import dataclasses
import os
import shlex
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
from fedjax_dd.experiments import registry
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
    (lambda c: "client_data" in registry.get(c.method).needs,
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


# Grid keys a cell may change on the run axis, as traced values: each is
# handed to the method's builder per run (experiments/common.py).
GRID_KEYS = ("client.lr",)

def parse_grid(text: str | None) -> tuple[str, list[float]] | None:
  """``"client.lr=0.01,0.03,0.1"`` -> ``("client.lr", [0.01, 0.03, 0.1])``.

  Raises:
    ValueError: one line naming ``--grid``: not ``KEY=V,V,...``, a key not
      in :data:`GRID_KEYS`, a value that is not a number, or a repeat.
  """
  if not text:
    return None
  key, sep, values = text.partition("=")
  if not sep or not values.strip():
    raise ValueError(f"--grid={text}: give KEY=V,V,... (e.g. "
                     "--grid=client.lr=0.01,0.03,0.1).")
  key = key.strip()
  if key not in GRID_KEYS:
    raise ValueError(f"--grid={text}: {key} cannot vary on the run axis; "
                     f"the keys that can are {list(GRID_KEYS)} (other "
                     "settings change shapes or host logic: run them as "
                     "separate sweeps).")
  try:
    out = [float(v) for v in values.split(",") if v.strip()]
  except ValueError:
    raise ValueError(f"--grid={text}: the values must be numbers.") from None
  if len(set(out)) != len(out):
    raise ValueError(f"--grid={text}: a value is given twice.")
  return key, out


def cell_name(key: str, value: float) -> str:
  """A grid cell's directory: ``client.lr_0.03`` (a sweep workdir of its
  ``seed_S`` runs; ``fedjax-dd-sweep`` takes it as ``[LABEL=]DIR``, so no
  ``=`` in it)."""
  return f"{key}_{value:g}"


def cell_config(config: ml_collections.ConfigDict, seed: int,
                grid: tuple[str, float] | None) -> ml_collections.ConfigDict:
  """The config of one run: ``seed`` (and ``data.seed``), and the cell's
  value of the grid key."""
  c = sweep.seed_config(config, seed)
  if grid is not None:
    group, key = grid[0].split(".")
    c[group][key] = float(grid[1])
  return c


def check(config: ml_collections.ConfigDict,
          grid: tuple[str, list[float]] | None = None) -> None:
  """Refuses, before the data loads, a config (and grid) the run axis
  cannot run.

  Raises:
    ValueError: one line naming the setting and the fix.
  """
  for refused, why in _REFUSED:
    if refused(config):
      raise ValueError(
          f"--config.engine.run_axis=True: {config.method} cannot run its "
          f"seeds on one run axis: {why}. Drop --config.engine.run_axis to "
          "run one process per seed.")
  if grid is not None:
    if config.method == "scaffold":
      raise ValueError(
          f"--grid: scaffold reads {grid[0]} itself as a number (its "
          "variate update divides by the client rate), which cannot vary "
          "on the run axis yet; run one sweep per value.")
    for v in grid[1]:
      common.validate(cell_config(config, 0, (grid[0], v)))


def run_seeds(config: ml_collections.ConfigDict, workdir: str,
              seeds: Sequence[int], *, argv: Sequence[str],
              grid: tuple[str, list[float]] | None = None
              ) -> dict[str, Any]:
  """Runs ``config`` for ``seeds`` (and grid cells) on one run axis and
  writes the report.

  Args:
    config: the resolved config (its own ``seed`` and ``data.seed`` are
      replaced by each seed, the grid key by each cell's value).
    workdir: the sweep's workdir: ``checkpoints/`` and ``config.json`` of
      the sweep, ``seed_S/`` of each run, or with a grid
      ``<key>_<value>/seed_S/`` (:func:`cell_name`).
    seeds: the seeds.
    argv: the sweep's command line, for each seed's ``command.txt``.
    grid: ``(key, values)`` of :func:`parse_grid`: the R = cells x seeds
      runs share the axis, the key's value traced per run.

  Returns:
    The report of :func:`fedjax_dd.utils.sweep.write_report` (one group
    per cell), with a grid also ``"against"``: the final accuracy against
    the key (:func:`fedjax_dd.utils.sweep.against`).
  """
  check(config, grid)
  start = time.time()
  cells = [None] if grid is None else [(grid[0], v) for v in grid[1]]
  runs = [(cell, seed) for cell in cells for seed in seeds]
  configs = [cell_config(config, seed, cell) for cell, seed in runs]
  dirs = [sweep_lib.seed_dir(
      workdir if cell is None else os.path.join(workdir, cell_name(*cell)),
      seed) for cell, seed in runs]
  prepared = common.load_and_prepare(config)
  by_seed = {}
  for seed in seeds:
    c = sweep.seed_config(config, seed)
    parts = runners._client_partition(c, prepared)  # pylint: disable=protected-access
    data = common.client_data(prepared.dataset, parts)
    by_seed[seed] = (c, data, common.local_steps(c, data.num_examples))
  training = common.local_training(
      config, prepared.task, max(int(jnp.max(s)) for _, _, s in
                                 by_seed.values()))
  method = registry.get(config.method)

  def algorithm(seed, hparams):
    t = training
    if "client.lr" in hparams:
      t = dataclasses.replace(training, optimizer=common.make_optimizer(
          config, lr=hparams["client.lr"]))
    c = by_seed[seed][0]
    return method.rounds(c, t, **registry.build_inputs(c, method))

  # Each run's directory records its own settings, as a seed's process of
  # the process-per-seed sweep does.
  for d, c in zip(dirs, configs):
    workdir_lib.record_fingerprint(d, common.fingerprint(c))
  wall = loop_lib.WallClock(start=start)
  n = by_seed[seeds[0]][1].num_clients
  definition = {"seeds": list(seeds), **{
      k: v for k, v in common.fingerprint(config).items()
      if k not in sweep_lib.SEED_KEYS}}
  if grid is not None:
    definition[f"grid.{grid[0]}"] = list(grid[1])
  result = run_axis_lib.fit_runs(
      algorithm, prepared, [by_seed[s][1] for _, s in runs],
      [by_seed[s][2] for _, s in runs], seeds=[s for _, s in runs],
      rounds=config.rounds, clients_per_round=common.cohort(config, n),
      workdir=workdir,
      hparams=None if grid is None else {grid[0]: [c[1] for c, _ in runs]},
      names=[os.path.relpath(d, workdir) for d in dirs],
      max_seconds=runners.remaining_budget(config, start),
      wall=wall, definition=definition, name=config.method,
      **runners.loop_settings(config))
  fields = registry.get(config.method).summary_fields
  for i, (c, d, (_, seed)) in enumerate(zip(configs, dirs, runs)):
    state = result.run_state(i)
    summary = runners.summarize(
        c, rows=result.rows[i], ledger=result.ledgers[i],
        params=state.server.params, rounds=int(state.round), wall=wall)
    if fields is not None:
      summary = {**summary, **fields(c, n, summary["rounds"])}
    Workdir(d).write_summary(summary)
    args = sweep.seed_args(argv, os.path.dirname(d), seed)
    if grid is not None:
      value = common.config_value(c, grid[0])
      args = [a for a in args if not a.startswith("--grid")] + [
          f"--config.{grid[0]}={value}"]
    metrics_lib.write_text(os.path.join(d, "command.txt"),
                           shlex.join(["fedjax-dd", *args]) + "\n")
  groups: dict[str, list[str]] = {}
  for (cell, _), d in zip(runs, dirs):
    label = (config.method if cell is None else
             f"{config.method} {cell_name(*cell)}")
    groups.setdefault(label, []).append(d)
  title = (f"{config.method} on {config.data.dataset}, seeds {list(seeds)}"
           + ("" if grid is None else f", {grid[0]} {grid[1]}")
           + " (run axis)")
  report = sweep_lib.write_report(groups, workdir, name="sweep", title=title,
                                  ignore=sweep.IGNORED)
  if grid is not None:
    report["against"] = sweep_lib.against(groups, grid[0], workdir,
                                          name="sweep_against", title=title)
  return report
