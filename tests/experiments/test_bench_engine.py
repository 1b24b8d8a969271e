"""The engine benchmark's client-step forms run and report every form."""

import math

import pytest

from fedjax_dd.experiments.bench import bench_engine


# Runs the measurement and checks its fields only: slow.
@pytest.mark.slow
def test_forms_report_every_form():
  out = bench_engine.measure_forms(steps=1, batch=4, reps=1, conv_impl="lax")
  assert out["conv_impl"] == "lax" and out["steps"] == 1
  for form in ("unbatched", "vmap1", "vmap2", "map2"):
    assert math.isfinite(out[form]) and out[form] > 0, form
  # The per-core programs run with XLA's intra-op threads off where XLA
  # has that option.
  assert set(out["compiler_options"]) <= {"xla_cpu_multi_thread_eigen",
                                          "xla_cpu_use_thunk_runtime"}


@pytest.mark.slow
def test_padding_report_on_the_smoke_preset():
  """Uneven Dirichlet clients: the bucketed stage computes at most the
  masked one's steps, at least the real ones, and the same bits."""
  row = bench_engine.measure_padding("fedhydra.py:smoke", pairs=1)
  assert row["clients"] == 3 and len(row["seconds"]) == 1
  assert row["real_steps"] <= row["computed_after"] <= row["computed_before"]
  assert row["computed_before"] >= row["max_steps"] * row["clients"]
  assert row["bit_identical"]


def test_vs_torch_alternates_and_takes_median_ratios(monkeypatch):
  """Fake measurements: the order rotates each pair and the ratios are
  PyTorch ms / engine ms, median with min and max over pairs."""
  calls = []
  ms = {"jax": [2.0, 4.0, 2.0], "torch": [4.0, 4.0, 6.0],
        "lean": [3.0, 2.0, 2.0]}

  def fake(kind, python=None, **kw):
    name = "lean" if kw.get("lean") else kind
    calls.append(name)
    return {"ms_per_client_step": ms[name].pop(0)}

  monkeypatch.setattr(bench_engine, "_subprocess", fake)
  out = bench_engine.measure_vs_torch(pairs=3, client_counts=[100], steps=1,
                                      batch=4, reps=1, chunk_size=0)
  assert calls == ["jax", "torch", "lean", "torch", "lean", "jax",
                   "lean", "jax", "torch"]
  s = out["summary"]["100"]
  assert s["engine_ms"] == 2.0 and s["torch_ms"] == 4.0
  # torch / engine per pair: 2, 1, 3; lean / engine: 1.5, 0.5, 1.
  assert s["ratio_torch"] == {"median": 2.0, "min": 1.0, "max": 3.0}
  assert s["ratio_torch_lean"] == {"median": 1.0, "min": 0.5, "max": 1.5}


def test_lean_torch_loop_runs_when_torch_is_installed():
  pytest.importorskip("torch")
  for lean in (False, True):
    r = bench_engine.measure_torch("lenet5", 2, steps=2, batch=4, reps=1,
                                   lean=lean)
    assert r["lean"] is lean and r["ms_per_client_step"] > 0


@pytest.mark.slow
def test_scale_row_on_a_small_population():
  row = bench_engine.measure_scale(200, participation=0.01, examples=6,
                                   rounds=1, batch=3)
  assert row["num_clients"] == 200 and row["clients_per_round"] == 2
  assert row["data_mb"] == (200 * 6 * 28 * 28 + 200 * 6 * 4) / 2**20
  assert row["seconds_per_round"] > 0 and row["peak_rss_mb"] > 0


def test_platform_reaches_the_measurement_subprocesses(monkeypatch):
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  assert "JAX_PLATFORMS" not in bench_engine.worker_env(None)
  assert bench_engine.worker_env("cuda")["JAX_PLATFORMS"] == "cuda"


# Runs the measurement and checks its fields only: slow.
@pytest.mark.slow
def test_profile_parts_add_up_to_the_update():
  r = bench_engine.measure_profile(steps=1, batch=4, reps=1, conv_impl="lax")
  assert set(r["ms_per_client_step"]) == {"sample", "forward", "sgd_dense",
                                          "sgd", "update"}
  assert all(v > 0 for v in r["ms_per_client_step"].values())
  assert math.isclose(sum(r["share_of_update"].values()), 1.0, rel_tol=1e-9)


@pytest.mark.slow
def test_padding_report_on_hfldd_heads():
  """An HFLDD preset's workload is its heads' round: one row per head, the
  heads' uneven data sizes, and the same bits bucketed or not."""
  from fedjax_dd.experiments import run_hfldd
  from fedjax_dd.experiments.configs import hfldd_random

  _, heads = run_hfldd.heads_data(hfldd_random.get_config("smoke"))
  row = bench_engine.measure_padding("hfldd_random.py:smoke", pairs=1)
  assert row["clients"] == heads.num_clients
  assert row["real_steps"] == sum(row["steps"]) == row["full"]["real_steps"]
  assert row["real_steps"] <= row["computed_after"] <= row["computed_before"]
  assert row["bit_identical"]


