"""``--seeds=... --config.engine.run_axis=True``: a seed sweep as one program.

Glue from a ``federated`` config, its seeds and ``--grid`` cells to
:func:`fedjax_dd.core.run_grid.fit_grid`: each seed's partition
(``data.seed = seed``), each run's algorithm (the method's registry builder,
reading the cell's traced value, :func:`traced_config`), and each run's
``summary.json`` and ``command.txt`` in ``WORKDIR/seed_S`` with the sweep's
report, as :func:`fedjax_dd.experiments.sweep.run_seeds` writes them, so
``fedjax-dd-sweep`` reads both alike::

  fedjax-dd --config=experiments/configs/fedavg.py:smoke --workdir=/tmp/sw \
      --seeds=0,1,2 --config.engine.run_axis=True
  fedjax-dd --config=experiments/configs/fedprox.py:smoke --workdir=/tmp/g \
      --seeds=0,1 --config.engine.run_axis=True --grid=client.mu=0.01,0.1
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import time
from typing import Any, Mapping, Sequence

import ml_collections

from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core import metrics as metrics_lib
from fedjax_dd.core import run_axis as run_axis_lib
from fedjax_dd.core import run_grid
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


# Grid keys a cell may change on the run axis, as traced values, and the
# methods whose builders read each (None: every method, through the
# clients' optimizer of common.make_optimizer, and SCAFFOLD's variate
# update). A run's builder reads the key from its config, where the value
# is a tracer (traced_config).
GRID_KEYS: dict[str, tuple[str, ...] | None] = {
    "client.lr": None,
    "client.weight_decay": None,
    "client.mu": ("fedprox",),
    "feddyn.alpha": ("feddyn",),
    "server.lr": ("scaffold",),
}

# Keys a user may expect on the grid that cannot vary there, and why.
_NOT_TRACED: dict[str, str] = {}

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
  if key in _NOT_TRACED:
    raise ValueError(f"--grid={text}: {key} cannot vary on the run axis: "
                     f"{_NOT_TRACED[key]}; run one sweep per value.")
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


# A grid cell's directory: ``client.lr_0.03``.
cell_name = run_grid.cell_name


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
  registry.check_method(config)
  for refused, why in _REFUSED:
    if refused(config):
      raise ValueError(
          f"--config.engine.run_axis=True: {config.method} cannot run its "
          f"seeds on one run axis: {why}. Drop --config.engine.run_axis to "
          "run one process per seed.")
  if grid is not None:
    methods = GRID_KEYS[grid[0]]
    if methods is not None and config.method not in methods:
      raise ValueError(
          f"--grid: {config.method} does not read {grid[0]} (only "
          f"{', '.join(methods)} does), so its cells would all be one run; "
          "grid a key the method reads.")
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
  runs = run_grid.grid_runs(seeds, grid)
  prepared = common.load_and_prepare(config)
  data = run_grid.seed_data(
      seeds, lambda seed: _seed_clients(sweep.seed_config(config, seed),
                                        prepared))
  training = common.local_training(config, prepared.task,
                                   run_grid.most_steps(data))
  method = registry.get(config.method)

  def algorithm(seed, hparams):
    c = traced_config(sweep.seed_config(config, seed), hparams)
    t = training
    if {"client.lr", "client.weight_decay"} & set(hparams):
      t = dataclasses.replace(training, optimizer=common.make_optimizer(
          c, lr=hparams.get("client.lr"),
          weight_decay=hparams.get("client.weight_decay")))
    return method.rounds(c, t, **registry.build_inputs(c, method))

  wall = loop_lib.WallClock(start=start)
  n = data[runs[0].seed][0].num_clients
  definition = {"seeds": list(seeds), **{
      k: v for k, v in common.fingerprint(config).items()
      if k not in sweep_lib.SEED_KEYS}}
  if grid is not None:
    definition[f"grid.{grid[0]}"] = list(grid[1])
  # Each run's directory records its own settings, as a seed's process of
  # the process-per-seed sweep does.
  result = run_grid.fit_grid(
      algorithm, prepared, runs, data,
      run_definition=lambda run: common.fingerprint(
          cell_config(config, run.seed, run.cell)),
      rounds=config.rounds, clients_per_round=common.cohort(config, n),
      workdir=workdir, max_seconds=runners.remaining_budget(config, start),
      wall=wall, definition=definition, name=config.method,
      run_chunk_size=config.engine.run_chunk_size or "auto",
      **runners.loop_settings(config))
  fields = method.summary_fields

  def write(run, state, rows, ledger):
    c = cell_config(config, run.seed, run.cell)
    d = os.path.join(workdir, run.name)
    summary = runners.summarize(c, rows=rows, ledger=ledger,
                                params=state.server.params,
                                rounds=int(state.round), wall=wall)
    if fields is not None:
      summary = {**summary, **fields(c, n, summary["rounds"])}
    Workdir(d).write_summary(summary)
    metrics_lib.write_text(os.path.join(d, "command.txt"),
                           shlex.join(["fedjax-dd", *run_args(argv, workdir,
                                                              run)]) + "\n")

  run_grid.each_run(result, runs, write)
  groups = run_grid.groups(
      runs, workdir, lambda run: config.method if run.cell is None else
      f"{config.method} {cell_name(*run.cell)}")
  title = (f"{config.method} on {config.data.dataset}, seeds {list(seeds)}"
           + ("" if grid is None else f", {grid[0]} {grid[1]}")
           + " (run axis)")
  report = sweep_lib.write_report(groups, workdir, name="sweep", title=title,
                                  ignore=sweep.IGNORED)
  if grid is not None:
    report["against"] = sweep_lib.against(groups, grid[0], workdir,
                                          name="sweep_against", title=title)
  return report


def _seed_clients(config: ml_collections.ConfigDict, prepared):
  """One seed's clients and local step counts (its ``data.seed``)."""
  parts = runners._client_partition(config, prepared)  # pylint: disable=protected-access
  data = common.client_data(prepared.dataset, parts)
  return data, common.local_steps(config, data.num_examples)


def traced_config(config: ml_collections.ConfigDict,
                  hparams: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """``config`` with the run's grid value at its key: a number for a run's
  ``init``, a tracer inside the round program, which a method's builder
  reads where it reads the setting (e.g. ``client.mu`` for FedProx). A
  copy that is not type-safe, since a tracer is not a float; ``config``
  itself when there is no grid."""
  if not hparams:
    return config
  (key, value), = hparams.items()
  c = ml_collections.ConfigDict(config.to_dict(), type_safe=False)
  group, name = key.split(".")
  c[group][name] = value
  return c


def run_args(argv: Sequence[str], workdir: str,
             run: run_grid.GridRun) -> list[str]:
  """The flags of ``run`` as its own command: the seed's
  (:func:`fedjax_dd.experiments.sweep.seed_args`) and, in a grid, the
  cell's value as ``--config.KEY=V`` instead of ``--grid``."""
  d = os.path.join(workdir, run.name)
  args = sweep.seed_args(argv, os.path.dirname(d), run.seed)
  if run.cell is None:
    return args
  key, value = run.cell
  return [a for a in args if not a.startswith("--grid")] + [
      f"--config.{key}={float(value)}"]
