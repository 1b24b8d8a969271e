"""End-to-end HFLDD / w/o-DD / random-samples / FedSeq runners on digits (MNIST: slow)."""

import json
import os

import numpy as np
import pytest

from fedjax_dd.algorithms import hfldd
from fedjax_dd.core.ledger import load_metrics
from fedjax_dd.data import sources
from fedjax_dd.experiments import run_hfldd
from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import centralized as centralized_config
from fedjax_dd.experiments.configs import fedseq as fedseq_config
from fedjax_dd.experiments.configs import hfldd as hfldd_config
from fedjax_dd.experiments.configs import hfldd_random as random_config
from fedjax_dd.experiments.configs import hfldd_wodd as wodd_config
from tests.conftest import shared_dataset

SUMMARY_KEYS = {
    "method", "dataset", "final_test_accuracy", "best_test_accuracy",
    "wall_seconds", "config", "num_clients", "aux_size", "num_classes",
    "num_heads", "param_count", "rounds", "distilled_samples_total",
    "pixels_per_sample", "bytes_total", "accuracy_by_round", "clusters",
    "stage_seconds", "privacy", "kip_loss", "member_data", "sent_label_bytes",
}
PRIVACY_KEYS = {"uploaded_images", "identical_to_raw_count",
                "near_copy_count", "near_copy_fraction", "stored_in_workdir",
                "identical_to_raw_fraction", "nearest_raw_l2_min",
                "nearest_raw_l2_median"}


def _check_hfldd_summary(s, workdir):
  assert SUMMARY_KEYS <= set(s)
  clusters = s["clusters"]
  n = s["num_clients"]
  assert len(clusters["homogeneous"]) == n == len(clusters["heterogeneous"])
  assert len(clusters["heads"]) == s["num_heads"]
  assert sum(clusters["heterogeneous_sizes"]) == n
  want_bits = hfldd.eq18_bits(
      num_clients=n, aux_size=s["aux_size"], num_classes=s["num_classes"],
      distilled_samples=s["distilled_samples_total"],
      pixels_per_sample=s["pixels_per_sample"], num_heads=s["num_heads"],
      num_params=s["param_count"], rounds=s["rounds"])
  assert s["bytes_total"] * 8 == want_bits
  assert len(s["accuracy_by_round"]) == s["rounds"]
  assert all(np.isfinite(a) for _, a in s["accuracy_by_round"])
  assert os.path.getsize(os.path.join(workdir, "topology.png")) > 1000
  with open(os.path.join(workdir, "summary.json")) as f:
    assert json.load(f)["bytes_total"] == s["bytes_total"]
  for stage in ("label_knowledge", "dataset_generation", "training"):
    assert s["stage_seconds"][stage] >= 0
  assert set(s["privacy"]) == PRIVACY_KEYS
  assert s["privacy"]["uploaded_images"] == s["distilled_samples_total"]
  # The stage cache holds the uploads and nothing else (issue 76).
  assert s["privacy"]["stored_in_workdir"] == s["privacy"]["uploaded_images"]
  assert 0.0 <= s["privacy"]["identical_to_raw_fraction"] <= 1.0


def _smoke(tmp_path, rounds=2):
  config = hfldd_config.get_config("smoke")
  config.run.progress = False
  config.rounds = rounds
  return config, registry.run(config, str(tmp_path))


def test_hfldd_smoke(tmp_path):
  config, s = _smoke(tmp_path)
  _check_hfldd_summary(s, tmp_path)
  assert s["num_heads"] >= 2
  # Every non-head member sends |D~_i| = support_size (all hold more).
  assert s["distilled_samples_total"] == (
      20 - s["num_heads"]) * config.hfldd.support_size
  assert s["rounds"] == 2
  assert s["stage_info"]["kip_members"] == 20 - s["num_heads"]
  # A fixed budget: every member ran all kip.max_iterations.
  assert s["stage_info"]["kip_iterations_max"] == config.kip.max_iterations
  assert s["stage_info"]["kip_iterations_mean"] == config.kip.max_iterations
  assert set(s["kip_loss"]) == {"first_min", "first_median", "last_min",
                                "last_median"}
  assert s["privacy"]["identical_to_raw_fraction"] < 1.0
  assert s["member_data"] == "kip" and s["sent_label_bytes"] == 0
  assert s["eq18_bytes"] == s["bytes_total"] and not s["stages_cached"]
  # Balanced C = 1: 2 clients per digit class.
  assert s["config"]["data"]["partition"]["style"] == "balanced"


