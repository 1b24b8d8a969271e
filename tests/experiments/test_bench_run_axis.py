"""The run-axis benchmark's quick mode runs both sides and reports them."""

import json

import pytest

from fedjax_dd.experiments.bench import bench_run_axis


@pytest.mark.slow  # runs the benchmark script end to end
def test_quick_mode_reports_both_sides(tmp_path):
  out = tmp_path / "q.json"
  report = bench_run_axis.main(["--quick", f"--out={out}",
                                f"--workdir={tmp_path / 'w'}"])
  assert json.loads(out.read_text())["seeds"] == "0,1"
  for side in ("run_axis", "sequential"):
    assert report[side]["seconds"] > 0
    assert report[side]["cpu_seconds"] > 0
    # A preset's time budget cannot cut a side short.
    assert "--config.run.max_wall_seconds=0" in report[side]["command"]
    assert sorted(report[side]["final_test_accuracy"]) == [0, 1]
  assert "--config.engine.run_axis=True" in report["run_axis"]["command"]
  assert "run_axis" not in report["sequential"]["command"]
  assert report["speedup"] > 0 and report["cpu_speedup"] > 0
  # The same runs: final accuracies agree up to the batched rounding.
  assert report["max_final_accuracy_difference"] <= 0.01
  assert report["environment"]["platform"]
  # The commit the figures come from (None outside a git checkout).
  assert report["code"] is None or len(report["code"]["commit"]) == 40


def test_a_side_cut_short_is_not_a_measurement(tmp_path):
  d = tmp_path / "side"
  (d / "seed_0").mkdir(parents=True)
  (d / "sweep.json").write_text(json.dumps({"tables": [{"runs": [
      {"seed": 0, "final_test_accuracy": 0.5}]}]}))
  (d / "seed_0" / "summary.json").write_text(json.dumps({"rounds": 25}))
  assert bench_run_axis.finals(str(d)) == {0: 0.5}
  with pytest.raises(RuntimeError, match="finished 25 of 30 rounds"):
    bench_run_axis.finals(str(d), 30)
