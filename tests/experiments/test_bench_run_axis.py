"""The run-axis benchmark's quick mode runs both sides and reports them."""

import json

from fedjax_dd.experiments.bench import bench_run_axis


def test_quick_mode_reports_both_sides(tmp_path):
  out = tmp_path / "q.json"
  report = bench_run_axis.main(["--quick", f"--out={out}",
                                f"--workdir={tmp_path / 'w'}"])
  assert json.loads(out.read_text())["seeds"] == "0,1"
  for side in ("run_axis", "sequential"):
    assert report[side]["seconds"] > 0
    assert sorted(report[side]["final_test_accuracy"]) == [0, 1]
  assert "--config.engine.run_axis=True" in report["run_axis"]["command"]
  assert "run_axis" not in report["sequential"]["command"]
  assert report["speedup"] > 0
  # The same runs: final accuracies agree up to the batched rounding.
  assert report["max_final_accuracy_difference"] <= 0.01
  assert report["environment"]["platform"]
