"""Hyper-parameter dataclasses built from a config section in one call.

:func:`from_section` reads every field from the key of its name; a key
without a field or a field without a key raises, so a setting added on one
side only fails at once. The library names no config key; the experiments'
glue knows each group's layout.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Collection, Mapping, TypeVar

T = TypeVar("T")


def from_section(cls: type[T], section: Mapping[str, Any], *,
                 other_keys: Collection[str] = (), **given: Any) -> T:
  """``cls(**fields)`` with each field not in ``given`` from ``section``.

  Args:
    cls: a dataclass.
    section: a config section (a ``ConfigDict`` or a mapping), one key per
      field.
    other_keys: keys of ``section`` that are not fields (read by the caller).
    **given: fields derived by the caller instead of read.

  Raises:
    KeyError: naming a key of ``section`` that is neither a field nor in
      ``other_keys``, or a field that is neither a key nor in ``given``.
  """
  fields = [f.name for f in dataclasses.fields(cls)]
  keys = set(section.keys())
  stray = sorted(keys - set(fields) - set(other_keys))
  if stray:
    raise KeyError(f"{cls.__name__}: config keys {stray} are "
                   "neither fields nor listed in its other_keys.")
  missing = [f for f in fields if f not in keys and f not in given]
  if missing:
    raise KeyError(f"{cls.__name__}: fields {missing} have no "
                   "config key of their name.")
  return cls(**{f: given[f] if f in given else section[f] for f in fields})
