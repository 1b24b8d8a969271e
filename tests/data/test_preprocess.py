"""Tests for fedjax_dd.data.preprocess."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.data import preprocess

_DATASETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                         "..", "..", "shared", "datasets")


def _two_channel_images():
  """[2, 1, 2, 2]: channel 0 holds 0, 255, 0, 255; channel 1 is all 51."""
  x = np.zeros((2, 1, 2, 2), np.uint8)
  x[0, 0, 1, 0] = 255
  x[1, 0, 1, 0] = 255
  x[..., 1] = 51
  return x


# ---------------------------------------------------------------- stats


@pytest.mark.parametrize("chunk_size", [1, 3, 1024])
def test_channel_stats_hand_computed(chunk_size):
  mean, std = preprocess.channel_stats(_two_channel_images(),
                                       chunk_size=chunk_size)
  assert mean.dtype == np.float32 and std.dtype == np.float32
  # Channel 0: half 0, half 1 -> mean 0.5, std 0.5. Channel 1: 51/255 = 0.2.
  np.testing.assert_allclose(mean, [0.5, 0.2], atol=1e-7)
  np.testing.assert_allclose(std, [0.5, 0.0], atol=1e-7)


def test_channel_stats_accepts_jax_arrays():
  mean, std = preprocess.channel_stats(jnp.asarray(_two_channel_images()))
  np.testing.assert_allclose(mean, [0.5, 0.2], atol=1e-7)
  np.testing.assert_allclose(std, [0.5, 0.0], atol=1e-7)


def test_channel_stats_rejects_bad_input():
  with pytest.raises(ValueError, match="uint8"):
    preprocess.channel_stats(np.zeros((1, 2, 2, 1), np.float32))
  with pytest.raises(ValueError, match=r"\[N, H, W, C\]"):
    preprocess.channel_stats(np.zeros((2, 2, 1), np.uint8))
  with pytest.raises(ValueError, match="at least one"):
    preprocess.channel_stats(np.zeros((0, 2, 2, 1), np.uint8))


def test_channel_stats_real_mnist():
  path = os.path.join(_DATASETS, "mnist.npz")
  if not os.path.exists(path):
    pytest.skip("../shared/datasets/mnist.npz is absent")
  with np.load(path) as f:
    x = f["x_train"]
  mean, std = preprocess.channel_stats(x)
  # The widely published MNIST statistics.
  np.testing.assert_allclose(mean, [0.1307], atol=1e-4)
  np.testing.assert_allclose(std, [0.3081], atol=1e-4)


# ---------------------------------------------------------------- normalize


def test_normalize_numpy_hand_computed():
  x = np.array([0, 255, 51], np.uint8).reshape(3, 1, 1, 1)
  out = preprocess.normalize(x, np.array([0.2]), np.array([0.5]))
  assert isinstance(out, np.ndarray) and out.dtype == np.float32
  # (0 - .2) / .5, (1 - .2) / .5, (.2 - .2) / .5.
  np.testing.assert_allclose(out.ravel(), [-0.4, 1.6, 0.0], atol=1e-6)


def test_normalize_jit_matches_numpy():
  x = _two_channel_images()
  mean = np.array([0.5, 0.1], np.float32)
  std = np.array([0.5, 0.25], np.float32)
  expected = preprocess.normalize(x, mean, std)
  out = jax.jit(preprocess.normalize)(jnp.asarray(x), mean, std)
  assert isinstance(out, jax.Array) and out.dtype == jnp.float32
  assert out.shape == x.shape
  np.testing.assert_allclose(np.asarray(out), expected, atol=1e-6)
  # Channel 1 is 0.2 everywhere: (0.2 - 0.1) / 0.25 = 0.4.
  np.testing.assert_allclose(np.asarray(out)[..., 1], 0.4, atol=1e-6)


def test_normalize_rejects_bad_input():
  with pytest.raises(ValueError, match="uint8"):
    preprocess.normalize(np.zeros((1, 2, 2, 1), np.float32), 0.5, 0.5)
  with pytest.raises(ValueError, match="channel"):
    preprocess.normalize(np.zeros((1, 2, 2, 3), np.uint8), np.zeros(2),
                         np.ones(2))


# ---------------------------------------------------------------- resize


def test_resize_bilinear_hand_computed():
  # Half-pixel centres: output columns sample input positions -0.25, 0.25,
  # 0.75, 1.25, i.e. 0, 255/4, 3*255/4, 255 -> rounded 0, 64, 191, 255.
  x = np.array([0, 255], np.uint8).reshape(1, 1, 2, 1)
  out = preprocess.resize_images(x, (1, 4, 1), "bilinear")
  assert out.dtype == np.uint8 and isinstance(out, np.ndarray)
  np.testing.assert_array_equal(out.ravel(), [0, 64, 191, 255])


def test_resize_bilinear_same_size_is_identity_and_repeats_gray():
  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, size=(3, 5, 5, 1), dtype=np.uint8)
  out = preprocess.resize_images(x, (5, 5, 3), "bilinear")
  assert out.shape == (3, 5, 5, 3)
  for c in range(3):
    np.testing.assert_array_equal(out[..., c], x[..., 0])


def test_resize_pad_mnist_to_lenet_shape():
  x = np.full((2, 28, 28, 1), 9, np.uint8)
  out = preprocess.resize_images(x, (32, 32, 3), "pad")
  assert out.shape == (2, 32, 32, 3) and out.dtype == np.uint8
  assert np.all(out[:, 2:30, 2:30, :] == 9)
  assert out.sum() == 2 * 28 * 28 * 3 * 9  # Everything else is zero.


def test_resize_pad_odd_surplus_goes_bottom_right():
  x = np.full((1, 2, 2, 1), 7, np.uint8)
  out = preprocess.resize_images(x, (3, 3, 1), "pad")[0, ..., 0]
  np.testing.assert_array_equal(out, [[7, 7, 0], [7, 7, 0], [0, 0, 0]])


def test_resize_numpy_chunks_match_one_shot_and_jax():
  rng = np.random.default_rng(1)
  x = rng.integers(0, 256, size=(5, 6, 6, 1), dtype=np.uint8)
  whole = preprocess.resize_images(x, (9, 9, 3), chunk_size=5)
  chunked = preprocess.resize_images(x, (9, 9, 3), chunk_size=2)
  np.testing.assert_array_equal(whole, chunked)
  jitted = jax.jit(lambda a: preprocess.resize_images(a, (9, 9, 3)))
  on_device = jitted(jnp.asarray(x))
  assert isinstance(on_device, jax.Array) and on_device.dtype == jnp.uint8
  np.testing.assert_array_equal(np.asarray(on_device), whole)


def test_resize_rejects_bad_requests():
  x = np.zeros((1, 4, 4, 3), np.uint8)
  with pytest.raises(ValueError, match="Unknown resize method"):
    preprocess.resize_images(x, (4, 4, 3), "nearest")
  with pytest.raises(ValueError, match="only enlarges"):
    preprocess.resize_images(x, (2, 2, 3), "pad")
  with pytest.raises(ValueError, match="3 channels to 1"):
    preprocess.resize_images(x, (4, 4, 1))
  with pytest.raises(ValueError, match="uint8"):
    preprocess.resize_images(x.astype(np.float32), (4, 4, 3))
  with pytest.raises(ValueError, match="out_shape"):
    preprocess.resize_images(x, (4, 4))
