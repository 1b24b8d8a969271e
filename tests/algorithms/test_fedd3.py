"""FedD3 stages: upload size, union, hybrid data, distillers."""

import jax
import numpy as np
import pytest

from fedjax_dd.algorithms import fedd3
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.kernels.ntk import fc_kernel


def _distilled(learned=False):
  x = np.arange(3 * 2 * 2 * 1, dtype=np.uint8).reshape(3, 2, 2, 1)
  y = np.array([0, 1, 1], np.int32)
  return fedd3.DistilledSet(x=x, y=y, y_soft=np.eye(2, dtype=np.float32)[y],
                            owner=np.array([0, 0, 2]), learned_labels=learned)


def test_upload_bits_by_hand():
  # 3 images of 2x2x1 at 8 bits + 3 hard labels at 8 bits = 96 + 24.
  assert fedd3.upload_bits(_distilled()) == 3 * 4 * 8 + 3 * 8
  # Learned labels travel as 2 float32 entries each: 96 + 3 * 2 * 32.
  assert fedd3.upload_bits(_distilled(learned=True)) == 96 + 192


def test_server_dataset_is_one_client_union():
  d = fedd3.server_dataset(_distilled())
  assert d.x.shape == (1, 3, 2, 2, 1)
  np.testing.assert_array_equal(d.num_examples, [3])
  np.testing.assert_array_equal(d.y[0], [0, 1, 1])


def test_hybrid_client_data_appends_others_only():
  x = np.full((3, 4, 2, 2, 1), 200, np.uint8)
  y = np.full((3, 4), 1, np.int32)
  data = ClientData(x=x, y=y, num_examples=np.array([4, 2, 3], np.int32))
  h = fedd3.hybrid_client_data(data, _distilled())
  # Client 0 sent 2 images (receives 1), client 1 none (3), client 2 one (2).
  np.testing.assert_array_equal(h.num_examples, [5, 5, 5])
  np.testing.assert_array_equal(h.x[0, 4, :, :, 0], [[8, 9], [10, 11]])
  np.testing.assert_array_equal(h.y[1, 2:5], [0, 1, 1])
  np.testing.assert_array_equal(h.y[2, 3:5], [0, 1])
  # Round-1 download: each client receives the others' sets (1 + 3 + 2 images).
  per_image = 4 * 8 + 8
  assert fedd3.hybrid_download_bits(_distilled(), 3) == 6 * per_image


def _clients():
  rng = np.random.default_rng(0)
  x = np.zeros((2, 8, 4, 4, 1), np.uint8)
  y = np.zeros((2, 8), np.int32)
  for c in range(2):
    lab = np.array([c, c + 1] * 4)
    img = rng.integers(0, 40, (8, 4, 4, 1))
    img[np.arange(8), lab] += 200
    x[c], y[c] = img, lab
  return ClientData(x=x, y=y, num_examples=np.array([8, 6], np.int32))


def test_kip_and_gmm_distillers_shapes():
  data = _clients()
  kip = fedd3.kip_distiller(fc_kernel(depth=2), num_classes=3, mean=[0.3],
                            std=[0.3], images_per_class=1, max_iterations=5,
                            segment_iterations=5)
  d = kip(jax.random.PRNGKey(0), data)
  assert d.size == 4 and d.x.dtype == np.uint8 and d.x_float.shape == (4, 4, 4, 1)
  np.testing.assert_array_equal(np.bincount(d.owner), [2, 2])
  np.testing.assert_array_equal(sorted(d.y[d.owner == 1]), [1, 2])
  g = fedd3.gmm_distiller(num_classes=3, images_per_class=2)(jax.random.PRNGKey(0), data)
  assert g.size == 8 and g.x.dtype == np.uint8
  np.testing.assert_array_equal(g.y_soft.sum(-1), np.ones(8))


def test_privacy_guard_refuses_single_sample_classes():
  data = _clients()
  data = data.replace(num_examples=np.array([8, 3], np.int32))  # client 1: 1x class 2
  kip = fedd3.kip_distiller(fc_kernel(depth=2), num_classes=3, mean=[0.3],
                            std=[0.3], images_per_class=1, max_iterations=2)
  with pytest.raises(ValueError, match="raw image"):
    kip(jax.random.PRNGKey(0), data)
