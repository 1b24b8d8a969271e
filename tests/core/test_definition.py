"""What defines a run, read from the objects it is built from."""

import dataclasses
import functools

import jax
import numpy as np

from fedjax_dd.core import clients
from fedjax_dd.core import definition


def _factory(lr, mapper=clients.ClientMapper()):
  cache = {}

  def update(g):
    cache[(g,)] = g  # a program cache, filled as the run goes
    return -lr * g, mapper

  return update


@dataclasses.dataclass(frozen=True)
class _Model:
  width: int
  conv_impl: str = "auto"


def test_closure_values_are_recorded_by_path():
  flat = definition.flatten(definition.describe(_factory(0.5)), "algorithm")
  assert flat["algorithm.lr"] == 0.5
  assert flat["algorithm.function"].endswith("_factory.<locals>.update")
  # Another learning rate is another run, named by its path.
  other = definition.flatten(definition.describe(_factory(0.1)), "algorithm")
  assert [k for k in flat if flat[k] != other.get(k)] == ["algorithm.lr"]


def test_layout_caches_and_forms_are_left_out():
  a = _factory(0.5)
  before = definition.describe(a)
  a(1.0)  # fills the cache
  assert definition.describe(a) == before
  assert before["cache"] == "<cache>"
  # The client mapper (backend, chunks) is recorded by its class only.
  b = _factory(0.5, clients.ClientMapper(backend="vmap", chunk_size=3))
  assert definition.describe(b) == before
  # A model's layer form is the environment's, not the run's.
  assert definition.describe(_Model(4, "patches")) == definition.describe(
      _Model(4, "forward"))
  assert definition.forms_of(_Model(4, "patches")) == {
      "task.conv_impl": "patches"}


def test_arrays_partials_and_keys_by_digest():
  x = np.arange(6, dtype=np.int32)
  d = definition.describe(functools.partial(np.add, x))
  assert d["args"] == [definition.array_digest(x)]
  assert definition.array_digest(x).endswith(" int32[6]")
  assert definition.array_digest(x) != definition.array_digest(x[::-1].copy())
  # A typed key and a raw one of the same seed hold the same bits.
  assert definition.array_digest(jax.random.key(0)) == (
      definition.array_digest(jax.random.PRNGKey(0)))
