"""Tests for fedjax_dd.kernels.native (pure-JAX NTK/NNGP kernels).

The golden values (``golden_ntk.npz``, written by ``make_golden.py`` with
neural-tangents 0.6.5 in float64) need no neural-tangents here; only
:func:`test_matches_neural_tangents_float32` imports it, and skips without it.
"""

import math
import os

import jax
from tests.conftest import x64 as enable_x64
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.kernels import blocking
from fedjax_dd.kernels import kip_loss as kip_loss_lib
from fedjax_dd.kernels import native

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "golden_ntk.npz")

# (arch, image shape, depth, kind, parameterization), as make_golden.py.
_GOLDEN_SHAPES = (("fc", (6, 6, 1), (1, 2, 3)), ("fc", (4, 4, 3), (1, 2, 3)),
                  ("conv", (8, 8, 1), (1, 2, 3)), ("conv", (4, 4, 3), (1, 2)))
GOLDEN_CASES = [(arch, shape, depth, kind, par)
                for arch, shape, depths in _GOLDEN_SHAPES
                for depth in depths
                for kind in ("ntk", "nngp")
                for par in (("ntk", "standard") if depth == 2 else ("ntk",))]


def _images(n, h=8, w=8, ch=1, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.normal(size=(n, h, w, ch)).astype(np.float32))


def _close(actual, desired, rtol=1e-5):
  # Relative to each entry, with an absolute floor of rtol * 1e-2 * the
  # largest entry for entries that are (nearly) zero.
  desired = np.asarray(desired)
  np.testing.assert_allclose(np.asarray(actual), desired, rtol=rtol,
                             atol=rtol * 1e-2 * np.max(np.abs(desired)))


@pytest.fixture(scope="module")
def golden():
  with np.load(GOLDEN) as f:
    return dict(f)


@pytest.mark.parametrize("arch,shape,depth,kind,par", GOLDEN_CASES)
def test_matches_golden_float64(golden, arch, shape, depth, kind, par):
  tag = "x".join(map(str, shape))
  key = f"{arch}_{tag}_d{depth}_{kind}_{par}"
  with enable_x64():
    x1, x2, xs = (jnp.asarray(golden[f"{tag}_{n}"], jnp.float64)
                  for n in ("x1", "x2", "xs"))
    w12, wss = jnp.asarray(golden["w12"]), jnp.asarray(golden["wss"])
    k = getattr(native, f"{arch}_kernel")(depth=depth, kind=kind,
                                          parameterization=par)

    @jax.jit
    def everything(x1, x2, xs):
      # Gradients of sum(k * w) are the VJPs with cotangent w.
      k12, vjp12 = jax.vjp(k, x1, x2)
      ks, vjps = jax.vjp(lambda a: k(a, a), xs)
      return (k12, *vjp12(w12), ks, *vjps(wss))

    k12, g1, g2, ks, gs = everything(x1, x2, xs)
    assert k12.dtype == jnp.float64
  _close(k12, golden[f"{key}_k"])
  _close(g1, golden[f"{key}_g1"])
  _close(g2, golden[f"{key}_g2"])
  _close(ks, golden[f"{key}_ks"])
  # The support holds a duplicate (cos = 1 off the diagonal).
  _close(gs, golden[f"{key}_gs"])


def _arccos_nngp_ntk(x, y, W_std, b_std):
  """One hidden ReLU layer, by hand (Cho & Saul 2009), NTK parameterisation."""
  d = x.size
  q11 = W_std**2 * x @ x / d + b_std**2
  q22 = W_std**2 * y @ y / d + b_std**2
  q12 = W_std**2 * x @ y / d + b_std**2
  cos = np.clip(q12 / math.sqrt(q11 * q22), -1.0, 1.0)
  theta = math.acos(cos)
  relu = (math.sqrt(q11 * q22) / (2 * math.pi) *
          (math.sin(theta) + (math.pi - theta) * cos))
  nngp = W_std**2 * relu + b_std**2
  # Theta_1 = q12; the ReLU multiplies it by (pi - theta) / (2 pi).
  ntk = nngp + W_std**2 * q12 * (math.pi - theta) / (2 * math.pi)
  return nngp, ntk


