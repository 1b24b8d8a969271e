r"""Audit benchmark: the audit of a finished FedD3 run against its own
distillation time (the target: at most twice as long).

  fedjax-dd --config=experiments/configs/fedd3.py:mnist_noniid_kip --workdir=workdir/d3
  python -m fedjax_dd.experiments.bench.bench_audit --workdir=workdir/d3 \
      --out bench_audit.json

Reads the run's config from ``WORKDIR/summary.json``
(:func:`fedjax_dd.experiments.auditing.finished_config`) and audits its
uploads as ``--config.audit.enabled=True`` would
(:func:`fedjax_dd.experiments.auditing.audit_fedd3`: image MIA in pixels
and random features, reconstruction, label leakage), with ``audit.json``
written to a scratch folder so that the run's own is left alone. The data
are loaded and partitioned once before the clock starts (the run had them
already). Reported:

* ``audit_first_seconds``: the first audit, compilation included, as a run
  pays it; ``audit_seconds``: the best of ``--reps`` audits after it;
* ``distill_seconds``: the run's own distillation (its ``summary.json``,
  compilation included);
* ``ratio_first`` = ``audit_first_seconds / distill_seconds`` (the target:
  at most 2), and ``ratio`` with the warm audit;
* the commit, jax version and devices of this process, and the run's.

A benchmark, not a test: its figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import time


def measure(workdir: str, reps: int = 2, holdout: int | None = None) -> dict:
  """Times the audit of the FedD3 run in ``workdir`` (module docstring)."""
  import jax
  from fedjax_dd import versions
  from fedjax_dd.experiments import auditing
  from fedjax_dd.experiments import common

  with open(os.path.join(workdir, "summary.json"), encoding="utf-8") as f:
    summary = json.load(f)
  config = auditing.finished_config(workdir)
  if config.runner != "fedd3":
    raise SystemExit(f"{workdir} holds a run of runner {config.runner!r}; "
                     "bench_audit times FedD3's upload audit.")
  if holdout is not None:
    config.audit.holdout = int(holdout)
  # The uploads are read from the run; audit.json goes to a scratch folder.
  if not config.fedd3.distilled_from:
    config.fedd3.distilled_from = workdir
  start = time.perf_counter()
  prepared = common.load_and_prepare(config)
  data = common.client_data(
      prepared.dataset, common.partition(config, prepared.dataset.y_train))
  load_seconds = time.perf_counter() - start

  times = []
  with tempfile.TemporaryDirectory() as scratch:
    for _ in range(1 + max(0, int(reps))):
      start = time.perf_counter()
      result = auditing.audit_fedd3(config, scratch, prepared=prepared,
                                    data=data)
      times.append(time.perf_counter() - start)
  distill = summary.get("distill_seconds")
  first, warm = times[0], min(times[1:]) if len(times) > 1 else None
  return {
      "workdir": workdir,
      "run": {"method": summary.get("method"),
              "dataset": summary.get("dataset"),
              "num_clients": summary.get("num_clients"),
              "distiller": summary.get("distiller"),
              "code": summary.get("code"),
              "jax": summary.get("environment", {}).get("started", {}).get(
                  "jax"),
              "devices": summary.get("environment", {}).get(
                  "started", {}).get("devices")},
      "holdout": int(config.audit.holdout),
      "audited_clients": int(data.num_clients),
      "uploads": int(sum(result["num_uploads"])),
      "load_seconds": load_seconds,
      "audit_first_seconds": first,
      "audit_seconds": warm,
      "audit_rep_seconds": times[1:],
      "distill_seconds": distill,
      "ratio_first": first / distill if distill else None,
      "ratio": warm / distill if distill and warm is not None else None,
      "target_ratio": 2.0,
      "image_mia_pixels_auc": result["image_mia_pixels"]["auc_mean"],
      "code": versions.source_commit(),
      "jax": jax.__version__,
      "devices": str(jax.devices()),
      "machine": platform.machine(),
      "processor": platform.processor(),
      "cpu_count": os.cpu_count(),
      "cpu_affinity": (len(os.sched_getaffinity(0))
                       if hasattr(os, "sched_getaffinity") else None),
      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
  }


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(
      description=__doc__,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", required=True,
                 help="a finished FedD3 run (its summary.json and stage cache)")
  p.add_argument("--reps", type=int, default=2,
                 help="warm audits after the first (default 2)")
  p.add_argument("--holdout", type=int, default=None,
                 help="audit.holdout (default: the run's own)")
  p.add_argument("--out", default="bench_audit.json")
  args = p.parse_args(argv)
  report = measure(args.workdir, reps=args.reps, holdout=args.holdout)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)
  print(json.dumps({k: report[k] for k in (
      "audit_first_seconds", "audit_seconds", "distill_seconds",
      "ratio_first", "ratio")}, indent=2))
  return report


if __name__ == "__main__":
  main()
