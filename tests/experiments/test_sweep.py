"""Seed sweeps through the entry point, and method comparisons."""

import json
import os
import shlex
import subprocess
import sys

import ml_collections
import pytest

from fedjax_dd.experiments import sweep
from fedjax_dd.experiments.configs import fedavg
from fedjax_dd.utils import sweep as sweep_lib
from tests.conftest import REPO_ROOT
from tests.experiments.test_entrypoint import _read


def test_seed_command_replaces_workdir_and_seeds():
  argv = ["/x/experiments/main.py", "--config=experiments/configs/fedavg.py:smoke",
          "--workdir", "/tmp/w", "--seeds=0,1", "--config.rounds=3",
          "--config.run.progress=False"]
  assert sweep.seed_args(argv, "/tmp/w", 1) == [
      "--config=experiments/configs/fedavg.py:smoke", "--config.rounds=3",
      "--config.run.progress=False", "--workdir=/tmp/w/seed_1",
      "--config.seed=1", "--config.data.seed=1"]
  cmd = sweep.seed_command(argv + ["--config.model.name=a b"], "/tmp/w", 7)
  assert shlex.split(cmd)[0] == "fedjax-dd"
  assert "'--config.model.name=a b'" in cmd  # shell-quoted
  assert cmd.endswith("--workdir=/tmp/w/seed_7 --config.seed=7 "
                      "--config.data.seed=7")
  assert sweep.seed_flags_in(["p", "--config.seed=3", "--config.seeds_x=1",
                              "--config.data.seed", "4",
                              "--config.data.seeds=5"]) == [
                                  "--config.seed=3", "--config.data.seed"]
  # The seed flags are dropped from a sweep's command line, both spellings.
  assert sweep.seed_args(["p", "--config.data.seed", "4", "--config.seed=2",
                          "--config.rounds=1"], "/w", 0) == [
      "--config.rounds=1", "--workdir=/w/seed_0", "--config.seed=0",
      "--config.data.seed=0"]


def test_parse_seeds():
  assert sweep.parse_seeds("0, 1,2") == [0, 1, 2]
  assert sweep.parse_seeds(["3", "5"]) == [3, 5]
  with pytest.raises(ValueError, match="repeat"):
    sweep.parse_seeds("1,1")
  with pytest.raises(ValueError, match="names no seed"):
    sweep.parse_seeds("")


def _fake_runner(calls):
  """Writes a summary and two rounds whose accuracy is 0.1 * (seed + 1)."""

  def run(config, workdir):
    calls.append((config.seed, config.data.seed, workdir))
    os.makedirs(workdir, exist_ok=True)
    acc = 0.1 * (config.seed + 1)
    rows = [{"round": r, "test_accuracy": acc * r / 2,
             "bytes_total_cumulative": 10 * r} for r in (1, 2)]
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    summary = {"method": config.method, "dataset": "toy", "rounds": 2,
               "final_test_accuracy": acc, "best_test_accuracy": acc,
               "bytes_total": 20, "wall_seconds": 1.0,
               "stopped_by_time_budget": False, "config": config.to_dict()}
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump(summary, f)
    return summary

  return run


def _toy_config():
  return ml_collections.ConfigDict({
      "method": "toy", "seed": 0, "rounds": 2,
      "data": {"dataset": "toy", "seed": 0, "input_shape": (8, 8, 1)},
      "run": {"progress": True}})