@pytest.mark.parametrize("W_std,b_std", [(math.sqrt(2.0), 0.0), (1.3, 0.2)])
def test_fc_one_layer_matches_arccos_closed_form(W_std, b_std):
  rng = np.random.default_rng(3)
  x = rng.normal(size=(3, 5))
  x[2] = -0.5 * x[0]           # cos = -1 before the bias
  with enable_x64():
    k_nngp = native.fc_kernel(1, W_std, b_std, "nngp")(jnp.asarray(x))
    k_ntk = native.fc_kernel(1, W_std, b_std, "ntk")(jnp.asarray(x))
  # At cos = +-1 (the diagonal, x[2] vs x[0] without bias) the kernels take
  # the angle from sqrt(prod - c**2), which rounding leaves at ~1e-8 (as in
  # neural-tangents; 1.5e-8 on jax 0.12): hence 1e-7 / 5e-8 absolute on O(1)
  # entries, not float64 precision.
  for i in range(3):
    for j in range(3):
      nngp, ntk = _arccos_nngp_ntk(x[i], x[j], W_std, b_std)
      np.testing.assert_allclose(k_nngp[i, j], nngp, rtol=1e-7, atol=5e-8)
      np.testing.assert_allclose(k_ntk[i, j], ntk, rtol=1e-7, atol=5e-8)


def test_fc_nngp_matches_wide_random_networks():
  # 200 random 1-hidden-layer ReLU networks of width 2048 in the standard
  # parameterisation, 16 outputs each: E[f(x) f(y)] is the NNGP.
  W_std, b_std, d, width, nets, outs = math.sqrt(2.0), 0.3, 16, 2048, 200, 16
  x = _images(4, 4, 4, 1, seed=5).reshape(4, d)
  k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(0), 4)

  @jax.jit
  def sample(k1, k2, k3, k4):
    w1 = jax.random.normal(k1, (nets, d, width)) * W_std / math.sqrt(d)
    b1 = jax.random.normal(k2, (nets, 1, width)) * b_std
    w2 = jax.random.normal(k3, (nets, width, outs)) * W_std / math.sqrt(width)
    b2 = jax.random.normal(k4, (nets, 1, outs)) * b_std
    h = jax.nn.relu(jnp.einsum("nd,sdw->snw", x, w1) + b1)
    f = jnp.einsum("snw,swo->sno", h, w2) + b2          # [nets, 4, outs]
    return jnp.einsum("sio,sjo->ij", f, f) / (nets * outs)

  empirical = sample(k1, k2, k3, k4)
  exact = native.fc_kernel(1, W_std, b_std, "nngp",
                           parameterization="standard")(x)
  np.testing.assert_allclose(empirical, exact,
                             atol=0.05 * float(jnp.max(exact)))


@pytest.mark.parametrize("arch", ["fc", "conv"])
@pytest.mark.parametrize("kind", ["ntk", "nngp"])
def test_kip_loss_gradient_finite_with_duplicate_and_zero_images(arch, kind):
  xs = np.array(_images(4, seed=2))
  xs[1] = xs[0]           # a duplicate: cos = 1 between two support images
  xs[3] = 0.0             # an all-zero image
  xt = _images(5, seed=3)
  ys = jax.nn.one_hot(jnp.array([0, 1, 0, 1]), 2)
  yt = jax.nn.one_hot(jnp.array([0, 1, 1, 0, 1]), 2)
  depth = 2 if arch == "fc" else 1
  k = getattr(native, f"{arch}_kernel")(depth=depth, kind=kind)

  def loss(x):
    return kip_loss_lib.kip_loss(k, x, ys, xt, yt, reg=1e-6)[0]

  value, grad = jax.jit(jax.value_and_grad(loss))(jnp.asarray(xs))
  assert bool(jnp.isfinite(value))
  assert bool(jnp.all(jnp.isfinite(grad)))
  assert float(jnp.max(jnp.abs(grad))) > 0


@pytest.mark.parametrize("arch", ["fc", "conv"])
def test_gradient_finite_at_zero_inputs_without_bias(arch):
  # b_std = 0: the zero image has zero variance in every layer.
  x = np.array(_images(3, seed=4))
  x[0] = 0.0
  x[2] = x[1]
  w = jnp.asarray(np.random.default_rng(0).normal(size=(3, 3)),
                  jnp.float32)
  for kind in ("ntk", "nngp"):
    k = getattr(native, f"{arch}_kernel")(depth=2, b_std=0.0, kind=kind)
    g = jax.grad(lambda a: jnp.sum(k(a) * w))(jnp.asarray(x))
    assert bool(jnp.all(jnp.isfinite(g))), kind
    assert bool(jnp.all(jnp.isfinite(k(x)))), kind


