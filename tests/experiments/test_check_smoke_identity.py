"""check_smoke_identity: the comparison, and the presets against the commit
before the refactor that bundled configs into hyper-parameter dataclasses
(a change of results after it is a new ``BASE``)."""

import json
import os
import subprocess

import pytest

from fedjax_dd.experiments import check_smoke_identity as check
from tests.conftest import REPO_ROOT

# The tree whose smoke results every later refactor keeps.
BASE = "167b583"


def _write(root, name, rows, summary):
  os.makedirs(os.path.join(root, name))
  with open(os.path.join(root, name, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  with open(os.path.join(root, name, "summary.json"), "w") as f:
    json.dump(summary, f)


def test_varying_fields_are_left_out_at_any_depth():
  record = {"a": 1, "wall_seconds": 3.2, "max_wall_seconds": 60.0,
            "stage_seconds": {"setup": 1.0}, "distill_seconds": 2.0,
            "inner": [{"environment": {"jax": "x"}, "b": 0.5}]}
  assert check.strip(record) == {"a": 1, "max_wall_seconds": 60.0,
                                 "inner": [{"b": 0.5}]}
  assert check.strip({"figure": "/runs/x/topology.png"}, "/runs/x") == {
      "figure": "<workdir>/topology.png"}
  # What the run was given, not what it computed.
  assert check.strip({"final": 0.5, "code": {"commit": "abc"},
                      "config": {"eval": {"personal": False}}}) == {
                          "final": 0.5}


def test_first_difference_names_the_path():
  assert check.first_difference({"a": [1, 2.0]}, {"a": [1, 2.0]}) is None
  assert check.first_difference({"a": [1, 2.0]}, {"a": [1, 2.5]}) == (
      ".a[1]: 2.0 vs 2.5")
  assert check.first_difference({"a": 1}, {"a": 1, "b": 2}) == (
      ".b (only in new)")
  assert check.first_difference([1], [1, 2]) == " (length 1 vs 2)"
  # 1 and 1.0 are written differently, so they differ.
  assert check.first_difference({"a": 1}, {"a": 1.0}) == ".a: 1 vs 1.0"


def test_compare_ignores_wall_time_and_names_a_changed_metric(tmp_path):
  ref, new = str(tmp_path / "ref"), str(tmp_path / "new")
  _write(ref, "p", [{"round": 1, "test_accuracy": 0.25}],
         {"final": 0.25, "wall_seconds": 1.0})
  _write(new, "p", [{"round": 1, "test_accuracy": 0.25}],
         {"final": 0.25, "wall_seconds": 9.0})
  _write(ref, "q", [{"round": 1, "test_accuracy": 0.25}], {})
  _write(new, "q", [{"round": 1, "test_accuracy": 0.5}], {})
  assert check.compare(ref, new, ["p", "q", "r"]) == {
      "q": "metrics.jsonl[0].test_accuracy: 0.25 vs 0.5",
      "r": f"missing {os.path.join(ref, 'r', 'metrics.jsonl')}"}


def test_runs_on_another_device_count_are_not_comparable(tmp_path):
  ref, new = str(tmp_path / "ref"), str(tmp_path / "new")
  for root, devices, acc in ((ref, 2, 0.25), (new, 1, 0.5)):
    _write(root, "p", [{"round": 1, "test_accuracy": acc}], {})
    with open(os.path.join(root, "p", "environment.json"), "w") as f:
      json.dump({"started": {"platform": "cpu", "devices": devices,
                             "jax": "0.12.1", "jaxlib": "0.12.1"}}, f)
  assert check.compare(ref, new, ["p"]) == {
      "p": "not comparable: devices 2 vs 1 (environment.json); run both "
           "sides with the same CPU affinity and jax"}


def _has_base():
  return subprocess.run(["git", "-C", REPO_ROOT, "cat-file", "-e",
                         f"{BASE}^{{commit}}"], capture_output=True,
                        check=False).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _has_base(), reason=f"commit {BASE} not in this clone")
def test_smoke_presets_equal_the_base_commit(tmp_path, capsys):
  presets = ("fedavg", "dynafed")
  assert check.main([f"--base={BASE}", f"--out={tmp_path}",
                     f"--presets={','.join(presets)}"]) == 0
  assert capsys.readouterr().out.splitlines() == [
      f"{p}: identical" for p in presets]
