"""Metrics rows: JSON conversion, truncation on resume, TensorBoard option."""

import math
import os

import numpy as np
import pytest

from fedjax_dd.core.metrics import (MetricsFileError, MetricsWriter, to_jsonable,
                                    write_json)


def test_to_jsonable_and_truncate(tmp_path):
  row = {"round": np.int32(2), "acc": np.float32(0.5), "v": np.arange(2),
         "bad": float("nan")}
  out = to_jsonable(row)
  assert out == {"round": 2, "acc": 0.5, "v": [0, 1], "bad": "nan"}
  w = MetricsWriter(tmp_path / "m" / "metrics.jsonl")
  for r in range(1, 5):
    w.write({"round": r, "x": r * 0.25})
  w.truncate_after(2)
  assert w.rows() == [{"round": 1, "x": 0.25}, {"round": 2, "x": 0.5}]
  write_json(tmp_path / "s.json", {"a": np.float64(1.5), "inf": math.inf})
  assert (tmp_path / "s.json").read_text().count("1.5") == 1


def test_tensorboard_scalars(tmp_path):
  w = MetricsWriter(tmp_path / "metrics.jsonl", tensorboard_dir=tmp_path / "tb")
  w.write({"round": 1, "test_accuracy": 0.5})
  files = os.listdir(tmp_path / "tb")
  assert any(f.startswith("events.out.tfevents") for f in files)


def test_a_cut_last_line_is_dropped_on_truncate_and_named_otherwise(tmp_path):
  import pytest  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core.metrics import MetricsFileError  # pylint: disable=g-import-not-at-top
  path = tmp_path / "metrics.jsonl"
  w = MetricsWriter(path)
  w.write({"round": 1})
  with open(path, "a") as f:
    f.write('{"round": 2, "x')  # killed while writing round 2's row
  with pytest.raises(MetricsFileError, match=r"line 2 is not a JSON row"):
    w.rows()
  w.truncate_after(1)
  assert w.rows() == [{"round": 1}]
  # A fresh start drops whatever the file held without reading it.
  path.write_text("garbage\n{oops\n")
  w.truncate_after(0)
  assert w.rows() == []


def test_a_symlinked_metrics_file_is_refused_not_followed(tmp_path):
  outside = tmp_path / "outside.txt"
  outside.write_text("not the run's\n")
  run = tmp_path / "run"
  run.mkdir()
  os.symlink(outside, run / "metrics.jsonl")
  with pytest.raises(MetricsFileError, match=r"metrics.jsonl is a symbolic "
                                             r"link \(to .*outside.txt\)"):
    MetricsWriter(run / "metrics.jsonl")
  assert outside.read_text() == "not the run's\n"
  # A link made after the writer opened: refused at the next write.
  os.remove(run / "metrics.jsonl")
  w = MetricsWriter(run / "metrics.jsonl")
  w.write({"round": 1})
  os.remove(run / "metrics.jsonl")
  os.symlink(outside, run / "metrics.jsonl")
  with pytest.raises(MetricsFileError, match="symbolic link"):
    w.write({"round": 2})
  with pytest.raises(MetricsFileError, match="symbolic link"):
    w.truncate_after(1)
  assert outside.read_text() == "not the run's\n"


def test_the_first_new_row_removes_what_described_the_old_rows(tmp_path):
  stale = tmp_path / "summary.json"
  stale.write_text("{}")
  w = MetricsWriter(tmp_path / "metrics.jsonl", invalidates=(stale,))
  w.truncate_after(0)
  assert stale.exists()  # a resume that writes nothing keeps it
  w.write({"round": 1})
  assert not stale.exists()
  stale.write_text("{}")  # the run's own new summary, at its end
  w.write({"round": 2})
  assert stale.exists()
