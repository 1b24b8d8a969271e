"""A full device, a read-only workdir and a damaged lock: one line each."""

import errno
import os

import numpy as np
import pytest

from fedjax_dd.core import checkpoint as C
from fedjax_dd.core import workdir as workdir_lib


def test_a_full_device_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
  state = {"w": np.arange(3.0)}
  with C.CheckpointStore(tmp_path / "ckpt") as store:
    assert store.save(1, state)

    def full(*args, **kwargs):
      # What Orbax raises when tensorstore cannot write (measured on a
      # 400 KB tmpfs): a ValueError carrying the status.
      os.makedirs(tmp_path / "ckpt" / "2.orbax-checkpoint-tmp")
      raise ValueError('RESOURCE_EXHAUSTED: Error writing "w/0": Failed to '
                       "write 88758 bytes: No space left on device")

    monkeypatch.setattr(store._manager, "save", full)
    with pytest.raises(C.DiskFullError) as e:
      store.save(2, {"w": np.arange(3.0) + 1})
    assert str(e.value) == (
        f"No space left on the device of {tmp_path / 'ckpt'}: checkpoint 2 "
        "could not be written (its partial files were removed); the last "
        "good checkpoint, step 1, is kept. Free some space and re-run the "
        "same command to resume.")
    assert e.value.errno == errno.ENOSPC
    assert not (tmp_path / "ckpt" / "2.orbax-checkpoint-tmp").exists()
    monkeypatch.undo()
    assert store.latest_step() == 1
    step, restored, _ = store.restore(state)
    assert step == 1
    np.testing.assert_array_equal(restored["w"], state["w"])


def test_other_save_errors_pass_through(tmp_path, monkeypatch):
  with C.CheckpointStore(tmp_path / "ckpt") as store:
    def broken(*args, **kwargs):
      raise ValueError("some other failure")
    monkeypatch.setattr(store._manager, "save", broken)
    with pytest.raises(ValueError, match="some other failure"):
      store.save(1, {"w": np.zeros(2)})


def test_is_disk_full_reads_errno_text_and_causes():
  assert C.is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
  assert not C.is_disk_full(OSError(errno.EACCES, "Permission denied"))
  try:
    try:
      raise OSError(errno.ENOSPC, "full")
    except OSError as inner:
      raise RuntimeError("wrapped") from inner
  except RuntimeError as outer:
    assert C.is_disk_full(outer)
  assert not C.is_disk_full(ValueError("bad value"))


def test_read_only_workdir_is_one_line(tmp_path, monkeypatch):
  def read_only(path, exist_ok=False):
    raise OSError(errno.EROFS, "Read-only file system", path)
  monkeypatch.setattr(workdir_lib.os, "makedirs", read_only)
  with pytest.raises(PermissionError, match=r"^--workdir .*/w cannot be "
                     r"created \(Read-only file system\); choose a writable "
                     r"path\.$"):
    workdir_lib.check_writable(tmp_path / "w")
  monkeypatch.undo()

  # An existing directory on a read-only mount (os.access cannot tell; root
  # passes it too): the write probe fails.
  def no_write(*args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system")
  monkeypatch.setattr(workdir_lib.tempfile, "TemporaryFile", no_write)
  with pytest.raises(PermissionError, match=r"is not writable \(Read-only "
                     r"file system\)"):
    workdir_lib.check_writable(tmp_path)


def test_a_lock_that_is_not_a_file_is_named(tmp_path):
  (tmp_path / ".lock").mkdir()
  with pytest.raises(PermissionError, match=r"The workdir lock .*\.lock "
                     r"cannot be opened \(Is a directory\); .*delete it"):
    with workdir_lib.WorkdirLock(tmp_path):
      pass
  (tmp_path / ".lock").rmdir()
  (tmp_path / ".lock").write_bytes(b"\xff\xfe garbage")  # not UTF-8: fine
  with workdir_lib.WorkdirLock(tmp_path):
    pass
