"""End-to-end runner smoke tests on sklearn digits: outputs, ledger, resume,
heterogeneous client architectures."""

import dataclasses
import json
import os

import chex
import jax
import numpy as np
import pytest

from fedjax_dd import models
from fedjax_dd.core.ledger import num_params
from fedjax_dd.experiments import registry
from fedjax_dd.experiments import run_fedhydra
from fedjax_dd.experiments.configs import dense as dense_config
from fedjax_dd.experiments.configs import fedhydra as fedhydra_config


@pytest.mark.slow
def test_fedhydra_smoke_then_resume(tmp_path):
  config = fedhydra_config.get_config("smoke")
  workdir = str(tmp_path / "fh")
  summary = run_fedhydra.run(config, workdir)
  for key in ("method", "dataset", "final_test_accuracy", "best_test_accuracy",
              "client_test_accuracy", "os_fedavg_test_accuracy", "U", "U_r",
              "U_c", "stage_seconds", "bytes_uploaded", "wall_seconds",
              "config"):
    assert key in summary, key
  m, c = config.data.num_clients, 10
  assert np.asarray(summary["U_r"]).shape == (c, m)
  np.testing.assert_allclose(np.asarray(summary["U_r"]).sum(1), 1.0, rtol=1e-5)
  assert len(summary["client_test_accuracy"]) == m
  counts = np.asarray(summary["client_class_counts"])
  assert counts.shape == (m, c)
  np.testing.assert_array_equal(counts.sum(1), summary["client_sizes"])
  agree = summary["U_r_vs_class_share"]
  assert -1.0 <= agree["correlation"] <= 1.0
  naming = summary["sa_target_naming"]
  assert set(naming) == {"sa", "sa_predicted", "ae"}
  assert all(0.0 <= v <= 1.0 for v in naming.values())
  assert 0.0 <= agree["argmax_agreement"] <= 1.0
  # One upload per client model, nothing downloaded (the init is a seed).
  assert summary["bytes_uploaded"] == m * summary["param_count"] * 4
  assert summary["bytes_downloaded"] == 0
  for name in ("summary.json", "metrics.jsonl", "u_r.png", "samples.png",
               "accuracy.png"):
    assert os.path.exists(os.path.join(workdir, name)), name
  rows = [json.loads(line) for line in open(
      os.path.join(workdir, "metrics.jsonl"))]
  # One row per epoch; evaluated every eval_every = 2 epochs.
  assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
  assert [r["epoch"] for r in rows if "test_accuracy" in r] == [2, 4]
  assert summary["accuracy_by_epoch"][-1][1] == summary["final_test_accuracy"]
  # Re-running resumes from the checkpoints: same result, no retraining.
  again = run_fedhydra.run(config, workdir)
  assert again["final_test_accuracy"] == summary["final_test_accuracy"]
  assert again["stage_seconds"]["local_training_seconds"] == 0
  assert again["stage_seconds"]["setup_seconds"] == 0
  assert again["sa_target_naming"] == naming


@pytest.mark.slow
def test_fedhydra_multi_round_then_resume(tmp_path, monkeypatch):
  """Paper Tab. 5: clients restart from the distilled model each round."""
  config = fedhydra_config.get_config("smoke")
  config.rounds = 2
  config.dfkd.distill_epochs = 2
  workdir = str(tmp_path / "fh")
  events = []
  declared = registry.get("fedhydra")

  def spy_build(*args, **kwargs):
    algo = declared.server(*args, **kwargs)

    def stage(starts, data, key):
      events.append(("clients", starts))
      return algo.client_stage(starts, data, key)

    def model(state):
      events.append(("model", algo.model(state)))
      return events[-1][1]

    return algo._replace(client_stage=stage, model=model)

  monkeypatch.setitem(registry._DECLARED, "fedhydra",  # pylint: disable=protected-access
                      dataclasses.replace(declared, server=spy_build))
  summary = run_fedhydra.run(config, workdir)
  monkeypatch.undo()
  starts = [e[1][0] for e in events if e[0] == "clients"]
  # The last global model before round 2's clients: round 1's distilled one.
  second = [i for i, e in enumerate(events) if e[0] == "clients"][1]
  distilled = [e[1] for e in events[:second] if e[0] == "model"][-1:]
  # Round 2's clients start from round 1's distilled global model.
  assert len(starts) == 2 and len(distilled) == 1
  chex.assert_trees_all_equal(starts[1], distilled[0])
  with pytest.raises(AssertionError):
    chex.assert_trees_all_equal(starts[0], distilled[0])
  m, size = config.data.num_clients, summary["param_count"] * 4
  assert summary["rounds"] == 2
  assert [r["round"] for r in summary["per_round"]] == [1, 2]
  # Round 1 uploads; round 2 downloads the global model, then uploads.
  assert summary["bytes_uploaded"] == 2 * m * size
  assert summary["bytes_downloaded"] == m * size
  for r in (1, 2):
    assert os.path.isdir(os.path.join(workdir, f"r{r}", "clients")), r
  assert summary["final_test_accuracy"] == summary["per_round"][1]["test_accuracy"]
  again = run_fedhydra.run(config, workdir)
  assert again["per_round"] == summary["per_round"]
  assert again["stage_seconds"]["local_training_seconds"] == 0


