"""What a setting may be: the one place that decides what is refused.

The library's public builders (:func:`fedjax_dd.fit`,
:func:`fedjax_dd.local_steps`, :class:`fedjax_dd.LocalTraining`, the loops'
options) and the entry point's config checks
(``fedjax_dd.experiments.checks``) refuse values through these functions, so
both refuse the same things with the same words (the entry point naming
``config.client.batch_size`` where a Python caller reads ``batch_size``).

Each check returns the value in its plain Python type, so a caller can use
what it checked.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import jax
import numpy as np


class SettingError(ValueError):
  """A setting outside what it may be (one line: the name, what it must be,
  the value given and, where the caller knows it, what to set)."""


def refuse(name: str, want: str, value: Any, fix: str | None = None) -> None:
  """Raises :class:`SettingError`: ``NAME must be WANT, got VALUE; FIX.``"""
  tail = f"; {fix}." if fix else "."
  raise SettingError(f"{name} must be {want}, got {value!r}{tail}")


def is_int(value: Any) -> bool:
  """An int, a NumPy integer or a 0-d integer array (``steps.max()``), and
  not a bool."""
  if isinstance(value, (bool, np.bool_)):
    return False
  if isinstance(value, (int, np.integer)):
    return True
  dtype = getattr(value, "dtype", None)
  return (dtype is not None and getattr(value, "shape", None) == ()
          and np.issubdtype(dtype, np.integer))


def check_int(name: str, value: Any, low: int, high: int | None = None, *,
              fix: str | None = None) -> int:
  """``value`` as an int in ``[low, high]``; a float, even a whole one
  (``batch_size=16.5`` or ``16.0``), a bool or a string is refused."""
  if not is_int(value) or value < low or (high is not None and value > high):
    refuse(name, f"an int >= {low}" + (f" and <= {high}" if high is not None
                                        else ""), value, fix)
  return int(value)


def check_whole(name: str, value: Any, low: int, *,
                fix: str | None = None) -> int:
  """``value`` as an int ``>= low``, accepting a whole float (``2.0``) but
  not a fraction (``rounds=2.7`` would run 2)."""
  if (isinstance(value, (bool, np.bool_))
      or not isinstance(value, (int, float, np.integer, np.floating))
      or not math.isfinite(value) or int(value) != value or value < low):
    refuse(name, f"a whole number >= {low}", value, fix)
  return int(value)


def check_number(name: str, value: Any, low: float | None = None,
                 high: float | None = None, *, low_open: bool = False,
                 high_open: bool = False, fix: str | None = None) -> float:
  """``value`` as a finite float within the bounds (open where asked)."""
  try:
    number = float(value)
  except (TypeError, ValueError):
    number = math.nan
  ok = math.isfinite(number) and not isinstance(value, (bool, np.bool_, str))
  if ok and low is not None:
    ok = number > low if low_open else number >= low
  if ok and high is not None:
    ok = number < high if high_open else number <= high
  if not ok:
    parts = []
    if low is not None:
      parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
      parts.append(f"{'<' if high_open else '<='} {high:g}")
    refuse(name, " ".join(["a finite number", " and ".join(parts)]).strip(),
           value, fix)
  return number


def is_traced(value: Any) -> bool:
  """A JAX tracer: a hyperparameter traced per run on the run axis
  (:func:`fedjax_dd.fit_runs`), whose concrete value was checked when that
  run's algorithm was built for its ``init``."""
  return isinstance(value, jax.core.Tracer)


def check_scalar(name: str, value: Any, low: float | None = None,
                 high: float | None = None, *, low_open: bool = False,
                 high_open: bool = False, fix: str | None = None) -> Any:
  """:func:`check_number` of a hyperparameter that may be a traced scalar.

  A concrete value is checked and returned as a float; a traced one
  (:func:`is_traced`) is returned unchanged, since its run checked its
  concrete value already and a tracer has no value to compare.

  Raises:
    SettingError: a concrete value outside the bounds; a traced value that
      is not a scalar.
  """
  if is_traced(value):
    if getattr(value, "shape", None) != ():
      refuse(name, "a scalar", value, fix)
    return value
  return check_number(name, value, low, high, low_open=low_open,
                      high_open=high_open, fix=fix)


def check_budget(name: str, value: Any, *, fix: str | None = None) -> float:
  """A wall-clock budget in seconds: ``0`` for none, else ``> 0``; a
  negative one is refused, not read as "no budget"."""
  return check_number(name, value, 0.0, None, fix=fix)


def check_choice(name: str, value: Any, choices: Iterable[Any], *,
                 fix: str | None = None) -> Any:
  """``value`` if it is one of ``choices``."""
  choices = tuple(choices)
  if value not in choices:
    refuse(name, f"one of {list(choices)}", value, fix)
  return value


def check_transformation(name: str, value: Any) -> None:
  """An optax ``GradientTransformation`` (anything with callable ``init``
  and ``update``): a name such as ``"sgd"`` fails here, at construction,
  not inside the jitted client program."""
  if not (callable(getattr(value, "init", None))
          and callable(getattr(value, "update", None))):
    hint = (f" (a name: build it, e.g. optax.{value}(learning_rate))"
            if isinstance(value, str) else "")
    raise SettingError(
        f"{name} must be an optax.GradientTransformation (with init and "
        f"update), got {type(value).__name__} {value!r}{hint}.")
