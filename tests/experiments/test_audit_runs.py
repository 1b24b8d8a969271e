"""Audits of a run (``--config.audit.enabled=True``) and of a finished
workdir (``python -m fedjax_dd.experiments.audit``): audit.json, the
headline in summary.json, the same numbers from both, resumes and
refusals."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from fedjax_dd.audit import workdir as audit_lib
from fedjax_dd.core import checks
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.experiments import common
from fedjax_dd.experiments.configs import fedavg, fedd3, fedhydra, fedseq
from fedjax_dd.experiments.configs import hfldd

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# The random-image control uploading every image a client holds (digits'
# clients hold under 200 of a class): the upload is the raw data.
RAW = ("--config.fedd3.distiller=random", "--config.fedd3.allow_raw_upload=True",
       "--config.fedd3.images_per_class=200")


def _run(workdir, *overrides, config="experiments/configs/fedd3.py:smoke"):
  return subprocess.run(
      [sys.executable, "-m", "fedjax_dd.experiments.main",
       f"--config={config}", f"--workdir={workdir}",
       "--config.run.progress=False", *overrides],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
      check=False)


def _audit(workdir, *flags):
  return subprocess.run(
      [sys.executable, "-m", "fedjax_dd.experiments.audit",
       f"--workdir={workdir}", *flags],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
      check=False)


def _read(path):
  with open(path) as f:
    return json.load(f)


def test_fedd3_raw_upload_audit_from_the_cli_then_standalone(tmp_path):
  w = tmp_path / "fedd3"
  proc = _run(w, "--config.audit.enabled=True", *RAW)
  assert proc.returncode == 0, proc.stderr[-3000:]
  audit = _read(w / "audit.json")
  summary = _read(w / "summary.json")
  for key in ("kind", "holdout", "fprs", "num_clients", "audited_clients",
              "num_members", "num_nonmembers", "num_uploads",
              "image_mia_pixels", "image_mia_features", "reconstruction",
              "label_leakage"):
    assert key in audit, key
  assert audit["kind"] == "image_uploads"
  assert audit["holdout"] == {"source": "test split", "requested": 0,
                              "size": 360}
  c = audit["num_clients"]
  assert c == 10 and audit["audited_clients"] == list(range(c))
  # Every image uploaded as it is: found by either space, copied exactly.
  assert audit["num_uploads"] == audit["num_members"]
  for space in ("image_mia_pixels", "image_mia_features"):
    assert len(audit[space]["auc"]) == c
    assert audit[space]["auc_mean"] >= 0.99
    assert audit[space]["tpr_at_fpr_mean"]["0.001"] >= 0.99
  r = audit["reconstruction"]
  assert r["best_psnr_max"] == ["inf"] * c
  assert r["best_psnr_median"] == ["inf"] * c
  assert r["fraction_above_mean"] == 1.0
  assert r["exact_copy_fraction_mean"] == 1.0
  assert r["best_ssim_mean"] == pytest.approx(1.0, abs=1e-5)
  assert r["ssim_window"] == 7  # 8 x 8 digits
  assert audit["label_leakage"]["tv_mean"] == pytest.approx(0.0, abs=1e-6)
  assert summary["audit"] == audit_lib.headline(audit)
  assert summary["audit"]["file"] == "audit.json"

  # The standalone command on the finished workdir: the same numbers.
  os.remove(w / "audit.json")
  proc = _audit(w)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert _read(w / "audit.json") == audit
  assert json.loads(proc.stdout) == summary["audit"]

  # audit.* is not the run's identity: a resume with other values goes on
  # (no fingerprint refusal) and audits again under them.
  proc = _run(w, "--config.audit.enabled=True", "--config.audit.holdout=100",
              "--config.audit.psnr_threshold=20", *RAW)
  assert proc.returncode == 0, proc.stderr[-3000:]
  again = _read(w / "audit.json")
  assert again["holdout"]["size"] == 100
  assert again["reconstruction"]["psnr_threshold"] == 20.0
  assert _read(w / "summary.json")["audit"] == audit_lib.headline(again)


def test_fedd3_kip_upload_reveals_less_than_raw_images(tmp_path):
  w = tmp_path / "kip"
  proc = _run(w, "--config.audit.enabled=True")
  assert proc.returncode == 0, proc.stderr[-3000:]
  audit = _read(w / "audit.json")
  r = audit["reconstruction"]
  assert all(v != "inf" for v in r["best_psnr_max"])  # no copy uploaded
  assert r["exact_copy_fraction_mean"] == 0.0
  assert 0.0 <= audit["image_mia_pixels"]["auc_mean"] <= 1.0
  assert 0.0 <= audit["label_leakage"]["tv_mean"] <= 1.0


def test_fedavg_global_model_audit_and_standalone(tmp_path):
  w = tmp_path / "fedavg"
  proc = _run(w, "--config.audit.enabled=True", "--config.audit.holdout=150",
              "--config.audit.lira_shadows=2",
              config="experiments/configs/fedavg.py:smoke")
  assert proc.returncode == 0, proc.stderr[-3000:]
  audit = _read(w / "audit.json")
  assert audit["kind"] == "global_model"
  assert audit["rounds"] == _read(w / "summary.json")["rounds"]
  mia = audit["model_mia_loss"]
  assert len(mia["auc"]) == audit["num_clients"]
  assert 0.0 <= mia["auc_mean"] <= 1.0
  assert set(mia["tpr_at_fpr"]) == {"0.01", "0.001"}
  uploads = audit["client_uploads"]
  assert uploads["start"] == "final global model"  # the smoke runs 2 rounds
  for group in (audit["model_mia_lira"], uploads["model_mia_loss"],
                uploads["model_mia_lira"]):
    assert len(group["auc"]) == audit["num_clients"]
  assert len(uploads["label_leakage"]["tv"]) == audit["num_clients"]
  headline = _read(w / "summary.json")["audit"]
  assert headline["client_uploads_model_mia_lira_auc"] == (
      uploads["model_mia_lira"]["auc_mean"])
  os.remove(w / "audit.json")
  proc = _audit(w)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert _read(w / "audit.json") == audit
  # While a run holds the workdir, the audit refuses it in one line.
  from fedjax_dd.core import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  os.remove(w / "audit.json")
  with workdir_lib.WorkdirLock(w):
    proc = _audit(w)
  assert proc.returncode == 1
  assert proc.stderr.startswith(f"FATAL The workdir {w} is in use by ")
  assert not (w / "audit.json").exists()


def _one_shot_audit_run(tmp_path):
  """FedHydra's smoke run with its audit: each client's uploaded model
  against its own data and the final global model."""
  w = tmp_path / "fedhydra"
  proc = _run(w, "--config.audit.enabled=True", "--config.audit.holdout=200",
              "--config.audit.lira_shadows=2",
              config="experiments/configs/fedhydra.py:smoke")
  assert proc.returncode == 0, proc.stderr[-3000:]
  audit = _read(w / "audit.json")
  summary = _read(w / "summary.json")
  assert audit["kind"] == "client_models"
  assert audit["num_clients"] == len(summary["client_test_accuracy"])
  for group in ("model_mia_loss", "model_mia_lira", "global_model_mia_loss",
                "global_model_mia_lira"):
    assert len(audit[group]["auc"]) == audit["num_clients"]
    assert 0.0 <= audit[group]["auc_mean"] <= 1.0
    assert summary["audit"][f"{group}_auc"] == audit[group]["auc_mean"]
  tv = audit["label_leakage"]["tv"]
  assert len(tv) == audit["num_clients"] and all(0 <= t <= 1 for t in tv)
  return w, audit


def test_one_shot_client_models_audit_in_the_run(tmp_path):
  _one_shot_audit_run(tmp_path)


# The standalone command on an image-upload and a global-model workdir is
# checked by default above; on a one-shot workdir it resumes the whole run.
@pytest.mark.slow
def test_one_shot_client_models_audit_standalone(tmp_path):
  """The command on the finished workdir (which resumes the run, every
  stage restored) writes the run's audit and trains nothing again."""
  w, audit = _one_shot_audit_run(tmp_path)
  metrics = (w / "metrics.jsonl").read_text()
  os.remove(w / "audit.json")
  proc = _audit(w, "--holdout=200")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert _read(w / "audit.json") == audit
  # The resumed run trained nothing again: its rows are the run's.
  assert (w / "metrics.jsonl").read_text() == metrics


