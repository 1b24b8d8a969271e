"""PSNR, SSIM, the reconstructed fraction and label leakage."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.audit import reconstruction as rc
from fedjax_dd.core.checks import SettingError
from fedjax_dd.core.task import Classifier
from tests.audit import _data


def test_identical_images_give_inf_and_one():
  a = np.random.default_rng(0).uniform(size=(16, 16, 3)).astype(np.float32)
  assert float(rc.psnr(a, a)) == np.inf
  assert float(rc.ssim(a, a)) == pytest.approx(1.0, abs=1e-6)


def test_known_noise_matches_the_closed_form():
  rng = np.random.default_rng(0)
  sigma = 0.05
  a = np.full((4, 64, 64, 1), 0.5, np.float32)
  b = a + rng.normal(0, sigma, a.shape).astype(np.float32)  # never clips
  r = rc.reconstruction_audit(a, b[::-1])
  # Each image's best match is its own noisy copy: MSE ~ sigma^2.
  np.testing.assert_allclose(r.best_psnr, 20 * np.log10(1 / sigma), atol=0.2)


def test_ssim_of_two_constant_images_by_hand():
  # No variance: SSIM is the luminance term (2 mu_a mu_b + C1) /
  # (mu_a^2 + mu_b^2 + C1) = (0.24 + 1e-4) / (0.40 + 1e-4).
  a, b = np.full((11, 11, 1), 0.2), np.full((11, 11, 1), 0.6)
  assert float(rc.ssim(a, b)) == pytest.approx(0.2401 / 0.4001, rel=1e-4)


def test_fraction_reconstructed_above_the_threshold():
  rng = np.random.default_rng(1)
  x, _ = _data.draw(rng, 1, _data.templates())  # 10 images of 8x8
  up = np.concatenate([x[:3], _data.near_copy(rng, x[3:4]),
                       np.zeros((2, *_data.SHAPE), np.uint8)])
  r = rc.reconstruction_audit(x, up, 10, 4, window=7)
  assert np.all(np.isinf(r.best_psnr[:3]))
  # A move of 2 grey levels in every pixel: 20 log10(255 / 2).
  assert float(r.best_psnr[3]) == pytest.approx(20 * np.log10(255 / 2),
                                                rel=1e-5)
  assert np.all(r.best_psnr[4:] < 30.0)
  assert float(r.fraction_above) == pytest.approx(0.4)
  np.testing.assert_allclose(r.best_ssim[:3], 1.0, atol=1e-6)


def test_batched_equals_each_client():
  rng = np.random.default_rng(2)
  x, _ = _data.draw(rng, 1, _data.templates())
  cx = np.stack([x, x[::-1], np.roll(x, 3, 0)])
  ux = np.stack([x[:4], _data.near_copy(rng, x[:4]), x[5:9]])
  n, m = np.array([10, 6, 3]), np.array([4, 2, 1])
  b = rc.reconstruction_batched(cx, n, ux, m, window=5, psnr_threshold=40.0)
  assert b.best_psnr.shape == b.best_ssim.shape == (3, 10)
  for i in range(3):
    one = rc.reconstruction_audit(cx[i], ux[i], n[i], m[i], window=5,
                                  psnr_threshold=40.0)
    np.testing.assert_allclose(b.best_psnr[i], one.best_psnr, rtol=1e-6)
    np.testing.assert_allclose(b.best_ssim[i], one.best_ssim, atol=1e-6)
    assert float(b.fraction_above[i]) == pytest.approx(
        float(one.fraction_above))


def test_reconstruction_refusals():
  x = np.zeros((2, 8, 8, 1), np.uint8)
  with pytest.raises(SettingError, match=r"^window must be an int >= 1 and "
                     r"<= 8, got 11; SSIM's window must fit in the image\.$"):
    rc.reconstruction_audit(x, x)
  with pytest.raises(SettingError, match=r"num_examples must be in \[1, 2\]"):
    rc.reconstruction_audit(x, x, 0, window=3)
  with pytest.raises(SettingError, match="upload_x must be images of"):
    rc.reconstruction_audit(x, x[:, :4], window=3)


def test_tv_distance_by_hand():
  assert float(rc.tv_distance(jnp.array([1.0, 0]), jnp.array([0, 1.0]))) == 1
  assert float(rc.tv_distance(jnp.array([0.5, 0.5]),
                              jnp.array([1.0, 0]))) == 0.5
  # Counts are scaled first: [1/2, 1/2] against [3/4, 1/4].
  assert float(rc.tv_distance(jnp.array([2.0, 2.0]),
                              jnp.array([3.0, 1.0]))) == 0.25


def test_histograms_from_labels_and_label_rows():
  # The 4th row is padding.
  h = rc.label_histogram(jnp.array([0, 0, 1, 2]), 3, 3)
  np.testing.assert_allclose(h, [2 / 3, 1 / 3, 0])
  # KIP's mean-centred rows read as their positive part; the zero row and
  # the padding row count for nothing.
  rows = jnp.array([[0.9, -0.1, -0.1], [0.2, 0.2, 0.6], [0.0, 0.0, 0.0],
                    [0.0, 0.0, 9.0]])
  np.testing.assert_allclose(rc.upload_label_histogram(rows, 3, 3),
                             [0.6, 0.1, 0.3], rtol=1e-6)
  # Upload [0, 1] against the truth [0, 0, 1]: TV = |1/2 - 2/3| = 1/6.
  tv = rc.label_leakage(jnp.array([0, 1]), 2, jnp.array([0, 0, 1]), 3, 3)
  assert float(tv) == pytest.approx(1 / 6)


class _Linear(nn.Module):

  @nn.compact
  def __call__(self, x, *, train):
    del train
    return nn.Dense(_data.CLASSES)(x.reshape(x.shape[0], -1))


def _task():
  return Classifier(_Linear(), _data.SHAPE,
                    lambda x: x.astype(jnp.float32) / 255.0, _data.CLASSES)


def test_model_histogram_and_batched_leakage():
  task = _task()
  params, stats = task.init(jax.random.key(0))
  zero = jax.tree_util.tree_map(jnp.zeros_like, params)
  probe = np.zeros((5, *_data.SHAPE), np.uint8)
  # A zero model's softmax is uniform; the truth all class 0: TV 0.9.
  y = np.zeros((2, 4), np.int32)
  y[1, :2] = [3, 4]
  n = np.array([4, 2])
  assert float(rc.model_label_leakage(task, zero, stats, probe, y[0], 4)) == (
      pytest.approx(0.9))
  models = jax.tree_util.tree_map(lambda p: jnp.stack([p, p * 0]), params)
  b = rc.model_label_leakage_batched(task, models, {}, probe, y, n)
  for i in range(2):
    one = rc.model_label_leakage(
        task, jax.tree_util.tree_map(lambda p, i=i: p[i], models), {}, probe,
        y[i], n[i])
    assert float(b[i]) == pytest.approx(float(one), rel=1e-6)
  up = np.array([[1, 1, 0], [3, 4, 4]], np.int32)
  leak = rc.label_leakage_batched(up, [2, 3], y, n, _data.CLASSES)
  np.testing.assert_allclose(leak, [1.0, 1 / 6], rtol=1e-6)
  with pytest.raises(SettingError, match=r"y must be class indices in "
                     r"\[0, 10\)"):
    rc.label_leakage_batched(up, [2, 3], y + 10, n, _data.CLASSES)
  with pytest.raises(SettingError, match="probe_x must be images of the "
                     "task's input shape"):
    rc.model_label_leakage_batched(task, models, {}, probe[:, :4], y, n)