def test_hfldd_survives_iid_clients_and_unbalanced_clusters(tmp_path):
  # C = 10: every client holds every class, so the KL rows are close and
  # KMeans makes clusters of very different sizes (or fewer than K).
  config = hfldd_config.get_config("smoke")
  config.run.progress = False
  config.rounds = 1
  config.data.partition.num_classes_per_client = 10
  config.client.local_steps = 3             # the heads honour local_steps
  s = registry.run(config, str(tmp_path))
  _check_hfldd_summary(s, tmp_path)
  rows = load_metrics(os.path.join(tmp_path, "metrics.jsonl"))
  assert rows[-1]["local_steps_mean"] == 3.0
  sizes = np.bincount(s["clusters"]["homogeneous"])
  assert sizes.sum() == 20 and s["num_heads"] >= 1
  assert np.isfinite(s["final_test_accuracy"])


@pytest.mark.slow
def test_hfldd_resume_reuses_cached_stages(tmp_path):
  _, s = _smoke(tmp_path, rounds=2)
  # Re-running with more rounds reuses the cached stages and resumes.
  config, s2 = _smoke(tmp_path, rounds=3)
  assert s2["stages_cached"] and not s["stages_cached"]
  assert s2["rounds"] == 3 and len(s2["accuracy_by_round"]) == 3
  assert s2["accuracy_by_round"][:2] == s["accuracy_by_round"]
  assert s2["clusters"] == s["clusters"]
  _check_hfldd_summary(s2, tmp_path)
  config.hfldd.support_size = 10            # a stage setting: refuse the cache
  with pytest.raises(ValueError, match=r"hfldd\.support_size"):
    registry.run(config, str(tmp_path))


def test_fedseq_smoke_eq19_traffic_and_local_steps(tmp_path):
  config = fedseq_config.get_config("smoke")
  config.run.progress = False
  config.rounds = 1
  config.hfldd.group_by_similarity = False
  config.client.local_steps = 2
  s = registry.run(config, str(tmp_path))
  assert s["num_groups"] == 5 and s["group_size"] == 4
  assert sorted(i for g in s["groups"] for i in g) == list(range(20))
  assert s["fedseq_traffic"] == "eq19"
  assert s["bytes_total"] == s["eq19_bytes"]
  # T = 1: O |w| B1 (1 + J) bytes as printed; J - 1 hand-offs physically.
  assert s["eq19_bytes"] == 5 * s["param_count"] * 4 * (1 + 4)
  assert s["physical_bytes"] == 5 * s["param_count"] * 4 * (1 + 3)
  assert np.isfinite(s["final_test_accuracy"])
  rows = load_metrics(os.path.join(tmp_path, "metrics.jsonl"))
  # local_steps = 2 per member, 4 members per superclient.
  assert rows[-1]["local_steps_mean"] == 8.0


def test_sent_label_bits_counts_what_is_sent():
  config = hfldd_config.get_config("smoke")
  assert run_hfldd.sent_label_bits(config) == 0       # fixed labels
  config.kip.learn_labels = True
  assert run_hfldd.sent_label_bits(config) == 32      # float32 learned labels
  config.hfldd.sent_label_bits = 0                    # Eq. 18 to the letter
  assert run_hfldd.sent_label_bits(config) == 0
  raw = wodd_config.get_config("smoke")
  raw.kip.learn_labels = True
  assert run_hfldd.sent_label_bits(raw) == 0


