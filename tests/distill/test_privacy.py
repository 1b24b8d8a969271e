"""Privacy figure of an upload: identical-to-raw share and nearest distances."""

import numpy as np
import pytest

from fedjax_dd.distill import privacy


def _raw():
  x = np.zeros((2, 3, 2, 2, 1), np.uint8)
  x[0, 0] = 255            # all white
  x[0, 1, 0, 0, 0] = 255   # one white pixel
  x[1, 0] = 0              # black (client 1 holds 1 real image)
  x[1, 1:] = 77            # padding: must be ignored
  return x, np.array([2, 1], np.int32)


def test_hand_checked_distances_and_identity():
  x, n = _raw()
  up = np.zeros((3, 2, 2, 1), np.uint8)
  up[0] = 255                       # = client 0's raw image 0
  up[1, 0, 0, 0] = 255              # client 1 sends it: nearest raw is black
  up[1, 1, 1, 0] = 51               # and 0.2 more in one pixel
  up[2] = 77                        # equals client 1's *padding* only
  p = privacy.upload_privacy(up, np.array([0, 1, 1]), x, n)
  assert p["uploaded_images"] == 3
  assert p["identical_to_raw_count"] == 1
  assert p["identical_to_raw_fraction"] == pytest.approx(1 / 3)
  d1 = np.sqrt(1.0 + 0.2 ** 2)      # to client 1's black image
  d2 = np.sqrt(4 * (77 / 255) ** 2)  # padding is not raw data
  assert p["nearest_raw_l2_min"] == 0.0
  assert p["nearest_raw_l2_median"] == pytest.approx(min(d1, d2))


def test_own_raw_only():
  x, n = _raw()
  up = np.full((1, 2, 2, 1), 255, np.uint8)  # client 0's image, sent by 1
  p = privacy.upload_privacy(up, np.array([1]), x, n)
  assert p["identical_to_raw_count"] == 0
  assert p["nearest_raw_l2_min"] == pytest.approx(2.0)


def test_empty_upload_and_bad_inputs():
  x, n = _raw()
  p = privacy.upload_privacy(np.zeros((0, 2, 2, 1), np.uint8),
                             np.zeros((0,), int), x, n)
  assert p["identical_to_raw_fraction"] == 0.0 and p["nearest_raw_l2_min"] is None
  with pytest.raises(ValueError, match="uint8"):
    privacy.upload_privacy(np.zeros((1, 2, 2, 1), np.float32), [0], x, n)
  with pytest.raises(ValueError, match="owner must be in"):
    privacy.upload_privacy(np.zeros((1, 2, 2, 1), np.uint8), [5], x, n)
  with pytest.raises(ValueError, match="differ in shape"):
    privacy.upload_privacy(np.zeros((1, 3, 2, 1), np.uint8), [0], x, n)
  with pytest.raises(ValueError, match="hold no raw"):
    privacy.upload_privacy(np.zeros((1, 2, 2, 1), np.uint8), [1], x,
                           np.array([2, 0]))


def test_identity_flags_and_the_guard():
  x, n = _raw()
  up = np.zeros((3, 2, 2, 1), np.uint8)
  up[0] = 255                       # client 0's raw image 0
  up[2] = 77                        # client 1's padding only: not raw
  owner = np.array([0, 1, 1])
  np.testing.assert_array_equal(
      privacy.identical_to_raw(up, owner, x, n), [True, True, False])
  # up[1] is black = client 1's one raw image.
  with pytest.raises(privacy.RawUploadError,
                     match=r"2 of 3 KIP images .* \(2 clients, e\.g\. \[0, 1\]\)"):
    privacy.check_no_raw_upload(up, owner, x, n)
  privacy.check_no_raw_upload(up[2:], owner[2:], x, n)  # nothing raw
  assert privacy.identical_to_raw(up[:0], owner[:0], x, n).shape == (0,)


def test_constant_images_are_not_told_to_run_more_iterations():
  # Two clients of two images each; the uploads copy one raw image each.
  x = np.zeros((2, 2, 2, 2, 1), np.uint8)
  x[0, 0] = [[[10], [20]], [[30], [40]]]     # varied pixels
  x[0, 1] = 200
  x[1, :] = 7                               # constant, and all the same
  n = np.array([2, 2])
  owner = np.array([0, 1])
  varied = np.stack([x[0, 0], x[1, 0]])
  with pytest.raises(privacy.RawUploadError, match=r"Run more iterations"):
    privacy.check_no_raw_upload(varied[:1], owner[:1], x, n)
  with pytest.raises(privacy.RawUploadError, match=(
      r"^1 of 1 KIP images to upload are byte-identical .* and 1 of them are "
      r"constant images \(one value in every pixel\): an image cannot be "
      r"distilled away from a set of identical images .* more iterations "
      r"give the same images\.")):
    privacy.check_no_raw_upload(varied[1:], owner[1:], x, n)
  # Mixed: one upload KIP could still move, so the advice stays.
  with pytest.raises(privacy.RawUploadError, match=r"Run more iterations"):
    privacy.check_no_raw_upload(varied, owner, x, n)


def test_a_near_copy_passes_the_byte_check_but_is_counted():
  # Before: an upload one grey level from its source passed as private.
  x, n = _raw()
  up = np.zeros((3, 2, 2, 1), np.uint8)
  up[0] = 254                       # client 0's white image, 1 level off
  up[1] = x[0, 1]
  up[1, 1, 1, 0] = 2                # its one-pixel image, 2 levels off
  up[2] = 255                       # exact copy: near too
  p = privacy.upload_privacy(up, np.array([0, 0, 0]), x, n)
  assert p["identical_to_raw_count"] == 1
  # RMS over 4 pixels: 1/255 and sqrt(4/4)/255 = 1/255, both <= 2/255.
  assert p["near_copy_count"] == 3 and p["near_copy_fraction"] == 1.0
  far = np.full((1, 2, 2, 1), 3, np.uint8)   # 3 levels from black: RMS 3/255
  p = privacy.upload_privacy(far, np.array([1]), x, n)
  assert p["near_copy_count"] == 0 and p["identical_to_raw_count"] == 0
