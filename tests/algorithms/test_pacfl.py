"""PACFL: clusters from data subspaces, per-cluster FedAvg, resume."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms.cluster_models import ClusterServing
from fedjax_dd.algorithms import pacfl as pacfl_lib
from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.algorithm import ExperimentState
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.evaluate import make_evaluator
from fedjax_dd.core.local import LocalTraining, round_decay
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import iga as iga_lib
from fedjax_dd.models.cgenerator import CGeneratorA
from tests.algorithms import kill_resume
from tests.conftest import rounds_compile_nothing, tiny_task

N = 9      # examples per client
GROUP = 3  # clients per group


def _data(seed=0):
  """Group A's images live on rows 0-1 of the 4x4 image, group B's on rows
  2-3: orthogonal subspaces (90° apart); the class c lights column c of the
  group's first row."""
  rng = np.random.default_rng(seed)
  x = np.zeros((2 * GROUP, N, 4, 4, 1), np.uint8)
  y = np.tile(np.arange(N) % 3, (2 * GROUP, 1)).astype(np.int32)
  for c in range(2 * GROUP):
    row = 0 if c < GROUP else 2
    x[c, :, row:row + 2] = rng.integers(0, 40, (N, 2, 4, 1))
    x[c, np.arange(N), row, y[c]] = 255
  return ClientData(x=x, y=y, num_examples=np.full(2 * GROUP, N, np.int32))


def _clusters(data, **kw):
  return pacfl_lib.cluster_clients(data, num_classes=3, rank=2,
                                   threshold=45.0,
                                   mapper=ClientMapper(backend="vmap"), **kw)


def test_clusters_from_orthogonal_subspaces_and_signature_traffic():
  data = _data()
  c = _clusters(data)
  np.testing.assert_array_equal(c.labels, [0, 0, 0, 1, 1, 1])
  assert c.num_clusters == 2
  # Across the groups every angle is 90°; within a group the 6-dimensional
  # class subspaces of the 8 pixels of two rows intersect (angle 0).
  np.testing.assert_allclose(c.proximity[:GROUP, GROUP:], 90.0, atol=1e-4)
  assert np.all(c.proximity[:GROUP, :GROUP] < 1.0)
  # 3 classes x 2 vectors of 16 numbers per client, 32 bits each.
  assert c.upload_bits == 2 * GROUP * 3 * 2 * 16 * 32
  fixed = _clusters(data, proximity="basis")
  np.testing.assert_array_equal(fixed.labels, c.labels)


def _alg(task, clusters, iga=None, lr_decay=1.0, **kw):
  training = LocalTraining(task, optax.sgd(0.5), batch_size=3, max_steps=3,
                           mapper=ClientMapper(backend="vmap"),
                           schedule=round_decay(lr_decay))
  serving = kw.pop("serving", ClusterServing(
      iga=iga, generator_key=jax.random.PRNGKey(5)))
  return pacfl_lib.pacfl(training, clusters=clusters, serving=serving, **kw)


def _state(alg, task, n=2 * GROUP):
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, n)
  return ExperimentState(server, clients, jax.random.PRNGKey(1),
                         jnp.asarray(0, jnp.int32))


