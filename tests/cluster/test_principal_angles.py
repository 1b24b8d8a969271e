"""PACFL's signatures, principal-angle proximity, clustering, assignment."""

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.cluster import principal_angles as pa


def _client(vectors, n_max=6):
  """A client whose images are the given 4-pixel vectors (as 2x2x1)."""
  x = np.zeros((n_max, 2, 2, 1), np.float32)
  for i, v in enumerate(vectors):
    x[i] = np.asarray(v, np.float32).reshape(2, 2, 1)
  return jnp.asarray(x), jnp.zeros((n_max,), jnp.int32), len(vectors)


def _signature(vectors, rank=1):
  x, y, n = _client(vectors)
  return pa.client_subspace(x, y, n, num_classes=1, rank=rank,
                            per_class=False)


def test_angles_of_one_dimensional_subspaces():
  e1, e2 = [1, 0, 0, 0], [0, 1, 0, 0]
  diag = [1, 1, 0, 0]
  us, masks = zip(*[_signature([e1, [3, 0, 0, 0]]), _signature([e2]),
                    _signature([diag, [2, 2, 0, 0]])])
  u, mask = jnp.stack(us), jnp.stack(masks)
  assert u.shape == (3, 4, 1)
  for form in pa.PROXIMITIES:
    a = np.asarray(pa.proximity(u, mask, form))
    np.testing.assert_allclose(a, [[0, 90, 45], [90, 0, 45], [45, 45, 0]],
                               atol=1e-3)


def test_smallest_principal_angle_against_the_codes_basis_angle():
  # A spans {e1, e2} with singular vectors e1 (larger) and e2; B spans
  # {(e1 + e2)/√2, e3}. The smallest principal angle is 0 ((e1 + e2)/√2 lies
  # in A); the closest pair of basis vectors is 45° apart.
  a = _signature([[2, 0, 0, 0]] * 3 + [[0, 1, 0, 0]], rank=2)
  b = _signature([[3, 3, 0, 0]] * 3 + [[0, 0, 1, 0]], rank=2)
  np.testing.assert_array_equal(a[1], [True, True])
  u, mask = jnp.stack([a[0], b[0]]), jnp.stack([a[1], b[1]])
  assert float(pa.proximity(u, mask, "smallest")[0, 1]) < 0.1
  np.testing.assert_allclose(pa.proximity(u, mask, "basis")[0, 1], 45.0,
                             atol=1e-3)


def test_columns_past_the_rank_padding_and_absent_classes_are_masked():
  x, y, n = _client([[1, 0, 0, 0], [2, 0, 0, 0]], n_max=5)
  x = x.at[3:].set(99.0)  # padding garbage
  y = y.at[1].set(2)      # classes 0 and 2 hold one image each, 1 none
  u, mask = pa.client_subspace(x, y, n, num_classes=3, rank=2)
  assert u.shape == (4, 6)
  np.testing.assert_array_equal(mask, [True, False, False, False, True,
                                       False])
  np.testing.assert_allclose(np.abs(u[:, 0]), [1, 0, 0, 0], atol=1e-6)
  np.testing.assert_array_equal(u[:, 1:4], 0)


def test_agglomerative_threshold_fixed_k_and_assignment():
  a = np.asarray([[0, 1, 50, 52], [1, 0, 51, 50], [50, 51, 0, 2],
                  [52, 50, 2, 0]], np.float32)
  c = pa.agglomerative(a, threshold=10.0)
  np.testing.assert_array_equal(c.labels, [0, 0, 1, 1])
  assert c.num_clusters == 2
  assert pa.agglomerative(a, threshold=60.0).num_clusters == 1
  assert pa.agglomerative(a, num_clusters=4).num_clusters == 4
  new = np.asarray([[48, 49, 3, 4], [2, 3, 40, 41]], np.float32)
  np.testing.assert_array_equal(pa.assign(new, c.labels, 2), [1, 0])
  with pytest.raises(ValueError, match="exactly one"):
    pa.agglomerative(a)


def test_randomized_vectors_match_the_full_svd():
  # 40 images of 8x8 whose singular values fall by 0.6 a step: the top 3
  # vectors of 6 power iterations on 5 columns equal LAPACK's.
  rng = np.random.default_rng(0)
  left, _ = np.linalg.qr(rng.normal(size=(64, 40)))
  right, _ = np.linalg.qr(rng.normal(size=(40, 40)))
  images = (right * 0.6 ** np.arange(40)) @ left.T  # [40, 64]
  x = jnp.asarray(images.reshape(40, 8, 8, 1), jnp.float32)
  y, n = jnp.zeros((40,), jnp.int32), 40
  kw = dict(num_classes=1, rank=3, per_class=False)
  fast, mask = pa.client_subspace(x, y, n, oversample=2, **kw)
  exact, _ = pa.client_subspace(x, y, n, iterations=-1, **kw)
  assert bool(mask.all())
  np.testing.assert_allclose(np.abs(np.sum(fast * exact, axis=0)), 1.0,
                             atol=1e-4)
