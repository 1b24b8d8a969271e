"""Seeds × a grid of traced values as the runs of one run axis.

A seed sweep with a grid (``--seeds=0,1 --grid=client.lr=0.03,0.1``) is
R = cells × seeds runs of :func:`fedjax_dd.core.run_axis.fit_runs`; a
caller only says how to build one seed's clients, one run's algorithm and
one run's outputs:

:func:`grid_runs` (the runs and their directories), :func:`seed_data` (each
seed's clients, built once), :func:`fit_grid` (``fit_runs`` with each cell's
value traced as ``hparams[key]``), :func:`each_run` and :func:`groups` (the
outputs, and the runs grouped by cell for a report).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Mapping, Sequence, TypeVar

import jax
import numpy as np

from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import run_axis as run_axis_lib
from fedjax_dd.core import workdir as workdir_lib
from fedjax_dd.core.algorithm import ExperimentState
from fedjax_dd.core.prepare import Prepared
from fedjax_dd.data.stacked import ClientData

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class GridRun:
  """One run of a grid sweep.

  Attributes:
    seed: the run's seed (model and, where the caller derives it so, the
      partition).
    cell: ``(key, value)`` of its grid cell, or None without a grid.
    name: its directory under the sweep's workdir.
  """
  seed: int
  cell: tuple[str, float] | None
  name: str


def cell_name(key: str, value: float) -> str:
  """A grid cell's directory: ``client.lr_0.03`` (a sweep workdir of its
  ``seed_S`` runs; ``fedjax-dd-sweep`` takes it as ``[LABEL=]DIR``, so no
  ``=`` in it)."""
  return f"{key}_{value:g}"


def grid_runs(seeds: Sequence[int],
              grid: tuple[str, Sequence[float]] | None = None
              ) -> list[GridRun]:
  """The runs of ``seeds`` in each cell of ``grid``: cells outer, seeds
  inner, named ``seed_S`` (no grid) or ``<cell_name>/seed_S``."""
  cells = [None] if grid is None else [(grid[0], float(v)) for v in grid[1]]
  return [GridRun(seed=int(s), cell=cell,
                  name=(f"seed_{s}" if cell is None else
                        os.path.join(cell_name(*cell), f"seed_{s}")))
          for cell in cells for s in seeds]


def seed_data(seeds: Sequence[int], build: Callable[[int], T]
              ) -> dict[int, T]:
  """``{seed: build(seed)}``, each seed built once (in the given order)."""
  return {s: build(s) for s in dict.fromkeys(int(s) for s in seeds)}


def most_steps(data: Mapping[int, tuple[ClientData, jax.Array]]) -> int:
  """The largest local step count of any client of any seed: the bound
  ``max_steps`` of the one local training all runs share."""
  return max(int(np.max(np.asarray(jax.device_get(steps))))
             for _, steps in data.values())


def fit_grid(build: run_axis_lib.Builder, prepared: Prepared,
             runs: Sequence[GridRun],
             data: Mapping[int, tuple[ClientData, jax.Array]], *,
             run_definition: Callable[[GridRun], Mapping[str, Any]] | None
             = None,
             **kwargs: Any) -> run_axis_lib.RunsResult:
  """:func:`fedjax_dd.core.run_axis.fit_runs` of a grid's runs.

  Args:
    build: ``build(seed, hparams) -> FederatedAlgorithm`` as
      ``fit_runs``'; ``hparams`` holds the run's cell value under its key
      (none without a grid).
    prepared: the task and its dataset.
    runs: :func:`grid_runs`.
    data: ``{seed: (clients, num_steps)}`` (:func:`seed_data`); a run
      trains on its seed's.
    run_definition: what defines each run, recorded as
      ``<workdir>/<run.name>/config.json`` before any round (a resume
      with another definition is refused, naming what differs).
    **kwargs: to ``fit_runs`` (``rounds``, ``clients_per_round``,
      ``workdir``, ...).

  Returns:
    ``fit_runs``' :class:`~fedjax_dd.core.run_axis.RunsResult`, its runs
    in the order of ``runs``.

  Raises:
    ValueError: the runs mix grid keys, or a run with and one without a
      cell.
  """
  keys = {None if r.cell is None else r.cell[0] for r in runs}
  if len(keys) != 1:
    raise ValueError(f"fit_grid: the runs' cells vary {sorted(map(str, keys))}"
                     "; one grid key per sweep, every run in a cell.")
  (key,) = keys
  if run_definition is not None:
    workdir = kwargs.get("workdir")
    if workdir is None:
      raise ValueError("fit_grid: run_definition records each run's "
                       "definition in its directory; give a workdir.")
    for run in runs:
      workdir_lib.record_fingerprint(
          os.path.join(os.fspath(workdir), run.name),
          dict(run_definition(run)))
  return run_axis_lib.fit_runs(
      build, prepared, [data[r.seed][0] for r in runs],
      [data[r.seed][1] for r in runs], seeds=[r.seed for r in runs],
      hparams=None if key is None else {key: [r.cell[1] for r in runs]},
      names=[r.name for r in runs], **kwargs)


def each_run(result: run_axis_lib.RunsResult, runs: Sequence[GridRun],
             write: Callable[[GridRun, ExperimentState, list[dict[str, Any]],
                              ledger_lib.Ledger], None]) -> None:
  """``write(run, state, rows, ledger)`` for each run of ``result``: its
  final state (as :func:`fedjax_dd.fit` returns it), its rows and ledger."""
  for i, run in enumerate(runs):
    write(run, result.run_state(i), result.rows[i], result.ledgers[i])


def groups(runs: Sequence[GridRun], workdir: str | os.PathLike,
           label: Callable[[GridRun], str]) -> dict[str, list[str]]:
  """``{label: [run directories]}``: the runs grouped by ``label(run)`` in
  the order they come, for :func:`fedjax_dd.utils.sweep.write_report`."""
  out: dict[str, list[str]] = {}
  for run in runs:
    out.setdefault(label(run), []).append(
        os.path.join(os.fspath(workdir), run.name))
  return out
