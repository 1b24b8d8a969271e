"""Experiment checkpoints: one state pytree plus JSON metadata per step.

:class:`CheckpointStore` wraps an Orbax ``CheckpointManager``. Each checkpoint
holds the whole experiment state as ONE pytree (``flax.struct`` dataclasses,
dicts, lists, arrays, Python scalars, ``None``) under the item ``state``, and
a JSON-able dict (e.g. the ledger's ``to_dict()``) under the item ``meta``.

Layout of ``directory``::

    <step>/state/...              Orbax PyTree checkpoint
    <step>/meta/metadata          the metadata dict as JSON
    <step>/fedjax_dd_commit.json  commit marker: size and SHA-256 of every file

Integrity. Orbax cannot tell later damage (a truncated file, a flipped byte
that restores silently with wrong values) from a good checkpoint, so the
store writes a commit marker after Orbax, a step being *committed* once it
exists. :meth:`CheckpointStore.restore` checks a step against its marker
first; a step that fails (or an Orbax temporary directory) is reported with
``logging.warning`` and skipped for the next older one. A step that passes
but does not fit the template raises ``ValueError`` instead.

PRNG keys. Raw ``uint32`` keys (recommended) are stored as they are; typed
keys (``jax.random.key``) as their ``key_data``, rewrapped on restore with
the template leaf's implementation.

Single writer. The store assumes one process writes to ``directory``: it
deletes steps and temporary directories it finds stale.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import operator
import os
import pathlib
import re
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

__all__ = ["CheckpointStore", "COMMIT_MARKER", "DiskFullError", "as_restored",
           "is_damaged", "is_disk_full", "unwritable"]

_log = logging.getLogger(__name__)

PyTree = Any

COMMIT_MARKER = "fedjax_dd_commit.json"


class DiskFullError(OSError):
  """A write failed because the device holding the workdir is full.

  Raised by :meth:`CheckpointStore.save` instead of the writer's own error
  (tensorstore's ``RESOURCE_EXHAUSTED`` through Orbax, or ``ENOSPC``); the
  partial checkpoint is removed and the committed ones are kept.
  """

  def __str__(self) -> str:
    return str(self.strerror)


# How a full device shows in the writers' errors: errno ENOSPC from Python,
# tensorstore's status (through Orbax, a ValueError) and its OS text.
_DISK_FULL_TEXT = ("RESOURCE_EXHAUSTED", "No space left on device")


def _chain(error: BaseException | None):
  """``error`` and each error it was raised from, once each."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def is_disk_full(error: BaseException) -> bool:
  """Whether ``error`` (or an error it was raised from) says the device is
  full."""
  return any(
      isinstance(e, DiskFullError)
      or (isinstance(e, OSError) and e.errno == errno.ENOSPC)
      or any(t in str(e) for t in _DISK_FULL_TEXT) for e in _chain(error))


def unwritable(error: BaseException) -> OSError | None:
  """The error in ``error``'s chain that says a write was refused (a
  read-only or permission-denied folder: EROFS, EACCES, EPERM), or None."""
  return next((e for e in _chain(error) if isinstance(e, OSError)
               and e.errno in (errno.EROFS, errno.EACCES, errno.EPERM)),
              None)
"""Name of the commit marker file written into every complete step directory."""

_MARKER_VERSION = 1
_STATE = "state"
_META = "meta"
# Orbax writes a step into "<step>.orbax-checkpoint-tmp-<timestamp>" and
# renames it when done.
_TMP_DIR_RE = re.compile(r"^(\d+)\.orbax-checkpoint-tmp")
_HASH_CHUNK = 1 << 20

# Committed step directories a restore of this process skipped as damaged,
# so that messages naming "the newest checkpoint" skip them too.
_damaged_steps: set[str] = set()


def is_damaged(step_dir: str | os.PathLike) -> bool:
  """Whether a restore in this process skipped ``step_dir`` as damaged
  (committed, but a file no longer matches its commit marker)."""
  return os.path.realpath(os.fspath(step_dir)) in _damaged_steps


def _stale_mesh(x: jax.Array) -> bool:
  mesh = getattr(getattr(x.aval, "sharding", None), "mesh", None)
  return (mesh is not None and bool(getattr(mesh, "axis_names", ()))
          and len(x.sharding.device_set) == 1)


def as_restored(tree: PyTree) -> PyTree:
  """``tree``'s one-device arrays as a restore hands them back: same buffers,
  their own abstract value.

  An array moved onto one device by ``jax.device_put`` keeps its source's
  abstract value, device mesh included, so it compiles other programs than
  a restored one and a fresh run can round differently from a resumed one.
  Re-wrapping the buffers (no copy) gives them a restore's abstract value.

  Args:
    tree: a pytree; leaves that are not one-device ``jax.Array`` s with a
      stale mesh (and weak-typed ones) are returned unchanged.

  Returns:
    The same values.
  """
  def fresh(x):
    if not isinstance(x, jax.Array) or x.weak_type or not _stale_mesh(x):
      return x
    return jax.make_array_from_single_device_arrays(
        x.shape, x.sharding, [x.addressable_data(0)])

  return jax.tree_util.tree_map(fresh, tree)


# ----------------------------------------------------------------------------
# Typed PRNG keys.
# ----------------------------------------------------------------------------


def _is_typed_key(x: Any) -> bool:
  dtype = getattr(x, "dtype", None)
  return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _key_impl(leaf: Any) -> Any:
  """PRNG implementation of a typed key array or ``ShapeDtypeStruct``."""
  if isinstance(leaf, jax.Array):
    return jax.random.key_impl(leaf)
  # key_impl only accepts arrays; trace an abstract one to read it.
  found = []
  jax.eval_shape(lambda k: found.append(jax.random.key_impl(k)), leaf)
  return found[0]


def _default_sharding() -> jax.sharding.Sharding:
  return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def _keys_to_data(tree: PyTree) -> PyTree:
  return jax.tree_util.tree_map(
      lambda x: jax.random.key_data(x) if _is_typed_key(x) else x, tree
  )


def _restore_target(leaf: Any) -> Any:
  """Template leaf -> what Orbax should restore into."""
  if _is_typed_key(leaf):
    if isinstance(leaf, jax.Array):
      return jax.random.key_data(leaf)
    data = jax.eval_shape(jax.random.key_data, leaf)
    return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=_default_sharding())
  if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None:
    # Orbax would read the saved sharding, valid only on its own topology.
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=_default_sharding())
  return leaf


