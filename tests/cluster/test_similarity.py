"""Update vectors and their cosine matrix (DisUE Eq. 3)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.cluster.similarity import (cosine_matrix, flatten_params,
                                          update_similarity, update_vectors)


def _params():
  # Three clients, leaves [3, 2] and [3, 1, 2].
  return {"a": jnp.asarray([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]]),
          "b": jnp.asarray([[[0.0, 0.0]], [[0.0, 0.0]], [[0.0, 3.0]]])}


def test_flatten_params_shape_and_order():
  v = flatten_params(_params())
  assert v.shape == (3, 4) and v.dtype == jnp.float32
  np.testing.assert_array_equal(v[2], [2.0, 0.0, 0.0, 3.0])


def test_flatten_params_rejects_mismatched_client_axes():
  with pytest.raises(ValueError, match="leading"):
    flatten_params({"a": jnp.zeros((3, 2)), "b": jnp.zeros((2, 2))})


def test_update_vectors_delta_and_raw():
  params = _params()
  glob = {"a": jnp.asarray([1.0, 0.0]), "b": jnp.asarray([[0.0, 0.0]])}
  delta = update_vectors(params, glob)
  np.testing.assert_array_equal(delta[0], [0, 0, 0, 0])
  np.testing.assert_array_equal(delta[1], [-1, 1, 0, 0])
  np.testing.assert_array_equal(update_vectors(params, glob, mode="raw"),
                                flatten_params(params))
  with pytest.raises(ValueError, match="mode"):
    update_vectors(params, glob, mode="grad")


def test_cosine_matrix_by_hand():
  v = jnp.asarray([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [0.0, 0.0],
                   [1.0, 1.0]])
  sim = np.asarray(cosine_matrix(v))
  assert sim.shape == (5, 5) and np.isfinite(sim).all()
  np.testing.assert_allclose(sim[0, 1], 0.0, atol=1e-7)
  np.testing.assert_allclose(sim[0, 2], -1.0)
  np.testing.assert_allclose(sim[0, 4], 1 / np.sqrt(2), rtol=1e-6)
  # The zero row: similarity 0 with everyone, itself included.
  np.testing.assert_array_equal(sim[3], np.zeros(5))
  np.testing.assert_array_equal(sim[:, 3], np.zeros(5))
  np.testing.assert_array_equal(np.diag(sim), [1, 1, 1, 0, 1])
  np.testing.assert_array_equal(sim, sim.T)


def test_raw_cosines_sit_near_one_update_cosines_do_not():
  # Two clients trained in opposite directions from a large shared ω_G.
  rng = np.random.default_rng(0)
  glob = {"w": jnp.asarray(10.0 + rng.normal(size=50), jnp.float32)}
  step = jnp.asarray(0.05 * rng.normal(size=50), jnp.float32)
  clients = {"w": jnp.stack([glob["w"] + step, glob["w"] - step])}
  raw = update_similarity(clients, glob, mode="raw")
  delta = update_similarity(clients, glob)
  assert raw[0, 1] > 0.99
  np.testing.assert_allclose(delta[0, 1], -1.0, atol=1e-4)


def test_update_similarity_does_not_recompile(caplog):
  rng = np.random.default_rng(1)
  glob = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}

  def clients():
    return {"w": jnp.asarray(rng.normal(size=(4, 3, 2)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)}

  update_similarity(clients(), glob)
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    sim = update_similarity(clients(), glob)
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
  assert sim.shape == (4, 4) and np.isfinite(np.asarray(sim)).all()
