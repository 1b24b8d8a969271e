"""IFCA, CFL, CFL-GP and PACFL configs: DisUE's presets, ``+iga`` presets,
smoke."""

import json

import numpy as np
import pytest

from fedjax_dd.experiments import common
from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import cfl, cfl_gp, disue, ifca, pacfl

CONFIGS = {"ifca": ifca, "cfl": cfl, "cfl_gp": cfl_gp, "pacfl": pacfl}


@pytest.mark.parametrize("method", sorted(CONFIGS))
@pytest.mark.parametrize("plugged", [False, True])
def test_presets_and_iga_presets(method, plugged):
  for name in disue.PRESETS:
    c = CONFIGS[method].get_config(name + ("+iga" if plugged else ""))
    assert c.method == method and c.iga.enabled == plugged
    common.validate(c)
    # DisUE's protocol, with the method's own group (and, in the smoke
    # preset, its own rounds).
    want = disue.protocol(method, name).to_dict()
    want["iga"]["enabled"] = plugged
    got = c.to_dict()
    got.pop(method, None), want.pop(method, None)
    if name == "smoke":
      got.pop("rounds"), want.pop("rounds")
    assert got == want
  with pytest.raises(ValueError, match="Unknown preset"):
    CONFIGS[method].get_config("mnist+iga")


def _smoke(method, arg="smoke"):
  c = CONFIGS[method].get_config(arg)
  c.run.progress = False
  c.rounds = 2
  return c


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_smoke_with_iga_runs_and_reports_clusters(tmp_path, method):
  s = registry.run(_smoke(method, "smoke+iga"),
                                   str(tmp_path / method))
  assert s["method"] == method and np.isfinite(s["final_test_accuracy"])
  with open(tmp_path / method / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert all(any(k.startswith("iga_") for k in r) for r in rows)
  # Class counts go up once per client (4 of 10 sampled a round).
  assert 0 < s["bytes_by_tag"]["class_counts"] * 8 <= 10 * 10 * 32
  if method == "pacfl":
    assert s["bytes_by_tag"]["pacfl_subspace"] > 0
    assert [k for _, k in s["num_clusters_by_round"]] == [5, 5]
  if method == "cfl":
    assert [k for _, k in s["num_clusters_by_round"]] == [1, 2]
  if method == "cfl_gp":
    assert [r["cfl_gp_partitioned"] for r in rows] == [1, 1]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ifca", "pacfl"])
def test_iga_changes_the_reported_model_not_what_clients_deploy(tmp_path,
                                                                method):
  # DisUE Tab. 2 under the personal protocol: IGA distils the round's
  # cluster models into the reported model only; the clients keep training
  # and deploying their cluster's model, so every personal figure is the
  # plain run's and only test_accuracy moves.
  rows = {}
  for arg in ("smoke", "smoke+iga"):
    c = _smoke(method, arg)
    c.eval.personal = True
    registry.run(c, str(tmp_path / arg))
    with open(tmp_path / arg / "metrics.jsonl") as f:
      rows[arg] = [json.loads(line) for line in f]
  personal = [k for k in rows["smoke"][0] if k.startswith("personal_")]
  assert "personal_accuracy" in personal
  for plain, plugged in zip(rows["smoke"], rows["smoke+iga"], strict=True):
    assert [plain[k] for k in personal] == [plugged[k] for k in personal]
  assert [r["test_accuracy"] for r in rows["smoke"]] != [
      r["test_accuracy"] for r in rows["smoke+iga"]]


@pytest.mark.parametrize("method, path, value, message", [
    ("cfl", "cfl.max_clusters", 0, r"config.cfl.max_clusters must be an int "
     r">= 1, got 0"),
    ("cfl", "cfl.eps1", -1.0, r"config.cfl.eps1 must be"),
    ("cfl_gp", "cfl_gp.period", 0, r"config.cfl_gp.period must be an int "
     r">= 1, got 0"),
    ("cfl_gp", "cfl_gp.stop_round", -1, r"config.cfl_gp.stop_round must be"),
    ("pacfl", "pacfl.linkage", "ward", r"config.pacfl.linkage must be one of"),
    ("pacfl", "pacfl.proximity", "cosine", r"pacfl.proximity must be one of"),
    ("pacfl", "pacfl.threshold", 0.0, r"pacfl.num_clusters must be at least 1"),
    ("ifca", "ifca.global_model", "first", r"^config.ifca.global_model must "
     r"be one of \['largest', 'average'\], got 'first'; set "
     r"--config.ifca.global_model.$"),
    ("ifca", "ifca.num_clusters", 0, r"^config.ifca.num_clusters must be an "
     r"int >= 1, got 0; set --config.ifca.num_clusters.$"),
])
def test_bad_settings_are_refused_before_the_data_loads(method, path, value,
                                                        message):
  from fedjax_dd.experiments.configs import base as base_lib  # pylint: disable=g-import-not-at-top
  c = CONFIGS[method].get_config("smoke")
  base_lib.set_path(c, path, value)
  with pytest.raises(ValueError, match=message):
    common.validate(c)


@pytest.mark.slow
@pytest.mark.parametrize("method, split", [("pacfl", "test"),
                                           ("ifca", "client")])
def test_smoke_with_personal_evaluation_writes_its_figures(tmp_path, method,
                                                           split):
  c = _smoke(method)
  c.eval.personal, c.eval.split, c.eval.finetune_steps = True, split, 2
  s = registry.run(c, str(tmp_path / method))
  with open(tmp_path / method / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert [r["round"] for r in rows if "personal_accuracy" in r] == [1, 2]
  last = rows[-1]
  assert 0.0 <= last["personal_accuracy_min"] <= last["personal_accuracy"] <= (
      last["personal_accuracy_max"]) <= 1.0
  assert s["final_personal_accuracy"] == last["personal_accuracy"]
  assert np.isfinite(s["final_test_accuracy"])


@pytest.mark.parametrize("name, flag, value, message", [
    ("moon", "temperature", 0.0, "config.moon.temperature must be a finite "
     "number > 0"),
    ("moon", "mu", -1.0, "config.moon.mu must be a finite number >= 0"),
    ("dynafed", "expert_rounds", 99, "config.dynafed.expert_rounds must be "
     "<= trajectory_rounds"),
    ("ot_fusion", "mode", "logits", "config.ot_fusion.mode must be one of "),
    ("feddyn", "alpha", 0.0, "config.feddyn.alpha must be a finite number > "
     "0"),
])
def test_declared_groups_refuse_with_their_setting(name, flag, value,
                                                   message):
  import importlib  # pylint: disable=g-import-not-at-top
  c = importlib.import_module(
      f"fedjax_dd.experiments.configs.{name}").get_config("smoke")
  c[name][flag] = value
  with pytest.raises(ValueError, match=message):
    common.validate(c)
  c[name].unread = 1
  del c[name][flag]
  with pytest.raises(ValueError, match=r"holds \['unread'\], which are not "
                     "fields"):
    common.validate(c)
