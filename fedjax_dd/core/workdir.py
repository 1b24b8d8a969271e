"""A run's directory: metrics, checkpoints and the one summary.

Layout of ``Workdir(directory)``::

    metrics.jsonl        one row per round / evaluated epoch (MetricsWriter)
    checkpoints/         the rounds loop's CheckpointStore
    r<r>/clients|setup|server/   the server-side driver's stores
    stages/<name>/       cached stage outputs (distilled sets, HFLDD stages)
                         and, while KIP runs, its state between segments
                         (``*_kip``, removed once the stage is cached)
    summary.json         written once, at the end, from memory
    tensorboard/         optional scalars
    .lock                held by the one process running in it (WorkdirLock)
    config.json          the settings that define the run (record_fingerprint)
    environment.json     the platform, devices, jax and layer forms it ran on
                         (record_environment)

``metrics.jsonl`` or ``.lock`` as a symbolic link is refused, not followed.
The loops take the pieces (writer, stores) explicitly; :class:`Workdir`
only names where they live, so a notebook can pass its own.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any, Mapping

from fedjax_dd.core.checkpoint import COMMIT_MARKER, CheckpointStore, is_damaged
from fedjax_dd.core.metrics import MetricsWriter, to_jsonable, write_json

_log = logging.getLogger(__name__)

FINGERPRINT_FILE = "config.json"
"""Name of the file holding a run's fingerprint (:func:`record_fingerprint`)."""

CONTENT_SUFFIX = "#content"
"""Suffix of the fingerprint entry holding a data file's content digest."""

LOCK_FILE = ".lock"
"""The file :class:`WorkdirLock` holds."""

ENVIRONMENT_FILE = "environment.json"
"""Name of the file recording where a run computed (:func:`record_environment`)."""

# Directories whose changed environment this process has already warned of.
_warned_environments: set[str] = set()


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
      # A new row makes an earlier summary.json stale: it is removed.
      self._writer = MetricsWriter(
          self.path("metrics.jsonl"),
          tensorboard_dir=self.path("tensorboard") if self._tensorboard else None,
          invalidates=(self.path("summary.json"),))
    return self._writer

  def store(self, name: str = "checkpoints", *, max_to_keep: int | None = 2,
            save_every: int = 1) -> CheckpointStore:
    """A checkpoint store under ``directory/name``."""
    return CheckpointStore(self.path(name), max_to_keep=max_to_keep,
                           save_every=save_every)

  def write_summary(self, summary: Mapping[str, Any]) -> str:
    """Writes ``summary.json`` (once per run; a second call is an error).

    The run's ``environment.json`` (:func:`record_environment`), if any,
    goes in as ``environment`` unless the summary sets that key.
    """
    if self._summary_written:
      raise RuntimeError(f"summary.json of {self.directory} was already written.")
    path = self.path("summary.json")
    environment = read_environment(self.directory)
    if environment is not None and "environment" not in summary:
      summary = dict(summary, environment=environment)
    write_json(path, summary)
    self._summary_written = True
    return path


class WorkdirBusyError(RuntimeError):
  """Another live process holds the run directory."""


