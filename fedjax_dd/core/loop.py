"""The library's one loop: steps with metrics, evaluation, checkpoints, budget.

Every iterated stage of the library runs through :func:`run_loop`: the rounds
of the FedAvg family (:func:`fedjax_dd.core.rounds.run_rounds`) and the server
epochs of the distillation methods (:func:`fedjax_dd.core.server.run_server`).
A stage supplies only ``step(carry, t) -> (carry, row)``; the loop adds

* the row of step ``t`` (index keys, metrics fetched from the device, the
  test accuracy every ``eval_every`` steps and at the last), written by a
  :class:`~fedjax_dd.core.metrics.MetricsWriter`;
* a checkpoint through ``save(t, carry, force)`` (forced at the last step);
* progress (``LoopOptions.progress``): a tqdm bar on a TTY, elsewhere one
  line per step (:data:`PROGRESS_LINE`);
* a wall-clock budget: the first step that ends past it is treated as the
  last (evaluated, checkpointed), so a resumed run continues from it;
* a divergence stop: a row with a non-finite number raises
  :class:`NonFiniteError` before it is written or checkpointed.

Resume is the caller's: restore ``carry`` and ``start`` from the store, and
:meth:`MetricsWriter.truncate_after` drops the rows written after it, so a
resumed loop writes exactly the rows of an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import io
import sys
import time
from typing import Any, Callable, Mapping, TypeVar

import jax
import numpy as np
import tqdm

from fedjax_dd.core import checks
from fedjax_dd.core.metrics import MetricsFileError, MetricsWriter

Carry = TypeVar("Carry")
Row = dict[str, Any]

# Evaluated figures with these prefixes are not of the test split and keep
# their own names in the row (fedjax_dd.core.personal).
ROW_PREFIXES = ("personal_",)


@dataclasses.dataclass(frozen=True)
class LoopOptions:
  """Options of :func:`run_loop`.

  Attributes:
    num_steps: the last step of the stage (a resumed loop continues to it).
    eval_every: evaluate every this many steps and at the last; 0 disables.
    progress: report each step on stderr: a tqdm bar on a TTY, else one
      line per step (:data:`PROGRESS_LINE`).
    max_seconds: wall-clock budget of this call; ``0`` means none. At least
      one step always runs.
    clock: the clock the budget is read from (injectable for tests).
    desc: what runs, the progress lines' label (e.g. ``"round"``).
    stop_on_nonfinite: raise :class:`NonFiniteError` when a step's row holds
      a NaN or infinite number; False writes it and goes on.
  """
  num_steps: int
  eval_every: int = 1
  progress: bool = True
  max_seconds: float = 0.0
  clock: Callable[[], float] = time.monotonic
  desc: str = "steps"
  stop_on_nonfinite: bool = True

  def __post_init__(self):
    checks.check_budget("max_seconds", self.max_seconds)


# One step's progress line off a TTY, in tqdm's format fields: e.g.
# "rounds 3/5 [00:04<00:03, acc=0.6120]" (elapsed < estimated time left).
PROGRESS_LINE = "{desc} {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"


# The label of the runs in this context (:func:`progress_label`).
_LABEL: contextvars.ContextVar[str] = contextvars.ContextVar(
    "fedjax_dd_progress_label", default="")


@contextlib.contextmanager
def progress_label(label: str):
  """Prefixes this context's progress lines with ``label``.

  For runs side by side in one process
  (:func:`fedjax_dd.core.side_by_side.run_side_by_side`), which then report
  in lines, also on a TTY (redrawn bars would overwrite each other).
  """
  token = _LABEL.set(label)
  try:
    yield
  finally:
    _LABEL.reset(token)


def progress_bar(total: int, desc: str, *, initial: int = 0,
                 show: bool = True) -> tqdm.tqdm:
  """A tqdm bar over ``total`` steps for :func:`report`: drawn on a TTY;
  elsewhere (or under :func:`progress_label`) kept off screen, :func:`report`
  printing its status as lines."""
  label = _LABEL.get()
  live = sys.stderr.isatty() and not label
  desc = f"{label}: {desc}" if label else desc
  bar = tqdm.tqdm(total=total, initial=initial, desc=desc,
                  disable=not show, leave=True, dynamic_ncols=True,
                  file=sys.stderr if live else io.StringIO(),
                  bar_format=None if live else PROGRESS_LINE)
  bar.as_lines = not live
  return bar


def report(bar: tqdm.tqdm, steps: int = 1) -> None:
  """Advances ``bar`` by ``steps``; off a TTY (or under
  :func:`progress_label`), prints its status as a line (a redrawn bar would
  fill a log with carriage returns)."""
  bar.update(steps)
  if not bar.disable and getattr(bar, "as_lines", not sys.stderr.isatty()):
    # One write per line: runs side by side may report at the same time.
    sys.stderr.write(f"{bar}\n")
    sys.stderr.flush()


def progress_counter(total: int, desc: str
                     ) -> Callable[..., None]:
  """``callback(done, **status)`` for a stage that reports how far it got
  (KIP's iterations): :func:`progress_bar`'s bar moved to ``done``, with
  ``status`` (e.g. ``converged=3``) beside it."""
  bar = progress_bar(total, desc)

  def callback(done: int, **status) -> None:
    bar.set_postfix(status, refresh=False)
    report(bar, done - bar.n)
    if done >= total:
      bar.close()

  return callback


class NonFiniteError(FloatingPointError):
  """A step produced a non-finite metric (training diverged).

  Attributes:
    step: the step whose row was non-finite (not written, not saved).
    keys: the non-finite entries of its row.
    last_saved: the last step checkpointed by this call (None if none).
  """

  def __init__(self, message: str, *, step: int, keys: list[str],
               last_saved: int | None):
    super().__init__(message)
    self.step, self.keys, self.last_saved = step, keys, last_saved


def check_rows(writer: MetricsWriter | None, last: int, *,
               key: str = "round", first: int = 1) -> None:
  """After a resume: the rows of steps ``first .. last`` are all there.

  A checkpoint at step ``last`` means those rows were written before it; a
  ``metrics.jsonl`` cut since would otherwise leave the summary describing
  only part of the run.

  Raises:
    MetricsFileError: rows are missing or repeated (one line, naming the
      file and the fix).
  """
  if writer is None or last < first:
    return
  steps = [r.get(key) for r in writer.rows()
           if isinstance(r.get(key), int) and first <= r.get(key) <= last]
  if steps != list(range(first, last + 1)):
    missing = sorted(set(range(first, last + 1)) - set(steps))
    what = (f"lacks the rows of {key}s {_span(missing)}" if missing else
            f"does not hold {key}s {first}..{last} once each, in order")
    raise MetricsFileError(
        f"{writer.path} {what}, which the checkpoint at {key} {last} "
        "recorded (the file was deleted, cut or edited). Restore the file, "
        "or start the run again in a new --workdir (or delete this one's "
        "checkpoints).")


def _span(values: list[int]) -> str:
  if len(values) > 3 and values == list(range(values[0], values[-1] + 1)):
    return f"{values[0]}..{values[-1]}"
  return ", ".join(map(str, values))


class ResumeRefusedError(ValueError):
  """The workdir's checkpoints answer another request than this call's
  (e.g. a finished run asked for fewer rounds than it ran)."""


class DivergedError(NonFiniteError):
  """An optimisation ended with its loss above where it started (or not
  finite): it diverged, and its result is not what the run asked for."""

  def __init__(self, message: str):
    super().__init__(message, step=-1, keys=[], last_saved=None)


def check_not_diverged(first_loss, last_loss, *, what: str,
                       advice: str, allow_rise: bool = False) -> None:
  """Stops a distillation whose loss rose past its start, as
  :func:`run_loop` stops training at a non-finite metric.

  Runs (e.g. clients) with both losses 0 (no iteration ran) are left out.

  Args:
    first_loss, last_loss: ``[C]`` host arrays, each run's first and last
      iteration's loss.
    what: the stage's name for the message (e.g. ``"fedd3: KIP"``).
    advice: what to change, appended to the message.
    allow_rise: check only that the losses are finite (DP-KIP's noised
      steps may end above the start without diverging).

  Raises:
    DivergedError: a last loss is not finite, or (unless ``allow_rise``)
      the median last loss is above the median first loss (a single run's
      noise does not count).
  """
  first = np.asarray(first_loss, np.float64).reshape(-1)
  last = np.asarray(last_loss, np.float64).reshape(-1)
  ran = (first != 0) | (last != 0)
  if not ran.any():
    return
  first, last = first[ran], last[ran]
  bad = ~np.isfinite(last) | ~np.isfinite(first)
  if bad.any():
    raise DivergedError(
        f"{what} diverged: the loss of {int(bad.sum())} of {len(last)} runs "
        f"is not finite. {advice}")
  start, end = float(np.median(first)), float(np.median(last))
  if end > start and not allow_rise:
    raise DivergedError(
        f"{what} diverged: the median loss rose from {start:.4g} at the first "
        f"iteration to {end:.4g} at the last ({int(np.sum(last > first))} of "
        f"{len(last)} runs ended above their start). {advice}")


def _non_finite(row: Mapping[str, Any]) -> list[str]:
  return sorted(k for k, v in row.items()
                if isinstance(v, float) and not np.isfinite(v))


@dataclasses.dataclass
class WallClock:
  """Wall time of this process and of the whole run across resumes.

  Each checkpoint stores :meth:`total` in its meta and a resumed run calls
  :meth:`resumed_from` with it (time after the last checkpoint of a killed
  process is not counted).

  Attributes:
    start: this process's start (``time.time()``).
    before: seconds spent by earlier processes, from the checkpoint.
  """
  start: float = dataclasses.field(default_factory=time.time)
  before: float = 0.0

  def process(self) -> float:
    """Seconds since this process started the run."""
    return time.time() - self.start

  def total(self) -> float:
    """Seconds of the run over all its processes."""
    return self.before + self.process()

  def resumed_from(self, meta: Mapping[str, Any] | None) -> None:
    """Takes the earlier processes' time from a checkpoint's meta."""
    if meta and meta.get("wall_seconds_total") is not None:
      self.before = max(self.before, float(meta["wall_seconds_total"]))


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
    evaluate: ``carry -> {"accuracy", "loss", ...}`` on the test split; each
      further key ``k`` is written as ``test_<k>``, or as ``k`` when it
      starts with one of :data:`ROW_PREFIXES`.
    writer: appends one JSON row per step.
    save: ``(t, carry, force) -> Any`` checkpoints step ``t``; ``force`` is
      True at the last step. It returns False when it skipped the step
      (e.g. :meth:`CheckpointStore.save` between ``checkpoint_every`` steps).
    on_step: called after each step with the carry and its row.

  Returns:
    A :class:`LoopResult`.

  Raises:
    NonFiniteError: a step's row held a NaN or infinite number (with
      ``options.stop_on_nonfinite``).
  """
  n = options.num_steps
  rows: list[Row] = []
  t_start = options.clock()
  out_of_time = False
  last_step = start
  last_saved = None
  bar = progress_bar(n, options.desc, initial=start, show=options.progress)
  report(bar, 0)  # before the first step, which compiles
  for t in range(start + 1, n + 1):
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
      # Further keys as documented under ``evaluate`` above.
      row.update({k if k.startswith(ROW_PREFIXES) else f"test_{k}": v
                  for k, v in ev.items() if k not in ("accuracy", "loss")})
      bar.set_postfix(acc=f"{ev['accuracy']:.4f}", refresh=False)
    bad = _non_finite(row)
    if bad and options.stop_on_nonfinite:
      bar.close()
      saved = (f"the last checkpoint written is step {last_saved}"
               if last_saved is not None else
               f"no checkpoint was written by this call (it started after "
               f"step {start})")
      raise NonFiniteError(
          f"{options.desc}: step {t} produced non-finite "
          f"{', '.join(f'{k}={row[k]}' for k in bad)}; training diverged "
          "(most often a learning rate too high for the model, or "
          f"degenerate inputs). Step {t} was not written or saved; {saved}. "
          "Lower the learning rate, or set stop_on_nonfinite=False to go on.",
          step=t, keys=bad, last_saved=last_saved)
    rows.append(row)
    if writer is not None:
      writer.write(row)
    if save is not None and save(t, carry, last) is not False:
      last_saved = t
    if on_step is not None:
      on_step(carry, row)
    report(bar)
    last_step = t
    if out_of_time:
      break
  bar.close()
  return LoopResult(carry=carry, rows=rows, last_step=last_step,
                    out_of_time=out_of_time and last_step < n)
