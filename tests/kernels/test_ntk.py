"""Tests for fedjax_dd.kernels.ntk."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# neural-tangents is the optional `nt` extra (jax < 0.6 only).
pytest.importorskip("neural_tangents")
from neural_tangents import stax  # pylint: disable=g-import-not-at-top,wrong-import-position

from fedjax_dd.kernels import ntk  # pylint: disable=g-import-not-at-top,wrong-import-position


def _images(n, h=8, w=8, ch=1, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.normal(size=(n, h, w, ch)).astype(np.float32))


def _direct_fc(depth, W_std, b_std):
  layers = [stax.Flatten()]
  for _ in range(depth):
    layers += [stax.Dense(512, W_std=W_std, b_std=b_std), stax.Relu()]
  layers += [stax.Dense(10, W_std=W_std, b_std=b_std)]
  return stax.serial(*layers)[2]


def _direct_conv(depth, W_std, b_std):
  layers = []
  for _ in range(depth):
    layers += [stax.Conv(64, (3, 3), padding="SAME", W_std=W_std,
                         b_std=b_std),
               stax.Relu(),
               stax.AvgPool((2, 2), strides=(2, 2))]
  layers += [stax.Flatten(), stax.Dense(10, W_std=W_std, b_std=b_std)]
  return stax.serial(*layers)[2]


def test_fc_nngp_one_hidden_layer_matches_arccos_formula():
  # depth=1, W_std^2=2, b_std=0, inputs of dimension d=4:
  #   q = 2 * x.x' / d; ReLU arc-cosine: same x -> q/2, orthogonal equal-norm
  #   x, x' -> q/(2 pi) (for theta = pi/2); readout multiplies by W_std^2 = 2.
  x = jnp.array([[1.0, 1.0, 1.0, 1.0], [1.0, -1.0, 1.0, -1.0]])
  k = ntk.fc_kernel(depth=1, W_std=math.sqrt(2.0), b_std=0.0, kind="nngp")(x)
  # q(x, x) = 2 * 4 / 4 = 2: diagonal 2 * 2 / 2 = 2; off-diagonal
  # 2 * 2 / (2 pi) = 2 / pi.
  np.testing.assert_allclose(k, [[2.0, 2 / np.pi], [2 / np.pi, 2.0]],
                             rtol=1e-5)


def test_fc_nngp_bias_on_diagonal():
  # With b_std=0.1: diagonal = 2 * (2|x|^2/d + 0.01) / 2 + 0.01 = 2.02 for
  # the all-ones input of d=4.
  x = jnp.ones((1, 4))
  k = ntk.fc_kernel(depth=1, kind="nngp")(x, x)
  np.testing.assert_allclose(k, [[2.02]], rtol=1e-5)


@pytest.mark.parametrize("kind", ["ntk", "nngp"])
@pytest.mark.parametrize("ours, direct, depth, n1, n2", [
    (ntk.fc_kernel, _direct_fc, 3, 5, 3),
    (ntk.conv_kernel, _direct_conv, 2, 3, 2)])
def test_kernel_matches_direct_stax(kind, ours, direct, depth, n1, n2):
  x1, x2 = _images(n1), _images(n2, seed=1)
  k = ours(depth=depth, kind=kind)(x1, x2)
  want = jax.jit(direct(depth, math.sqrt(2.0), 0.1),
                 static_argnums=2)(x1, x2, kind)
  assert k.shape == (n1, n2)
  np.testing.assert_allclose(k, want, rtol=1e-5, atol=1e-6)


def test_fc_kernel_flat_and_nhwc_inputs_agree_and_default_x2():
  x = _images(4)
  k = ntk.fc_kernel(depth=2)
  np.testing.assert_allclose(k(x), k(x.reshape(4, -1), x.reshape(4, -1)),
                             rtol=1e-6)
  np.testing.assert_allclose(k(x), k(x).T, rtol=1e-6)



def test_uint8_inputs_are_cast_to_float():
  x = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4, 1)
  k = ntk.fc_kernel(depth=1)
  np.testing.assert_allclose(k(x), k(x.astype(np.float32)), rtol=1e-6)


def test_conv_kernel_chunked_equals_unchunked_including_padding():
  # 5 rows and 3 columns with blocks of 2: both axes need a padded block.
  x1, x2 = _images(5), _images(3, seed=1)
  full = ntk.conv_kernel(depth=2)(x1, x2)
  chunked = ntk.conv_kernel(depth=2, batch_size=2)(x1, x2)
  assert chunked.shape == (5, 3)
  np.testing.assert_allclose(chunked, full, rtol=1e-5, atol=1e-6)


def test_fc_kernel_chunked_equals_unchunked():
  x1, x2 = _images(7), _images(4, seed=1)
  full = ntk.fc_kernel(depth=2)(x1, x2)
  chunked = ntk.fc_kernel(depth=2, batch_size=3)(x1, x2)
  np.testing.assert_allclose(chunked, full, rtol=1e-5, atol=1e-6)


def test_gradient_wrt_inputs_is_finite_and_chunking_preserves_it():
  # KIP differentiates k(x_s, x_s) (which has cosine exactly 1 on the
  # diagonal) and k(x_t, x_s) with respect to x_s.
  xs, xt = _images(3), _images(4, seed=1)

  def grad_fn(kernel):
    return jax.jit(jax.grad(
        lambda x: jnp.sum(kernel(x, x) ** 2) + jnp.sum(kernel(xt, x))))

  full = grad_fn(ntk.conv_kernel(depth=1))(xs)
  chunked = grad_fn(ntk.conv_kernel(depth=1, batch_size=2))(xs)
  assert bool(jnp.all(jnp.isfinite(full)))
  assert float(jnp.max(jnp.abs(full))) > 0
  np.testing.assert_allclose(chunked, full, rtol=1e-4, atol=1e-5)

  g_fc = grad_fn(ntk.fc_kernel(depth=2))(xs)
  assert bool(jnp.all(jnp.isfinite(g_fc)))
  assert float(jnp.max(jnp.abs(g_fc))) > 0


@pytest.mark.parametrize("batch_size", [None, 2])
def test_vmap_over_clients_equals_per_client(batch_size):
  xs = _images(3 * 3).reshape(3, 3, 8, 8, 1)
  xt = _images(3 * 4, seed=1).reshape(3, 4, 8, 8, 1)
  k = ntk.conv_kernel(depth=2, batch_size=batch_size)
  batched = jax.jit(jax.vmap(k))(xt, xs)
  assert batched.shape == (3, 4, 3)
  for c in range(3):
    np.testing.assert_allclose(batched[c], k(xt[c], xs[c]), rtol=1e-5,
                               atol=1e-6)


def test_estimate_kernel_bytes_formula():
  # 4 bytes * (8*8)^2 * (8.2 * 1 * 1 + 1.7 * 2) = 16384 * 11.6 = 190054.4.
  assert ntk.estimate_kernel_bytes(1, 1, (8, 8), 2) == 190055
  # Forward: 16384 * (3.1 * 2 * 3 + 1.5 * 5) = 16384 * 26.1 = 427622.4.
  assert ntk.estimate_kernel_bytes(2, 3, (8, 8, 3), 3,
                                   with_grad=False) == 427623
  assert ntk.estimate_kernel_bytes(1, 1, (8, 8), 2, itemsize=8) == 380109


@pytest.mark.parametrize("with_grad", [False, True])
def test_estimate_bounds_compiled_memory(with_grad):
  n1, n2, shape, depth = 4, 3, (12, 12, 1), 2
  k = ntk.conv_kernel(depth=depth, memory_budget_bytes=None)
  fn = (jax.grad(lambda a, b: jnp.sum(k(a, b))) if with_grad else k)
  args = (jax.ShapeDtypeStruct((n1,) + shape, jnp.float32),
          jax.ShapeDtypeStruct((n2,) + shape, jnp.float32))
  analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
  if analysis is None:
    pytest.skip("backend gives no memory analysis")
  measured = analysis.temp_size_in_bytes
  est = ntk.estimate_kernel_bytes(n1, n2, shape, depth, with_grad=with_grad)
  assert measured <= est <= 2 * measured


def test_memory_budget_refuses_large_block_and_chunking_fixes_it():
  x = jnp.zeros((20, 28, 28, 1))
  budget = ntk.estimate_kernel_bytes(4, 4, (28, 28), 3)
  with pytest.raises(ValueError, match="memory_budget_bytes"):
    jax.eval_shape(ntk.conv_kernel(memory_budget_bytes=budget), x, x)
  out = jax.eval_shape(
      ntk.conv_kernel(memory_budget_bytes=budget, batch_size=4), x, x)
  assert out.shape == (20, 20)


def test_invalid_arguments():
  with pytest.raises(ValueError, match="kind"):
    ntk.fc_kernel(kind="gp")
  with pytest.raises(ValueError, match="depth"):
    ntk.conv_kernel(depth=0)
  with pytest.raises(ValueError, match="batch_size"):
    ntk.fc_kernel(batch_size=0)
  with pytest.raises(ValueError, match="too small"):
    ntk.conv_kernel(depth=4)(_images(1), _images(1))
  with pytest.raises(ValueError, match="NHWC"):
    ntk.conv_kernel(depth=1)(jnp.zeros((2, 64)), jnp.zeros((2, 64)))
  with pytest.raises(ValueError, match="same per-example shape"):
    ntk.fc_kernel()(jnp.zeros((2, 64)), jnp.zeros((2, 63)))
