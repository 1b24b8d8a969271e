"""Value checks before the dataset loads (experiments/checks.py)."""

import jax
import numpy as np
import pytest

from fedjax_dd.data import sources
from fedjax_dd.experiments import common
from fedjax_dd.experiments.configs import base as base_lib
from fedjax_dd.experiments.configs import disue as disue_config
from fedjax_dd.experiments.configs import fedavg as fedavg_config
from fedjax_dd.experiments.configs import fedd3 as fedd3_config
from fedjax_dd.experiments.configs import feddf as feddf_config
from fedjax_dd.experiments.configs import fedhydra as fedhydra_config
from fedjax_dd.experiments.configs import hfldd as hfldd_config
from fedjax_dd.experiments.configs import ifca as ifca_config
from fedjax_dd.experiments.configs import moon as moon_config

_PRESETS = {"fedavg": lambda: fedavg_config.get_config("smoke"),
            "fedhydra": lambda: fedhydra_config.get_config("smoke"),
            "feddf": lambda: feddf_config.get_config("smoke"),
            "disue": lambda: disue_config.get_config("smoke"),
            "hfldd": lambda: hfldd_config.get_config("smoke"),
            "fedd3": lambda: fedd3_config.get_config("smoke"),
            "ifca": lambda: ifca_config.get_config("smoke")}


@pytest.mark.parametrize("preset,path,value,message", [
    # Each of these was refused only after the data loaded or compute
    # started (issue 41: partition options, sampling, public_size, damping
    # after 12 s, support_size after 15 s, names, chunk_size, iterations).
    ("feddf", "data.partition.alpha", -1.0,
     r"config.data.partition.alpha must be a finite number > 0, got -1.0; "
     r"set --config.data.partition.alpha\."),
    ("fedavg", "data.partition.num_classes_per_client", 0,
     r"data.partition.num_classes_per_client must be an int >= 1, got 0"),
    ("fedavg", "data.partition.style", "foo",
     r"data.partition.style must be one of \['balanced', 'hfldd', 'fedd3'\]"),
    ("fedavg", "client.clients_per_round", -3,
     r"config.client.clients_per_round must be an int >= 0, got -3"),
    ("fedavg", "client.clients_per_round", 500,
     r"at most config.data.num_clients = 8 .*got 500"),
    ("fedavg", "client.client_fraction", 0.0,
     r"client_fraction must be a finite number > 0 and <= 1, got 0.0"),
    ("fedavg", "client.client_fraction", 1.5, r"<= 1, got 1.5"),
    ("fedavg", "client.activity", 1.5,
     r"client.activity must be a finite number >= 0 and <= 1, got 1.5"),
    ("fedavg", "client.activity", -0.1, r">= 0 and <= 1, got -0.1"),
    ("feddf", "data.public_size", 0,
     r"config.data.public_size must be an int >= 1 \(images drawn from "
     r"data.public_data='digits'\), got 0"),
    ("feddf", "data.public_data", "foo",
     r"config.data.public_data: Unknown dataset 'foo'.*Set "
     r"--config.data.public_data\."),
    ("feddf", "data.public_data", "npz:/nonexistent/x.npz",
     r"file not found: /nonexistent/x.npz"),
    ("feddf", "data.public_data", "", r"config.data.public_data must be a "
     r"dataset name"),
    ("hfldd", "data.aux_dataset", "npz:", r"missing path after 'npz:'"),
    ("disue", "disue.damping", 1.0,
     r"config.disue.damping must be a finite number >= 0.5 and < 1, got 1.0"),
    ("disue", "disue.similarity", "cos", r"disue.similarity must be one of"),
    ("hfldd", "hfldd.support_size", 0,
     r"config.hfldd.support_size must be an int >= 1, got 0"),
    ("fedavg", "client.optimizer", "foo",
     r"client.optimizer must be one of \['sgd', 'adam', 'adamw'\], got 'foo'"),
    ("fedavg", "engine.backend", "foo",
     r"engine.backend must be one of \['auto', 'vmap'"),
    ("fedavg", "model.name", "foo", r"config.model.name must be one of \["),
    ("fedavg", "model.init", "kaiming",
     r"model.init must be one of \['', 'torch'\]"),
    ("fedavg", "model.proj_dim", 64,
     r"config.model.proj_dim must be 0 for model 'digits_cnn' \(it sets the "
     r"width of MOON's projection head"),
    ("fedavg", "model.proj_dim", -1,
     r"config.model.proj_dim must be an int >= 0, got -1"),
    ("fedavg", "model.client_models", "digits_cnn,foo",
     r"model.client_models must be comma-separated names"),
    ("fedavg", "engine.chunk_size", -1,
     r"config.engine.chunk_size must be an int >= 0, got -1"),
    ("fedavg", "engine.run_chunk_size", -1,
     r"config.engine.run_chunk_size must be an int >= 0, got -1"),
    ("disue", "iga.iterations", 0,
     r"config.iga.iterations must be >= 1, got 0; set --config.iga.iterations"),
    ("disue", "iga.discrepancy", "l2", r"config.iga.discrepancy must be one"),
    ("fedd3", "kip.reg", float("nan"),
     r"config.kip.reg must be a finite number .*set --config.kip.reg\."),
    ("fedd3", "fedd3.distiller", "pca", r"fedd3.distiller must be one of"),
    ("ifca", "ifca.num_clusters", 50, r"ifca.num_clusters must be at most"),
    ("fedavg", "data.seed", -1, r"config.data.seed must be an int >= 0"),
    ("fedavg", "data.input_shape", (4, 4), r"config.data.input_shape must "
     r"be \(\) \(the model's\) or \(H, W, Ch\) of positive ints, got \(4, 4\)"),
    ("fedavg", "data.resplit", 1.0, r"data.resplit must be a finite number "
     r">= 0 and < 1"),
    # A traceback ("A loss curve needs steps >= 2") after the data loaded.
    ("fedhydra", "dfkd.stratify_steps", 1,
     r"config.dfkd.stratify_steps must be a finite number >= 2, got 1; set "
     r"--config.dfkd.stratify_steps\."),
    ("fedhydra", "dfkd.stratify_batch_size", 0,
     r"config.dfkd.stratify_batch_size must be a finite number >= 1, got 0"),
])
def test_settings_refused_before_the_data_loads(preset, path, value, message):
  config = _PRESETS[preset]()
  common.validate(config)  # the preset itself is fine
  base_lib.set_path(config, path, value)
  with pytest.raises(ValueError, match=message):
    common.validate(config)


