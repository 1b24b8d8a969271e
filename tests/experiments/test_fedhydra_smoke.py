"""End-to-end runner smoke test on sklearn digits: outputs, ledger, resume."""

import json
import os

import numpy as np
import pytest

from fedjax_dd.experiments import run_fedhydra
from fedjax_dd.experiments.configs import dense as dense_config
from fedjax_dd.experiments.configs import fedhydra as fedhydra_config


def test_fedhydra_smoke_then_resume(tmp_path):
  config = fedhydra_config.get_config("smoke")
  workdir = str(tmp_path / "fh")
  summary = run_fedhydra.run(config, workdir)
  for key in ("method", "dataset", "final_test_accuracy", "best_test_accuracy",
              "client_test_accuracy", "os_fedavg_test_accuracy", "U", "U_r",
              "U_c", "stage_seconds", "bytes_uploaded", "wall_seconds",
              "config"):
    assert key in summary, key
  m, c = config.num_clients, 10
  assert np.asarray(summary["U_r"]).shape == (c, m)
  np.testing.assert_allclose(np.asarray(summary["U_r"]).sum(1), 1.0, rtol=1e-5)
  assert len(summary["client_test_accuracy"]) == m
  # One upload per client model, nothing downloaded (the init is a seed).
  assert summary["bytes_uploaded"] == m * summary["param_count"] * 4
  assert summary["bytes_downloaded"] == 0
  for name in ("summary.json", "metrics.jsonl", "u_r.png", "samples.png",
               "accuracy.png"):
    assert os.path.exists(os.path.join(workdir, name)), name
  epochs = [r["epoch"] for r in map(json.loads, open(
      os.path.join(workdir, "metrics.jsonl")))]
  assert epochs == [2, 4]
  # Re-running resumes from the checkpoints: same result, no retraining.
  again = run_fedhydra.run(config, workdir)
  assert again["final_test_accuracy"] == summary["final_test_accuracy"]
  assert "local_training_seconds" not in again["stage_seconds"]
  assert "stratification_seconds" not in again["stage_seconds"]


@pytest.mark.slow
def test_dense_reuses_fedhydra_clients(tmp_path):
  config = fedhydra_config.get_config("smoke")
  workdir = str(tmp_path / "fh")
  summary = run_fedhydra.run(config, workdir)
  # DENSE on the same clients (teachers_from): identical client accuracies.
  dconf = dense_config.get_config("smoke")
  dconf.teachers_from = workdir
  dsum = run_fedhydra.run(dconf, str(tmp_path / "de"))
  assert dsum["client_test_accuracy"] == summary["client_test_accuracy"]
  assert "U" not in dsum and np.isfinite(dsum["final_test_accuracy"])
  # Another client protocol is refused.
  dconf.seed = 1
  with pytest.raises(ValueError, match="client protocol"):
    run_fedhydra.run(dconf, str(tmp_path / "de2"))
