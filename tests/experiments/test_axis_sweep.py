"""``--seeds --config.engine.run_axis=True``: a seed sweep on one run axis.

Every metrics row of each seed on the run axis equals the row of the same
seed run as its own process (``runners.run_federated``), to ``RTOL``: the
run axis computes each run's clients inside its one program (on CPU the
policy's chunks of one run), where a single run in this test process
shards its cohort over the two host devices (the engine's sharded CPU
backend), and XLA:CPU fuses and orders their float32 reductions
differently, so a value can differ in its last bits (measured on these
presets: at most a few ulp after 2 rounds, e.g. SCAFFOLD's test loss
2.2139525 against 2.2139506). The CPU policy's rows equal ``fit``'s bit
for bit in tests/core/test_run_axis.py, and separate processes' on one
host device (experiments/results/bench_run_axis_fmnist_cpu.md).
Integers (rounds, bytes) and the keys of every row are compared exactly.
"""

import copy
import json
import os
import subprocess
import sys

import pytest

from fedjax_dd.core import workdir as workdir_lib
from fedjax_dd.experiments import axis_sweep
from fedjax_dd.experiments import common
from fedjax_dd.experiments import runners
from fedjax_dd.experiments import sweep
from fedjax_dd.utils import sweep as sweep_lib
from tests.conftest import REPO_ROOT

RTOL = 1e-5
ATOL = 1e-6
SEEDS = (0, 1, 2)


