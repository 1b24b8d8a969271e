"""IFCA: cluster selection by loss, per-cluster averaging, state round trip."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms.cluster_models import ClusterServing
from fedjax_dd.algorithms.ifca import ifca, selection_losses
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.algorithm import Cohort, ExperimentState
from fedjax_dd.core.checkpoint import CheckpointStore
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.local import LocalTraining, round_decay
from fedjax_dd.data.stacked import ClientData
from tests.algorithms import test_cfl as cfl_test
from tests.conftest import rounds_compile_nothing, tiny_task

N = 12        # examples per client
GROUP = 4     # clients per group


def _two_groups(seed=0):
  """test_cfl's two groups (one model cannot fit both), as ``(x, y)``."""
  data = cfl_test._two_groups(seed)  # pylint: disable=protected-access
  return data.x, data.y


def _cohort(x, y, steps=6):
  c = x.shape[0]
  return Cohort(x=jnp.asarray(x), y=jnp.asarray(y),
                num_examples=jnp.full((c,), N, jnp.int32),
                num_steps=jnp.full((c,), steps, jnp.int32),
                client_ids=jnp.arange(c))


def _alg(task, k=2, seed=0, lr_decay=1.0, **kw):
  training = LocalTraining(task, optax.sgd(0.5), batch_size=6, max_steps=6,
                           mapper=ClientMapper(backend="vmap"),
                           schedule=round_decay(lr_decay))
  return ifca(training, num_clusters=k,
              init_key=jax.random.PRNGKey(10 + seed), **kw)


def _picks(task, server, x, y):
  return [int(jnp.argmin(selection_losses(
      task, server.extra["models"], server.extra["batch_stats"], x[c], y[c],
      N))) for c in range(x.shape[0])]


@pytest.mark.parametrize("seed", [0, 1])
def test_permuted_groups_pick_different_models(seed):
  task = tiny_task()
  x, y = _two_groups()
  cohort = _cohort(x, y)
  alg = _alg(task, seed=seed)
  params, stats = task.init(jax.random.PRNGKey(seed))
  server, clients = alg.init(params, stats, 2 * GROUP)
  for r in range(6):
    server, clients, metrics = alg.apply(server, clients, cohort,
                                         jax.random.PRNGKey(100 + r))
  picks = _picks(task, server, x, y)
  assert len(set(picks[:GROUP])) == 1 and len(set(picks[GROUP:])) == 1
  assert picks[0] != picks[GROUP]
  assert float(metrics["cluster_0_clients"]) == GROUP
  assert float(metrics["cluster_1_clients"]) == GROUP
  assert float(metrics["train_loss"]) < 0.3
  # Equal sizes: the global model is the lower-index cluster's.
  for a, b in zip(jax.tree_util.tree_leaves(server.params),
                  jax.tree_util.tree_leaves(server.extra["models"])):
    np.testing.assert_array_equal(a, b[0])


def test_shapes_selection_and_unpicked_cluster_kept():
  task = tiny_task()
  x, y = _two_groups()
  x, y = x[:GROUP], y[:GROUP]  # one group only
  alg = _alg(task, k=3)
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, GROUP)
  assert clients == {} and alg.comm == (3, 1)
  for leaf, p in zip(jax.tree_util.tree_leaves(server.extra["models"]),
                     jax.tree_util.tree_leaves(params)):
    assert leaf.shape == (3, *p.shape)
    np.testing.assert_array_equal(leaf[0], p)   # model 0 is the given start
  losses = selection_losses(task, server.extra["models"],
                            server.extra["batch_stats"], x[0], y[0], N)
  assert losses.shape == (3,) and np.all(np.isfinite(losses))
  # Padding never counts: garbage rows past n leave the losses unchanged.
  xp = np.concatenate([x[0], np.full((5, 4, 4, 1), 255, np.uint8)])
  yp = np.concatenate([y[0], np.full((5,), 2, np.int32)])
  np.testing.assert_allclose(
      selection_losses(task, server.extra["models"],
                       server.extra["batch_stats"], xp, yp, N), losses,
      rtol=1e-6)
  before = server.extra["models"]
  new, _, metrics = alg.apply(server, clients, _cohort(x, y),
                              jax.random.PRNGKey(1))
  counts = [float(metrics[f"cluster_{j}_clients"]) for j in range(3)]
  assert sum(counts) == GROUP and all(np.isfinite(float(v))
                                      for v in metrics.values())
  for j in range(3):
    leaves = zip(jax.tree_util.tree_leaves(new.extra["models"]),
                 jax.tree_util.tree_leaves(before))
    same = all(np.array_equal(a[j], b[j]) for a, b in leaves)
    assert same == (counts[j] == 0)
  np.testing.assert_array_equal(new.extra["sizes"],
                                np.asarray(counts, np.float32) * N)