@pytest.mark.parametrize("kind", ["ntk", "nngp"])
@pytest.mark.parametrize("arch", ["fc", "conv"])
def test_matches_neural_tangents_float32(arch, kind):
  pytest.importorskip("neural_tangents")  # The optional `nt` extra.
  from fedjax_dd.kernels import ntk
  x1, x2 = _images(3), _images(2, seed=1)
  depth = 3 if arch == "fc" else 2
  for par in ("ntk", "standard"):
    np.testing.assert_allclose(
        getattr(native, f"{arch}_kernel")(depth, kind=kind,
                                          parameterization=par)(x1, x2),
        getattr(ntk, f"{arch}_kernel")(depth, kind=kind,
                                       parameterization=par)(x1, x2),
        rtol=1e-5, atol=1e-6)
  if arch == "conv":
    # Non-square, odd-sized images with 2 channels (pooling drops the last
    # row and column).
    y1, y2 = _images(2, 7, 5, 2, seed=2), _images(3, 7, 5, 2, seed=3)
    np.testing.assert_allclose(native.conv_kernel(2, kind=kind)(y1, y2),
                               ntk.conv_kernel(2, kind=kind)(y1, y2),
                               rtol=1e-5, atol=1e-6)


def test_blocked_and_vmapped_equal_plain():
  x1, x2 = _images(5), _images(3, seed=1)
  full = native.conv_kernel(depth=2)(x1, x2)
  chunked = native.conv_kernel(depth=2, batch_size=2)(x1, x2)
  assert chunked.shape == (5, 3)
  np.testing.assert_allclose(chunked, full, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(native.fc_kernel(2, batch_size=2)(x1, x2),
                             native.fc_kernel(2)(x1, x2), rtol=1e-5,
                             atol=1e-6)
  xs = _images(2 * 3).reshape(2, 3, 8, 8, 1)
  k = native.conv_kernel(depth=1, kind="nngp")
  batched = jax.jit(jax.vmap(k))(xs, xs)
  for c in range(2):
    np.testing.assert_allclose(batched[c], k(xs[c]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_grad", [False, True])
def test_native_estimate_bounds_compiled_memory(with_grad):
  n1, n2, shape, depth = 4, 3, (12, 12, 1), 2
  k = native.conv_kernel(depth=depth, memory_budget_bytes=None)
  fn = (jax.grad(lambda a, b: jnp.sum(k(a, b))) if with_grad else k)
  args = (jax.ShapeDtypeStruct((n1,) + shape, jnp.float32),
          jax.ShapeDtypeStruct((n2,) + shape, jnp.float32))
  analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
  if analysis is None:
    pytest.skip("backend gives no memory analysis")
  est = blocking.estimate_kernel_bytes(n1, n2, shape, depth,
                                       with_grad=with_grad, impl="native")
  assert analysis.temp_size_in_bytes <= est <= 2 * analysis.temp_size_in_bytes


def test_memory_guard_and_invalid_arguments():
  x = jnp.zeros((20, 28, 28, 1))
  budget = blocking.estimate_kernel_bytes(4, 4, (28, 28), 3, impl="native")
  with pytest.raises(ValueError, match="memory_budget_bytes"):
    jax.eval_shape(native.conv_kernel(memory_budget_bytes=budget), x, x)
  out = jax.eval_shape(
      native.conv_kernel(memory_budget_bytes=budget, batch_size=4), x, x)
  assert out.shape == (20, 20)
  with pytest.raises(ValueError, match="kind"):
    native.fc_kernel(kind="gp")
  with pytest.raises(ValueError, match="too small"):
    native.conv_kernel(depth=4)(_images(1), _images(1))
  with pytest.raises(ValueError, match="impl"):
    blocking.estimate_kernel_bytes(1, 1, (8, 8), 1, impl="jax")
  u8 = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4, 1)
  np.testing.assert_allclose(native.fc_kernel(1)(u8),
                             native.fc_kernel(1)(u8.astype(np.float32)),
                             rtol=1e-6)
