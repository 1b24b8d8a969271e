"""The rounds loop: ledger closed form, bit-identical resume, no recompiles."""

import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.algorithms.scaffold import scaffold
from fedjax_dd.core import cohorts
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.algorithm import ExperimentState
from fedjax_dd.core.checkpoint import CheckpointStore
from fedjax_dd.core.evaluate import make_evaluator
from fedjax_dd.core.local import LocalTraining, steps_for
from fedjax_dd.core.metrics import MetricsWriter
from fedjax_dd.data.stacked import ClientData
from tests.algorithms import kill_resume
from tests.conftest import rounds_compile_nothing, synthetic_clients, tiny_task


def _setup(algorithm_name="fedavg", num_clients=4):
  task = tiny_task()
  x, y, n = synthetic_clients()
  data = jax.device_put(ClientData(x=x, y=y, num_examples=n))
  num_steps = steps_for(data.num_examples, 4, epochs=1)
  max_steps = int(jnp.max(num_steps))
  if algorithm_name == "fedavg":
    alg = fedavg(LocalTraining(task, optax.sgd(0.1), batch_size=4,
                               max_steps=max_steps))
  else:
    alg = scaffold(LocalTraining(task, optax.sgd(0.1), batch_size=4,
                                 max_steps=max_steps), learning_rate=0.1)
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, num_clients)
  state = ExperimentState(server, clients, jax.random.PRNGKey(1),
                          jnp.asarray(0, jnp.int32))
  evaluate = make_evaluator(task, x.reshape(-1, 4, 4, 1), y.reshape(-1),
                            batch_size=16)
  return alg, state, data, num_steps, evaluate


def test_fedavg_ledger_matches_hfldd_eq3():
  alg, state, data, num_steps, _ = _setup()
  n_params = ledger_lib.num_params(state.server.params)
  for seed_convention, factor in [(True, 2 * 3 - 1), (False, 2 * 3)]:
    opts = rounds_lib.RoundsOptions(num_rounds=3, clients_per_round=4,
                                    progress=False,
                                    initial_model_as_seed=seed_convention)
    _, ledger, rows = rounds_lib.run_rounds(alg, state, data, num_steps, opts)
    # N * (2T - 1) * |w| * 32 bits (seed convention), N * 2T * |w| * 32 otherwise.
    assert ledger.cumulative()["bytes_total"] * 8 == 4 * factor * n_params * 32
    assert len(rows) == 3


def test_bernoulli_cohort_rows_and_ledger():
  # Each of the 4 clients joins with probability 0.5: the rows carry the
  # round's cohort size, and the ledger charges that many models each way
  # (none down in round 1: the initial model comes from the seed).
  alg, state, data, num_steps, _ = _setup()
  n_params = ledger_lib.num_params(state.server.params)
  opts = rounds_lib.RoundsOptions(
      num_rounds=6, clients_per_round=cohorts.BernoulliCohort(0.5),
      progress=False, eval_every=0)
  _, ledger, rows = rounds_lib.run_rounds(alg, state, data, num_steps, opts)
  sizes = [row["cohort_size"] for row in rows]
  assert len(set(sizes)) > 1 and all(1 <= k <= 4 for k in sizes)
  for r, (row, k) in enumerate(zip(rows, sizes), start=1):
    assert row["bytes_uploaded_round"] * 8 == k * n_params * 32
    assert row["bytes_downloaded_round"] * 8 == (r > 1) * k * n_params * 32
  fixed = rounds_lib.RoundsOptions(num_rounds=1, clients_per_round=2,
                                   progress=False, eval_every=0)
  assert "cohort_size" not in rounds_lib.run_rounds(
      alg, state, data, num_steps, fixed)[2][0]


def test_traffic_metrics_go_to_the_ledger_not_the_row():
  alg, state, data, num_steps, _ = _setup()

  def apply(server, clients, cohort, key):
    server, clients, metrics = alg.apply(server, clients, cohort, key)
    # Each sampled client reports 3 class counts of 8 bits.
    return server, clients, {**metrics,
                             "traffic/upload/class_counts": 2 * 3 * 8,
                             "traffic/download/nothing": 0}

  opts = rounds_lib.RoundsOptions(num_rounds=2, clients_per_round=2,
                                  progress=False)
  _, ledger, rows = rounds_lib.run_rounds(alg._replace(apply=apply), state,
                                          data, num_steps, opts)
  tags = ledger.tag_totals()
  assert tags["class_counts"]["bytes_total"] * 8 == 2 * 2 * 3 * 8
  assert "nothing" not in tags
  assert not any(k.startswith("traffic/") for row in rows for k in row)
  assert rows[0]["bytes_uploaded_round"] * 8 == (
      2 * ledger_lib.num_params(state.server.params) * 32 + 48)


