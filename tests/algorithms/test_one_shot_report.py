"""The one-shot runs' server diagnostics (one_shot.server_diagnostics)."""

import numpy as np

from fedjax_dd.algorithms import one_shot


def test_server_diagnostics_scores_u_r():
  # 2 classes, 2 clients: client 0 holds class 0 only, client 1 mostly
  # class 1. U_r [c, m] names the right client for both classes.
  counts = np.array([[6, 0], [2, 8]])
  u_r = np.array([[0.75, 0.25], [0.0, 1.0]])
  samples = (np.zeros((4, 2, 2, 1), np.float32), np.array([0, 1, 0, 1]))
  out = one_shot.server_diagnostics(
      {"U_r": u_r, "U": np.ones((2, 2)), "samples": samples}, counts)
  assert set(out) == {"U_r", "U", "U_r_vs_class_share"}
  assert out["U_r"] == u_r.tolist() and out["U"] == [[1.0, 1.0]] * 2
  # The oracle's shares are [[0.75, 0.25], [0, 1]]: U_r equals them.
  agreement = out["U_r_vs_class_share"]
  assert np.isclose(agreement["correlation"], 1.0)
  assert agreement["argmax_agreement"] == 1.0
  # A server without a report (one-shot FedAvg): nothing.
  assert one_shot.server_diagnostics({}, counts) == {}
