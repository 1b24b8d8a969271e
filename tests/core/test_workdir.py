"""The run directory: one summary write, one writer, a writable path."""

import json
import os
import re

import pytest

from fedjax_dd import policy
from fedjax_dd.core import workdir as workdir_lib


def test_summary_is_written_once(tmp_path):
  work = workdir_lib.Workdir(tmp_path / "w")
  work.write_summary({"a": 1})
  with pytest.raises(RuntimeError, match="already written"):
    work.write_summary({"a": 2})
  assert (tmp_path / "w" / "summary.json").read_text().count('"a": 1') == 1


def test_second_writer_fails_at_once_and_lock_dies_with_its_holder(tmp_path):
  import threading  # pylint: disable=g-import-not-at-top
  path = tmp_path / "w"
  errors = []

  def second_writer():
    try:
      with workdir_lib.WorkdirLock(path):
        pass
    except workdir_lib.WorkdirBusyError as e:
      errors.append(str(e))

  with workdir_lib.WorkdirLock(path):
    # The holding thread may take it again (the entry point, then fit) ...
    with workdir_lib.WorkdirLock(path):
      pass
    # ... another thread may not (another process: the flock, tested
    # through the entry point).
    thread = threading.Thread(target=second_writer)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "in use by another thread" in errors[0]
    assert workdir_lib.lock_holder(path) == (
        f"pid {os.getpid()} on host {__import__('socket').gethostname()}")
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


def _commit(directory, step):
  """A step directory with a commit marker, as CheckpointStore leaves it."""
  os.makedirs(directory / str(step), exist_ok=True)
  (directory / str(step) / workdir_lib.COMMIT_MARKER).write_text("{}")


def test_fingerprint_is_written_then_checked(tmp_path, caplog):
  path = tmp_path / "w"
  fp = {"data.num_clients": 8, "data.dataset": "digits", "shape": (1, 2)}
  assert workdir_lib.record_fingerprint(path, fp) == "new"
  assert workdir_lib.record_fingerprint(path, fp) == "same"  # tuple == list
  # Nothing to resume yet: new settings replace the recorded ones.
  assert workdir_lib.record_fingerprint(path, {**fp, "seed": 1}) == "new"
  assert workdir_lib.record_fingerprint(path, fp) == "new"
  _commit(path / "checkpoints", 3)
  assert workdir_lib.record_fingerprint(path, fp) == "same"
  with pytest.raises(workdir_lib.FingerprintMismatchError) as info:
    workdir_lib.record_fingerprint(
        path, {**fp, "data.num_clients": 4, "model.name": "mlp"})
  message = str(info.value)
  assert "\n" not in message
  assert "data.num_clients was 8, now 4" in message
  assert 'model.name was "(unset)", now "mlp"' in message
  assert "data.dataset" not in message
  assert "new --workdir" in message and "revert" in message
  # A workdir made before fingerprints: adopted with one warning.
  old = tmp_path / "old"
  _commit(old / "checkpoints", 1)
  with caplog.at_level("WARNING"):
    assert workdir_lib.record_fingerprint(old, fp) == "adopted"
  assert "has no config.json" in caplog.text
  assert (old / workdir_lib.FINGERPRINT_FILE).is_file()


def test_settings_added_after_a_run_match_at_their_defaults(tmp_path):
  path = tmp_path / "w"
  fp = {"data.num_clients": 8}
  workdir_lib.record_fingerprint(path, fp)
  _commit(path / "checkpoints", 1)
  # The code gained client.grad_clip (default 0) after the run was recorded.
  newer = {**fp, "client.grad_clip": 0.0}
  defaults = {"data.num_clients": 100, "client.grad_clip": 0.0}
  assert workdir_lib.record_fingerprint(path, newer,
                                        defaults=defaults) == "same"
  with open(path / workdir_lib.FINGERPRINT_FILE) as f:
    assert json.load(f) == newer  # recorded from now on
  # Set to another value it is a different experiment.
  other = tmp_path / "o"
  workdir_lib.record_fingerprint(other, fp)
  _commit(other / "checkpoints", 1)
  with pytest.raises(workdir_lib.FingerprintMismatchError,
                     match=r'client.grad_clip was "\(unset\)", now 10.0'):
    workdir_lib.record_fingerprint(other, {**fp, "client.grad_clip": 10.0},
                                   defaults=defaults)
  # Without defaults a new setting is a difference, as before.
  with pytest.raises(workdir_lib.FingerprintMismatchError):
    workdir_lib.record_fingerprint(other, {**fp, "client.grad_clip": 0.0})


