"""The one summary of a finished run (``summary.json``), built from memory.

:func:`run_summary` turns a driver's metrics rows, ledger, final parameters
and :class:`~fedjax_dd.core.loop.WallClock` into the fields every run
reports (accuracy, traffic, time), then the method's own. With
``gce_gammas`` it adds FedD3's GCE (Song et al., IJCNN 2023, Tab. 2,
:func:`fedjax_dd.core.ledger.gce_summary`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import loop as loop_lib

Row = Mapping[str, Any]

_FROM_ROWS = object()


def clustering_fields(rows: Sequence[Row]) -> dict[str, Any]:
  """Clustered methods' groups per round (DisUE: AP's K and convergence)."""
  rows = [r for r in rows if "num_clusters" in r]
  if not rows:
    return {}
  return {"num_clusters_by_round": [[r["round"], int(r["num_clusters"])]
                                    for r in rows],
          "ap_converged_rounds": sum(int(r["clustering_converged"])
                                     for r in rows)}


def before_iga_fields(rows: Sequence[Row]) -> dict[str, Any]:
  """When the run evaluated ω_G before IGA (DisUE / FedFTG):
  ``accuracy_before_iga_by_round`` and ``before_iga`` = {the final accuracy
  before IGA, IGA's mean gain (after − before) over the evaluated rounds}."""
  rows = [r for r in rows if "test_accuracy_before_iga" in r]
  if not rows:
    return {}
  gains = [r["test_accuracy"] - r["test_accuracy_before_iga"] for r in rows]
  before = {"final_test_accuracy": rows[-1]["test_accuracy_before_iga"],
            "mean_iga_gain": float(np.mean(gains))}
  if "test_class_accuracy_before_iga" in rows[-1]:
    before["final_test_class_accuracy"] = rows[-1][
        "test_class_accuracy_before_iga"]
  return {"accuracy_before_iga_by_round": [
              [r["round"], r["test_accuracy_before_iga"]] for r in rows],
          "before_iga": before}


def class_accuracy_fields(rows: Sequence[Row]) -> dict[str, Any]:
  """The last evaluation's accuracy per class, when the rows log it."""
  rows = [r for r in rows if "test_class_accuracy" in r]
  return ({"final_test_class_accuracy": rows[-1]["test_class_accuracy"]}
          if rows else {})


def personal_fields(rows: Sequence[Row]) -> dict[str, Any]:
  """With personalized evaluation (rows with ``personal_accuracy``): its
  last value with the spread over clients, and the best over the run."""
  rows = [r for r in rows if "personal_accuracy" in r]
  if not rows:
    return {}
  last = rows[-1]
  return {"final_personal_accuracy": last["personal_accuracy"],
          "best_personal_accuracy": max(r["personal_accuracy"] for r in rows),
          "final_personal_accuracy_sd": last.get("personal_accuracy_sd"),
          "final_personal_accuracy_min": last.get("personal_accuracy_min")}


def run_summary(*, method: str, dataset: str, model: str,
                rows: Sequence[Row], ledger: ledger_lib.Ledger, params,
                rounds: int, planned_rounds: int, num_clients: int,
                wall: loop_lib.WallClock,
                paper_departures: Sequence[str] = (),
                gce_gammas: Sequence[float] = (),
                round_key: str = "round",
                curve_name: str = "accuracy_by_round",
                final_test_accuracy: Any = _FROM_ROWS,
                stopped_by_time_budget: bool | None = None,
                extra: Mapping[str, Any] | None = None,
                config: Mapping[str, Any] | None = None,
                code: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """The summary fields every run reports, then ``extra`` and ``config``.

  Args:
    method, dataset, model: what ran (reported as given).
    rows: the metrics rows (``test_accuracy`` where evaluated).
    ledger: the final ledger.
    params: the final global parameters (their count is reported).
    rounds: rounds (or epochs) completed.
    planned_rounds: rounds asked for; fewer completed means the time
      budget stopped the run (unless ``stopped_by_time_budget`` says).
    num_clients: clients of the run.
    wall: the run's wall clock (this process's and every process's seconds).
    paper_departures: where the setting departs from its paper.
    gce_gammas: FedD3's GCE for these gammas (none: no GCE fields).
    round_key: the rows' field the accuracy curve pairs with the accuracy
      (one-shot servers: ``step``).
    curve_name: the curve's name (one-shot servers: ``accuracy_by_epoch``).
    final_test_accuracy: default the last evaluated row's.
    stopped_by_time_budget: default ``rounds < planned_rounds``.
    extra: the method's own fields, added before ``config``.
    config: the run's settings, added last.
    code: the code that computed the figures
      (:func:`fedjax_dd.versions.source_commit`); ``None``: not recorded.
  """
  accs = [r["test_accuracy"] for r in rows if "test_accuracy" in r]
  if final_test_accuracy is _FROM_ROWS:
    final_test_accuracy = accs[-1] if accs else None
  if stopped_by_time_budget is None:
    stopped_by_time_budget = rounds < int(planned_rounds)
  totals = ledger.cumulative()
  efficiency = {}
  if gce_gammas:
    efficiency = ledger_lib.gce_summary(
        ledger, final_accuracy=accs[-1] if accs else None,
        best_accuracy=max(accs) if accs else None,
        gammas=tuple(gce_gammas))
  summary = {
      "method": method,
      "dataset": dataset,
      "model": model,
      "final_test_accuracy": final_test_accuracy,
      "best_test_accuracy": max(accs) if accs else final_test_accuracy,
      **class_accuracy_fields(rows),
      **personal_fields(rows),
      "rounds": rounds,
      "stopped_by_time_budget": bool(stopped_by_time_budget),
      "num_clients": int(num_clients),
      "param_count": ledger_lib.num_params(params),
      "bytes_uploaded": totals["bytes_uploaded"],
      "bytes_downloaded": totals["bytes_downloaded"],
      "bytes_total": totals["bytes_total"],
      "bytes_peer": totals["bytes_peer"],
      "bytes_by_tag": {k: v["bytes_total"]
                       for k, v in ledger.tag_totals().items()},
      "wall_seconds": wall.process(),
      "wall_seconds_total": wall.total(),
      curve_name: [[r[round_key], r["test_accuracy"]] for r in rows
                   if "test_accuracy" in r],
      **clustering_fields(rows),
      **before_iga_fields(rows),
      **efficiency,
      "paper_departures": list(paper_departures),
      **(extra or {}),
  }
  if code is not None:
    summary["code"] = dict(code)
  if config is not None:
    summary["config"] = dict(config)
  return summary
