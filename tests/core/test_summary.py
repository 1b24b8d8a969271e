"""The one summary builder on hand-made rows and a hand-made ledger."""

import numpy as np

from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core import summary


def _ledger():
  # Round 1: 2 uploads of 800 bits, 1 download of 1,600; 80 peer bits.
  return (ledger_lib.Ledger()
          .record(1, kind="upload", bits=800, count=2, tag="model")
          .record(1, kind="download", bits=1600, tag="model")
          .record(1, kind="peer", bits=80, tag="data"))


ROWS = [{"round": 1, "step": 1, "test_accuracy": 0.5, "num_clusters": 2,
         "clustering_converged": True},
        {"round": 2, "step": 2, "train_loss": 1.0},
        {"round": 3, "step": 3, "test_accuracy": 0.75, "num_clusters": 3,
         "clustering_converged": False, "test_class_accuracy": [0.5, 1.0]}]


def test_run_summary_fields_by_hand():
  params = {"w": np.zeros((2, 3)), "b": np.zeros(3)}
  s = summary.run_summary(
      method="m", dataset="d", model="net", rows=ROWS, ledger=_ledger(),
      params=params, rounds=3, planned_rounds=4, num_clients=2,
      wall=loop_lib.WallClock(start=0.0), paper_departures=("x",),
      extra={"own": 1}, config={"seed": 0})
  assert (s["final_test_accuracy"], s["best_test_accuracy"]) == (0.75, 0.75)
  assert s["final_test_class_accuracy"] == [0.5, 1.0]
  assert s["param_count"] == 9
  # 1,600 bits up = 200 B, 1,600 down = 200 B, 80 peer bits = 10 B (sent,
  # so among the uploads too).
  assert (s["bytes_uploaded"], s["bytes_downloaded"], s["bytes_peer"]) == (
      210, 200, 10)
  assert s["bytes_total"] == 410
  assert s["bytes_by_tag"] == {"model": 400, "data": 10}
  assert s["stopped_by_time_budget"] is True   # 3 of 4 rounds
  assert s["accuracy_by_round"] == [[1, 0.5], [3, 0.75]]
  assert s["num_clusters_by_round"] == [[1, 2], [3, 3]]
  assert s["ap_converged_rounds"] == 1
  assert s["paper_departures"] == ["x"] and "gce" not in s
  assert list(s)[-2:] == ["own", "config"]


def test_run_summary_overrides_and_gce():
  s = summary.run_summary(
      method="m", dataset="d", model="net", rows=ROWS[:2], ledger=_ledger(),
      params={}, rounds=1, planned_rounds=1, num_clients=2,
      wall=loop_lib.WallClock(start=0.0), gce_gammas=(0.5,),
      final_test_accuracy=0.25, stopped_by_time_budget=True,
      round_key="step", curve_name="accuracy_by_epoch")
  assert s["final_test_accuracy"] == 0.25 and s["best_test_accuracy"] == 0.5
  assert s["stopped_by_time_budget"] is True
  assert s["accuracy_by_epoch"] == [[1, 0.5]] and "accuracy_by_round" not in s
  assert "0.5" in s["gce"] and "config" not in s


def test_before_iga_fields_by_hand():
  rows = [{"round": 1, "test_accuracy": 0.6, "test_accuracy_before_iga": 0.5},
          {"round": 2, "test_accuracy": 0.7, "test_accuracy_before_iga": 0.8}]
  out = summary.before_iga_fields(rows)
  assert out["accuracy_before_iga_by_round"] == [[1, 0.5], [2, 0.8]]
  assert out["before_iga"]["final_test_accuracy"] == 0.8
  assert np.isclose(out["before_iga"]["mean_iga_gain"], 0.0)
  assert summary.before_iga_fields([{"round": 1}]) == {}
