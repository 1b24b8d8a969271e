"""Quickstart glue: each member method's own runner, then one comparison.

``run(config, workdir, run_member=)`` builds every member's config (its preset, the
shared ``data`` settings and ``seed``, its overrides), runs it through its
runner in ``WORKDIR/<method>`` (a re-run resumes each), and writes the
comparison: the printed table, ``comparison.png``
(:func:`fedjax_dd.utils.reporting.write_comparison`) and ``summary.json``.
Each row carries its member's ``note`` (what the row shows, or why the system
cannot show it in the quickstart's budget); a one-shot member's baseline row
(the one-shot FedAvg of its own clients) carries ``baseline_note``.
"""

from __future__ import annotations

import importlib
import os
import time
from typing import Any, Callable

import ml_collections

from fedjax_dd.core.workdir import Workdir
from fedjax_dd.experiments.configs import base as base_lib
from fedjax_dd.utils import reporting


def member_config(config: ml_collections.ConfigDict,
                  name: str) -> ml_collections.ConfigDict:
  """The config of member ``name``: its preset with the shared settings
  (data, partition, seed, ``model.conv_impl``)."""
  m = config.members[name]
  module = importlib.import_module(
      f"fedjax_dd.experiments.configs.{m.config}")
  c = module.get_config(m.preset)
  c.seed = config.seed
  for key in ("dataset", "num_clients", "partition", "seed"):
    c.data[key] = config.data[key]
  # How convolutions are computed (same results to float rounding) is the
  # run's, as --config.model.conv_impl sets it on the quickstart.
  c.model.conv_impl = config.model.conv_impl
  for path, value in m.overrides:
    base_lib.set_path(c, path, value)
  c.run.progress = config.run.progress
  return c


def table(rows: list[dict[str, Any]]) -> str:
  """Markdown: method, final accuracy, bytes sent, wall seconds, note
  (:func:`fedjax_dd.utils.reporting.comparison_table`)."""
  return reporting.comparison_table(rows)


def run(config: ml_collections.ConfigDict, workdir: str, *,
        run_member: Callable[[ml_collections.ConfigDict, str],
                             dict[str, Any]]) -> dict[str, Any]:
  """Runs every member with ``run_member(config, workdir) -> summary`` (the
  runner table's :func:`fedjax_dd.experiments.registry.run`), then the
  comparison."""
  start = time.time()
  rows = []
  for name in config.order:  # one run per method, not a training loop
    member = member_config(config, name)
    summary = run_member(member, os.path.join(workdir, name))
    m = config.members[name]
    rows.append({"method": name,
                 "final_test_accuracy": summary["final_test_accuracy"],
                 "bytes_total": summary["bytes_total"],
                 "wall_seconds": summary["wall_seconds"],
                 "workdir": name, "note": m.get("note", "")})
    if summary.get("os_fedavg_test_accuracy") is not None:
      # The one-shot methods' clients, averaged: the server's baseline.
      rows.append({"method": f"{name}: one-shot FedAvg of its clients",
                   "final_test_accuracy": summary["os_fedavg_test_accuracy"],
                   "bytes_total": summary["bytes_total"],
                   "wall_seconds": 0.0, "workdir": name,
                   "note": m.get("baseline_note", "")})
  work = Workdir(workdir)
  print(reporting.write_comparison(rows, work.directory))
  summary = {"method": "quickstart", "dataset": config.data.dataset,
             "methods": rows, "wall_seconds": time.time() - start,
             "figures": ["comparison.png"], "config": config.to_dict()}
  work.write_summary(summary)
  return summary
