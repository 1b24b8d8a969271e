"""KMeans homogeneous clusters, ClusterSampling (HFLDD Alg. 1), FedSeq groups."""

import numpy as np
import pytest

from fedjax_dd.cluster import sampling as clustering


def test_homogeneous_clusters_recovers_separated_groups_in_first_seen_order():
  feats = np.array([[0, 0], [10, 10], [0.1, 0], [10, 10.2], [-5, 20], [-5, 20.1]])
  labels = clustering.homogeneous_clusters(feats, 3, seed=0, n_init=3)
  np.testing.assert_array_equal(labels, [0, 1, 0, 1, 2, 2])


def test_more_clusters_than_distinct_rows_is_capped():
  feats = np.array([[1.0, 0.0]] * 3 + [[0.0, 1.0]] * 2)
  labels = clustering.homogeneous_clusters(feats, 10, seed=0, n_init=2)
  np.testing.assert_array_equal(labels, [0, 0, 0, 1, 1])
  one = clustering.homogeneous_clusters(np.ones((4, 3)), 5, seed=0)
  np.testing.assert_array_equal(one, [0, 0, 0, 0])


def test_homogeneous_clusters_rejects_bad_input():
  with pytest.raises(ValueError):
    clustering.homogeneous_clusters(np.array([[np.nan, 1.0]]), 1, seed=0)
  with pytest.raises(ValueError):
    clustering.homogeneous_clusters(np.zeros((3, 2)), 0, seed=0)


def test_cluster_sampling_exhaustion_order_and_sizes():
  # Homogeneous clusters: A={0,1,2}, B={3}, C={4,5}.
  homo = np.array([0, 0, 0, 1, 2, 2])
  clusters = clustering.cluster_sampling(homo, np.random.default_rng(0))
  # Pass 1 takes one of each (A, B, C); B is then empty. Pass 2 takes one of
  # A and C; C is empty. A's last client is left alone: a singleton.
  assert [len(c) for c in clusters] == [3, 2, 1]
  assert 3 in clusters[0]
  for c in clusters[:2]:
    assert len(set(homo[c])) == len(c)          # no two from one cluster
  assert homo[clusters[2][0]] == 0
  everyone = np.sort(np.concatenate(clusters))
  np.testing.assert_array_equal(everyone, np.arange(6))


def test_cluster_sampling_leftover_cluster_becomes_singletons():
  homo = np.array([0, 0, 0, 0, 0, 1])
  clusters = clustering.cluster_sampling(homo, np.random.default_rng(1))
  assert [len(c) for c in clusters] == [2, 1, 1, 1, 1]
  assert 5 in clusters[0]
  # A single homogeneous cluster: everyone is isolated.
  alone = clustering.cluster_sampling(np.zeros(3, int), np.random.default_rng(0))
  assert sorted(int(c[0]) for c in alone) == [0, 1, 2]


def test_cluster_sampling_is_deterministic_and_seed_dependent():
  homo = np.repeat(np.arange(4), 5)
  a = clustering.cluster_sampling(homo, np.random.default_rng(7))
  b = clustering.cluster_sampling(homo, np.random.default_rng(7))
  c = clustering.cluster_sampling(homo, np.random.default_rng(8))
  assert all(np.array_equal(u, v) for u, v in zip(a, b))
  assert not all(np.array_equal(u, v) for u, v in zip(a, c))
  assert [len(x) for x in a] == [4] * 5     # balanced: 5 IID-like clusters


def test_build_topology_heads_belong_to_their_cluster():
  homo = np.array([0, 0, 1, 1, 2, 2, 2])
  topo = clustering.build_topology(homo, np.random.default_rng(3))
  assert topo.num_clients == 7 and topo.num_heads == 3
  for h, head in enumerate(topo.heads):
    assert topo.heterogeneous[head] == h
  assert (topo.heterogeneous >= 0).all()
  assert topo.is_head.sum() == 3
  np.testing.assert_array_equal(np.sort(np.concatenate([topo.members, topo.heads])),
                                np.arange(7))
  np.testing.assert_array_equal(topo.head_of()[topo.heads], topo.heads)
  d = topo.to_dict()
  assert d["heterogeneous_sizes"] == [3, 3, 1] and d["num_homogeneous"] == 3
  with pytest.raises(TypeError):
    clustering.build_topology(homo, 0)


def test_diverse_groups_mix_clusters_and_cover_everyone():
  homo = np.repeat(np.arange(3), 4)           # 3 clusters of 4
  groups = clustering.diverse_groups(homo, 4, np.random.default_rng(0))
  assert [len(g) for g in groups] == [3, 3, 3, 3]
  for g in groups:
    assert sorted(homo[g]) == [0, 1, 2]
  np.testing.assert_array_equal(np.sort(np.concatenate(groups)), np.arange(12))
  uneven = clustering.diverse_groups(np.zeros(7, int), 3, np.random.default_rng(0))
  assert sorted(len(g) for g in uneven) == [2, 2, 3]
  with pytest.raises(ValueError):
    clustering.diverse_groups(homo, 13, np.random.default_rng(0))
