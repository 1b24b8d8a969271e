"""The quickstart: member configs, the table, and a run of two members."""

import json
import os

import numpy as np
import pytest

from fedjax_dd.core import workdir as workdir_lib
from fedjax_dd.experiments import common
from fedjax_dd.experiments import run_quickstart
from fedjax_dd.experiments import registry
from fedjax_dd.experiments import runners
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


def test_table_has_the_expected_ranges_and_marks_a_row_outside():
  rows = [{"method": "a", "final_test_accuracy": 0.5, "bytes_total": 2048,
           "wall_seconds": 3.4, "note": "why", "expected": (0.45, 0.55)},
          {"method": "b", "final_test_accuracy": 0.25, "bytes_total": 10,
           "wall_seconds": 0.0, "expected": (0.3, 0.4)},
          {"method": "c", "final_test_accuracy": 0.9, "bytes_total": 10,
           "wall_seconds": 0.0, "expected": None}]
  assert run_quickstart.table(rows).splitlines() == [
      "| method | final accuracy | expected | bytes sent | wall | note |",
      "|---|---|---|---|---|---|",
      "| a | 0.5000 | 0.45-0.55 | 2.05 KB | 3 s | why |",
      "| b | 0.2500 | 0.30-0.40 (**below**) | 10 B | 0 s |  |",
      "| c | 0.9000 |  | 10 B | 0 s |  |"]
  lines = run_quickstart.footer(rows, 61.4, "results.md").splitlines()
  assert lines[0] == "Whole run: 61 s."
  (outside,) = lines[1:]
  assert outside.startswith("b: 0.2500 is below its expected range "
                            "0.30-0.40 (")
  assert "results.md" in outside
  # With the process's CPU time, the first line names both and the cores.
  first = run_quickstart.footer(rows, 61.4, "results.md", 120.6).splitlines()[0]
  assert first == (f"Whole run: 61 s wall, 121 s CPU on {os.cpu_count()} "
                   "cores.")


def _measured_rows(path):
  """The rows of the results file's "Expected ranges" table, as dicts."""
  with open(path) as f:
    text = f.read()
  section = text.split("## Expected ranges", 1)[1].split("\n## ", 1)[0]
  lines = [l for l in section.splitlines() if l.startswith("|")]
  head = [h.strip() for h in lines[0].strip("|").split("|")]
  return [dict(zip(head, (v.strip() for v in l.strip("|").split("|"))))
          for l in lines[2:]]


def test_every_row_has_the_expected_range_measured_in_the_results_file():
  import math  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  c = quickstart.get_config()
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  assert c.expected.source == "experiments/results/quickstart_digits.md"
  measured = _measured_rows(os.path.join(root, c.expected.source))
  # Three seeds or more on each jax end.
  for end in ("0.5.3", "0.12"):
    assert len({r["seed"] for r in measured
                if r["jax"].startswith(end)}) >= 3, end
  columns = {n: n for n in c.order}
  columns["fedhydra: one-shot FedAvg of its clients"] = "fedhydra_baseline"
  for column, name in columns.items():
    values = [float(r[column]) for r in measured if r[column] != "-"]
    # The range is the measured one, widened to whole hundredths.
    wanted = (math.floor(min(values) * 100) / 100,
              math.ceil(max(values) * 100) / 100)
    assert tuple(c.expected[name]) == pytest.approx(wanted), column
  # Getting started quotes the same ranges.
  with open(os.path.join(root, "docs", "getting_started.md")) as f:
    docs = f.read()
  for column, name in columns.items():
    low, high = c.expected[name]
    assert f"| {column} | {low:.2f}-{high:.2f} |" in docs, column


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
  s = registry.run(c, str(tmp_path))
  out = capsys.readouterr().out
  assert "| fedavg |" in out and "| fedd3 |" in out
  # The run reports its own wall and CPU time, and the summary keeps both.
  assert f"s CPU on {os.cpu_count()} cores." in out
  assert s["cpu_seconds"] > 0 and s["wall_seconds"] > 0
  assert (tmp_path / "comparison.png").stat().st_size > 0
  with open(tmp_path / "summary.json") as f:
    written = json.load(f)
  assert [r["method"] for r in written["methods"]] == ["fedavg", "fedd3"]
  assert [r["note"] for r in written["methods"]] == [
      c.members.fedavg.note, c.members.fedd3.note]
  for r in s["methods"]:
    assert 0.0 <= r["final_test_accuracy"] <= 1.0
    assert r["bytes_total"] > 0 and np.isfinite(r["wall_seconds"])
  # The members ran in their own workdirs (and resume from them), each with
  # its settings recorded as the entry point records a run's.
  assert (tmp_path / "fedd3" / "summary.json").exists()
  for name in c.order:
    with open(tmp_path / name / "config.json") as f:
      assert json.load(f) == json.loads(json.dumps(common.fingerprint(
          run_quickstart.member_config(c, name))))


