"""dynafed.py: presets, refusals before the data loads, and the smoke run."""

import json
import os

import pytest

from fedjax_dd.experiments import common, registry
from fedjax_dd.experiments.configs import dynafed


@pytest.mark.parametrize("arg", ["smoke", "mnist_c1", "mnist_c2", "mnist_c10",
                                 "cifar10_c1", "cifar10_c2", "mnist_c1_gpu",
                                 "cifar10_c2_gpu"])
def test_presets_validate(arg):
  c = dynafed.get_config(arg)
  common.validate(c)
  assert c.method == "dynafed" and c.runner == "federated"
  assert c.dynafed.images_per_class == (2 if arg == "smoke" else 15)
  if arg.endswith("_gpu"):
    assert c.rounds == 300 and c.dynafed.iterations == 3000
    assert c.data.resplit == 0.8
  elif arg != "smoke":
    # The CPU presets synthesise within HFLDD's 7-round comparison.
    assert c.dynafed.trajectory_rounds < 7 and c.paper_departures


def test_unknown_preset_and_bad_setting_are_refused():
  with pytest.raises(ValueError, match="Unknown preset 'mnist_iid'"):
    dynafed.get_config("mnist_iid")
  c = dynafed.get_config("mnist_c1")
  c.dynafed.expert_rounds = 9
  with pytest.raises(ValueError, match=r"config\.dynafed\.expert_rounds must "
                     r"be <= trajectory_rounds = 5.*--config\.dynafed\."
                     "expert_rounds"):
    common.validate(c)


@pytest.mark.slow
def test_smoke_runs_through_the_federated_runner(tmp_path):
  c = dynafed.get_config("smoke")
  c.run.progress = False
  s = registry.run(c, str(tmp_path))
  assert s["rounds"] == 3
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  # Synthesis at round L = 2, fine-tuning from round 3.
  assert [r["match_loss_first"] > 0 for r in rows] == [False, True, False]
  assert [r["finetune_loss"] > 0 for r in rows] == [False, False, True]
  # FedAvg's traffic (HFLDD Eq. 3): 8 clients, 3 rounds, the round-1 model
  # a seed.
  assert s["bytes_total"] == 8 * 5 * s["param_count"] * 4