def test_latest_checkpoint_is_the_newest_committed_step(tmp_path):
  assert workdir_lib.latest_checkpoint(tmp_path) is None
  _commit(tmp_path / "checkpoints", 1)
  _commit(tmp_path / "checkpoints", 2)
  # Markers a few ms apart may share an mtime: set them apart explicitly.
  os.utime(tmp_path / "checkpoints" / "1" / workdir_lib.COMMIT_MARKER,
           (1, 1))
  os.makedirs(tmp_path / "checkpoints" / "3.orbax-checkpoint-tmp")  # no marker
  assert workdir_lib.latest_checkpoint(tmp_path) == (
      os.path.join("checkpoints", "2"), 2)
  assert workdir_lib.has_run_files(tmp_path)
  assert not workdir_lib.has_run_files(tmp_path / "nothing")


def test_an_npz_replaced_under_the_same_path_is_another_dataset(tmp_path):
  import numpy as np  # pylint: disable=g-import-not-at-top
  data = tmp_path / "d.npz"
  x = np.arange(24, dtype=np.uint8).reshape(6, 2, 2, 1)
  y = np.asarray([0, 1, 2, 0, 1, 2], np.int32)
  np.savez(data, x_train=x, y_train=y, x_test=x, y_test=y)
  path = tmp_path / "w"
  fp = {"data.dataset": f"npz:{data}", "seed": 0}
  assert workdir_lib.record_fingerprint(path, fp) == "new"
  with open(path / workdir_lib.FINGERPRINT_FILE) as f:
    recorded = json.load(f)
  key = "data.dataset" + workdir_lib.CONTENT_SUFFIX
  assert recorded[key].startswith("sha256:")
  _commit(path / "checkpoints", 2)
  assert workdir_lib.record_fingerprint(path, fp) == "same"
  # The same arrays written again (compressed) are the same data.
  np.savez_compressed(data, x_train=x, y_train=y, x_test=x, y_test=y)
  assert workdir_lib.record_fingerprint(path, fp) == "same"
  # Shuffled labels under the same path, with the same size and time:
  # refused, in one line naming it (the content is hashed at every start).
  np.savez(data, x_train=x, y_train=y, x_test=x, y_test=y)
  assert workdir_lib.record_fingerprint(path, fp) == "same"
  st = os.stat(data)
  np.savez(data, x_train=x, y_train=y[::-1], x_test=x, y_test=y)
  assert os.stat(data).st_size == st.st_size
  os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
  with pytest.raises(workdir_lib.FingerprintMismatchError) as info:
    workdir_lib.record_fingerprint(path, fp)
  message = str(info.value)
  assert "\n" not in message
  assert f"data.dataset: the file npz:{data} holds other data" in message
  assert "new --workdir" in message
  # A run recorded before content digests resumes and records them.
  old = tmp_path / "old"
  workdir_lib.record_fingerprint(old, fp)
  with open(old / workdir_lib.FINGERPRINT_FILE, "w") as f:
    json.dump(fp, f)
  _commit(old / "checkpoints", 1)
  assert workdir_lib.record_fingerprint(old, fp) == "same"
  with open(old / workdir_lib.FINGERPRINT_FILE) as f:
    assert key in json.load(f)


def test_a_damaged_config_json_is_one_line_naming_it(tmp_path):
  path = tmp_path / "w"
  workdir_lib.record_fingerprint(path, {"seed": 0})
  config = path / workdir_lib.FINGERPRINT_FILE
  for text in ('{"seed": 0', "[1, 2]"):
    config.write_text(text)
    with pytest.raises(workdir_lib.FingerprintMismatchError) as info:
      workdir_lib.record_fingerprint(path, {"seed": 0})
    message = str(info.value)
    assert "\n" not in message
    assert f"{config} is damaged" in message and "delete it" in message
  # Deleted as the message offers: the settings are recorded anew.
  config.unlink()
  assert workdir_lib.record_fingerprint(path, {"seed": 0}) == "new"


