"""FedD3 runner: summary figures, the distilled-set stage cache, the random control."""

import json
import os

import numpy as np
import pytest

from fedjax_dd.algorithms import fedd3 as fedd3_lib
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import server as server_lib
from fedjax_dd.core.stage_cache import StageCache, StaleStageError
from fedjax_dd.experiments import common
from fedjax_dd.experiments import run_fedd3
from fedjax_dd.experiments import registry
from fedjax_dd.experiments import stage_builders
from fedjax_dd.experiments.configs import base
from fedjax_dd.experiments.configs import fedd3


def _smoke(**overrides):
  """The smoke preset, 1 round; ``overrides`` by dotted path with ``__``
  for ``.`` (``fedd3__distiller="random"``)."""
  config = fedd3.get_config("smoke")
  config.run.progress = False
  config.rounds = 1
  for k, v in overrides.items():
    base.set_path(config, k.replace("__", "."), v)
  return config


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
  """One KIP smoke run (10 clients x 2 classes x 2 images), shared."""
  workdir = tmp_path_factory.mktemp("fedd3") / "a"
  summary = registry.run(_smoke(), str(workdir))
  return workdir, summary


def test_smoke_summary_reports_gce_privacy_and_kip_statistics(smoke_run):
  workdir, s = smoke_run
  with open(workdir / "summary.json") as f:
    assert json.load(f)["gce"] == s["gce"]
  # Each client sends 4 images of 8x8 uint8 pixels plus a byte per label:
  # V_1 = 4 * (64 * 8 + 8) = 2,080 bits; the cohort total is ten of them.
  assert s["gce_message_bits"] == [[1, 2080.0]]
  assert s["bytes_uploaded"] == 10 * 2080 // 8
  acc = s["final_test_accuracy"]
  assert s["gce"] == ledger_lib.gce_table(acc, [2080], (0.01, 0.5))
  assert s["gce_cohort"] == ledger_lib.gce_table(acc, [20800], (0.01, 0.5))
  assert s["gce"]["0.5"] > s["gce_cohort"]["0.5"]
  departures = s["paper_departures"]
  assert departures == list(fedd3.get_config("smoke").paper_departures)
  assert departures and all(isinstance(d, str) for d in departures)
  p = s["privacy"]
  assert p["uploaded_images"] == 40
  assert 0.0 <= p["identical_to_raw_fraction"] <= 1.0
  assert p["identical_to_raw_count"] == round(40 * p["identical_to_raw_fraction"])
  # The preset runs its fixed KIP budget with the privacy guard on: no
  # upload is a raw image.
  assert p["identical_to_raw_count"] == 0
  assert 0.0 <= p["nearest_raw_l2_min"] <= p["nearest_raw_l2_median"]
  kl, ki = s["kip_loss"], s["kip_iterations"]
  assert set(kl) == {"first_min", "first_median", "last_min", "last_median"}
  assert all(np.isfinite(v) and v >= 0 for v in kl.values())
  assert kl["first_min"] <= kl["first_median"]
  assert 1 <= ki["min"] <= ki["median"] <= ki["max"] <= 20
  assert s["distilled_cached"] is False
  hit = StageCache.for_workdir(workdir).load(
      run_fedd3.STAGE, run_fedd3.distill_fingerprint(_smoke()))
  assert hit.arrays["iterations"].shape == (10,)
  assert hit.arrays["first_loss"].shape == (10,)
  assert hit.info["seconds"] == s["distill_seconds"]


def _cached(workdir):
  hit = StageCache.for_workdir(workdir).load(
      run_fedd3.STAGE, run_fedd3.distill_fingerprint(_smoke()))
  return fedd3_lib.DistilledSet.from_arrays(hit.arrays, **{
      k: hit.info[k] for k in ("learned_labels", "centered_labels")})


def test_distilled_from_reuses_the_upload_and_checks_settings(smoke_run, tmp_path):
  workdir, first = smoke_run
  x_first = _cached(workdir).x

  # A server-side variant trains on the same upload without distilling.
  config = _smoke(fedd3__distilled_from=str(workdir), client__lr=0.05,
                  client__batch_size=8)
  second = registry.run(config, str(tmp_path / "b"))
  assert not os.path.exists(tmp_path / "b" / "stages")
  assert second["distilled_from"] == str(workdir) and second["distilled_cached"]
  assert second["distilled_images_total"] == first["distilled_images_total"] == 40
  assert second["bytes_total"] == first["bytes_total"]
  assert second["distill_seconds"] == first["distill_seconds"]
  assert second["kip_loss"] == first["kip_loss"]
  assert second["privacy"] == first["privacy"]
  np.testing.assert_array_equal(_cached(workdir).x, x_first)

  # A distillation setting differs: the cache is refused, naming it.
  config = _smoke(fedd3__distilled_from=str(workdir), kip__lr=0.01)
  with pytest.raises(StaleStageError, match=r"kip\.lr"):
    registry.run(config, str(tmp_path / "c"))
  # A workdir without a distilled set.
  config = _smoke(fedd3__distilled_from=str(tmp_path / "nothing"))
  with pytest.raises(ValueError, match="holds no distilled set"):
    registry.run(config, str(tmp_path / "d"))