@pytest.mark.slow
def test_padding_epochs_scale_times_fewer_steps_and_keeps_full_counts():
  full = bench_engine.measure_padding("fedhydra.py:smoke", pairs=1)
  half = bench_engine.measure_padding("fedhydra.py:smoke", pairs=1,
                                      epochs_scale=0.5)
  assert half["full"] == full["full"]
  assert half["real_steps"] < full["real_steps"]
  assert half["max_steps"] < full["max_steps"]
  assert half["bit_identical"]


@pytest.mark.parametrize("model", ["lenet5", "convnet3"])
def test_torch_reference_models_have_the_engines_parameter_count(model):
  torch = pytest.importorskip("torch")
  del torch
  r = bench_engine.measure_torch(model, 2, steps=1, batch=4, reps=1,
                                 lean=True)
  assert r["model"] == model and r["ms_per_client_step"] > 0
  import jax
  from fedjax_dd.core import ledger
  task, _ = bench_engine._task(model, "lax")
  params, _ = task.init(jax.random.PRNGKey(0))
  assert r["param_count"] == ledger.num_params(params)


def test_default_report_has_every_section(monkeypatch, tmp_path):
  """Without a mode flag the report holds the grid, the PyTorch ratios, the
  padding rows and the scale rows."""
  calls = {}

  def fake_subprocess(kind, python=None, **kw):
    calls.setdefault(kind, []).append(kw)
    if kind == "matmul":
      return 100.0
    if kind == "torch":
      return None
    return {"model": kw.get("model"), "num_clients": kw.get("num_clients"),
            "backend": kw.get("backend"), "ms_per_client_step": 1.0}

  monkeypatch.setattr(bench_engine, "_subprocess", fake_subprocess)
  monkeypatch.setattr(bench_engine, "measure_padding",
                      lambda p, pairs, epochs_scale: {"preset": p,
                                                      "scale": epochs_scale})
  out = bench_engine.main(["--out", str(tmp_path / "r.json"), "--clients",
                           "10", "--models", "lenet5", "--backends",
                           "sharded"])
  assert [r["preset"] for r in out["padding"]] == list(
      bench_engine.FULL_PADDING_PRESETS)
  assert set(out["vs_torch"]["summary"]) == {"10", "100"}
  assert [kw["num_clients"] for kw in calls["scale"]] == [500, 2000, 10000]
  only = bench_engine.main(["--out", str(tmp_path / "g.json"), "--clients",
                            "10", "--models", "lenet5", "--backends",
                            "sharded", "--grid_only"])
  assert "padding" not in only and "vs_torch" not in only


# Runs the measurement and checks its fields only: slow.
@pytest.mark.slow
def test_layouts_report_both_layouts_with_and_without_donation():
  r = bench_engine.measure_layouts(steps=1, batch=4, reps=1)
  assert set(r["ms_per_client_step"]) == {"nhwc", "nchw", "nhwc_donate",
                                          "nchw_donate"}
  assert all(math.isfinite(v) and v > 0
             for v in r["ms_per_client_step"].values())


@pytest.mark.slow
def test_public_and_entry_rounds_run_with_the_same_forms():
  rows = {b: bench_engine.measure_round(b, num_clients=2, steps=1, batch=4,
                                        reps=1)
          for b in bench_engine.ROUND_BUILDS}
  for build, row in rows.items():
    assert row["build"] == build
    assert math.isfinite(row["ms_per_client_step"])
    assert row["ms_per_client_step"] > 0
  assert rows["public"]["conv_impl"] == rows["entry"]["conv_impl"]
  assert rows["public"]["conv_impl"] == rows["public"]["policy"]["conv"]
  with pytest.raises(ValueError, match="build must be one of"):
    bench_engine.measure_round("cli", num_clients=2, steps=1, batch=4, reps=1)


def test_public_round_alternates_and_takes_median_ratios(monkeypatch):
  calls = []
  ms = {"public": [2.2, 3.0, 1.0], "entry": [2.0, 2.0, 1.0]}

  def fake(kind, python=None, **kw):
    assert kind == "round"
    calls.append((python, kw["build"]))
    return {"ms_per_client_step": ms[kw["build"]].pop(0),
            "jax_version": "x", "conv_impl": "lax"}

  monkeypatch.setattr(bench_engine, "_subprocess", fake)
  out = bench_engine.measure_public_round(pairs=3, num_clients=4, steps=1,
                                          batch=4, reps=1)
  assert [b for _, b in calls] == ["public", "entry", "entry", "public",
                                   "public", "entry"]
  s = out["summary"]["this"]
  # public / entry per pair: 1.1, 1.5, 1.0.
  assert s["ratio_public_over_entry"] == pytest.approx(
      {"median": 1.1, "min": 1.0, "max": 1.5})
  assert s["public_ms"] == 2.2 and s["entry_ms"] == 2.0
  assert s["conv_impl"] == {"public": "lax", "entry": "lax"}


def test_every_benchmarked_model_is_registered_with_its_input_shape():
  from fedjax_dd import models  # pylint: disable=g-import-not-at-top
  for name, (registered, shape) in bench_engine.MODELS.items():
    assert models.get_model(registered).input_shape == shape, name
