"""FedFTG's conditional generator CGeneratorA."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.distill import ensemble
from fedjax_dd.models.cgenerator import CGeneratorA

NZ = 8


def _z(n, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(n, NZ)),
                     jnp.float32)


@pytest.mark.parametrize("out_shape", [(28, 28, 1), (32, 32, 3), (8, 8, 1)])
def test_output_shape_finite_and_standardised(out_shape):
  gen = CGeneratorA(out_shape=out_shape, nz=NZ, ngf=4, num_classes=3)
  params, stats = ensemble.init_generator(gen, jax.random.PRNGKey(0))
  h0 = out_shape[0] // 4  # 7x7, 8x8, 2x2 first maps (FedFTG: img_size // 4).
  assert params["noise_fc"]["kernel"].shape == (NZ, h0 * h0 * 4)
  assert params["label_fc"]["kernel"].shape == (3, h0 * h0 * 4)
  assert "bn_out" not in params  # BatchNorm(affine=False): no scale, bias.
  # FedFTG's convolutions keep their bias; conv_bias=False drops it before
  # the BatchNorms only.
  assert set(params["conv1"]) == set(params["conv2"]) == {"kernel", "bias"}
  no_bias, _ = ensemble.init_generator(
      CGeneratorA(out_shape=out_shape, nz=NZ, ngf=4, num_classes=3,
                  conv_bias=False), jax.random.PRNGKey(0))
  assert set(no_bias["conv1"]) == set(no_bias["conv2"]) == {"kernel"}
  assert set(no_bias["conv3"]) == {"kernel", "bias"}
  assert set(stats["bn_out"]) == {"mean", "var"}
  y = jnp.array([0, 1, 2, 0, 1, 2], jnp.int32)
  x, new_stats = ensemble.apply_generator(gen, params, stats, _z(6), y, True)
  assert x.shape == (6, *out_shape)
  assert np.all(np.isfinite(x))
  # Training mode: the last BatchNorm standardises each channel.
  np.testing.assert_allclose(np.mean(x, axis=(0, 1, 2)), 0.0, atol=1e-4)
  np.testing.assert_allclose(np.var(x, axis=(0, 1, 2)), 1.0, atol=1e-2)
  assert not np.allclose(new_stats["bn_out"]["mean"], stats["bn_out"]["mean"])
  x_eval, same = ensemble.apply_generator(gen, params, stats, _z(6), y, False)
  assert x_eval.shape == (6, *out_shape) and np.all(np.isfinite(x_eval))
  assert same is stats


def test_labels_condition_the_output_and_defaults():
  gen = CGeneratorA(out_shape=(8, 8, 1), nz=NZ, ngf=2, num_classes=3)
  params, stats = ensemble.init_generator(gen, jax.random.PRNGKey(1))
  z = _z(3)
  a, _ = ensemble.apply_generator(gen, params, stats, z, jnp.array([0, 0, 0]),
                                  False)
  b, _ = ensemble.apply_generator(gen, params, stats, z, jnp.array([1, 2, 0]),
                                  False)
  np.testing.assert_array_equal(a[2], b[2])
  assert not np.allclose(a[0], b[0]) and not np.allclose(a[1], b[1])
  default = CGeneratorA()
  assert (default.nz, default.ngf, default.out_shape) == (100, 64, (32, 32, 3))
  assert ensemble.is_conditional(default)
  assert ensemble.generator_output_space(default) == "normalised"


def test_bad_inputs_and_input_fn():
  gen = CGeneratorA(out_shape=(8, 8, 1), nz=NZ, ngf=2, num_classes=3)
  params, stats = ensemble.init_generator(gen, jax.random.PRNGKey(0))
  v = {"params": params, "batch_stats": stats}
  with pytest.raises(ValueError, match="needs labels"):
    gen.apply(v, _z(2), train=False)
  with pytest.raises(ValueError, match="y must have shape"):
    gen.apply(v, _z(2), jnp.array([0, 1, 2]), train=False)
  with pytest.raises(ValueError, match="divisible by 4"):
    CGeneratorA(out_shape=(6, 6, 1), nz=NZ).init(
        jax.random.PRNGKey(0), _z(1), jnp.zeros((1,), jnp.int32), train=False)
  # A normalised generator's samples go to the classifiers unchanged; the
  # unit-range Generator keeps its normaliser.
  from fedjax_dd import models
  norm = lambda x: 2 * x - 1
  x = jnp.full((1, 2), 0.25)
  assert ensemble.generator_input_fn(gen, norm)(x) is x
  assert ensemble.generator_input_fn(models.Generator(), norm) is norm
  with pytest.raises(ValueError, match="input_fn"):
    ensemble.generator_input_fn(models.Generator(), None)