@pytest.mark.slow
def test_dense_reuses_fedhydra_clients(tmp_path):
  config = fedhydra_config.get_config("smoke")
  workdir = str(tmp_path / "fh")
  summary = run_fedhydra.run(config, workdir)
  # DENSE on the same clients (teachers_from): identical client accuracies.
  dconf = dense_config.get_config("smoke")
  dconf.server.teachers_from = workdir
  dsum = run_fedhydra.run(dconf, str(tmp_path / "de"))
  assert dsum["client_test_accuracy"] == summary["client_test_accuracy"]
  assert "U" not in dsum and np.isfinite(dsum["final_test_accuracy"])
  assert "sa_target_naming" not in dsum
  # server_seed repeats the server stage over the same clients: the clients
  # are reused, the stratification is drawn anew.
  rconf = fedhydra_config.get_config("smoke")
  rconf.server.teachers_from, rconf.server.seed = workdir, 3
  rsum = run_fedhydra.run(rconf, str(tmp_path / "fh_s3"))
  assert rsum["client_test_accuracy"] == summary["client_test_accuracy"]
  assert rsum["stage_seconds"]["local_training_seconds"] == 0
  assert not np.allclose(rsum["U"], summary["U"])
  # Another client protocol is refused.
  dconf.seed = 1
  with pytest.raises(ValueError, match="client protocol"):
    run_fedhydra.run(dconf, str(tmp_path / "de2"))


def _upload_bytes(names, num_classes, input_shape):
  """Σ_k 4 · |w_k| over the clients' architectures, from the registry."""
  counts = {n: num_params(models.init_model(
      models.get_model(n).build(num_classes), jax.random.PRNGKey(0),
      input_shape)["params"]) for n in set(names)}
  return sum(4 * counts[n] for n in names)


def _check_hetero(config, summary, workdir):
  m = config.data.num_clients
  assert summary["client_models"] == ["cnn2", "digits_cnn", "cnn2"]
  assert len(summary["client_test_accuracy"]) == m
  assert all(0.0 <= a <= 1.0 for a in summary["client_test_accuracy"])
  assert summary["os_fedavg_test_accuracy"] is None
  assert np.isfinite(summary["final_test_accuracy"])
  # Each client uploads its own architecture: 2 x cnn2 + 1 x digits_cnn.
  expected = _upload_bytes(summary["client_models"], 10, (8, 8, 1))
  assert expected == 2 * 54762 * 4 + 53002 * 4
  assert summary["bytes_uploaded"] == expected
  assert summary["bytes_downloaded"] == 0
  # The student is the server model (cnn2), not a client average.
  assert summary["param_count"] == 54762
  assert os.path.isdir(os.path.join(workdir, "r1", "clients"))


def _hetero_run(config_module, workdir):
  """``config_module``'s ``smoke_hetero`` run, checked by
  :func:`_check_hetero`: ``(config, summary)``."""
  config = config_module.get_config("smoke_hetero")
  summary = run_fedhydra.run(config, workdir)
  _check_hetero(config, summary, workdir)
  return config, summary


@pytest.mark.slow
def test_dense_hetero_smoke(tmp_path):
  _, summary = _hetero_run(dense_config, str(tmp_path / "de"))
  assert "U" not in summary


def test_hetero_refusals(tmp_path):
  config = fedhydra_config.get_config("smoke_hetero")
  config.method = "os_fedavg"
  with pytest.raises(ValueError, match="undefined across the client arch"):
    run_fedhydra.run(config, str(tmp_path / "os"))
  config = fedhydra_config.get_config("smoke_hetero")
  config.rounds = 2
  with pytest.raises(ValueError, match="rounds=1"):
    run_fedhydra.run(config, str(tmp_path / "r2"))
  # LeNet-5's two VALID 5x5 convolutions do not fit 8x8 digits.
  config = fedhydra_config.get_config("smoke_hetero")
  config.model.client_models = "cnn2,lenet5"
  with pytest.raises(ValueError, match="'lenet5' does not accept"):
    run_fedhydra.run(config, str(tmp_path / "le"))


