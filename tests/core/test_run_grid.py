"""The runs of seeds × a grid cell (fedjax_dd.core.run_grid)."""

import json
import os

import pytest

from fedjax_dd.core import run_grid
from tests.core import test_run_axis as base


def test_grid_runs_cells_outer_seeds_inner():
  assert run_grid.grid_runs([0, 1]) == [
      run_grid.GridRun(0, None, "seed_0"), run_grid.GridRun(1, None, "seed_1")]
  runs = run_grid.grid_runs([3, 4], ("client.mu", [0.01, 0.1]))
  assert [(r.seed, r.cell, r.name) for r in runs] == [
      (3, ("client.mu", 0.01), os.path.join("client.mu_0.01", "seed_3")),
      (4, ("client.mu", 0.01), os.path.join("client.mu_0.01", "seed_4")),
      (3, ("client.mu", 0.1), os.path.join("client.mu_0.1", "seed_3")),
      (4, ("client.mu", 0.1), os.path.join("client.mu_0.1", "seed_4"))]


def test_seed_data_builds_each_seed_once_and_groups_by_label():
  calls = []
  data = run_grid.seed_data([2, 0, 2], lambda s: calls.append(s) or s * 10)
  assert calls == [2, 0] and data == {2: 20, 0: 0}
  runs = run_grid.grid_runs([0, 1], ("client.lr", [0.1, 0.3]))
  groups = run_grid.groups(runs, "W", lambda r: f"lr {r.cell[1]}")
  assert groups == {
      "lr 0.1": [os.path.join("W", "client.lr_0.1", f"seed_{s}")
                 for s in (0, 1)],
      "lr 0.3": [os.path.join("W", "client.lr_0.3", f"seed_{s}")
                 for s in (0, 1)]}


def test_fit_grid_records_each_run_and_traces_its_cell(tmp_path):
  """Each run's definition lands in its directory before the rounds, and
  the cell's value reaches the builder as ``hparams[key]``."""
  p = base._prepared()  # pylint: disable=protected-access
  data = run_grid.seed_data([0, 1], lambda s: base._seed_data(p, s))  # pylint: disable=protected-access
  most = run_grid.most_steps(data)
  seen = []

  def build(seed, hparams):
    seen.append((seed, dict(hparams)))
    return base.fedjax_dd.fedavg(base._training(  # pylint: disable=protected-access
        p, most, lr=hparams["client.lr"]))

  runs = run_grid.grid_runs([0, 1], ("client.lr", [0.1]))
  result = run_grid.fit_grid(
      build, p, runs, data,
      run_definition=lambda r: {"seed": r.seed, "lr": r.cell[1]}, rounds=1,
      clients_per_round=2, workdir=tmp_path, progress=False)
  assert result.names == [r.name for r in runs]
  assert seen[:2] == [(0, {"client.lr": 0.1}), (1, {"client.lr": 0.1})]
  written = []
  run_grid.each_run(result, runs, lambda run, state, rows, ledger:
                    written.append((run.seed, int(state.round), len(rows))))
  assert written == [(0, 1, 1), (1, 1, 1)]
  for r in runs:
    with open(tmp_path / r.name / "config.json") as f:
      assert json.load(f) == {"seed": r.seed, "lr": 0.1}


def test_fit_grid_refuses_mixed_cells(tmp_path):
  runs = [run_grid.GridRun(0, None, "seed_0"),
          run_grid.GridRun(1, ("client.lr", 0.1), "x/seed_1")]
  with pytest.raises(ValueError, match="one grid key per sweep"):
    run_grid.fit_grid(None, None, runs, {}, rounds=1, clients_per_round=1,
                      workdir=tmp_path)
