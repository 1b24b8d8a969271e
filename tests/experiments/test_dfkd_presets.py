"""The data-free presets: DENSE's own adversarial weight, the student
optimiser, the client protocol teachers_from checks."""

import copy
import json

import pytest

from fedjax_dd.experiments import checks
from fedjax_dd.experiments import common
from fedjax_dd.experiments import run_fedhydra
from fedjax_dd.experiments import sections

from fedjax_dd.experiments.configs import base as base_config
from fedjax_dd.experiments.configs import dense as dense_config
from fedjax_dd.experiments.configs import feddf as feddf_config
from fedjax_dd.experiments.configs import fedhydra as fedhydra_config
from tests.conftest import validate_with_shared_data

PRESETS = ["smoke", "smoke_hetero", "mnist_a0.5", "mnist_a0.1", "mnist_2cc",
           "fmnist_a0.5", "cifar10_a0.1", "mnist_a0.5_gpu",
           "mnist_a0.5_hetero", "cifar10_a0.1_hetero_gpu",
           "mnist_a0.01_paper", "mnist_a0.1_paper"]


@pytest.mark.parametrize("arg", ["mnist_a0.01_paper", "mnist_a0.1_paper"])
def test_paper_presets_are_the_gpu_scale_from_own_inits(arg):
  c = fedhydra_config.get_config(arg)
  gpu = fedhydra_config.get_config(arg.replace("_paper", "_gpu"))
  assert c.client.independent_init and not gpu.client.independent_init
  assert (c.client.local_epochs, c.dfkd.distill_epochs) == (200.0, 200)
  # The shared start is the _gpu presets' one departure more.
  assert gpu.paper_departures[1:] == c.paper_departures
  assert "share one initialisation" in gpu.paper_departures[0]
  c.client.independent_init = False
  c.paper_departures = gpu.paper_departures
  assert c.to_dict() == gpu.to_dict()
  validate_with_shared_data(c)


@pytest.mark.parametrize("arg", PRESETS)
def test_dense_uses_its_own_adversarial_weight(arg):
  dense, hydra = dense_config.get_config(arg), fedhydra_config.get_config(arg)
  # DENSE's λ2 (documented in dense.py), not FedHydra's λ2 = 1 (Sec. 4.1.5).
  assert dense_config.LAMBDA_ADV == 0.5
  assert dense.dfkd.lambda_adv == 0.5
  assert hydra.dfkd.lambda_adv == 1.0
  # Apart from the method and λ2 the presets are the same, so DENSE distils
  # the same clients (teachers_from) with the same student protocol.
  d, h = dense.to_dict(), hydra.to_dict()
  for group, key in ((d, "method"), (h, "method"), (d["dfkd"], "lambda_adv"),
                     (h["dfkd"], "lambda_adv")):
    group.pop(key)
  assert d == h


@pytest.mark.parametrize("arg", PRESETS)
def test_student_optimiser_follows_the_documented_protocol(arg):
  for c in (fedhydra_config.get_config(arg), dense_config.get_config(arg)):
    # Paper Sec. 4.1.5: SGD, lr 0.01; momentum 0.9 of the reference code.
    assert c.dfkd.student_lr == 0.01
    assert c.dfkd.student_momentum == 0.9
    # Clients: SGD lr 0.01 (0.05 on the digits smoke runs), no momentum.
    lr = 0.05 if arg.startswith("smoke") else 0.01
    assert (c.client.optimizer, c.client.lr, c.client.momentum) == (
        "sgd", lr, 0.0)


def test_feddf_keeps_fedhydras_clients():
  df, fh = feddf_config.get_config("mnist_a0.5"), fedhydra_config.get_config(
      "mnist_a0.5")
  # The client protocol: every field teachers_from checks.
  for path in base_config.fingerprint_paths("client_protocol"):
    assert common.config_value(df, path) == common.config_value(fh, path), path


def test_client_protocol_names_every_setting_of_the_client_models():
  c = fedhydra_config.get_config("mnist_a0.5")
  base = json.loads(run_fedhydra._protocol(c))
  assert base["client.grad_clip"] == 0.0
  assert "data.resize_method" not in base  # no resizing: not part of it
  for path, value in (("client.grad_clip", 10.0), ("data.resplit", 0.8),
                      ("data.num_classes", 10)):
    other = copy.deepcopy(c)
    base_config.set_path(other, path, value)
    assert json.loads(run_fedhydra._protocol(other))[path] == value, path
  c.data.input_shape = (32, 32, 1)
  assert json.loads(run_fedhydra._protocol(c))["data.resize_method"] == (
      "bilinear")


def test_dfkd_protocol_defaults_to_dense_and_paper_drops_momentum():
  from fedjax_dd.distill import dfkd
  from fedjax_dd.experiments import stage_builders
  for arg in PRESETS:
    # "dense" keeps every measured preset's loop (and its results).
    assert fedhydra_config.get_config(arg).dfkd.protocol == "dense", arg
  c = fedhydra_config.get_config("smoke")
  assert stage_builders.student_momentum(c) == 0.9
  c.dfkd.protocol = "paper"
  checks.check_values(c)
  # Sec. 4.1.5: SGD, lr 0.01, no momentum; Alg. 1's loop.
  assert stage_builders.student_momentum(c) == 0.0
  hp = sections.dfkd(c.dfkd)
  assert (hp.protocol, hp.reset_generator, hp.pool_size,
          hp.student_steps) == ("paper", False, 1, 1)
  c.dfkd.protocol = "alg1"
  with pytest.raises(ValueError, match="dfkd.protocol"):
    checks.check_values(c)


def test_a_resume_under_another_dfkd_protocol_is_refused(tmp_path):
  from fedjax_dd.core import workdir
  c = fedhydra_config.get_config("smoke")
  fp = common.fingerprint(c)
  assert fp["dfkd.protocol"] == "dense"
  # A run recorded before the key existed resumes under its default ...
  old = {k: v for k, v in fp.items() if k != "dfkd.protocol"}
  workdir.record_fingerprint(tmp_path, old)
  (tmp_path / "metrics.jsonl").write_text('{"round": 1}\n')
  assert workdir.record_fingerprint(tmp_path, fp, defaults=fp) == "same"
  # ... and under the other protocol it is refused, naming the key.
  c.dfkd.protocol = "paper"
  with pytest.raises(workdir.FingerprintMismatchError,
                     match="dfkd.protocol"):
    workdir.record_fingerprint(tmp_path, common.fingerprint(c), defaults=fp)

