"""The run axis in chunks (issue 80, item 5): ``fit_runs(run_chunk_size=k)``.

The round program maps the R runs in chunks of ``k`` (``lax.map`` over
chunks, each a vmap of ``k`` runs) instead of one vmap of all R, to bound
its memory. The checkpoint keeps the ``[R, ...]`` layout, so a sweep
resumes across chunk sizes.

Tolerance. XLA compiles a vmap of 3 runs and a chunk of 2 (or 1) as
different programs, which may order a float32 reduction differently: on
the CPU backend the tests run on, ``train_loss`` of the tiny sweep differs
in the last bit (relative 5e-7) and the parameters by 3e-8. Rows and
states are compared to test_run_axis' ``RTOL``/``ATOL``; integers (rounds,
bytes, ledgers) and the rows' keys exactly. A killed chunked sweep resumed
with the same chunk runs the same program and is compared bit for bit.
"""

import logging
import shutil

import jax
import numpy as np
import pytest

import fedjax_dd
from fedjax_dd.core import run_axis
from fedjax_dd.core.checks import SettingError
from fedjax_dd.core.metrics import MetricsWriter
from tests.core import test_run_axis as base


def _same_state(a, b):
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _close_state(a, b):
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=base.RTOL,
                               atol=base.ATOL)


def _close_rows(a, b):
  assert len(a) == len(b)
  for rows_a, rows_b in zip(a, b):
    base.assert_rows_close(rows_a, rows_b)


def test_chunked_runs_equal_the_unchunked_axis(tmp_path, caplog):
  p = base._prepared()  # pylint: disable=protected-access
  plain, _, _ = base._sweep(p, tmp_path / "plain")  # pylint: disable=protected-access
  caplog.set_level(logging.INFO, logger=run_axis.__name__)
  chunked, _, _ = base._sweep(p, tmp_path / "chunked", run_chunk_size=2)  # pylint: disable=protected-access
  splits = [r.getMessage() for r in caplog.records
            if r.getMessage().startswith("run axis:")]
  assert splits == ["run axis: 3 runs in chunks of 2 (2 chunks in sequence "
                    "per round, one program; the last chunk padded with 1 "
                    "copy of the last run)"]
  _close_rows(chunked.rows, plain.rows)
  for a, b in zip(chunked.ledgers, plain.ledgers):
    assert a.to_dict() == b.to_dict()
  _close_state(chunked.state, plain.state)
  np.testing.assert_array_equal(chunked.state.round, [3, 3, 3])


def test_chunks_of_one_run_traced_hyperparameters(tmp_path, capsys):
  """``run_chunk_size=1``: a ``lax.map`` with no vmap over runs; each
  run's traced client rate still reaches its builder. With progress on,
  the split is said on stderr with the progress lines."""
  p = base._prepared()  # pylint: disable=protected-access
  data, steps = base._seed_data(p, 0)  # pylint: disable=protected-access
  most = int(steps.max())
  rates = [0.03, 0.1, 0.3]

  def build(seed, hparams):
    del seed
    return fedjax_dd.fedavg(base._training(p, most, lr=hparams["client.lr"]))  # pylint: disable=protected-access

  def sweep(workdir, chunk):
    return run_axis.fit_runs(
        build, p, data, steps, seeds=[0, 0, 0], rounds=2,
        clients_per_round=2, workdir=workdir, hparams={"client.lr": rates},
        names=[f"lr_{r}" for r in rates], progress=chunk is not None,
        run_chunk_size=chunk)

  plain = sweep(tmp_path / "plain", None)
  one = sweep(tmp_path / "one", 1)
  assert ("run axis: 3 runs in chunks of 1 (3 chunks in sequence per "
          "round, one program)\n") in capsys.readouterr().err
  _close_rows(one.rows, plain.rows)
  _close_state(one.state, plain.state)
  assert len({rows[-1]["train_loss"] for rows in one.rows}) == 3


def test_a_killed_chunked_sweep_resumes_with_another_chunk(tmp_path,
                                                           monkeypatch):
  """Killed mid-round with chunks of 2: resumed with chunks of 2, the rows
  and state of an uninterrupted chunked sweep bit for bit; resumed
  unchunked, accepted (the chunk is not part of the sweep's definition, as
  ``engine.chunk_size`` is not) and equal to ``RTOL``."""
  p = base._prepared()  # pylint: disable=protected-access
  full, _, _ = base._sweep(p, tmp_path / "full", rounds=3,  # pylint: disable=protected-access
                           run_chunk_size=2)
  write = MetricsWriter.write
  count = [0]

  def ticking_write(self, row):
    write(self, row)
    count[0] += 1
    if count[0] == 5:  # round 2: run 0 and 1 written, run 2 not
      raise base.Killed("row 5")

  monkeypatch.setattr(MetricsWriter, "write", ticking_write)
  with pytest.raises(base.Killed):
    base._sweep(p, tmp_path / "part", rounds=3, run_chunk_size=2)  # pylint: disable=protected-access
  monkeypatch.setattr(MetricsWriter, "write", write)
  shutil.copytree(tmp_path / "part", tmp_path / "other")
  resumed, _, _ = base._sweep(p, tmp_path / "part", rounds=3,  # pylint: disable=protected-access
                              run_chunk_size=2)
  assert resumed.rows == full.rows
  _same_state(resumed.state, full.state)
  other, _, _ = base._sweep(p, tmp_path / "other", rounds=3)  # pylint: disable=protected-access
  _close_rows(other.rows, full.rows)
  _close_state(other.state, full.state)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_chunk_is_refused_before_compute(tmp_path, bad):
  p = base._prepared()  # pylint: disable=protected-access
  with pytest.raises(SettingError) as e:
    base._sweep(p, tmp_path / "w", run_chunk_size=bad)  # pylint: disable=protected-access
  msg = str(e.value)
  assert "\n" not in msg
  assert msg.startswith("fit_runs: run_chunk_size must be a whole number >= 1")
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("runs,chunk,line", [
    (5, 2, "run axis: 5 runs in chunks of 2 (3 chunks in sequence per round,"
     " one program; the last chunk padded with 1 copy of the last run)"),
    (4, 2, "run axis: 4 runs in chunks of 2 (2 chunks in sequence per round,"
     " one program)"),
    (3, 3, "run axis: 3 runs in one vmap per round"),
    (3, 8, "run axis: 3 runs in one vmap per round"),
])
def test_split_line(runs, chunk, line):
  assert run_axis.split_line(runs, run_axis.run_chunks(runs, chunk)) == line
