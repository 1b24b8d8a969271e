"""Tables and learning curves over seeds, on tiny hand-checked runs."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from fedjax_dd.utils import figures
from fedjax_dd.utils import sweep
from tests.conftest import REPO_ROOT


def _summary(final, best, traffic, wall, seed, method="fedavg"):
  return {"method": method, "dataset": "digits", "final_test_accuracy": final,
          "best_test_accuracy": best, "bytes_total": traffic,
          "wall_seconds": wall, "rounds": 2,
          "config": {"seed": seed, "data": {"seed": seed}}}


SUMMARIES = [_summary(0.5, 0.6, 1000, 10.0, 0), _summary(0.7, 0.8, 1000, 14.0, 1),
             _summary(0.9, 1.0, 1000, 12.0, 2)]

# Seed A reaches round 3 (round 4 was not evaluated), seed B stops at round 2.
RUN_A = [{"round": 1, "test_accuracy": 0.1, "bytes_total_cumulative": 100},
         {"round": 2, "test_accuracy": 0.2, "bytes_total_cumulative": 200},
         {"round": 3, "test_accuracy": 0.3, "bytes_total_cumulative": 300},
         {"round": 4, "bytes_total_cumulative": 400}]
RUN_B = [{"round": 1, "test_accuracy": 0.3, "bytes_total_cumulative": 100},
         {"round": 2, "test_accuracy": 0.4, "bytes_total_cumulative": 300}]


def test_mean_sd_is_the_sample_sd():
  assert sweep.mean_sd([0.5, 0.7, 0.9]) == pytest.approx(
      {"mean": 0.7, "sd": 0.2, "n": 3})
  # None and non-finite values (NaN is written to JSON as "nan") are skipped.
  got = sweep.mean_sd([1.0, None, "nan", float("inf"), 3.0])
  assert got["n"] == 2 and got["mean"] == pytest.approx(2.0)
  assert got["sd"] == pytest.approx(math.sqrt(2.0))
  assert sweep.mean_sd([4.0]) == {"mean": 4.0, "sd": None, "n": 1}
  assert sweep.mean_sd([]) == {"mean": None, "sd": None, "n": 0}


def test_seed_table_and_markdown():
  cmds = [f"fedjax-dd --config.seed={s}" for s in range(3)]
  t = sweep.seed_table("fedavg", SUMMARIES, commands=cmds,
                       workdirs=["a", "b", "c"])
  assert t["num_seeds"] == 3 and t["seeds"] == [0, 1, 2]
  assert [r["data_seed"] for r in t["runs"]] == [0, 1, 2]  # config.data.seed
  assert t["method"] == "fedavg" and t["dataset"] == "digits"
  s = t["stats"]
  assert s["final_test_accuracy"] == pytest.approx({"mean": 0.7, "sd": 0.2, "n": 3})
  assert s["best_test_accuracy"] == pytest.approx({"mean": 0.8, "sd": 0.2, "n": 3})
  assert s["bytes_total"] == pytest.approx({"mean": 1000.0, "sd": 0.0, "n": 3})
  assert s["wall_seconds"] == pytest.approx({"mean": 12.0, "sd": 2.0, "n": 3})
  assert [r["final_test_accuracy"] for r in t["runs"]] == [0.5, 0.7, 0.9]
  assert [r["command"] for r in t["runs"]] == cmds
  md = sweep.format_tables([t])
  assert "| fedavg | digits | 3 | 0.7000 ± 0.2000 | 0.8000 ± 0.2000 | " \
         "1.00 KB ± 0 B | 12.0 ± 2.0 |" in md
  # Summaries without code or environment records: "-".
  assert "| fedavg | 1 | 1 | 2 | 0.7000 | 0.8000 | 1.00 KB | 14.0 | - | - " \
         "| - | `fedjax-dd --config.seed=1` |" in md
  with pytest.raises(ValueError, match="differ in length"):
    sweep.seed_table("x", SUMMARIES, commands=cmds[:2])


def test_wall_time_is_the_whole_run_over_resumed_processes():
  # A run resumed once: its last process took 3 s of the run's 10 s.
  resumed = {**_summary(0.5, 0.6, 1000, 3.0, 0), "wall_seconds_total": 10.0}
  older = _summary(0.7, 0.8, 1000, 14.0, 1)  # no total: its own seconds
  t = sweep.seed_table("fedavg", [resumed, older])
  assert [r["wall_seconds"] for r in t["runs"]] == [10.0, 14.0]
  assert t["stats"]["wall_seconds"]["mean"] == pytest.approx(12.0)
  assert sweep.get_stat(resumed, "wall_seconds") == 10.0


def test_learning_curve_aligns_runs_of_different_lengths():
  c = sweep.learning_curve([RUN_A, RUN_B])
  assert c.x_key == "round"
  np.testing.assert_array_equal(c.x, [1, 2, 3])
  np.testing.assert_allclose(c.mean, [0.2, 0.3, 0.3])
  np.testing.assert_array_equal(c.n, [2, 2, 1])
  np.testing.assert_allclose(c.sd[:2], [math.sqrt(0.02)] * 2)
  assert math.isnan(c.sd[2])  # one seed: no spread
  np.testing.assert_allclose(c.bytes_mean, [100, 250, 300])
  j = c.to_json()
  assert j["sd"][2] is None and j["n"] == [2, 2, 1]
  json.dumps(j)  # plain JSON types


def test_learning_curve_over_distillation_epochs_has_no_traffic():
  run = lambda a, b: [{"step": 2, "round": 1, "epoch": 2, "test_accuracy": a},
                      {"step": 4, "round": 1, "epoch": 4, "test_accuracy": b}]
  c = sweep.learning_curve([run(0.2, 0.4), run(0.4, 0.6)])
  assert c.x_key == "step" and sweep.curve_x_key([run(0.2, 0.4)]) == "step"
  np.testing.assert_array_equal(c.x, [2, 4])
  np.testing.assert_allclose(c.mean, [0.3, 0.5])
  assert c.bytes_mean is None
  # Aligning by round instead: both epochs are round 1, the last row counts.
  by_round = sweep.learning_curve([run(0.2, 0.4), run(0.4, 0.6)],
                                  x_key="round")
  np.testing.assert_allclose(by_round.mean, [0.5])


def _write_run(d, summary, rows, command=None):
  os.makedirs(d, exist_ok=True)
  # In a run's order: the rows, then the summary at its end.
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  with open(os.path.join(d, "summary.json"), "w") as f:
    json.dump(summary, f)
  if command:
    with open(os.path.join(d, "command.txt"), "w") as f:
      f.write(command + "\n")


def test_find_seed_dirs_and_write_report(tmp_path):
  wd = tmp_path / "sw"
  _write_run(sweep.seed_dir(wd, 0), SUMMARIES[0], RUN_A, "cmd 0")
  _write_run(sweep.seed_dir(wd, 10), SUMMARIES[1], RUN_B, "cmd 10")
  os.makedirs(sweep.seed_dir(wd, 2))  # an unfinished first run: no summary
  dirs = sweep.find_seed_dirs(wd)
  assert [s for s, _ in dirs] == [0, 10]  # numeric order
  one_shot = [{"step": 1, "round": 1, "test_accuracy": 0.5}]
  _write_run(tmp_path / "fh", _summary(0.5, 0.5, 64, 3.0, 0, "fedhydra"),
             one_shot)
  report = sweep.write_report(
      {"fedavg": [d for _, d in dirs], "fedhydra": [str(tmp_path / "fh")]},
      tmp_path / "out", name="cmp")
  for key in ("markdown", "json", "curves"):
    assert os.path.getsize(report["files"][key]) > 0, key
  with open(report["files"]["curves"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  with open(report["files"]["json"]) as f:
    saved = json.load(f)
  fedavg, fedhydra = saved["tables"]
  assert fedavg["stats"]["final_test_accuracy"]["mean"] == pytest.approx(0.6)
  assert [r["command"] for r in fedavg["runs"]] == ["cmd 0", "cmd 10"]
  assert fedhydra["num_seeds"] == 1
  assert fedhydra["stats"]["final_test_accuracy"]["sd"] is None
  assert saved["curves"]["fedavg"]["mean"] == pytest.approx([0.2, 0.3, 0.3])
  assert saved["curves"]["fedhydra"]["x_key"] == "step"
  with open(report["files"]["markdown"]) as f:
    assert "| fedhydra | digits | 1 | 0.5000 |" in f.read()
  with pytest.raises(ValueError, match="no runs"):
    sweep.write_report({"empty": []}, tmp_path / "out")


def test_plot_learning_curves_writes_a_png(tmp_path):
  curves = {
      "a": {"x": [1, 2, 3], "mean": [0.2, 0.3, 0.3],
            "sd": [0.1, 0.1, float("nan")], "bytes": [1e3, 2e3, 3e3],
            "x_label": "round"},
      "b": {"x": [2, 4], "mean": [0.3, 0.5], "sd": [0.1, 0.1], "bytes": None,
            "x_label": "distillation epoch"},
  }
  path = figures.plot_learning_curves(curves, tmp_path / "c.png",
                                      endpoints={"b": (1e6, 0.5, 0.1)},
                                      title="t")
  assert path == str(tmp_path / "c.png") and os.path.getsize(path) > 0
  # Nothing with traffic at all still draws.
  path = figures.plot_learning_curves({"b": curves["b"]}, tmp_path / "d.png")
  assert os.path.getsize(path) > 0


def test_endpoints_at_one_traffic_are_drawn_apart(tmp_path, monkeypatch):
  made = []
  new_figure = figures.new_figure
  monkeypatch.setattr(figures, "new_figure",
                      lambda **kw: made.append(new_figure(**kw)) or made[-1])
  curve = {"x": [2, 4], "mean": [0.3, 0.5], "sd": [0.1, 0.1], "bytes": None}
  # FedHydra and DENSE over the same clients send the same bytes.
  figures.plot_learning_curves(
      {"fedhydra": curve, "dense": curve, "feddf": curve}, tmp_path / "c.png",
      endpoints={"fedhydra": (1e6, 0.5, 0.1), "dense": (1e6, 0.4, 0.1),
                 "feddf": (2e6, 0.4, 0.1)})
  traffic_panel = made[0].axes[1]
  xs = [line.get_xdata()[0] for line in traffic_panel.get_lines()
        if line.get_marker() == "o"]
  # 4 % either side of the shared 1e6; the one at 2e6 stays there.
  assert xs == pytest.approx([0.98e6, 1.02e6, 2e6])


def test_line_style_tells_more_curves_than_colours_apart():
  class ThreeColours:
    N = 3

    def __call__(self, i):
      return "rgb"[i]

  styles = [figures.line_style(i, ThreeColours()) for i in range(12)]
  # The colours in order, then again dashed, dotted and dash-dotted.
  assert styles[:4] == [("r", "-"), ("g", "-"), ("b", "-"), ("r", "--")]
  assert styles[8] == ("b", ":") and styles[11] == ("b", "-.")
  assert len(set(styles)) == 12


def test_figures_and_sweep_import_without_matplotlib():
  code = ("import sys; import fedjax_dd.utils.figures, fedjax_dd.utils.sweep; "
          "sys.exit('matplotlib' in sys.modules)")
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]


def test_nested_gce_and_privacy_stats_are_averaged_when_reported():
  runs = [{"method": "fedd3", "final_test_accuracy": 0.9, "config": {"seed": s},
           "gce": {"0.01": g, "0.5": 2 * g},
           "privacy": {"identical_to_raw_fraction": p,
                       "nearest_raw_l2_median": 0.5, "uploaded_images": 10}}
          for s, g, p in [(0, 0.07, 0.1), (1, 0.09, 0.3)]]
  t = sweep.seed_table("fedd3", runs)
  assert "gce/0.01" in t["stats"] and "gce/0.5" in t["stats"]
  assert "privacy/uploaded_images" not in t["stats"]
  assert t["stats"]["gce/0.01"]["mean"] == pytest.approx(0.08)
  assert t["stats"]["gce/0.5"]["sd"] == pytest.approx(np.sqrt(2) * 0.02)
  assert t["stats"]["privacy/identical_to_raw_fraction"]["mean"] == (
      pytest.approx(0.2))
  other = sweep.seed_table("fedavg", [{"method": "fedavg", "config": {},
                                       "final_test_accuracy": 0.5}])
  md = sweep.format_tables([t, other])
  assert "identical to raw" in md and "gce/0.01" in md
  assert "| fedavg |" in md  # the group without GCE shows "-"


def _with_config(summary, **config):
  out = dict(summary)
  out["config"] = {**summary["config"], **config}
  return out


def test_config_value_reads_dotted_keys():
  s = _with_config(SUMMARIES[0], data={"seed": 0, "partition": {"alpha": 0.02}})
  assert sweep.config_value(s, "data.partition.alpha") == 0.02
  assert sweep.config_value(s, "seed") == 0
  with pytest.raises(KeyError, match="missing 'beta'"):
    sweep.config_value(s, "data.partition.beta")


def test_against_orders_values_and_averages_seeds(tmp_path):
  def part(alpha, seed, final, method="disue"):
    s = _summary(final, final, 1000, 1.0, seed, method)
    return _with_config(s, data={"seed": seed, "partition": {"alpha": alpha}})
  runs = {"a02": [part(0.02, 0, 0.5), part(0.02, 1, 0.7)],
          "a01": [part(0.01, 0, 0.4)],
          "f01": [part(0.01, 0, 0.3, "fedavg")]}
  groups = {}
  for label, summaries in runs.items():
    groups[label] = []
    for s in summaries:
      d = str(tmp_path / label / f"seed_{s['config']['seed']}")
      _write_run(d, s, RUN_A)
      groups[label].append(d)
  report = sweep.against(groups, "data.partition.alpha", tmp_path / "out",
                         name="eps")
  disue = report["series"]["disue"]
  assert [p["x"] for p in disue] == [0.01, 0.02]  # sorted by the value
  assert disue[0]["mean"] == pytest.approx(0.4) and disue[0]["sd"] is None
  assert disue[1]["mean"] == pytest.approx(0.6)
  assert disue[1]["sd"] == pytest.approx(math.sqrt(0.02))
  assert [p["x"] for p in report["series"]["fedavg"]] == [0.01]
  with open(report["files"]["figure"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  with open(report["files"]["markdown"]) as f:
    assert "| disue | 0.02 | 0.6000 ± 0.1414 | 2 | a02 |" in f.read()
  # Seeds of one group must share the value.
  mixed = {"m": groups["a02"][:1] + groups["a01"]}
  with pytest.raises(ValueError, match="disagree"):
    sweep.against(mixed, "data.partition.alpha", tmp_path / "out")
  twice = {"x": groups["a01"], "y": groups["a01"]}
  with pytest.raises(ValueError, match="share"):
    sweep.against(twice, "data.partition.alpha", tmp_path / "out")


def test_before_iga_stats_are_averaged_and_named():
  runs = [{"method": "disue", "final_test_accuracy": 0.5, "config": {"seed": s},
           "before_iga": {"final_test_accuracy": b, "mean_iga_gain": g}}
          for s, b, g in [(0, 0.6, -0.04), (1, 0.4, -0.02)]]
  t = sweep.seed_table("disue", runs)
  assert t["stats"]["before_iga/mean_iga_gain"]["mean"] == pytest.approx(-0.03)
  assert t["stats"]["before_iga/final_test_accuracy"]["mean"] == (
      pytest.approx(0.5))
  md = sweep.format_tables([t])
  assert "final acc before IGA" in md and "IGA gain (mean over rounds)" in md
  assert "-0.0300 ± 0.0141" in md


def test_personal_accuracy_in_tables_curves_and_against(tmp_path):
  rows = [{"round": 1, "test_accuracy": 0.1, "personal_accuracy": 0.5},
          {"round": 2, "test_accuracy": 0.2, "personal_accuracy": 0.7}]
  groups = {}
  for seed, personal in ((0, 0.7), (1, 0.9)):
    s = _with_config(_summary(0.2, 0.2, 1000, 1.0, seed),
                     data={"seed": seed, "partition": {"alpha": 0.1}})
    s.update(final_personal_accuracy=personal, best_personal_accuracy=personal,
             final_personal_accuracy_sd=0.1, final_personal_accuracy_min=0.3)
    d = str(tmp_path / "runs" / f"seed_{seed}")
    _write_run(d, s, [dict(r, personal_accuracy=r["personal_accuracy"] + seed
                           / 10) for r in rows])
    groups.setdefault("fedavg", []).append(d)
  report = sweep.write_report(groups, tmp_path / "p", metric="personal")
  table = report["tables"][0]
  assert table["stats"]["final_personal_accuracy"]["mean"] == pytest.approx(0.8)
  assert table["stats"]["final_test_accuracy"]["mean"] == pytest.approx(0.2)
  # Seeds' personal curves: 0.5 / 0.6 at round 1, 0.7 / 0.8 at round 2.
  assert report["curves"]["fedavg"]["mean"] == pytest.approx([0.55, 0.75])
  with open(report["files"]["markdown"]) as f:
    assert "final personal acc" in f.read()
  test_curve = sweep.write_report(groups, tmp_path / "t")["curves"]["fedavg"]
  assert test_curve["mean"] == pytest.approx([0.1, 0.2])
  versus = sweep.against(groups, "data.partition.alpha", tmp_path / "a",
                         metric="personal")
  assert versus["series"]["fedavg"][0]["mean"] == pytest.approx(0.8)
  with pytest.raises(ValueError, match="metric must be one of"):
    sweep.write_report(groups, tmp_path / "x", metric="train")
  # Runs without personalized evaluation keep their columns.
  assert "final_personal_accuracy" not in sweep.stats_for(SUMMARIES)


def test_every_run_row_names_its_code_jax_and_machine():
  s = dict(SUMMARIES[0], code={"commit": "0123456789abcdef", "modified": True},
           environment={"started": {"platform": "cpu", "device_kind": "cpu",
                                    "devices": 2, "jax": "0.5.3"},
                        "resumed": []})
  assert sweep.provenance(s) == {"code": "0123456+modified", "jax": "0.5.3",
                                 "machine": "cpu cpu ×2"}
  resumed = dict(s, code={"commit": "fedcba9876543210", "modified": False},
                 environment={**s["environment"], "resumed": [{"devices": 1}]})
  assert sweep.provenance(resumed)["code"] == "fedcba9"
  assert sweep.provenance(resumed)["machine"] == "cpu cpu ×2 +resumed elsewhere"
  assert sweep.provenance(SUMMARIES[0]) == {"code": None, "jax": None,
                                            "machine": None}
  md = sweep.format_tables([sweep.seed_table("fedavg", [s, resumed])])
  assert "| 0123456+modified | 0.5.3 | cpu cpu ×2 | - |" in md


def test_source_commit_reads_the_checkout_or_says_none(tmp_path):
  from fedjax_dd import versions  # pylint: disable=g-import-not-at-top
  here = versions.source_commit(REPO_ROOT)
  if here is not None:  # a git checkout (not an unpacked sdist)
    assert len(here["commit"]) == 40 and isinstance(here["modified"], bool)
  assert versions.source_commit(str(tmp_path)) is None
def test_runs_of_other_settings_are_not_averaged(tmp_path):
  def config(seed, lr, rounds, progress=True):
    return {"seed": seed, "data": {"seed": seed}, "rounds": rounds,
            "client": {"lr": lr}, "run": {"progress": progress}}

  a = dict(_summary(0.38, 0.38, 1000, 1.0, 0), config=config(0, 0.05, 2))
  b = dict(_summary(0.40, 0.40, 1000, 1.0, 1), config=config(1, 0.1, 4))
  _write_run(tmp_path / "sw" / "seed_0", a, RUN_A)
  _write_run(tmp_path / "sw" / "seed_1", b, RUN_B)
  dirs = [str(tmp_path / "sw" / f"seed_{s}") for s in (0, 1)]
  with pytest.raises(ValueError, match=r"Group 'fedavg': its runs differ in "
                     r"client.lr besides the seed \(0.05 in .*seed_0, 0.1 in "
                     r".*seed_1\)"):
    sweep.write_report({"fedavg": dirs}, tmp_path / "out")
  # Settings the caller ignores (here run.*) may differ; the round count
  # may not.
  b["config"] = config(1, 0.05, 4, progress=False)
  _write_run(tmp_path / "sw" / "seed_1", b, RUN_B)
  with pytest.raises(ValueError, match="differ in rounds"):
    sweep.write_report({"fedavg": dirs}, tmp_path / "out",
                       ignore=sweep.SEED_KEYS + ("run",))
  b["config"] = config(1, 0.05, 2, progress=False)
  _write_run(tmp_path / "sw" / "seed_1", b, RUN_B)
  report = sweep.write_report({"fedavg": dirs}, tmp_path / "out",
                              ignore=sweep.SEED_KEYS + ("run",))
  assert report["tables"][0]["num_seeds"] == 2


def test_a_stale_or_running_summary_is_not_reported(tmp_path):
  from fedjax_dd.core import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  d = tmp_path / "seed_0"
  _write_run(d, SUMMARIES[0], RUN_A)
  # A 2-round summary left while the run went on to more rounds.
  later = os.path.getmtime(d / "summary.json") + 5
  os.utime(d / "metrics.jsonl", (later, later))
  with pytest.raises(ValueError, match="summary.json is older than its "
                                       "metrics.jsonl"):
    sweep.write_report({"fedavg": [str(d)]}, tmp_path / "out")
  os.utime(d / "metrics.jsonl", (later - 10, later - 10))
  with workdir_lib.WorkdirLock(d):
    with pytest.raises(ValueError, match="is still running"):
      sweep.write_report({"fedavg": [str(d)]}, tmp_path / "out")
  assert sweep.write_report({"fedavg": [str(d)]}, tmp_path / "out")
