"""CFL: split statistics, bi-partition, the cluster tree, resume."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms.cluster_models import ClusterServing
from fedjax_dd.algorithms import cfl as cfl_lib
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.algorithm import ExperimentState
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import LocalTraining, round_decay
from fedjax_dd.data.stacked import ClientData
from tests.algorithms import kill_resume
from tests.conftest import rounds_compile_nothing, tiny_task

N = 12     # examples per client
GROUP = 4  # clients per group


def test_statistics_by_hand():
  updates = jnp.asarray([[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [0.0, 2.0],
                         [5.0, 5.0]])
  has = jnp.asarray([True, True, True, True, False])
  weights = jnp.asarray([1.0, 1.0, 1.0, 3.0, 7.0])
  clusters = jnp.asarray([0, 0, 0, 1, 0])
  s = cfl_lib.statistics(updates, has, weights, clusters, 3)
  # Cluster 0: mean (1 + 1 - 1)/3 = 1/3 along x (client 4 has no update).
  np.testing.assert_allclose(s.mean_norm, [1 / 3, 2.0, 0.0], rtol=1e-6)
  np.testing.assert_allclose(s.max_norm, [1.0, 2.0, 0.0])
  np.testing.assert_array_equal(s.count, [3, 1, 0])
  np.testing.assert_allclose(s.similarity[:4, :4],
                             [[1, 1, -1, 0], [1, 1, -1, 0], [-1, -1, 1, 0],
                              [0, 0, 0, 1]], atol=1e-6)


def test_split_clusters_follows_the_criterion():
  sim = np.asarray([[1, .9, -.8, -.9], [.9, 1, -.9, -.8], [-.8, -.9, 1, .9],
                    [-.9, -.8, .9, 1]])
  stats = cfl_lib.ClusterStats(mean_norm=np.asarray([0.1, 0.0]),
                               max_norm=np.asarray([2.0, 0.0]),
                               count=np.asarray([4, 0]), similarity=sim)
  clusters = np.zeros(4, np.int32)
  has = np.ones(4, bool)
  new, splits = cfl_lib.split_clusters(stats, clusters, has, 1, eps1=0.4,
                                       eps2=1.6, max_clusters=4)
  np.testing.assert_array_equal(new, [0, 0, 1, 1])
  assert splits == [(0, 1)]
  # Not stationary (mean norm >= eps1), too small an update, or at K_max:
  # no split.
  for kw in ({"eps1": 0.05, "eps2": 1.6}, {"eps1": 0.4, "eps2": 2.5}):
    assert cfl_lib.split_clusters(stats, clusters, has, 1, max_clusters=4,
                                  **kw)[1] == []
  assert cfl_lib.split_clusters(stats, clusters, has, 1, eps1=0.4, eps2=1.6,
                                max_clusters=1)[1] == []


def _two_groups(seed=0):
  """8 clients; the image of class c has pixel (c, 0) lit. Group A labels
  it c, group B (c + 1) mod 3: their updates point apart."""
  rng = np.random.default_rng(seed)
  x = rng.integers(0, 40, (2 * GROUP, N, 4, 4, 1)).astype(np.uint8)
  y = np.zeros((2 * GROUP, N), np.int32)
  cls = np.arange(N) % 3
  for c in range(2 * GROUP):
    x[c, np.arange(N), cls, 0, 0] = 255
    y[c] = cls if c < GROUP else (cls + 1) % 3
  return ClientData(x=x, y=y, num_examples=np.full(2 * GROUP, N, np.int32))


def _alg(task, lr_decay=1.0, **kw):
  kw = {"eps1": 100.0, "eps2": 0.0, "warmup": 1, "max_clusters": 2, **kw}
  training = LocalTraining(task, optax.sgd(0.5), batch_size=6, max_steps=2,
                           mapper=ClientMapper(backend="vmap"),
                           schedule=round_decay(lr_decay))
  return cfl_lib.cfl(training, **kw)


def _state(alg, task):
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, 2 * GROUP)
  return ExperimentState(server, clients, jax.random.PRNGKey(1),
                         jnp.asarray(0, jnp.int32))


def test_groups_with_conflicting_labels_split_in_two():
  task = tiny_task()
  data = jax.device_put(_two_groups())
  alg = _alg(task)
  state = _state(alg, task)
  num_steps = jnp.full((2 * GROUP,), 2, jnp.int32)
  opts = rounds_lib.RoundsOptions(num_rounds=3, clients_per_round=2 * GROUP,
                                  progress=False)
  state, _, rows = rounds_lib.run_rounds(alg, state, data, num_steps, opts)
  # Round 1 is the warm-up; round 2 splits the one cluster by the groups.
  assert [r["cfl_splits"] for r in rows] == [0, 1, 0]
  assert [r["num_clusters"] for r in rows] == [1, 2, 2]
  extra = state.server.extra
  np.testing.assert_array_equal(extra["clusters"], [0] * GROUP + [1] * GROUP)
  np.testing.assert_array_equal(extra["parent"], [-1, 0])
  np.testing.assert_array_equal(extra["split_round"], [-1, 2])
  assert rows[-1]["train_loss"] < rows[0]["train_loss"]


def test_bad_arguments():
  task = tiny_task()
  with pytest.raises(ValueError, match="max_clusters"):
    _alg(task, max_clusters=0)
  with pytest.raises(ValueError, match="global_model"):
    _alg(task, serving=ClusterServing(global_model="best"))


def test_no_recompilation_across_a_split(caplog):
  task = tiny_task(bn=True)
  data = jax.device_put(_two_groups())
  # No warm-up: round 1 compiles and splits the root; round 2 splits both
  # children (4 members each) under the compile log; then K = K_max.
  alg = _alg(task, warmup=0, max_clusters=4, lr_decay=0.9)
  state, rows = rounds_compile_nothing(
      caplog, alg, _state(alg, task), data,
      jnp.full((2 * GROUP,), 2, jnp.int32), clients_per_round=2 * GROUP,
      rounds=4)
  assert [r["cfl_splits"] for r in rows] == [2, 0, 0]
  assert int(state.server.extra["num_clusters"]) == 4


def killed_and_resumed(tmp_path, build):
  """:func:`kill_resume.check` of ``build(task)`` on :func:`_two_groups`,
  6 clients a round, killed at four points; the uninterrupted run."""
  task = tiny_task(bn=True)
  data = jax.device_put(_two_groups())
  evaluate, opts = kill_resume.evaluated_options(task, data,
                                                 clients_per_round=6)
  return kill_resume.check(
      tmp_path, lambda tick: build(task), lambda alg: _state(alg, task),
      data, jnp.full((2 * GROUP,), 2, jnp.int32), opts,
      [("apply", 1), ("row", 2), ("apply", 2), ("row", 1)],
      evaluate=evaluate)


def test_killed_and_resumed_run_is_bit_identical(tmp_path):
  full = killed_and_resumed(
      tmp_path, lambda task: _alg(task, warmup=2, max_clusters=3))
  assert sum(r["cfl_splits"] for r in full.rows) >= 1


@pytest.mark.parametrize("eps", [{"eps1": -0.1}, {"eps2": -1.0},
                                 {"eps1": float("inf")}])
def test_cfl_refuses_thresholds_no_norm_can_meet(eps):
  # Before: a negative eps1 was accepted and CFL silently never split.
  name = next(iter(eps))
  with pytest.raises(ValueError, match=rf"^CFL {name} must be a finite "
                     r"number >= 0, got "):
    _alg(tiny_task(), **eps)
