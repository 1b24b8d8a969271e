"""Tests for fedjax_dd.kernels.kip_loss."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.kernels import kip_loss as kip
from fedjax_dd.kernels import native as ntk


def linear_kernel(x1, x2):
  return x1.reshape(x1.shape[0], -1) @ x2.reshape(x2.shape[0], -1).T


def _toy(n, seed):
  """2 classes of 8x8x1 images: bright top half (0) or bottom half (1)."""
  rng = np.random.default_rng(seed)
  labels = np.arange(n) % 2
  x = rng.normal(scale=0.3, size=(n, 8, 8, 1))
  x[labels == 0, :4] += 1.0
  x[labels == 1, 4:] += 1.0
  return jnp.asarray(x, jnp.float32), jnp.asarray(labels, jnp.int32)


def test_one_hot_labels_plain_and_centered():
  y = jnp.array([1, 0, 3])
  np.testing.assert_array_equal(
      kip.one_hot_labels(y, 4),
      [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1]])
  centred = kip.one_hot_labels(y, 4, centered=True)
  np.testing.assert_allclose(centred[0], [-0.25, 0.75, -0.25, -0.25])
  np.testing.assert_allclose(jnp.sum(centred, axis=1), 0.0, atol=1e-7)
  assert centred.dtype == jnp.float32
  with pytest.raises(ValueError, match="num_classes"):
    kip.one_hot_labels(y, 0)
  with pytest.raises(ValueError, match="integer"):
    kip.one_hot_labels(jnp.array([0.0, 1.0]), 2)


def test_hand_checked_linear_kernel():
  # K_ss = I, reg = 0 -> pred = K_ts y_s = x_t @ y_s = [[2, 0], [0, 3]].
  # Errors (-1, 0) and (0, -2): loss = 0.5 * mean(1, 4) = 1.25; both argmax
  # agree, so accuracy 1.
  x_s = jnp.eye(2)
  y_s = jnp.eye(2)
  x_t = jnp.array([[2.0, 0.0], [0.0, 3.0]])
  y_t = jnp.eye(2)
  loss, aux = kip.kip_loss(linear_kernel, x_s, y_s, x_t, y_t, reg=0.0)
  np.testing.assert_allclose(loss, 1.25, rtol=1e-6)
  np.testing.assert_allclose(aux.pred, [[2, 0], [0, 3]], rtol=1e-6)
  assert float(aux.accuracy) == 1.0
  assert bool(aux.krr.finite)
  # Swapping the target labels makes both predictions wrong.
  _, aux = kip.kip_loss(linear_kernel, x_s, y_s, x_t, y_t[::-1], reg=0.0)
  assert float(aux.accuracy) == 0.0


def test_kip_steps_reduce_loss_on_toy_problem():
  x_t, labels_t = _toy(40, seed=0)
  y_t = kip.one_hot_labels(labels_t, 2, centered=True)
  # Support: 4 pure-noise images, 2 per class.
  x_s = jax.random.normal(jax.random.key(0), (4, 8, 8, 1)) * 0.3
  y_s = kip.one_hot_labels(jnp.array([0, 1, 0, 1]), 2, centered=True)
  kernel = ntk.fc_kernel(depth=2)
  opt = optax.adam(0.05)

  @jax.jit
  def step(x, opt_state):
    (loss, aux), g = jax.value_and_grad(
        lambda x: kip.kip_loss(kernel, x, y_s, x_t, y_t), has_aux=True)(x)
    updates, opt_state = opt.update(g, opt_state)
    return optax.apply_updates(x, updates), opt_state, loss, aux

  opt_state = opt.init(x_s)
  losses, accuracies = [], []
  for _ in range(10):
    x_s, opt_state, loss, aux = step(x_s, opt_state)
    losses.append(float(loss))
    accuracies.append(float(aux.accuracy))
  assert all(np.isfinite(losses))
  assert losses[-1] < 0.5 * losses[0]
  assert accuracies[-1] == 1.0
  assert step._cache_size() == 1


def test_gradient_wrt_learned_labels():
  x_t, labels_t = _toy(10, seed=1)
  y_t = kip.one_hot_labels(labels_t, 2)
  x_s, labels_s = _toy(4, seed=2)
  y_s = kip.one_hot_labels(labels_s, 2)
  kernel = ntk.fc_kernel(depth=1)
  g_x, g_y = jax.jit(jax.grad(
      lambda x, y: kip.kip_loss(kernel, x, y, x_t, y_t)[0],
      argnums=(0, 1)))(x_s, y_s)
  assert g_x.shape == x_s.shape and g_y.shape == y_s.shape
  for g in (g_x, g_y):
    assert bool(jnp.all(jnp.isfinite(g)))
    assert float(jnp.max(jnp.abs(g))) > 0


def test_masks_equal_unpadded_and_block_padded_gradients():
  x_t, labels_t = _toy(6, seed=3)
  y_t = kip.one_hot_labels(labels_t, 2)
  x_s, labels_s = _toy(4, seed=4)
  y_s = kip.one_hot_labels(labels_s, 2)
  # Padding: 2 garbage support points and 3 garbage targets at the end.
  x_s_pad = jnp.concatenate([x_s, 5 + jnp.ones((2, 8, 8, 1))])
  y_s_pad = jnp.concatenate([y_s, jnp.full((2, 2), 7.0)])
  x_t_pad = jnp.concatenate([x_t, jnp.zeros((3, 8, 8, 1))])
  y_t_pad = jnp.concatenate([y_t, jnp.full((3, 2), -9.0)])
  s_mask = jnp.arange(6) < 4
  t_mask = jnp.arange(9) < 6

  loss, aux = jax.jit(lambda x: kip.kip_loss(
      linear_kernel, x, y_s, x_t, y_t, reg=1e-2))(x_s)

  @jax.jit
  def padded(x):
    return kip.kip_loss(linear_kernel, x, y_s_pad, x_t_pad, y_t_pad,
                        reg=1e-2, support_mask=s_mask, target_mask=t_mask)

  loss_p, aux_p = padded(x_s_pad)
  np.testing.assert_allclose(loss_p, loss, rtol=1e-5)
  np.testing.assert_allclose(aux_p.pred[:6], aux.pred, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(aux_p.accuracy, aux.accuracy)
  np.testing.assert_allclose(aux_p.krr.ridge, aux.krr.ridge, rtol=1e-5)

  g = jax.jit(jax.grad(lambda x: padded(x)[0]))(x_s_pad)
  g_ref = jax.jit(jax.grad(lambda x: kip.kip_loss(
      linear_kernel, x, y_s, x_t, y_t, reg=1e-2)[0]))(x_s)
  np.testing.assert_allclose(g[:4], g_ref, rtol=1e-3, atol=1e-5)
  np.testing.assert_array_equal(g[4:], 0.0)


def test_all_targets_masked_gives_zero():
  x = jnp.eye(2)
  loss, aux = kip.kip_loss(linear_kernel, x, x, x, x,
                           target_mask=jnp.zeros(2, bool))
  assert float(loss) == 0.0 and float(aux.accuracy) == 0.0


def test_vmap_over_clients_equals_per_client():
  xs, ys, xt, yt = [], [], [], []
  for c in range(3):
    x, l = _toy(4, seed=10 + c)
    xs.append(x)
    ys.append(kip.one_hot_labels(l, 2, centered=True))
    x, l = _toy(6, seed=20 + c)
    xt.append(x)
    yt.append(kip.one_hot_labels(l, 2, centered=True))
  xs, ys, xt, yt = map(jnp.stack, (xs, ys, xt, yt))
  kernel = ntk.fc_kernel(depth=1)
  batched = jax.jit(jax.vmap(
      lambda a, b, c, d: kip.kip_loss(kernel, a, b, c, d)))
  loss, aux = batched(xs, ys, xt, yt)
  assert loss.shape == (3,) and aux.pred.shape == (3, 6, 2)
  assert aux.accuracy.shape == (3,) and aux.krr.finite.shape == (3,)
  for c in range(3):
    loss_c, aux_c = kip.kip_loss(kernel, xs[c], ys[c], xt[c], yt[c])
    np.testing.assert_allclose(loss[c], loss_c, rtol=1e-5)
    np.testing.assert_allclose(aux.pred[c], aux_c.pred, rtol=1e-4,
                               atol=1e-6)
  batched(xs + 0.1, ys, xt, yt)
  assert batched._cache_size() == 1


def test_shape_errors():
  x = jnp.eye(2)
  with pytest.raises(ValueError, match=r"\[n, K\]"):
    kip.kip_loss(linear_kernel, x, jnp.array([0, 1]), x, x)
  with pytest.raises(ValueError, match="label dims"):
    kip.kip_loss(linear_kernel, x, x, x, jnp.ones((2, 3)))
  with pytest.raises(ValueError, match="disagree"):
    kip.kip_loss(linear_kernel, x, jnp.ones((3, 2)), x, x)
  with pytest.raises(ValueError, match="per-example"):
    kip.kip_loss(linear_kernel, x, x, jnp.ones((2, 3)), x)
  with pytest.raises(ValueError, match="support_mask"):
    kip.kip_loss(linear_kernel, x, x, x, x, support_mask=jnp.ones(3, bool))
