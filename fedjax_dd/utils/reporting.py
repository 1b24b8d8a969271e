"""Rounds and traffic to reach a target accuracy, in HFLDD's table format.

HFLDD (Shi et al., "Dataset Distillation-based Hybrid Federated Learning on
Non-IID Data", 2024), Tables III-V, compare methods by the communication
rounds and the traffic each needs to reach a target test accuracy, and by the
ratio of that traffic to HFLDD's. :func:`target_table` computes those rows
from runs' ``metrics.jsonl`` rows; :func:`format_table` renders them as
Markdown. Tables over seeds are in :mod:`fedjax_dd.utils.sweep`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from fedjax_dd.core import ledger as ledger_lib

Rows = Sequence[Mapping[str, Any]]


def target_table(runs: Mapping[str, Rows], target_accuracy: float, *,
                 reference: str = "hfldd",
                 accuracy_key: str = "test_accuracy",
                 bytes_key: str = "bytes_total_cumulative"
                 ) -> list[dict[str, Any]]:
  """Rounds and bytes to reach ``target_accuracy`` for every run.

  Args:
    runs: ``{name: metrics rows}`` in round order.
    target_accuracy: accuracy to reach (``>=``).
    reference: the run the ratios are relative to (HFLDD in the paper).
    accuracy_key: row key of the test accuracy.
    bytes_key: row key of the cumulative traffic.

  Returns:
    One dict per run, in the order of ``runs``: ``name``, ``target``,
    ``round`` and ``bytes`` (``None`` if never reached), ``best_accuracy``,
    ``rounds_ratio`` and ``traffic_ratio`` (this run over the reference;
    ``None`` when either did not reach the target or the reference is
    absent from ``runs``).
  """
  reached = {
      name: ledger_lib.traffic_to_target(rows, target_accuracy,
                                         accuracy_key=accuracy_key,
                                         bytes_key=bytes_key)
      for name, rows in runs.items()
  }
  ref = reached.get(reference)
  table = []
  for name, rows in runs.items():
    hit = reached[name]
    accs = [float(r[accuracy_key]) for r in rows
            if r.get(accuracy_key) is not None]
    row: dict[str, Any] = {
        "name": name,
        "target": float(target_accuracy),
        "round": None if hit is None else hit["round"],
        "bytes": None if hit is None else hit["bytes"],
        "best_accuracy": max(accs) if accs else None,
        "rounds_ratio": None,
        "traffic_ratio": None,
    }
    if hit is not None and ref is not None:
      if ref["round"]:
        row["rounds_ratio"] = hit["round"] / ref["round"]
      if ref["bytes"]:
        row["traffic_ratio"] = hit["bytes"] / ref["bytes"]
    table.append(row)
  return table


def format_bytes(b: float | None) -> str:
  """``b`` bytes in B / KB / MB / GB (decimal units); ``"-"`` for ``None``."""
  if b is None:
    return "-"
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
    if b >= scale:
      return f"{b / scale:.2f} {unit}"
  return f"{b:.0f} B"


def format_table(table: Sequence[Mapping[str, Any]]) -> str:
  """Markdown rendering of :func:`target_table` rows."""
  lines = ["| method | target | rounds | traffic | x rounds | x traffic | best acc |",
           "|---|---|---|---|---|---|---|"]
  for r in table:
    ratio = lambda v: "-" if v is None else f"{v:.2f}x"
    lines.append(
        f"| {r['name']} | {r['target']:.2%} | "
        f"{'-' if r['round'] is None else r['round']} | {format_bytes(r['bytes'])} | "
        f"{ratio(r['rounds_ratio'])} | {ratio(r['traffic_ratio'])} | "
        f"{'-' if r['best_accuracy'] is None else format(r['best_accuracy'], '.4f')} |")
  return "\n".join(lines)


def comparison_table(rows: Rows) -> str:
  """Markdown of a comparison of methods: method, final accuracy, bytes
  sent, wall seconds and each row's ``note``.

  Rows with ``expected`` ``(low, high)`` add an ``expected`` column; an
  accuracy outside its range is marked there (:func:`outside_expected`).
  """
  ranged = any(r.get("expected") for r in rows)
  head = ["method", "final accuracy"] + (["expected"] if ranged else []) + [
      "bytes sent", "wall", "note"]
  out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    cells = [str(r["method"]), f"{r['final_test_accuracy']:.4f}"]
    if ranged:
      cells.append(_expected_cell(r))
    cells += [format_bytes(r["bytes_total"]), f"{r['wall_seconds']:.0f} s",
              r.get("note", "")]
    out.append("| " + " | ".join(cells) + " |")
  return "\n".join(out)


def outside_expected(row: Mapping[str, Any]) -> str | None:
  """``"below"`` or ``"above"`` when the row's final accuracy lies outside
  its ``expected`` ``(low, high)``; None inside it or without a range."""
  if not row.get("expected"):
    return None
  low, high = row["expected"]
  acc = row["final_test_accuracy"]
  if acc < low:
    return "below"
  if acc > high:
    return "above"
  return None


def _expected_cell(row: Mapping[str, Any]) -> str:
  if not row.get("expected"):
    return ""
  low, high = row["expected"]
  side = outside_expected(row)
  cell = f"{low:.2f}-{high:.2f}"
  return cell if side is None else f"{cell} (**{side}**)"


def write_comparison(rows: Rows, directory: str, *,
                     title: str | None = None) -> str:
  """Writes ``directory/comparison.png``
  (:func:`fedjax_dd.utils.figures.plot_comparison`, under ``title``) and
  returns :func:`comparison_table` of ``rows``."""
  import os  # pylint: disable=g-import-not-at-top
  from fedjax_dd.utils import figures  # pylint: disable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  figures.plot_comparison(rows, os.path.join(directory, "comparison.png"),
                          title=title)
  return comparison_table(rows)