def test_scaffold_ledger_counts_two_models_up():
  alg, state, data, num_steps, _ = _setup("scaffold")
  n_params = ledger_lib.num_params(state.server.params)
  opts = rounds_lib.RoundsOptions(num_rounds=2, clients_per_round=2,
                                  progress=False)
  _, ledger, _ = rounds_lib.run_rounds(alg, state, data, num_steps, opts)
  totals = ledger.cumulative()
  assert totals["bytes_uploaded"] * 8 == 2 * 2 * 2 * n_params * 32
  assert totals["bytes_downloaded"] * 8 == 1 * 2 * 2 * n_params * 32


@pytest.mark.parametrize("algorithm_name,cohort", [
    ("fedavg", 2), ("scaffold", 2),
    ("fedavg", cohorts.BernoulliCohort(0.5)),
    ("scaffold", cohorts.BernoulliCohort(0.5))])
def test_resume_is_bit_identical(tmp_path, algorithm_name, cohort):
  alg, state0, data, num_steps, evaluate = _setup(algorithm_name)
  # Against 5 uninterrupted rounds, killed after round 3: rows of round 4
  # were written but never checkpointed.
  full, _, resumed, full_rows, rows = kill_resume.stale_row_resume(
      tmp_path, alg, state0, data, num_steps, evaluate=evaluate,
      clients_per_round=cohort, rounds=5, killed_after=3)
  assert rows == full_rows
  for a, b in zip(jax.tree_util.tree_leaves(full),
                  jax.tree_util.tree_leaves(resumed)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_no_recompilation_between_rounds(caplog):
  alg, state, data, num_steps, evaluate = _setup("scaffold")
  opts1 = rounds_lib.RoundsOptions(num_rounds=1, clients_per_round=2,
                                   progress=False)
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    state, ledger, _ = rounds_lib.run_rounds(alg, state, data, num_steps,
                                             opts1, evaluate=evaluate)
  # The probe works: the first round does compile.
  assert any("Compiling" in r.getMessage() for r in caplog.records)
  opts = rounds_lib.RoundsOptions(num_rounds=4, clients_per_round=2,
                                  progress=False)
  with jax.log_compiles(True):
    caplog.clear()
    rounds_lib.run_rounds(alg, state, data, num_steps, opts, evaluate=evaluate,
                          ledger=ledger)
  compiles = [r.getMessage() for r in caplog.records
              if "Compiling" in r.getMessage()]
  assert not compiles, compiles


def test_invalid_clients_per_round():
  alg, state, data, num_steps, _ = _setup()
  with pytest.raises(ValueError, match="clients_per_round"):
    rounds_lib.run_rounds(alg, state, data, num_steps,
                          rounds_lib.RoundsOptions(num_rounds=1,
                                                   clients_per_round=5,
                                                   progress=False))


def test_client_sampling_is_seeded_and_without_replacement():
  a = rounds_lib.sample_clients(jax.random.PRNGKey(3), 10, 4)
  b = rounds_lib.sample_clients(jax.random.PRNGKey(3), 10, 4)
  c = rounds_lib.sample_clients(jax.random.PRNGKey(4), 10, 4)
  np.testing.assert_array_equal(a, b)
  assert len(set(np.asarray(a).tolist())) == 4 and not np.array_equal(a, c)
  np.testing.assert_array_equal(rounds_lib.sample_clients(jax.random.PRNGKey(0), 5, 5),
                                np.arange(5))


def test_per_client_evaluation_matches_global_evaluator():
  from fedjax_dd.core.evaluate import make_client_evaluator
  task = tiny_task()
  x, y, _ = synthetic_clients()
  xs, ys = x.reshape(-1, 4, 4, 1), y.reshape(-1)
  p0, s0 = task.init(jax.random.PRNGKey(0))
  p1, s1 = task.init(jax.random.PRNGKey(1))
  stacked = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), p0, p1)
  per_client = make_client_evaluator(task, xs, ys, batch_size=7)(stacked, {})
  single = make_evaluator(task, xs, ys, batch_size=7)
  for i, p in enumerate([p0, p1]):
    np.testing.assert_allclose(per_client["accuracy"][i], single(p, {})["accuracy"], rtol=1e-6)
    np.testing.assert_allclose(per_client["loss"][i], single(p, {})["loss"], rtol=1e-5)
  # Hand check: accuracy is a fraction of the 48 rows, whatever the padding.
  assert (per_client["accuracy"] * 48) == pytest.approx(np.round(per_client["accuracy"] * 48))


