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


def test_max_pool_gives_a_tie_to_the_first_maximum():
  # Three of the window's four entries tie at the maximum: the first in
  # row-major window order gets the whole gradient (as PyTorch and lax's
  # reduce_window max-pool do), eagerly and jitted alike.
  x = jnp.array([[0., 2.], [2., 2.]]).reshape(1, 2, 2, 1)
  grad = jax.grad(lambda x: layers.max_pool(x).sum())
  for g in (grad(x), jax.jit(grad)(x)):
    np.testing.assert_array_equal(g[0, :, :, 0], [[0., 1.], [0., 0.]])


def test_max_pool_gradient_on_odd_sizes_and_larger_windows():
  # 5x7 input, 2x2 windows: the last row and column are cropped and get no
  # gradient; 3x3 windows on 6x6: one 1 per window, at its maximum.
  x = jnp.asarray(np.random.default_rng(0).permutation(2 * 5 * 7 * 3)
                  .reshape(2, 5, 7, 3), jnp.float32)
  g = jax.jit(jax.grad(lambda x: layers.max_pool(x).sum()))(x)
  assert g.shape == x.shape
  np.testing.assert_array_equal(g[:, 4, :, :], 0)
  np.testing.assert_array_equal(g[:, :, 6, :], 0)
  win = np.asarray(x[:, :4, :6, :]).reshape(2, 2, 2, 3, 2, 3)
  hit = np.asarray(g[:, :4, :6, :]).reshape(2, 2, 2, 3, 2, 3)
  np.testing.assert_array_equal(hit.sum(axis=(2, 4)), 1)
  np.testing.assert_array_equal(
      hit, win == win.max(axis=(2, 4), keepdims=True))
  x = x[:, :, :6, :][:, :3]
  x = jnp.concatenate([x, x[:, ::-1] + 1000], axis=1)  # 6x6, distinct
  g = jax.grad(lambda x: layers.max_pool(x, 3, 3).sum())(x)
  win = np.asarray(x).reshape(2, 2, 3, 2, 3, 3)
  hit = np.asarray(g).reshape(2, 2, 3, 2, 3, 3)
  np.testing.assert_array_equal(
      hit, win == win.max(axis=(2, 4), keepdims=True))


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


def test_phase_selection_places_each_tap_once_per_output_phase():
  # Each kernel tap (a, b) reaches each output phase (r, s) from exactly one
  # (u, v, p, q): 2u + p - r = a, 2v + q - s = b.
  sel = layers._phase_selection(5, 5)
  assert sel.shape == (3, 3, 2, 2, 2, 2, 5, 5)
  np.testing.assert_array_equal(sel.sum(axis=(0, 1, 2, 3)),
                                np.ones((2, 2, 5, 5)))
  # (u, v, p, q, r, s) = (1, 1, 0, 1, 1, 0): a = 2 + 0 - 1 = 1, b = 2 + 1 = 3.
  assert sel[1, 1, 0, 1, 1, 0].sum() == 1 and sel[1, 1, 0, 1, 1, 0, 1, 3] == 1
  # (1, 2, 0, 1, 1, 0): b = 4 + 1 - 0 = 5 is outside the 5x5 kernel.
  assert sel[1, 2, 0, 1, 1, 0].sum() == 0


def test_phase_split_conv_max_pool_hand_example():
  # A 1x1 kernel of 2 on a 4x4 ramp: the pool of 2x is 2x the pool.
  x = jnp.arange(16, dtype=jnp.float32).reshape(1, 4, 4, 1)
  k = jnp.full((1, 1, 1, 1), 2.0)
  np.testing.assert_array_equal(
      layers.phase_split_conv_max_pool(x, k)[0, :, :, 0], [[10., 14.],
                                                          [26., 30.]])


@pytest.mark.slow
@pytest.mark.parametrize("conv_impl", ["lax", "patches"])
@pytest.mark.parametrize("shape,kernel", [((3, 28, 28, 1), (5, 5, 1, 6)),
                                          ((2, 32, 32, 3), (5, 5, 3, 6)),
                                          ((2, 10, 8, 2), (3, 5, 2, 4))])
