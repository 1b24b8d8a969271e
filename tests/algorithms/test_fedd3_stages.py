"""FedD3's distil-or-load, KIP statistics and the KRR quantisation check on
tiny hand-checkable sets."""

import numpy as np
import pytest

from fedjax_dd.algorithms import fedd3_stages
from fedjax_dd.algorithms.fedd3 import DistilledSet
from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core.stage_cache import StageCache
from fedjax_dd.data.stacked import ClientData


def _set(first_loss=(2.0, 1.0, 0.0), last_loss=(1.0, 0.5, 0.0)):
  x = np.array([[[[0]]], [[[255]]]], np.uint8)           # [2, 1, 1, 1]
  return DistilledSet(
      x=x, y=np.array([0, 1], np.int32),
      y_soft=np.eye(2, dtype=np.float32), owner=np.array([0, 1]),
      x_float=np.array([[[[10.0]]], [[[250.0]]]], np.float32),
      iterations=np.array([4, 2, 0], np.int32),
      converged=np.array([True, False, False]),
      first_loss=np.asarray(first_loss, np.float32),
      last_loss=np.asarray(last_loss, np.float32))


def test_kip_statistics_skip_clients_that_ran_nothing():
  out = fedd3_stages.kip_statistics(_set())
  # Clients 0 and 1 ran (4 and 2 iterations); client 2 had no data.
  assert out["kip_iterations"] == {"min": 2, "median": 3.0, "max": 4,
                                   "converged_fraction": 0.5}
  assert out["kip_loss"] == {"first_min": 1.0, "first_median": 1.5,
                             "last_min": 0.5, "last_median": 0.75}
  no_kip = DistilledSet(x=_set().x, y=_set().y, y_soft=_set().y_soft,
                        owner=_set().owner)
  assert fedd3_stages.kip_statistics(no_kip) == {"kip_loss": None,
                                                 "kip_iterations": None}


def test_quantisation_cost_is_krr_accuracy_before_and_after_rounding():
  # A linear kernel on one pixel: KRR through the two support points
  # predicts class 1 above their midpoint. The float support (10, 250;
  # midpoint 130) puts pixel 128 in class 0; the uint8 one (0, 255;
  # midpoint 127.5) in class 1.
  linear = lambda a, b: (a.reshape(a.shape[0], -1) @ b.reshape(b.shape[0],
                                                              -1).T) + 1.0
  x_test = np.array([[[[128]]], [[[5]]], [[[240]]]], np.uint8)
  y_test = np.array([0, 0, 1])
  out = fedd3_stages.quantisation_cost(
      _set(), kernel_fn=linear, mean=np.zeros(1), std=np.ones(1),
      x_test=x_test, y_test=y_test, reg=1e-6)
  assert out == {"krr_test_accuracy_float": 1.0,
                 "krr_test_accuracy_uint8": pytest.approx(2 / 3)}
  gmm = DistilledSet(x=_set().x, y=_set().y, y_soft=_set().y_soft,
                     owner=_set().owner)
  assert fedd3_stages.quantisation_cost(
      gmm, kernel_fn=linear, mean=np.zeros(1), std=np.ones(1),
      x_test=x_test, y_test=y_test, reg=1e-6) == {}


def test_distill_or_load_distils_once_and_reads_another_runs_cache(tmp_path):
  calls = []

  def distill():
    calls.append(1)
    return _set()

  cache = StageCache(tmp_path / "a")
  first, _, cached = fedd3_stages.distill_or_load(
      distill, cache=cache, fingerprint={"k": 1})
  again, _, cached_again = fedd3_stages.distill_or_load(
      distill, cache=cache, fingerprint={"k": 1})
  assert len(calls) == 1 and not cached and cached_again
  np.testing.assert_array_equal(again.x, first.x)
  np.testing.assert_array_equal(again.iterations, [4, 2, 0])
  other = StageCache(tmp_path / "b")
  from_source, _, _ = fedd3_stages.distill_or_load(
      distill, cache=other, fingerprint={"k": 1}, source=cache)
  np.testing.assert_array_equal(from_source.x_float, first.x_float)
  assert len(calls) == 1 and not other.root.exists()
  with pytest.raises(ValueError, match="run b holds no distilled set"):
    fedd3_stages.distill_or_load(distill, cache=cache, fingerprint={"k": 1},
                                 source=other, source_name="run b")


def test_a_diverged_kip_set_is_refused_and_not_cached(tmp_path):
  cache = StageCache(tmp_path)
  with pytest.raises(loop_lib.DivergedError, match="lower the lr"):
    fedd3_stages.distill_or_load(
        lambda: _set(first_loss=(1.0, 1.0, 0.0), last_loss=(9.0, 9.0, 0.0)),
        cache=cache, fingerprint={"k": 1}, diverged_advice="lower the lr")
  assert cache.load(fedd3_stages.STAGE, {"k": 1}) is None


def test_upload_fields_measure_privacy_and_draw_nothing(tmp_path,
                                                        monkeypatch):
  monkeypatch.chdir(tmp_path)
  raw = ClientData(x=np.array([[[[[0]]]], [[[[9]]]]], np.uint8),
                   y=np.zeros((2, 1), np.int32),
                   num_examples=np.array([1, 1], np.int32))
  out = fedd3_stages.upload_fields(
      _set(), raw, distiller="kip", distill_seconds=2.0, cached=False,
      distilled_grid="g.png", quantisation={"q": 1.0})
  assert not list(tmp_path.iterdir())  # the caller draws the grid
  assert out["distilled_grid"] == "g.png"
  assert out["distilled_images_total"] == 2 and out["pixels_per_sample"] == 1
  # Image 0 (0) is client 0's raw image; image 1 (255) is not client 1's (9).
  assert out["privacy"]["identical_to_raw_count"] == 1
  assert out["kip_iterations"]["max"] == 4 and out["q"] == 1.0
  assert list(out)[:5] == ["distiller", "distilled_images_total",
                           "distill_seconds", "distilled_cached",
                           "distilled_from"]