def test_members_settings_are_recorded_before_their_runner_writes(
    tmp_path, monkeypatch, caplog):
  # HFLDD writes its stage cache before its rounds: with nothing recorded,
  # fit took the member's workdir for a run made before settings were.
  seen = []

  def runner(config, workdir):
    seen.append(os.path.exists(os.path.join(workdir, "config.json")))
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.write('{"round": 1}\n')
    return {"final_test_accuracy": 0.5, "bytes_total": 1, "wall_seconds": 0.0}

  monkeypatch.setattr(runners, "run_federated", runner)
  c = quickstart.get_config()
  c.order = ("fedavg",)
  with caplog.at_level("WARNING"):
    registry.run(c, str(tmp_path))
  assert seen == [True]
  assert "no config.json" not in caplog.text
  # Another setting for the member on the same workdir: refused.
  c.members.fedavg.overrides = (("rounds", 5), ("client.lr", 0.5))
  with pytest.raises(workdir_lib.FingerprintMismatchError, match="client.lr"):
    registry.run(c, str(tmp_path))


@pytest.mark.slow
def test_full_quickstart_runs_every_system(tmp_path):
  s = registry.run(quickstart.get_config(), str(tmp_path))
  names = [r["method"] for r in s["methods"]]
  for m in ("fedavg", "fedd3", "hfldd", "fedhydra", "disue"):
    assert m in names


def test_start_order_puts_named_members_first_and_keeps_the_rest():
  c = quickstart.get_config()
  assert run_quickstart.start_order(c)[0] == "fedhydra"
  assert sorted(run_quickstart.start_order(c)) == sorted(c.order)
  c.order = ("fedavg", "disue")
  c.start_order = ("disue",)
  assert run_quickstart.start_order(c) == ["disue", "fedavg"]


@pytest.mark.parametrize("workers", [0, -1])
def test_bad_worker_count_is_refused_before_any_member_runs(tmp_path,
                                                           workers):
  c = quickstart.get_config()
  c.workers = workers
  with pytest.raises(ValueError, match="workers must be an integer >= 1"):
    registry.run(c, str(tmp_path))
  assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_members_side_by_side_write_the_rows_of_members_one_at_a_time(
    tmp_path):
  # Two members on two threads compute what they compute one after the
  # other: every metrics row equal.
  rows = {}
  for workers in (1, 2):
    c = quickstart.get_config()
    c.order = ("fedavg", "fedd3")
    c.workers = workers
    registry.run(c, str(tmp_path / str(workers)))
    for name in c.order:
      with open(tmp_path / str(workers) / name / "metrics.jsonl") as f:
        rows[workers, name] = [
            {k: v for k, v in json.loads(line).items()
             if "seconds" not in k} for line in f]
  for name in ("fedavg", "fedd3"):
    assert rows[1, name] and rows[1, name] == rows[2, name]