def test_run_seeds_skips_finished_seeds(tmp_path):
  wd = str(tmp_path / "sw")
  argv = ["fedjax-dd", "--config=c.py", f"--workdir={wd}", "--seeds=0,1"]
  calls = []
  report = sweep.run_seeds(_toy_config(), wd, [0, 1], argv=argv,
                           runner=_fake_runner(calls))
  assert [(s, ds) for s, ds, _ in calls] == [(0, 0), (1, 1)]
  assert [d for _, _, d in calls] == [sweep_lib.seed_dir(wd, s) for s in (0, 1)]
  (table,) = report["tables"]
  # Final accuracies 0.1 and 0.2: mean 0.15, sample sd 0.1 / sqrt(2).
  assert table["stats"]["final_test_accuracy"]["mean"] == pytest.approx(0.15)
  assert table["stats"]["final_test_accuracy"]["sd"] == pytest.approx(
      0.1 / 2 ** 0.5)
  assert table["runs"][1]["command"] == (
      f"fedjax-dd --config=c.py --workdir={wd}/seed_1 --config.seed=1 "
      "--config.data.seed=1")
  for name in ("sweep.md", "sweep.json", "sweep_curves.png"):
    assert os.path.isfile(os.path.join(wd, name)), name
  # Same config (a cosmetic key aside): nothing runs again.
  config = _toy_config()
  config.run.progress = False
  sweep.run_seeds(config, wd, [0, 1], argv=argv, runner=_fake_runner(calls))
  assert len(calls) == 2
  # Another config or a run cut short by its time budget runs (resumes).
  config.rounds = 3
  sweep.run_seeds(config, wd, [1], argv=argv, runner=_fake_runner(calls))
  path = os.path.join(sweep_lib.seed_dir(wd, 0), "summary.json")
  with open(path) as f:
    summary = json.load(f)
  summary["stopped_by_time_budget"] = True
  with open(path, "w") as f:
    json.dump(summary, f)
  sweep.run_seeds(_toy_config(), wd, [0], argv=argv, runner=_fake_runner(calls))
  assert [(s, ds) for s, ds, _ in calls[2:]] == [(1, 1), (0, 0)]


def test_run_seeds_checks_the_summary_seed(tmp_path):
  def wrong_seed(config, workdir):
    config = ml_collections.ConfigDict(config.to_dict())
    config.seed = 99
    return _fake_runner([])(config, workdir)

  with pytest.raises(RuntimeError, match="not 0"):
    sweep.run_seeds(_toy_config(), str(tmp_path), [0], argv=["p"],
                    runner=wrong_seed)


def test_compare_labels_and_single_runs(tmp_path):
  argv = ["p"]
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  sweep.run_seeds(_toy_config(), a, [0, 1], argv=argv, runner=_fake_runner([]))
  sweep.run_seeds(_toy_config(), b, [2], argv=argv, runner=_fake_runner([]))
  single = sweep_lib.seed_dir(b, 2)  # a run's own workdir works too
  out = str(tmp_path / "cmp")
  report = sweep.main([a, f"mine={b}", single, f"--out={out}", "--title=t"])
  labels = [t["name"] for t in report["tables"]]
  assert labels == ["toy", "mine", "toy (seed_2)"]
  assert [t["num_seeds"] for t in report["tables"]] == [2, 1, 1]
  for name in ("compare.md", "compare.json", "compare_curves.png"):
    assert os.path.isfile(os.path.join(out, name)), name
  with pytest.raises(ValueError, match="does not exist"):
    sweep.compare([str(tmp_path / "nothing")], out)
  # --against: one point per DIR at its config value (here the model seed).
  report = sweep.main([f"mine={b}", f"--out={out}", "--against=seed"])
  assert [p["x"] for p in report["against"]["series"]["toy"]] == [2]
  assert os.path.isfile(os.path.join(out, "compare_against.png"))
  with pytest.raises(ValueError, match="disagree"):
    sweep.compare([a], out, against="seed")  # seeds 0 and 1
  with pytest.raises(SystemExit):  # the command: one line, no traceback
    sweep.main([a, f"--out={out}", "--against=seed"])


