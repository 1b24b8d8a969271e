"""The library loop: rows, evaluation cadence, checkpoints, budget, resume."""

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core.checkpoint import CheckpointStore
from fedjax_dd.core.metrics import MetricsWriter


def _step(carry, t):
  # carry_t = 2 * carry_{t-1} + t: every step's value depends on all before.
  new = 2 * carry + t
  return new, {"value": new.astype(jnp.float32), "t_python": t}


def _evaluate(carry):
  return {"accuracy": float(carry) / 100.0, "loss": 1.0}


def test_rows_eval_cadence_and_saves(tmp_path):
  saved = []
  writer = MetricsWriter(tmp_path / "m.jsonl")
  result = loop_lib.run_loop(
      _step, jnp.asarray(0, jnp.int32),
      loop_lib.LoopOptions(num_steps=5, eval_every=2, progress=False),
      index=lambda t: {"round": t}, evaluate=_evaluate, writer=writer,
      save=lambda t, c, force: saved.append((t, int(c), force)))
  # 0 -> 1 -> 4 -> 11 -> 26 -> 57
  assert [r["value"] for r in result.rows] == [1.0, 4.0, 11.0, 26.0, 57.0]
  assert [r["round"] for r in result.rows] == [1, 2, 3, 4, 5]
  # Python values pass unchanged; device scalars become floats.
  assert result.rows[0]["t_python"] == 1 and isinstance(
      result.rows[0]["value"], float)
  # Evaluated at 2, 4 and the last step 5.
  assert [r["round"] for r in result.rows if "test_accuracy" in r] == [2, 4, 5]
  assert result.rows[-1]["test_accuracy"] == pytest.approx(0.57)
  assert saved == [(1, 1, False), (2, 4, False), (3, 11, False),
                   (4, 26, False), (5, 57, True)]
  assert writer.rows() == result.rows
  assert result.last_step == 5 and not result.out_of_time


def test_budget_stops_and_forces_last_save():
  ticks = iter(range(100))
  saved = []
  result = loop_lib.run_loop(
      _step, jnp.asarray(0, jnp.int32),
      loop_lib.LoopOptions(num_steps=10, eval_every=0, progress=False,
                           max_seconds=3, clock=lambda: next(ticks)),
      save=lambda t, c, force: saved.append((t, force)))
  # Clock reads 0 at the start, then 1, 2, 3 after steps 1..3: stop after 3.
  assert result.last_step == 3 and result.out_of_time
  assert saved[-1] == (3, True)


def test_resume_from_store_is_bit_identical(tmp_path):
  opts = loop_lib.LoopOptions(num_steps=6, eval_every=1, progress=False)
  full = loop_lib.run_loop(_step, jnp.asarray(0, jnp.int32), opts,
                           evaluate=_evaluate)

  store = CheckpointStore(tmp_path / "ckpt", save_every=2)
  writer = MetricsWriter(tmp_path / "m.jsonl")

  def killed_step(carry, t):
    if t == 4:
      raise KeyboardInterrupt  # killed during step 4 (step 3 not saved)
    return _step(carry, t)

  with pytest.raises(KeyboardInterrupt):
    loop_lib.run_loop(killed_step, jnp.asarray(0, jnp.int32), opts,
                      evaluate=_evaluate, writer=writer,
                      save=lambda t, c, f: store.save(t, {"carry": c}, force=f))
  start, saved, _ = store.restore({"carry": jnp.asarray(0, jnp.int32)})
  carry = saved["carry"]
  assert start == 2
  writer.truncate_after(start, key="step")
  rest = loop_lib.run_loop(_step, carry, opts, start=start,
                           evaluate=_evaluate, writer=writer,
                           save=lambda t, c, f: store.save(t, {"carry": c}, force=f))
  assert int(rest.carry) == int(full.carry)
  assert writer.rows() == full.rows
  assert np.asarray(store.all_steps()).tolist()[-1] == 6


def test_non_finite_row_stops_before_write_and_save(tmp_path):
  writer = MetricsWriter(tmp_path / "m.jsonl")
  saved = []

  def diverging(carry, t):
    return carry + 1, {"loss": jnp.asarray(np.nan if t == 3 else 1.0)}

  with pytest.raises(loop_lib.NonFiniteError, match="step 3.*loss=nan") as e:
    loop_lib.run_loop(diverging, jnp.asarray(0), loop_lib.LoopOptions(
        num_steps=5, progress=False), writer=writer,
                      save=lambda t, c, f: saved.append(t))
  assert e.value.step == 3 and e.value.keys == ["loss"]
  assert e.value.last_saved == 2 and saved == [1, 2]
  assert [r["step"] for r in writer.rows()] == [1, 2]
  # A non-finite test loss counts too; the option keeps going.
  with pytest.raises(loop_lib.NonFiniteError, match="test_loss"):
    loop_lib.run_loop(_step, jnp.asarray(0, jnp.int32), loop_lib.LoopOptions(
        num_steps=2, progress=False),
                      evaluate=lambda c: {"accuracy": 0.1, "loss": np.inf})
  kept = loop_lib.run_loop(diverging, jnp.asarray(0), loop_lib.LoopOptions(
      num_steps=4, progress=False, stop_on_nonfinite=False))
  assert kept.last_step == 4 and np.isnan(kept.rows[2]["loss"])


