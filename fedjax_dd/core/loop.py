"""The library's one loop: steps with metrics, evaluation, checkpoints, budget.

Every iterated stage of the library runs through :func:`run_loop`: the rounds
of the FedAvg family (:func:`fedjax_dd.core.rounds.run_rounds`) and the server
epochs of the distillation methods (:func:`fedjax_dd.core.server.run_server`).
A stage supplies only ``step(carry, t) -> (carry, row)``; the loop adds

* the row of step ``t`` (the stage's index keys, its metrics fetched from the
  device, the test accuracy every ``eval_every`` steps and at the last);
* one :class:`~fedjax_dd.core.metrics.MetricsWriter` line per step;
* a checkpoint through ``save(t, carry, force)`` (the stage decides what one
  unit of its state is; the store writes every ``checkpoint_every`` steps and
  always at the last);
* a tqdm bar (on a TTY only);
* a wall-clock budget: the loop stops after the first step that ends past
  it and treats that step as the last (evaluated, checkpointed), so a resumed
  run continues from it.

Resume is the caller's: restore ``carry`` and the completed step ``start``
from the same store, and :meth:`MetricsWriter.truncate_after` drops rows
written after that checkpoint, so a resumed loop writes exactly the rows of an
uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable, Mapping, TypeVar

import jax
import numpy as np
import tqdm

from fedjax_dd.core.metrics import MetricsWriter

Carry = TypeVar("Carry")
Row = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class LoopOptions:
  """Options of :func:`run_loop`.

  Attributes:
    num_steps: the last step of the stage (a resumed loop continues to it).
    eval_every: evaluate every this many steps and at the last; 0 disables.
    progress: show a tqdm bar (only on a TTY).
    max_seconds: wall-clock budget of this call; ``0`` means none. At least
      one step always runs.
    clock: the clock the budget is read from (injectable for tests).
    desc: the bar's label.
  """
  num_steps: int
  eval_every: int = 1
  progress: bool = True
  max_seconds: float = 0.0
  clock: Callable[[], float] = time.monotonic
  desc: str = "steps"


@dataclasses.dataclass(frozen=True)
class LoopResult:
  """What :func:`run_loop` returns.

  Attributes:
    carry: the state after the last step run.
    rows: the rows written by this call.
    last_step: the last completed step (``start`` if none ran).
    out_of_time: the budget stopped the loop before ``num_steps``.
  """
  carry: Any
  rows: list[Row]
  last_step: int
  out_of_time: bool


def _to_host(row: Mapping[str, Any]) -> Row:
  """Device scalars become Python floats; Python values pass unchanged."""
  fetched = jax.device_get(dict(row))
  return {k: float(v) if isinstance(v, (np.ndarray, np.generic)) else v
          for k, v in fetched.items()}


def run_loop(
    step: Callable[[Carry, int], tuple[Carry, Mapping[str, Any]]],
    carry: Carry,
    options: LoopOptions,
    *,
    start: int = 0,
    index: Callable[[int], Row] = lambda t: {"step": t},
    evaluate: Callable[[Carry], Mapping[str, float]] | None = None,
    writer: MetricsWriter | None = None,
    save: Callable[[int, Carry, bool], Any] | None = None,
    on_step: Callable[[Carry, Row], None] | None = None,
) -> LoopResult:
  """Runs steps ``start + 1 .. options.num_steps`` (or fewer, see the budget).

  Args:
    step: ``(carry, t) -> (carry, row)``; ``row`` may hold device scalars
      (fetched here, which also waits for the step before the budget check).
    carry: the state after step ``start``.
    options: loop options.
    start: the last completed step.
    index: the index keys of step ``t``'s row (e.g. ``{"round": t}``).
    evaluate: ``carry -> {"accuracy", "loss"}`` on the test split.
    writer: appends one JSON row per step.
    save: ``(t, carry, force) -> Any`` checkpoints step ``t``; ``force`` is
      True at the last step.
    on_step: called after each step with the carry and its row.

  Returns:
    A :class:`LoopResult`.
  """
  n = options.num_steps
  show = options.progress and sys.stderr.isatty()
  rows: list[Row] = []
  t_start = options.clock()
  out_of_time = False
  last_step = start
  bar = tqdm.tqdm(range(start + 1, n + 1), disable=not show, initial=start,
                  total=n, desc=options.desc)
  for t in bar:
    carry, step_row = step(carry, t)
    row = dict(index(t))
    row.update(_to_host(step_row))
    out_of_time = bool(options.max_seconds) and (
        options.clock() - t_start >= options.max_seconds)
    last = t == n or out_of_time
    if evaluate is not None and options.eval_every and (
        t % options.eval_every == 0 or last):
      ev = evaluate(carry)
      row["test_accuracy"] = ev["accuracy"]
      row["test_loss"] = ev["loss"]
      bar.set_postfix(acc=f"{ev['accuracy']:.4f}")
    rows.append(row)
    if writer is not None:
      writer.write(row)
    if save is not None:
      save(t, carry, last)
    if on_step is not None:
      on_step(carry, row)
    last_step = t
    if out_of_time:
      break
  bar.close()
  return LoopResult(carry=carry, rows=rows, last_step=last_step,
                    out_of_time=out_of_time and last_step < n)