_CPU2 = {"platform": "cpu", "device_kind": "cpu", "devices": 2,
         "processes": 1, "jax": "0.12.0", "jaxlib": "0.12.0"}


def test_environment_is_recorded_and_a_resume_elsewhere_warns(tmp_path,
                                                              caplog):
  path = tmp_path / "w"
  one = {**_CPU2, "devices": 1}
  assert workdir_lib.record_environment(path, _CPU2) is None
  assert workdir_lib.read_environment(path) == {"started": _CPU2,
                                                "resumed": []}
  # Nothing to resume yet: the new environment replaces the recorded one.
  assert workdir_lib.record_environment(path, one) is None
  assert workdir_lib.read_environment(path)["started"] == one
  assert workdir_lib.record_environment(path, _CPU2) is None
  _commit(path / "checkpoints", 1)
  assert workdir_lib.record_environment(path, _CPU2) is None  # same: silent
  with caplog.at_level("WARNING"):
    message = workdir_lib.record_environment(path, one)
    # Again in this process (the entry point, then its loop): same text,
    # logged once, recorded once.
    assert workdir_lib.record_environment(path, one) == message
  assert "\n" not in message
  # Only what differs is named.
  assert re.search(r"environment \(([^)]*)\)", message).group(1) == (
      "devices 2 -> 1")
  assert "FEDJAX_DD_HOST_DEVICES=2" in message
  assert caplog.text.count("started in another environment") == 1
  assert workdir_lib.read_environment(path) == {"started": _CPU2,
                                                "resumed": [one]}
  # Another platform: named, with no host-device hint.
  gpu = {**_CPU2, "platform": "gpu", "device_kind": "NVIDIA H100",
         "devices": 1}
  message = workdir_lib.record_environment(path, gpu)
  assert 'platform "cpu" -> "gpu"' in message
  assert "FEDJAX_DD_HOST_DEVICES" not in message
  assert workdir_lib.read_environment(path)["resumed"] == [one, gpu]
  # The summary says where its figures came from.
  workdir_lib.Workdir(path).write_summary({"a": 1})
  summary = json.loads((path / "summary.json").read_text())
  assert summary["environment"] == {"started": _CPU2, "resumed": [one, gpu]}


def test_a_run_without_an_environment_record_is_recorded_silently(tmp_path):
  old = tmp_path / "old"
  _commit(old / "checkpoints", 1)
  assert workdir_lib.record_environment(old, _CPU2) is None
  assert workdir_lib.read_environment(old) == {"started": _CPU2,
                                               "resumed": []}
  # A summary that sets the key itself keeps its own; none without a record.
  workdir_lib.Workdir(old).write_summary({"environment": "mine"})
  assert json.loads((old / "summary.json").read_text())["environment"] == "mine"
  bare = workdir_lib.Workdir(tmp_path / "bare")
  bare.write_summary({"a": 1})
  assert "environment" not in json.loads(
      (tmp_path / "bare" / "summary.json").read_text())


def test_current_environment_names_this_process():
  import jax  # pylint: disable=g-import-not-at-top
  env = workdir_lib.current_environment()
  assert env["platform"] == jax.default_backend()
  assert env["devices"] == len(jax.devices())
  assert env["jax"] == jax.__version__
  assert set(env) == {"platform", "x64", "device_kind", "devices",
                      "processes", "jax", "jaxlib", "policy"}
  assert env["x64"] == bool(jax.config.jax_enable_x64)
  assert env["policy"] == policy.forms()
  assert env["policy"]["conv"] == policy.current().conv


