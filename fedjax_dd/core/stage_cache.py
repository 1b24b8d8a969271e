"""A fingerprinted cache of one-off stage outputs on the checkpoint store.

Some stages run once before the rounds and are deterministic given a few
settings (FedD3's client distillation, HFLDD's label knowledge, topology and
member uploads); a resumed run loads their output instead of recomputing it.
:class:`StageCache` keeps each named stage in its own
:class:`~fedjax_dd.core.checkpoint.CheckpointStore` under ``<root>/<name>``
(:meth:`StageCache.for_workdir`), with the store's integrity checks. One
entry per stage: saving replaces it.

What is cached is a flat ``{name: array}`` dict of host arrays plus a
JSON-able ``info`` dict; the checkpoint's meta holds::

    {"fingerprint": {...},            # the settings that determine the output
     "spec": {name: {"shape": [...], "dtype": "uint8"}, ...},
     "info": {...}}

Fingerprints. A fingerprint is a JSON dict of the settings that determine the
output, chosen by the caller, compared after a JSON round trip. A field the
stored fingerprint lacks whose current value is "off" (``0``, ``None``,
``""``, ``False``, empty) counts as equal (a setting added later, off
meaning what the older run did). Any other difference raises
:class:`StaleStageError` naming every differing field; a stale entry is never
silently recomputed over (the workdir likely belongs to another experiment).

Templates. The output's shapes are known only to the computation, so the
meta records every array's shape and dtype (``spec``), from which the
restore template is rebuilt. An entry that fails the store's integrity check
is a miss, with the store's warning. Zero-size arrays, which Orbax does not
save, live in the spec only and come back empty.

In-progress stages. :class:`TreeCheckpoint` keeps the state of a stage still
running (e.g. KIP's, :class:`fedjax_dd.distill.kip.SegmentStore`) as an entry
of its own, so a run stopped mid-stage continues from its last saved part.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any, Callable

import jax
import numpy as np

from fedjax_dd.core.checkpoint import COMMIT_MARKER, CheckpointStore

__all__ = ["CachedStage", "StageCache", "StaleStageError", "TreeCheckpoint"]

_log = logging.getLogger(__name__)

# The one step each stage's store holds.
_STEP = 0


class StaleStageError(ValueError):
  """A cached stage was computed under other settings."""


@dataclasses.dataclass(frozen=True)
class CachedStage:
  """A stage output read back from the cache.

  Attributes:
    arrays: ``{name: np.ndarray}`` as saved (shapes and dtypes included).
    info: the JSON ``info`` dict saved with it.
  """
  arrays: dict[str, np.ndarray]
  info: dict[str, Any]


def _normalise(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
  """The fingerprint as it reads back from JSON (tuples become lists)."""
  if not isinstance(fingerprint, Mapping):
    raise ValueError(
        f"fingerprint must be a dict, got {type(fingerprint).__name__}.")
  try:
    return json.loads(json.dumps(dict(fingerprint), sort_keys=True))
  except (TypeError, ValueError) as e:
    raise ValueError(f"fingerprint must be JSON-serialisable: {e}") from e


def _is_off(value: Any) -> bool:
  return value is None or value is False or value == 0 or (
      isinstance(value, (str, list, dict)) and not value)


def fingerprint_differences(cached: Mapping[str, Any],
                            current: Mapping[str, Any], *,
                            names: tuple[str, str] = ("cached", "current")
                            ) -> list[str]:
  """Fields on which two (normalised) fingerprints differ, sorted.

  A field missing from ``cached`` whose current value is off is not a
  difference (module docstring).

  Args:
    cached, current: the stored and the current fingerprint.
    names: how the messages call the two.
  """
  old, new = names
  out = []
  for k in sorted(set(cached) | set(current)):
    if k not in cached:
      if not _is_off(current[k]):
        out.append(f"{k} ({old}: absent, {new}: {current[k]!r})")
    elif k not in current:
      out.append(f"{k} ({old}: {cached[k]!r}, {new}: absent)")
    elif cached[k] != current[k]:
      out.append(f"{k} ({old}: {cached[k]!r}, {new}: {current[k]!r})")
  return out


class StageCache:
  """Named, fingerprinted stage outputs, one checkpoint store per stage.

  Example::

      cache = StageCache.for_workdir(workdir)
      hit = cache.load("distilled", fingerprint)
      if hit is None:
        arrays, info = compute()
        cache.save("distilled", fingerprint, arrays, info)
      else:
        arrays, info = hit.arrays, hit.info

  Args:
    root: directory holding one sub-directory per stage; nothing is created
      before :meth:`save`.
  """

  def __init__(self, root: str | os.PathLike):
    self._root = pathlib.Path(os.path.abspath(os.fspath(root)))

  @classmethod
  def for_workdir(cls, workdir: str | os.PathLike) -> StageCache:
    """The cache of a run: ``workdir/stages``."""
    return cls(os.path.join(os.fspath(workdir), "stages"))

  @property
  def root(self) -> pathlib.Path:
    return self._root

  def path(self, name: str) -> pathlib.Path:
    """The checkpoint directory of stage ``name``."""
    if not name or os.sep in name or name in (".", ".."):
      raise ValueError(f"Invalid stage name {name!r}.")
    return self._root / name

  def load(self, name: str, fingerprint: Mapping[str, Any]
           ) -> CachedStage | None:
    """The cached output of stage ``name``, or None on a miss.

    A miss is no entry, or one that fails the store's integrity check.

    Raises:
      StaleStageError: if the entry was saved under another fingerprint; the
        message names the differing fields.
    """
    current = _normalise(fingerprint)
    directory = self.path(name)
    if not (directory / str(_STEP) / COMMIT_MARKER).exists():
      return None  # No entry (and no store created for one).
    with CheckpointStore(directory, max_to_keep=1) as store:
      meta = store.read_meta(_STEP)
    try:
      cached, spec = meta["fingerprint"], meta["spec"]
    except (KeyError, TypeError) as e:
      _log.warning("Stage %r in %s has unreadable metadata (%s); computing "
                   "it again.", name, directory, e)
      return None
    diffs = fingerprint_differences(cached, current)
    if diffs:
      raise StaleStageError(
          f"Stage {name!r} cached in {directory} was computed under other "
          f"settings; differing fields: {'; '.join(diffs)}. Use a fresh "
          "workdir, or the settings it was computed with.")
    template = {k: np.empty(tuple(s["shape"]), np.dtype(s["dtype"]))
                for k, s in spec.items() if int(np.prod(s["shape"]))}
    with CheckpointStore(directory, max_to_keep=1) as store:
      restored = store.restore(template)
    if restored is None:
      return None
    _, stored, meta = restored
    if _normalise(meta.get("fingerprint", {})) != _normalise(cached):
      return None  # replaced between the two reads
    arrays = {k: (np.asarray(stored[k]) if k in stored
                  else np.empty(tuple(s["shape"]), np.dtype(s["dtype"])))
              for k, s in spec.items()}
    return CachedStage(arrays=arrays, info=dict(meta.get("info") or {}))

  def save(self, name: str, fingerprint: Mapping[str, Any],
           arrays: Mapping[str, Any], info: Mapping[str, Any] | None = None
           ) -> None:
    """Saves (replaces) the output of stage ``name``.

    Args:
      name: the stage.
      fingerprint: JSON dict of the settings that determine the output.
      arrays: ``{name: array}``; host or device arrays, or scalars.
      info: JSON-able extras returned by :meth:`load`.

    Raises:
      ValueError: on a fingerprint or info that is not JSON-serialisable, or
        no non-empty array to save.
    """
    current = _normalise(fingerprint)
    host = {str(k): np.asarray(v) for k, v in arrays.items()}
    spec = {k: {"shape": list(a.shape), "dtype": a.dtype.name}
            for k, a in host.items()}
    tree = {k: a for k, a in host.items() if a.size}
    if not tree:
      raise ValueError(f"Stage {name!r} has no non-empty array to save.")
    meta = {"fingerprint": current, "spec": spec, "info": dict(info or {})}
    with CheckpointStore(self.path(name), max_to_keep=1) as store:
      store.save(_STEP, tree, meta, force=True, replacing=True)

  def get_or_compute(
      self, name: str, fingerprint: Mapping[str, Any],
      compute: Callable[[], tuple[Mapping[str, Any], Mapping[str, Any]]]
  ) -> tuple[CachedStage, bool]:
    """The cached output of stage ``name``, computed and saved on a miss.

    Args:
      name: the stage.
      fingerprint: JSON dict of the settings that determine the output.
      compute: ``() -> (arrays, info)``, run only on a miss.

    Returns:
      ``(stage, computed)``: the output as :meth:`load` returns it (host
      arrays) and whether ``compute`` ran.

    Raises:
      StaleStageError: the entry was saved under another fingerprint.
    """
    hit = self.load(name, fingerprint)
    if hit is not None:
      return hit, False
    arrays, info = compute()
    self.save(name, fingerprint, arrays, info)
    host = {str(k): np.asarray(v) for k, v in arrays.items()}
    return CachedStage(arrays=host, info=json.loads(json.dumps(dict(info or {})))), True



class TreeCheckpoint:
  """A pytree in progress, with the host loop's position, in a stage cache.

  Entry ``name`` of ``cache`` holds the tree's leaves (``leaf_<i>``) and
  ``done`` in its info. :meth:`resume` refuses an entry saved under another
  fingerprint and ignores, with a warning, one whose tree, shapes or dtypes
  differ from the template. Implements
  :class:`fedjax_dd.distill.kip.SegmentStore`.

  Args:
    cache: the run's stage cache.
    name: the entry (e.g. ``"hfldd_kip"``).
    fingerprint: the settings the stage's output depends on.
    every: save only every ``every``-th call of :meth:`save`.
  """

  def __init__(self, cache: StageCache, name: str,
               fingerprint: Mapping[str, Any], *, every: int = 1):
    if int(every) < 1:
      raise ValueError(f"every must be >= 1, got {every}.")
    self._cache, self._name = cache, name
    self._fingerprint = dict(fingerprint)
    self._every, self._calls = int(every), 0
    cache.path(name)  # refuses a bad name now

  @property
  def path(self) -> pathlib.Path:
    """The entry's checkpoint directory."""
    return self._cache.path(self._name)

  def resume(self, template: Any) -> tuple[Any, int] | None:
    """``(tree, done)`` as last saved, or None (no usable entry).

    Args:
      template: a tree of arrays or ``jax.ShapeDtypeStruct`` of the saved
        tree's structure, shapes and dtypes.

    Raises:
      StaleStageError: the entry was saved under another fingerprint.
    """
    hit = self._cache.load(self._name, self._fingerprint)
    if hit is None:
      return None
    leaves, treedef = jax.tree_util.tree_flatten(template)
    want = {f"leaf_{i}": (tuple(v.shape), np.dtype(v.dtype).name)
            for i, v in enumerate(leaves)}
    got = {k: (a.shape, a.dtype.name) for k, a in hit.arrays.items()}
    if (got != want or hit.info.get("treedef") != str(treedef)
        or "done" not in hit.info):
      _log.warning("%s holds a state of another shape; starting the stage "
                   "from its beginning.", self.path)
      return None
    tree = jax.tree_util.tree_unflatten(
        treedef, [hit.arrays[f"leaf_{i}"] for i in range(len(leaves))])
    return tree, int(hit.info["done"])

  def save(self, tree: Any, done: int) -> None:
    """Saves ``tree`` reached at ``done`` (every ``every``-th call)."""
    self._calls += 1
    if self._calls % self._every:
      return
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    arrays = {f"leaf_{i}": np.asarray(jax.device_get(v))
              for i, v in enumerate(leaves)}
    self._cache.save(self._name, self._fingerprint, arrays,
                     {"done": int(done), "treedef": str(treedef)})

  def clear(self) -> None:
    """Removes the entry (the stage's output is cached)."""
    shutil.rmtree(self.path, ignore_errors=True)
