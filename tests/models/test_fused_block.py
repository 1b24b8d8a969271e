"""Tests for fedjax_dd.models.fused_block."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd import models
from fedjax_dd.models import fused_block
from fedjax_dd.models import layers
from tests.conftest import x64

fused = fused_block.conv_instance_norm_relu_avg_pool


def _layers(x, kernel, scale, bias, epsilon=1e-5):
  """The four layers the fused block stands for, written with jnp/lax."""
  y = jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME",
                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
  mean = jnp.mean(y, (1, 2), keepdims=True)
  var = jnp.maximum(jnp.mean(jnp.square(y), (1, 2), keepdims=True)
                    - jnp.square(mean), 0.0)
  z = (y - mean) * jax.lax.rsqrt(var + epsilon) * scale + bias
  return layers.avg_pool(nn.relu(z))


def _problem(x_shape, kernel_size, out, dtype, seed=0):
  rng = np.random.default_rng(seed)
  ch = x_shape[-1]
  arrays = (rng.normal(size=x_shape) * 2 + 0.5,
            rng.normal(size=(*kernel_size, ch, out)),
            rng.normal(size=(out,)) + 1, rng.normal(size=(out,)))
  return tuple(jnp.asarray(a, dtype) for a in arrays)


def test_hand_checked_two_by_two_image():
  # One 2x2 image [[0, 2], [4, 6]], a 1x1 kernel: mean 3, variance
  # (9 + 1 + 1 + 9) / 4 = 5, normalised [-3, -1, 1, 3] / sqrt(5).
  x = jnp.asarray([[0.0, 2.0], [4.0, 6.0]]).reshape(1, 2, 2, 1)
  ones = jnp.ones((1,))
  # Bias 0: ReLU keeps 1/sqrt(5) and 3/sqrt(5); their mean over 4 pixels.
  out = fused(x, jnp.ones((1, 1, 1, 1)), ones, 0 * ones, epsilon=0.0)
  assert out.shape == (1, 1, 1, 1)
  np.testing.assert_allclose(out.ravel(), [1 / math.sqrt(5)], rtol=1e-6)
  # Kernel 2 (the norm undoes the scale), bias 0.5: (0.5 - 1/sqrt(5)) +
  # (0.5 + 1/sqrt(5)) + (0.5 + 3/sqrt(5)) over 4 = 0.375 + 0.75/sqrt(5).
  out = fused(x, 2 * jnp.ones((1, 1, 1, 1)), ones, 0.5 * ones, epsilon=0.0)
  np.testing.assert_allclose(out.ravel(), [0.375 + 0.75 / math.sqrt(5)],
                             rtol=1e-6)


_CASES = [
    ((2, 8, 8, 3), (3, 3), 4),
    ((3, 7, 9, 1), (3, 3), 2),   # odd sizes: a row and a column dropped
    ((2, 6, 6, 2), (5, 5), 3),
    ((1, 4, 4, 3), (1, 1), 5),
]


@pytest.mark.slow
@pytest.mark.parametrize("x_shape, kernel_size, out", _CASES)
def test_values_and_gradients_equal_the_layers_in_float64(x_shape,
                                                          kernel_size, out):
  with x64():
    args = _problem(x_shape, kernel_size, out, jnp.float64)
    ct = jnp.asarray(np.random.default_rng(9).normal(
        size=_layers(*args).shape))
    loss = lambda f: lambda *a: jnp.vdot(f(*a), ct)
    np.testing.assert_allclose(fused(*args), _layers(*args), rtol=1e-12,
                               atol=1e-12)
    grads = [jax.grad(loss(f), (0, 1, 2, 3))(*args) for f in (fused, _layers)]
    for a, b, arg in zip(*grads, args):
      assert a.shape == arg.shape and a.dtype == jnp.float64
      np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11)


def test_float32_and_under_vmap():
  # Two clients with their own images and variables, as the engine maps
  # them; float32 within 1e-5 of the largest entry.
  per_client = [_problem((4, 8, 8, 3), (3, 3), 6, jnp.float32, seed=s)
                for s in (0, 1)]
  args = tuple(jnp.stack(a) for a in zip(*per_client))
  ct = jax.random.normal(jax.random.PRNGKey(0), (2, 4, 4, 4, 6))
  loss = lambda f: lambda x, k, s, b, c: jnp.vdot(f(x, k, s, b), c)
  for f_out, ref_out in zip(
      jax.vmap(jax.value_and_grad(loss(fused), (0, 1, 2, 3)))(*args, ct),
      jax.vmap(jax.value_and_grad(loss(_layers), (0, 1, 2, 3)))(*args, ct)):
    for a, b in zip(jax.tree.leaves(f_out), jax.tree.leaves(ref_out)):
      assert a.shape == b.shape and bool(jnp.isfinite(a).all())
      scale = float(jnp.max(jnp.abs(b)))
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * scale)


def test_constant_images_give_the_bias_and_finite_gradients():
  # A 1x1 kernel on constant images: zero variance in every channel, so the
  # normalised map is 0 and the output is relu(bias); the variance path of
  # the gradient carries nothing (y equals its mean).
  with x64():
    x = jnp.full((2, 4, 4, 2), 3.0, jnp.float64)
    kernel = jnp.asarray(np.random.default_rng(0).normal(size=(1, 1, 2, 3)))
    scale = jnp.ones((3,), jnp.float64)
    bias = jnp.asarray([-0.5, 0.0, 0.7])
    out = fused(x, kernel, scale, bias)
    np.testing.assert_allclose(out, jnp.broadcast_to(
        jnp.maximum(bias, 0.0), out.shape), atol=1e-6)
    grads = [jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a))), (0, 1, 2, 3))(
        x, kernel, scale, bias) for f in (fused, _layers)]
    for a, b in zip(*grads):
      assert bool(jnp.isfinite(a).all())
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_bad_shapes_are_refused_before_compute():
  x, kernel, scale, bias = _problem((1, 4, 4, 3), (3, 3), 2, jnp.float32)
  with pytest.raises(ValueError, match="kernel"):
    fused(x, kernel[:, :, :2], scale, bias)
  with pytest.raises(ValueError, match="scale and bias"):
    fused(x, kernel, scale[:1], bias)
  with pytest.raises(ValueError, match="H, W >= 2"):
    fused(x[:, :1], kernel, scale, bias)


def test_jitted_gradient_compiles_once():
  step = jax.jit(jax.grad(lambda *a: jnp.sum(fused(*a)), (1, 2, 3)))
  for seed in range(3):
    jax.block_until_ready(step(*_problem((2, 8, 8, 3), (3, 3), 4,
                                         jnp.float32, seed=seed)))
  assert step._cache_size() == 1


def test_fuses_first_block_on_cpu_only():
  assert fused_block.fuses_first_block("cpu")
  assert not fused_block.fuses_first_block("gpu")
  assert not fused_block.fuses_first_block("tpu")


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(3, 16, 16, 3), (2, 14, 14, 1)])
def test_convnet_fused_and_unfused_are_the_same_model(shape):
  # Same variables (names, shapes, initial values); the same outputs and
  # gradients, the input's included, in float64.
  with x64():
    x = jnp.asarray(np.random.default_rng(0).normal(size=shape))
    ours, ref = (models.ConvNet(
        5, width=8, layers=layers.LayerSet(fuse_first_block=f))
                 for f in (True, False))
    v = ours.init(jax.random.PRNGKey(1), x, train=False)
    v_ref = ref.init(jax.random.PRNGKey(1), x, train=False)
    jax.tree.map(np.testing.assert_array_equal, v, v_ref)
    v = jax.tree.map(lambda a: a.astype(jnp.float64) + 0.1, v)
    loss = lambda m: lambda v, x: jnp.sum(jnp.sin(m.apply(v, x, train=True)))
    np.testing.assert_allclose(loss(ours)(v, x), loss(ref)(v, x), rtol=1e-12)
    g, g_ref = (jax.grad(loss(m), (0, 1))(v, x) for m in (ours, ref))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(
        a, b, rtol=1e-10, atol=1e-12), g, g_ref)
