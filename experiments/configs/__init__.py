"""Experiment configs (ml_collections ConfigDicts, big_vision style)."""

from __future__ import annotations

import importlib
import os
import re

# Not runnable configs.
_NOT_CONFIGS = ("__init__", "base")
# No preset is named so (':' would end a path, and no name holds a NUL).
_PROBE = "\0"


def catalog() -> list[tuple[str, str, str]]:
  """Every config file: ``(file name, one-line description, presets)``.

  The description is the first line of the file's docstring. The presets
  are what the file's ``get_config`` names when it refuses an unknown one
  (every config does, docs/bad_inputs.md), so this list cannot drift from
  the presets the files accept; ``"none"`` for a config without presets.
  """
  directory = os.path.dirname(os.path.abspath(__file__))
  out = []
  for file in sorted(os.listdir(directory)):
    name, ext = os.path.splitext(file)
    if ext != ".py" or name in _NOT_CONFIGS:
      continue
    module = importlib.import_module(f"{__name__}.{name}")
    # The docstring's first paragraph (a first line may wrap).
    first = " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())
    try:
      module.get_config(_PROBE)
      presets = "?"
    except ValueError as e:
      presets = _named_presets(str(e))
    out.append((file, first, presets))
  return out


def _named_presets(refusal: str) -> str:
  """The presets a refusal of an unknown preset names, as one line."""
  if "has none" in refusal:
    return "none"
  text = refusal.split("expected", 1)[-1].strip()
  text = re.sub(r"^one of ", "", text).rstrip(".")
  # A list or tuple's repr: its names, comma-separated.
  if text[:1] in "[(" and text[-1:] in "])":
    return ", ".join(re.findall(r"'([^']*)'", text))
  # A pattern's lists of parts: {a, b}.
  return re.sub(r"[\[(]('[^']*'(?:, '[^']*')*)[\])]",
                lambda m: "{" + ", ".join(re.findall(r"'([^']*)'",
                                                     m.group(1))) + "}", text)
