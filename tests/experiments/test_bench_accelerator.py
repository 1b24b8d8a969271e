"""The accelerator benchmark's report: schema, finiteness, time budget and
skips (no timing asserts)."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from fedjax_dd.experiments.bench import bench_accelerator

from tests.conftest import REPO_ROOT, shared_dataset

COMMON = ("section", "name", "status", "note", "platform", "device",
          "jax_version", "unit", "min", "median", "max", "reps", "elapsed_s")


def _check_schema(report: dict) -> None:
  assert set(report) == {"meta", "rows"}
  assert report["meta"]["finished"] is True
  for row in report["rows"]:
    assert set(COMMON) <= set(row), row
    assert row["section"] in bench_accelerator.SECTIONS + ("compile",)
    assert row["status"] in ("ok", "skipped", "error"), row
    if row["status"] == "ok":
      values = (row["min"], row["median"], row["max"])
      assert all(math.isfinite(v) and v >= 0 for v in values), row
      assert row["min"] <= row["median"] <= row["max"] and row["reps"] >= 1
      assert row["platform"] == "cpu" and row["jax_version"]
    else:
      assert row["note"] and row["median"] is None and row["reps"] == 0


# Runs the benchmark and checks its fields only: slow (the fast smoke of
# the command is test_command_line_spent_budget_skips_every_row).
@pytest.mark.slow
def test_quick_report_schema(tmp_path):
  """``--quick`` in this process: every section's rows but IGA's (the next
  test), all finite."""
  out = tmp_path / "quick.json"
  report = bench_accelerator.main([
      "--out", str(out), "--quick", "--in_process", "--sections",
      "engine,vs_torch,kip,smoke,engine_backends"])
  with open(out) as f:
    assert json.load(f) == json.loads(json.dumps(report))
  _check_schema(report)
  rows = report["rows"]
  by = {(r["section"], r["name"]): r for r in rows}
  errors = [r for r in rows if r["status"] == "error"]
  assert not errors, errors
  engine = by[("engine", "lenet5/C=4/auto")]
  assert engine["num_clients"] == 4 and engine["steps"] == 2
  assert engine["reps"] == 1
  # CPU gives no allocator statistics: the memory fields say so.
  assert engine["memory"] is None and engine["peak_memory_mb"] is None
  assert by[("engine", "lenet5/C=4/loop")]["resolved_backend"] == "loop"
  first = by[("compile", "engine/lenet5/C=4/auto")]["first_call_ms"]
  assert math.isfinite(first) and first > 0
  for mode in ("batched", "loop"):
    assert by[("kip", f"fc_ntk/C=4/ipc=1/{mode}")]["status"] == "ok"
  assert ("kip", "fc_ntk/C=4/ipc=1/loop_over_batched") in by
  assert ("compile", "kip/fc_ntk/C=4/ipc=1/batched") in by
  for ref in ("torch", "torch_lean", "torch_bf16"):
    row = by[("vs_torch", f"lenet5/C=4/{ref}")]
    if importlib.util.find_spec("torch") is None:
      assert row["status"] == "skipped" and "torch" in row["note"]
    else:
      assert row["status"] == "ok" and row["torch_device"] == "cpu"
  for name in ("fedavg.py:mnist_iid", "disue.py:fmnist_dir0.01"):
    assert by[("smoke", name)]["status"] == "skipped"


# Fields, and a DisUE round without recompiles, which
# tests/experiments/test_bench_disue.py checks fast: slow.
@pytest.mark.slow
def test_quick_iga_rows(tmp_path):
  """One tiny DisUE round split into its stages, each with its compile
  row."""
  report = bench_accelerator.main(["--out", str(tmp_path / "i.json"),
                                   "--quick", "--in_process", "--sections",
                                   "iga"])
  _check_schema(report)
  by = {(r["section"], r["name"]): r for r in report["rows"]}
  iga = "disue/digits_cnn/N=4/S=2"
  for stage in ("local_training", "similarity", "ap", "aggregation", "iga",
                "round", "iga_steps_per_second"):
    assert by[("iga", f"{iga}/{stage}")]["status"] == "ok", stage
  for stage in ("local_training", "iga"):
    assert by[("compile", f"iga/{iga}/{stage}")]["first_call_ms"] > 0
  assert by[("iga", f"{iga}/round")]["recompile_count"] == 0


def test_torch_rows_say_when_torch_is_missing(tmp_path, monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "torch"
                      else real(name, *a))
  report = bench_accelerator.main(["--out", str(tmp_path / "t.json"),
                                   "--quick", "--in_process", "--sections",
                                   "vs_torch", "--models", "lenet5,convnet3"])
  _check_schema(report)
  # Three PyTorch loops (float32 plain and lean, bfloat16 autocast) a model.
  assert len(report["rows"]) == 6
  for row in report["rows"]:
    assert row["status"] == "skipped" and "not installed" in row["note"]


def test_smoke_skips_without_its_files(tmp_path):
  report = bench_accelerator.main([
      "--out", str(tmp_path / "s.json"), "--quick", "--in_process",
      "--sections", "smoke", "--smoke_data_dir", str(tmp_path)])
  _check_schema(report)
  assert [r["status"] for r in report["rows"]] == ["skipped", "skipped"]
  assert "mnist.npz not in" in report["rows"][0]["note"]


def test_command_line_spent_budget_skips_every_row(tmp_path):
  """The real command with no time left: the device is still identified
  (the info worker is exempt), every measurement is skipped with a note and
  the file is complete."""
  out = tmp_path / "b.json"
  proc = subprocess.run(
      [sys.executable, "-m", "fedjax_dd.experiments.bench.bench_accelerator",
       "--out", str(out), "--quick", "--budget_s", "0"],
      capture_output=True, text=True, check=False, cwd=REPO_ROOT)
  assert proc.returncode == 0, proc.stderr[-2000:]
  with open(out) as f:
    report = json.load(f)
  _check_schema(report)
  assert report["meta"]["platform"] == "cpu"
  # (The other backends' rows are engine rows.)
  assert {r["section"] for r in report["rows"]} == set(
      bench_accelerator.SECTIONS) - {"engine_backends"}
  for row in report["rows"]:
    assert row["status"] == "skipped", row
    assert ("time budget" in row["note"] or "not installed" in row["note"]
            or "--smoke_data_dir" in row["note"]), row


@pytest.mark.slow
def test_real_data_smoke_through_the_entry_point(tmp_path):
  data_dir = os.path.dirname(shared_dataset("mnist.npz"))
  shared_dataset("fashion_mnist.npz")
  report = bench_accelerator.main([
      "--out", str(tmp_path / "smoke.json"), "--quick", "--sections",
      "smoke", "--smoke_data_dir", data_dir])
  _check_schema(report)
  for row in report["rows"]:
    assert row["status"] == "ok", row
    assert 0.0 <= row["final_test_accuracy"] <= 1.0
    assert row["rounds_run"] == 1


# Runs the benchmark and checks its fields only: slow (the fast smoke of
# the command is test_command_line_spent_budget_skips_every_row).
@pytest.mark.slow
def test_engine_rows_per_convolution_form(tmp_path):
  """--conv_impls times each form by name."""
  report = bench_accelerator.main([
      "--out", str(tmp_path / "c.json"), "--quick", "--in_process",
      "--sections", "engine", "--models", "lenet5",
      "--conv_impls", "lax,patches"])
  _check_schema(report)
  rows = [r for r in report["rows"] if r["section"] == "engine"]
  assert [(r["name"], r["conv_impl"]) for r in rows] == [
      ("lenet5/C=4/auto/conv=lax", "lax"),
      ("lenet5/C=4/auto/conv=patches", "patches")]


def test_an_unknown_convolution_form_is_refused_before_anything_runs(
    tmp_path):
  with pytest.raises(SystemExit):
    bench_accelerator.main(["--out", str(tmp_path / "d.json"), "--quick",
                            "--conv_impls", "lax,winograd"])
  assert not (tmp_path / "d.json").exists()


@pytest.mark.slow  # runs the benchmark script end to end
def test_engine_rows_per_precision_count_flops(tmp_path):
  """--precisions times each compute precision by name; every row carries
  XLA's FLOP count and the TFLOP/s it implies (no peak on a CPU)."""
  report = bench_accelerator.main([
      "--out", str(tmp_path / "p.json"), "--quick", "--in_process",
      "--sections", "engine", "--precisions", "float32,bfloat16"])
  _check_schema(report)
  rows = [r for r in report["rows"] if r["section"] == "engine"]
  assert [(r["name"], r["compute_dtype"]) for r in rows] == [
      ("lenet5/C=4/auto/prec=float32", "float32"),
      ("lenet5/C=4/auto/prec=bfloat16", "bfloat16")]
  for r in rows:
    assert r["flops_per_client_step"] > 0
    # TFLOP/s is the FLOP count over the median time, both in the row.
    assert r["tflops_achieved"] == pytest.approx(
        r["flops_per_client_step"] / (r["median"] * 1e-3) / 1e12)
    assert r["peak_tflops"] is None and r["peak_fraction"] is None


