"""DisUE and its baselines from their configs: presets, runs, summaries."""

import json

import numpy as np
import pytest

from fedjax_dd.experiments import common
from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import disue as disue_config
from fedjax_dd.experiments.configs import fedavg, feddf_datafree, fedftg, ifca
from fedjax_dd.experiments.configs import fedprox, scaffold

CONFIGS = {"disue": disue_config, "fedftg": fedftg,
           "feddf_datafree": feddf_datafree, "ifca": ifca, "fedavg": fedavg,
           "fedprox": fedprox, "scaffold": scaffold}


@pytest.mark.parametrize("method", sorted(CONFIGS))
@pytest.mark.parametrize("arg", disue_config.PRESETS)
def test_every_preset_follows_the_protocol_and_validates(method, arg):
  c = CONFIGS[method].get_config(arg)
  assert c.method == method
  common.validate(c)
  if arg == "smoke":
    return
  # DisUE Sec. 5.1: N = 100, Act = 0.15, 5 epochs of batch 50, SGD lr 0.1
  # decaying 0.998 per round, weight decay 1e-3, clip 10, flip and crop.
  assert c.data.num_clients == 100 and c.client.clients_per_round == 15
  assert c.data.partition.name == "dirichlet_client"
  assert (c.client.local_epochs, c.client.batch_size, c.client.lr,
          c.client.lr_decay, c.client.weight_decay, c.client.grad_clip,
          c.client.augment) == (5.0, 50, 0.1, 0.998, 1e-3, 10.0, "flip_crop")
  assert c.model.name == ("resnet18" if arg.endswith(("_gpu", "_paper")) else
                          "lenet5" if arg.startswith("fmnist") else "cnn3")
  assert c.iga.nz == (256 if arg == "cifar100_gpu" else 100)
  assert c.rounds == 500


def test_fedprox_and_scaffold_keep_their_own_settings_under_disue():
  assert fedprox.get_config("fmnist_dir0.01").client.mu == 0.01
  assert fedavg.get_config("fmnist_dir0.01").client.mu == 0.0
  assert scaffold.get_config("fmnist_dir0.01").server.lr == 1.0
  # Their own presets are untouched: FedD3's protocol keeps mu = 0.1.
  assert fedprox.get_config("mnist_fedd3").client.mu == 0.1


def _smoke(method, **overrides):
  c = CONFIGS[method].get_config("smoke")
  c.run.progress = False
  c.rounds = 1
  for k, v in overrides.items():
    c[k.split("__")[0]][k.split("__")[1]] = v
  return c


def test_disue_smoke_summary(tmp_path):
  s = registry.run(_smoke("disue"), str(tmp_path / "d"))
  with open(tmp_path / "d" / "summary.json") as f:
    assert json.load(f)["num_clusters_by_round"] == s["num_clusters_by_round"]
  assert s["method"] == "disue"
  [[r, k]] = s["num_clusters_by_round"]
  assert r == 1 and 1 <= k <= 4
  assert s["ap_converged_rounds"] in (0, 1)
  assert s["bytes_by_tag"]["class_counts"] * 8 == 4 * 10 * 32
  assert s["bytes_total"] == sum(s["bytes_by_tag"].values())
  assert np.isfinite(s["final_test_accuracy"])


@pytest.mark.parametrize("method", ["fedftg", "feddf_datafree", "ifca"])
def test_baseline_smoke_runs(tmp_path, method):
  s = registry.run(_smoke(method), str(tmp_path / method))
  assert s["method"] == method and np.isfinite(s["final_test_accuracy"])


@pytest.mark.slow
def test_bernoulli_activity_reaches_the_cohort_iga_and_ledger(tmp_path):
  # --config.client.activity: each client joins a round with probability
  # 0.5 (FedFTG's act_prob); IGA distils from exactly the round's cohort.
  c = _smoke("fedftg", client__activity=0.5)
  c.rounds = 3
  s = registry.run(c, str(tmp_path / "f"))
  with open(tmp_path / "f" / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  sizes = [r["cohort_size"] for r in rows]
  assert all(1 <= k <= c.data.num_clients for k in sizes)
  assert [r["iga_num_teachers"] for r in rows] == sizes
  # A client reports its 10 class counts of 32 bits the first round it
  # joins: once for each of at least max(sizes) distinct clients.
  reporters, rest = divmod(s["bytes_by_tag"]["class_counts"] * 8, 10 * 32)
  assert rest == 0
  assert max(sizes) <= reporters <= min(sum(sizes), c.data.num_clients)
  assert np.isfinite(s["final_test_accuracy"])


def test_ablations_build_and_fedftg_needs_iga(tmp_path):
  # −IGA is FedAvg of the clusters: no generator, no iga_* metrics.
  s = registry.run(_smoke("disue", iga__enabled=False),
                                   str(tmp_path / "noiga"))
  with open(tmp_path / "noiga" / "metrics.jsonl") as f:
    row = json.loads(f.readline())
  assert not any(k.startswith("iga_") for k in row)
  assert s["num_clusters_by_round"]
  with pytest.raises(ValueError, match="iga.enabled must stay True"):
    registry.run(_smoke("fedftg", iga__enabled=False),
                                 str(tmp_path / "f"))


def test_evaluate_before_iga_reaches_rows_and_summary(tmp_path):
  s = registry.run(_smoke("fedftg", iga__evaluate_before=True),
                                   str(tmp_path / "f"))
  with open(tmp_path / "f" / "metrics.jsonl") as f:
    row = json.loads(f.readline())
  assert 0 <= row["test_accuracy_before_iga"] <= 1
  assert s["accuracy_before_iga_by_round"] == [
      [1, row["test_accuracy_before_iga"]]]
  assert s["before_iga"] == {
      "final_test_accuracy": row["test_accuracy_before_iga"],
      "mean_iga_gain": pytest.approx(row["test_accuracy"] -
                                     row["test_accuracy_before_iga"])}
  with pytest.raises(ValueError, match="evaluate_before_iga needs an IGA"):
    registry.run(
        _smoke("disue", iga__enabled=False, iga__evaluate_before=True),
        str(tmp_path / "d"))


def test_class_accuracy_reaches_rows_and_summary(tmp_path):
  # run.class_accuracy: each class's test accuracy, before and after IGA.
  s = registry.run(
      _smoke("fedftg", iga__evaluate_before=True, run__class_accuracy=True),
      str(tmp_path / "f"))
  with open(tmp_path / "f" / "metrics.jsonl") as f:
    row = json.loads(f.readline())
  after, before = row["test_class_accuracy"], row[
      "test_class_accuracy_before_iga"]
  assert len(after) == len(before) == 10  # digits: every class in the test
  assert all(0 <= a <= 1 for a in after + before)
  # The class accuracies weighted by the test split's class sizes are the
  # accuracy.
  y_test = common.load_and_prepare(_smoke("fedftg")).dataset.y_test
  n = np.bincount(np.asarray(y_test), minlength=10)
  assert np.dot(after, n) / n.sum() == pytest.approx(row["test_accuracy"],
                                                     abs=1e-6)
  assert np.dot(before, n) / n.sum() == pytest.approx(
      row["test_accuracy_before_iga"], abs=1e-6)
  assert s["final_test_class_accuracy"] == after
  assert s["before_iga"]["final_test_class_accuracy"] == before
  plain = registry.run(_smoke("ifca"), str(tmp_path / "i"))
  assert "final_test_class_accuracy" not in plain
