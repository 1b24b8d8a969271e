"""The persistent compilation cache is the test session's (tests/conftest.py),
reaches the subprocesses tests start, and is never set by the package."""

import os
import subprocess
import sys

import pytest

_PROBE = ("import fedjax_dd, jax; fedjax_dd.configure_cpu(); "
          "print(jax.config.jax_compilation_cache_dir, "
          "jax.config.jax_persistent_cache_min_compile_time_secs)")


def _probe(env):
  proc = subprocess.run([sys.executable, "-c", _PROBE], env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return proc.stdout.split()


def test_subprocesses_inherit_the_session_cache():
  cache_dir = os.environ["JAX_COMPILATION_CACHE_DIR"]
  if not cache_dir:
    pytest.skip("the cache is turned off (JAX_COMPILATION_CACHE_DIR=)")
  # Every program is cached, not only those over JAX's default second.
  assert _probe(dict(os.environ)) == [cache_dir, "0.0"]


def test_importing_the_package_sets_no_cache():
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_COMPILATION_CACHE",
                              "JAX_PERSISTENT_CACHE"))}
  # JAX's own defaults: no directory, programs under a second not kept.
  assert _probe(env) == ["None", "1.0"]