def test_peak_tflops_per_card_and_precision():
  peak = bench_accelerator.peak_tflops
  assert peak("NVIDIA H100 80GB HBM3", "bfloat16", "auto") == (989.4,
                                                                 "bfloat16")
  # A float32 model at jax's default precision runs on TF32 tensor cores.
  assert peak("NVIDIA H200", "float32", "auto") == (494.7, "tf32")
  assert peak("NVIDIA H200", "float32", "float32") == (67.0, "float32")
  assert peak("NVIDIA H100 PCIe", "float32", "tf32") == (378.0, "tf32")
  assert peak("cpu", "float32", "auto") == (None, None)


def test_plan_estimates_from_an_earlier_report(tmp_path):
  """--plan measures nothing: each measurement's estimate is its rows'
  share of an earlier report's wall time (hand-made here: 30 s and 50 s),
  or its time cap where the report lacks it; the running total is checked
  against the budget."""
  earlier = tmp_path / "earlier.json"
  rows = [
      {"section": "engine", "name": "lenet5/C=4/auto", "status": "ok",
       "elapsed_s": 30.0},
      {"section": "compile", "name": "engine/lenet5/C=4/auto",
       "status": "ok", "elapsed_s": 30.0},
      {"section": "engine", "name": "lenet5/C=8/auto", "status": "ok",
       "elapsed_s": 80.0}]
  earlier.write_text(json.dumps({
      "meta": {"platform": "gpu", "device": "NVIDIA H200",
               "device_count": 1, "jax_version": "0.12.0"}, "rows": rows}))
  out = tmp_path / "plan.json"
  report = bench_accelerator.main([
      "--out", str(out), "--quick", "--plan", "--plan_from", str(earlier),
      "--sections", "engine", "--clients", "4,8,16", "--cap_engine_s", "60",
      "--budget_s", "100"])
  with open(out) as f:
    assert json.load(f) == json.loads(json.dumps(report))
  plan = report["plan"]
  assert [p["names"] for p in plan] == [
      ["engine/lenet5/C=4/auto"], ["engine/lenet5/C=8/auto"],
      ["engine/lenet5/C=16/auto"]]
  assert [p["estimate_s"] for p in plan] == [30.0, 50.0, 60.0]
  assert [p["source"] for p in plan] == ["report", "report", "cap"]
  assert [p["cumulative_s"] for p in plan] == [30.0, 80.0, 140.0]
  assert [p["fits"] for p in plan] == [True, True, False]
  # The plan is for the reports' machine.
  assert report["meta"]["device"] == "NVIDIA H200"


