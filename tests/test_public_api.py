"""The curated public API: every name resolves, lazily."""

import subprocess
import sys

import fedjax_dd


def test_every_public_name_resolves():
  for name in fedjax_dd.__all__:
    assert getattr(fedjax_dd, name) is not None, name
  assert set(fedjax_dd.__all__) <= set(dir(fedjax_dd))
  # The two algorithm shapes and a factory of each.
  assert fedjax_dd.fedavg.__module__ == "fedjax_dd.algorithms.fedavg"
  assert fedjax_dd.ServerDistillation._fields[:3] == ("client_stage", "setup",
                                                      "init")


def test_unknown_name_is_an_attribute_error():
  try:
    fedjax_dd.fedavgg  # pylint: disable=pointless-statement
  except AttributeError as e:
    assert "fedavgg" in str(e)
  else:
    raise AssertionError("no error")


def test_import_loads_no_framework():
  # Importing the package loads neither JAX nor an algorithm module.
  code = ("import sys, fedjax_dd; "
          "print(sorted(m for m in ('jax', 'flax', 'fedjax_dd.algorithms') "
          "if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, check=True).stdout.strip()
  assert out == "[]"