def test_hfldd_member_uploads_audit_standalone_and_in_the_run(tmp_path):
  """HFLDD's audit: the uploads each member sent its head and the heads'
  final model, from the command on a finished workdir, and the same file
  from the runner's own audit (``run_hfldd.run`` with ``audit.enabled``)."""
  w = tmp_path / "hfldd"
  proc = _run(w, config="experiments/configs/hfldd.py:smoke")
  assert proc.returncode == 0, proc.stderr[-3000:]
  proc = _audit(w, "--holdout=200")
  assert proc.returncode == 0, proc.stderr[-3000:]
  audit = _read(w / "audit.json")
  summary = _read(w / "summary.json")
  assert audit["kind"] == "hfldd"
  assert audit["holdout"] == {"source": "test split", "requested": 200,
                              "size": 200}
  # Members only: the heads send nothing, and every member sent its set.
  assert audit["audited_clients"] == sorted(audit["senders"])
  assert len(audit["senders"]) < audit["num_clients"]
  assert all(m > 0 for m in audit["num_uploads"])
  for group in ("image_mia_pixels", "image_mia_features"):
    assert len(audit[group]["auc"]) == len(audit["senders"])
    assert 0.0 <= audit[group]["auc_mean"] <= 1.0
  assert 0.0 <= audit["label_leakage"]["tv_mean"] <= 1.0
  assert "fraction_above_mean" in audit["reconstruction"]
  # Every client's soft labels on D_g, what the server clusters.
  assert len(audit["soft_labels"]["label_leakage"]["tv"]) == (
      audit["num_clients"])
  # The final model against every client's data, heads included.
  mia = audit["model_mia_loss"]
  assert len(mia["auc"]) == audit["num_clients"]
  assert 0.0 <= mia["auc_mean"] <= 1.0
  assert audit["rounds"] == summary["rounds"]
  os.rename(w / "audit.json", w / "standalone.json")
  code = ("from fedjax_dd.experiments.configs import hfldd; "
          "from fedjax_dd.experiments import run_hfldd; "
          "c = hfldd.get_config('smoke'); c.audit.enabled = True; "
          "c.audit.holdout = 200; c.run.progress = False; "
          f"run_hfldd.run(c, {str(w)!r})")
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=600,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  again = _read(w / "audit.json")
  assert again == audit
  assert _read(w / "summary.json")["audit"] == audit_lib.headline(again)


