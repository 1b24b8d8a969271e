"""The quickstart's comparison figure: one bar per method, readable labels."""

import itertools

import numpy as np

from fedjax_dd.utils import figures


def _capture_figures(monkeypatch):
  """The figures plot_comparison makes, in order."""
  made = []
  new_figure = figures.new_figure

  def capture(**kwargs):
    made.append(new_figure(**kwargs))
    return made[-1]

  monkeypatch.setattr(figures, "new_figure", capture)
  return made


def test_comparison_tick_labels_do_not_overlap(tmp_path, monkeypatch):
  made = _capture_figures(monkeypatch)
  names = ["fedavg", "fedd3", "hfldd", "fedhydra",
           "fedhydra: one-shot FedAvg of its clients", "disue"]
  rows = [{"method": n, "final_test_accuracy": 0.1 * (i + 1),
           "bytes_total": 10.0 ** (i + 3)} for i, n in enumerate(names)]
  path = figures.plot_comparison(rows, tmp_path / "comparison.png")
  assert (tmp_path / "comparison.png").stat().st_size > 0
  assert path.endswith("comparison.png")
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  canvas = FigureCanvasAgg(made[0])
  canvas.draw()
  renderer = canvas.get_renderer()
  labels = [t for ax in made[0].axes
            for t in ax.get_xticklabels() + ax.get_yticklabels()
            if t.get_text() and t.get_visible()]
  # Every method's name is shown once, in the table's order from the top.
  shown = [t.get_text() for t in made[0].axes[0].get_yticklabels()]
  assert shown == names
  boxes = [t.get_window_extent(renderer) for t in labels]
  for (a, ta), (b, tb) in itertools.combinations(zip(boxes, labels), 2):
    assert not a.overlaps(b), (ta.get_text(), tb.get_text())


def test_comparison_has_its_title_and_marks_each_expected_range(
    tmp_path, monkeypatch):
  made = _capture_figures(monkeypatch)
  rows = [{"method": "in", "final_test_accuracy": 0.5,
           "bytes_total": 1e3, "expected": (0.4, 0.6)},
          {"method": "low", "final_test_accuracy": 0.2,
           "bytes_total": 1e4, "expected": (0.3, 0.7)},
          {"method": "none", "final_test_accuracy": 0.9,
           "bytes_total": 1e5}]
  figures.plot_comparison(rows, tmp_path / "comparison.png",
                          title="Quickstart")
  fig = made[0]
  assert fig._suptitle.get_text() == "Quickstart"  # pylint: disable=protected-access
  ax = fig.axes[0]
  # One interval per ranged row, spanning exactly its (low, high).
  spans = sorted(
      tuple(np.round(seg[:, 0], 6)) for coll in ax.collections
      for seg in coll.get_segments())
  assert spans == [(0.3, 0.7), (0.4, 0.6)]
  texts = [t.get_text() for t in ax.texts]
  assert texts == ["0.500", "0.200 (below)", "0.900"]