class WorkdirLock:
  """An exclusive lock on a run directory, held for the life of a run.

  Two processes writing one workdir would corrupt each other's checkpoints
  and metrics, so the second one fails at once. The lock is ``fcntl.flock``
  on ``directory/.lock`` (the kernel drops it when its process dies, so it
  is never stale); the file names the holder's host and pid. The thread
  that holds it may take it again (the entry point, then
  :func:`fedjax_dd.fit`); another thread may not.

  Example::

      with WorkdirLock(workdir):
        run(...)

  Raises (on enter):
    WorkdirBusyError: another process holds the lock.
    NotADirectoryError / PermissionError: ``directory`` is a file or cannot
      be written (:func:`check_writable`).
    WorkdirLayoutError: see :func:`check_layout`.
  """

  # realpath -> (thread id, depth) of the locks this process holds.
  _held: dict[str, tuple[int, int]] = {}

  def __init__(self, directory: str | os.PathLike, *,
               flag: str = "--workdir"):
    self.directory = os.fspath(directory)
    self._flag = flag
    self._file = None
    self._key: str | None = None

  def __enter__(self) -> "WorkdirLock":
    import fcntl  # pylint: disable=g-import-not-at-top
    import socket  # pylint: disable=g-import-not-at-top
    import threading  # pylint: disable=g-import-not-at-top
    check_writable(self.directory, flag=self._flag)
    key = os.path.realpath(self.directory)
    held = WorkdirLock._held.get(key)
    if held is not None:
      if held[0] != threading.get_ident():
        raise WorkdirBusyError(
            f"The workdir {self.directory} is in use by another thread of "
            f"this process (pid {os.getpid()}); two runs cannot share a "
            f"workdir. Wait for it, or choose another {self._flag}.")
      WorkdirLock._held[key] = (held[0], held[1] + 1)
      self._key = key
      return self
    # Once per lock: the entry point checked it before fit re-enters.
    check_layout(self.directory)
    path = os.path.join(self.directory, LOCK_FILE)
    if os.path.islink(path):  # opening it would truncate what it names
      raise PermissionError(
          f"The workdir lock {path} is a symbolic link (to "
          f"{os.readlink(path)}); it is only a lock, holding no results: "
          "delete it and re-run.")
    try:
      f = open(path, "a+", encoding="utf-8", errors="replace")  # pylint: disable=consider-using-with
    except OSError as e:  # e.g. .lock replaced by a directory
      raise PermissionError(
          f"The workdir lock {path} cannot be opened ({e.strerror}); it is "
          "only a lock, holding no results: delete it and re-run.") from None
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      f.seek(0)
      holder = f.read().strip() or "another process"
      f.close()
      raise WorkdirBusyError(
          f"The workdir {self.directory} is in use by {holder}; two runs "
          f"cannot share a workdir. Wait for it, stop it, or choose another "
          f"{self._flag}.") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on host {socket.gethostname()}")
    f.flush()
    self._file = f
    self._key = key
    WorkdirLock._held[key] = (threading.get_ident(), 1)
    return self

  def __exit__(self, *exc_info) -> None:
    if self._key is not None:
      thread, depth = WorkdirLock._held.get(self._key, (0, 1))
      if depth > 1:
        WorkdirLock._held[self._key] = (thread, depth - 1)
      else:
        WorkdirLock._held.pop(self._key, None)
      self._key = None
    if self._file is not None:
      self._file.close()  # closing releases the flock
      self._file = None


def lock_holder(directory: str | os.PathLike) -> str | None:
  """Who holds ``directory``'s :class:`WorkdirLock` (``"pid P on host H"``),
  or None when nobody does (a finished or killed run). Takes and drops the
  lock to find out, so it is only for readers such as a report over runs."""
  import fcntl  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.fspath(directory), LOCK_FILE)
  if not os.path.isfile(path):
    return None
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      try:
        fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
      except OSError:
        return f.read().strip() or "another process"
      fcntl.flock(f, fcntl.LOCK_UN)
  except OSError:
    return None
  return None


def summary_is_stale(directory: str | os.PathLike) -> str | None:
  """Why ``directory/summary.json`` does not describe the run's rows, or
  None when it does (or there is no summary).

  A summary older than ``metrics.jsonl``, or in a directory whose lock is
  held, describes an earlier state of the run.
  """
  directory = os.fspath(directory)
  summary = os.path.join(directory, "summary.json")
  if not os.path.isfile(summary):
    return None
  holder = lock_holder(directory)
  if holder is not None:
    return (f"{directory} is still running (its lock is held by {holder}); "
            "its summary.json is not its result yet")
  metrics = os.path.join(directory, "metrics.jsonl")
  if (os.path.isfile(metrics)
      and os.path.getmtime(metrics) > os.path.getmtime(summary)):
    return (f"{directory}/summary.json is older than its metrics.jsonl: the "
            "run was resumed after that summary and has not finished since")
  return None


