"""A run's directory: metrics, checkpoints and the one summary.

Layout of ``Workdir(directory)``::

    metrics.jsonl        one row per round / evaluated epoch (MetricsWriter)
    checkpoints/         the rounds loop's CheckpointStore
    r<r>/clients|setup|server/   the server-side driver's stores
    stages/<name>/       cached stage outputs (distilled sets, HFLDD stages)
    summary.json         written once, at the end, from memory
    tensorboard/         optional scalars

The loops take the pieces (writer, stores) explicitly; this class only names
where they live, so a notebook can pass its own.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from fedjax_dd.core.checkpoint import CheckpointStore
from fedjax_dd.core.metrics import MetricsWriter, write_json


class Workdir:
  """Where one run's files go.

  Args:
    directory: created if missing.
    tensorboard: also write numeric metrics as TensorBoard scalars.
  """

  def __init__(self, directory: str | os.PathLike, *, tensorboard: bool = False):
    self.directory = os.fspath(directory)
    os.makedirs(self.directory, exist_ok=True)
    self._tensorboard = tensorboard
    self._writer: MetricsWriter | None = None
    self._summary_written = False

  def path(self, *parts: str) -> str:
    """``directory/parts...``."""
    return os.path.join(self.directory, *parts)

  @property
  def writer(self) -> MetricsWriter:
    """The run's metrics writer (``metrics.jsonl``)."""
    if self._writer is None:
      self._writer = MetricsWriter(
          self.path("metrics.jsonl"),
          tensorboard_dir=self.path("tensorboard") if self._tensorboard else None)
    return self._writer

  def store(self, name: str = "checkpoints", *, max_to_keep: int | None = 2,
            save_every: int = 1) -> CheckpointStore:
    """A checkpoint store under ``directory/name``."""
    return CheckpointStore(self.path(name), max_to_keep=max_to_keep,
                           save_every=save_every)

  def write_summary(self, summary: Mapping[str, Any]) -> str:
    """Writes ``summary.json`` (once per run; a second call is an error)."""
    if self._summary_written:
      raise RuntimeError(f"summary.json of {self.directory} was already written.")
    path = self.path("summary.json")
    write_json(path, summary)
    self._summary_written = True
    return path