def _config(method):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(
      f"{method}_config", os.path.join(REPO_ROOT, "experiments", "configs",
                                      f"{method}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config("smoke")
  config.run.progress = False
  return config


def _rows(directory):
  with open(os.path.join(directory, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _assert_rows_close(axis_rows, single_rows, rtol=RTOL):
  assert len(axis_rows) == len(single_rows)
  for a, b in zip(axis_rows, single_rows):
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    for k in a:
      if isinstance(b[k], float):
        assert a[k] == pytest.approx(b[k], rel=rtol, abs=ATOL), k
      else:
        assert a[k] == b[k], k


# SCAFFOLD (client state on the axis) and IFCA (host cluster logic per run)
# by default; FedAvg (tests/core/test_run_axis.py checks each run against
# fit), FedProx and FedDyn (whose traced coefficients the grid tests cover)
# with -m slow.
@pytest.mark.parametrize("method", [
    "scaffold", "ifca", pytest.param("fedavg", marks=pytest.mark.slow),
    pytest.param("fedprox", marks=pytest.mark.slow),
    pytest.param("feddyn", marks=pytest.mark.slow)])
def test_run_axis_rows_equal_separate_runs(tmp_path, method):
  config = _config(method)
  axis = str(tmp_path / "axis")
  report = axis_sweep.run_seeds(config, axis, SEEDS, argv=["fedjax-dd"])
  assert report["tables"][0]["seeds"] == list(SEEDS)
  for seed in SEEDS:
    c = sweep.seed_config(config, seed)
    single = str(tmp_path / f"single_{seed}")
    workdir_lib.record_fingerprint(single, common.fingerprint(c))
    runners.run_federated(c, single)
    axis_dir = sweep_lib.seed_dir(axis, seed)
    _assert_rows_close(_rows(axis_dir), _rows(single))
    with open(os.path.join(axis_dir, "summary.json")) as f:
      summary = json.load(f)
    assert (summary["config"]["seed"],
            summary["config"]["data"]["seed"]) == (seed, seed)
    assert summary["rounds"] == config.rounds


# tests/core/test_run_axis_chunks.py resumes a killed chunked sweep with
# another chunk size by default; this is the same through the glue.
@pytest.mark.slow
def test_run_chunks_are_a_resume_safe_setting(tmp_path):
  """``engine.run_chunk_size`` splits the runs of a round into chunks
  (``fit_runs(run_chunk_size=)``); like ``engine.chunk_size`` it is not
  part of the sweep's fingerprint, so a sweep started in chunks of 1
  resumes unchunked, to the rows of an unchunked sweep (to RTOL: a vmap of
  two runs and a chunk of one are different programs)."""
  config = _config("fedavg")
  plain = str(tmp_path / "plain")
  axis_sweep.run_seeds(config, plain, (0, 1), argv=["fedjax-dd"])
  chunked = str(tmp_path / "chunked")
  first = copy.deepcopy(config)
  first.rounds = 1
  first.engine.run_chunk_size = 1
  axis_sweep.run_seeds(first, chunked, (0, 1), argv=["fedjax-dd"])
  axis_sweep.run_seeds(config, chunked, (0, 1), argv=["fedjax-dd"])
  for seed in (0, 1):
    rows = _rows(sweep_lib.seed_dir(chunked, seed))
    assert [r["round"] for r in rows] == list(range(1, config.rounds + 1))
    _assert_rows_close(rows, _rows(sweep_lib.seed_dir(plain, seed)))


def test_check_refuses_what_the_axis_cannot_run():
  config = _config("fedavg")
  config.client.activity = 0.5
  with pytest.raises(ValueError, match="Bernoulli cohort"):
    axis_sweep.check(config)
  config = _config("pacfl")
  with pytest.raises(ValueError, match="PACFL"):
    axis_sweep.check(config)


def _main(workdir, config, *args):
  cmd = [sys.executable, "-m", "fedjax_dd.experiments.main", config,
         f"--workdir={workdir}", "--config.run.progress=False", *args]
  return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=900)


def test_cli_routes_seeds_to_the_run_axis_and_the_sweep_tool_reads_it(
    tmp_path):
  workdir = str(tmp_path / "sw")
  proc = _main(workdir, "--config=experiments/configs/fedavg.py:smoke",
               "--seeds=0,1", "--config.engine.run_axis=True")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert os.listdir(os.path.join(workdir, "checkpoints"))
  for s in (0, 1):
    d = sweep_lib.seed_dir(workdir, s)
    assert [r["round"] for r in _rows(d)] == [1, 2]
    with open(os.path.join(d, "config.json")) as f:
      recorded = json.load(f)
    assert (recorded["seed"], recorded["data.seed"]) == (s, s)
  out = str(tmp_path / "cmp")
  report = sweep.main([workdir, f"--out={out}"])
  assert report["tables"][0]["seeds"] == [0, 1]
  # Host logic between the jitted steps (CFL's NumPy clustering): one line.
  proc = _main(str(tmp_path / "cfl"),
               "--config=experiments/configs/cfl.py:smoke",
               "--seeds=0,1", "--config.engine.run_axis=True")
  assert proc.returncode == 1
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("FATAL fit_runs: cfl's apply runs host logic"), last
  # A grid's cells share the run axis: without it, refused before the data.
  proc = _main(str(tmp_path / "g"),
               "--config=experiments/configs/fedavg.py:smoke", "--seeds=0",
               "--grid=client.lr=0.1,0.3")
  assert proc.returncode == 1 and "--config.engine.run_axis=True" in (
      proc.stderr), proc.stderr[-2000:]


def test_parse_grid():
  assert axis_sweep.parse_grid(None) is None
  assert axis_sweep.parse_grid("client.lr=0.01,0.03") == ("client.lr",
                                                         [0.01, 0.03])
  for bad, match in (("client.lr", "KEY=V"), ("model.name=a,b", "cannot vary"),
                     ("client.lr=a", "numbers"), ("client.lr=1,1", "twice")):
    with pytest.raises(ValueError, match=match):
      axis_sweep.parse_grid(bad)
  assert axis_sweep.parse_grid("client.weight_decay=0,0.001") == (
      "client.weight_decay", [0.0, 0.001])
  # A key the method does not read: one line, before the data loads.
  with pytest.raises(ValueError,
                     match=r"^--grid: fedavg does not read client.mu \(only "
                     r"fedprox does\)"):
    axis_sweep.check(_config("fedavg"), ("client.mu", [0.01, 0.1]))
  with pytest.raises(ValueError, match="does not read server.lr"):
    axis_sweep.check(_config("fedprox"), ("server.lr", [0.5, 1.0]))
  # SCAFFOLD's client rate is traced into its variate update too.
  axis_sweep.check(_config("scaffold"), ("client.lr", [0.1]))
  axis_sweep.check(_config("scaffold"), ("server.lr", [0.5, 1.0]))


def test_grid_cells_equal_separate_runs(tmp_path):
  """``--grid=client.lr=...``: each cell's rate is traced per run (the
  optimizer of ``common.make_optimizer(lr=...)``), against a run of that
  rate set in the config."""
  config = _config("fedavg")
  axis = str(tmp_path / "axis")
  rates = [0.03, 0.1]
  report = axis_sweep.run_seeds(config, axis, (0, 1), argv=["fedjax-dd"],
                                grid=("client.lr", rates))
  assert [p["x"] for p in report["against"]["series"]["fedavg"]] == rates
  finals = set()
  for lr in rates:
    for seed in (0, 1):
      c = axis_sweep.cell_config(config, seed, ("client.lr", lr))
      single = str(tmp_path / f"single_{lr}_{seed}")
      workdir_lib.record_fingerprint(single, common.fingerprint(c))
      runners.run_federated(c, single)
      d = sweep_lib.seed_dir(os.path.join(axis, f"client.lr_{lr:g}"), seed)
      rows = _rows(d)
      _assert_rows_close(rows, _rows(single))
      finals.add(rows[-1]["train_loss"])
      with open(os.path.join(d, "summary.json")) as f:
        assert json.load(f)["config"]["client"]["lr"] == lr
  assert len(finals) == 4


@pytest.mark.parametrize("method,key,values,rtol", [
    ("fedprox", "client.mu", [0.0, 0.5], RTOL),
    # The decay's term is in every cell's chain, so the cell of 0 adds
    # 0 * w where the run of 0 has no term.
    # These two and FedProx's mu are the default twins of
    # tests/core/test_run_axis_hparams.py's cases that run with -m slow.
    ("fedavg", "client.weight_decay", [0.0, 0.05], RTOL),
    ("feddyn", "feddyn.alpha", [0.01, 0.1], RTOL),
    # SCAFFOLD's two traced rates: tests/core/test_run_axis_hparams.py's
    # test_scaffold_both_rates_traced checks them by default; through the
    # command line with -m slow.
    pytest.param("scaffold", "server.lr", [0.5, 1.5], RTOL,
                 marks=pytest.mark.slow),
    # SCAFFOLD's variate update divides the model change by the client
    # rate, which magnifies the run axis's last-bit differences: on two
    # host devices the test loss differed by 3.7e-5 relative and one
    # training example's prediction flipped (6.6e-4 of train accuracy).
    # The two rates' runs differ by far more than this.
    pytest.param("scaffold", "client.lr", [0.03, 0.1], 2e-3,
                 marks=pytest.mark.slow),
])
def test_traced_grid_keys_equal_separate_runs(tmp_path, method, key, values,
                                             rtol):
  """``--grid=KEY=...`` beyond ``client.lr``: each cell's value reaches the
  method's builder as a tracer through its config
  (``axis_sweep.traced_config``); every row equals a run of that value set
  in the config, to ``RTOL``."""
  config = _config(method)
  axis = str(tmp_path / "axis")
  axis_sweep.run_seeds(config, axis, (1,), argv=["fedjax-dd"],
                       grid=(key, values))
  finals = set()
  for v in values:
    c = axis_sweep.cell_config(config, 1, (key, v))
    single = str(tmp_path / f"single_{v}")
    workdir_lib.record_fingerprint(single, common.fingerprint(c))
    runners.run_federated(c, single)
    d = sweep_lib.seed_dir(os.path.join(axis, f"{key}_{v:g}"), 1)
    rows = _rows(d)
    _assert_rows_close(rows, _rows(single), rtol=rtol)
    finals.add(rows[-1]["train_loss"])
    with open(os.path.join(d, "command.txt")) as f:
      assert f.read().split()[-1] == f"--config.{key}={v}"
  assert len(finals) == len(values)
