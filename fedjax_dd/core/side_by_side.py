"""Independent runs side by side in one process, on a few threads.

A comparison (the quickstart's systems) is a set of runs that share nothing
but the process. Much of a small run's time is single-core compilation and
tracing, so runs on several threads overlap one's compilation with another's
compute. Every run computes what it computes alone: its programs, inputs and
their order are its own. Each run's progress lines carry its name
(:func:`fedjax_dd.core.loop.progress_label`).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
from typing import Callable, Mapping, Sequence, TypeVar

from fedjax_dd.core import loop as loop_lib

T = TypeVar("T")


def check_runs(names: Sequence[str], workers: int,
               start_order: Sequence[str] | None = None) -> list[str]:
  """The start order of runs ``names``, checked as :func:`run_side_by_side`
  checks it (callers check before they load anything).

  Raises:
    ValueError: ``workers`` is not an integer ``>= 1``, or ``start_order``
      does not name each run exactly once.
  """
  if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
    raise ValueError(f"workers must be an integer >= 1, got {workers!r}.")
  order = list(names) if start_order is None else list(start_order)
  if sorted(order) != sorted(names) or len(set(order)) != len(order):
    raise ValueError(
        f"start_order must name each run once: got {order}, runs "
        f"{list(names)}.")
  return order


def run_side_by_side(runs: Mapping[str, Callable[[], T]], *, workers: int,
                     start_order: Sequence[str] | None = None,
                     on_start: Callable[[str], None] | None = None
                     ) -> dict[str, T]:
  """Runs each of ``runs`` once, ``workers`` at a time.

  Args:
    runs: name -> ``() -> result``; the runs must not depend on each other.
    workers: how many run at once (``1``: one after the other, in
      ``start_order``, on this thread).
    start_order: the order in which runs start (default: ``runs``' order).
      Longest first keeps the threads busy to the end.
    on_start: called with a run's name as it starts (e.g. a progress line).

  Returns:
    name -> result, in ``runs``' order.

  Raises:
    ValueError: ``workers < 1``, or ``start_order`` is not an order of
      ``runs``' names (before any run starts).
    Exception: the first failure's exception (by start order among runs
      that end together), after the running runs have ended; no run starts
      after it.
  """
  order = check_runs(list(runs), workers, start_order)

  def one(name: str) -> T:
    if on_start is not None:
      on_start(name)
    if workers == 1:
      return runs[name]()
    with loop_lib.progress_label(name):
      return runs[name]()

  if workers == 1:
    done = {name: one(name) for name in order}
    return {name: done[name] for name in runs}
  pending, running, results = list(order), {}, {}
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    while pending or running:
      # Start only on a free thread, so that none starts after a failure.
      while pending and len(running) < workers:
        name = pending.pop(0)
        # In a copy of this context: the run's own progress label.
        running[pool.submit(contextvars.copy_context().run, one,
                            name)] = name
      done, _ = concurrent.futures.wait(
          running, return_when=concurrent.futures.FIRST_COMPLETED)
      for f in sorted(done, key=lambda f: order.index(running[f])):
        results[running.pop(f)] = f.result()  # a failure raises here
  return {name: results[name] for name in runs}
