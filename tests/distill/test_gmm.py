"""Tests for fedjax_dd.distill.gmm."""

import numpy as np
import pytest

from fedjax_dd.distill import gmm


def _two_level_class(low, high, n_each, shape):
  """A class made of n_each constant images at `low` and n_each at `high`."""
  return np.concatenate([np.full((n_each,) + shape, low, np.uint8),
                         np.full((n_each,) + shape, high, np.uint8)])


def test_means_of_two_tight_clusters_are_recovered():
  # One class: 5 images of constant 10 and 5 of constant 200. Two components
  # must sit exactly on the two levels.
  x = _two_level_class(10, 200, 5, (8, 8, 1))
  y = np.zeros(10, np.int32)
  # Two distinct images for two components: the means are those raw images.
  xd, yd = gmm.gmm_coreset(x, y, images_per_class=2,
                           rng=np.random.default_rng(0), allow_raw_upload=True)
  assert xd.shape == (2, 8, 8, 1) and xd.dtype == np.uint8
  assert yd.dtype == np.int32
  np.testing.assert_array_equal(yd, [0, 0])
  levels = sorted(int(v) for v in np.unique(xd))
  assert levels == [10, 200]
  assert all(len(np.unique(img)) == 1 for img in xd)


def test_shapes_counts_and_class_order_8x8x1():
  rng = np.random.default_rng(1)
  # Classes 2 (10 samples), 0 (10 samples), 5 (3 samples); shuffled.
  y = np.array([2] * 10 + [0] * 10 + [5] * 3, np.int32)
  perm = rng.permutation(len(y))
  y = y[perm]
  x = rng.integers(0, 256, size=(len(y), 8, 8, 1), dtype=np.uint8)
  # Class 5 is smaller than images_per_class: allowed raw upload.
  xd, yd = gmm.gmm_coreset(x, y, images_per_class=4,
                           rng=np.random.default_rng(2), max_iter=20,
                           allow_raw_upload=True)
  # min(4, count): 4 + 4 + 3 (class 5 has fewer samples than components).
  assert xd.shape == (11, 8, 8, 1) and xd.dtype == np.uint8
  np.testing.assert_array_equal(yd, [0] * 4 + [2] * 4 + [5] * 3)


def test_works_on_32x32x3_and_is_reproducible():
  rng = np.random.default_rng(3)
  x = rng.integers(0, 256, size=(12, 32, 32, 3), dtype=np.uint8)
  y = np.array([0] * 6 + [1] * 6, np.int64)
  out1 = gmm.gmm_coreset(x, y, images_per_class=2,
                         rng=np.random.default_rng(7), max_iter=10)
  out2 = gmm.gmm_coreset(x, y, images_per_class=2,
                         rng=np.random.default_rng(7), max_iter=10)
  assert out1[0].shape == (4, 32, 32, 3) and out1[0].dtype == np.uint8
  np.testing.assert_array_equal(out1[1], [0, 0, 1, 1])
  np.testing.assert_array_equal(out1[0], out2[0])


def test_means_are_clipped_to_pixel_range():
  x = np.full((4, 4, 4, 1), 255, np.uint8)
  x[:2] = 0
  xd, _ = gmm.gmm_coreset(x, np.zeros(4, np.int32), images_per_class=2,
                          rng=np.random.default_rng(0), allow_raw_upload=True)
  assert sorted(int(v) for v in np.unique(xd)) == [0, 255]


def test_privacy_guard_for_single_sample_class():
  x = np.stack([np.full((8, 8, 1), v, np.uint8) for v in (10, 20, 99)])
  y = np.array([0, 0, 1])
  with pytest.raises(ValueError, match=r"^class 1 holds 1 example <= images_per_class=1: each "
                     r"Gaussian-mixture mean would be one of its raw images"):
    gmm.gmm_coreset(x, y, images_per_class=1, rng=np.random.default_rng(0))
  xd, yd = gmm.gmm_coreset(x, y, images_per_class=2,
                           rng=np.random.default_rng(0),
                           allow_raw_upload=True)
  np.testing.assert_array_equal(yd, [0, 0, 1])
  np.testing.assert_array_equal(xd[2], x[2])


