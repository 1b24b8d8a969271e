"""FedD3 runner: reusing a distillation through ``distilled_from``."""

import os

import numpy as np
import pytest

from fedjax_dd.experiments import run_fedd3
from fedjax_dd.experiments import runners
from fedjax_dd.experiments.configs import fedd3


def _smoke():
  config = fedd3.get_config("smoke")
  config.progress = False
  config.rounds = 1
  return config


def test_distilled_from_reuses_the_upload_and_checks_settings(tmp_path):
  config = _smoke()
  first = runners.RUNNERS[config.runner](config, str(tmp_path / "a"))
  cache = tmp_path / "a" / "distilled.npz"
  with np.load(cache) as z:
    x_first = z["x"].copy()
    assert str(z["fingerprint"]) == run_fedd3.distill_fingerprint(config)

  # A server-side variant trains on the same upload without distilling.
  config = _smoke()
  config.distilled_from = str(cache)
  config.lr = 0.05
  config.batch_size = 8
  second = runners.RUNNERS[config.runner](config, str(tmp_path / "b"))
  assert not os.path.exists(tmp_path / "b" / "distilled.npz")
  assert second["distilled_from"] == str(cache)
  assert second["distilled_images_total"] == first["distilled_images_total"] == 40
  assert second["bytes_total"] == first["bytes_total"]
  assert second["distill_seconds"] == first["distill_seconds"]
  loaded, _ = run_fedd3._load_distilled(str(cache), config)
  np.testing.assert_array_equal(loaded.x, x_first)

  # A distillation setting differs: the cache is refused.
  config = _smoke()
  config.distilled_from = str(cache)
  config.kip_lr = 0.01
  with pytest.raises(ValueError, match="different settings"):
    runners.RUNNERS[config.runner](config, str(tmp_path / "c"))