def test_own_cache_under_other_settings_is_refused(smoke_run, tmp_path):
  workdir, _ = smoke_run
  # Reusing a workdir with another partition seed is a different experiment.
  with pytest.raises(ValueError, match=r"data\.seed"):
    registry.run(_smoke(data__seed=1), str(workdir))


def test_a_killed_run_resumes_on_its_cached_distilled_set(
    smoke_run, tmp_path, monkeypatch):
  _, reference = smoke_run
  workdir = tmp_path / "killed"

  def killed(*args, **kwargs):
    raise KeyboardInterrupt("killed after the distillation")

  # Killed once the distilled set is cached, before the server trains.
  with monkeypatch.context() as m:
    m.setattr(server_lib, "run_server_rounds", killed)
    with pytest.raises(KeyboardInterrupt):
      registry.run(_smoke(), str(workdir))
  assert not os.path.exists(workdir / "summary.json")

  # The rerun must not distill again.
  def no_distiller(*args, **kwargs):
    raise AssertionError("distilled again")

  monkeypatch.setattr(stage_builders, "distiller", no_distiller)
  s = registry.run(_smoke(), str(workdir))
  assert s["distilled_cached"] is True
  # The same upload and training as an uninterrupted run.
  for k in ("final_test_accuracy", "bytes_total", "gce", "privacy",
            "kip_loss", "kip_iterations", "accuracy_by_round"):
    assert s[k] == reference[k], k
  hit = StageCache.for_workdir(workdir).load(
      run_fedd3.STAGE, run_fedd3.distill_fingerprint(_smoke()))
  assert s["distill_seconds"] == hit.info["seconds"]
  with open(workdir / "summary.json") as f:
    assert json.load(f)["distilled_cached"] is True


def test_random_control_sends_raw_images_at_the_same_budget(smoke_run, tmp_path):
  _, kip = smoke_run
  s = registry.run(_smoke(fedd3__distiller="random"),
                              str(tmp_path / "r"))
  assert s["distiller"] == "random"
  assert s["distilled_images_total"] == kip["distilled_images_total"] == 40
  assert s["bytes_total"] == kip["bytes_total"]
  assert s["gce_message_bits"] == kip["gce_message_bits"]
  p = s["privacy"]
  assert p["identical_to_raw_fraction"] == 1.0
  assert p["nearest_raw_l2_median"] == 0.0
  assert s["kip_loss"] is None and s["kip_iterations"] is None


@pytest.mark.slow
def test_hybrid_with_learned_labels_trains_on_soft_targets(tmp_path):
  config = _smoke(method="fedd3_hybrid", kip__learn_labels=True,
                  kip__max_iterations=3, kip__stop_accuracy=None)
  s = registry.run(config, str(tmp_path / "h"))
  assert s["learned_labels"] is True
  assert np.isfinite(s["final_test_accuracy"])
  assert s["kip_iterations"]["min"] == s["kip_iterations"]["max"] == 3
  # Each image travels with 10 float32 soft-label entries: 64 * 8 + 320
  # bits. Round 1: each client uploads its 4 images and its model.
  image = 64 * 8 + 10 * 32
  model = s["param_count"] * 32
  assert s["gce_message_bits"] == [[1, 4 * image + model]]
  # Downloads: each client receives the other 36 images (no model: seeded).
  assert s["bytes_downloaded"] == 10 * 36 * image // 8
  assert s["bytes_uploaded"] == (40 * image + 10 * model) // 8


def test_early_stopped_kip_that_sends_raw_images_is_refused(tmp_path):
  # A stop rule met at once leaves the support at its raw initial images.
  config = _smoke(kip__stop_accuracy=0.0, kip__min_iterations=0)
  with pytest.raises(common.InputError,
                     match=r"fedd3: 40 of 40 KIP images to upload are "
                     r"byte-identical .*no early stop: kip\.stop_accuracy "
                     r"above 1, e\.g\. --config\.kip\.stop_accuracy=2\), "
                     r"or set --config\.fedd3\.allow_raw_upload=True"):
    registry.run(config, str(tmp_path / "raw"))
  # Accepted on request, and measured.
  s = registry.run(_smoke(kip__stop_accuracy=0.0,
                                      kip__min_iterations=0,
                                      fedd3__allow_raw_upload=True),
                               str(tmp_path / "ok"))
  assert s["privacy"]["identical_to_raw_count"] == 40