def test_duplicates_limit_components_and_single_image_class_is_guarded():
  # Class 0: 6 images but only 2 distinct (3 x 40, 3 x 90); 4 components
  # requested -> 2 images, never an empty (black) component.
  x = _two_level_class(40, 90, 3, (8, 8, 1))
  xd, yd = gmm.gmm_coreset(x, np.zeros(6, np.int32), images_per_class=4,
                           rng=np.random.default_rng(0), allow_raw_upload=True)
  np.testing.assert_array_equal(yd, [0, 0])
  assert sorted(np.unique(xd).tolist()) == [40, 90]
  # Class with 3 copies of one image: its mean is that raw image.
  x = np.full((3, 8, 8, 1), 123, np.uint8)
  with pytest.raises(ValueError, match=r"^class 0 holds 3 examples, 1 distinct <= "
                     r"images_per_class=2"):
    gmm.gmm_coreset(x, np.zeros(3, np.int32), images_per_class=2,
                    rng=np.random.default_rng(0))
  xd, _ = gmm.gmm_coreset(x, np.zeros(3, np.int32), images_per_class=2,
                          rng=np.random.default_rng(0), allow_raw_upload=True)
  np.testing.assert_array_equal(xd, x[:1])


def test_invalid_arguments():
  x = np.zeros((4, 8, 8, 1), np.uint8)
  y = np.zeros(4, np.int32)
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match="uint8"):
    gmm.gmm_coreset(x.astype(np.float32), y, images_per_class=1, rng=rng)
  with pytest.raises(ValueError, match="images_per_class"):
    gmm.gmm_coreset(x, y, images_per_class=0, rng=rng)
  with pytest.raises(ValueError, match="Generator"):
    gmm.gmm_coreset(x, y, images_per_class=1, rng=0)
  with pytest.raises(ValueError, match="covariance_type"):
    gmm.gmm_coreset(x, y, images_per_class=1, rng=rng,
                    covariance_type="block")
  with pytest.raises(ValueError, match="shape"):
    gmm.gmm_coreset(x, y[:3], images_per_class=1, rng=rng)


def test_empty_input():
  xd, yd = gmm.gmm_coreset(np.zeros((0, 8, 8, 1), np.uint8),
                           np.zeros(0, np.int32), images_per_class=3,
                           rng=np.random.default_rng(0))
  assert xd.shape == (0, 8, 8, 1) and yd.shape == (0,)


def _client_stack():
  # Client 0: class 0 (4 imgs at 30 / 4 at 60), class 1 (2 at 200 / 2 at 220).
  # Client 1: class 1 only, 2 at 100 and 2 at 140, then padding.
  # Client 2: no data.
  shape = (8, 8, 1)
  n_max = 12
  x = np.full((3, n_max) + shape, 77, np.uint8)  # padding value 77
  y = np.full((3, n_max), 9, np.int32)  # padding label 9
  x[0, :8] = _two_level_class(30, 60, 4, shape)
  y[0, :8] = 0
  x[0, 8:12] = _two_level_class(200, 220, 2, shape)
  y[0, 8:12] = 1
  x[1, :4] = _two_level_class(100, 140, 2, shape)
  y[1, :4] = 1
  return x, y, np.array([12, 4, 0], np.int32)


def test_clients_shapes_counts_padding_and_values():
  x, y, num = _client_stack()
  xo, yo, counts = gmm.gmm_coreset_clients(
      x, y, num, images_per_class=2, rng=np.random.default_rng(0),
      allow_raw_upload=True)  # two distinct images per class
  np.testing.assert_array_equal(counts, [4, 2, 0])
  assert xo.shape == (3, 4, 8, 8, 1) and xo.dtype == np.uint8
  assert yo.shape == (3, 4) and yo.dtype == np.int32
  np.testing.assert_array_equal(yo[0], [0, 0, 1, 1])
  np.testing.assert_array_equal(yo[1, :2], [1, 1])
  # Padding (labels 9 / value 77) never enters; outputs are zero-padded.
  assert sorted(np.unique(xo[0, :2]).tolist()) == [30, 60]
  assert sorted(np.unique(xo[0, 2:]).tolist()) == [200, 220]
  assert sorted(np.unique(xo[1, :2]).tolist()) == [100, 140]
  assert not np.any(xo[1, 2:]) and not np.any(xo[2])
  assert not np.any(yo[1, 2:]) and not np.any(yo[2])


