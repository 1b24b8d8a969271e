"""Differentially private runs from configs: DP-FedAvg's and DP-KIP's
settings are refused before the data loads when unusable, recorded in the
run's fingerprint, and their epsilon lands in summary.json."""

import json

import pytest

from fedjax_dd.core import workdir as workdir_lib
from fedjax_dd.experiments import common, registry
from fedjax_dd.experiments.configs import dp_fedavg, fedd3, hfldd
from fedjax_dd.privacy import accounting

pytest.importorskip("dp_accounting")


def _smoke(**overrides):
  c = dp_fedavg.get_config("smoke")
  c.run.progress = False
  for path, value in overrides.items():
    node = c
    *parents, leaf = path.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


def test_presets_validate_and_register():
  for preset in ("smoke", "mnist_noniid", "cifar10_noniid"):
    c = dp_fedavg.get_config(preset)
    common.validate(c)
    registry.check_method(c)
    assert (c.dp.clip, c.dp.noise_multiplier, c.dp.delta) == (1.0, 1.0, 1e-5)
  c = dp_fedavg.get_config("mnist_noniid")
  assert (c.data.num_clients, c.rounds, c.client.local_epochs) == (500, 18,
                                                                   10.0)
  # FedD3's CIFAR-10 multi-shot protocol, as fedavg.py:cifar10_fedd3.
  c = dp_fedavg.get_config("cifar10_noniid")
  assert (c.data.dataset, c.model.name, c.data.num_clients, c.rounds,
          c.client.local_epochs) == ("npz:../shared/datasets/cifar10.npz",
                                     "alexcifarnet", 500, 6, 10.0)
  assert "dp_fedavg" in registry.methods("federated")
  with pytest.raises(ValueError, match="'dp_fedavg' is declared by "
                     "fedjax_dd.experiments.runners"):
    registry.declare(registry.Method(
        "dp_fedavg", rounds=lambda config, training: None))
  with pytest.raises(ValueError, match=r"expected one of \['cifar10_noniid', "
                     r"'mnist_noniid', 'smoke'\]"):
    dp_fedavg.get_config("bogus")


@pytest.mark.parametrize("overrides, message", [
    ({"dp.clip": 0.0}, "config.dp.clip must be a finite number > 0, got 0.0; "
     "set --config.dp.clip."),
    ({"dp.noise_multiplier": -1.0}, "config.dp.noise_multiplier must be a "
     "finite number >= 0, got -1.0; set --config.dp.noise_multiplier."),
    ({"dp.delta": 1.0}, "config.dp.delta must be a finite number > 0 and "
     "< 1, got 1.0; set --config.dp.delta."),
    ({"method": "fedavg"}, "config.dp is DP-FedAvg's group, but config."
     "method is 'fedavg', which does not read it; use "
     "--config=experiments/configs/dp_fedavg.py:<preset>."),
    ({"model.name": "cnn2"}, "config.model.name='cnn2' keeps BatchNorm "
     "statistics, which DP-FedAvg's clients would upload and the server "
     "average without noise, outside the guarantee; set "
     "--config.model.name to a model without BatchNorm."),
])
def test_dp_fedavg_settings_refused_before_the_data_loads(overrides,
                                                          message):
  with pytest.raises(ValueError) as e:
    common.validate(_smoke(**overrides))
  assert str(e.value) == message


def _fedd3(**kip):
  c = fedd3.get_config("smoke")
  for k, v in kip.items():
    c.kip[k] = v
  return c


@pytest.mark.parametrize("config, message", [
    (lambda: _fedd3(dp_clip=-1.0), "config.kip.dp_clip must be a finite "
     "number >= 0, got -1.0; set --config.kip.dp_clip."),
    (lambda: _fedd3(dp_clip=1.0, dp_delta=0.0), "config.kip.dp_delta must "
     "be a finite number > 0 and < 1, got 0.0; set --config.kip.dp_delta."),
    (lambda: _fedd3(dp_clip=1.0, stop_accuracy=0.999), "config.kip."
     "stop_accuracy must be None or above 1 (no early stop) with DP-KIP "
     "(dp_clip > 0): a stop on a target batch's accuracy is not private, "
     "got 0.999; set --config.kip.stop_accuracy."),
    (lambda: _fedd3(dp_noise_multiplier=1.0), "config.kip.dp_clip must be "
     "> 0 when dp_noise_multiplier > 0 (the noise is sigma * dp_clip), got "
     "0.0; set --config.kip.dp_clip."),
])
def test_dp_kip_settings_refused_before_the_data_loads(config, message):
  with pytest.raises(ValueError) as e:
    common.validate(config())
  assert str(e.value) == message


