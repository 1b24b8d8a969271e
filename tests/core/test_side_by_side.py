"""Tests of fedjax_dd.core.side_by_side."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core import side_by_side


def _train(seed: int) -> np.ndarray:
  # A small jitted loop: 20 gradient steps of least squares from its own key.
  kx, kw = jax.random.split(jax.random.PRNGKey(seed))
  x = jax.random.normal(kx, (64, 8))
  y = x @ jnp.arange(8.0)
  w = jax.random.normal(kw, (8,))
  step = jax.jit(lambda w: w - 0.05 * jax.grad(
      lambda w: jnp.mean((x @ w - y) ** 2))(w))
  for _ in range(20):
    w = step(w)
  return np.asarray(w)


def test_results_in_runs_order_and_equal_to_runs_alone():
  alone = {s: _train(s) for s in range(4)}
  runs = {f"run{s}": (lambda s=s: _train(s)) for s in range(4)}
  out = side_by_side.run_side_by_side(
      runs, workers=2, start_order=["run3", "run1", "run0", "run2"])
  assert list(out) == ["run0", "run1", "run2", "run3"]
  for s in range(4):
    np.testing.assert_array_equal(out[f"run{s}"], alone[s])


def test_two_workers_run_at_once_and_one_worker_in_start_order():
  # Both runs must be inside their body together to pass the barrier.
  barrier = threading.Barrier(2, timeout=30)
  runs = {"a": lambda: barrier.wait() is not None,
          "b": lambda: barrier.wait() is not None}
  assert side_by_side.run_side_by_side(runs, workers=2) == {"a": True,
                                                             "b": True}
  started = []
  runs = {n: (lambda n=n: n) for n in "abc"}
  out = side_by_side.run_side_by_side(runs, workers=1, start_order="cab",
                                      on_start=started.append)
  assert started == ["c", "a", "b"] and out == {"a": "a", "b": "b", "c": "c"}


def test_a_failure_stops_new_runs_and_is_raised():
  started = []
  b_failed = threading.Event()

  def a():
    assert b_failed.wait(timeout=30)
    return 1

  def b():
    b_failed.set()
    raise RuntimeError("b broke")

  runs = {"a": a, "b": b, "c": lambda: 3, "d": lambda: 4}
  with pytest.raises(RuntimeError, match="b broke"):
    side_by_side.run_side_by_side(runs, workers=2, on_start=started.append)
  # c and d never start: a thread freed by b's failure takes no new run.
  assert sorted(started) == ["a", "b"]


@pytest.mark.parametrize("workers,order,match", [
    (0, None, "workers must be an integer >= 1, got 0"),
    (True, None, "workers must be an integer >= 1, got True"),
    (2, ["a"], r"start_order must name each run once: got \['a'\]"),
    (2, ["a", "a", "b"], "start_order must name each run once"),
])
def test_bad_settings_are_refused_before_any_run(workers, order, match):
  started = []
  with pytest.raises(ValueError, match=match):
    side_by_side.run_side_by_side({"a": lambda: 1, "b": lambda: 2},
                                  workers=workers, start_order=order,
                                  on_start=started.append)
  assert not started


def test_progress_lines_carry_the_run_name(capsys):
  def run(name):
    bar = loop_lib.progress_bar(2, "rounds")
    loop_lib.report(bar)
    loop_lib.report(bar)
    bar.close()
    return name

  side_by_side.run_side_by_side({"x": lambda: run("x"),
                                 "y": lambda: run("y")}, workers=2)
  err = capsys.readouterr().err.splitlines()
  for name in "xy":
    lines = [l for l in err if l.startswith(f"{name}: rounds")]
    assert [l.split(" [")[0] for l in lines] == [f"{name}: rounds 1/2",
                                                f"{name}: rounds 2/2"]
  # Outside a side-by-side run, lines have no label.
  bar = loop_lib.progress_bar(1, "epochs")
  loop_lib.report(bar)
  assert capsys.readouterr().err.startswith("epochs 1/1")
