"""The quickstart: member configs, the table, and a run of two members."""

import json

import numpy as np
import pytest

from fedjax_dd.experiments import run_quickstart
from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import quickstart


def test_members_share_data_partition_and_seed():
  c = quickstart.get_config()
  assert tuple(c.order) == ("fedavg", "fedd3", "hfldd", "fedhydra", "disue")
  configs = [run_quickstart.member_config(c, m) for m in c.order]
  assert {m.method for m in configs} == set(c.order)
  for m in configs:
    assert m.data.dataset == "digits" and m.data.num_clients == 20
    assert m.data.partition.to_dict() == c.data.partition.to_dict()
    assert (m.seed, m.data.seed) == (c.seed, c.data.seed)
  assert configs[4].client.clients_per_round == 10  # an override applied
  # FedHydra's clients start from their own inits (one-shot FL's regime);
  # the others keep the shared start.
  assert [m.client.independent_init for m in configs] == [
      False, False, False, True, False]
  # The run's convolution form reaches every member.
  c.model.conv_impl = "patches"
  assert {run_quickstart.member_config(c, m).model.conv_impl
          for m in c.order} == {"patches"}


def test_table_formats_every_row():
  rows = [{"method": "a", "final_test_accuracy": 0.5, "bytes_total": 2048,
           "wall_seconds": 3.4, "note": "why"},
          {"method": "b", "final_test_accuracy": 0.25, "bytes_total": 10,
           "wall_seconds": 0.0}]
  text = run_quickstart.table(rows)
  assert text.splitlines() == [
      "| method | final accuracy | bytes sent | wall | note |",
      "|---|---|---|---|---|",
      "| a | 0.5000 | 2.05 KB | 3 s | why |",
      "| b | 0.2500 | 10 B | 0 s |  |"]


def test_every_row_has_a_note():
  c = quickstart.get_config()
  for name in c.order:
    assert c.members[name].note, name
  # The one-shot member's baseline row says what it is.
  assert c.members.fedhydra.baseline_note


def test_two_member_quickstart_writes_table_figure_and_summary(tmp_path,
                                                               capsys):
  c = quickstart.get_config()
  c.order = ("fedavg", "fedd3")
  s = registry.RUNNERS["quickstart"](c, str(tmp_path))
  out = capsys.readouterr().out
  assert "| fedavg |" in out and "| fedd3 |" in out
  assert (tmp_path / "comparison.png").stat().st_size > 0
  with open(tmp_path / "summary.json") as f:
    written = json.load(f)
  assert [r["method"] for r in written["methods"]] == ["fedavg", "fedd3"]
  assert [r["note"] for r in written["methods"]] == [
      c.members.fedavg.note, c.members.fedd3.note]
  for r in s["methods"]:
    assert 0.0 <= r["final_test_accuracy"] <= 1.0
    assert r["bytes_total"] > 0 and np.isfinite(r["wall_seconds"])
  # The members ran in their own workdirs (and resume from them).
  assert (tmp_path / "fedd3" / "summary.json").exists()


@pytest.mark.slow
def test_full_quickstart_runs_every_system(tmp_path):
  s = registry.RUNNERS["quickstart"](quickstart.get_config(), str(tmp_path))
  names = [r["method"] for r in s["methods"]]
  for m in ("fedavg", "fedd3", "hfldd", "fedhydra", "disue"):
    assert m in names
