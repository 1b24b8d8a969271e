"""Tests for the data-free KD generator."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd import models

NZ = 8
# Cheap-to-compile key implementation (see test_models.py).
KEY = functools.partial(jax.random.key, impl="rbg")


def _z(n=2, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.normal(size=(n, NZ)), jnp.float32)


@pytest.mark.parametrize("out_shape", [(28, 28, 1), (32, 32, 3)])
def test_output_shape_and_range(out_shape):
  gen = models.Generator(out_shape=out_shape, nz=NZ, ngf=4)
  variables = models.init_model(gen, KEY(0), (NZ,))
  assert set(variables) == {"params", "batch_stats"}
  # The first feature map is H/4 x W/4 (7x7 for 28x28, 8x8 for 32x32).
  h0 = out_shape[0] // 4
  assert variables["params"]["fc"]["kernel"].shape == (NZ, h0 * h0 * 8)
  imgs, upd = gen.apply(variables, _z(), train=True, mutable=["batch_stats"])
  assert imgs.shape == (2, *out_shape)
  assert np.all((imgs > 0) & (imgs < 1))
  assert set(upd) == {"batch_stats"}
  eval_imgs = gen.apply(variables, _z(), train=False)
  assert eval_imgs.shape == (2, *out_shape)
  assert np.all(np.isfinite(eval_imgs))


def test_default_train_mode_needs_mutable_batch_stats():
  gen = models.Generator(out_shape=(8, 8, 1), nz=NZ, ngf=2)
  variables = models.init_model(gen, KEY(0), (NZ,))
  # train defaults to True, which updates batch_stats.
  with pytest.raises(Exception, match="batch_stats"):
    gen.apply(variables, _z())


def test_conditional_requires_labels():
  gen = models.Generator(out_shape=(8, 8, 1), nz=NZ, ngf=2, conditional=True,
                         num_classes=3)
  y = jnp.array([0, 2], jnp.int32)
  variables = models.init_model(gen, KEY(0), (NZ,), y=y[:1])
  assert variables["params"]["label_embed"]["embedding"].shape == (3, NZ)
  with pytest.raises(ValueError, match="needs labels"):
    gen.apply(variables, _z(), train=False)
  with pytest.raises(ValueError, match="y must have shape"):
    gen.apply(variables, _z(), jnp.array([0, 1, 2]), train=False)
  out = gen.apply(variables, _z(), y, train=False)
  assert out.shape == (2, 8, 8, 1)


def test_conditional_labels_change_output():
  gen = models.Generator(out_shape=(8, 8, 1), nz=NZ, ngf=2, conditional=True,
                         num_classes=3)
  variables = models.init_model(gen, KEY(0), (NZ,),
                                y=jnp.zeros((1,), jnp.int32))
  z = jnp.tile(_z(1), (2, 1))  # same noise twice
  out = gen.apply(variables, z, jnp.array([0, 1]), train=False)
  assert not np.allclose(out[0], out[1])
  same = gen.apply(variables, z, jnp.array([2, 2]), train=False)
  np.testing.assert_allclose(same[0], same[1])


def test_unconditional_rejects_labels():
  gen = models.Generator(out_shape=(8, 8, 1), nz=NZ, ngf=2)
  variables = models.init_model(gen, KEY(0), (NZ,))
  with pytest.raises(ValueError, match="unconditional"):
    gen.apply(variables, _z(), jnp.zeros((2,), jnp.int32), train=False)


@pytest.mark.parametrize("kwargs,z_shape,match", [
    (dict(out_shape=(30, 30, 1)), (2, NZ), "divisible by 4"),
    (dict(out_shape=(28, 28)), (2, NZ), r"\(H, W, Ch\)"),
    (dict(out_shape=(8, 8, 1)), (2, NZ + 1), "z must have shape"),
])
def test_bad_configuration_raises(kwargs, z_shape, match):
  gen = models.Generator(nz=NZ, ngf=2, **kwargs)
  with pytest.raises(ValueError, match=match):
    gen.init(KEY(0), jnp.zeros(z_shape), train=False)


def test_upsample_is_nearest_neighbour():
  from fedjax_dd.models.generator import _upsample2
  x = jnp.arange(4.0).reshape(1, 2, 2, 1)
  np.testing.assert_array_equal(
      _upsample2(x)[0, :, :, 0],
      [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]])
