"""FedD3's float uploads (the authors' code sends KIP's support unquantised):
off by default, 32 bits per pixel channel, the server reads float pixels as
it reads uint8 ones."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dd.algorithms import fedd3
from fedjax_dd.data import preprocess
from fedjax_dd.distill.kip import KipOptions
from fedjax_dd.kernels.native import fc_kernel
from tests.algorithms.test_fedd3 import _clients  # the same two clients
from tests.conftest import tiny_task


def _kip(**kw):
  return fedd3.kip_distiller(
      fc_kernel(depth=2), num_classes=3, mean=[0.3], std=[0.3],
      images_per_class=1, options=KipOptions(
          max_iterations=4, segment_iterations=4, stop_accuracy=None), **kw)


def test_float_upload_sends_the_support_as_optimised_at_32_bits():
  data, key = _clients(), jax.random.PRNGKey(0)
  q = _kip()(key, data)
  f = _kip(float_upload=True)(key, data)
  # Off (the default): uint8, as before.
  assert q.x.dtype == np.uint8 and f.x.dtype == np.float32
  np.testing.assert_array_equal(f.x, f.x_float)
  np.testing.assert_array_equal(q.x_float, f.x_float)
  np.testing.assert_array_equal(q.x, np.clip(np.round(f.x), 0, 255))
  # 4 images of 4x4x1: 16 · 8 bits (uint8) or 16 · 32 bits (float32), plus
  # a byte per hard label.
  assert fedd3.upload_bits(q) == 4 * (16 * 8 + 8)
  assert fedd3.upload_bits(f) == 4 * (16 * 32 + 8)
  u = fedd3.pad_uploads(f, num_clients=2, size=3)
  assert u.x.dtype == np.float32
  np.testing.assert_array_equal(u.distilled().x, f.x)


def _task(mean, std):
  return dataclasses.replace(tiny_task(), preprocess=functools.partial(
      preprocess.normalize, mean=mean, std=std))


def test_float_pixel_task_reads_pixels_as_the_uint8_preprocessing():
  mean, std = np.array([0.3], np.float32), np.array([0.25], np.float32)
  task = _task(mean, std)
  ft = fedd3.float_pixel_task(task, mean, std)
  x = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4, 1) * 7
  np.testing.assert_allclose(ft.preprocess(jnp.asarray(x, jnp.float32)),
                             task.preprocess(jnp.asarray(x)), rtol=1e-6)
  # Pixels outside [0, 255] stay as they are (no clip before the server).
  np.testing.assert_allclose(ft.preprocess(jnp.full((1, 1, 1, 1), -51.0)),
                             [[[[(-0.2 - 0.3) / 0.25]]]], rtol=1e-6)


def test_the_server_trains_on_a_float_upload():
  data, key = _clients(), jax.random.PRNGKey(0)
  mean, std = np.array([0.3], np.float32), np.array([0.3], np.float32)
  task = _task(mean, std)
  m = fedd3.fedd3(_kip(float_upload=True),
                  fedd3.float_pixel_task(task, mean, std), optax.sgd(0.1),
                  num_classes=3, images_per_class=1, batch_size=2,
                  float_upload=True)
  uploads = m.client_stage(None, data, key)
  assert uploads.x.dtype == jnp.float32
  template = m.upload_template(None, None, data)
  assert template.x.dtype == jnp.float32 and template.x.shape == uploads.x.shape
  _, bits = m.upload_bits(uploads)
  np.testing.assert_array_equal(bits, [2 * (16 * 32 + 8)] * 2)
  setup = m.setup(uploads, key)
  params, stats = task.init(jax.random.PRNGKey(1))
  state = m.init(key, setup, uploads, params, stats)
  state, metrics = m.epoch(state, uploads)
  assert int(state.epoch) == 1
  assert all(np.all(np.isfinite(np.asarray(v))) for v in metrics.values())