def _rewrap_keys(template: PyTree, restored: PyTree) -> PyTree:
  return jax.tree_util.tree_map(
      lambda t, r: jax.random.wrap_key_data(r, impl=_key_impl(t))
      if _is_typed_key(t)
      else r,
      template,
      restored,
  )


# ----------------------------------------------------------------------------
# Commit markers.
# ----------------------------------------------------------------------------


def _file_digest(path: pathlib.Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(_HASH_CHUNK):
      h.update(chunk)
  return h.hexdigest()


def _step_files(step_dir: pathlib.Path) -> list[pathlib.Path]:
  files = []
  for root, _, names in os.walk(step_dir):
    for name in names:
      path = pathlib.Path(root) / name
      if path.parent == step_dir and name.startswith(COMMIT_MARKER):
        continue
      files.append(path)
  return sorted(files)


def _write_marker(step_dir: pathlib.Path, step: int) -> None:
  files = {
      p.relative_to(step_dir).as_posix(): {
          "size": p.stat().st_size,
          "sha256": _file_digest(p),
      }
      for p in _step_files(step_dir)
  }
  marker = {"version": _MARKER_VERSION, "step": step, "files": files}
  tmp = step_dir / (COMMIT_MARKER + ".tmp")
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(marker, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  # Atomic: the marker is either absent or complete.
  os.replace(tmp, step_dir / COMMIT_MARKER)


def _verify(step_dir: pathlib.Path, step: int) -> str | None:
  """Returns why ``step_dir`` is not a complete checkpoint, or None if it is."""
  marker_path = step_dir / COMMIT_MARKER
  if not marker_path.exists():
    return f"no commit marker {COMMIT_MARKER} (the save did not finish)"
  try:
    with open(marker_path, encoding="utf-8") as f:
      marker = json.load(f)
    files = marker["files"]
    if marker["version"] != _MARKER_VERSION or marker["step"] != step:
      return f"commit marker is for version {marker['version']} step {marker['step']}"
  except (OSError, ValueError, KeyError, TypeError) as e:
    return f"commit marker unreadable ({type(e).__name__}: {e})"
  if not files:
    return "commit marker lists no files"
  for rel, expected in sorted(files.items()):
    path = step_dir / rel
    if not path.is_file():
      return f"file {rel} is missing"
    size = path.stat().st_size
    if size != expected["size"]:
      return f"file {rel} has {size} bytes, expected {expected['size']}"
    if _file_digest(path) != expected["sha256"]:
      return f"file {rel} does not match its checksum"
  return None


# ----------------------------------------------------------------------------
# The store.
# ----------------------------------------------------------------------------


def _check_int(value: Any, name: str, minimum: int) -> int:
  """Returns ``value`` as a Python int >= ``minimum``; bools are rejected."""
  if isinstance(value, bool):
    raise ValueError(f"{name} must be an int, got bool {value!r}.")
  try:
    result = operator.index(value)
  except TypeError:
    raise ValueError(
        f"{name} must be an int, got {type(value).__name__} {value!r}."
    ) from None
  if result < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {result}.")
  return result


class CheckpointStore:
  """Saves and restores the whole experiment state every ``save_every`` steps.

  Example::

      with CheckpointStore(workdir / "ckpt", max_to_keep=3, save_every=10) as store:
        restored = store.restore(init_state)
        start, state, meta = restored if restored else (0, init_state, {})
        ledger = Ledger.from_dict(meta["ledger"]) if meta else Ledger()
        for r in range(start + 1, num_rounds + 1):
          state = run_round(state, r)
          store.save(r, state, {"ledger": ledger.to_dict()})

  Saves are blocking: when :meth:`save` returns the checkpoint is committed
  on disk. Only the ``max_to_keep`` newest committed steps are kept, older
  ones deleted after a new commit, never before. Saving step ``s`` first
  deletes every step ``>= s`` (an abandoned run's, which would shadow it).

  Args:
    directory: root directory of the checkpoints; created if missing.
    max_to_keep: number of newest committed steps kept (>= 1), or None to
      keep all.
    save_every: :meth:`save` writes only when ``step % save_every == 0``
      unless forced.
  """

  def __init__(
      self,
      directory: str | os.PathLike,
      *,
      max_to_keep: int | None = 3,
      save_every: int = 1,
  ):
    if max_to_keep is not None:
      max_to_keep = _check_int(max_to_keep, "max_to_keep", 1)
    self._max_to_keep = max_to_keep
    self._save_every = _check_int(save_every, "save_every", 1)
    self._directory = pathlib.Path(os.path.abspath(os.fspath(directory)))
    options = ocp.CheckpointManagerOptions(
        # Retention is done here, counting committed steps only.
        max_to_keep=None,
        enable_async_checkpointing=False,
        create=True,
    )
    self._manager = ocp.CheckpointManager(
        self._directory, options=options, item_names=(_STATE, _META)
    )
    self._closed = False
    self._damaged: list[int] = []

  @property
  def damaged_steps(self) -> list[int]:
    """Committed steps the last :meth:`restore` skipped because a file no
    longer matched its commit marker, newest first (their contents are
    lost)."""
    return list(self._damaged)

  @property
  def directory(self) -> pathlib.Path:
    """Absolute root directory of the checkpoints."""
    return self._directory

  @property
  def save_every(self) -> int:
    """Steps between unforced saves."""
    return self._save_every

  @property
  def max_to_keep(self) -> int | None:
    """Number of newest committed steps kept (None: all)."""
    return self._max_to_keep

  def _check_open(self) -> None:
    if self._closed:
      raise ValueError(f"CheckpointStore for {self._directory} is closed.")

  def _step_dir(self, step: int) -> pathlib.Path:
    return self._directory / str(step)

  def _orbax_steps(self) -> list[int]:
    """Steps Orbax sees as finalised on disk, committed or not."""
    self._manager.reload()
    return sorted(self._manager.all_steps())

  def _tmp_dirs(self) -> list[tuple[int, pathlib.Path]]:
    if not self._directory.is_dir():
      return []
    out = []
    for path in self._directory.iterdir():
      m = _TMP_DIR_RE.match(path.name)
      if m and path.is_dir():
        out.append((int(m.group(1)), path))
    return sorted(out)

  def should_save(self, step: int) -> bool:
    """Whether :meth:`save` writes ``step`` without ``force``."""
    return _check_int(step, "step", 0) % self._save_every == 0

  def all_steps(self) -> list[int]:
    """Committed steps (commit marker present), ascending.

    File contents are only verified by :meth:`restore`.
    """
    self._check_open()
    return [
        s for s in self._orbax_steps() if (self._step_dir(s) / COMMIT_MARKER).exists()
    ]

  def latest_step(self) -> int | None:
    """Newest committed step, or None. See :meth:`all_steps`."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(
      self,
      step: int,
      state: PyTree,
      meta: dict | None = None,
      *,
      force: bool = False,
      replacing: bool = False,
  ) -> bool:
    """Saves ``state`` and ``meta`` as checkpoint ``step``.

    Checkpoints at ``step`` or later are deleted first, with a warning.

    Args:
      step: step (round) index, >= 0.
      state: the experiment state, one pytree.
      meta: JSON-serialisable dict (round-trips through JSON: tuples come
        back as lists, non-string keys as strings); None saves ``{}``.
      force: save even if ``step % save_every != 0``.
      replacing: the caller replaces ``step`` on purpose (a stage cache's
        one entry): no warning.

    Returns:
      True if a checkpoint was written, False if the step was skipped.

    Raises:
      ValueError: on a negative step, a closed store, or ``meta`` that is not
        a JSON-serialisable dict. Nothing is written in that case.
    """
    self._check_open()
    step = _check_int(step, "step", 0)
    if meta is None:
      meta = {}
    if not isinstance(meta, dict):
      raise ValueError(f"meta must be a dict or None, got {type(meta).__name__}.")
    try:
      json.dumps(meta)
    except (TypeError, ValueError) as e:
      raise ValueError(f"meta must be JSON-serialisable: {e}") from e
    if not (force or self.should_save(step)):
      return False

    for s in self._orbax_steps():
      if s >= step:
        if not (replacing and s == step):
          _log.warning(
              "Checkpoint step %d in %s is replaced by the new save of step "
              "%d; deleting it.", s, self._directory, step,
          )
        self._manager.delete(s)
    for s, path in self._tmp_dirs():
      _log.warning(
          "Deleting incomplete checkpoint of step %d left at %s.", s, path
      )
      shutil.rmtree(path, ignore_errors=True)

    try:
      self._manager.save(
          step,
          args=ocp.args.Composite(
              **{
                  _STATE: ocp.args.StandardSave(_keys_to_data(state)),
                  _META: ocp.args.JsonSave(meta),
              }
          ),
          force=True,
      )
      self._manager.wait_until_finished()
      _write_marker(self._step_dir(step), step)
    except Exception as e:  # pylint: disable=broad-except
      if not is_disk_full(e):
        raise
      self._drop_partial(step)
      raise self._disk_full(step) from None
    self._apply_retention()
    return True

  def _drop_partial(self, step: int) -> None:
    """Removes what a failed save of ``step`` left (never a committed
    step), to give the space back."""
    for s, path in self._tmp_dirs():
      if s == step:
        shutil.rmtree(path, ignore_errors=True)
    step_dir = self._step_dir(step)
    if step_dir.is_dir() and not (step_dir / COMMIT_MARKER).exists():
      shutil.rmtree(step_dir, ignore_errors=True)

  def _disk_full(self, step: int) -> DiskFullError:
    latest = self.latest_step()
    kept = ("no earlier checkpoint was written" if latest is None else
            f"the last good checkpoint, step {latest}, is kept")
    return DiskFullError(
        errno.ENOSPC,
        f"No space left on the device of {self._directory}: checkpoint "
        f"{step} could not be written (its partial files were removed); "
        f"{kept}. Free some space and re-run the same command to resume.")

  def _apply_retention(self) -> None:
    if self._max_to_keep is None:
      return
    steps = self._orbax_steps()
    committed = [s for s in steps if (self._step_dir(s) / COMMIT_MARKER).exists()]
    if len(committed) <= self._max_to_keep:
      return
    oldest_kept = committed[-self._max_to_keep]
    for s in steps:
      if s < oldest_kept:
        self._manager.delete(s)

  def restore(
      self, template: PyTree, step: int | None = None
  ) -> tuple[int, PyTree, dict] | None:
    """Restores a checkpoint into the structure and dtypes of ``template``.

    Args:
      template: pytree with the structure of the saved state (e.g. the fresh
        state, or its ``jax.eval_shape``). Restored leaves take the template
        leaves' types, shardings and dtypes (``ShapeDtypeStruct`` without
        sharding: the default device).
      step: step to restore; None: the newest that passes the integrity
        check, warning about each one skipped.

    Returns:
      ``(step, state, meta)``, or None if ``step`` is None and no checkpoint
      passes the integrity check (including an empty directory).

    Raises:
      ValueError: if ``step`` is given and does not exist or fails the
        integrity check, or if a checkpoint that passes the check does not
        match ``template`` (structure or shapes).
    """
    self._check_open()
    steps = self._orbax_steps()
    if step is not None:
      step = _check_int(step, "step", 0)
      if step not in steps:
        raise ValueError(
            f"No checkpoint for step {step} in {self._directory}; steps on disk: {steps}."
        )
      reason = _verify(self._step_dir(step), step)
      if reason is not None:
        raise ValueError(
            f"Checkpoint step {step} in {self._directory} is corrupt or incomplete: {reason}."
        )
      return self._restore_step(step, template)

    for s, path in self._tmp_dirs():
      _log.warning(
          "Skipping checkpoint step %d in %s: incomplete save (Orbax temporary "
          "directory %s).", s, self._directory, path.name,
      )
    self._damaged = []
    for s in reversed(steps):
      reason = _verify(self._step_dir(s), s)
      if reason is not None:
        _log.warning(
            "Skipping checkpoint step %d in %s: %s.", s, self._directory, reason
        )
        if (self._step_dir(s) / COMMIT_MARKER).exists():
          self._damaged.append(s)
          _damaged_steps.add(os.path.realpath(self._step_dir(s)))
        continue
      return self._restore_step(s, template)
    return None

  def _restore_step(self, step: int, template: PyTree) -> tuple[int, PyTree, dict]:
    target = jax.tree_util.tree_map(_restore_target, template)
    try:
      restored = self._manager.restore(
          step,
          args=ocp.args.Composite(
              **{
                  _STATE: ocp.args.StandardRestore(target),
                  _META: ocp.args.JsonRestore(),
              }
          ),
      )
    except Exception as e:  # Orbax raises several types for a mismatch.
      raise ValueError(
          f"Checkpoint step {step} in {self._directory} passed its integrity "
          f"check but does not match the template: {type(e).__name__}: {e}"
      ) from e
    state = _rewrap_keys(template, restored[_STATE])
    # Orbax checks shapes of jax arrays but restores numpy leaves as saved.
    paths_and_leaves = jax.tree_util.tree_flatten_with_path(template)[0]
    for (path, want), got in zip(paths_and_leaves, jax.tree_util.tree_leaves(state)):
      want_shape = getattr(want, "shape", None)
      got_shape = getattr(got, "shape", None)
      if want_shape is not None and tuple(got_shape or ()) != tuple(want_shape):
        raise ValueError(
            f"Checkpoint step {step} in {self._directory} does not match the "
            f"template: leaf {jax.tree_util.keystr(path)} has shape "
            f"{tuple(got_shape or ())} on disk, template has {tuple(want_shape)}."
        )
    meta = restored[_META]
    return step, state, {} if meta is None else dict(meta)

  def read_meta(self, step: int) -> dict | None:
    """The metadata dict of committed ``step`` without reading its state.

    Returns:
      The dict, or None if ``step`` has no commit marker or its metadata
      cannot be read. Contents are not verified; :meth:`restore` does that.
    """
    self._check_open()
    step_dir = self._step_dir(_check_int(step, "step", 0))
    if not (step_dir / COMMIT_MARKER).exists():
      return None
    try:
      with open(step_dir / _META / "metadata", encoding="utf-8") as f:
        meta = json.load(f)
    except (OSError, ValueError) as e:
      _log.warning("Checkpoint step %d in %s has unreadable metadata: %s.",
                   step, self._directory, e)
      return None
    return meta if isinstance(meta, dict) else None

  def close(self) -> None:
    """Waits for pending work and releases the manager. Idempotent."""
    if not self._closed:
      self._manager.close()
      self._closed = True

  def __enter__(self) -> CheckpointStore:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def __repr__(self) -> str:
    return (
        f"CheckpointStore({str(self._directory)!r}, max_to_keep={self._max_to_keep}, "
        f"save_every={self._save_every})"
    )
