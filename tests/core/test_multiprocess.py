"""Two processes on localhost (jax.distributed) train like one process."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO_ROOT

_MODULE = "fedjax_dd.experiments.multiprocess_smoke"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices: int) -> dict:
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if "host_platform_device_count" not in f]
  env["XLA_FLAGS"] = " ".join(
      flags + [f"--xla_force_host_platform_device_count={devices}"])
  env["JAX_PLATFORMS"] = "cpu"
  return env


@pytest.mark.multidevice
def test_two_processes_equal_one_process(tmp_path):
  """The launch in docs/getting_started.md ("Several processes"): 2
  processes of 1 CPU device each run FedAvg with the client axis sharded
  over both; both end with the parameters of one
  process running the same over 2 devices."""
  out = str(tmp_path / "params")
  coordinator = f"127.0.0.1:{_free_port()}"
  procs = [subprocess.Popen(
      [sys.executable, "-m", _MODULE, f"--coordinator={coordinator}",
       "--num_processes=2", f"--process_id={pid}", f"--out={out}_multi"],
      env=_env(1), cwd=REPO_ROOT, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for pid in (0, 1)]
  results = [p.communicate(timeout=600) for p in procs]
  for p, (stdout, stderr) in zip(procs, results):
    assert p.returncode == 0, stderr[-3000:]
    assert "DONE 2 3" in stdout, stdout
  single = subprocess.run(
      [sys.executable, "-m", _MODULE, "--num_processes=1",
       f"--out={out}_single"], env=_env(2), cwd=REPO_ROOT,
      capture_output=True, text=True, timeout=600)
  assert single.returncode == 0, single.stderr[-3000:]
  assert "DONE 1 3" in single.stdout
  runs = [np.load(f"{out}_multi_0.npz"), np.load(f"{out}_multi_1.npz"),
          np.load(f"{out}_single_0.npz")]
  assert runs[0].files and len(runs[0].files) == len(runs[2].files)
  for name in runs[0].files:
    np.testing.assert_array_equal(runs[0][name], runs[1][name])
    np.testing.assert_array_equal(runs[0][name], runs[2][name])
