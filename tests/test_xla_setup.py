"""fedjax_dd._xla_setup: when the host device count is (not) set."""

from __future__ import annotations

import pytest

from fedjax_dd import _xla_setup


@pytest.fixture
def fresh(monkeypatch):
  """A process whose JAX backend is not initialised yet, 2 usable cores."""
  monkeypatch.setattr(_xla_setup, "_backend_initialised", lambda: False)
  monkeypatch.setattr(_xla_setup, "_usable_cores", lambda: 2)
  for var in ("XLA_FLAGS", "FEDJAX_DD_NO_XLA_FLAGS", "FEDJAX_DD_HOST_DEVICES"):
    monkeypatch.delenv(var, raising=False)
  return monkeypatch


def test_appends_one_device_per_core(fresh):
  fresh.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
  assert _xla_setup.configure()
  import os
  assert os.environ["XLA_FLAGS"] == (
      "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=2")
  # Idempotent: a second import adds nothing.
  assert not _xla_setup.configure()


def test_respects_an_explicit_count_and_the_opt_out(fresh):
  import os
  fresh.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
  assert not _xla_setup.configure()
  assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4"
  fresh.delenv("XLA_FLAGS")
  fresh.setenv("FEDJAX_DD_NO_XLA_FLAGS", "1")
  assert not _xla_setup.configure()
  assert "XLA_FLAGS" not in os.environ


def test_leaves_an_initialised_backend_alone(fresh):
  import os
  fresh.setattr(_xla_setup, "_backend_initialised", lambda: True)
  assert not _xla_setup.configure()
  assert "XLA_FLAGS" not in os.environ


def test_count_override_cap_and_single_core(fresh):
  fresh.setattr(_xla_setup, "_usable_cores", lambda: 64)
  assert _xla_setup.host_device_count() == _xla_setup.MAX_HOST_DEVICES
  fresh.setenv("FEDJAX_DD_HOST_DEVICES", "3")
  assert _xla_setup.host_device_count() == 3
  fresh.setenv("FEDJAX_DD_HOST_DEVICES", "0")
  with pytest.raises(ValueError, match="FEDJAX_DD_HOST_DEVICES"):
    _xla_setup.host_device_count()
  fresh.delenv("FEDJAX_DD_HOST_DEVICES")
  fresh.setattr(_xla_setup, "_usable_cores", lambda: 1)
  import os
  assert not _xla_setup.configure()  # one device is XLA's default anyway
  assert "XLA_FLAGS" not in os.environ


@pytest.mark.parametrize("value,message", [
    ("abc", r"^FEDJAX_DD_HOST_DEVICES must be an int >= 1 \(host devices for "
     r"the client axis\), got 'abc'; unset it for one per core\.$"),
    ("2.5", r"got '2.5'"), ("-1", r"got '-1'")])
def test_bad_host_device_counts_are_named(fresh, value, message):
  fresh.setenv("FEDJAX_DD_HOST_DEVICES", value)
  with pytest.raises(ValueError, match=message):
    _xla_setup.host_device_count()


def test_the_opt_out_reads_on_and_off(fresh):
  for value, off in (("1", True), ("true", True), ("0", False),
                     ("false", False), ("", False)):
    fresh.setenv("FEDJAX_DD_NO_XLA_FLAGS", value)
    assert _xla_setup.no_xla_flags() is off
  # "0" used to turn the options off, as any non-empty value did.
  fresh.setenv("FEDJAX_DD_NO_XLA_FLAGS", "0")
  assert _xla_setup.configure()
  fresh.setenv("FEDJAX_DD_NO_XLA_FLAGS", "maybe")
  with pytest.raises(ValueError, match=r"^FEDJAX_DD_NO_XLA_FLAGS must be 1 "
                     r".* or 0 .*, got 'maybe'\.$"):
    _xla_setup.configure()


def _clean_env():
  import os
  env = {k: v for k, v in os.environ.items()
         if k not in ("XLA_FLAGS", "FEDJAX_DD_NO_XLA_FLAGS",
                      "FEDJAX_DD_HOST_DEVICES")}
  return env


def test_import_has_no_side_effects():
  import subprocess
  import sys
  out = subprocess.run(
      [sys.executable, "-c",
       "import fedjax_dd, os; print(os.environ.get('XLA_FLAGS'))"],
      env=_clean_env(), capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "None"


def test_configure_cpu_before_jax_gives_one_device_per_core():
  import subprocess
  import sys
  env = {**_clean_env(), "FEDJAX_DD_HOST_DEVICES": "2"}
  out = subprocess.run(
      [sys.executable, "-c",
       "import fedjax_dd; print(fedjax_dd.configure_cpu()); import jax; "
       "print(jax.local_device_count()); print(fedjax_dd.configure_cpu())"],
      env=env, capture_output=True, text=True, check=True)
  assert out.stdout.split() == ["True", "2", "False"]
