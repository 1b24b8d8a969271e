"""from_section: one key per field, stray keys and missing fields refused."""

import dataclasses

import pytest

from fedjax_dd.core.hparams import from_section


@dataclasses.dataclass(frozen=True)
class _Toy:
  a: int = 1
  b: float = 2.0


def test_reads_each_field_from_its_key():
  assert from_section(_Toy, {"a": 3, "b": 4.5}) == _Toy(a=3, b=4.5)


def test_given_fields_and_other_keys():
  toy = from_section(_Toy, {"a": 3, "width": 7}, other_keys=("width",), b=0.5)
  assert toy == _Toy(a=3, b=0.5)


def test_a_key_without_a_field_is_refused():
  with pytest.raises(KeyError, match=r"\['c'\]"):
    from_section(_Toy, {"a": 3, "b": 4.5, "c": 0})


def test_a_field_without_a_key_is_refused_despite_its_default():
  with pytest.raises(KeyError, match=r"\['b'\]"):
    from_section(_Toy, {"a": 3})
