"""Quickstart glue: each member method's own runner, then one comparison.

``run(config, workdir, run_member=)`` builds every member's config (its preset, the
shared ``data`` settings and ``seed``, its overrides), runs it through its
runner in ``WORKDIR/<method>`` (a re-run resumes each), and writes the
comparison: the printed table, ``comparison.png``
(:func:`fedjax_dd.utils.reporting.write_comparison`) and ``summary.json``.
Each row carries its member's ``note`` (what the row shows, or why the system
cannot show it in the quickstart's budget) and its range
``config.expected[method]``; a one-shot member's baseline row (the one-shot
FedAvg of its own clients) carries ``baseline_note`` and
``config.expected[method + "_baseline"]``. With ``run.progress`` each
member's start is one line on stderr, then its own progress lines.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
from typing import Any, Callable

import ml_collections

from fedjax_dd.core import side_by_side
from fedjax_dd.core.workdir import Workdir
from fedjax_dd.experiments import registry
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
  c.model.compute_dtype = config.model.compute_dtype
  for path, value in m.overrides:
    base_lib.set_path(c, path, value)
  c.run.progress = config.run.progress
  c.run.checkpoint_every = config.run.checkpoint_every
  return c


def start_order(config: ml_collections.ConfigDict) -> list[str]:
  """The members in the order they start: ``config.start_order``'s that
  run, then the others in ``config.order``."""
  return ([n for n in config.start_order if n in config.order]
          + [n for n in config.order if n not in config.start_order])


def _check(config: ml_collections.ConfigDict) -> None:
  side_by_side.check_runs(list(config.order), config.workers,
                          start_order(config))


def table(rows: list[dict[str, Any]]) -> str:
  """Markdown: method, final accuracy, bytes sent, wall seconds, note
  (:func:`fedjax_dd.utils.reporting.comparison_table`)."""
  return reporting.comparison_table(rows)


def footer(rows: list[dict[str, Any]], seconds: float,
           source: str, cpu_seconds: float | None = None) -> str:
  """The lines under the table: the whole run's wall time (and CPU time of
  this process, all its threads, with the cores it had), and for each row
  outside its expected range, what that means."""
  if cpu_seconds is None:
    lines = [f"Whole run: {seconds:.0f} s."]
  else:
    lines = [f"Whole run: {seconds:.0f} s wall, {cpu_seconds:.0f} s CPU on "
             f"{os.cpu_count()} cores."]
  for r in rows:
    side = reporting.outside_expected(r)
    if side is not None:
      low, high = r["expected"]
      lines.append(
          f"{r['method']}: {r['final_test_accuracy']:.4f} is {side} its "
          f"expected range {low:.2f}-{high:.2f} (measured over seeds and "
          f"jax versions: {source}); compare the other rows, and the "
          "machine and versions recorded there.")
  return "\n".join(lines)


def run(config: ml_collections.ConfigDict, workdir: str, *,
        run_member: Callable[[ml_collections.ConfigDict, str],
                             dict[str, Any]]) -> dict[str, Any]:
  """Runs every member with ``run_member(config, workdir) -> summary`` (the
  entry point's :func:`fedjax_dd.experiments.registry.run_recorded`), then the
  comparison."""
  start, start_cpu = time.time(), time.process_time()
  members = {name: member_config(config, name) for name in config.order}

  def announce(name: str) -> None:
    if config.run.progress:
      i = list(config.order).index(name)
      print(f"[{i + 1}/{len(config.order)}] {name}: "
            f"{config.members[name].get('note', '')}", file=sys.stderr,
            flush=True)

  summaries = side_by_side.run_side_by_side(
      {name: functools.partial(run_member, members[name],
                               os.path.join(workdir, name))
       for name in config.order},
      workers=config.workers, on_start=announce,
      start_order=start_order(config))
  rows = []
  for name, summary in summaries.items():  # one row per method, no loop body
    m = config.members[name]
    rows.append({"method": name,
                 "final_test_accuracy": summary["final_test_accuracy"],
                 "expected": config.expected.get(name),
                 "bytes_total": summary["bytes_total"],
                 "wall_seconds": summary["wall_seconds"],
                 "workdir": name, "note": m.get("note", "")})
    if summary.get("os_fedavg_test_accuracy") is not None:
      # The one-shot methods' clients, averaged: the server's baseline.
      rows.append({"method": f"{name}: one-shot FedAvg of its clients",
                   "final_test_accuracy": summary["os_fedavg_test_accuracy"],
                   "expected": config.expected.get(f"{name}_baseline"),
                   "bytes_total": summary["bytes_total"],
                   "wall_seconds": 0.0, "workdir": name,
                   "note": m.get("baseline_note", "")})
  work = Workdir(workdir)
  seconds = time.time() - start
  cpu_seconds = time.process_time() - start_cpu
  title = (f"Quickstart: {config.data.dataset}, {config.data.num_clients} "
           f"clients, seed {config.seed}")
  print(reporting.write_comparison(rows, work.directory, title=title))
  print(footer(rows, seconds, config.expected.source, cpu_seconds))
  summary = {"method": "quickstart", "dataset": config.data.dataset,
             "methods": rows, "wall_seconds": seconds,
             "cpu_seconds": cpu_seconds,
             "figures": ["comparison.png"], "config": config.to_dict()}
  work.write_summary(summary)
  return summary


def _run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  return run(config, workdir, run_member=registry.run_recorded)


registry.declare(registry.Method("quickstart", pipeline=_run, check=_check))
