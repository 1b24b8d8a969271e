"""DisUE, FedFTG and data-free FedDF: the clustered round with IGA."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms import clustered
from fedjax_dd.algorithms.disue import affinity_grouping, disue
from fedjax_dd.algorithms.fedftg import feddf_hparams, fedftg
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.algorithm import ExperimentState
from fedjax_dd.core.checkpoint import CheckpointStore
from fedjax_dd.core.evaluate import make_evaluator
from fedjax_dd.core.local import LocalTraining, steps_for, round_decay
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import iga as iga_lib
from fedjax_dd.models.cgenerator import CGeneratorA
from tests.conftest import tiny_task

GEN = CGeneratorA(out_shape=(4, 4, 1), nz=4, ngf=4, num_classes=3)
HP = iga_lib.IGAHyperParams(iterations=2, generator_steps=1, student_steps=2,
                            batch_size=8, student_lr=0.2)
COHORT = 4


def _data(num_clients=6, n=10, seed=0):
  """Two kinds of client: classes {0, 1} (even ids) and class 2 (odd)."""
  rng = np.random.default_rng(seed)
  x = np.zeros((num_clients, n, 4, 4, 1), np.uint8)
  y = np.zeros((num_clients, n), np.int32)
  for c in range(num_clients):
    labels = rng.integers(0, 2, n) if c % 2 == 0 else np.full(n, 2)
    imgs = rng.integers(0, 60, (n, 4, 4, 1))
    imgs[np.arange(n), labels, 0, 0] += 180
    x[c], y[c] = imgs, labels
  return ClientData(x=x, y=y, num_examples=np.full(num_clients, n, np.int32))


def _state(algorithm, task, num_clients):
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = algorithm.init(params, stats, num_clients)
  return ExperimentState(server, clients, jax.random.PRNGKey(1),
                         jnp.asarray(0, jnp.int32))


def _disue(task, *, grouping=None, use_iga=True, hparams=HP, **kwargs):
  num_steps = steps_for(jnp.full((6,), 10), 5, epochs=1)
  loop = (iga_lib.make_iga(task, GEN, hparams=hparams,
                           num_teachers_max=COHORT) if use_iga else None)
  alg = disue(LocalTraining(task, optax.sgd(0.1), batch_size=5,
                            max_steps=int(jnp.max(num_steps))),
              iga=loop, generator_key=jax.random.PRNGKey(5),
              grouping=grouping, **kwargs)
  return alg, num_steps


def _run(alg, task, rounds=2, store=None, state=None, evaluate=None):
  data = jax.device_put(_data())
  num_steps = steps_for(data.num_examples, 5, epochs=1)
  state = state if state is not None else _state(alg, task, 6)
  opts = rounds_lib.RoundsOptions(num_rounds=rounds, clients_per_round=COHORT,
                                  progress=False, checkpoint_every=1)
  return rounds_lib.run_rounds(alg, state, data, num_steps, opts, store=store,
                               evaluate=evaluate)


def test_disue_round_shapes_metrics_and_ledger():
  task = tiny_task(bn=True)
  alg, _ = _disue(task)
  state, ledger, rows = _run(alg, task)
  assert int(state.round) == 2
  for row in rows:
    assert 1 <= row["num_clusters"] <= COHORT
    assert row["clustering_converged"] in (0, 1)
    for k in ("train_loss", "iga_gen_loss", "iga_student_cd"):
      assert np.isfinite(row[k]), k
  groups = np.asarray(state.server.extra["groups"])
  assert groups.shape == (6,) and groups.max() < COHORT
  assert all(np.isfinite(np.asarray(a)).all()
             for a in jax.tree_util.tree_leaves(state.server.params))
  # Class counts: 3 int32 per client, the first time it is sampled.
  reported = int(np.asarray(state.server.extra["reported"]).sum())
  tags = ledger.tag_totals()
  assert tags["class_counts"]["bytes_total"] * 8 == reported * 3 * 32
  n_params = ledger_lib.num_params(state.server.params)
  assert tags["model"]["bytes_total"] * 8 == (2 * 2 - 1) * COHORT * n_params * 32


def test_affinity_grouping_separates_two_kinds_of_update():
  task = tiny_task()
  params, _ = task.init(jax.random.PRNGKey(0))
  # Updates of clients 0, 2 point one way, of 1, 3 the other way.
  signs = jnp.array([1.0, -1.0, 1.0, -1.0])
  noise = jax.random.normal(jax.random.PRNGKey(1), (4,))
  stacked = jax.tree_util.tree_map(
      lambda p: p[None] + (signs + 0.05 * noise).reshape(
          (4,) + (1,) * p.ndim) * jnp.ones_like(p)[None], params)
  rng = np.random.default_rng(0)
  for protocol in ("plain", "pcsc"):
    g = affinity_grouping(protocol=protocol)(stacked, params, jnp.ones(4), rng)
    assert g.num_groups == 2 and g.converged
    assert g.labels[0] == g.labels[2] != g.labels[1] == g.labels[3]
  assert set(g.traffic) == {("upload", "pcsc"), ("download", "pcsc")}
  assert g.traffic[("upload", "pcsc")] > g.traffic[("download", "pcsc")] > 0
  with pytest.raises(ValueError, match="protocol"):
    affinity_grouping(protocol="paillier")
  with pytest.raises(ValueError, match="similarity"):
    affinity_grouping(similarity="grad")


def test_without_iga_the_global_model_is_the_cohorts_fedavg():
  # Groups of FedAvg models weighted by their sizes give FedAvg: the same
  # model whatever the grouping.
  task = tiny_task(bn=True)
  finals = []
  for grouping in (clustered.singletons, clustered.one_group, None):
    alg, _ = _disue(task, grouping=grouping, use_iga=False)
    state, _, _ = _run(alg, task, rounds=1)
    finals.append(state.server.params)
  for other in finals[1:]:
    for a, b in zip(jax.tree_util.tree_leaves(finals[0]),
                    jax.tree_util.tree_leaves(other)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_no_recompilation_when_k_changes(caplog):
  task = tiny_task(bn=True)
  calls = []

  def varying(client_params, global_params, num_examples, rng):
    # K = 1, 2, 4 in successive rounds.
    k = (1, 2, 4)[len(calls) % 3]
    calls.append(k)
    return clustered.Groups(labels=np.arange(COHORT, dtype=np.int32) % k,
                            num_groups=k)

  alg, _ = _disue(task, grouping=varying)
  state, _, rows = _run(alg, task, rounds=1)
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    _, _, rows = _run(alg, task, rounds=3, state=state)
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
  assert [r["num_clusters"] for r in rows] == [2, 4]


def test_resume_is_bit_identical(tmp_path):
  task = tiny_task(bn=True)
  alg, _ = _disue(task)
  full, ledger_full, rows_full = _run(alg, task, rounds=3)
  with CheckpointStore(str(tmp_path / "ck")) as store:
    _run(alg, task, rounds=2, store=store)
  with CheckpointStore(str(tmp_path / "ck")) as store:
    template = _state(alg, task, 6)
    step, restored, _ = store.restore(template)
    assert step == 2
    resumed, _, rows = _run(alg, task, rounds=3, state=restored)
  for a, b in zip(jax.tree_util.tree_leaves(full),
                  jax.tree_util.tree_leaves(resumed)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # (The resumed call starts a fresh ledger: compare the per-round rows.)
  per_round = lambda rs: [{k: v for k, v in r.items()
                           if not k.endswith("_cumulative")} for r in rs]
  assert per_round(rows) == per_round(rows_full[2:])


def test_fedftg_and_datafree_feddf_run_with_clients_as_teachers():
  task = tiny_task(bn=True)
  num_steps = steps_for(jnp.full((6,), 10), 5, epochs=1)
  for hparams in (HP, feddf_hparams(HP)):
    loop = iga_lib.make_iga(task, GEN, hparams=hparams,
                            num_teachers_max=COHORT)
    alg = fedftg(LocalTraining(task, optax.sgd(0.1), batch_size=5,
                               max_steps=int(jnp.max(num_steps))), iga=loop,
                 generator_key=jax.random.PRNGKey(5))
    state, _, rows = _run(alg, task, rounds=1)
    assert rows[0]["num_clusters"] == COHORT
    assert int(rows[0]["iga_num_teachers"]) == COHORT
    assert np.isfinite(rows[0]["iga_gen_loss"])
  assert not feddf_hparams(HP).use_gls and not feddf_hparams(HP).use_gwf


def test_iga_without_generator_key_is_refused():
  task = tiny_task(bn=True)
  loop = iga_lib.make_iga(task, GEN, hparams=HP, num_teachers_max=COHORT)
  with pytest.raises(ValueError, match="generator_key"):
    disue(LocalTraining(task, optax.sgd(0.1), batch_size=5, max_steps=2),
          iga=loop, generator_key=None)


def test_lr_decay_and_augmentation_match_fedavg_without_iga():
  # One group and no IGA is FedAvg: with the same decay and augmentation
  # the two reach the same model after rounds with different factors.
  from fedjax_dd.algorithms.fedavg import fedavg
  from fedjax_dd.core.local import flip_and_crop
  task = tiny_task(bn=True)
  num_steps = steps_for(jnp.full((6,), 10), 5, epochs=1)
  training = LocalTraining(task, optax.sgd(0.1), batch_size=5,
                           max_steps=int(jnp.max(num_steps)),
                           augment=flip_and_crop(1),
                           schedule=round_decay(0.5))
  ours = clustered.clustered_distillation(
      training, grouping=clustered.one_group, iga=None)
  theirs = fedavg(training)
  a, _, _ = _run(ours, task, rounds=2)
  b, _, _ = _run(theirs, task, rounds=2)
  assert int(a.round) == int(b.round) == 2
  for x, y in zip(jax.tree_util.tree_leaves(a.server.params),
                  jax.tree_util.tree_leaves(b.server.params)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_evaluate_before_iga_is_the_model_without_iga_and_resumes(tmp_path):
  task = tiny_task(bn=True)
  alg, _ = _disue(task, evaluate_before_iga=True)
  no_iga, _ = _disue(task, use_iga=False)
  # Round 1 starts from the same ω_G, so the kept model is the −IGA round's.
  one, _, _ = _run(alg, task, rounds=1)
  ref, _, _ = _run(no_iga, task, rounds=1)
  kept = one.server.extra[rounds_lib.EVAL_MODELS]["before_iga"]
  for a, b in zip(jax.tree_util.tree_leaves((kept["params"],
                                             kept["batch_stats"])),
                  jax.tree_util.tree_leaves((ref.server.params,
                                             ref.server.batch_stats))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The rounds loop reports it beside the global model.
  data = _data()
  evaluate = make_evaluator(task, data.x.reshape(-1, 4, 4, 1),
                            data.y.reshape(-1), batch_size=20)
  full, _, rows = _run(alg, task, rounds=3, evaluate=evaluate)
  for row in rows:
    assert 0 <= row["test_accuracy_before_iga"] <= 1
    assert np.isfinite(row["test_loss_before_iga"])
  ev = evaluate(kept["params"], kept["batch_stats"])
  _, _, first_rows = _run(alg, task, rounds=1, evaluate=evaluate)
  assert first_rows[0]["test_accuracy_before_iga"] == ev["accuracy"]
  # Resume from round 2 is bit-identical, the kept model included.
  with CheckpointStore(str(tmp_path / "ck")) as store:
    _run(alg, task, rounds=2, store=store)
  with CheckpointStore(str(tmp_path / "ck")) as store:
    _, restored, _ = store.restore(_state(alg, task, 6))
    resumed, _, _ = _run(alg, task, rounds=3, state=restored)
  for a, b in zip(jax.tree_util.tree_leaves(full),
                  jax.tree_util.tree_leaves(resumed)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ValueError, match="evaluate_before_iga needs an IGA"):
    _disue(task, use_iga=False, evaluate_before_iga=True)


# The kill points: apply (a round starts), row (a row written, before its
# checkpoint), and any the builder ticks itself (DisUE: iga, mid-round).
from tests.algorithms.kill_resume import Killed as _Killed  # pylint: disable=g-import-not-at-top
from tests.algorithms.kill_resume import Plan as _Plan  # pylint: disable=g-import-not-at-top
from tests.algorithms.kill_resume import _Writer  # pylint: disable=g-import-not-at-top
from tests.algorithms.kill_resume import assert_same_run  # pylint: disable=g-import-not-at-top


def test_disue_killed_at_every_round_boundary_and_mid_iga_resumes_bit_identically(
    tmp_path):
  task = tiny_task(bn=True)
  num_steps = steps_for(jnp.full((6,), 10), 5, epochs=1)
  data = jax.device_put(_data())
  evaluate = make_evaluator(task, data.x.reshape(-1, 4, 4, 1),
                            data.y.reshape(-1), batch_size=20)
  loop = iga_lib.make_iga(task, GEN, hparams=HP, num_teachers_max=COHORT)

  def build(plan=None):
    def iga_round(*args):
      if plan is not None:
        plan.tick("iga")
      return loop.round(*args)

    alg = disue(LocalTraining(task, optax.sgd(0.1), batch_size=5,
                              max_steps=int(jnp.max(num_steps))),
                iga=loop._replace(round=iga_round),
                generator_key=jax.random.PRNGKey(5))

    def apply(*args):
      if plan is not None:
        plan.tick("apply")
      return alg.apply(*args)

    return alg._replace(apply=apply)

  opts = rounds_lib.RoundsOptions(num_rounds=3, clients_per_round=COHORT,
                                  progress=False, eval_every=2,
                                  checkpoint_every=2)

  def train(directory, plan=None):
    alg = build(plan)
    return rounds_lib.resume_and_run(
        alg, _state(alg, task, 6), data, num_steps, opts,
        writer=_Writer(directory / "metrics.jsonl", plan),
        store=CheckpointStore(str(directory / "ck"), save_every=2),
        evaluate=evaluate)

  full = train(tmp_path / "full")
  assert [r["round"] for r in full.rows] == [1, 2, 3]
  # The state carried between rounds has the avals a restore gives (the
  # client mapper's mesh is not left in them).
  for leaf in jax.tree_util.tree_leaves(full.state):
    if isinstance(leaf, jax.Array):
      assert not leaf.aval.sharding.mesh.axis_names, leaf.aval.sharding
  part = tmp_path / "part"
  for point, n in [("apply", 1),  # round 1 started
                   ("iga", 1),    # round 1's clients trained, IGA started
                   ("row", 1),    # row 1 written, no checkpoint
                   ("row", 2),    # row 2 written, its checkpoint not
                   ("apply", 1),  # restored at 2; round 3 started
                   ("iga", 1),    # mid round 3
                   ("row", 1)]:   # row 3 written, its checkpoint not
    with pytest.raises(_Killed):
      train(part, _Plan(point, n))
  assert_same_run(full, train(part))