def test_a_stop_above_one_is_no_stop():
  # What a float key can be set to from the command line instead of None
  # (fedd3.py:mnist_noniid_kip --config.kip.stop_accuracy=2).
  c = fedd3.get_config("mnist_noniid_kip")
  c.kip.dp_clip, c.kip.stop_accuracy = 1.0, 2.0
  common.validate(c)


def test_dp_kip_needs_a_kip_upload():
  c = _fedd3(dp_clip=1.0)
  c.fedd3.distiller = "gmm"
  with pytest.raises(ValueError, match=r"^config.kip.dp_clip=1 runs DP-KIP, "
                     r"but config.fedd3.distiller='gmm' uploads no KIP "
                     r"images; set --config.kip.dp_clip=0 or "
                     r"--config.fedd3.distiller=kip.$"):
    common.validate(c)
  h = hfldd.get_config("smoke")
  h.kip.dp_clip = 1.0
  common.validate(h)  # member_data=kip
  h.hfldd.member_data = "random"
  with pytest.raises(ValueError, match="config.hfldd.member_data='random'"):
    common.validate(h)


def test_a_dp_run_without_dp_accounting_is_refused(monkeypatch):
  import importlib.util  # pylint: disable=g-import-not-at-top
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
      None if name == "dp_accounting" else find_spec(name, *a)))
  common.validate(fedd3.get_config("smoke"))  # no DP: nothing to account
  for config in (_smoke(), _fedd3(dp_clip=1.0)):
    with pytest.raises(ValueError, match=r'^A differentially private run .*'
                       r'pip install "fedjax-dd\[privacy\]".$'):
      common.validate(config)


def test_dp_settings_are_in_the_fingerprints():
  c = _smoke()
  run = common.fingerprint(c)
  assert {"dp.clip", "dp.noise_multiplier", "dp.delta"} <= set(run)
  k = _fedd3(dp_clip=1.0, dp_noise_multiplier=0.5)
  upload = common.fingerprint(k, "fedd3_distill")
  assert (upload["kip.dp_clip"], upload["kip.dp_noise_multiplier"]) == (
      1.0, 0.5)
  assert "kip.dp_delta" not in upload  # delta changes the epsilon, not the set
  assert {"kip.dp_clip", "kip.dp_noise_multiplier",
          "kip.dp_delta"} <= set(common.fingerprint(k))
  h = common.fingerprint(hfldd.get_config("smoke"), "hfldd_stages")
  assert "kip.dp_clip" in h and "kip.dp_delta" not in h


def test_a_dp_fedavg_run_records_its_epsilon_and_refuses_other_dp_settings(
    tmp_path):
  workdir = str(tmp_path / "w")
  summary = registry.run_recorded(_smoke(rounds=1), workdir)
  with open(f"{workdir}/summary.json") as f:
    written = json.load(f)
  for s in (summary, written):
    assert s["dp_epsilon"] == pytest.approx(
        accounting.epsilon(1.0, 1.0, 1, 1e-5))
    assert (s["dp_clip"], s["dp_noise_multiplier"], s["dp_delta"],
            s["dp_sampling_rate"], s["dp_steps"]) == (1.0, 1.0, 1e-5, 1.0, 1)
  for path, value, old in (("dp.noise_multiplier", 2.0, 1.0),
                           ("dp.clip", 0.5, 1.0), ("dp.delta", 1e-6, 1e-5)):
    with pytest.raises(workdir_lib.FingerprintMismatchError,
                       match=rf"{path} was {old}, now {value}"):
      registry.run_recorded(_smoke(rounds=2, **{path: value}), workdir)


def test_a_dp_kip_fedd3_run_records_its_epsilon(tmp_path):
  c = _fedd3(dp_clip=1.0, dp_noise_multiplier=1.0, max_iterations=5)
  c.rounds, c.run.progress = 1, False
  common.validate(c)
  summary = registry.run_recorded(c, str(tmp_path / "d3"))
  # Target batches of 10 over the smallest of the 10 digits clients.
  q = summary["dp_sampling_rate"]
  assert 0.0 < q < 1.0 and summary["dp_steps"] == 5
  assert summary["dp_epsilon"] == pytest.approx(
      accounting.epsilon(1.0, q, 5, 1e-5))
  assert summary["privacy"]["identical_to_raw_count"] == 0
