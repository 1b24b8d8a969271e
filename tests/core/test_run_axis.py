"""The run axis (issue 80): R runs as one vmapped program per round.

Each run of :func:`fedjax_dd.core.run_axis.fit_runs` must compute what
:func:`fedjax_dd.fit` computes for its seed, data and hyperparameters, and
a killed sweep must resume to the rows and state of an uninterrupted one.

Tolerance. Under one vmap of the runs (``run_chunk_size=None``, the
accelerators' default, which ``_sweep`` uses) the run axis batches every
client's steps into one ``[R, S, ...]`` program, where a separate run
computes per-client programs (the engine's sharded backend); XLA fuses and
orders the float32 reductions of the two programs differently, so the same
run can round differently in the last bits (a few ulp; see
tests/experiments/test_axis_sweep.py for the digits presets). Row values
are compared to ``RTOL``; integers (rounds, bytes) and the row's keys
exactly. The CPU policy's chunks of one run compute each run as ``fit``
does and are compared bit for bit. A resumed sweep against an
uninterrupted sweep runs the same program and is compared bit for bit.
"""

import json
import os

import jax
import numpy as np
import optax
import pytest

import fedjax_dd
from fedjax_dd.core import fit as fit_lib
from fedjax_dd.core import prepare as prepare_lib
from fedjax_dd.core import run_axis
from fedjax_dd.core.metrics import MetricsWriter
from fedjax_dd.core.checkpoint import CheckpointStore
from fedjax_dd.data.stacked import stack_clients
from tests.core import test_fit

RTOL = 1e-5
ATOL = 1e-6
SEEDS = (0, 1, 2)


def _tiny_dataset():
  return test_fit._tiny_dataset(num_train=40)  # pylint: disable=protected-access


def _prepared():
  return prepare_lib.prepare(_tiny_dataset(), "digits_cnn",
                             input_shape=(4, 4, 1))


def _seed_data(p, seed):
  """A partition per seed: clients of other sizes (and N_max) per run."""
  ds = p.dataset
  parts = fedjax_dd.dirichlet(ds.y_train, 4, 0.5,
                              np.random.default_rng(seed), min_size=3)
  data = stack_clients(ds.x_train, ds.y_train, parts)
  return data, fit_lib.local_steps(data, batch_size=3, epochs=1.0)


def _training(p, max_steps, lr=0.1):
  return fedjax_dd.LocalTraining(p.task, optax.sgd(lr), batch_size=3,
                                 max_steps=max_steps)


def _sweep(p, workdir, rounds=3, **kw):
  # One vmap of the runs (the accelerators' default) unless a test asks for
  # chunks; the CPU policy's chunks of one have their own tests.
  kw.setdefault("run_chunk_size", None)
  datas, steps = zip(*[_seed_data(p, s) for s in SEEDS])
  most = max(int(s.max()) for s in steps)
  algo = fedjax_dd.fedavg(_training(p, most))
  return run_axis.fit_runs(algo, p, list(datas), list(steps), seeds=SEEDS,
                           rounds=rounds, clients_per_round=2,
                           workdir=workdir, progress=False, **kw), datas, steps


def assert_rows_close(axis_rows, fit_rows):
  assert len(axis_rows) == len(fit_rows)
  for a, b in zip(axis_rows, fit_rows):
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    for k in a:
      if isinstance(b[k], float):
        np.testing.assert_allclose(a[k], b[k], rtol=RTOL, atol=ATOL,
                                   err_msg=k)
      else:
        assert a[k] == b[k], k