def test_each_cluster_trains_its_own_model_and_signatures_go_once():
  task = tiny_task()
  data = jax.device_put(_data())
  clusters = _clusters(_data())
  alg = _alg(task, clusters)
  state = _state(alg, task)
  for leaf, p in zip(jax.tree_util.tree_leaves(state.server.extra["models"]),
                     jax.tree_util.tree_leaves(state.server.params)):
    np.testing.assert_array_equal(leaf[0], p)  # every cluster starts equal
    np.testing.assert_array_equal(leaf[1], p)
  num_steps = jnp.full((2 * GROUP,), 3, jnp.int32)
  opts = rounds_lib.RoundsOptions(num_rounds=1, clients_per_round=GROUP,
                                  progress=False)
  state1, ledger, rows = rounds_lib.run_rounds(alg, state, data, num_steps,
                                               opts)
  assert rows[0]["num_clusters"] == 2
  assert ledger.tag_totals()["pacfl_subspace"]["bytes_total"] == (
      clusters.upload_bits / 8)
  # A cluster's size is the examples of its sampled clients; a cluster
  # nobody sampled keeps its model.
  sizes = np.asarray(state1.server.extra["sizes"])
  members = np.asarray(clusters.labels)[np.asarray(
      rounds_lib.sample_clients(
          keys_lib.sample_and_train(
              keys_lib.round_key(state.key, 1))[0], 2 * GROUP, GROUP))]
  np.testing.assert_array_equal(sizes, [N * np.sum(members == k)
                                        for k in range(2)])
  for k in range(2):
    same = all(np.array_equal(a[k], b[k]) for a, b in zip(
        jax.tree_util.tree_leaves(state1.server.extra["models"]),
        jax.tree_util.tree_leaves(state.server.extra["models"])))
    assert same == (sizes[k] == 0)
  assert rows[0]["clusters_trained"] == np.sum(sizes > 0)
  opts = rounds_lib.RoundsOptions(num_rounds=6, clients_per_round=4,
                                  progress=False)
  state2, ledger, rows = rounds_lib.run_rounds(alg, state1, data, num_steps,
                                               opts, ledger=ledger)
  # The signatures were counted in round 1 only.
  assert ledger.tag_totals()["pacfl_subspace"]["bytes_total"] == (
      clusters.upload_bits / 8)
  assert rows[-1]["train_loss"] < 0.3
  assert np.all(np.isfinite([r["train_loss"] for r in rows]))


def test_bad_arguments():
  task = tiny_task()
  c = _clusters(_data())
  with pytest.raises(ValueError, match="global_model"):
    _alg(task, c, serving=ClusterServing(global_model="best"))
  with pytest.raises(ValueError, match="labels"):
    _alg(task, c._replace(num_clusters=1))
  with pytest.raises(ValueError, match="clustered 6"):
    _alg(task, c).init(*task.init(jax.random.PRNGKey(0)), 5)


GEN = CGeneratorA(out_shape=(4, 4, 1), nz=4, ngf=4, num_classes=3)
HP = iga_lib.IGAHyperParams(iterations=1, generator_steps=1, student_steps=1,
                            batch_size=6)


def _iga(task, cohort=4):
  return iga_lib.make_iga(task, GEN, hparams=HP, num_teachers_max=cohort,
                          mapper=ClientMapper(backend="vmap"))


@pytest.mark.parametrize("with_iga", [
    False, pytest.param(True, marks=pytest.mark.slow)])
def test_no_recompilation_across_rounds(caplog, with_iga):
  task = tiny_task(bn=True)
  data = jax.device_put(_data())
  alg = _alg(task, _clusters(_data()),
             iga=_iga(task) if with_iga else None, lr_decay=0.9)
  state, rows = rounds_compile_nothing(
      caplog, alg, _state(alg, task), data,
      jnp.full((2 * GROUP,), 3, jnp.int32), clients_per_round=4, rounds=3)
  assert int(state.round) == 3
  assert all(np.isfinite(r["train_loss"]) for r in rows)
  if with_iga:
    assert int(state.server.extra["iga"].rounds) == 3
    assert all(any(k.startswith("iga_") for k in r) for r in rows)


@pytest.mark.parametrize("with_iga", [
    False, pytest.param(True, marks=pytest.mark.slow)])
def test_killed_and_resumed_run_is_bit_identical(tmp_path, with_iga):
  task = tiny_task(bn=True)
  data = jax.device_put(_data())
  clusters = _clusters(_data())
  evaluate = make_evaluator(task, data.x.reshape(-1, 4, 4, 1),
                            data.y.reshape(-1), batch_size=18)
  opts = rounds_lib.RoundsOptions(num_rounds=3, clients_per_round=4,
                                  progress=False, eval_every=2,
                                  checkpoint_every=2)
  kill_resume.check(
      tmp_path,
      lambda tick: _alg(task, clusters, iga=_iga(task) if with_iga else None),
      lambda alg: _state(alg, task), data,
      jnp.full((2 * GROUP,), 3, jnp.int32), opts,
      [("apply", 1), ("row", 1), ("row", 2), ("apply", 1), ("row", 1)],
      evaluate=evaluate)