def test_average_global_model_is_the_size_weighted_mean():
  task = tiny_task()
  x, y = _two_groups()
  alg = _alg(task, serving=ClusterServing(global_model="average"))
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, 2 * GROUP)
  server, _, _ = alg.apply(server, clients, _cohort(x[:3], y[:3]),
                           jax.random.PRNGKey(1))
  w = np.asarray(server.extra["sizes"]) / float(server.extra["sizes"].sum())
  for g, m in zip(jax.tree_util.tree_leaves(server.params),
                  jax.tree_util.tree_leaves(server.extra["models"])):
    np.testing.assert_allclose(g, np.tensordot(w, np.asarray(m), axes=1),
                               rtol=1e-5, atol=1e-6)


def test_bad_arguments():
  task = tiny_task()
  with pytest.raises(ValueError, match="num_clusters"):
    _alg(task, k=0)
  with pytest.raises(ValueError, match="global_model"):
    _alg(task, serving=ClusterServing(global_model="best"))
  with pytest.raises(ValueError, match="lr_decay"):
    _alg(task, lr_decay=-1.0)


def _rounds_setup(tmp_path=None):
  task = tiny_task()
  x, y = _two_groups()
  data = jax.device_put(ClientData(x=x, y=y,
                                   num_examples=np.full(2 * GROUP, N,
                                                        np.int32)))
  num_steps = jnp.full((2 * GROUP,), 3, jnp.int32)
  alg = _alg(task, lr_decay=0.9)
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, 2 * GROUP)
  state = ExperimentState(server, clients, jax.random.PRNGKey(1),
                          jnp.asarray(0, jnp.int32))
  return alg, state, data, num_steps


def test_no_recompilation_across_rounds(caplog):
  alg, state, data, num_steps = _rounds_setup()
  state, rows = rounds_compile_nothing(caplog, alg, state, data, num_steps,
                                       clients_per_round=4)
  assert int(state.round) == 3
  assert all(np.isfinite(r["train_loss"]) for r in rows)
  assert all(r["cluster_0_clients"] + r["cluster_1_clients"] == 4
             for r in rows)


def test_checkpoint_round_trip(tmp_path):
  alg, state0, data, num_steps = _rounds_setup()
  state, _, _ = rounds_lib.run_rounds(
      alg, state0, data, num_steps,
      rounds_lib.RoundsOptions(num_rounds=2, clients_per_round=4,
                               progress=False))
  store = CheckpointStore(tmp_path / "ckpt")
  store.save(2, state, {"note": "ifca"}, force=True)
  store.close()
  store = CheckpointStore(tmp_path / "ckpt")
  step, restored, meta = store.restore(state0)
  store.close()
  assert step == 2 and meta == {"note": "ifca"}
  assert (jax.tree_util.tree_structure(restored)
          == jax.tree_util.tree_structure(state))
  for a, b in zip(jax.tree_util.tree_leaves(state),
                  jax.tree_util.tree_leaves(restored)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