def test_time_budget_ends_on_an_evaluated_checkpointed_round(tmp_path):
  alg, state0, data, num_steps, evaluate = _setup()
  ticks = iter(range(0, 1000, 10))  # each clock read advances 10 "seconds"
  opts = rounds_lib.RoundsOptions(
      num_rounds=6, clients_per_round=2, progress=False, eval_every=5,
      checkpoint_every=5, max_seconds=15.0, clock=lambda: next(ticks))
  store = CheckpointStore(tmp_path / "ckpt", save_every=5)
  state, _, rows = rounds_lib.run_rounds(alg, state0, data, num_steps, opts,
                                         evaluate=evaluate, store=store)
  # Start reads 0; round 1 ends at 10 (< 15), round 2 at 20: stop there.
  assert int(state.round) == 2 and [r["round"] for r in rows] == [1, 2]
  assert "test_accuracy" not in rows[0] and "test_accuracy" in rows[1]
  store.close()
  restored, _ = rounds_lib.resume(CheckpointStore(tmp_path / "ckpt"), state0)
  assert int(restored.round) == 2


def test_no_budget_runs_all_rounds():
  alg, state0, data, num_steps, _ = _setup()
  opts = rounds_lib.RoundsOptions(num_rounds=3, clients_per_round=2,
                                  progress=False, clock=lambda: 1e9)
  state, _, rows = rounds_lib.run_rounds(alg, state0, data, num_steps, opts)
  assert int(state.round) == 3 and len(rows) == 3


def test_diverging_training_stops_keeping_the_last_good_checkpoint(tmp_path):
  from fedjax_dd.core.loop import NonFiniteError
  task = tiny_task()
  x, y, n = synthetic_clients()
  data = jax.device_put(ClientData(x=x, y=y, num_examples=n))
  num_steps = steps_for(data.num_examples, 4, epochs=1)
  # lr = 1e20 makes the first round's loss non-finite (1e6 only huge).
  alg = fedavg(LocalTraining(task, optax.sgd(1e20), batch_size=4,
                             max_steps=int(jnp.max(num_steps))))
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, 4)
  state = ExperimentState(server, clients, jax.random.PRNGKey(1),
                          jnp.asarray(0, jnp.int32))
  store = CheckpointStore(tmp_path / "ckpt")
  writer = MetricsWriter(tmp_path / "metrics.jsonl")
  with pytest.raises(NonFiniteError, match="rounds: step") as e:
    rounds_lib.run_rounds(alg, state, data, num_steps,
                          rounds_lib.RoundsOptions(num_rounds=3,
                                                   clients_per_round=4,
                                                   progress=False),
                          writer=writer, store=store)
  bad = e.value.step
  assert store.all_steps() == list(range(1, bad))[-2:]
  assert len(writer.rows()) == bad - 1


def test_resumed_run_reports_the_time_of_every_process(tmp_path):
  from fedjax_dd.core import loop as loop_lib
  alg, state0, data, num_steps, evaluate = _setup()
  opts = rounds_lib.RoundsOptions(num_rounds=3, clients_per_round=2,
                                  progress=False)
  first = loop_lib.WallClock()
  first.before = 50.0  # as if an earlier process had run 50 s
  rounds_lib.resume_and_run(alg, state0, data, num_steps, opts,
                   writer=MetricsWriter(tmp_path / "m.jsonl"),
                   store=CheckpointStore(tmp_path / "ckpt"), wall=first)
  store = CheckpointStore(tmp_path / "ckpt")
  saved = store.restore(state0)[2]["wall_seconds_total"]
  store.close()
  assert saved >= 50.0
  again = loop_lib.WallClock()
  rounds_lib.resume_and_run(alg, state0, data, num_steps, opts,
                   writer=MetricsWriter(tmp_path / "m.jsonl"),
                   store=CheckpointStore(tmp_path / "ckpt"), wall=again)
  assert again.before == saved
  assert again.total() > saved