def test_a_float_upload_of_another_distiller_is_refused_before_the_data():
  # Only KIP's support goes as float32; GMM and random images are uint8.
  config = _PRESETS["fedd3"]()
  config.fedd3.distiller, config.fedd3.float_upload = "gmm", True
  with pytest.raises(ValueError, match=(
      r"^config.fedd3.float_upload must be False for the 'gmm' distiller, "
      r"which sends uint8 images .*; set --config.fedd3.float_upload\.$")):
    common.validate(config)
  config.fedd3.distiller = "kip"
  common.validate(config)


def test_check_name_refuses_without_loading(tmp_path):
  sources.check_name("digits")
  path = tmp_path / "d.npz"
  np.savez(path, x_train=np.zeros(1))
  sources.check_name(f"npz:{path}")  # a zip: its arrays are read later
  path.write_bytes(b"not a zip")
  with pytest.raises(ValueError, match="is not an npz archive"):
    sources.check_name(f"npz:{path}")
  with pytest.raises(ValueError, match="is a directory, not an npz file"):
    sources.check_name(f"npz:{tmp_path}")
  with pytest.raises(ValueError, match=r"Unknown dataset 'dgits'"):
    sources.check_name("dgits")
  with pytest.raises(ValueError, match="file not found"):
    sources.check_name(f"npz:{tmp_path / 'missing.npz'}")


def test_a_partition_that_leaves_classes_to_no_client_is_refused():
  config = fedavg_config.get_config("smoke")  # pathological, 2 per client
  labels = np.repeat(np.arange(10), 5)        # 10 classes of 5
  config.data.num_clients = 1
  with pytest.raises(common.InputError, match=(
      r"^data.partition 'pathological' over data.num_clients=1 gives no "
      r"client classes .* \(8 of 10 classes, 40 of 50 training examples, "
      r"80 %\); the test set still holds them\. Raise "
      r"--config.data.num_clients")):
    common.partition(config, labels)
  config.data.num_clients = 5                 # 5 x 2 covers all 10 classes
  parts = common.partition(config, labels)
  assert sum(p.size for p in parts) == 50


def test_a_partition_that_leaves_a_few_classes_out_is_a_warning(caplog):
  """At most half the data left out: the run goes on, with the figures in
  a warning (a pathological split of 8 clients misses class 9 of digits)."""
  labels = np.repeat(np.arange(10), 5)
  config = fedavg_config.get_config("smoke")
  parts = [np.flatnonzero(labels < 6)]        # classes 6-9: 40 % left out
  with caplog.at_level("WARNING"):
    common.check_coverage(config, labels, parts)
  assert "(4 of 10 classes, 20 of 50 training examples, 40 %)" in caplog.text
  with pytest.raises(common.InputError, match=r"\(6 of 10 classes"):
    common.check_coverage(config, labels, [np.flatnonzero(labels < 4)])


def test_moon_projection_width_reaches_the_model():
  config = moon_config.get_config("smoke")
  config.model.proj_dim = 8
  common.validate(config)  # a '<name>_proj' model takes a width
  params, _ = common.load_and_prepare(config).task.init(jax.random.PRNGKey(0))
  assert params["proj2"]["kernel"].shape[-1] == 8
  assert params["out"]["kernel"].shape[0] == 8