def test_phase_split_equals_conv_then_max_pool(conv_impl, shape, kernel):
  x = jax.random.normal(jax.random.PRNGKey(0), shape)
  k = jax.random.normal(jax.random.PRNGKey(1), kernel)
  conv_fn = (layers.patches_conv_general_dilated if conv_impl == "patches"
             else jax.lax.conv_general_dilated)
  ref = lambda x, k: layers.max_pool(jax.lax.conv_general_dilated(
      x, k, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")))
  ours = lambda x, k: layers.phase_split_conv_max_pool(x, k, conv_fn)
  np.testing.assert_allclose(ours(x, k), ref(x, k), rtol=1e-5, atol=1e-5)
  g = jax.random.normal(jax.random.PRNGKey(2), ref(x, k).shape)
  grads = [jax.grad(lambda x, k: jnp.sum(f(x, k) * g), argnums=(0, 1))(x, k)
           for f in (ours, ref)]
  for a, b in zip(*grads):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_phase_split_refuses_odd_inputs():
  with pytest.raises(ValueError, match="even input sizes"):
    layers.phase_split_conv_max_pool(jnp.zeros((1, 7, 8, 1)),
                                     jnp.zeros((3, 3, 1, 2)))


@pytest.mark.parametrize("shape", [(2, 28, 28, 1), (2, 27, 27, 1)])
def test_conv_relu_max_pool_has_nn_conv_parameters_and_values(shape):
  # Same parameter tree and initial values as nn.Conv + ReLU + max_pool, the
  # plain form bit-identical, the phase-split form equal to rounding (the
  # 27x27 input falls back to the plain form).
  class Plain(nn.Module):
    @nn.compact
    def __call__(self, x):
      return layers.max_pool(nn.relu(nn.Conv(6, (5, 5), padding="VALID",
                                             name="c")(x)))

  class Ours(nn.Module):
    phase_split: bool

    @nn.compact
    def __call__(self, x):
      return layers.ConvReluMaxPool(6, (5, 5), conv_impl="lax",
                                    phase_split=self.phase_split, name="c")(x)

  x = jax.random.normal(jax.random.PRNGKey(0), shape)
  v = Plain().init(jax.random.PRNGKey(3), x)
  for split in (False, True):
    w = Ours(split).init(jax.random.PRNGKey(3), x)
    assert jax.tree.structure(w) == jax.tree.structure(v)
    for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(v)):
      np.testing.assert_array_equal(a, b)
  ref = Plain().apply(v, x)
  np.testing.assert_array_equal(Ours(False).apply(v, x), ref)
  np.testing.assert_allclose(Ours(True).apply(v, x), ref, rtol=1e-5, atol=1e-5)


# --- Conv, add_bias, InstanceNorm: nn.Conv's and nn.InstanceNorm's parameters


def test_add_bias_hand_example():
  y = jnp.arange(12.0).reshape(2, 3, 2)
  b = jnp.array([10.0, 20.0])
  np.testing.assert_array_equal(layers.add_bias(y, b), y + b)
  ct = jnp.arange(12.0).reshape(2, 3, 2) + 1  # 1..12
  dy, db = jax.grad(lambda y, b: jnp.vdot(layers.add_bias(y, b), ct),
                    (0, 1))(y, b)
  np.testing.assert_array_equal(dy, ct)
  # Channel 0 sums 1+3+5+7+9+11, channel 1 sums 2+4+...+12.
  np.testing.assert_array_equal(db, [36.0, 42.0])
  # Under vmap each client gets its own sums.
  db2 = jax.vmap(jax.grad(lambda b, c: jnp.vdot(layers.add_bias(y, b), c)))(
      jnp.stack([b, b]), jnp.stack([ct, 2 * ct]))
  np.testing.assert_array_equal(db2, [[36.0, 42.0], [72.0, 84.0]])


@pytest.mark.parametrize("conv_impl", ["lax", "patches"])
@pytest.mark.parametrize("weight_grad", ["lax", "gemm", "taps"])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_conv_module_has_nn_conv_parameters_values_and_gradients(
    conv_impl, weight_grad, padding):
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 9, 8, 3))
  theirs = nn.Conv(5, (3, 3), padding=padding)
  ours = layers.Conv(5, (3, 3), padding=padding, conv_impl=conv_impl,
                     weight_grad=weight_grad)
  v = theirs.init(jax.random.PRNGKey(3), x)
  w = ours.init(jax.random.PRNGKey(3), x)
  assert jax.tree.structure(w) == jax.tree.structure(v)
  for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(v)):
    np.testing.assert_array_equal(a, b)
  # A non-zero bias, so that the bias is really added.
  v = jax.tree.map(lambda a: a + 0.1, v)
  np.testing.assert_allclose(ours.apply(v, x), theirs.apply(v, x),
                             rtol=1e-5, atol=1e-5)
  ct = jax.random.normal(jax.random.PRNGKey(4), theirs.apply(v, x).shape)
  g = lambda m: jax.grad(lambda v, x: jnp.vdot(m.apply(v, x), ct),
                         (0, 1))(v, x)
  for a, b in zip(jax.tree.leaves(g(ours)), jax.tree.leaves(g(theirs))):
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_conv_without_applied_bias_declares_it_but_does_not_add_it():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, 5, 3))
  theirs = nn.Conv(4, (3, 3), padding="SAME")
  ours = layers.Conv(4, (3, 3), padding="SAME", apply_bias=False)
  v = theirs.init(jax.random.PRNGKey(1), x)
  w = ours.init(jax.random.PRNGKey(1), x)
  # The same variables as nn.Conv, the bias included.
  assert jax.tree.structure(w) == jax.tree.structure(v)
  v = jax.tree.map(lambda a: a + 0.5, v)
  bias = v["params"]["bias"]
  np.testing.assert_allclose(ours.apply(v, x), theirs.apply(v, x) - bias,
                             rtol=1e-5, atol=1e-5)
  g = jax.grad(lambda v: jnp.sum(ours.apply(v, x) ** 2))(v)
  np.testing.assert_array_equal(g["params"]["bias"], np.zeros(4))
  assert np.abs(np.asarray(g["params"]["kernel"])).max() > 0