def test_hfldd_uploads_are_each_senders_masked_rows():
  from fedjax_dd.algorithms.hfldd import SentData  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments import auditing  # pylint: disable=g-import-not-at-top
  x = np.arange(2 * 3 * 2 * 2 * 1, dtype=np.uint8).reshape(2, 3, 2, 2, 1)
  y = np.eye(3, dtype=np.float32)[np.array([[0, 1, 2], [2, 2, 0]])]
  mask = np.array([[True, False, True], [False, True, False]])
  sent = SentData(x=x, y=y, mask=mask, senders=np.array([3, 1]))
  u = auditing.hfldd_uploads(sent, num_clients=4)
  assert np.asarray(u.count).tolist() == [0, 1, 0, 2]
  ux = np.asarray(u.x)
  np.testing.assert_array_equal(ux[3, :2], x[0, [0, 2]])
  np.testing.assert_array_equal(ux[1, :1], x[1, [1]])
  assert not ux[0].any() and not ux[2].any()
  np.testing.assert_array_equal(np.asarray(u.y_soft)[3, :2], y[0, [0, 2]])
  assert u.learned_labels and not u.centered_labels


def test_audit_settings_are_not_the_runs_identity():
  c = fedd3.get_config("smoke")
  before = common.fingerprint(c)
  c.audit.enabled, c.audit.holdout, c.audit.psnr_threshold = True, 50, 20.0
  c.audit.fprs = (0.1,)
  assert common.fingerprint(c) == before
  assert not any(k.startswith("audit") for k in before)