def test_wall_clock_adds_earlier_processes():
  wall = loop_lib.WallClock(start=100.0)
  assert wall.before == 0.0
  wall.resumed_from({"wall_seconds_total": 40.0})
  wall.resumed_from({"wall_seconds_total": 25.0})   # an older checkpoint
  wall.resumed_from({})                             # none recorded
  assert wall.before == 40.0
  assert wall.total() == pytest.approx(40.0 + wall.process())


def test_further_evaluation_keys_are_written_as_test_keys():
  evaluate = lambda c: {"accuracy": 0.5, "loss": 2.0,
                        "accuracy_before": float(c) / 10.0}
  result = loop_lib.run_loop(
      _step, jnp.asarray(0, jnp.int32),
      loop_lib.LoopOptions(num_steps=2, eval_every=1, progress=False),
      index=lambda t: {"round": t}, evaluate=evaluate)
  assert [(r["test_accuracy"], r["test_accuracy_before"])
          for r in result.rows] == [(0.5, 0.1), (0.5, 0.4)]


def test_a_distillation_whose_loss_rose_past_its_start_is_stopped():
  # Falling losses (one client's noise aside) pass; clients that ran no
  # iteration (both 0) are left out.
  loop_lib.check_not_diverged([0.5, 0.4, 0.3, 0.0], [0.2, 0.45, 0.1, 0.0],
                              what="KIP", advice="Lower lr.")
  loop_lib.check_not_diverged([0.0], [0.0], what="KIP", advice="")
  # The median rose (fedd3.py:smoke at kip.lr=1e8: 0.114 -> 0.5).
  with pytest.raises(loop_lib.DivergedError) as info:
    loop_lib.check_not_diverged([0.114, 0.12, 0.11], [0.5, 0.5, 0.09],
                                what="fedd3: KIP", advice="Lower lr.")
  message = str(info.value)
  assert "\n" not in message
  assert message == ("fedd3: KIP diverged: the median loss rose from 0.114 "
                     "at the first iteration to 0.5 at the last (2 of 3 runs "
                     "ended above their start). Lower lr.")
  # The entry point reports it as it reports NaN training: one line.
  assert isinstance(info.value, loop_lib.NonFiniteError)
  with pytest.raises(loop_lib.DivergedError, match="1 of 2 runs is not finite"):
    loop_lib.check_not_diverged([0.3, 0.2], [np.nan, 0.1], what="KIP",
                                advice="")


def test_progress_is_one_line_per_step_off_a_tty(capsys):
  # pytest's captured stderr is not a TTY, like a pipe or a log file.
  loop_lib.run_loop(
      _step, jnp.asarray(0, jnp.int32),
      loop_lib.LoopOptions(num_steps=3, eval_every=2, desc="round"),
      start=1, evaluate=_evaluate)
  lines = capsys.readouterr().err.splitlines()
  # Before the first step (which compiles), then after each step run:
  # the step of the total, elapsed < time left, the last test accuracy.
  assert [l.split(" [")[0] for l in lines] == [
      "round 1/3", "round 2/3", "round 3/3"]
  assert all(l.endswith("]") and "<" in l for l in lines)
  # From carry 0 after step 1: 2 * 0 + 2 = 2 (step 2), 2 * 2 + 3 = 7.
  assert "acc" not in lines[0]
  assert lines[1].endswith(", acc=0.0200]")
  assert lines[2].endswith(", acc=0.0700]")
  assert "\r" not in capsys.readouterr().err


def test_no_progress_prints_nothing(capsys):
  loop_lib.run_loop(_step, jnp.asarray(0, jnp.int32),
                    loop_lib.LoopOptions(num_steps=3, progress=False))
  assert capsys.readouterr().err == ""


def test_progress_counter_reports_how_far(capsys):
  counter = loop_lib.progress_counter(100, "KIP iteration")
  counter(40, converged=1)
  counter(100, converged=3)
  lines = capsys.readouterr().err.splitlines()
  assert [l.split(" [")[0] for l in lines] == ["KIP iteration 40/100",
                                                "KIP iteration 100/100"]
  assert lines[-1].endswith(", converged=3]")