def test_clients_pad_to_and_errors():
  x, y, num = _client_stack()
  xo, yo, counts = gmm.gmm_coreset_clients(
      x, y, num, images_per_class=2, rng=np.random.default_rng(0), pad_to=6,
      allow_raw_upload=True)
  assert xo.shape == (3, 6, 8, 8, 1) and yo.shape == (3, 6)
  with pytest.raises(ValueError, match="pad_to"):
    gmm.gmm_coreset_clients(x, y, num, images_per_class=2,
                            rng=np.random.default_rng(0), pad_to=3,
                            allow_raw_upload=True)
  with pytest.raises(ValueError, match="num_examples"):
    gmm.gmm_coreset_clients(x, y, np.array([13, 0, 0]), images_per_class=2,
                            rng=np.random.default_rng(0))
  num_one = np.array([12, 1, 0], np.int32)  # client 1: one sample of class 1
  with pytest.raises(ValueError, match=r"^client 1: class 1 holds 1 example <= "
                     r"images_per_class=1"):
    gmm.gmm_coreset_clients(x, y, num_one, images_per_class=1,
                            rng=np.random.default_rng(0))


def test_guard_refuses_a_class_no_larger_than_images_per_class():
  # 3 distinct images, 3 components: each mean would be one raw image.
  x = np.stack([np.full((4, 4, 1), v, np.uint8) for v in (10, 90, 200)])
  with pytest.raises(ValueError, match=r"^class 0 holds 3 examples <= "
                     r"images_per_class=3: each Gaussian-mixture mean would be "
                     r"one of its raw images, which would leak them \(FedD3 App\. "
                     r"G\)\. Lower images_per_class below 3, or pass "
                     r"allow_raw_upload=True to accept this\.$"):
    gmm.gmm_coreset(x, np.zeros(3, np.int32), images_per_class=3,
                    rng=np.random.default_rng(0))


def test_clients_are_all_checked_before_any_is_fitted(monkeypatch):
  x, y, num = _client_stack()
  fitted = []
  monkeypatch.setattr(gmm.mixture.GaussianMixture, "fit",
                      lambda self, *a: fitted.append(1))
  # Client 1's class 1 has 2 distinct images: refused with images_per_class=2.
  with pytest.raises(ValueError, match=r"^client 0: class 0 holds 8 examples, "
                     r"2 distinct <= images_per_class=2"):
    gmm.gmm_coreset_clients(x, y, num, images_per_class=2,
                            rng=np.random.default_rng(0))
  assert not fitted


def test_with_the_guard_on_no_uploaded_mean_is_raw():
  from fedjax_dd.distill import privacy
  rng = np.random.default_rng(0)
  # Two clients, two classes of 12 noisy images each: 2 components per class.
  x = rng.integers(0, 256, (2, 24, 6, 6, 1)).astype(np.uint8)
  y = np.tile(np.repeat([0, 1], 12), (2, 1)).astype(np.int32)
  n = np.array([24, 24], np.int32)
  xo, yo, counts = gmm.gmm_coreset_clients(
      x, y, n, images_per_class=2, rng=np.random.default_rng(1), max_iter=20)
  owner = np.repeat(np.arange(2), counts)
  up = np.concatenate([xo[i, :counts[i]] for i in range(2)])
  p = privacy.upload_privacy(up, owner, x, n)
  assert p["uploaded_images"] == 8 and p["identical_to_raw_count"] == 0
  # The same clients with images_per_class >= the class size are refused.
  with pytest.raises(ValueError, match="client 0: class 0 holds 12 examples "
                     "<= images_per_class=12"):
    gmm.gmm_coreset_clients(x, y, n, images_per_class=12,
                            rng=np.random.default_rng(1))


def test_clients_refuse_bad_inputs():
  x, y, num = _client_stack()
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match=r"^x must be \[C, N_max, \.\.\.\] uint8"):
    gmm.gmm_coreset_clients(x / 255.0, y, num, images_per_class=1, rng=rng)
  with pytest.raises(ValueError, match=r"^y must be \[C, N_max\] integer class "
                     r"indices, got dtype float32"):
    gmm.gmm_coreset_clients(x, y.astype(np.float32), num, images_per_class=1,
                            rng=rng)
  bad = y.copy()
  bad[1, 0] = -1
  with pytest.raises(ValueError, match=r"^client 1: y must hold class indices "
                     r"in \[0, 2147483647\), got 1 outside it \(-1\)"):
    gmm.gmm_coreset_clients(x, bad, num, images_per_class=1, rng=rng)
  with pytest.raises(ValueError, match=r"^images_per_class must be an int >= 1, "
                     r"got 0\.$"):
    gmm.gmm_coreset_clients(x, y, num, images_per_class=0, rng=rng)
