"""What defines a run built from Python objects, as a flat JSON record.

A notebook run (:func:`fedjax_dd.fit`) has no config to fingerprint
(:func:`fedjax_dd.core.workdir.record_fingerprint`): its algorithm is a pair
of closures, its data arrays. :func:`describe` turns such objects into the
values they were built from (arrays by digest), and :func:`flatten` into
``{dotted path: value}``, so that a resume with another learning rate is
refused naming ``algorithm.apply.train.local.optimizer...`` like a config
key.

Left out: the client axis's layout (:data:`HOW_MODULES`) and the models'
layer forms (:data:`FORM_FIELDS`), which change rounding, not what is
computed (:func:`fedjax_dd.core.workdir.record_environment` warns of them
instead); dicts keyed by anything but strings, and empty ones (program
caches); objects of other classes, recorded by their class only.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import math
import types
from typing import Any

import numpy as np

FORM_FIELDS = ("conv_impl", "phase_split", "fuse_first_block", "weight_grads",
               "fold", "fold_norm", "dtype")
"""Model fields that pick how a layer computes, not what: its form and
its compute dtype, on the model or on its layer set (its ``layers`` field,
:class:`fedjax_dd.models.LayerSet`). Another value changes rounding
(bfloat16: precision), so a resume under it is named, not refused (the
policy table's forms, :func:`fedjax_dd.policy.forms`)."""

HOW_MODULES = ("fedjax_dd.core.clients",)
"""Modules that decide how a computation is laid out on devices: their
objects are recorded by class, their functions by the functions they
wrap."""

_SKIPPED_FIELDS = ("parent", "name") + FORM_FIELDS
_MAX_DEPTH = 40


def array_digest(a: Any) -> str:
  """``"sha256:<16 hex> <dtype>[shape]"`` of an array's values."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.dtypes.issubdtype(getattr(a, "dtype", None), jax.dtypes.prng_key):
    a = jax.random.key_data(a)  # a typed key: its bits
  a = np.ascontiguousarray(np.asarray(jax.device_get(a)))
  h = hashlib.sha256(f"{a.dtype.str}|{a.shape}|".encode())
  h.update(a.tobytes())
  return f"sha256:{h.hexdigest()[:16]} {a.dtype}{list(a.shape)}"


def _name(obj: Any) -> str:
  module = getattr(obj, "__module__", None) or ""
  qual = getattr(obj, "__qualname__", None) or getattr(
      obj, "__name__", None) or type(obj).__qualname__
  return f"{module}.{qual}" if module else str(qual)


def describe(obj: Any) -> Any:
  """A JSON-able description of what ``obj`` computes with.

  Numbers and strings as they are; arrays by :func:`array_digest`; lists,
  tuples and dicts item by item; dataclasses and named tuples field by field
  (with their class); functions by name, with the values their closures and
  defaults hold (a jitted function by the function it wraps); any other
  object by its class only. Cycles and nesting past 40 levels end in a
  marker.
  """
  return _describe(obj, (), 0)


def _describe(obj: Any, seen: tuple[int, ...], depth: int) -> Any:
  if obj is None or isinstance(obj, (bool, int, str)):
    return obj
  if isinstance(obj, float):
    return obj if math.isfinite(obj) else str(obj)
  if isinstance(obj, enum.Enum):
    return f"{type(obj).__qualname__}.{obj.name}"
  if isinstance(obj, np.generic):
    return _describe(obj.item(), seen, depth)
  if isinstance(obj, np.ndarray) or (hasattr(obj, "shape")
                                     and hasattr(obj, "dtype")
                                     and hasattr(obj, "__array__")):
    return array_digest(obj)
  if isinstance(obj, (type, types.ModuleType, types.BuiltinFunctionType)):
    return _name(obj)
  if id(obj) in seen:
    return "<cycle>"
  if depth >= _MAX_DEPTH:
    return "<deep>"
  seen, depth = seen + (id(obj),), depth + 1
  walk = lambda v: _describe(v, seen, depth)
  if isinstance(obj, tuple) and hasattr(obj, "_fields"):
    return {"class": _name(type(obj)),
            **{f: walk(getattr(obj, f)) for f in obj._fields}}
  if isinstance(obj, (list, tuple)):
    return [walk(v) for v in obj]
  if isinstance(obj, dict):
    if not obj or not all(isinstance(k, str) for k in obj):
      # A cache a call fills, not a setting.
      return "<cache>"
    return {k: walk(obj[k]) for k in sorted(obj)}
  if type(obj).__module__ in HOW_MODULES:
    return {"class": _name(type(obj))}
  if dataclasses.is_dataclass(obj):
    return {"class": _name(type(obj)),
            **{f.name: walk(getattr(obj, f.name, None))
               for f in dataclasses.fields(obj)
               if f.name not in _SKIPPED_FIELDS
               and _layer_set(getattr(obj, f.name, None)) is None}}
  if isinstance(obj, functools.partial):
    return {"partial": walk(obj.func), "args": walk(list(obj.args)),
            "keywords": walk(dict(obj.keywords))}
  if isinstance(obj, types.MethodType):
    return {"method": _name(obj.__func__), "self": walk(obj.__self__)}
  wrapped = getattr(obj, "__wrapped__", None)
  if wrapped is not None and callable(obj):
    return walk(wrapped)
  if isinstance(obj, types.FunctionType):
    out: dict[str, Any] = {"function": _name(obj)}
    layout = obj.__module__ in HOW_MODULES
    for var, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
      try:
        value = cell.cell_contents
      except ValueError:  # an empty cell (a name bound later)
        out[var] = "<unbound>"
        continue
      if layout and not (callable(value) or dataclasses.is_dataclass(value)
                         or isinstance(value, tuple)):
        continue  # chunk sizes, caps, program caches: the layout
      out[var] = walk(value)
    if obj.__defaults__:
      out["defaults"] = walk(list(obj.__defaults__))
    if obj.__kwdefaults__:
      out["kwdefaults"] = walk(dict(obj.__kwdefaults__))
    return out
  return {"class": _name(type(obj))}


def flatten(tree: Any, prefix: str) -> dict[str, Any]:
  """``{prefix.path: leaf}`` of a :func:`describe` tree (list items by
  index)."""
  out: dict[str, Any] = {}
  if isinstance(tree, dict) and tree:
    for k, v in tree.items():
      out.update(flatten(v, f"{prefix}.{k}"))
  elif isinstance(tree, list) and tree:
    for i, v in enumerate(tree):
      out.update(flatten(v, f"{prefix}.{i}"))
  else:
    out[prefix] = tree
  return out


def _layer_set(value: Any) -> Any:
  """``value`` if it is a model's layer set (its forms, left out of
  :func:`describe` as :data:`FORM_FIELDS` are), else None."""
  if (dataclasses.is_dataclass(value) and not isinstance(value, type)
      and type(value).__name__ == "LayerSet"):
    return value
  return None


def forms_of(module: Any) -> dict[str, Any]:
  """The :data:`FORM_FIELDS` a model instance or its layer set sets,
  ``{"task.<field>": value}``: what
  :func:`fedjax_dd.core.workdir.record_environment` records as the run's
  forms."""
  layer_set = _layer_set(getattr(module, "layers", None))
  out = {}
  for f in FORM_FIELDS:
    holder = layer_set if hasattr(layer_set, f) else module
    if hasattr(holder, f):
      value = getattr(holder, f)
      if f == "dtype" and value is not None:
        value = np.dtype(value).name  # "float32", "bfloat16"
      out[f"task.{f}"] = _describe(value, (), 0)
  return out