def test_each_run_matches_fit_of_its_seed(tmp_path):
  p = _prepared()
  result, datas, steps = _sweep(p, tmp_path / "axis")
  assert result.names == [f"seed_{s}" for s in SEEDS]
  # The per-seed partitions differ in N_max: padded on the axis.
  assert len({int(d.x.shape[1]) for d in datas}) > 1
  for i, seed in enumerate(SEEDS):
    algo = fedjax_dd.fedavg(_training(p, int(steps[i].max())))
    single = fit_lib.fit(algo, p, datas[i], steps[i], rounds=3,
                         clients_per_round=2, seed=seed,
                         workdir=tmp_path / f"fit_{seed}", progress=False)
    assert_rows_close(result.rows[i], single.rows)
    assert result.ledgers[i].to_dict() == single.ledger.to_dict()
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL),
        result.run_state(i).server.params, single.state.server.params)
    # The sweep tool's layout: WORKDIR/seed_S/metrics.jsonl.
    with open(tmp_path / "axis" / f"seed_{seed}" / "metrics.jsonl") as f:
      assert [json.loads(l) for l in f] == result.rows[i]
  assert os.listdir(tmp_path / "axis" / run_axis.CHECKPOINTS)


def test_runs_in_sequence_equal_fit_bit_for_bit(tmp_path):
  """``run_chunk_size=1`` (the CPU policy's run axis): each run inside the
  one program is the program ``fit`` runs for its seed, so its rows, ledger
  and model equal ``fit``'s bit for bit, padding to the largest ``N_max``
  of the runs included."""
  p = _prepared()
  result, datas, steps = _sweep(p, tmp_path / "axis", run_chunk_size=1)
  for i, seed in enumerate(SEEDS):
    algo = fedjax_dd.fedavg(_training(p, int(steps[i].max())))
    single = fit_lib.fit(algo, p, datas[i], steps[i], rounds=3,
                         clients_per_round=2, seed=seed,
                         workdir=tmp_path / f"fit_{seed}", progress=False)
    assert result.rows[i] == single.rows
    assert result.ledgers[i].to_dict() == single.ledger.to_dict()
    jax.tree.map(np.testing.assert_array_equal,
                 result.run_state(i).server.params, single.state.server.params)


def test_one_checkpoint_holds_every_run(tmp_path):
  p = _prepared()
  result, _, _ = _sweep(p, tmp_path / "w", rounds=2)
  store = CheckpointStore(tmp_path / "w" / run_axis.CHECKPOINTS)
  step, state, meta = store.restore(result.state)
  store.close()
  assert step == 2 and meta["runs"] == result.names
  assert len(meta["ledgers"]) == len(SEEDS)
  # Every leaf carries the run axis.
  for leaf in jax.tree_util.tree_leaves(state):
    assert leaf.shape[0] == len(SEEDS)
  np.testing.assert_array_equal(state.round, [2, 2, 2])


class Killed(Exception):
  pass


