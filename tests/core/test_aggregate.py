"""Weighted FedAvg over the cohort and per cluster (DisUE Eq. 2)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.core.aggregate import segment_weighted_mean, weighted_mean


def _tree():
  # 4 clients; leaf "w" is [4, 2], leaf "b" is [4].
  a, b, c, d = [1.0, 2.0], [10.0, 20.0], [3.0, 4.0], [30.0, 40.0]
  return {"w": jnp.asarray([a, b, c, d], jnp.float32),
          "b": jnp.asarray([1.0, 2.0, 3.0, 4.0], jnp.float32)}


def test_weighted_mean_by_hand():
  out = weighted_mean(_tree(), jnp.asarray([1.0, 2.0, 3.0, 4.0]))
  # (1*1 + 2*10 + 3*3 + 4*30) / 10 = 150 / 10
  np.testing.assert_allclose(out["w"], [(1 + 20 + 9 + 120) / 10,
                                        (2 + 40 + 12 + 160) / 10], rtol=1e-6)
  np.testing.assert_allclose(out["b"], (1 + 4 + 9 + 16) / 10, rtol=1e-6)
  assert out["w"].shape == (2,) and out["w"].dtype == jnp.float32


def test_weighted_mean_zero_weights_give_zeros():
  out = weighted_mean(_tree(), jnp.zeros(4))
  np.testing.assert_array_equal(out["w"], [0.0, 0.0])


def test_segment_mean_by_hand():
  means, seg_w = segment_weighted_mean(
      _tree(), jnp.asarray([0, 1, 0, 1], jnp.int32),
      jnp.asarray([1.0, 2.0, 3.0, 4.0]), num_segments=4)
  # segment 0 = (1·a + 3·c) / 4, segment 1 = (2·b + 4·d) / 6.
  np.testing.assert_allclose(means["w"][0], [(1 + 9) / 4, (2 + 12) / 4])
  np.testing.assert_allclose(means["w"][1], [(20 + 120) / 6, (40 + 160) / 6])
  np.testing.assert_allclose(means["b"][:2], [(1 + 9) / 4, (4 + 16) / 6])
  # Empty segments: zeros and weight 0.
  np.testing.assert_array_equal(means["w"][2:], np.zeros((2, 2)))
  np.testing.assert_array_equal(seg_w, [4.0, 6.0, 0.0, 0.0])
  assert means["w"].shape == (4, 2) and means["b"].shape == (4,)
  assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(means))


def test_padding_clients_change_nothing():
  tree = _tree()
  ids = jnp.asarray([0, 1, 0, 1], jnp.int32)
  w = jnp.asarray([1.0, 2.0, 3.0, 4.0])
  ref, ref_w = segment_weighted_mean(tree, ids, w, num_segments=4)
  garbage = {"w": jnp.asarray([[jnp.nan, jnp.inf], [1e30, -1e30]]),
             "b": jnp.asarray([jnp.nan, 7.0])}
  padded = jax.tree_util.tree_map(lambda x, g: jnp.concatenate([x, g]), tree,
                                  garbage)
  out, out_w = segment_weighted_mean(
      padded, jnp.asarray([0, 1, 0, 1, 0, 3], jnp.int32),
      jnp.asarray([1.0, 2.0, 3.0, 4.0, 0.0, 0.0]), num_segments=4)
  for x, y in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(out)):
    np.testing.assert_array_equal(x, y)
  np.testing.assert_array_equal(ref_w, out_w)
  full = weighted_mean(padded, jnp.asarray([1.0, 2.0, 3.0, 4.0, 0.0, 0.0]))
  np.testing.assert_allclose(full["b"], 3.0)


def test_segment_mean_does_not_recompile_when_clusters_change(caplog):
  tree, w = _tree(), jnp.asarray([1.0, 2.0, 3.0, 4.0])
  segment_weighted_mean(tree, jnp.asarray([0, 1, 0, 1], jnp.int32), w,
                        num_segments=4)
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    out, seg_w = segment_weighted_mean(
        tree, jnp.asarray([0, 1, 2, 3], jnp.int32), w, num_segments=4)
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
  # Every client its own cluster: the means are the clients.
  np.testing.assert_allclose(out["w"], tree["w"])
  np.testing.assert_array_equal(seg_w, w)
