"""Bad data and settings are refused before compute, in one line."""

import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from fedjax_dd.experiments import common
from fedjax_dd.experiments.configs import fedd3
from tests.conftest import REPO_ROOT


def _main(tmp_path, config, *overrides):
  return subprocess.run(
      [sys.executable, "-m", "fedjax_dd.experiments.main",
       f"--config=experiments/configs/{config}",
       f"--workdir={tmp_path / 'w'}", "--config.run.progress=False",
       *overrides], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)


def _npz(tmp_path, y_train):
  """8x8 grayscale images (the digits models' input) with these labels."""
  path = tmp_path / "d.npz"
  rng = np.random.default_rng(0)
  n = len(y_train)
  np.savez(path, x_train=rng.integers(0, 256, (n, 8, 8), np.uint8),
           y_train=np.asarray(y_train),
           x_test=rng.integers(0, 256, (4, 8, 8), np.uint8),
           y_test=np.array([0, 1, 2, 3]))
  return f"npz:{path}"


def _fatal(proc):
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  fatal = [l for l in proc.stderr.splitlines() if l.startswith("FATAL")]
  assert len(fatal) == 1, proc.stderr[-3000:]
  return fatal[0]


def test_cli_refuses_labels_outside_the_declared_classes(tmp_path):
  spec = _npz(tmp_path, [0, 1, 2, 3] * 10 + [12, 100000])
  proc = _main(tmp_path, "centralized.py:smoke", f"--config.data.dataset={spec}",
               "--config.data.num_classes=4")
  assert _fatal(proc) == (
      f"FATAL {spec}: y_train must hold class indices in [0, 4) "
      "(num_classes=4), got 2 labels outside it (12, 100000).")


def test_cli_logs_inferred_classes_and_refuses_raw_fedd3_uploads(tmp_path):
  # 40 images of 4 classes over 2 clients of 2 classes: 10 per client class,
  # all uploaded raw with 10 images per class.
  spec = _npz(tmp_path, [0, 1, 2, 3] * 10)
  proc = _main(tmp_path, "fedd3.py:smoke", f"--config.data.dataset={spec}",
               "--config.data.num_clients=2", "--config.fedd3.images_per_class=10")
  assert (f"{spec}: 4 classes inferred from labels 0..3; set "
          "--config.data.num_classes to declare it.") in proc.stderr
  line = _fatal(proc)
  assert line.startswith(
      "FATAL fedd3: client 0 class 0 holds 10 examples <= images_per_class=10: "
      "its KIP support would be those raw images (FedD3 App. G); 4 (client, "
      "class) pairs in all: "), line
  assert line.endswith(
      "Set --config.fedd3.images_per_class below the smallest client class, "
      "or --config.fedd3.allow_raw_upload=True to accept raw uploads."), line


def test_cli_refuses_zero_images_per_class(tmp_path):
  proc = _main(tmp_path, "fedd3.py:smoke", "--config.fedd3.images_per_class=0")
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert ("config.fedd3.images_per_class must be an int >= 1, got 0; set "
          "--config.fedd3.images_per_class.") in proc.stderr, proc.stderr[-2000:]
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("path, value, message", [
    ("fedd3.images_per_class", 0, "must be an int >= 1, got 0"),
    ("fedd3.images_per_class", -2, "must be an int >= 1, got -2"),
    ("data.num_classes", -1, "must be an int >= 0, got -1"),
])
def test_validate_refuses_bad_counts(path, value, message):
  c = fedd3.get_config("smoke")
  group, key = path.split(".")
  c[group][key] = value
  with pytest.raises(ValueError, match=f"config.{path} {message}"):
    common.validate(c)


def test_upload_privacy_guard_follows_the_settings():
  c = fedd3.get_config("smoke")
  labels = np.array([0, 0, 1, 1, 1, 2, 2, 2])
  parts = [np.array([0, 1, 2, 3, 4]), np.array([5, 6, 7])]
  c.fedd3.images_per_class = 2
  with pytest.raises(common.InputError, match=r"^fedd3: client 0 class 0 holds "
                     r"2 examples <= images_per_class=2"):
    common.check_upload_privacy(c, labels, parts)
  for path, value in (("fedd3.allow_raw_upload", True),
                      ("fedd3.distiller", "random"),
                      ("fedd3.images_per_class", 1)):
    d = ml_collections.ConfigDict(c.to_dict())
    group, key = path.split(".")
    d[group][key] = value
    common.check_upload_privacy(d, labels, parts)   # allowed: no error