@pytest.mark.slow
def test_cli_sweep_over_two_seeds_of_fedavg_smoke(tmp_path):
  workdir = str(tmp_path / "sw")
  cmd = [sys.executable, "-m", "fedjax_dd.experiments.main",
         "--config=experiments/configs/fedavg.py:smoke",
         f"--workdir={workdir}", "--seeds=0,1", "--config.run.progress=False"]
  proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in ("sweep.md", "sweep.json", "sweep_curves.png"):
    assert os.path.getsize(os.path.join(workdir, name)) > 0, name
  (s0, rows0), (s1, rows1) = (_read(sweep_lib.seed_dir(workdir, s))
                              for s in (0, 1))
  # Each run used its own partition and model seed ...
  assert (s0["config"]["seed"], s0["config"]["data"]["seed"]) == (0, 0)
  assert (s1["config"]["seed"], s1["config"]["data"]["seed"]) == (1, 1)
  assert rows0[0]["train_loss"] != rows1[0]["train_loss"]
  # Each seed's workdir records its own settings (resume checks them).
  for s in (0, 1):
    with open(os.path.join(sweep_lib.seed_dir(workdir, s), "config.json")) as f:
      recorded = json.load(f)
    assert (recorded["seed"], recorded["data.seed"]) == (s, s)
  assert not os.path.exists(os.path.join(workdir, "config.json"))
  # ... and everything else of the preset.
  preset = fedavg.get_config("smoke").to_dict()
  for group, key in (("data", "num_clients"), (None, "rounds"),
                     ("client", "batch_size"), ("client", "lr"),
                     ("model", "name")):
    get = lambda d: d[group][key] if group else d[key]
    assert get(s0["config"]) == get(s1["config"]) == get(preset), key
  with open(os.path.join(workdir, "sweep.json")) as f:
    report = json.load(f)
  (table,) = report["tables"]
  assert table["seeds"] == [0, 1]
  finals = [s0["final_test_accuracy"], s1["final_test_accuracy"]]
  assert table["stats"]["final_test_accuracy"]["mean"] == pytest.approx(
      sum(finals) / 2)
  assert table["stats"]["final_test_accuracy"]["sd"] == pytest.approx(
      abs(finals[0] - finals[1]) / 2 ** 0.5)
  assert table["runs"][1]["command"] == (
      "fedjax-dd --config=experiments/configs/fedavg.py:smoke "
      f"--config.run.progress=False --workdir={workdir}/seed_1 --config.seed=1 "
      "--config.data.seed=1")
  assert report["curves"]["fedavg"]["x"] == [1, 2]
  assert report["curves"]["fedavg"]["bytes_mean"] == [
      rows0[0]["bytes_total_cumulative"], rows0[1]["bytes_total_cumulative"]]
  with open(os.path.join(workdir, "sweep.md")) as f:
    assert table["runs"][0]["command"] in f.read()
  # Re-running skips the finished seeds: their summaries stay as they were.
  proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "seed 0: finished" in proc.stdout and "seed 1: finished" in proc.stdout
  assert _read(sweep_lib.seed_dir(workdir, 0))[0] == s0
  # The sweep sets the seeds itself.
  proc = subprocess.run(cmd + ["--config.seed=3"], cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode != 0 and "--seeds sets config.seed" in proc.stderr


def test_unfinished_seeds_are_named_not_averaged_silently(tmp_path, capsys):
  a = str(tmp_path / "a")
  sweep.run_seeds(_toy_config(), a, [0, 1], argv=["p"],
                  runner=_fake_runner([]))
  # Seed 1 resumed for more rounds and killed: its summary was removed.
  os.remove(os.path.join(sweep_lib.seed_dir(a, 1), "summary.json"))
  report = sweep.compare([a], str(tmp_path / "out"))
  assert [t["num_seeds"] for t in report["tables"]] == [1]
  assert (f"{sweep_lib.seed_dir(a, 1)} has no summary.json (not finished): "
          "left out of the report.") in capsys.readouterr().err
  os.remove(os.path.join(sweep_lib.seed_dir(a, 0), "summary.json"))
  with pytest.raises(ValueError, match="none of its runs has finished"):
    sweep.compare([a], str(tmp_path / "out"))
