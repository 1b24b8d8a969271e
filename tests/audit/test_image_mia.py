"""Membership inference on image uploads: hand checks and calibration."""

import jax
import numpy as np
import pytest

from fedjax_dd.audit import image_mia
from fedjax_dd.core.checks import SettingError
from fedjax_dd.distill import privacy
from tests.audit import _data

PROJECTION = image_mia.random_projection(jax.random.key(0), _data.SHAPE)


def test_distance_to_the_nearest_upload_of_the_class_by_hand():
  x = np.array([[[[0], [255]]], [[[0], [0]]], [[[255], [255]]]], np.uint8)
  y = np.array([0, 1, 2], np.int32)
  up = np.array([[[[0], [0]]], [[[255], [0]]], [[[9], [9]]]], np.uint8)
  up_y = np.array([[1.0, 0.0, 0.0], [0.1, 0.7, 0.2], [0.0, 0.0, 1.0]])
  # Class 0's only upload is [0, 0]: distance 1. Class 1's is [1, 0]:
  # distance 1 to [0, 0]. Class 2's upload is padding (2 valid rows): inf.
  d = image_mia.nearest_upload_distance(x, y, up, up_y, 2)
  np.testing.assert_allclose(d, [1.0, 1.0, np.inf])
  s = image_mia.image_mia_scores(x, y, up, up_y.argmax(1), 3)
  np.testing.assert_allclose(s, [-1.0, -1.0, -np.sqrt(2) * (1 - 9 / 255)],
                             rtol=1e-6)


def _sets(seed=1):
  rng = np.random.default_rng(seed)
  t = _data.templates()
  members = _data.draw(rng, 100, t)
  nonmembers = _data.draw(rng, 100, t)
  return rng, t, members, nonmembers


@pytest.mark.parametrize("projection", [None, PROJECTION],
                         ids=["pixels", "features"])
def test_an_upload_of_the_raw_images_is_found(projection):
  _, _, (mx, my), (nx, ny) = _sets()
  r = image_mia.image_mia(mx, my, nx, ny, mx, my, projection=projection)
  assert r.auc >= 0.99 and r.num_members == r.num_nonmembers == 1000


@pytest.mark.parametrize("projection", [None, PROJECTION],
                         ids=["pixels", "features"])
def test_an_upload_of_held_out_images_is_a_coin(projection):
  rng, t, (mx, my), (nx, ny) = _sets()
  hx, hy = _data.draw(rng, 100, t)  # the same classes, neither set
  r = image_mia.image_mia(mx, my, nx, ny, hx, hy, projection=projection)
  assert abs(r.auc - 0.5) <= 0.05


@pytest.mark.parametrize("projection", [None, PROJECTION],
                         ids=["pixels", "features"])
def test_a_near_copy_passes_the_byte_check_but_not_the_audit(projection):
  rng, _, (mx, my), (nx, ny) = _sets()
  near = _data.near_copy(rng, mx)
  r = image_mia.image_mia(mx, my, nx, ny, near, my, projection=projection)
  assert r.auc >= 0.95
  p = privacy.upload_privacy(near, np.zeros(len(near), np.int32), mx[None],
                             np.array([len(mx)]))
  assert p["identical_to_raw_count"] == 0


def test_batched_equals_each_client():
  rng = np.random.default_rng(2)
  t = _data.templates()
  c, n_max, m_max = 3, 12, 7
  counts, uploads = np.array([12, 5, 9]), np.array([7, 3, 1])
  x = np.zeros((c, n_max, *_data.SHAPE), np.uint8)
  y = np.zeros((c, n_max), np.int32)
  ux = np.zeros((c, m_max, *_data.SHAPE), np.uint8)
  uy = np.zeros((c, m_max, _data.CLASSES), np.float32)
  for i in range(c):
    xi, yi = _data.draw(rng, 2, t)
    pick = rng.permutation(len(yi))
    x[i, :counts[i]] = xi[pick[:counts[i]]]
    y[i, :counts[i]] = yi[pick[:counts[i]]]
    ux[i, :uploads[i]] = xi[pick[:uploads[i]]]
    uy[i, :uploads[i]] = np.eye(_data.CLASSES)[yi[pick[:uploads[i]]]]
  for proj in (None, PROJECTION):
    batched = image_mia.image_mia_scores_batched(x, y, ux, uy, uploads, proj)
    assert batched.shape == (c, n_max)
    for i in range(c):
      one = image_mia.image_mia_scores(x[i], y[i], ux[i], uy[i], uploads[i],
                                       proj)
      np.testing.assert_allclose(batched[i], one, rtol=1e-5, atol=1e-5)
  results = image_mia.image_mia_batched(x, y, counts, x[:, ::-1], y[:, ::-1],
                                        counts, ux, uy, uploads)
  for i in range(c):
    one = image_mia.image_mia(x[i, :counts[i]], y[i, :counts[i]],
                              x[i, ::-1][:counts[i]], y[i, ::-1][:counts[i]],
                              ux[i], uy[i], uploads[i])
    assert results[i].auc == pytest.approx(one.auc)
    assert results[i].tpr_at_fpr == pytest.approx(one.tpr_at_fpr)


def test_bad_inputs_are_one_line_refusals():
  x = np.zeros((4, 2, 2, 1), np.uint8)
  y = np.zeros(4, np.int32)
  with pytest.raises(SettingError, match=r"upload_x must be images of the "
                     r"candidates' shape \[H, W, Ch\] = \(2, 2, 1\), got "
                     r"\(3, 2, 1\)"):
    image_mia.image_mia(x, y, x, y, np.zeros((4, 3, 2, 1), np.uint8), y)
  with pytest.raises(SettingError, match="members_x must be a non-empty"):
    image_mia.image_mia(x[:0], y[:0], x, y, x, y)
  with pytest.raises(SettingError, match=r"^fpr must be"):
    image_mia.image_mia(x, y, x, y, x, y, fprs=(0.0,))
  with pytest.raises(SettingError, match=r"num_uploads must be in \[1, 4\]"):
    image_mia.image_mia(x, y, x, y, x, y, 0)
  with pytest.raises(SettingError, match="y must be one class per candidate"):
    image_mia.image_mia(x, y[:3], x, y, x, y)
  with pytest.raises(SettingError, match="upload_y must be labels of shape"):
    image_mia.image_mia(x, y, x, y, x, y[:2])
  with pytest.raises(SettingError, match="projection must be"):
    image_mia.image_mia(x, y, x, y, x, y, projection=PROJECTION)
  with pytest.raises(SettingError, match=r"num_members must be in \[1, 4\]"):
    image_mia.image_mia_batched(x[None], y[None], [0], x[None], y[None], [4],
                                x[None], y[None], [4])
