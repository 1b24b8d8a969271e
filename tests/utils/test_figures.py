"""Figures drawn at the caller from the library's data."""

import numpy as np

from fedjax_dd.utils import figures


def test_plot_one_shot_draws_what_the_report_has(tmp_path):
  counts = np.array([[6, 0], [2, 8]])
  rows = [{"step": 1, "test_accuracy": 0.5}, {"step": 2, "train_loss": 1.0},
          {"step": 3, "test_accuracy": 0.75}]
  report = {"U_r": np.array([[0.75, 0.25], [0.0, 1.0]]),
            "samples": (np.zeros((4, 2, 2, 1), np.float32),
                        np.array([0, 1, 0, 1]))}
  names = figures.plot_one_shot(report, rows, class_counts=counts,
                                num_classes=2, directory=str(tmp_path))
  assert names == ["u_r.png", "samples.png", "accuracy.png"]
  for name in names:
    assert (tmp_path / name).stat().st_size > 0
  # A server without a report (one-shot FedAvg): only the accuracy curve.
  assert figures.plot_one_shot({}, rows, class_counts=counts, num_classes=2,
                               directory=str(tmp_path / "bare")) == [
                                   "accuracy.png"]
  assert figures.plot_one_shot({}, rows[1:2], class_counts=counts,
                               num_classes=2,
                               directory=str(tmp_path / "none")) == []
