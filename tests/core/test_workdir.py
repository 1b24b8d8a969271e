"""The run directory: one summary write, one writer, a writable path."""

import os

import pytest

from fedjax_dd.core import workdir as workdir_lib


def test_summary_is_written_once(tmp_path):
  work = workdir_lib.Workdir(tmp_path / "w")
  work.write_summary({"a": 1})
  with pytest.raises(RuntimeError, match="already written"):
    work.write_summary({"a": 2})
  assert (tmp_path / "w" / "summary.json").read_text().count('"a": 1') == 1


def test_second_writer_fails_at_once_and_lock_dies_with_its_holder(tmp_path):
  path = tmp_path / "w"
  with workdir_lib.WorkdirLock(path):
    with pytest.raises(workdir_lib.WorkdirBusyError,
                       match=f"in use by pid {os.getpid()}"):
      with workdir_lib.WorkdirLock(path):
        pass
  # Released on exit (the kernel also releases it when a process dies).
  with workdir_lib.WorkdirLock(path):
    pass


def test_unwritable_or_file_workdir_is_refused(tmp_path):
  afile = tmp_path / "f"
  afile.write_text("x")
  with pytest.raises(NotADirectoryError, match="is a file"):
    workdir_lib.check_writable(afile)
  with pytest.raises(NotADirectoryError, match="parent of it is a file"):
    workdir_lib.check_writable(afile / "sub")
  ro = tmp_path / "ro"
  ro.mkdir()
  ro.chmod(0o500)
  try:
    if os.access(ro, os.W_OK):
      pytest.skip("running as a user who can write anywhere")
    with pytest.raises(PermissionError, match="not writable"):
      workdir_lib.check_writable(ro)
  finally:
    ro.chmod(0o700)
