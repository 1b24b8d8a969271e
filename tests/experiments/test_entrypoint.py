"""The console entry point: files, summary keys, resume and continue."""

import json
import os
import subprocess
import sys

import pytest

from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import centralized, fedavg, fedd3, os_fedavg
from tests.conftest import REPO_ROOT

SUMMARY_KEYS = {"method", "dataset", "final_test_accuracy", "best_test_accuracy",
                "wall_seconds", "config", "rounds", "bytes_uploaded",
                "bytes_downloaded", "bytes_total", "num_clients", "param_count"}


def _read(workdir):
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return summary, rows


@pytest.mark.slow
def test_console_script_centralized_smoke(tmp_path):
  workdir = str(tmp_path / "c")
  proc = subprocess.run(
      [sys.executable, "-m", "fedjax_dd.experiments.main",
       "--config=experiments/configs/centralized.py:smoke",
       f"--workdir={workdir}", "--config.run.progress=False"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary, rows = _read(workdir)
  assert SUMMARY_KEYS <= set(summary)
  assert summary["method"] == "centralized" and summary["dataset"] == "digits"
  assert 0.0 <= summary["final_test_accuracy"] <= 1.0
  assert summary["best_test_accuracy"] >= summary["final_test_accuracy"]
  assert [r["round"] for r in rows] == [1, 2]
  assert summary["bytes_total"] == 0


@pytest.mark.parametrize("override, nearest", [
    ("--config.clinet.lr=0.1", "client"),          # a misspelled group
    pytest.param("--config.client.lrr=0.1", "client.lr",  # a key in one
                 marks=pytest.mark.slow),
    pytest.param("--config.data_seed=1", "data.seed",     # a flat old name
                 marks=pytest.mark.slow),
])
def test_unknown_override_is_a_one_line_usage_error(tmp_path, override,
                                                    nearest):
  proc = subprocess.run(
      [sys.executable, "-m", "fedjax_dd.experiments.main",
       "--config=experiments/configs/fedavg.py:smoke",
       f"--workdir={tmp_path / 'w'}", override],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode != 0
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr[-3000:]     # no traceback
  key = override.split("=")[0].removeprefix("--config.").split(".")
  assert lines[0].startswith("FATAL Flags parsing error: Unknown config key ")
  assert f"did you mean {nearest}" in lines[0], lines[0]
  assert override.split("=")[0] in lines[0] and key[-1] in lines[0]
  assert not os.path.exists(tmp_path / "w")


def test_diverging_run_exits_non_zero_with_one_line(tmp_path):
  workdir = tmp_path / "nan"
  proc = subprocess.run(
      [sys.executable, "-m", "fedjax_dd.experiments.main",
       "--config=experiments/configs/fedavg.py:smoke", f"--workdir={workdir}",
       "--config.client.lr=1e20", "--config.run.progress=False"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 1
  fatal = [l for l in proc.stderr.splitlines() if l.startswith("FATAL")]
  assert len(fatal) == 1 and "rounds: step 1 produced non-finite" in fatal[0]
  assert "Traceback" not in proc.stderr
  assert not os.path.exists(workdir / "summary.json")


@pytest.mark.parametrize("override", [
    "--config.run.eval_every=0",
    pytest.param("--config.rounds=0", marks=pytest.mark.slow),
    pytest.param("--config.client.lr=nan", marks=pytest.mark.slow)])
def test_unusable_settings_are_refused_before_compute(tmp_path, override):
  workdir = tmp_path / "bad"
  proc = subprocess.run(
      [sys.executable, "-m", "fedjax_dd.experiments.main",
       "--config=experiments/configs/fedavg.py:smoke", f"--workdir={workdir}",
       override], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode != 0
  path = override.split("=")[0].removeprefix("--")
  assert f"{path} must be" in proc.stderr, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert not os.path.exists(workdir)


def test_workdir_in_use_or_a_file_is_refused_before_compute(tmp_path):
  from fedjax_dd.core.workdir import WorkdirLock
  cmd = [sys.executable, "-m", "fedjax_dd.experiments.main",
         "--config=experiments/configs/fedavg.py:smoke"]
  busy = tmp_path / "busy"
  with WorkdirLock(busy):
    proc = subprocess.run(cmd + [f"--workdir={busy}"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert f"in use by pid {os.getpid()}" in proc.stderr, proc.stderr[-2000:]
  assert not os.path.exists(busy / "metrics.jsonl")
  afile = tmp_path / "afile"
  afile.write_text("x")
  proc = subprocess.run(cmd + [f"--workdir={afile}"], cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode != 0 and "is a file" in proc.stderr


def test_fedavg_resume_with_more_rounds_continues(tmp_path):
  workdir = str(tmp_path / "f")
  config = fedavg.get_config("smoke")
  config.run.progress = False
  # A spent time budget still runs (and checkpoints) one round ...
  config.run.max_wall_seconds = 1e-9
  budgeted = registry.run(config, workdir)
  assert budgeted["rounds"] == 1 and budgeted["stopped_by_time_budget"]
  # ... and the run resumes from it.
  config.run.max_wall_seconds = 0.0
  first = registry.run(config, workdir)
  assert not first["stopped_by_time_budget"]
  _, rows2 = _read(workdir)
  config.rounds = 3
  second = registry.run(config, workdir)
  _, rows3 = _read(workdir)
  assert [r["round"] for r in rows3] == [1, 2, 3]
  assert rows3[:2] == rows2
  assert second["rounds"] == 3 and first["rounds"] == 2
  # HFLDD Eq. 3 over 3 rounds of 8 clients: 8 * (2 * 3 - 1) * |w| * 4 bytes.
  assert second["bytes_total"] == 8 * 5 * second["param_count"] * 4
  # Each summary has this process's time and the run's over the three
  # processes (each checkpoint records the total so far).
  assert budgeted["wall_seconds_total"] == pytest.approx(
      budgeted["wall_seconds"], abs=1e-3)
  assert first["wall_seconds_total"] > budgeted["wall_seconds_total"]
  assert second["wall_seconds_total"] > first["wall_seconds_total"]
  assert second["wall_seconds_total"] > second["wall_seconds"]


def test_os_fedavg_and_fedd3_smoke(tmp_path):
  config = os_fedavg.get_config("smoke")
  config.run.progress = False
  s = registry.run(config, str(tmp_path / "os"))
  assert s["rounds"] == 1 and s["bytes_downloaded"] == 0
  assert s["bytes_uploaded"] == 8 * s["param_count"] * 4
  config = fedd3.get_config("smoke")
  config.run.progress = False
  config.rounds = 2
  s = registry.run(config, str(tmp_path / "d3"))
  assert s["distilled_images_total"] == 40  # 10 clients x 2 classes x 2 img/cls
  assert s["bytes_total"] == 40 * 64 + 40  # uint8 pixels + one byte per label
  assert set(s["gce"]) == {"0.01", "0.5"}
  assert os.path.exists(tmp_path / "d3" / "distilled_grid.png")


def test_unknown_preset_raises():
  with pytest.raises(ValueError, match="Unknown preset"):
    centralized.get_config("nope")


def test_os_fedavg_a05_trains_the_same_clients_as_fedhydra():
  from fedjax_dd.experiments.configs import fedhydra as fedhydra_config
  from fedjax_dd.experiments.configs import os_fedavg as os_config
  os_c, fh_c = os_config.get_config("mnist_a0.5"), fedhydra_config.get_config(
      "mnist_a0.5")
  from fedjax_dd.experiments import common
  from fedjax_dd.experiments.configs import base as base_config
  # The client protocol: every field teachers_from checks.
  for path in base_config.fingerprint_paths("client_protocol"):
    assert common.config_value(os_c, path) == common.config_value(
        fh_c, path), path


def _cli(workdir, *overrides, config="experiments/configs/fedavg.py:smoke"):
  return [sys.executable, "-m", "fedjax_dd.experiments.main",
          f"--config={config}", f"--workdir={workdir}",
          "--config.run.progress=False", *overrides]


def _rounds(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line)["round"] for line in f]


def test_multihost_outside_a_cluster_is_one_usage_line_before_any_file(
    tmp_path):
  # No cluster jax could discover: no SLURM, MPI or Kubernetes variables.
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("SLURM_", "OMPI_", "PMI_", "KUBERNETES_",
                              "JAX_COORDINATOR", "TPU_"))}
  workdir = tmp_path / "w"
  proc = subprocess.run(_cli(workdir, "--config.engine.multihost=True"),
                        cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=600, env=env)
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  (line,) = [l for l in proc.stderr.splitlines()
             if "--config.engine.multihost=True" in l]
  assert "jax.distributed could not start" in line
  assert "Several processes" in line
  assert not workdir.exists()                  # refused before anything ran


@pytest.mark.slow
def test_resume_with_other_settings_is_refused_before_the_data_loads(
    tmp_path):
  workdir = tmp_path / "w"
  run = lambda *o: subprocess.run(_cli(workdir, *o), cwd=REPO_ROOT,
                                  capture_output=True, text=True, timeout=600)
  proc = run("--config.rounds=1")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (workdir / "config.json").is_file()
  proc = run("--config.rounds=1", "--config.data.num_clients=4")
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr
  (line,) = [l for l in proc.stderr.splitlines() if "other settings" in l]
  assert "data.num_clients was 8, now 4" in line, line
  assert "new --workdir" in line and "revert" in line
  assert _rounds(workdir) == [1]                      # nothing was touched
  # Resume-safe settings (more rounds, another evaluation cadence) resume.
  proc = run("--config.rounds=2", "--config.run.eval_every=2")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert _rounds(workdir) == [1, 2]
  # A workdir made before fingerprints resumes with one warning.
  os.remove(workdir / "config.json")
  proc = run("--config.rounds=3")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert len([l for l in proc.stderr.splitlines()
              if "has no config.json" in l]) == 1
  assert _rounds(workdir) == [1, 2, 3]
  assert (workdir / "config.json").is_file()
  # A setting the recorded run predates (simulated by dropping it from the
  # record) resumes at its preset value, and is refused when changed.
  recorded = json.loads((workdir / "config.json").read_text())
  del recorded["client.grad_clip"]
  (workdir / "config.json").write_text(json.dumps(recorded))
  proc = run("--config.rounds=3", "--config.client.grad_clip=5")
  assert proc.returncode != 0 and "client.grad_clip was" in proc.stderr
  proc = run("--config.rounds=4")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert _rounds(workdir) == [1, 2, 3, 4]


@pytest.mark.slow
def test_resume_on_another_host_device_count_warns_once_and_is_recorded(
    tmp_path):
  workdir = tmp_path / "w"
  env = {k: v for k, v in os.environ.items()
         if k not in ("XLA_FLAGS", "FEDJAX_DD_NO_XLA_FLAGS")}
  run = lambda devices, *o: subprocess.run(
      _cli(workdir, *o), cwd=REPO_ROOT, capture_output=True, text=True,
      timeout=600, env=dict(env, FEDJAX_DD_HOST_DEVICES=str(devices)))
  proc = run(1, "--config.rounds=1")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "another environment" not in proc.stderr
  proc = run(2, "--config.rounds=2")
  assert proc.returncode == 0, proc.stderr[-3000:]    # resumed, not refused
  (line,) = [l for l in proc.stderr.splitlines()
             if "started in another environment" in l]
  assert "(devices 1 -> 2)" in line and "FEDJAX_DD_HOST_DEVICES=1" in line
  assert _rounds(workdir) == [1, 2]
  summary, _ = _read(workdir)
  started, (resumed,) = (summary["environment"]["started"],
                         summary["environment"]["resumed"])
  assert (started["devices"], resumed["devices"]) == (1, 2)
  assert started["platform"] == resumed["platform"] == "cpu"


def test_ctrl_c_exits_130_naming_the_checkpoint_and_resumes(tmp_path):
  import signal
  import time
  workdir = tmp_path / "w"
  # Far more rounds than run before the signal lands, so the run cannot end
  # on its own first (12 rounds sometimes did).
  # The child handles SIGINT as under a terminal: a suite launched in the
  # background (`cmd &` in a script) inherits SIGINT ignored, and Python then
  # installs no KeyboardInterrupt handler, so the signal would be dropped and
  # the run would end on its own. The child installs it itself (a
  # preexec_fn would fork this process, whose JAX threads make a fork
  # unsafe: Python warns of it).
  command = _cli(workdir, "--config.rounds=500")
  assert command[1:3] == ["-m", "fedjax_dd.experiments.main"]
  command[1:3] = ["-c", "import runpy, signal; signal.signal(signal.SIGINT, "
                  "signal.default_int_handler); runpy.run_module("
                  "'fedjax_dd.experiments.main', run_name='__main__', "
                  "alter_sys=True)"]
  proc = subprocess.Popen(
      command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)
  metrics = workdir / "metrics.jsonl"
  deadline = time.time() + 600
  # Two rows: round 1's checkpoint is committed (saved after its row).
  while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
    assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
    time.sleep(0.02)
  proc.send_signal(signal.SIGINT)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 130, stderr[-3000:]
  assert "Traceback" not in stderr
  (line,) = [l for l in stderr.splitlines() if l.startswith("Interrupted")]
  assert f"the run in {workdir} stopped" in line
  assert "newest checkpoint is checkpoints" in line
  assert "Re-running the same command resumes" in line
  # The lock is released and the command resumes; with two rounds more than
  # were logged (the number of rounds is a resume-safe setting) it finishes.
  total = len(_rounds(workdir)) + 2
  done = subprocess.run(_cli(workdir, f"--config.rounds={total}"),
                        cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert _rounds(workdir) == list(range(1, total + 1))


@pytest.mark.parametrize("override, wanted", [
    ("--config.client.local_epochs=0", "set --config.client.local_epochs > 0"),
    ("--config.data.partition.name=dirichlet",
     "'dirichlet' does not fit the config's partition options: it does not "
     "take num_classes_per_client, style and it needs alpha"),
])
def test_local_training_and_partition_options_refused_before_compute(
    tmp_path, override, wanted):
  proc = subprocess.run(_cli(tmp_path / "bad", override), cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode != 0
  assert wanted in proc.stderr, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr and "max_steps" not in proc.stderr
  assert not os.path.exists(tmp_path / "bad")


def test_a_damaged_finished_workdir_is_refused_and_keeps_its_rows(tmp_path):
  # Before: checkpoints/ replaced by a file restarted the finished run at
  # round 0, emptying metrics.jsonl before computing anything (issue 76).
  import shutil  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "w"

  def run():
    return subprocess.run(
        [sys.executable, "-m", "fedjax_dd.experiments.main",
         "--config=experiments/configs/fedavg.py:smoke",
         f"--workdir={workdir}", "--config.run.progress=False"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)

  assert run().returncode == 0
  rows = (workdir / "metrics.jsonl").read_text()
  assert len(rows.splitlines()) == 2
  shutil.move(workdir / "checkpoints", tmp_path / "kept")
  (workdir / "checkpoints").write_text("x")
  proc = run()
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert (f"The workdir {workdir} is damaged: {workdir}/checkpoints is a "
          "file, where a run keeps a directory") in proc.stderr
  assert (workdir / "metrics.jsonl").read_text() == rows
  # Every checkpoint damaged: the fresh start that would erase the rows is
  # refused, naming the skipped steps.
  (workdir / "checkpoints").unlink()
  shutil.move(tmp_path / "kept", workdir / "checkpoints")
  for step in ("1", "2"):
    for f in sorted((workdir / "checkpoints" / step).rglob("*")):
      if f.is_file() and f.stat().st_size > 100 and (
          f.name != "fedjax_dd_commit.json"):
        f.write_bytes(f.read_bytes()[:10])
        break
  proc = run()
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith(f"FATAL {workdir}/metrics.jsonl holds 2 rows of an "
                         "earlier run and every committed checkpoint"), last
  assert (workdir / "metrics.jsonl").read_text() == rows