def test_unknown_precision_or_model_is_refused_before_anything_runs(
    tmp_path):
  for flags in (["--precisions", "float32,fp8"], ["--models", "vgg99"],
                ["--plan_from", str(tmp_path / "x.json")]):
    with pytest.raises(SystemExit):
      bench_accelerator.main(["--out", str(tmp_path / "e.json"), "--quick",
                              *flags])
  assert not (tmp_path / "e.json").exists()


def test_torch_bf16_autocast_loop():
  """The PyTorch lean loop under bfloat16 autocast (skipped without
  torch)."""
  pytest.importorskip("torch")
  from fedjax_dd.experiments.bench import bench_engine

  r = bench_engine.measure_torch("lenet5", 2, steps=2, batch=4, reps=1,
                                 lean=True, autocast=True)
  assert r["autocast"] == "bfloat16" and r["ms_per_client_step"] > 0
  with pytest.raises(ValueError, match="lean"):
    bench_engine.measure_torch("lenet5", 2, steps=2, batch=4, reps=1,
                               autocast=True)


def test_plan_times_another_form_like_the_measured_one(tmp_path):
  """A row the report lacks in this form or precision is estimated from
  the same model and cohort's row."""
  earlier = tmp_path / "earlier.json"
  earlier.write_text(json.dumps({
      "meta": {"platform": "gpu", "device": "NVIDIA H100 80GB HBM3",
               "device_count": 1, "jax_version": "0.11.2"},
      "rows": [{"section": "engine", "name": "lenet5/C=4/auto",
                "status": "ok", "elapsed_s": 20.0}]}))
  report = bench_accelerator.main([
      "--out", str(tmp_path / "plan.json"), "--quick", "--plan",
      "--plan_from", str(earlier), "--sections", "engine",
      "--conv_impls", "lax,patches", "--precisions", "bfloat16"])
  assert [(p["names"], p["estimate_s"], p["source"])
          for p in report["plan"]] == [
              (["engine/lenet5/C=4/auto/conv=lax/prec=bfloat16"], 20.0,
               "report, other form"),
              (["engine/lenet5/C=4/auto/conv=patches/prec=bfloat16"], 20.0,
               "report, other form")]