def test_streamed_host_data_equals_device_data_and_resumes(tmp_path, caplog):
  """Client data in host memory (NumPy) is streamed one cohort at a time:
  the same bits as device-resident data, a bit-identical resume, and no
  recompilation across rounds."""
  alg, state0, data, num_steps, evaluate = _setup()
  host = ClientData(x=np.asarray(data.x), y=np.asarray(data.y),
                    num_examples=np.asarray(data.num_examples))
  ids = jnp.asarray([3, 1], jnp.int32)
  streamed = rounds_lib.gather_cohort(host, num_steps, ids)
  on_device = rounds_lib.gather_cohort(data, num_steps, ids)
  assert isinstance(streamed.x, jax.Array)
  for a, b in zip(jax.tree_util.tree_leaves(streamed),
                  jax.tree_util.tree_leaves(on_device)):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  opts = dict(clients_per_round=2, progress=False, checkpoint_every=1)
  ref, _, _ = rounds_lib.run_rounds(
      alg, state0, data, num_steps,
      rounds_lib.RoundsOptions(num_rounds=4, **opts), evaluate=evaluate)
  store = CheckpointStore(tmp_path / "ckpt", save_every=2)
  rounds_lib.run_rounds(alg, state0, host, num_steps,
                        rounds_lib.RoundsOptions(num_rounds=2, **opts),
                        evaluate=evaluate, store=store)
  store.close()
  store = CheckpointStore(tmp_path / "ckpt")
  restored, ledger = rounds_lib.resume(store, state0)
  resumed, _, _ = rounds_lib.run_rounds(
      alg, restored, host, num_steps,
      rounds_lib.RoundsOptions(num_rounds=4, **opts), evaluate=evaluate,
      ledger=ledger, store=store)
  for a, b in zip(jax.tree_util.tree_leaves(ref),
                  jax.tree_util.tree_leaves(resumed)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  rounds_compile_nothing(caplog, alg, state0, host, num_steps,
                         clients_per_round=2)


def test_evaluate_server_adds_every_extra_model():
  from fedjax_dd.core.algorithm import ServerState
  # "accuracy" is the sum of the parameters, "loss" that of the statistics.
  evaluate = lambda p, s: {"accuracy": float(sum(p)), "loss": float(sum(s))}
  server = ServerState(params=[1.0, 2.0], batch_stats=[0.5], opt_state={},
                       extra={rounds_lib.EVAL_MODELS: {
                           "a": {"params": [4.0], "batch_stats": [1.0]},
                           "b": {"params": [0.0, 7.0], "batch_stats": []}}})
  assert rounds_lib.evaluate_server(evaluate, server) == {
      "accuracy": 3.0, "loss": 0.5, "accuracy_a": 4.0, "loss_a": 1.0,
      "accuracy_b": 7.0, "loss_b": 0.0}
  plain = ServerState(params=[1.0], batch_stats=[], opt_state={}, extra={})
  assert rounds_lib.evaluate_server(evaluate, plain) == {"accuracy": 1.0,
                                                         "loss": 0.0}


def test_deleted_or_cut_metrics_of_a_checkpointed_run_stop_the_resume(
    tmp_path):
  from fedjax_dd.core import loop as loop_lib  # pylint: disable=g-import-not-at-top
  alg, state0, data, num_steps, evaluate = _setup()
  opts = rounds_lib.RoundsOptions(num_rounds=3, clients_per_round=2,
                                  progress=False, checkpoint_every=1)
  path = tmp_path / "metrics.jsonl"

  def train():
    return rounds_lib.resume_and_run(
        alg, state0, data, num_steps, opts, writer=MetricsWriter(path),
        store=CheckpointStore(tmp_path / "ck"), evaluate=evaluate)

  rows = train().rows
  assert [r["round"] for r in rows] == [1, 2, 3]
  # Deleted after the run finished: the re-run does not rewrite history.
  os.remove(path)
  with pytest.raises(loop_lib.MetricsFileError) as info:
    train()
  message = str(info.value)
  assert "\n" not in message
  assert f"{path} lacks the rows of rounds 1, 2, 3" in message
  assert "new --workdir" in message
  # Rows cut from the middle: named too.
  with open(path, "w") as f:
    f.write(json.dumps(rows[0]) + "\n" + json.dumps(rows[2]) + "\n")
  with pytest.raises(loop_lib.MetricsFileError, match="rounds 2,"):
    train()
  # A last line cut by a kill while written (after the last checkpoint,
  # round 2) is dropped and the run resumes to the same rows.
  with open(path, "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows[:2]))
    f.write(json.dumps(rows[2])[:20])
  ck = tmp_path / "ck"
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.rmtree(ck / "3")
  assert train().rows == rows
  # A damaged line elsewhere is named, not a traceback.
  with open(path, "w") as f:
    f.write(json.dumps(rows[0]) + "\n{oops\n" + json.dumps(rows[2]) + "\n")
  with pytest.raises(loop_lib.MetricsFileError, match="line 2 is not a JSON"):
    MetricsWriter(path).rows()


def test_a_finished_run_asked_for_fewer_rounds_is_refused(tmp_path):
  from fedjax_dd.core import loop as loop_lib  # pylint: disable=g-import-not-at-top
  alg, state0, data, num_steps, evaluate = _setup()

  def train(rounds):
    return rounds_lib.resume_and_run(
        alg, state0, data, num_steps,
        rounds_lib.RoundsOptions(num_rounds=rounds, clients_per_round=2,
                                 progress=False),
        writer=MetricsWriter(tmp_path / "metrics.jsonl"),
        store=CheckpointStore(tmp_path / "ck"))

  assert int(train(3).state.round) == 3
  with pytest.raises(loop_lib.ResumeRefusedError) as info:
    train(2)
  message = str(info.value)
  assert "\n" not in message
  assert "finished 3 rounds; 2 were asked for" in message
  # Says what to change from Python as well as from the command line.
  assert "fit's rounds=" in message and "--config.rounds" in message
  assert int(train(3).state.round) == 3  # the same request still resumes


def _cut_every_step(store_dir):
  for step_dir in sorted(p for p in store_dir.iterdir() if p.name.isdigit()):
    for f in sorted(step_dir.rglob("*")):
      if f.is_file() and f.name != "fedjax_dd_commit.json" and (
          f.stat().st_size > 100):
        f.write_bytes(f.read_bytes()[:10])
        break


def test_a_fresh_start_never_erases_the_rows_of_a_damaged_or_finished_run(
    tmp_path):
  # Before: with every checkpoint damaged (or checkpoints/ gone), the run
  # started again at round 0 and emptied metrics.jsonl before computing.
  from fedjax_dd.core import loop as loop_lib  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  alg, state0, data, num_steps, evaluate = _setup()
  opts = rounds_lib.RoundsOptions(num_rounds=2, clients_per_round=2,
                                  progress=False)
  path = tmp_path / "metrics.jsonl"
  summary = tmp_path / "summary.json"

  def train():
    return rounds_lib.resume_and_run(
        alg, state0, data, num_steps, opts,
        writer=MetricsWriter(path, invalidates=(summary,)),
        store=CheckpointStore(tmp_path / "ck"), evaluate=evaluate)

  rows = train().rows
  kept = path.read_text()
  assert [r["round"] for r in rows] == [1, 2]
  _cut_every_step(tmp_path / "ck")
  with pytest.raises(loop_lib.MetricsFileError) as info:
    train()
  message = str(info.value)
  assert "\n" not in message
  assert "holds 2 rows of an earlier run" in message
  assert "(steps 2, 1 were skipped)" in message
  assert path.read_text() == kept
  # A finished run (its summary) whose checkpoints are gone: refused too.
  shutil.rmtree(tmp_path / "ck")
  summary.write_text("{}")
  with pytest.raises(loop_lib.MetricsFileError,
                     match="says the run finished, but no checkpoint"):
    train()
  assert path.read_text() == kept
  # Rows of a run killed before its first checkpoint are rewritten: the
  # explicit fresh start.
  summary.unlink()
  assert train().rows == rows


def test_the_engine_numbers_the_rounds_an_algorithm_reads(tmp_path):
  # The rounds loop owns the round: cohort.round is the 0-based index of the
  # round it runs (rows number it + 1), on a fresh run and on a resumed one,
  # and the algorithm's state holds no counter of its own.
  from fedjax_dd.core.algorithm import FederatedAlgorithm, ServerState
  seen = []

  def init(params, batch_stats, num_clients):
    del num_clients
    return ServerState(params, batch_stats, ()), {}

  def apply(server, clients, cohort, key):
    del key
    seen.append(int(cohort.round))
    return server, clients, {"train_loss": jnp.float32(cohort.round)}

  alg = FederatedAlgorithm(init=init, apply=apply)
  task = tiny_task()
  x, y, n = synthetic_clients()
  data = jax.device_put(ClientData(x=x, y=y, num_examples=n))
  num_steps = steps_for(data.num_examples, 4, epochs=1)
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, 4)
  state = ExperimentState(server, clients, jax.random.PRNGKey(1),
                          jnp.asarray(0, jnp.int32))
  opts = rounds_lib.RoundsOptions(num_rounds=2, clients_per_round=2,
                                  eval_every=0, progress=False)
  state, _, rows = rounds_lib.run_rounds(alg, state, data, num_steps, opts)
  assert seen == [0, 1] and [r["train_loss"] for r in rows] == [0.0, 1.0]
  later = rounds_lib.RoundsOptions(num_rounds=4, clients_per_round=2,
                                   eval_every=0, progress=False)
  state, _, rows = rounds_lib.run_rounds(alg, state, data, num_steps, later)
  assert seen == [0, 1, 2, 3] and [r["round"] for r in rows] == [3, 4]
  assert int(state.round) == 4 and state.server.extra == {}