@pytest.mark.parametrize("key, value, message", [
    ("holdout", -1, "config.audit.holdout must be an int >= 0, got -1; set "
     "--config.audit.holdout."),
    ("fprs", (), "config.audit.fprs must be a non-empty sequence of rates "
     "in (0, 1), got (); set --config.audit.fprs."),
    ("psnr_threshold", math.nan, "config.audit.psnr_threshold must be a "
     "finite number, got nan; set --config.audit.psnr_threshold."),
    ("fprs", (0.01, 1.0), "config.audit.fprs must be a finite number > 0 "
     "and < 1, got 1.0; set --config.audit.fprs."),
    ("lira_shadows", 1, "config.audit.lira_shadows must be 0 (no LiRA) or "
     "at least 2 shadows (LiRA fits a variance over them), got 1; set "
     "--config.audit.lira_shadows."),
    ("lira_pool", -3, "config.audit.lira_pool must be an int >= 0, got -3; "
     "set --config.audit.lira_pool."),
])
def test_bad_audit_settings_refused_before_the_data_loads(key, value,
                                                          message):
  c = fedd3.get_config("smoke")
  c.audit[key] = value
  with pytest.raises(checks.SettingError) as e:
    common.validate(c)
  assert str(e.value) == message


def test_audit_of_a_runner_without_one_is_refused():
  c = fedseq.get_config("smoke")
  c.audit.enabled = True
  with pytest.raises(ValueError, match=r"^config.audit.enabled=True: runner "
                     r"'fedseq' has no audit yet \(runners fedd3, "
                     r"federated, hfldd, fedhydra"):
    common.validate(c)
  c.audit.enabled = False
  common.validate(c)
  for module in (hfldd, fedhydra):
    c = module.get_config("smoke")
    c.audit.enabled = True
    common.validate(c)
  fedavg.get_config("smoke").audit.enabled = True  # the group is everywhere
  c = fedd3.get_config("smoke")
  c.audit.enabled, c.audit.lira_shadows = True, 4
  with pytest.raises(ValueError, match=r"^config.audit.lira_shadows=4: LiRA "
                     r"audits model uploads \(runners federated and "
                     r"fedhydra\), not runner 'fedd3'"):
    common.validate(c)


def test_a_shadow_pool_the_holdout_leaves_empty_is_refused(tmp_path):
  proc = _run(tmp_path / "w", "--config.audit.enabled=True",
              "--config.audit.lira_shadows=2",
              config="experiments/configs/fedavg.py:smoke")
  assert proc.returncode != 0
  assert ("config.audit.lira_shadows=2: the shadow pool holds 0 test "
          "examples outside the holdout") in proc.stderr
  assert not (tmp_path / "w" / "checkpoints").exists()  # before any round


def test_a_holdout_above_the_test_split_is_one_line_before_compute(tmp_path):
  w = tmp_path / "big"
  proc = _run(w, "--config.audit.enabled=True",
              "--config.audit.holdout=100000")
  assert proc.returncode == 1
  lines = [l for l in proc.stderr.splitlines() if l.startswith("FATAL")]
  assert lines == [
      "FATAL config.audit.holdout must be an int >= 0 and <= 360, got "
      "100000; the test split of digits holds 360 examples; set "
      "--config.audit.holdout (0: all of them)."]
  assert not (w / "stages").exists()  # refused before KIP
  assert not (w / "audit.json").exists()


def test_nonmembers_follow_each_clients_label_mix():
  rng = np.random.default_rng(0)
  holdout_y = np.repeat(np.arange(3), 5)  # 5 of each of 3 classes
  y = np.array([[0, 0, 1, 0], [2, 2, 2, 2]], np.int32)
  data = ClientData(
      x=np.zeros((2, 4, 2, 2, 1), np.uint8), y=y,
      num_examples=np.array([3, 4], np.int32))
  parts = audit_lib.nonmember_parts(holdout_y, data, rng)
  assert np.bincount(holdout_y[parts[0]], minlength=3).tolist() == [2, 1, 0]
  assert np.bincount(holdout_y[parts[1]], minlength=3).tolist() == [0, 0, 4]
  with pytest.raises(checks.SettingError, match="client 1's classes"):
    audit_lib.nonmember_parts(np.zeros(4, np.int32), data, rng)