def test_a_resume_under_other_layer_forms_names_them(tmp_path, caplog):
  # The same platform and jax, but the table of a later version moves CNN2
  # to another convolution form: the resume names that, key by key.
  path = tmp_path / "w"
  row = policy.lookup("cpu", "0.12.0")
  before = {**_CPU2, "policy": {**policy.forms(row),
                                "forward_conv_models": ["CNN3"]}}
  after = {**_CPU2, "policy": policy.forms(row)}
  assert workdir_lib.record_environment(path, before) is None
  _commit(path / "checkpoints", 1)
  with caplog.at_level("WARNING"):
    message = workdir_lib.record_environment(path, after)
  assert re.search(r"environment \(([^)]*)\)", message).group(1) == (
      'policy.forward_conv_models ["CNN3"] -> ["CNN2", "CNN3"]')
  assert workdir_lib.read_environment(path)["resumed"] == [after]
  # A record made before the policy was recorded has nothing to compare it
  # with: silent, nothing added.
  old = tmp_path / "old"
  assert workdir_lib.record_environment(old, _CPU2) is None
  _commit(old / "checkpoints", 1)
  assert workdir_lib.record_environment(old, after) is None
  assert workdir_lib.read_environment(old) == {"started": _CPU2,
                                               "resumed": []}
  # Another device count as well: both differences, in key order.
  other = {**after, "devices": 1}
  message = workdir_lib.record_environment(path, other)
  assert re.search(r"environment \(([^)]*)\)", message).group(1) == (
      'devices 2 -> 1; policy.forward_conv_models ["CNN3"] -> '
      '["CNN2", "CNN3"]')


def test_a_symlinked_lock_is_refused(tmp_path):
  outside = tmp_path / "outside.txt"
  outside.write_text("keep me")
  (tmp_path / "w").mkdir()
  os.symlink(outside, tmp_path / "w" / workdir_lib.LOCK_FILE)
  with pytest.raises(PermissionError, match=r"\.lock is a symbolic link "
                     r"\(to .*outside.txt\); it is only a lock"):
    with workdir_lib.WorkdirLock(tmp_path / "w"):
      pass
  assert outside.read_text() == "keep me"


def test_a_summary_is_stale_while_running_or_older_than_its_rows(tmp_path):
  work = workdir_lib.Workdir(tmp_path / "w")
  work.writer.write({"round": 1})
  work.write_summary({"rounds": 1})
  assert workdir_lib.summary_is_stale(tmp_path / "w") is None
  # Resumed: the first new row removes the finished run's summary.
  again = workdir_lib.Workdir(tmp_path / "w")
  again.writer.write({"round": 2})
  assert not (tmp_path / "w" / "summary.json").exists()
  # A summary older than the rows (left by an older version) is stale ...
  (tmp_path / "w" / "summary.json").write_text("{}")
  later = os.path.getmtime(tmp_path / "w" / "summary.json") + 5
  os.utime(tmp_path / "w" / "metrics.jsonl", (later, later))
  assert "older than its metrics.jsonl" in workdir_lib.summary_is_stale(
      tmp_path / "w")
  # ... and so is any summary while the lock is held.
  os.utime(tmp_path / "w" / "metrics.jsonl", (later - 10, later - 10))
  assert workdir_lib.summary_is_stale(tmp_path / "w") is None
  with workdir_lib.WorkdirLock(tmp_path / "w"):
    assert workdir_lib.lock_holder(tmp_path / "w") == (
        f"pid {os.getpid()} on host {__import__('socket').gethostname()}")
    assert "still running" in workdir_lib.summary_is_stale(tmp_path / "w")
  assert workdir_lib.lock_holder(tmp_path / "w") is None


def test_a_resume_under_another_model_form_is_named_and_recorded(tmp_path,
                                                                 caplog):
  here = workdir_lib.current_environment()
  path = tmp_path / "w"
  workdir_lib.record_environment(path, here,
                                 forms={"model.conv_impl": "patches"})
  # A library loop of the same run records no forms: the entry point's stay.
  workdir_lib.record_environment(path, here)
  _commit(path / "checkpoints", 1)
  assert workdir_lib.read_environment(path)["started"]["forms"] == {
      "model.conv_impl": "patches"}
  with caplog.at_level("WARNING"):
    message = workdir_lib.record_environment(
        path, here, forms={"model.conv_impl": "forward"})
  assert 'forms.model.conv_impl "patches" -> "forward"' in message
  assert message in caplog.text
  assert workdir_lib.read_environment(path)["resumed"][0]["forms"] == {
      "model.conv_impl": "forward"}


