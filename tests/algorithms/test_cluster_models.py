"""Per-cluster aggregation, the global model and compact teacher slots."""

import jax.numpy as jnp
import numpy as np

from fedjax_dd.algorithms import cluster_models


def test_aggregate_is_the_weighted_mean_per_cluster_and_keeps_unpicked():
  models = {"w": jnp.asarray([[10.0], [20.0], [30.0]])}  # K = 3
  stacked = {"w": jnp.asarray([[1.0], [2.0], [4.0]])}    # S = 3
  new, sizes = cluster_models.aggregate(
      models, stacked, jnp.asarray([0, 0, 2]), jnp.asarray([1, 3, 2]), 3)
  # Cluster 0: (1·1 + 3·2) / 4; cluster 1 unpicked: kept; cluster 2: 4.
  np.testing.assert_allclose(new["w"][:, 0], [1.75, 20.0, 4.0])
  np.testing.assert_array_equal(sizes, [4.0, 0.0, 2.0])
  largest, _ = cluster_models.global_model(new, {}, sizes, "largest")
  np.testing.assert_allclose(largest["w"], [1.75])
  average, _ = cluster_models.global_model(new, {}, sizes, "average")
  np.testing.assert_allclose(average["w"], [(4 * 1.75 + 2 * 4.0) / 6])


def test_compact_labels_number_the_present_clusters_in_order():
  np.testing.assert_array_equal(
      cluster_models.compact_labels(jnp.asarray([5, 2, 5, 7]), 8),
      [1, 0, 1, 2])