def test_cli_unloadable_datasets_end_in_one_line(tmp_path):
  # Not an npz archive.
  bad = tmp_path / "bad.npz"
  bad.write_text("not a zip")
  # Refused before the data loads now (a usage error, no FATAL line).
  proc = _main(tmp_path, "centralized.py:smoke",
               f"--config.data.dataset=npz:{bad}")
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert f"{bad} is not an npz archive" in proc.stderr.strip().splitlines()[-1]
  # A TFDS name with no local copy and no network: the proxy the probe
  # goes through is a closed local port, so it fails at once.
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  import os
  env = {**os.environ, "https_proxy": f"http://127.0.0.1:{port}",
         "HTTPS_PROXY": f"http://127.0.0.1:{port}"}
  proc = subprocess.run(
      [sys.executable, "-m", "fedjax_dd.experiments.main",
       "--config=experiments/configs/centralized.py:smoke",
       f"--workdir={tmp_path / 'w2'}", "--config.run.progress=False",
       "--config.data.dataset=svhn_cropped",
       f"--config.data.data_dir={tmp_path / 'tfds'}"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=env)
  line = _fatal(proc)
  assert "Could not load 'svhn_cropped'" in line and "npz:PATH" in line


@pytest.mark.parametrize("path, value, message", [
    ("seed", 2**32, r"config.seed must be an int >= 0 and <= 4294967295, got "
                    r"4294967296"),
    ("data.seed", 2**32 + 3, r"config.data.seed must be an int >= 0 and <= "
                             r"4294967295"),
    ("client.activity", 1e-9, r"config.client.activity: The cohort's "
                              r"activity probability 1e-09 over 8 clients"),
])
def test_validate_refuses_aliased_seeds_and_hopeless_activities(path, value,
                                                                message):
  from fedjax_dd.experiments.configs import fedavg  # pylint: disable=g-import-not-at-top
  c = fedavg.get_config("smoke")  # 8 clients
  node = c
  *groups, key = path.split(".")
  for g in groups:
    node = node[g]
  node[key] = value
  with pytest.raises(ValueError, match=message):
    common.validate(c)


def _images_npz(tmp_path, name, x, y):
  path = tmp_path / f"{name}.npz"
  np.savez(path, x_train=x, y_train=y, x_test=x[:4], y_test=y[:4])
  return f"npz:{path}"


def test_data_the_model_or_partition_cannot_take_is_an_input_error(
    tmp_path, monkeypatch):
  from fedjax_dd.experiments.configs import fedavg  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  y = np.arange(40, dtype=np.int32) % 4
  c = fedavg.get_config("smoke")  # digits_cnn: 8x8x1 input, 8 clients
  # Channels first: [N, 1, 8, 8] read as 8 channels.
  c.data.dataset = _images_npz(
      tmp_path, "nchw", rng.integers(0, 256, (40, 1, 8, 8), np.uint8), y)
  with pytest.raises(common.InputError, match=r"Cannot map 8 channels to 1: "
                     r"images must be NHWC .* channels-first \(NCHW"):
    common.load_and_prepare(c)
  c.data.dataset = _images_npz(
      tmp_path, "rgb", rng.integers(0, 256, (40, 8, 8, 3), np.uint8), y)
  with pytest.raises(common.InputError, match="Cannot map 3 channels to 1.*"
                                              "grayscale"):
    common.load_and_prepare(c)
  # One class for a split of 2 classes per client; more clients than
  # examples; a client left without data.
  labels = np.zeros(40, np.int32)
  with pytest.raises(common.InputError, match=r"data.partition 'pathological' "
                     r"over data.num_clients=8 of .* \(40 training examples, "
                     r"1 classes\): num_classes_per_client"):
    common.partition(c, labels)
  c.data.num_clients = 50
  with pytest.raises(common.InputError, match="num_clients=50 exceeds the 40 "
                                              "samples"):
    common.partition(c, y)
  c.data.num_clients = 2
  monkeypatch.setitem(common.PARTITIONERS, "pathological",
                      lambda labels, n, rng, **kw: [np.arange(40),
                                                    np.arange(0)])
  with pytest.raises(common.InputError, match=r"leaves 1 client without data "
                                              r"\(e.g. client 1\)"):
    common.partition(c, y)


def test_cli_damaged_npz_and_channels_first_end_in_one_line(tmp_path):
  rng = np.random.default_rng(0)
  y = np.arange(40, dtype=np.int32) % 4
  nchw = _images_npz(tmp_path, "nchw",
                     rng.integers(0, 256, (40, 1, 8, 8), np.uint8), y)
  line = _fatal(_main(tmp_path, "fedavg.py:smoke",
                      f"--config.data.dataset={nchw}"))
  assert "channels-first (NCHW" in line
  cut = tmp_path / "cut.npz"
  raw = (tmp_path / "nchw.npz").read_bytes()
  cut.write_bytes(raw[:len(raw) // 2] + raw[-100:])
  line = _fatal(_main(tmp_path, "fedavg.py:smoke",
                      f"--config.data.dataset=npz:{cut}"))
  assert "is a damaged npz archive (BadZipFile" in line
