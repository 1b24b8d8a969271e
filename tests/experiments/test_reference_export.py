"""The partition exporter for reference implementations
(experiments/reference/export_partition.py) and the adapter's import guard."""

import importlib.util
import json
import pathlib

import numpy as np

_REF = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "reference"


def _load(name):
  spec = importlib.util.spec_from_file_location(name, _REF / f"{name}.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_pack_unpack_round_trip():
  exp = _load("export_partition")
  parts = [np.array([3, 1]), np.array([], np.int64), np.array([0, 2, 4])]
  indices, offsets = exp.pack(parts)
  np.testing.assert_array_equal(offsets, [0, 2, 2, 5])
  np.testing.assert_array_equal(indices, [3, 1, 0, 2, 4])
  for a, b in zip(exp.unpack(indices, offsets), parts):
    np.testing.assert_array_equal(a, b)


def test_export_equals_the_entry_points_partition(tmp_path):
  from fedjax_dd.experiments import common
  from fedjax_dd.experiments.configs import disue
  exp = _load("export_partition")
  config = disue.protocol("fedftg", "smoke")  # digits, 10 clients
  config.seed = config.data.seed = 3
  path = tmp_path / "part.npz"
  summary = exp.export(config, str(path))
  assert summary["clients"] == 10
  f = np.load(path)
  ds = common.load_dataset(config)
  want = common.partition(config, ds.y_train)
  got = exp.unpack(f["indices"], f["offsets"])
  assert len(got) == len(want)
  for a, b in zip(got, want):
    np.testing.assert_array_equal(a, b)
  assert int(f["data_seed"]) == 3 and int(f["num_classes"]) == 10
  assert json.loads(str(f["partition"]))["name"] == "dirichlet_client"
  assert f["mean"].shape == f["std"].shape == (1,)
  assert np.all(f["std"] > 0)


def test_adapter_module_imports_without_torch():
  # The adapter imports torch only inside main(), so CI without torch can
  # still import (and document) it.
  adapter = _load("fedftg_adapter")
  assert "--ref_dir" in adapter.__doc__