def test_a_resume_that_mixes_x64_modes_is_refused(tmp_path):
  # JAX_ENABLE_X64=1 changed fedavg.py:smoke's round-1 accuracy (0.2333
  # against 0.2194): another computation, not another rounding.
  path = tmp_path / "w"
  on = {**_CPU2, "x64": True}
  off = {**_CPU2, "x64": False}
  workdir_lib.record_environment(path, off)
  _commit(path / "checkpoints", 1)
  assert workdir_lib.record_environment(path, off) is None
  with pytest.raises(workdir_lib.EnvironmentMismatchError) as info:
    workdir_lib.record_environment(path, on)
  message = str(info.value)
  assert "\n" not in message
  assert ("made with JAX_ENABLE_X64=0 and this process has "
          "JAX_ENABLE_X64=1") in message
  assert "Set JAX_ENABLE_X64=0 to resume" in message
  # A record written before x64 was recorded is not refused.
  old = tmp_path / "old"
  workdir_lib.record_environment(old, _CPU2)
  _commit(old / "checkpoints", 1)
  assert workdir_lib.record_environment(old, on) is None


@pytest.mark.parametrize("name,kind", [
    ("checkpoints", "file"), ("stages", "file"), ("r1", "file"),
    ("r1/server", "file"), ("metrics.jsonl", "dir"), ("summary.json", "dir"),
    ("config.json", "dir")])
def test_a_workdir_not_laid_out_as_a_run_writes_it_is_refused(
    tmp_path, name, kind):
  # Before: checkpoints/ replaced by a file restarted the finished run at
  # round 0 and emptied metrics.jsonl before computing anything.
  path = tmp_path / "w"
  path.mkdir()
  (path / "metrics.jsonl").write_text('{"round": 1}\n')
  target = path / name
  if target.exists():
    target.unlink()
  target.parent.mkdir(parents=True, exist_ok=True)
  if kind == "file":
    target.write_text("x")
  else:
    target.mkdir()
  with pytest.raises(workdir_lib.WorkdirLayoutError) as info:
    with workdir_lib.WorkdirLock(path):
      pass
  message = str(info.value)
  assert "\n" not in message and str(target) in message
  assert "Nothing was read or changed" in message
  assert ("is a file, where a run keeps a directory" in message
          if kind == "file" else "is a directory, where a run keeps one file"
          in message)
  if name != "metrics.jsonl":
    assert (path / "metrics.jsonl").read_text() == '{"round": 1}\n'
  assert not (path / workdir_lib.LOCK_FILE).exists()


def test_a_store_that_refuses_new_files_is_refused_before_the_run(
    tmp_path, monkeypatch):
  # Before: a read-only checkpoints/ appended the next row, then an OSError
  # [Errno 30] traceback. (As root, chmod does not stop a write: the check
  # writes a file, so a read-only mount is what it sees; simulated here.)
  path = tmp_path / "w"
  (path / "checkpoints").mkdir(parents=True)
  real = workdir_lib._writable
  monkeypatch.setattr(
      workdir_lib, "_writable",
      lambda p: "Read-only file system" if p.endswith("checkpoints")
      else real(p))
  with pytest.raises(workdir_lib.WorkdirLayoutError,
                     match=r"checkpoints refuses new files \(Read-only file "
                     r"system\)"):
    workdir_lib.check_layout(path)
  monkeypatch.setattr(workdir_lib, "_writable", real)
  workdir_lib.check_layout(path)   # a good layout passes
  workdir_lib.check_layout(tmp_path / "none")   # and a missing directory


def test_latest_checkpoint_skips_a_step_a_restore_found_damaged(tmp_path):
  # Before: with every checkpoint cut, the Ctrl-C line named
  # checkpoints/2, which the restore had just skipped as damaged.
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core.checkpoint import CheckpointStore  # pylint: disable=g-import-not-at-top
  store = CheckpointStore(tmp_path / "checkpoints")
  for step in (1, 2):
    store.save(step, {"w": jnp.full((64,), float(step))})
  assert workdir_lib.latest_checkpoint(tmp_path) == (
      os.path.join("checkpoints", "2"), 2)
  for step in (1, 2):
    for f in sorted((tmp_path / "checkpoints" / str(step)).rglob("*")):
      if f.is_file() and f.name != workdir_lib.COMMIT_MARKER and (
          f.stat().st_size > 100):
        f.write_bytes(f.read_bytes()[:10])
        break
  assert store.restore({"w": jnp.zeros((64,))}) is None
  assert store.damaged_steps == [2, 1]
  assert workdir_lib.latest_checkpoint(tmp_path) is None
  store.close()
