"""Tests for fedjax_dd.models.layers."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.models import layers


def _tie_free(shape, seed=0):
  # A random permutation has all-distinct entries, so no pooling window ties.
  n = int(np.prod(shape))
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.permutation(n).reshape(shape) / n, jnp.float32)


@pytest.mark.parametrize(
    "shape,window",
    [
        ((2, 4, 4, 3), 2),
        ((2, 7, 9, 3), 2),   # odd sizes: last row/column cropped (VALID)
        ((1, 9, 10, 2), 3),  # 9 -> 3, 10 -> 3 with one column cropped
        ((5, 6, 1), 2),      # unbatched [H, W, Ch]
    ],
)
@pytest.mark.parametrize("ours,theirs", [
    (layers.max_pool, nn.max_pool),
    (layers.avg_pool, nn.avg_pool),
])
def test_pool_matches_flax_values_and_grads(shape, window, ours, theirs):
  x = _tie_free(shape)

  def f_ours(x):
    return ours(x, window, window)

  def f_theirs(x):
    return theirs(x, (window, window), strides=(window, window),
                  padding="VALID")

  out, ref = f_ours(x), f_theirs(x)
  assert out.shape == ref.shape
  np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-7)

  w = _tie_free(ref.shape, seed=1)
  g = jax.grad(lambda x: jnp.sum(f_ours(x) * w))(x)
  g_ref = jax.grad(lambda x: jnp.sum(f_theirs(x) * w))(x)
  np.testing.assert_allclose(g, g_ref, rtol=1e-6, atol=1e-7)


def test_max_pool_hand_example():
  # [1, 3, 5, 1]: the third row and fifth column are cropped.
  x = jnp.array([[1., 5., 2., 0., 9.],
                 [3., 4., 8., 7., 9.],
                 [9., 9., 9., 9., 9.]]).reshape(1, 3, 5, 1)
  np.testing.assert_array_equal(
      layers.max_pool(x)[0, :, :, 0], [[5., 8.]])
  np.testing.assert_allclose(
      layers.avg_pool(x)[0, :, :, 0], [[13. / 4, 17. / 4]])


def test_max_pool_gradient_goes_to_argmax():
  x = jnp.array([[1., 5.], [3., 4.]]).reshape(1, 2, 2, 1)
  g = jax.grad(lambda x: layers.max_pool(x).sum())(x)
  np.testing.assert_array_equal(g[0, :, :, 0], [[0., 1.], [0., 0.]])
  g = jax.grad(lambda x: layers.avg_pool(x).sum())(x)
  np.testing.assert_allclose(g[0, :, :, 0], np.full((2, 2), 0.25))


def test_max_pool_splits_the_gradient_evenly_among_tied_maxima():
  # Three of the window's four entries tie at the maximum: each gets 1/3
  # (reduce-max's gradient), whatever their place in the window.
  x = jnp.array([[2., 2.], [0., 2.]]).reshape(1, 2, 2, 1)
  g = jax.grad(lambda x: layers.max_pool(x).sum())(x)
  np.testing.assert_allclose(g[0, :, :, 0], [[1 / 3, 1 / 3], [0., 1 / 3]],
                             rtol=1e-6)


@pytest.mark.parametrize("ours,theirs", [
    (layers.max_pool, nn.max_pool),
    (layers.avg_pool, nn.avg_pool),
])
def test_overlapping_pool_falls_back_to_flax(ours, theirs):
  x = _tie_free((2, 7, 7, 2))
  np.testing.assert_allclose(
      ours(x, 3, 2), theirs(x, (3, 3), strides=(2, 2), padding="VALID"))
  assert ours(x, 3, 2).shape == (2, 3, 3, 2)


@pytest.mark.parametrize("kwargs", [
    dict(window=0), dict(stride=-1), dict(window=2.0), dict(window=5)])
def test_pool_bad_arguments(kwargs):
  x = jnp.zeros((1, 4, 4, 1))
  for fn in (layers.max_pool, layers.avg_pool):
    with pytest.raises(ValueError):
      fn(x, **kwargs)


def test_pool_rejects_low_rank():
  with pytest.raises(ValueError, match="rank"):
    layers.max_pool(jnp.zeros((4, 4)))


def test_local_response_norm_hand_example():
  # size 2 -> window {c-1, c}; alpha = size makes alpha / size = 1, and
  # beta = k = 1, so out[c] = x[c] / (1 + x[c-1]**2 + x[c]**2).
  x = jnp.array([1., 2., 3.]).reshape(1, 1, 1, 3)
  out = layers.local_response_norm(x, 2, alpha=2.0, beta=1.0, k=1.0)
  np.testing.assert_allclose(out.ravel(), [1 / 2, 2 / 6, 3 / 14], rtol=1e-6)


def test_local_response_norm_size4_window():
  # size 4 -> window {c-2, c-1, c, c+1}; only channel 0 is non-zero, so it
  # affects channels 0, 1 and 2 but not 3 (3 - 2 = 1 > 0).
  x = jnp.array([2., 0., 0., 0.]).reshape(1, 1, 1, 4)
  y = jnp.ones((1, 1, 1, 4)) + x
  out = layers.local_response_norm(y, 4, alpha=4.0, beta=1.0, k=0.0)
  # Sum of squares in each window of y = [3, 1, 1, 1].
  sums = np.array([9 + 1, 9 + 1 + 1, 9 + 1 + 1 + 1, 1 + 1 + 1])
  np.testing.assert_allclose(out.ravel(), np.array([3., 1., 1., 1.]) / sums,
                             rtol=1e-6)


def test_batch_norm_momentum_and_modes():
  x = jnp.arange(8.).reshape(4, 1, 1, 2)  # channel means 3 and 4
  bn = layers.batch_norm(train=True)
  v = bn.init(jax.random.key(0), x)
  _, upd = bn.apply(v, x, mutable=["batch_stats"])
  np.testing.assert_allclose(
      upd["batch_stats"]["mean"], [0.1 * 3., 0.1 * 4.], rtol=1e-6)
  # Eval mode normalises with the running averages: with the initial
  # mean 0 / var 1 it is the identity (scale 1, bias 0) up to epsilon.
  out = layers.batch_norm(train=False).apply(v, x)
  np.testing.assert_allclose(out, x / np.sqrt(1 + layers.BN_EPSILON),
                             rtol=1e-6)


def test_check_images():
  layers.check_images(jnp.zeros((1, 2, 2, 1)), "M")
  with pytest.raises(ValueError, match="M expects"):
    layers.check_images(jnp.zeros((2, 2, 1)), "M")
