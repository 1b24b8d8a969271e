"""Metrics output: ``metrics.jsonl`` (one JSON object per row) and summaries."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping


def to_jsonable(value: Any) -> Any:
  """Converts NumPy/JAX scalars and arrays, tuples and mappings to JSON types."""
  if isinstance(value, Mapping):
    return {str(k): to_jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_jsonable(v) for v in value]
  if hasattr(value, "tolist"):
    return to_jsonable(value.tolist())
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value


class MetricsWriter:
  """Appends rows to ``DIR/metrics.jsonl``; truncates on resume.

  Args:
    path: the JSONL file.
  """

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)

  def rows(self) -> list[dict[str, Any]]:
    if not os.path.exists(self.path):
      return []
    with open(self.path) as f:
      return [json.loads(line) for line in f if line.strip()]

  def truncate_after(self, round_index: int, key: str = "round") -> None:
    """Drops rows past ``round_index`` (written after the last checkpoint)."""
    kept = [r for r in self.rows() if r.get(key, 0) <= round_index]
    with open(self.path, "w") as f:
      for r in kept:
        f.write(json.dumps(r, sort_keys=True) + "\n")

  def write(self, row: Mapping[str, Any]) -> None:
    with open(self.path, "a") as f:
      f.write(json.dumps(to_jsonable(row), sort_keys=True) + "\n")


def write_json(path: str | os.PathLike, obj: Mapping[str, Any]) -> None:
  """Writes ``obj`` as indented JSON atomically (write, then rename)."""
  tmp = os.fspath(path) + ".tmp"
  with open(tmp, "w") as f:
    json.dump(to_jsonable(obj), f, indent=2, sort_keys=True)
  os.replace(tmp, path)