@pytest.mark.slow
def test_fedhydra_hetero_smoke_then_resume(tmp_path):
  workdir = str(tmp_path / "fh")
  config, summary = _hetero_run(fedhydra_config, workdir)
  c, m = 10, config.data.num_clients
  for k in ("U", "U_r", "U_c"):
    assert np.asarray(summary[k]).shape == (c, m), k
  np.testing.assert_allclose(np.asarray(summary["U_r"]).sum(1), 1.0, rtol=1e-5)
  # A client's model depends on its id, not on its group: the cnn2 clients 0
  # and 2 equal those of the homogeneous run (one digits test image = 1/360).
  homo = fedhydra_config.get_config("smoke")
  homo.method = "os_fedavg"
  ref = run_fedhydra.run(homo, str(tmp_path / "os"))["client_test_accuracy"]
  got = summary["client_test_accuracy"]
  np.testing.assert_allclose([got[0], got[2]], [ref[0], ref[2]], atol=1.5 / 360)
  assert abs(ref[0] - ref[2]) > 2 / 360  # so a swapped order would fail
  # Re-running resumes every group's clients and the stratification.
  again = run_fedhydra.run(config, workdir)
  assert again["final_test_accuracy"] == summary["final_test_accuracy"]
  assert again["client_test_accuracy"] == summary["client_test_accuracy"]
  assert again["stage_seconds"]["local_training_seconds"] == 0
  assert again["stage_seconds"]["setup_seconds"] == 0


@pytest.mark.slow
def test_independent_init_clients(tmp_path):
  shared_conf = fedhydra_config.get_config("smoke")
  shared_conf.method = "os_fedavg"
  shared = run_fedhydra.run(shared_conf, str(tmp_path / "shared"))
  conf = fedhydra_config.get_config("smoke")
  conf.method = "os_fedavg"
  conf.client.independent_init = True
  own = run_fedhydra.run(conf, str(tmp_path / "own"))
  # Same data and keys, other starts: other clients, another average.
  assert own["client_test_accuracy"] != shared["client_test_accuracy"]
  assert own["os_fedavg_test_accuracy"] != shared["os_fedavg_test_accuracy"]
  # Resuming repeats it; the clients are not retrained.
  again = run_fedhydra.run(conf, str(tmp_path / "own"))
  assert again["client_test_accuracy"] == own["client_test_accuracy"]
  assert again["stage_seconds"]["local_training_seconds"] == 0
  # The client protocol records it: shared-init clients are refused.
  dconf = dense_config.get_config("smoke")
  dconf.client.independent_init = True
  dconf.server.teachers_from = str(tmp_path / "shared")
  with pytest.raises(ValueError, match="independent_init"):
    run_fedhydra.run(dconf, str(tmp_path / "de"))
  # From round 2 the clients start from the distilled model: refused.
  conf.rounds = 2
  with pytest.raises(ValueError, match="rounds = 1"):
    run_fedhydra.run(conf, str(tmp_path / "two"))


# tests/core/test_server.py checks the same stage's spans and budget by
# default; this is the same through the runner.
@pytest.mark.slow
def test_clients_in_spans_stop_on_the_budget_and_resume(tmp_path):
  """``run.client_span_steps`` with a spent budget: the run stops after one
  span and its summary says how far the clients got; the next call
  finishes them, and the clients equal those of one call."""
  conf = fedhydra_config.get_config("smoke")
  conf.method = "os_fedavg"
  whole = run_fedhydra.run(conf, str(tmp_path / "whole"))
  conf.run.client_span_steps = 5
  conf.run.max_wall_seconds = 1e-9
  stopped = run_fedhydra.run(conf, str(tmp_path / "spans"))
  assert stopped["stopped_by_time_budget"]
  assert stopped["final_test_accuracy"] is None
  assert stopped["client_steps_done"] == 5
  assert stopped["client_steps_total"] > 5
  conf.run.max_wall_seconds = 0.0
  done = run_fedhydra.run(conf, str(tmp_path / "spans"))
  assert not done["stopped_by_time_budget"]
  assert done["client_test_accuracy"] == whole["client_test_accuracy"]
  assert done["os_fedavg_test_accuracy"] == whole["os_fedavg_test_accuracy"]
  assert not os.path.exists(tmp_path / "spans" / "r1" / "client_spans")