@pytest.mark.parametrize("kill", [("row", 4), ("row", 8), ("save", 2)])
def test_killed_sweep_resumes_bit_identically(tmp_path, monkeypatch, kill):
  """A kill between two runs' rows of a round (``row`` 4: run 0's round 2
  written, runs 1 and 2 not, no checkpoint), after all rows of a round
  before its checkpoint (``row`` 9 would be the same round's last), or
  right after a checkpoint (``save``) resumes to the uninterrupted rows,
  state and ledgers."""
  p = _prepared()
  full, _, _ = _sweep(p, tmp_path / "full", rounds=4)
  point, n = kill
  counts = {"row": 0, "save": 0}
  write, save = MetricsWriter.write, CheckpointStore.save

  def ticking_write(self, row):
    write(self, row)
    counts["row"] += 1
    if point == "row" and counts["row"] == n:
      raise Killed(f"row {n}")

  def ticking_save(self, *args, **kwargs):
    out = save(self, *args, **kwargs)
    counts["save"] += 1
    if point == "save" and counts["save"] == n:
      raise Killed(f"save {n}")
    return out

  monkeypatch.setattr(MetricsWriter, "write", ticking_write)
  monkeypatch.setattr(CheckpointStore, "save", ticking_save)
  with pytest.raises(Killed):
    _sweep(p, tmp_path / "part", rounds=4)
  monkeypatch.setattr(MetricsWriter, "write", write)
  monkeypatch.setattr(CheckpointStore, "save", save)
  resumed, _, _ = _sweep(p, tmp_path / "part", rounds=4)
  assert resumed.rows == full.rows
  for i in range(len(SEEDS)):
    assert [r["round"] for r in resumed.rows[i]] == [1, 2, 3, 4]
    assert resumed.ledgers[i].to_dict() == full.ledgers[i].to_dict()
  for a, b in zip(jax.tree_util.tree_leaves(full.state),
                  jax.tree_util.tree_leaves(resumed.state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_sweep_extended_continues_from_its_checkpoint(tmp_path):
  p = _prepared()
  full, _, _ = _sweep(p, tmp_path / "a", rounds=3)
  _sweep(p, tmp_path / "b", rounds=2)
  more, _, _ = _sweep(p, tmp_path / "b", rounds=3)
  assert more.rows == full.rows


def test_traced_client_learning_rate_per_run(tmp_path):
  """A grid of client rates on the axis: the builder receives each run's
  rate as a traced value (``optax.sgd`` of it)."""
  p = _prepared()
  data, steps = _seed_data(p, 0)
  most = int(steps.max())
  rates = [0.03, 0.1, 0.3]

  def build(seed, hparams):
    del seed
    return fedjax_dd.fedavg(_training(p, most, lr=hparams["client.lr"]))

  result = run_axis.fit_runs(
      build, p, data, steps, seeds=[0, 0, 0], rounds=2, clients_per_round=2,
      workdir=tmp_path / "grid", hparams={"client.lr": rates},
      names=[f"lr_{r}" for r in rates], progress=False)
  losses = []
  for i, lr in enumerate(rates):
    single = fit_lib.fit(fedjax_dd.fedavg(_training(p, most, lr=lr)), p,
                         data, steps, rounds=2, clients_per_round=2, seed=0,
                         workdir=tmp_path / f"fit_{i}", progress=False)
    assert_rows_close(result.rows[i], single.rows)
    losses.append(result.rows[i][-1]["train_loss"])
  assert len(set(losses)) == len(rates)  # the rates differ per run


def test_round_program_compiles_once(tmp_path, caplog):
  import logging  # pylint: disable=g-import-not-at-top
  p = _prepared()
  _sweep(p, tmp_path / "w", rounds=1)
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    caplog.clear()
    _sweep(p, tmp_path / "w", rounds=3)
  compiled = [r.getMessage() for r in caplog.records
              if "Compiling" in r.getMessage() and "one_run" in r.getMessage()]
  # This call's program compiles once (a new closure), not once per round.
  assert len(compiled) == 1, compiled


def test_host_logic_in_apply_is_refused_naming_the_algorithm(tmp_path):
  from fedjax_dd.algorithms.cfl import cfl  # pylint: disable=g-import-not-at-top
  p = _prepared()
  data, steps = _seed_data(p, 0)
  algo = cfl(_training(p, int(steps.max())), eps1=0.4, eps2=1.6)
  with pytest.raises(run_axis.RunAxisError, match=r"^fit_runs: cfl's apply"):
    run_axis.fit_runs(algo, p, data, steps, seeds=[0, 1], rounds=1,
                      clients_per_round=2, workdir=tmp_path / "w",
                      progress=False)
  assert not os.path.exists(tmp_path / "w" / "seed_0" / "metrics.jsonl")


def test_refusals(tmp_path):
  p = _prepared()
  data, steps = _seed_data(p, 0)
  algo = fedjax_dd.fedavg(_training(p, int(steps.max())))
  kw = dict(rounds=1, workdir=tmp_path / "w", progress=False)
  with pytest.raises(run_axis.RunAxisError, match="Bernoulli"):
    run_axis.fit_runs(algo, p, data, steps, seeds=[0, 1],
                      clients_per_round=fedjax_dd.core.cohorts.BernoulliCohort(
                          0.5), **kw)
  with pytest.raises(ValueError, match="distinct"):
    run_axis.fit_runs(algo, p, data, steps, seeds=[0, 0],
                      clients_per_round=2, **kw)
  with pytest.raises(ValueError, match="builder"):
    run_axis.fit_runs(algo, p, data, steps, seeds=[0, 1], clients_per_round=2,
                      hparams={"client.lr": [0.1, 0.2]}, **kw)
  with pytest.raises(ValueError, match="2 entries for 3 runs"):
    run_axis.fit_runs(algo, p, [data, data], steps, seeds=[0, 1, 2],
                      clients_per_round=2, **kw)


def test_split_row():
  row = {"round": 3, "run0.train_loss": 1.0, "run1.train_loss": 2.0,
         "test_accuracy": 0.5, "test_loss": 0.7,
         "test_run0.accuracy": 0.4, "test_run0.loss": 0.6,
         "test_run1.accuracy": 0.6, "test_run1.loss": 0.8,
         "test_run1.accuracy_before_iga": 0.1}
  assert run_axis.split_row(row, 2) == [
      {"round": 3, "train_loss": 1.0, "test_accuracy": 0.4,
       "test_loss": 0.6},
      {"round": 3, "train_loss": 2.0, "test_accuracy": 0.6, "test_loss": 0.8,
       "test_accuracy_before_iga": 0.1}]


def test_stack_client_data_pads_to_the_largest():
  p = _prepared()
  d0, _ = _seed_data(p, 0)
  d1, _ = _seed_data(p, 1)
  stacked = run_axis.stack_client_data([d0, d1])
  n_max = max(d0.x.shape[1], d1.x.shape[1])
  assert stacked.x.shape == (2, 4, n_max, 4, 4, 1)
  np.testing.assert_array_equal(stacked.x[0, :, :d0.x.shape[1]], d0.x)
  np.testing.assert_array_equal(stacked.num_examples[1], d1.num_examples)
  assert not np.asarray(stacked.x[0, :, d0.x.shape[1]:]).any()


def test_padding_that_would_change_a_batch_is_refused(tmp_path):
  """A batch above a run's own N_max draws N_max examples; padded to a
  larger N_max it would draw more: refused, naming the run."""
  p = _prepared()
  ds = p.dataset
  small = stack_clients(ds.x_train, ds.y_train,
                        [np.arange(i, 40, 8)[:4] for i in range(4)])
  large = stack_clients(ds.x_train, ds.y_train,
                        [np.arange(i, 40, 4) for i in range(4)])
  assert small.x.shape[1] == 4 and large.x.shape[1] == 10
  steps = fit_lib.local_steps(small, batch_size=6, steps=2)
  algo = fedjax_dd.fedavg(fedjax_dd.LocalTraining(p.task, optax.sgd(0.1),
                                                  batch_size=6, max_steps=2))
  with pytest.raises(run_axis.RunAxisError, match="run 0's largest client"):
    run_axis.fit_runs(algo, p, [small, large], [steps, steps], seeds=[0, 1],
                      rounds=1, clients_per_round=2, workdir=tmp_path / "w",
                      progress=False)


def test_time_budget_stops_every_run_and_a_resume_finishes_them(tmp_path):
  p = _prepared()
  full, _, _ = _sweep(p, tmp_path / "full", rounds=3)
  cut, _, _ = _sweep(p, tmp_path / "cut", rounds=3, max_seconds=1e-9)
  assert cut.out_of_time
  assert [[r["round"] for r in rows] for rows in cut.rows] == [[1]] * 3
  # The budget's last round is evaluated and checkpointed like any last.
  assert all("test_accuracy" in rows[-1] for rows in cut.rows)
  resumed, _, _ = _sweep(p, tmp_path / "cut", rounds=3)
  assert not resumed.out_of_time
  assert resumed.rows == full.rows
