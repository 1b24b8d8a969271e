"""StageCache: hit, miss, stale refusal, damaged entries, shapes from meta."""

import json
import logging

import numpy as np
import pytest

from fedjax_dd.core.stage_cache import StageCache, StaleStageError


def _arrays():
  return {"x": np.arange(24, dtype=np.uint8).reshape(2, 3, 4),
          "owner": np.array([0, 0, 5], np.int64),
          "converged": np.array([True, False]),
          "loss": np.asarray(0.25, np.float32),
          "empty": np.zeros((0, 3), np.int32)}


FP = {"dataset": "digits", "seed": 0, "partition": {"name": "iid"},
      "shape": (8, 8, 1), "format": 1}


def test_miss_then_hit_restores_shapes_dtypes_and_info(tmp_path):
  cache = StageCache.for_workdir(tmp_path)
  assert cache.load("distilled", FP) is None
  assert not (tmp_path / "stages").exists()     # a miss creates nothing
  cache.save("distilled", FP, _arrays(), {"seconds": 1.5, "flag": True})
  assert (tmp_path / "stages" / "distilled").is_dir()
  hit = StageCache.for_workdir(tmp_path).load("distilled", FP)
  assert hit is not None and hit.info == {"seconds": 1.5, "flag": True}
  assert set(hit.arrays) == set(_arrays())
  for k, want in _arrays().items():
    got = hit.arrays[k]
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype and got.shape == want.shape, k
    np.testing.assert_array_equal(got, want)
  # Another stage of the same cache is a separate entry.
  assert cache.load("other", FP) is None


def test_stale_entry_is_refused_naming_the_fields(tmp_path):
  cache = StageCache(tmp_path)
  cache.save("s", FP, _arrays())
  with pytest.raises(StaleStageError, match="seed") as e:
    cache.load("s", {**FP, "seed": 1, "lr": 0.1})
  msg = str(e.value)
  assert "seed (cached: 0, current: 1)" in msg
  assert "lr (cached: absent, current: 0.1)" in msg
  assert "dataset" not in msg
  assert isinstance(e.value, ValueError)
  with pytest.raises(ValueError, match="format"):
    cache.load("s", {k: v for k, v in FP.items() if k != "format"})


def test_fingerprints_compare_after_json_and_new_off_fields_match(tmp_path):
  cache = StageCache(tmp_path)
  cache.save("s", FP, _arrays())
  # A tuple and a list are the same setting once stored as JSON.
  assert cache.load("s", {**FP, "shape": [8, 8, 1]}) is not None
  # A setting added later, at its off value, is what the older run did.
  assert cache.load("s", {**FP, "resplit": 0.0, "new_flag": False,
                          "path": ""}) is not None
  with pytest.raises(StaleStageError, match="resplit"):
    cache.load("s", {**FP, "resplit": 0.8})


def test_save_replaces_the_entry(tmp_path, caplog):
  cache = StageCache(tmp_path)
  cache.save("s", FP, _arrays(), {"v": 1})
  smaller = {"x": np.ones((5,), np.float32)}
  with caplog.at_level(logging.WARNING):
    cache.save("s", {**FP, "seed": 3}, smaller, {"v": 2})
  # Replacing is what a stage cache's save does (a segment checkpoint saves
  # every segment): no warning about a replaced checkpoint.
  assert "replaced" not in caplog.text
  with pytest.raises(StaleStageError):
    cache.load("s", FP)
  hit = cache.load("s", {**FP, "seed": 3})
  assert hit.info == {"v": 2} and set(hit.arrays) == {"x"}
  np.testing.assert_array_equal(hit.arrays["x"], np.ones(5))


def test_damaged_or_unfinished_entry_is_a_miss(tmp_path, caplog):
  cache = StageCache(tmp_path)
  cache.save("s", FP, _arrays())
  step = cache.path("s") / "0"
  data_files = [p for p in (step / "state").rglob("*") if p.is_file()
                and p.stat().st_size > 0 and "metadata" not in p.name]
  assert data_files
  with open(data_files[0], "r+b") as f:            # flip one byte
    b = f.read(1)
    f.seek(0)
    f.write(bytes([b[0] ^ 0xFF]))
  with caplog.at_level(logging.WARNING):
    assert cache.load("s", FP) is None
  assert "does not match its checksum" in caplog.text
  cache.save("s", FP, _arrays())                    # recomputed and saved
  assert cache.load("s", FP) is not None
  (step / "fedjax_dd_commit.json").unlink()         # a save cut short
  assert cache.load("s", FP) is None


def test_invalid_arguments(tmp_path):
  cache = StageCache(tmp_path)
  with pytest.raises(ValueError, match="stage name"):
    cache.path("../x")
  with pytest.raises(ValueError, match="JSON"):
    cache.save("s", {"f": object()}, _arrays())
  with pytest.raises(ValueError, match="non-empty"):
    cache.save("s", FP, {"e": np.zeros((0,))})
  with pytest.raises(ValueError, match="dict"):
    cache.load("s", [1, 2])
  cache.save("s", FP, _arrays())
  meta = json.loads((cache.path("s") / "0" / "meta" / "metadata").read_text())
  assert meta["fingerprint"]["shape"] == [8, 8, 1]
  assert meta["spec"]["empty"] == {"shape": [0, 3], "dtype": "int32"}


def test_get_or_compute_runs_compute_once(tmp_path):
  cache = StageCache(tmp_path / "stages")
  calls = []

  def compute():
    calls.append(1)
    return {"x": np.arange(6, dtype=np.uint8).reshape(2, 3)}, {"seconds": 1.5}

  first, computed = cache.get_or_compute("s", {"k": 1}, compute)
  again, cached = StageCache(tmp_path / "stages").get_or_compute(
      "s", {"k": 1}, compute)
  assert computed and not cached and calls == [1]
  for got in (first, again):
    np.testing.assert_array_equal(got.arrays["x"], [[0, 1, 2], [3, 4, 5]])
    assert got.arrays["x"].dtype == np.uint8 and got.info == {"seconds": 1.5}
  with pytest.raises(StaleStageError, match="k"):
    cache.get_or_compute("s", {"k": 2}, compute)