def check_writable(directory: str | os.PathLike, *,
                   flag: str = "--workdir") -> None:
  """Creates ``directory`` if needed and checks it can be written.

  Raises:
    NotADirectoryError: the path (or a parent) is a file.
    PermissionError: it cannot be created or written.
  """
  directory = os.fspath(directory)
  if os.path.exists(directory) and not os.path.isdir(directory):
    raise NotADirectoryError(
        f"{flag} {directory} is a file, not a directory; choose another "
        "path.")
  try:
    os.makedirs(directory, exist_ok=True)
  except (FileExistsError, NotADirectoryError):
    raise NotADirectoryError(
        f"{flag} {directory}: a parent of it is a file; choose another "
        "path.") from None
  except PermissionError:
    raise PermissionError(
        f"{flag} {directory} cannot be created (permission denied); "
        "choose a writable path.") from None
  except OSError as e:  # e.g. a read-only file system (EROFS), ENOSPC
    raise PermissionError(
        f"{flag} {directory} cannot be created ({e.strerror}); choose a "
        "writable path.") from None
  if not os.access(directory, os.W_OK | os.X_OK):
    raise PermissionError(
        f"{flag} {directory} is not writable; choose a writable path.")
  error = _writable(directory)
  if error is not None:
    raise PermissionError(
        f"{flag} {directory} is not writable ({error}); choose a "
        "writable path.")


class WorkdirLayoutError(ValueError):
  """The workdir's files are not laid out as a run writes them (a store
  replaced by a file, a results file by a directory, a store that cannot be
  written): refused before anything in it is read or written."""


# What a run writes at the top of its directory, by kind; the r<r>/ rounds
# of the server-side driver hold the stores of _ROUND_STORES.
_LAYOUT_DIRS = ("checkpoints", "stages", "tensorboard")
_LAYOUT_FILES = ("metrics.jsonl", "summary.json", FINGERPRINT_FILE,
                 ENVIRONMENT_FILE)
_ROUND_STORES = ("clients", "client_spans", "setup", "server")


def _writable(path: str) -> str | None:
  """None when a file can be created in ``path``, else why not. Writes one:
  os.access says yes to root and knows nothing of a read-only mount."""
  try:
    with tempfile.TemporaryFile(dir=path):
      pass
  except OSError as e:
    return e.strerror or type(e).__name__
  return None


def check_layout(directory: str | os.PathLike) -> None:
  """Refuses a workdir whose files are not what a run writes there.

  Otherwise a ``checkpoints/`` turned into a file would look like a run with
  nothing to resume, restarted at round 0 over its metrics. ``checkpoints/``,
  ``stages/``, ``tensorboard/``, ``r<r>/`` and its stores must be writable
  directories; ``metrics.jsonl``, ``summary.json``, ``config.json`` and
  ``environment.json`` regular files. Other names are not looked at.

  Raises:
    WorkdirLayoutError: one line naming the path, what it is and the fix.
  """
  directory = os.fspath(directory)
  if not os.path.isdir(directory):
    return
  names = set(os.listdir(directory))
  dirs = [n for n in _LAYOUT_DIRS if n in names]
  for n in sorted(names):
    if n.startswith("r") and n[1:].isdigit():
      dirs.append(n)
      sub = os.path.join(directory, n)
      if os.path.isdir(sub):
        dirs += [os.path.join(n, m) for m in _ROUND_STORES
                 if os.path.lexists(os.path.join(sub, m))]
  for n in dirs:
    path = os.path.join(directory, n)
    if not os.path.isdir(path):
      kind = "a symbolic link to nothing" if os.path.islink(path) else "a file"
      raise WorkdirLayoutError(
          f"The workdir {directory} is damaged: {path} is {kind}, where a "
          "run keeps a directory of checkpoints or results. Nothing was read "
          "or changed. Restore it from a copy, or start the run again in a "
          "new --workdir.")
    error = _writable(path)
    if error is not None:
      raise WorkdirLayoutError(
          f"The workdir {directory} cannot be written: {path} refuses new "
          f"files ({error}), and the run saves its checkpoints there. "
          "Nothing was changed. Make it writable (or copy the workdir to a "
          "writable place) and re-run.")
  for n in _LAYOUT_FILES:
    path = os.path.join(directory, n)
    if os.path.lexists(path) and not os.path.islink(path) and (
        not os.path.isfile(path)):
      raise WorkdirLayoutError(
          f"The workdir {directory} is damaged: {path} is a directory, "
          "where a run keeps one file. Nothing was read or changed. Restore "
          "the file from a copy, or start the run again in a new "
          "--workdir.")


class FingerprintMismatchError(ValueError):
  """The workdir holds a run made with other defining settings."""


class EnvironmentMismatchError(FingerprintMismatchError):
  """A resume under an environment setting that changes what the run
  computes, not only its rounding (``JAX_ENABLE_X64``)."""