@pytest.mark.parametrize("fold", [False, True])
def test_instance_norm_hand_example(fold):
  # One example, one channel, values 1, 2, 3, 4: mean 2.5, variance 1.25.
  x = jnp.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 2, 2, 1)
  y = layers.InstanceNorm(epsilon=0.0, fold=fold).apply(
      {"params": {"scale": jnp.array([2.0]), "bias": jnp.array([1.0])}}, x)
  expected = (np.array([1.0, 2.0, 3.0, 4.0]) - 2.5) / np.sqrt(1.25) * 2 + 1
  np.testing.assert_allclose(y.reshape(-1), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("platform, version, expected", [
    ("cpu", "0.5.3", True), ("cpu", "0.4.30", True), ("cpu", "0.6.0", False),
    ("cpu", "0.12.0.1", False), ("gpu", "0.5.3", False),
    ("tpu", "0.5.3", False)])
def test_instance_norm_folds_on_the_classic_cpu_runtime_only(
    platform, version, expected):
  assert layers.instance_norm_folds(platform, version) is expected


def test_unfolded_instance_norm_is_flax_bit_for_bit():
  x = 3 * jax.random.normal(jax.random.PRNGKey(0), (3, 6, 5, 4)) + 1
  v = {"params": {"scale": jnp.linspace(0.5, 2.0, 4),
                  "bias": jnp.linspace(-1.0, 1.0, 4)}}
  np.testing.assert_array_equal(
      layers.InstanceNorm(1e-5, fold=False).apply(v, x),
      nn.InstanceNorm(epsilon=1e-5).apply(v, x))


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("shape", [(3, 6, 5, 4), (2, 4, 4, 1)])
def test_instance_norm_matches_flax(shape, fold):
  x = 3 * jax.random.normal(jax.random.PRNGKey(0), shape) + 1
  theirs = nn.InstanceNorm(epsilon=1e-5)
  ours = layers.InstanceNorm(1e-5, fold=fold)
  v = theirs.init(jax.random.PRNGKey(1), x)
  w = ours.init(jax.random.PRNGKey(1), x)
  assert jax.tree.structure(w) == jax.tree.structure(v)
  for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(v)):
    np.testing.assert_array_equal(a, b)
  v = {"params": {"scale": jnp.linspace(0.5, 2.0, shape[-1]),
                  "bias": jnp.linspace(-1.0, 1.0, shape[-1])}}
  np.testing.assert_allclose(ours.apply(v, x), theirs.apply(v, x),
                             rtol=1e-5, atol=1e-5)
  ct = jax.random.normal(jax.random.PRNGKey(2), shape)
  g = lambda m: jax.grad(lambda v, x: jnp.vdot(jax.nn.relu(m.apply(v, x)),
                                               ct), (0, 1))(v, x)
  for a, b in zip(jax.tree.leaves(g(ours)), jax.tree.leaves(g(theirs))):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