def test_presets_follow_the_paper():
  for preset in hfldd_config.PRESETS:
    c = hfldd_config.get_config(preset)
    assert c.data.partition.style == "balanced"
    assert c.hfldd.member_data == "kip"
    if preset == "smoke_paper":
      # The smoke run with the paper's re-split.
      assert c.data.resplit == 0.8 and not c.paper_departures
    elif preset.endswith(("_paper", "_gpu")):
      assert (c.kip.max_iterations, c.rounds, c.data.resplit) == (3000, 300,
                                                                  0.8)
      assert not c.paper_departures
    else:
      assert 0 < c.kip.max_iterations < 3000 and c.data.resplit == 0.0
      # A CPU preset says where it departs (the smoke preset is no protocol).
      assert bool(c.paper_departures) == (preset != "smoke")
      if preset != "smoke":
        assert str(c.kip.max_iterations) in c.paper_departures[0]
    # HFLDD's KIP runs a fixed budget (no accuracy stop).
    assert c.kip.stop_accuracy is None and c.kip.min_iterations == 0
    # FedSeq's grouping keys are not HFLDD's.
    assert "num_groups" not in c.hfldd
  assert random_config.get_config("mnist_c1").hfldd.member_data == "random"
  assert wodd_config.get_config("mnist_c1_gpu").hfldd.member_data == "raw"
  # FedSeq: the same presets without the member stage (no KIP, no uploads).
  s = fedseq_config.get_config("mnist_c1")
  assert "kip" not in s and "member_data" not in s.hfldd
  assert (s.hfldd.num_groups, s.hfldd.fedseq_traffic) == (10, "eq19")
  cl = centralized_config.get_config("mnist_hfldd")
  assert (cl.client.optimizer, cl.client.lr, cl.client.batch_size) == (
      "sgd", 0.01, 64)
  assert centralized_config.get_config("cifar10_hfldd_gpu").data.resplit == 0.8
  with pytest.raises(ValueError, match="member_data"):
    hfldd_config.hfldd_preset("smoke", member_data="distilled")


@pytest.mark.slow
def test_hfldd_random_control_smoke(tmp_path):
  config = random_config.get_config("smoke")
  config.run.progress = False
  config.rounds = 1
  config.client.local_steps = 2
  s = registry.run(config, str(tmp_path))
  _check_hfldd_summary(s, tmp_path)
  # The KIP upload budget, but raw images.
  assert s["distilled_samples_total"] == (
      20 - s["num_heads"]) * config.hfldd.support_size
  assert s["privacy"]["identical_to_raw_fraction"] == 1.0
  assert s["kip_loss"] is None and s["member_data"] == "random"
  rows = load_metrics(os.path.join(tmp_path, "metrics.jsonl"))
  assert rows[-1]["local_steps_mean"] == 2.0


@pytest.mark.slow
def test_hfldd_wodd_smoke(tmp_path):
  config = wodd_config.get_config("smoke")
  config.run.progress = False
  s = registry.run(config, str(tmp_path))
  _check_hfldd_summary(s, tmp_path)
  # Raw data: the heads together hold the whole training split.
  total = sources.load_dataset("digits").x_train.shape[0]
  assert sum(s["head_dataset_sizes"]) == total
  assert s["bytes_by_tag"]["distilled_data"] == (
      s["distilled_samples_total"] * s["pixels_per_sample"])
  assert s["privacy"]["identical_to_raw_fraction"] == 1.0
  assert s["privacy"]["nearest_raw_l2_median"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("preset,target,rounds", [("mnist_c1", 0.95, 15),
                                                  ("mnist_c2", 0.97, 20)])
def test_hfldd_mnist_reaches_target(tmp_path, preset, target, rounds):
  shared_dataset("mnist.npz")
  shared_dataset("fashion_mnist.npz")
  config = hfldd_config.get_config(preset)
  config.data.dataset = "npz:" + shared_dataset("mnist.npz")
  config.data.aux_dataset = "npz:" + shared_dataset("fashion_mnist.npz")
  config.run.progress = False
  # The paper's bound is 50. Measured (balanced split, 100 KIP iterations):
  # mnist_c1 reaches 0.95 at round 4; mnist_c2 not yet re-measured.
  config.rounds = rounds
  s = registry.run(config, str(tmp_path))
  _check_hfldd_summary(s, tmp_path)
  assert s["best_test_accuracy"] >= target
