"""A run's directory: metrics, checkpoints and the one summary.

Layout of ``Workdir(directory)``::

    metrics.jsonl        one row per round / evaluated epoch (MetricsWriter)
    checkpoints/         the rounds loop's CheckpointStore
    r<r>/clients|setup|server/   the server-side driver's stores
    stages/<name>/       cached stage outputs (distilled sets, HFLDD stages)
    summary.json         written once, at the end, from memory
    tensorboard/         optional scalars
    .lock                held by the one process running in it (WorkdirLock)

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


class WorkdirBusyError(RuntimeError):
  """Another live process holds the run directory."""


class WorkdirLock:
  """An exclusive lock on a run directory, held for the life of a run.

  Two processes writing one workdir would each delete the other's
  checkpoints and write every metrics row twice, so the second one must fail
  at once. The lock is ``fcntl.flock`` on ``directory/.lock``: the kernel
  drops it when its process dies, so a lock left by a killed run is never
  stale. The file records the holder's host and pid for the message.

  Example::

      with WorkdirLock(workdir):
        run(...)

  Raises (on enter):
    WorkdirBusyError: another process holds the lock.
    NotADirectoryError / PermissionError: ``directory`` is a file or cannot
      be written; the message says which path and what to change.
  """

  def __init__(self, directory: str | os.PathLike):
    self.directory = os.fspath(directory)
    self._file = None

  def __enter__(self) -> "WorkdirLock":
    import fcntl  # pylint: disable=g-import-not-at-top
    import socket  # pylint: disable=g-import-not-at-top
    check_writable(self.directory)
    path = os.path.join(self.directory, ".lock")
    f = open(path, "a+", encoding="utf-8")  # pylint: disable=consider-using-with
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      f.seek(0)
      holder = f.read().strip() or "another process"
      f.close()
      raise WorkdirBusyError(
          f"The workdir {self.directory} is in use by {holder}; two runs "
          "cannot share a workdir. Wait for it, stop it, or choose another "
          "--workdir.") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on host {socket.gethostname()}")
    f.flush()
    self._file = f
    return self

  def __exit__(self, *exc_info) -> None:
    if self._file is not None:
      self._file.close()  # closing releases the flock
      self._file = None


def check_writable(directory: str | os.PathLike) -> None:
  """Creates ``directory`` if needed and checks it can be written.

  Raises:
    NotADirectoryError: the path (or a parent) is a file.
    PermissionError: it cannot be created or written.
  """
  directory = os.fspath(directory)
  if os.path.exists(directory) and not os.path.isdir(directory):
    raise NotADirectoryError(
        f"--workdir {directory} is a file, not a directory; choose another "
        "path.")
  try:
    os.makedirs(directory, exist_ok=True)
  except (FileExistsError, NotADirectoryError):
    raise NotADirectoryError(
        f"--workdir {directory}: a parent of it is a file; choose another "
        "path.") from None
  except PermissionError:
    raise PermissionError(
        f"--workdir {directory} cannot be created (permission denied); "
        "choose a writable path.") from None
  if not os.access(directory, os.W_OK | os.X_OK):
    raise PermissionError(
        f"--workdir {directory} is not writable; choose a writable path.")
