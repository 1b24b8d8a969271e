"""The one-shot runs' figures and diagnostics (one_shot.server_report)."""

import numpy as np

from fedjax_dd.algorithms import one_shot


def test_server_report_writes_what_it_has_and_scores_u_r(tmp_path):
  # 2 classes, 2 clients: client 0 holds class 0 only, client 1 mostly
  # class 1. U_r [c, m] names the right client for both classes.
  counts = np.array([[6, 0], [2, 8]])
  u_r = np.array([[0.75, 0.25], [0.0, 1.0]])
  rows = [{"step": 1, "test_accuracy": 0.5}, {"step": 2, "train_loss": 1.0},
          {"step": 3, "test_accuracy": 0.75}]
  samples = (np.zeros((4, 2, 2, 1), np.float32), np.array([0, 1, 0, 1]))
  out = one_shot.server_report({"U_r": u_r, "U": np.ones((2, 2)),
                                "samples": samples}, rows,
                               class_counts=counts, num_classes=2,
                               directory=str(tmp_path))
  assert out["figures"] == ["u_r.png", "samples.png", "accuracy.png"]
  for name in out["figures"]:
    assert (tmp_path / name).stat().st_size > 0
  assert out["U_r"] == u_r.tolist() and out["U"] == [[1.0, 1.0]] * 2
  assert "U_c" not in out
  # The oracle's shares are [[0.75, 0.25], [0, 1]]: U_r equals them.
  agreement = out["U_r_vs_class_share"]
  assert np.isclose(agreement["correlation"], 1.0)
  assert agreement["argmax_agreement"] == 1.0
  # A server without a report (one-shot FedAvg): only the accuracy curve.
  bare = one_shot.server_report({}, rows, class_counts=counts, num_classes=2,
                                directory=str(tmp_path / "bare"))
  assert bare == {"figures": ["accuracy.png"]}
