"""Shared fixtures: tiny models and synthetic client data."""

from __future__ import annotations

import dataclasses
import os

# The suite runs in two worker processes (pyproject.toml): on a GPU each
# would otherwise reserve most of its memory at start.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# Many tests, and the entry-point subprocesses they start (which inherit
# os.environ), compile the same programs: keep them in a persistent
# compilation cache inside the checkout (git-ignored), every program
# included (JAX's defaults skip the ones that compile in under a second,
# most of this suite's on CPU). Set here, before JAX is imported, and never
# by the package: for users the cache stays opt-in. .ci/run sets its own
# directory per leg; `JAX_COMPILATION_CACHE_DIR=` (empty) turns it off.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(_REPO, ".ci-cache", "jax"))
# Older jax returns wrong executables from the persistent cache for this
# suite: on jax 0.5.3, tests/kernels/test_krr.py and tests/core/test_local.py
# fail with the cache (NaN solves, zero updates) and pass without it. Keep
# it off there, whatever the environment says; jax 0.12 passes the whole
# suite with it.
_CACHE_MIN_JAX = (0, 12)


from fedjax_dd import versions  # noqa: E402  (imports no jax)

if versions.version_tuple()[:2] < _CACHE_MIN_JAX:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = ""
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import fedjax_dd  # noqa: E402

# The suite runs on the engine's default CPU layout (one host device per
# core), as the entry point sets it; importing the package sets nothing.
fedjax_dd.configure_cpu()

import flax.linen as nn  # noqa: E402  (after the device layout)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fedjax_dd.core.task import Classifier  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATASETS = os.path.join(REPO_ROOT, "..", "shared", "datasets")


def shared_dataset(name: str) -> str:
  """Path of a file in ../shared/datasets, or skip the test if absent."""
  path = os.path.join(SHARED_DATASETS, name)
  if not os.path.exists(path):
    pytest.skip(f"{name} not available in ../shared/datasets")
  return path


class TinyNet(nn.Module):
  """A 2-layer MLP on ``[B, H, W, Ch]`` inputs (``[B, 4, 4, 1]`` by default)."""
  num_classes: int = 3

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(8)(x))
    return nn.Dense(self.num_classes)(x)


class TinyBNNet(nn.Module):
  """Like :class:`TinyNet` with a BatchNorm layer."""
  num_classes: int = 3

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = x.reshape((x.shape[0], -1))
    x = nn.Dense(8)(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    return nn.Dense(self.num_classes)(nn.relu(x))


def tiny_task(bn: bool = False, input_shape=(4, 4, 1)) -> Classifier:
  module = TinyBNNet() if bn else TinyNet()
  return Classifier(module=module, input_shape=tuple(input_shape),
                    preprocess=lambda x: x.astype(jnp.float32) / 255.0,
                    num_classes=3)


def tracing_task(traces: list) -> Classifier:
  """:func:`tiny_task` whose preprocessing appends to ``traces`` each time
  it is traced: a test of recompilation counts ``len(traces)``."""

  def preprocess(x):
    traces.append(1)
    return x.astype(jnp.float32) / 255.0

  return dataclasses.replace(tiny_task(), preprocess=preprocess)


def synthetic_clients(num_clients=4, sizes=(5, 9, 12, 7), n_max=12, seed=0):
  """Padded client data ``[C, n_max, 4, 4, 1]`` whose label depends on the image."""
  rng = np.random.default_rng(seed)
  x = np.zeros((num_clients, n_max, 4, 4, 1), np.uint8)
  y = np.zeros((num_clients, n_max), np.int32)
  for c in range(num_clients):
    n = sizes[c]
    labels = rng.integers(0, 3, n)
    imgs = rng.integers(0, 60, (n, 4, 4, 1))
    imgs[np.arange(n), labels, 0, 0] += 180  # a learnable signal
    x[c, :n] = imgs
    y[c, :n] = labels
  return x, y, np.asarray(sizes[:num_clients], np.int32)


@pytest.fixture
def task():
  return tiny_task()


def rounds_compile_nothing(caplog, algorithm, state, data, num_steps, *,
                           clients_per_round: int, rounds: int = 3):
  """Runs one round, then ``rounds`` more under ``jax.log_compiles``;
  asserts that the later rounds compiled nothing and returns
  ``(state, rows)`` of the later rounds."""
  import logging  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core import rounds as rounds_lib  # pylint: disable=g-import-not-at-top
  options = lambda n: rounds_lib.RoundsOptions(
      num_rounds=n, clients_per_round=clients_per_round, progress=False)
  state, ledger, _ = rounds_lib.run_rounds(algorithm, state, data, num_steps,
                                           options(1))
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    caplog.clear()
    state, _, rows = rounds_lib.run_rounds(algorithm, state, data, num_steps,
                                           options(rounds), ledger=ledger)
  compiles = [r.getMessage() for r in caplog.records
              if "Compiling" in r.getMessage()]
  assert not compiles, compiles
  return state, rows


def x64():
  """A context with 64-bit JAX types (``jax.enable_x64`` on new jax,
  ``jax.experimental.enable_x64`` before it)."""
  import jax  # pylint: disable=g-import-not-at-top
  if hasattr(jax, "enable_x64"):
    return jax.enable_x64(True)
  from jax.experimental import enable_x64  # pylint: disable=g-import-not-at-top
  return enable_x64()


def validate_with_shared_data(config) -> None:
  """``common.validate(config)`` once every ``npz:`` file of ``config.data``
  under ``../shared/datasets`` is present; skips the test otherwise (the
  checks before it still ran)."""
  # pylint: disable-next=g-import-not-at-top
  from fedjax_dd.experiments import common
  for key in ("dataset", "public_data", "aux_dataset"):
    value = config.data.get(key)
    if isinstance(value, str) and "shared/datasets/" in value:
      shared_dataset(value.rsplit("shared/datasets/", 1)[1])
  common.validate(config)
