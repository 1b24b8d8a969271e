"""Metrics output: ``metrics.jsonl`` (one JSON object per row) and summaries."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping


def to_jsonable(value: Any) -> Any:
  """Converts NumPy/JAX scalars and arrays, tuples and mappings to JSON types."""
  if isinstance(value, Mapping):
    return {str(k): to_jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_jsonable(v) for v in value]
  if hasattr(value, "tolist"):
    return to_jsonable(value.tolist())
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


class MetricsFileError(ValueError):
  """``metrics.jsonl`` is damaged, or disagrees with the run's checkpoints
  (one line naming the file and what to do)."""


class MetricsWriter:
  """Appends rows to ``DIR/metrics.jsonl``; truncates on resume.

  Args:
    path: the JSONL file; a symbolic link is refused.
    tensorboard_dir: if set, numeric fields are also written as TensorBoard
      scalars (step = the row's ``round``) with ``tensorboardX``.
    invalidates: files that describe the rows as they were (a finished
      run's ``summary.json``): removed before the first new row is written.

  Raises:
    MetricsFileError: ``path`` is a symbolic link.
  """

  def __init__(self, path: str | os.PathLike,
               tensorboard_dir: str | os.PathLike | None = None, *,
               invalidates: tuple[str | os.PathLike, ...] = ()):
    self.path = os.fspath(path)
    check_not_linked(self.path)
    os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
    self._invalidates = tuple(os.fspath(p) for p in invalidates)
    self._describes = self._invalidates
    self._tb = None
    if tensorboard_dir is not None:
      try:
        import tensorboardX  # pylint: disable=g-import-not-at-top
      except ImportError as e:
        raise ImportError("TensorBoard output needs tensorboardX: "
                          "pip install -e '.[tensorboard]'.") from e
      self._tb = tensorboardX.SummaryWriter(os.fspath(tensorboard_dir))

  def _read(self, torn_tail_ok: bool) -> list[dict[str, Any]]:
    if not os.path.exists(self.path):
      return []
    with open(self.path) as f:
      lines = [(i, line) for i, line in enumerate(f, 1) if line.strip()]
    rows = []
    for j, (i, line) in enumerate(lines):
      try:
        row = json.loads(line)
        if not isinstance(row, dict):
          raise ValueError("not an object")
      except ValueError:
        if torn_tail_ok and j == len(lines) - 1:
          break  # Cut by a kill while written: after the last checkpoint.
        raise MetricsFileError(
            f"{self.path}: line {i} is not a JSON row (the file was cut or "
            "edited); restore the file, or start the run again in a new "
            "--workdir.") from None
      rows.append(row)
    return rows

  def rows(self) -> list[dict[str, Any]]:
    """Every row.

    Raises:
      MetricsFileError: a line is not a JSON row.
    """
    return self._read(torn_tail_ok=False)

  def truncate_after(self, round_index: int, key: str = "round") -> None:
    """Drops rows past ``round_index`` (written after the last checkpoint),
    and a last line cut short by a kill while it was written."""
    # Nothing to keep before the first step: the file is not read.
    kept = [] if round_index <= 0 else [
        r for r in self._read(torn_tail_ok=True)
        if r.get(key, 0) <= round_index]
    check_not_linked(self.path)
    write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n"
                                  for r in kept))

  def start_fresh(self, store: Any = None) -> None:
    """Empties the file for a run that starts at its first step.

    The only call that drops rows a checkpoint vouched for, so it refuses
    (keeping every row) when they belong to a run the workdir can no longer
    resume: a finished run (a file of ``invalidates`` is still there) or one
    whose committed checkpoints were all damaged (``store``'s
    :attr:`~fedjax_dd.core.checkpoint.CheckpointStore.damaged_steps`).

    Raises:
      MetricsFileError: the rows are a finished or damaged run's.
    """
    rows = self._read(torn_tail_ok=True)
    if rows:
      damaged = list(getattr(store, "damaged_steps", ()) or ())
      finished = [p for p in self._describes if os.path.exists(p)]
      if damaged or finished:
        where = getattr(store, "directory", None)
        why = (f"every committed checkpoint in {where} is damaged (steps "
               f"{', '.join(map(str, damaged))} were skipped)" if damaged
               else f"{finished[0]} says the run finished, but no "
               "checkpoint of it can be restored")
        raise MetricsFileError(
            f"{self.path} holds {len(rows)} rows of an earlier run and "
            f"{why}: starting afresh would erase them. Restore the "
            "checkpoints, or start the run again in a new --workdir "
            "(or delete this one's metrics.jsonl to start it here).")
    check_not_linked(self.path)
    write_text(self.path, "")

  def write(self, row: Mapping[str, Any]) -> None:
    for stale in self._invalidates:
      if os.path.lexists(stale):
        os.remove(stale)
    self._invalidates = ()
    check_not_linked(self.path)
    with open(self.path, "a") as f:
      f.write(json.dumps(to_jsonable(row), sort_keys=True) + "\n")
    if self._tb is not None:
      step = int(row.get("round", 0))
      for k, v in row.items():
        if isinstance(v, (int, float)) and k != "round":
          self._tb.add_scalar(k, v, global_step=step)
      self._tb.flush()


def check_not_linked(path: str) -> None:
  """Raises :class:`MetricsFileError` when the run file ``path`` is a
  symbolic link."""
  if os.path.islink(path):
    raise MetricsFileError(
        f"{path} is a symbolic link (to {os.readlink(path)}); a run writes "
        "its own files and does not follow links out of its workdir. Remove "
        "the link (copy the file in its place if it holds this run's rows) "
        "and re-run.")


def write_text(path: str | os.PathLike, text: str) -> None:
  """Writes ``text`` to ``path`` atomically (write, then rename)."""
  tmp = os.fspath(path) + ".tmp"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def write_json(path: str | os.PathLike, obj: Mapping[str, Any]) -> None:
  """Writes ``obj`` as indented JSON atomically (write, then rename)."""
  write_text(path, json.dumps(to_jsonable(obj), indent=2, sort_keys=True))