# Environment keys a resume may not change: they change the numbers, not only
# their rounding.
_REFUSED_ENVIRONMENT = ("x64",)


def _normalised(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
  # Through JSON, so that a tuple compares equal to the list read back.
  return json.loads(json.dumps(to_jsonable(dict(fingerprint)), sort_keys=True))


def has_run_files(directory: str | os.PathLike) -> bool:
  """Whether ``directory`` holds results of an earlier run: a committed
  checkpoint (of any store), metrics rows or a summary; empty files do not
  count."""
  directory = os.fspath(directory)
  if not os.path.isdir(directory):
    return False
  metrics = os.path.join(directory, "metrics.jsonl")
  return (os.path.isfile(os.path.join(directory, "summary.json"))
          or (os.path.isfile(metrics) and os.path.getsize(metrics) > 0)
          or latest_checkpoint(directory) is not None)


def content_digests(fingerprint: Mapping[str, Any]) -> dict[str, str]:
  """``{name + CONTENT_SUFFIX: "sha256:<hex>"}`` for each setting whose value
  names an existing ``npz:`` file (the dataset, the public data).

  A path says where the data is, not what it holds: the digest makes a file
  replaced under the same path another experiment. It is computed at every
  start (size and mtime can survive a change). Missing, non-npz or damaged
  files get no entry (their loader reports them).
  """
  from fedjax_dd.data import sources  # pylint: disable=g-import-not-at-top
  out = {}
  for name, value in fingerprint.items():
    path = sources.npz_path(value)
    if path is None or not os.path.isfile(path):
      continue
    try:
      out[f"{name}{CONTENT_SUFFIX}"] = "sha256:" + sources.npz_digest(path)
    except (OSError, ValueError):
      continue
  return out


def _difference(name: str, old: Any, new: Any, recorded: Mapping[str, Any]
                ) -> str:
  if name.endswith(CONTENT_SUFFIX) and isinstance(old, str):
    setting = name[:-len(CONTENT_SUFFIX)]
    return (f"{setting}: the file {recorded.get(setting)} holds other data "
            f"than when the run started (its arrays' {old[:19]}..., now "
            f"{str(new)[:19]}...)")
  return f"{name} was {json.dumps(old)}, now {json.dumps(new)}"


NAMED_DIFFERENCES = 6
"""How many differing settings a refused resume names (then a count)."""


def record_fingerprint(directory: str | os.PathLike,
                       fingerprint: Mapping[str, Any], *,
                       defaults: Mapping[str, Any] | None = None,
                       flag: str = "--workdir") -> str:
  """Writes or checks ``directory/config.json``, the settings of the run.

  A run resumed with other defining settings (dataset, partition, model,
  seed ...) would continue the old checkpoint silently or fail deep in the
  restore; the fingerprint names the settings that differ first. The
  caller picks the defining settings (leaving out those a resume may
  change, e.g. the number of rounds); the content of every ``npz:`` file a
  setting names is compared too (:func:`content_digests`).

  Args:
    directory: the run directory (created if missing).
    fingerprint: ``{name: JSON-able value}``, e.g. dotted config paths.
    defaults: the values each setting takes when nobody sets it (e.g. the
      preset without overrides). A setting the recorded fingerprint lacks
      matches when its new value is its default.
    flag: how the caller names the directory in a refusal (``"--workdir"``
      on the command line, ``"workdir="`` for :func:`fedjax_dd.fit`).

  Returns:
    ``"new"`` (nothing to resume, :func:`has_run_files`: written),
    ``"same"`` (equal to the recorded one) or ``"adopted"`` (results without
    a fingerprint: written, with a warning, and the run resumes).

  Raises:
    FingerprintMismatchError: the directory holds results and the recorded
      fingerprint differs (naming up to :data:`NAMED_DIFFERENCES` keys with
      both values), or ``config.json`` cannot be read.
  """
  directory = os.fspath(directory)
  path = os.path.join(directory, FINGERPRINT_FILE)
  new = _normalised(fingerprint)
  new.update(content_digests(new))
  if os.path.isfile(path):
    try:
      with open(path, encoding="utf-8") as f:
        old = json.load(f)
      if not isinstance(old, dict):
        raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
      raise FingerprintMismatchError(
          f"{path} is damaged ({type(e).__name__}: "
          f"{str(e).splitlines()[0] if str(e) else 'unreadable'}); it records "
          "the settings of this run. Restore it, delete it to resume with "
          f"the current settings recorded anew, or use a new {flag}."
      ) from None
    missing = "(unset)"
    known = _normalised(defaults or {})
    # A run recorded before content digests has none: nothing to compare.
    diffs = [_difference(k, old.get(k, missing), new.get(k, missing), old)
             for k in sorted(set(old) | set(new))
             if old.get(k, missing) != new.get(k, missing)
             and not (k not in old and k in known and known[k] == new[k])
             and not (k not in old and k.endswith(CONTENT_SUFFIX))
             # A damaged file has no digest now: its loader says so.
             and not (k not in new and k.endswith(CONTENT_SUFFIX))]
    # A run without results leaves nothing to mix: new settings replace it.
    if diffs and has_run_files(directory):
      named = diffs[:NAMED_DIFFERENCES]
      if len(diffs) > len(named):
        named.append(f"and {len(diffs) - len(named)} more")
      raise FingerprintMismatchError(
          f"The workdir {directory} holds a run made with other settings: "
          f"{'; '.join(named)}. Resuming would mix two experiments: use a "
          f"new {flag}, or revert these settings to resume.")
    if not diffs and old == new:
      return "same"
    if not diffs:  # Settings added since, at their defaults: record them.
      _write_json_atomic(path, new)
      return "same"
  status = "adopted" if has_run_files(directory) else "new"
  if status == "adopted":
    _log.warning(
        "The workdir %s has no %s (made before settings were recorded); "
        "resuming it as it is and recording the current settings.",
        directory, FINGERPRINT_FILE)
  os.makedirs(directory, exist_ok=True)
  _write_json_atomic(path, new)
  return status


def _write_json_atomic(path: str, record: Mapping[str, Any]) -> None:
  # Atomic (several hosts of one run may write it at once).
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


def current_environment() -> dict[str, Any]:
  """Where this process computes: what sets a run's float rounding.

  Returns:
    ``{"platform", "x64", "device_kind", "devices", "processes", "jax",
    "jaxlib", "policy"}``; the device count matters on CPU too (it sets how
    clients are batched); ``policy`` is :func:`fedjax_dd.policy.forms`.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_dd import policy  # pylint: disable=g-import-not-at-top
  from fedjax_dd import versions  # pylint: disable=g-import-not-at-top
  devices = jax.devices()
  return {"platform": jax.default_backend(),
          # 64-bit scalars change the numbers (refused on a mixed resume).
          "x64": bool(jax.config.jax_enable_x64),
          "device_kind": devices[0].device_kind,
          "devices": len(devices),
          "processes": jax.process_count(),
          "jax": versions.installed_version("jax"),
          "jaxlib": versions.installed_version("jaxlib"),
          "policy": policy.forms()}


def _environment_differences(started: Mapping[str, Any],
                             now: Mapping[str, Any],
                             prefix: str = "") -> list[str]:
  """``"key old -> new"`` for each key both records hold with other values;
  dicts are compared key by key (``policy.conv "patches" -> "forward"``).
  A key only one side holds is not a difference."""
  out = []
  for k in sorted(set(started) & set(now)):
    old, new = started[k], now[k]
    if old == new:
      continue
    if isinstance(old, dict) and isinstance(new, dict):
      out += _environment_differences(old, new, f"{prefix}{k}.")
    else:
      out.append(f"{prefix}{k} {json.dumps(old)} -> {json.dumps(new)}")
  return out


def read_environment(directory: str | os.PathLike) -> dict[str, Any] | None:
  """``directory/environment.json`` (:func:`record_environment`), or None
  when there is none or it cannot be read."""
  try:
    with open(os.path.join(os.fspath(directory), ENVIRONMENT_FILE),
              encoding="utf-8") as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None
  return record if isinstance(record, dict) else None


def record_environment(directory: str | os.PathLike,
                       environment: Mapping[str, Any] | None = None, *,
                       forms: Mapping[str, Any] | None = None
                       ) -> str | None:
  """Records where the run computes, and says when a resume moves it.

  A resume in another environment (device count, platform, jax or layer
  forms) still runs, but its float rounding can differ from then on. So
  ``environment.json`` keeps the first environment under ``"started"`` and
  others under ``"resumed"``, and such a resume gets a warning naming the
  difference.

  Args:
    directory: the run directory (created if missing).
    environment: this process's; default :func:`current_environment`.
    forms: the layer forms the run asked for (e.g.
      ``{"model.conv_impl": "patches"}``), compared like the rest; recorded
      forms this call does not give keep their values.

  Raises:
    EnvironmentMismatchError: the run was made with the other
      ``JAX_ENABLE_X64`` setting (a change of numbers, not of rounding).

  Returns:
    The warning when the directory holds results (:func:`has_run_files`)
    made in another environment, else None; logged once per process and
    directory. Results without a record are recorded as now, without one.
  """
  directory = os.fspath(directory)
  now = _normalised(environment if environment is not None
                    else current_environment())
  record = read_environment(directory)
  # Forms this caller does not know keep their recorded values.
  started = record.get("started") if record is not None else None
  recorded_forms = (started.get("forms") if isinstance(started, dict)
                    else None)
  merged = {**(recorded_forms if isinstance(recorded_forms, dict) else {}),
            **_normalised(forms or {})}
  if merged:
    now["forms"] = merged
  if record is None or not has_run_files(directory):
    fresh = {"started": now, "resumed": []}
    if record != fresh:  # The entry point has often written it already.
      os.makedirs(directory, exist_ok=True)
      _write_json_atomic(os.path.join(directory, ENVIRONMENT_FILE), fresh)
    return None
  started = record.get("started")
  started = started if isinstance(started, dict) else {}
  for key in _REFUSED_ENVIRONMENT:
    if key in started and key in now and started[key] != now[key]:
      raise EnvironmentMismatchError(
          f"The run in {directory} was made with JAX_ENABLE_X64="
          f"{int(bool(started[key]))} and this process has "
          f"JAX_ENABLE_X64={int(bool(now[key]))}: 64-bit mode changes the "
          "numbers, so resuming would mix two computations. Set "
          f"JAX_ENABLE_X64={int(bool(started[key]))} to resume, or use a new "
          "--workdir.")
  diffs = _environment_differences(started, now)
  if not diffs:
    return None
  resumed = list(record.get("resumed") or [])
  if now not in resumed:
    resumed.append(now)
    _write_json_atomic(os.path.join(directory, ENVIRONMENT_FILE),
                       dict(record, resumed=resumed))
  hint = ""
  if (started.get("platform") == now.get("platform") == "cpu"
      and started.get("devices") != now.get("devices")
      and isinstance(started.get("devices"), int)):
    hint = (f" To resume on the run's own count, set "
            f"FEDJAX_DD_HOST_DEVICES={started['devices']} before the first "
            "JAX computation.")
  message = (
      f"The run in {directory} started in another environment "
      f"({'; '.join(diffs)}): it resumes, but from here on its float "
      "rounding can differ from an uninterrupted run's, and so can its "
      f"figures (recorded in {ENVIRONMENT_FILE}).{hint}")
  if os.path.abspath(directory) not in _warned_environments:
    _warned_environments.add(os.path.abspath(directory))
    _log.warning("%s", message)
  return message


def latest_checkpoint(directory: str | os.PathLike) -> tuple[str, int] | None:
  """The newest committed checkpoint under ``directory``, of any store.

  Reads only the commit markers (cheap, e.g. after Ctrl-C); steps this
  process skipped as damaged are not candidates
  (:func:`fedjax_dd.core.checkpoint.is_damaged`).

  Returns:
    ``(path of the step directory relative to directory, step)``, or None if
    nothing was committed.
  """
  directory = os.fspath(directory)
  newest = None
  for root, _, names in os.walk(directory):
    if COMMIT_MARKER not in names:
      continue
    step_name = os.path.basename(root)
    if not step_name.isdigit() or is_damaged(root):
      continue
    # Newest marker first; equal times (coarse clocks) go to the higher step.
    rank = (os.path.getmtime(os.path.join(root, COMMIT_MARKER)),
            int(step_name))
    if newest is None or rank > newest[0]:
      newest = (rank, os.path.relpath(root, directory), int(step_name))
  return None if newest is None else newest[1:]
