"""CFL-GP: affinity, spectral partition, model inheritance, rounds, resume."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms.cluster_models import ClusterServing
from fedjax_dd.algorithms import cfl_gp as cfl_gp_lib
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import LocalTraining, round_decay
from tests.algorithms.test_cfl import GROUP, _state, _two_groups
from tests.algorithms.test_cfl import killed_and_resumed
from tests.conftest import rounds_compile_nothing, tiny_task


def test_partition_separates_opposite_directions():
  g = np.asarray([[1.0, 0.0], [0.9, 0.1], [-1.0, 0.0], [-0.9, -0.1],
                  [1.0, 0.05]])
  labels = cfl_gp_lib.partition(g, 2)
  assert labels[0] == labels[1] == labels[4] != labels[2] == labels[3]


def test_profile_weight_by_hand():
  # K = 2, period 1: rounds 1 | 2-3 | 4 weigh 1, 1/2, 1/3.
  got = [float(cfl_gp_lib.profile_weight(t, 2, 1)) for t in (1, 2, 3, 4)]
  np.testing.assert_allclose(got, [1.0, 0.5, 0.5, 1 / 3], rtol=1e-6)


def test_inherit_takes_the_majority_old_cluster():
  # New 0 holds old {2, 2}, new 1 holds old {1}; new 2 is empty: itself.
  np.testing.assert_array_equal(
      cfl_gp_lib.inherit(np.asarray([2, 2, 1]), np.asarray([0, 0, 1]), 3),
      [2, 1, 2])
  # A tie (one member of old 0, one of old 1) goes to the lowest id.
  np.testing.assert_array_equal(
      cfl_gp_lib.inherit(np.asarray([1, 0]), np.asarray([0, 0]), 2), [0, 1])


def test_align_keeps_the_old_ids():
  # Spectral labels [1, 1, 0]: new 1 overlaps old 0 twice, so it becomes 0.
  np.testing.assert_array_equal(
      cfl_gp_lib.align(np.asarray([0, 0, 1]), np.asarray([1, 1, 0]), 2),
      [0, 0, 1])
  # All from old 0: the larger new cluster keeps id 0.
  np.testing.assert_array_equal(
      cfl_gp_lib.align(np.zeros(3, int), np.asarray([1, 0, 0]), 2),
      [1, 0, 0])


def _alg(task, lr_decay=1.0, **kw):
  kw = {"num_clusters": 2, "period": 1, "stop_round": 0, "compression": 1,
        **kw}
  training = LocalTraining(task, optax.sgd(0.5), batch_size=6, max_steps=2,
                           mapper=ClientMapper(backend="vmap"),
                           schedule=round_decay(lr_decay))
  return cfl_gp_lib.cfl_gp(training, subset_key=jax.random.PRNGKey(7), **kw)


def test_groups_with_conflicting_labels_are_partitioned():
  task = tiny_task()
  data = jax.device_put(_two_groups())
  alg = _alg(task, period=1, stop_round=2)
  state0 = _state(alg, task)
  opts = rounds_lib.RoundsOptions(num_rounds=3, clients_per_round=2 * GROUP,
                                  progress=False)
  state, _, rows = rounds_lib.run_rounds(
      alg, state0, data, jnp.full((2 * GROUP,), 2, jnp.int32), opts)
  # Rounds 1 and 2 partition; the schedule stops after stop_round = 2.
  assert [r["cfl_gp_partitioned"] for r in rows] == [1, 1, 0]
  assert [r["clustering_converged"] for r in rows] == [0, 1, 1]
  # compression 1 keeps every coordinate, in order.
  p = sum(x.size for x in jax.tree_util.tree_leaves(state0.server.params))
  np.testing.assert_array_equal(state.server.extra["feature_index"],
                                np.arange(p))
  clusters = np.asarray(state.server.extra["clusters"])
  assert len(set(clusters[:GROUP])) == 1 and len(set(clusters[GROUP:])) == 1
  assert clusters[0] != clusters[GROUP]
  # Round 1: one group keeps id 0, the other moves to id 1; round 2
  # keeps them.
  assert [r["cfl_gp_moved"] for r in rows] == [GROUP, 0, 0]
  assert np.all(np.asarray(state.server.extra["has_feature"]))
  assert rows[-1]["train_loss"] < rows[0]["train_loss"]


def test_bad_arguments():
  task = tiny_task()
  for kw, match in (({"num_clusters": 0}, "num_clusters"),
                    ({"period": 0}, "period"),
                    ({"compression": 0}, "compression"),
                    ({"stop_round": -1}, "stop_round"),
                    ({"serving": ClusterServing(global_model="best")}, "global_model")):
    with pytest.raises(ValueError, match=match):
      _alg(task, **kw)


def test_no_recompilation_across_partitions(caplog):
  task = tiny_task(bn=True)
  data = jax.device_put(_two_groups())
  alg = _alg(task, lr_decay=0.9)
  _, rows = rounds_compile_nothing(
      caplog, alg, _state(alg, task), data,
      jnp.full((2 * GROUP,), 2, jnp.int32), clients_per_round=2 * GROUP,
      rounds=2)
  assert all(r["cfl_gp_partitioned"] == 1 for r in rows)


def test_killed_and_resumed_run_is_bit_identical(tmp_path):
  full = killed_and_resumed(tmp_path, lambda task: _alg(task, period=2))
  assert sum(r["cfl_gp_partitioned"] for r in full.rows) == 2
