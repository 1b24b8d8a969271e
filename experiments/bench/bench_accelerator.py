r"""Accelerator benchmark: one command, one JSON file, on JAX's default backend.

  python -m fedjax_dd.experiments.bench.bench_accelerator --out bench_gpu.json \
      --smoke_data_dir ../shared/datasets
  python -m fedjax_dd.experiments.bench.bench_accelerator --out quick.json \
      --quick

Measures, on whatever ``jax.default_backend()`` is (a GPU, a TPU or the
CPU), in this order (``--sections`` picks and orders them):

* ``engine``: one FedAvg round (``bench_engine.measure_jax``) of LeNet-5
  and ConvNet-3, ``--steps`` local steps of batch ``--batch``, at each of
  ``--clients``, with the default client backend; ms per client-step and
  the device's peak memory where the platform reports it. ``--conv_impls``
  times each convolution form of training (grouped ``lax`` or batched
  matmul ``patches``; default: the policy's), ``--precisions`` each compute
  precision (``bench_engine.PRECISIONS``). Each row also gives the achieved
  TFLOP/s (XLA's FLOP count over the measured time) and, on a card of
  :data:`PEAK_TFLOPS`, the fraction of its dense peak. ``--models papers``
  names every model the papers use (:data:`PAPER_MODELS`).
* ``vs_torch``: ``bench_engine.measure_torch``'s loops (plain and lean in
  float32, lean under bfloat16 autocast, ``torch_bf16``; on CUDA when torch
  sees a GPU) alternating with the engine, ``--torch_pairs`` times, at
  ``--torch_clients``; the figure is PyTorch ms / engine ms (> 1: the engine
  is faster). Without torch the rows say so.
* ``kip``: ``bench_kip.measure`` for ``--kip_clients`` clients, FC-NTK, at
  each ``--kip_ipc``: the all-client program (``batched``) against the
  per-client loop (``loop``); ms per client-iteration.
* ``iga``: one DisUE round (``bench_disue.bench_model``) at N =
  ``--iga_clients``, S = ``--iga_cohort`` (Act = 0.15), ``--iga_model``
  (ResNet-18) on synthetic 32x32x3 data under the CIFAR-10 Dir(0.01)
  protocol; seconds per stage (local training, similarity, AP,
  aggregation, IGA).
* ``smoke`` (only with ``--smoke_data_dir``): the entry point runs
  ``fedavg.py:mnist_iid`` for 5 rounds and ``disue.py:fmnist_dir0.01`` for 3
  (``--config.run.max_wall_seconds`` set) on the real npz files of that
  folder; final accuracy and wall time. Missing files skip the row.
* ``engine_backends``: the engine rows again with every other client
  backend that applies (``sharded`` only with several devices; ``loop`` is
  the per-client jitted loop) and, on an accelerator, ``chunked:128``.

Every measurement also gives a ``compile`` row: its program's first call
(compilation included) against the warm calls.

Each measurement runs in a fresh subprocess (its own peak memory and
compilations) under ``--budget_s``, the whole command's limit: once too
little is left the remaining rows are written as skipped with a note. The
JSON is rewritten after every row, so a killed run keeps what it measured.

``--plan`` runs nothing: it estimates each measurement's time from earlier
reports (``--plan_from``, e.g.
``experiments/results/bench_accelerator_h100_run1.json``) or its time cap,
and writes ``{"meta": ..., "plan": [...]}`` with the running total and
whether each fits ``--budget_s``.

The report is ``{"meta": {...}, "rows": [...]}``; every row has ``section``,
``name``, ``status`` (``ok``, ``skipped``, ``error``), ``note``,
``platform``, ``device``, ``jax_version``, ``unit`` and ``min``/``median``/
``max`` over ``reps`` values (None unless ``ok``), plus its section's
details. ``--quick`` runs every section at tiny sizes (C = 4, one rep,
2 local steps) for tests.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from unittest import mock

import fedjax_dd

from fedjax_dd.policy import CONV_FORMS

SECTIONS = ("engine", "vs_torch", "kip", "iga", "smoke", "engine_backends")
ENGINE_MODELS = ("lenet5", "convnet3")
# The client models of the four papers and their baselines (``--models
# papers``): FedD3's and DisUE's LeNet-5, FedD3's ConvNet-3, FedHydra's
# CNN2 and CNN3 (DisUE's CIFAR presets), HFLDD's CIFAR CNN and AlexNet, and
# DisUE's ResNet-18.
PAPER_MODELS = ("lenet5", "convnet3", "cnn2", "cnn3", "hfldd_cifar_cnn",
                "alexnet", "resnet18")
# Dense (no sparsity) peak TFLOP/s per card and precision, from NVIDIA's
# datasheets (SXM forms); matched by substring of ``device_kind``, first
# match wins. float32 is the CUDA-core rate; tf32 and bfloat16 the tensor
# cores'.
PEAK_TFLOPS = (
    ("h200", {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4}),
    ("h100 pcie", {"float32": 51.2, "tf32": 378.0, "bfloat16": 756.0}),
    ("h100", {"float32": 66.9, "tf32": 494.7, "bfloat16": 989.4}),
    ("a100", {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0}),
)
# The real-data smoke runs: (config, preset, rounds, npz file it reads).
SMOKE_RUNS = (("fedavg.py", "mnist_iid", 5, "mnist.npz"),
              ("disue.py", "fmnist_dir0.01", 3, "fashion_mnist.npz"))
# A measurement is not started with less than this many seconds left.
MIN_START_S = 10.0
# A row name's form and precision parts (``/conv=patches/prec=tf32``).
_PLAIN = re.compile(r"/(conv|prec)=[^/]+")
# The note of a row that --plan walks without measuring.
PLANNED = "planned (--plan), not measured"


# --------------------------------------------------------------------------
# Workers: each runs in its own subprocess and returns a JSON-able dict.


def _device_info() -> dict:
  import jax

  dev = jax.devices()[0]
  return {"platform": jax.default_backend(),
          "device": str(getattr(dev, "device_kind", dev)),
          "device_count": jax.device_count(),
          "jax_version": jax.__version__,
          "python": sys.version.split()[0]}


def _peak_memory() -> dict | None:
  """The first device's allocator statistics, or None where the platform
  gives none (CPU)."""
  import jax

  try:
    stats = jax.local_devices()[0].memory_stats()
  except Exception:  # pylint: disable=broad-except
    return None
  if not stats:
    return None
  keys = ("peak_bytes_in_use", "bytes_in_use", "bytes_limit")
  return {k: int(stats[k]) for k in keys if k in stats}


@contextlib.contextmanager
def _recorded_reps(module):
  """Replaces ``module._min_time`` (the timing helper of ``bench_engine``)
  with one that also records the first call and every warm rep, in
  seconds."""
  record = {"first": None, "reps": []}

  def timed(fn, reps):
    t = time.perf_counter()
    fn()
    record["first"] = time.perf_counter() - t
    for _ in range(reps):
      t = time.perf_counter()
      fn()
      record["reps"].append(time.perf_counter() - t)
    return min(record["reps"])

  with mock.patch.object(module, "_min_time", timed):
    yield record


def work_info() -> dict:
  return _device_info()


def work_engine(model: str, num_clients: int, backend: str,
                chunk_size: int, steps: int, batch: int, reps: int,
                conv_impl: str = "auto", precision: str = "auto",
                flops: bool = False) -> dict:
  from fedjax_dd.experiments.bench import bench_engine

  with _recorded_reps(bench_engine) as rec:
    r = bench_engine.measure_jax(model, num_clients, backend, steps=steps,
                                 batch=batch, reps=reps,
                                 chunk_size=chunk_size, conv_impl=conv_impl,
                                 flops=flops, precision=precision)
  return {**_device_info(), "detail": r, "first_s": rec["first"],
          "rep_s": rec["reps"], "memory": _peak_memory()}


def work_torch(model: str, num_clients: int, steps: int, batch: int,
               reps: int, lean: bool, autocast: bool = False) -> dict:
  import torch

  from fedjax_dd.experiments.bench import bench_engine

  device = "cuda" if torch.cuda.is_available() else "cpu"
  with _recorded_reps(bench_engine) as rec:
    r = bench_engine.measure_torch(model, num_clients, steps=steps,
                                   batch=batch, reps=reps, lean=lean,
                                   device=device, autocast=autocast)
  if r is None:
    raise ValueError(f"measure_torch has no PyTorch {model}")
  name = (torch.cuda.get_device_name() if device == "cuda" else "cpu")
  return {"detail": r, "torch_device": name, "first_s": rec["first"],
          "rep_s": rec["reps"]}


def work_kip(mode: str, num_clients: int, ipc: int, iterations: int,
             per_client: int, reps: int) -> dict:
  from fedjax_dd.experiments.bench import bench_kip

  r = bench_kip.measure(mode, num_clients, ipc, iterations, per_client,
                        reps=reps)
  return {**_device_info(), "detail": r, "memory": _peak_memory()}


def work_iga(protocol: str, model: str, clients: int, cohort: int,
             examples_per_client: int, rounds: int,
             overrides: list[str]) -> dict:
  from fedjax_dd.experiments.bench import bench_disue

  config = bench_disue.make_config(protocol, model, clients=clients,
                                   cohort=cohort, overrides=overrides)
  with tempfile.TemporaryDirectory() as tmpdir:
    r = bench_disue.bench_model(config, rounds=rounds, ks=[],
                                synthetic=True,
                                examples_per_client=examples_per_client,
                                tmpdir=tmpdir)
  return {**_device_info(), "detail": r, "memory": _peak_memory()}


WORKERS = {"info": work_info, "engine": work_engine, "torch": work_torch,
           "kip": work_kip, "iga": work_iga}


# --------------------------------------------------------------------------
# The driver.


def peak_tflops(device: str | None, compute_dtype: str,
                precision: str) -> tuple[float | None, str | None]:
  """The card's dense peak for a row: ``(TFLOP/s, basis)``, or ``(None,
  None)`` for a device :data:`PEAK_TFLOPS` does not list (a CPU).

  The basis is ``bfloat16`` for a bfloat16 model, ``float32`` for
  ``precision="float32"`` (full precision) and ``tf32`` otherwise: jax's
  default precision lets XLA:GPU run float32 convolutions and matmuls on
  TF32 tensor cores.
  """
  kind = (device or "").lower()
  for key, peaks in PEAK_TFLOPS:
    if key in kind:
      basis = ("bfloat16" if compute_dtype == "bfloat16" else
               "float32" if precision == "float32" else "tf32")
      return peaks[basis], basis
  return None, None


def _stats(values) -> dict:
  values = [float(v) for v in values]
  return {"min": min(values), "median": float(statistics.median(values)),
          "max": max(values), "reps": len(values)}


def _row_seconds(reports: list[dict]) -> dict[str, float]:
  """``{"section/name": seconds}`` of the measured rows of earlier reports:
  each row's share of the wall time, its ``elapsed_s`` less the previous
  row's (a measurement's rows after its first take no time of their own);
  the last report wins."""
  out = {}
  for report in reports:
    previous = 0.0
    for row in report.get("rows", []):
      if row.get("status") == "ok" and row.get("elapsed_s") is not None:
        out[f"{row['section']}/{row['name']}"] = max(
            0.0, row["elapsed_s"] - previous)
      if row.get("elapsed_s") is not None:
        previous = row["elapsed_s"]
  return out


class Bench:
  """Runs workers under the time budget and writes the report after every
  row."""

  def __init__(self, out: str, *, budget_s: float, in_process: bool,
               meta: dict, plan_from: list[dict] | None = None):
    """``plan_from``: not None plans instead of measuring (``--plan``): the
    rows of earlier reports whose times estimate the measurements."""
    self.out = out
    self.budget_s = budget_s
    self.in_process = in_process
    self.start = time.monotonic()
    self.rows: list[dict] = []
    self.plan: list[dict] | None = None
    if plan_from is not None:
      self.plan = []
      self.known = _row_seconds(plan_from)
    self.meta = {**meta, "budget_s": budget_s, "finished": False,
                 "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                              time.gmtime())}
    self.info: dict = {}
    self.child: subprocess.Popen | None = None

  def elapsed(self) -> float:
    if self.plan is not None:  # the estimated time of what is planned
      return sum(p["estimate_s"] for p in self.plan)
    return time.monotonic() - self.start

  def remaining(self) -> float:
    return self.budget_s - self.elapsed()

  def write(self) -> None:
    self.meta["elapsed_s"] = self.elapsed()
    body = ({"meta": self.meta, "rows": self.rows} if self.plan is None else
            {"meta": self.meta, "plan": self.plan})
    tmp = self.out + ".tmp"
    with open(tmp, "w") as f:
      json.dump(body, f, indent=2)
    os.replace(tmp, self.out)

  def _known(self, name: str) -> float | None:
    """An earlier report's seconds for row ``name``, or for the rows a
    measurement of that name gave (``iga``'s stages, ``NAME/...``)."""
    if name in self.known:
      return self.known[name]
    parts = [v for k, v in self.known.items() if k.startswith(name + "/")]
    return sum(parts) if parts else None

  def _planned(self, kind: str, cap_s: float) -> None:
    """Plans one measurement. Measurements before the next row form one
    entry (``vs_torch``'s pairs give their rows together); the rows it
    names settle its estimate (:meth:`add`)."""
    if self.plan and not self.plan[-1]["names"]:
      entry = self.plan[-1]
      entry["kinds"].append(kind)
      entry["cap_s"] += cap_s
      entry["estimate_s"] = entry["cap_s"]
      return
    self.plan.append({"kinds": [kind], "cap_s": cap_s, "names": [],
                      "estimate_s": cap_s, "source": "cap"})

  def add(self, section: str, name: str, *, unit: str,
          values=None, status: str = "ok", note: str | None = None,
          info: dict | None = None, **extra) -> dict:
    if self.plan is not None:
      if self.plan and PLANNED in (note or ""):
        entry = self.plan[-1]
        entry["names"].append(f"{section}/{name}")
        known = [self._known(n) for n in entry["names"]]
        # A row the reports lack, timed there in another form or precision:
        # the same model and cohort (one compile and a few reps either way).
        plain = [self._known(_PLAIN.sub("", n)) for n in entry["names"]]
        for found, source in ((known, "report"),
                              (plain, "report, other form")):
          if all(k is not None for k in found):
            entry["estimate_s"] = min(entry["cap_s"], sum(found))
            entry["source"] = source
            break
        else:
          # Rows one measurement gives together (vs_torch's loops), some
          # new: the known ones' mean time each.
          found = [k for k in known if k is not None]
          if found:
            entry["estimate_s"] = min(
                entry["cap_s"], sum(found) * len(known) / len(found))
            entry["source"] = "report, scaled"
        entry["cumulative_s"] = round(self.elapsed(), 1)
        entry["fits"] = entry["cumulative_s"] <= self.budget_s
      return {"median": None}
    if status == "ok" and not values:
      status, note = "error", note or "no values measured"
    device = info or self.info
    row = {"section": section, "name": name, "status": status, "note": note,
           "platform": device.get("platform"), "device": device.get("device"),
           "jax_version": device.get("jax_version"), "unit": unit,
           **(_stats(values) if status == "ok" else
              {"min": None, "median": None, "max": None, "reps": 0}),
           **extra, "elapsed_s": round(self.elapsed(), 2)}
    self.rows.append(row)
    self.write()
    shown = {k: row[k] for k in ("section", "name", "status", "median",
                                 "unit", "note")}
    shown["note"] = shown["note"] and shown["note"][-300:]
    print(json.dumps(shown), file=sys.stderr, flush=True)
    return row

  def call(self, kind: str, cap_s: float, *, exempt: bool = False,
           **kwargs) -> dict:
    """Runs worker ``kind``: ``{"result": ...}``, or ``{"status":
    "skipped"|"error", "note": ...}``; ``exempt``: even when the budget is
    spent (with at most ``cap_s``)."""
    left = cap_s if exempt else self.remaining()
    if self.plan is not None and kind != "info":
      self._planned(kind, cap_s)
      return {"status": "skipped", "note": PLANNED}
    if left < MIN_START_S:
      return {"status": "skipped",
              "note": f"time budget: {max(left, 0):.0f} s of "
                      f"{self.budget_s:.0f} s left"}
    if self.in_process:
      try:
        return {"result": WORKERS[kind](**kwargs)}
      except Exception as e:  # pylint: disable=broad-except
        return {"status": "error", "note": f"{type(e).__name__}: {e}"[-2000:]}
    timeout = min(cap_s, left)
    cmd = [sys.executable, "-m",
           "fedjax_dd.experiments.bench.bench_accelerator",
           "--_worker", json.dumps({"kind": kind, **kwargs})]
    try:
      proc = self.run(cmd, timeout)
    except subprocess.TimeoutExpired:
      return {"status": "error",
              "note": f"timed out after {timeout:.0f} s (cap {cap_s:.0f} s, "
                      f"{left:.0f} s of the budget left)"}
    try:
      if proc.returncode == 0:
        return {"result": json.loads(proc.stdout.strip().splitlines()[-1])}
    except (ValueError, IndexError):
      pass
    return {"status": "error",
            "note": f"exit {proc.returncode}: "
                    f"{(proc.stderr or proc.stdout)[-2000:]}"}

  def run(self, cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run`` whose child :meth:`interrupt` can end."""
    if self.plan is not None:
      self._planned("smoke", timeout)
      return subprocess.CompletedProcess(cmd, 1, "", PLANNED)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
      self.child = proc
      try:
        out, err = proc.communicate(timeout=timeout)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
      finally:
        self.child = None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

  def interrupt(self, signum, frame) -> None:  # pylint: disable=unused-argument
    """On SIGTERM/SIGINT: end the running measurement, mark the report
    unfinished and exit (143/130)."""
    if self.child is not None and self.child.poll() is None:
      self.child.kill()
    self.meta["interrupted_by_signal"] = int(signum)
    self.write()
    os._exit(128 + int(signum))  # pylint: disable=protected-access


def _failed(bench: Bench, out: dict, section: str, name: str, unit: str,
            **extra) -> bool:
  """Adds the skipped/error row of a worker that did not return."""
  if "result" in out:
    return False
  bench.add(section, name, unit=unit, status=out["status"], note=out["note"],
            **extra)
  return True


def _backend_spec(spec: str) -> tuple[str, int]:
  name, _, chunk = spec.partition(":")
  return name, int(chunk or 0)


def _engine_row(bench: Bench, args, model: str, c: int, spec: str,
                conv_impl: str = "auto", precision: str = "auto") -> None:
  backend, chunk = _backend_spec(spec)
  name = f"{model}/C={c}/{spec}" + (
      "" if conv_impl == "auto" else f"/conv={conv_impl}") + (
          "" if precision == "auto" else f"/prec={precision}")
  out = bench.call("engine", args.cap_engine_s, model=model, num_clients=c,
                   backend=backend, chunk_size=chunk or args.chunk_size,
                   steps=args.steps, batch=args.batch, reps=args.reps,
                   conv_impl=conv_impl, precision=precision,
                   flops=args.flops)
  extra = dict(model=model, num_clients=c, backend=spec, steps=args.steps,
               batch=args.batch, conv_impl_asked=conv_impl,
               precision=precision)
  if _failed(bench, out, "engine", name, "ms per client-step", **extra):
    return
  r = out["result"]
  d = r["detail"]
  per = 1e3 / (c * args.steps)
  flops = d.get("flops_per_client_step")
  ms = statistics.median(s * per for s in r["rep_s"])
  tflops = flops / (ms * 1e-3) / 1e12 if flops else None
  peak, basis = peak_tflops(r.get("device"), d.get("compute_dtype"),
                            precision)
  extra.update(compute_dtype=d.get("compute_dtype"),
               flops_per_client_step=flops, tflops_achieved=tflops,
               peak_tflops=peak, peak_basis=basis,
               peak_fraction=tflops / peak if tflops and peak else None)
  extra.update(resolved_backend=d["resolved_backend"],
               chunk_size=d["chunk_size"], conv_impl=d["conv_impl"],
               devices=d["devices"], memory=r["memory"],
               peak_memory_mb=(r["memory"]["peak_bytes_in_use"] / 2**20
                               if r["memory"] and "peak_bytes_in_use"
                               in r["memory"] else None),
               peak_rss_mb=d["peak_rss_mb"])
  bench.add("engine", name, unit="ms per client-step", info=r,
            values=[s * per for s in r["rep_s"]], **extra)
  _compile_row(bench, "engine/" + name, r, r["first_s"], r["rep_s"])


def _compile_row(bench: Bench, program: str, info: dict, first_s, warm_s):
  """First call (compilation included) against the warm calls, ms."""
  if first_s is None or not warm_s:
    return
  warm = [1e3 * s for s in warm_s]
  bench.add("compile", program, unit="ms per call (warm)", info=info,
            values=warm, first_call_ms=1e3 * first_s,
            compile_ms_estimate=1e3 * first_s - statistics.median(warm))


def run_engine(bench: Bench, args, specs_for) -> None:
  for model in args.models.split(","):
    for c in _ints(args.clients):
      for spec in specs_for(model, c):
        for conv_impl in args.conv_impls.split(","):
          for precision in args.precisions.split(","):
            _engine_row(bench, args, model, c, spec, conv_impl, precision)


def run_vs_torch(bench: Bench, args) -> None:
  """The engine (default backend) and both PyTorch loops, alternating as
  ``bench_engine.measure_vs_torch`` does, each in a fresh subprocess."""
  unit = "ratio (PyTorch ms / engine ms)"
  kinds = ("engine", "torch", "torch_lean", "torch_bf16")
  for model in args.models.split(","):
    for c in _ints(args.torch_clients):
      name = f"{model}/C={c}"
      # (A plan is for a machine with torch.)
      if bench.plan is None and importlib.util.find_spec("torch") is None:
        for ref in kinds[1:]:
          bench.add("vs_torch", f"{name}/{ref}", unit=unit, status="skipped",
                    note="torch is not installed (pip install -e '.[bench]')",
                    model=model, num_clients=c)
        continue
      pairs, errors, torch_device = [], [], None
      for pair in range(args.torch_pairs):
        ms = {}
        shift = pair % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
          common = dict(model=model, num_clients=c, steps=args.steps,
                        batch=args.batch, reps=args.reps)
          if kind == "engine":
            out = bench.call("engine", args.cap_torch_s, backend="auto",
                             chunk_size=args.chunk_size, **common)
          else:
            out = bench.call("torch", args.cap_torch_s,
                             lean=kind != "torch",
                             autocast=kind == "torch_bf16", **common)
          if "result" not in out:
            errors.append(f"pair {pair} {kind}: {out['note']}")
            continue
          r = out["result"]
          ms[kind] = r["detail"]["ms_per_client_step"]
          if kind == "engine":
            ms["engine_compute_dtype"] = r["detail"].get("compute_dtype")
          torch_device = r.get("torch_device", torch_device)
        pairs.append(ms)
      for ref in kinds[1:]:
        ratios = [p[ref] / p["engine"] for p in pairs
                  if p.get(ref) and p.get("engine")]
        note = "; ".join(errors)[-2000:] or None
        bench.add("vs_torch", f"{name}/{ref}", unit=unit, values=ratios,
                  status="ok" if ratios else
                  ("skipped" if errors and "time budget" in errors[-1]
                   else "error"),
                  note=note, model=model, num_clients=c,
                  torch_device=torch_device, pairs=pairs, steps=args.steps,
                  batch=args.batch)


def run_kip(bench: Bench, args) -> None:
  unit = "ms per client-iteration"
  for ipc in _ints(args.kip_ipc):
    medians = {}
    for mode in ("batched", "loop"):
      name = f"fc_ntk/C={args.kip_clients}/ipc={ipc}/{mode}"
      extra = dict(mode=mode, num_clients=args.kip_clients,
                   images_per_class=ipc, iterations=args.kip_iterations,
                   per_client=args.kip_per_client)
      out = bench.call("kip", args.cap_kip_s, mode=mode,
                       num_clients=args.kip_clients, ipc=ipc,
                       iterations=args.kip_iterations,
                       per_client=args.kip_per_client, reps=args.reps)
      if _failed(bench, out, "kip", name, unit, **extra):
        continue
      r = out["result"]
      d = r["detail"]
      row = bench.add("kip", name, unit=unit, info=r,
                      values=d["rep_ms_per_iteration_per_client"],
                      backend=d["backend"], memory=r["memory"],
                      peak_rss_mb=d["peak_rss_mb"], **extra)
      medians[mode] = row["median"]
      if mode == "batched" and d.get("first_call_seconds") is not None:
        # (The loop's first call compiles on one client only.)
        _compile_row(bench, "kip/" + name, r, d["first_call_seconds"],
                     [v * args.kip_iterations * args.kip_clients / 1e3
                      for v in d["rep_ms_per_iteration_per_client"]])
    if medians.get("batched") and medians.get("loop"):
      bench.add("kip", f"fc_ntk/C={args.kip_clients}/ipc={ipc}/"
                "loop_over_batched", unit="ratio (loop ms / batched ms)",
                values=[medians["loop"] / medians["batched"]],
                images_per_class=ipc, num_clients=args.kip_clients)


def run_iga(bench: Bench, args) -> None:
  name = (f"disue/{args.iga_model}/N={args.iga_clients}/"
          f"S={args.iga_cohort}")
  overrides = [s for s in args.iga_set.split(";") if s]
  out = bench.call("iga", args.cap_iga_s, protocol=args.iga_protocol,
                   model=args.iga_model,
                   clients=args.iga_clients, cohort=args.iga_cohort,
                   examples_per_client=args.iga_examples_per_client,
                   rounds=args.iga_rounds, overrides=overrides)
  extra = dict(model=args.iga_model, num_clients=args.iga_clients,
               cohort=args.iga_cohort, overrides=overrides,
               protocol=f"disue.py:{args.iga_protocol}_dir0.01",
               data="synthetic, in the model's input shape")
  if _failed(bench, out, "iga", name, "s", **extra):
    return
  r = out["result"]
  d = r["detail"]
  extra.update(param_count=d["param_count"], local_steps=d["local_steps"],
               client_backend=d["client_backend"], memory=r["memory"],
               num_groups_by_round=d["num_groups_by_round"],
               iga_steps_by_round=d["iga_steps_by_round"],
               recompile_count=d["recompile_count"])
  by_round = d["stage_seconds_by_round"]
  from fedjax_dd.experiments.bench.bench_disue import STAGES
  for stage in STAGES:
    bench.add("iga", f"{name}/{stage}", unit="s", info=r, stage=stage,
              values=[sec[stage] for sec in by_round], **extra)
    _compile_row(bench, f"iga/{name}/{stage}", r,
                 d["warmup_stage_seconds"][stage],
                 [sec[stage] for sec in by_round])
  bench.add("iga", f"{name}/round", unit="s", info=r, stage="round",
            values=[sum(sec.values()) for sec in by_round],
            warmup_seconds=d["warmup_seconds"],
            setup_seconds=d["setup_seconds"], **extra)
  bench.add("iga", f"{name}/iga_steps_per_second", unit="steps/s", info=r,
            values=[i / sec["iga"] for i, sec in
                    zip(d["iga_steps_by_round"], by_round)], **extra)


def run_smoke(bench: Bench, args) -> None:
  # experiments/configs, beside this module's folder experiments/bench.
  configs = os.path.join(
      os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
  for config, preset, rounds, npz in SMOKE_RUNS:
    rounds = args.smoke_rounds or rounds
    name = f"{config}:{preset}"
    extra = dict(rounds=rounds, data_dir=args.smoke_data_dir)
    if not args.smoke_data_dir:
      bench.add("smoke", name, unit="s", status="skipped",
                note="no --smoke_data_dir", **extra)
      continue
    path = os.path.join(args.smoke_data_dir, npz)
    if not os.path.exists(path):
      bench.add("smoke", name, unit="s", status="skipped",
                note=f"{npz} not in {args.smoke_data_dir}", **extra)
      continue
    left = bench.remaining()
    if left < MIN_START_S + 20:
      bench.add("smoke", name, unit="s", status="skipped",
                note=f"time budget: {max(left, 0):.0f} s left", **extra)
      continue
    # The run stops after the first round ending past max_wall; leave time
    # for loading, compiling and the final evaluation after it.
    max_wall = max(5.0, min(args.smoke_max_wall_s, 0.5 * left))
    workdir = tempfile.mkdtemp(prefix="bench_smoke_")
    cmd = [sys.executable, "-m", "fedjax_dd.experiments.main",
           f"--config={os.path.join(configs, config)}:{preset}",
           f"--workdir={workdir}", f"--config.rounds={rounds}",
           f"--config.run.max_wall_seconds={max_wall}",
           "--config.run.progress=False",
           f"--config.data.dataset=npz:{os.path.abspath(path)}",
           *[f"--config.{s}" for s in args.smoke_set.split(";") if s]]
    extra.update(max_wall_seconds=max_wall, command=" ".join(cmd[1:]))
    t = time.perf_counter()
    try:
      proc = bench.run(cmd, left)
    except subprocess.TimeoutExpired:
      shutil.rmtree(workdir, ignore_errors=True)
      bench.add("smoke", name, unit="s", status="error",
                note=f"timed out after {left:.0f} s", **extra)
      continue
    wall = time.perf_counter() - t
    summary_path = os.path.join(workdir, "summary.json")
    s = None
    if proc.returncode == 0 and os.path.exists(summary_path):
      with open(summary_path) as f:
        s = json.load(f)
    shutil.rmtree(workdir, ignore_errors=True)
    if s is None:
      bench.add("smoke", name, unit="s", status="error",
                note=(proc.stderr or proc.stdout)[-2000:], **extra)
      continue
    bench.add("smoke", name, unit="s", values=[wall],
              final_test_accuracy=s.get("final_test_accuracy"),
              rounds_run=s.get("rounds"),
              stopped_by_time_budget=s.get("stopped_by_time_budget"),
              model=s.get("model"), **extra)


def _ints(spec) -> list[int]:
  return [int(v) for v in str(spec).split(",") if v]


QUICK = dict(models="lenet5", backends="loop", clients="4", steps=2, batch=8, reps=1, torch_clients="4",
             torch_pairs=1, kip_clients=4, kip_ipc="1", kip_iterations=2,
             kip_per_client=20, iga_model="digits_cnn",
             iga_protocol="fmnist", iga_clients=4,
             iga_cohort=2, iga_examples_per_client=40, iga_rounds=1,
             iga_set="iga.iterations=1;iga.student_steps=1;iga.batch_size=8;"
                     "iga.nz=8;iga.ngf=4;client.batch_size=8;"
                     "client.local_epochs=0.5",
             smoke_rounds=1, smoke_max_wall_s=5.0,
             smoke_set="data.num_clients=4;client.clients_per_round=2;"
                       "client.local_epochs=0.05")


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default="",
                 help="JSON file (rewritten after every row); required")
  p.add_argument("--quick", action="store_true",
                 help="tiny sizes for tests: C = 4, one rep, 2 local steps")
  p.add_argument("--budget_s", type=float, default=420.0,
                 help="the whole command's time limit, s: rows that would "
                      "start with under 10 s left are skipped with a note")
  p.add_argument("--sections", default=",".join(SECTIONS),
                 help="comma-separated, in the order to run: "
                      + ",".join(SECTIONS))
  p.add_argument("--plan", action="store_true",
                 help="measure nothing: write each measurement's estimated "
                      "time and whether it fits --budget_s")
  p.add_argument("--plan_from", default="",
                 help="comma-separated earlier reports whose rows estimate "
                      "--plan's times (rows they lack: their time cap)")
  p.add_argument("--in_process", action="store_true",
                 help="run the measurements in this process (no per-row "
                      "time limit or memory figure of its own; debugging)")
  g = p.add_argument_group("engine")
  g.add_argument("--models", default=",".join(ENGINE_MODELS),
                 help="comma-separated bench_engine models; 'papers': "
                      + ",".join(PAPER_MODELS))
  g.add_argument("--clients", default="100,1000")
  g.add_argument("--steps", type=int, default=10)
  g.add_argument("--batch", type=int, default=64)
  g.add_argument("--reps", type=int, default=3)
  g.add_argument("--precisions", default="auto",
                 help="comma-separated compute precisions of the engine rows "
                      "(auto, float32, tf32, bfloat16): auto is the policy's "
                      "compute dtype at jax's default precision")
  g.add_argument("--flops", action=argparse.BooleanOptionalAction,
                 default=True,
                 help="count each engine row's FLOPs (one more compiled "
                      "program per row) for its TFLOP/s and peak fraction")
  g.add_argument("--conv_impls", default="auto",
                 help="comma-separated convolution forms of the engine rows "
                      "(auto, lax, patches): auto is the policy's; naming "
                      "others compares the forms on this platform")
  g.add_argument("--chunk_size", type=int, default=0,
                 help="clients per chunk; 0: the engine's default")
  g.add_argument("--backends", default="",
                 help="engine_backends: comma-separated NAME[:CHUNK]; "
                      "default: every backend that applies except the "
                      "default one, and chunked:128 on an accelerator")
  g.add_argument("--cap_engine_s", type=float, default=120.0)
  g = p.add_argument_group("vs_torch")
  g.add_argument("--torch_clients", default="100")
  g.add_argument("--torch_pairs", type=int, default=2)
  g.add_argument("--cap_torch_s", type=float, default=90.0)
  g = p.add_argument_group("kip")
  g.add_argument("--kip_clients", type=int, default=500)
  g.add_argument("--kip_ipc", default="1,10")
  g.add_argument("--kip_iterations", type=int, default=20)
  g.add_argument("--kip_per_client", type=int, default=120)
  g.add_argument("--cap_kip_s", type=float, default=90.0)
  g = p.add_argument_group("iga")
  g.add_argument("--iga_model", default="resnet18")
  g.add_argument("--iga_protocol", default="cifar10",
                 choices=("cifar10", "fmnist"),
                 help="the disue.py Dir(0.01) preset whose protocol runs")
  g.add_argument("--iga_clients", type=int, default=100)
  g.add_argument("--iga_cohort", type=int, default=15)
  g.add_argument("--iga_examples_per_client", type=int, default=600)
  g.add_argument("--iga_rounds", type=int, default=2,
                 help="timed rounds after the warm-up round")
  g.add_argument("--iga_set", default="",
                 help="';'-separated config overrides KEY=VALUE, e.g. "
                      "'iga.iterations=2;client.local_epochs=1'")
  g.add_argument("--cap_iga_s", type=float, default=240.0)
  g = p.add_argument_group("smoke")
  g.add_argument("--smoke_data_dir", default="",
                 help="folder with mnist.npz and fashion_mnist.npz "
                      "(e.g. ../shared/datasets); empty: smoke skipped")
  g.add_argument("--smoke_rounds", type=int, default=0,
                 help="0: 5 rounds of FedAvg, 3 of DisUE")
  g.add_argument("--smoke_max_wall_s", type=float, default=90.0,
                 help="--config.run.max_wall_seconds of each run (at most "
                      "half the budget left)")
  g.add_argument("--smoke_set", default="",
                 help="';'-separated extra overrides KEY=VALUE of both runs")
  p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
  argv = list(sys.argv[1:] if argv is None else argv)
  args = p.parse_args(argv)
  if args._worker:
    spec = json.loads(args._worker)
    print(json.dumps(WORKERS[spec.pop("kind")](**spec)))
    return {}
  if not args.out:
    p.error("--out is required")
  if args.quick:
    # Quick sizes replace the defaults, not what the command line gives.
    given = {a.split("=")[0].lstrip("-") for a in argv if a.startswith("--")}
    for k, v in QUICK.items():
      if k not in given:
        setattr(args, k, v)
  sections = [s for s in args.sections.split(",") if s]
  unknown = set(sections) - set(SECTIONS)
  if unknown:
    p.error(f"unknown sections {sorted(unknown)}; expected {SECTIONS}")
  forms = ("auto",) + CONV_FORMS
  bad = [f for f in args.conv_impls.split(",") if f not in forms]
  if bad:
    p.error(f"unknown --conv_impls {bad}; expected some of {forms}")
  from fedjax_dd.experiments.bench.bench_engine import MODELS, PRECISIONS
  bad = [f for f in args.precisions.split(",") if f not in PRECISIONS]
  if bad:
    p.error(f"unknown --precisions {bad}; expected some of {PRECISIONS}")
  if args.models == "papers":
    args.models = ",".join(PAPER_MODELS)
  bad = [m for m in args.models.split(",") if m not in MODELS]
  if bad:
    p.error(f"unknown --models {bad}; expected 'papers' or some of "
            f"{tuple(MODELS)}")
  plan_from = None
  if args.plan:
    plan_from = []
    for path in filter(None, args.plan_from.split(",")):
      try:
        with open(path) as f:
          plan_from.append(json.load(f))
      except (OSError, ValueError) as e:
        p.error(f"--plan_from {path}: {e}")
  elif args.plan_from:
    p.error("--plan_from is read by --plan only")

  bench = Bench(args.out, budget_s=args.budget_s, in_process=args.in_process,
                meta={"command": "python -m fedjax_dd.experiments."
                                 "bench_accelerator " + " ".join(argv),
                      "args": {k: v for k, v in vars(args).items()
                               if k != "_worker"}},
                plan_from=plan_from)
  if not args.in_process:
    for signum in (signal.SIGTERM, signal.SIGINT):
      signal.signal(signum, bench.interrupt)
  if plan_from:
    # A plan is for the machine of the reports it reads, not this one.
    keys = ("platform", "device", "device_count", "jax_version")
    info = {"result": {k: plan_from[-1]["meta"].get(k) for k in keys}}
  else:
    info = bench.call("info", 120.0, exempt=True)
  if "result" not in info:
    bench.meta["info_error"] = info["note"]
  else:
    bench.info = info["result"]
    bench.meta.update(bench.info)
  try:
    import torch  # pylint: disable=import-outside-toplevel
    bench.meta["torch_version"] = torch.__version__
  except ImportError:
    bench.meta["torch_version"] = None
  bench.write()

  platform = bench.info.get("platform", "cpu")
  multi = bench.info.get("device_count", 1) > 1
  others = ([v for v in args.backends.split(",") if v] if args.backends else
            (["sharded"] if multi else []) + ["chunked", "vmap", "loop"] +
            (["chunked:128"] if platform != "cpu" else []))
  default = "sharded" if multi else ("chunked" if platform == "cpu"
                                     else "vmap")
  others = [s for s in others if s != default]

  for section in sections:
    if section == "engine":
      run_engine(bench, args, lambda m, c: ["auto"])
    elif section == "engine_backends":
      run_engine(bench, args, lambda m, c: others)
    elif section == "vs_torch":
      run_vs_torch(bench, args)
    elif section == "kip":
      run_kip(bench, args)
    elif section == "iga":
      run_iga(bench, args)
    elif section == "smoke":
      run_smoke(bench, args)
  bench.meta["finished"] = True
  bench.write()
  if bench.plan is not None:
    for entry in bench.plan:
      print(f"{entry['cumulative_s']:8.0f} s  {entry['estimate_s']:6.0f} s "
            f"({entry['source']})  {'fits' if entry['fits'] else 'over'}  "
            f"{', '.join(entry['names'])}")
    fits = sum(e["fits"] for e in bench.plan)
    print(json.dumps({"out": args.out, "planned": len(bench.plan),
                      "fit": fits, "budget_s": args.budget_s,
                      "estimate_s": round(bench.elapsed(), 1)}))
    return {"meta": bench.meta, "plan": bench.plan}
  counts = {}
  for r in bench.rows:
    counts[r["status"]] = counts.get(r["status"], 0) + 1
  print(json.dumps({"out": args.out, "rows": len(bench.rows), **counts,
                    "elapsed_s": round(bench.elapsed(), 1)}))
  return {"meta": bench.meta, "rows": bench.rows}


if __name__ == "__main__":
  fedjax_dd.configure_cpu()  # one host device per core, before JAX starts
  main()
