"""Affinity propagation on hand-built similarity matrices (DisUE Eq. 4)."""

import logging

import numpy as np
import pytest

from fedjax_dd.cluster.affinity import (Clusters, affinity_propagation,
                                        default_preference)


def _blocks(sizes, within=0.9, across=-0.5):
  s = sum(sizes)
  sim = np.full((s, s), across)
  start = 0
  for n in sizes:
    sim[start:start + n, start:start + n] = within
    start += n
  np.fill_diagonal(sim, 1.0)
  return sim


def _rng(seed=0):
  return np.random.default_rng(seed)


def test_two_blocks_give_two_clusters():
  out = affinity_propagation(_blocks([3, 3]), rng=_rng())
  assert isinstance(out, Clusters) and out.converged
  assert out.num_clusters == 2
  np.testing.assert_array_equal(out.labels, [0, 0, 0, 1, 1, 1])
  assert out.labels.dtype == np.int32 and out.exemplars.shape == (2,)
  # Each exemplar belongs to its own cluster.
  np.testing.assert_array_equal(out.labels[out.exemplars], [0, 1])
  np.testing.assert_array_equal(out.sizes, [3, 3])


def test_labels_follow_first_appearance():
  # Clients interleaved: 0, 2, 4 in one block, 1, 3, 5 in the other.
  order = np.array([0, 3, 1, 4, 2, 5])
  sim = _blocks([3, 3])[np.ix_(order, order)]
  out = affinity_propagation(sim, rng=_rng())
  np.testing.assert_array_equal(out.labels, [0, 1, 0, 1, 0, 1])


def test_three_blocks():
  out = affinity_propagation(_blocks([2, 3, 4], within=0.8, across=-0.2),
                             rng=_rng())
  np.testing.assert_array_equal(out.labels, [0, 0, 1, 1, 1, 2, 2, 2, 2])


def test_default_preference_is_off_diagonal_median():
  # Off-diagonal: 12 entries 0.9 and 18 entries -0.5.
  assert default_preference(_blocks([3, 3])) == -0.5


def test_one_client():
  out = affinity_propagation(np.ones((1, 1)), rng=_rng())
  np.testing.assert_array_equal(out.labels, [0])
  assert out.num_clusters == 1 and out.converged
  np.testing.assert_array_equal(out.exemplars, [0])


def test_two_clients():
  sim = np.array([[1.0, -1.0], [-1.0, 1.0]])
  # Default preference = the one off-diagonal value: one cluster.
  one = affinity_propagation(sim, rng=_rng())
  assert one.num_clusters == 1
  np.testing.assert_array_equal(one.labels, [0, 0])
  # A preference above the similarity: each client its own exemplar.
  two = affinity_propagation(sim, rng=_rng(), preference=0.0)
  np.testing.assert_array_equal(two.labels, [0, 1])
  np.testing.assert_array_equal(two.exemplars, [0, 1])


def test_identical_rows_give_one_cluster():
  out = affinity_propagation(np.ones((5, 5)), rng=_rng())
  assert out.num_clusters == 1 and out.converged
  np.testing.assert_array_equal(out.labels, np.zeros(5))


def test_every_client_its_own_exemplar():
  sim = np.full((4, 4), -1.0)
  np.fill_diagonal(sim, 1.0)
  out = affinity_propagation(sim, rng=_rng(), preference=0.0)
  assert out.num_clusters == 4
  np.testing.assert_array_equal(out.labels, [0, 1, 2, 3])
  np.testing.assert_array_equal(out.exemplars, [0, 1, 2, 3])


def test_no_convergence_falls_back_to_one_cluster(caplog):
  caplog.set_level(logging.WARNING)
  sim = _blocks([3, 3])
  sim[0, 1] = sim[1, 0] = 0.95  # client 0 has the largest total similarity
  out = affinity_propagation(sim, rng=_rng(), max_iter=2)
  assert not out.converged and out.num_clusters == 1
  np.testing.assert_array_equal(out.labels, np.zeros(6))
  np.testing.assert_array_equal(out.exemplars, [0])
  assert any("did not converge" in r.getMessage() for r in caplog.records)


def test_deterministic_given_the_rng():
  rng = np.random.default_rng(3)
  v = rng.normal(size=(12, 20))
  v /= np.linalg.norm(v, axis=1, keepdims=True)
  a = affinity_propagation(v @ v.T, rng=_rng(7))
  b = affinity_propagation(v @ v.T, rng=_rng(7))
  np.testing.assert_array_equal(a.labels, b.labels)
  assert a.to_dict() == b.to_dict()


@pytest.mark.parametrize("bad, match", [
    (np.ones((2, 3)), "square"),
    (np.ones(3), "square"),
    (np.ones((0, 0)), "square"),
    (np.array([[1.0, np.nan], [np.nan, 1.0]]), "finite"),
    (np.array([[1.0, np.inf], [0.0, 1.0]]), "finite"),
])
def test_refuses_bad_input(bad, match):
  with pytest.raises(ValueError, match=match):
    affinity_propagation(bad, rng=_rng())


def test_refuses_a_seed_instead_of_a_generator():
  with pytest.raises(TypeError, match="Generator"):
    affinity_propagation(np.eye(2), rng=0)
