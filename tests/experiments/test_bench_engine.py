"""The engine benchmark's client-step forms run and report every form."""

import math

from fedjax_dd.experiments import bench_engine


def test_forms_report_every_form():
  out = bench_engine.measure_forms(steps=1, batch=4, reps=1, conv_impl="lax")
  assert out["conv_impl"] == "lax" and out["steps"] == 1
  for form in ("unbatched", "vmap1", "vmap2", "map2"):
    assert math.isfinite(out[form]) and out[form] > 0, form
  # The per-core programs run with XLA's intra-op threads off where XLA
  # has that option.
  assert set(out["compiler_options"]) <= {"xla_cpu_multi_thread_eigen",
                                          "xla_cpu_use_thunk_runtime"}


def test_padding_report_on_the_smoke_preset():
  """Uneven Dirichlet clients: the bucketed stage computes at most the
  masked one's steps, at least the real ones, and the same bits."""
  row = bench_engine.measure_padding("fedhydra.py:smoke", pairs=1)
  assert row["clients"] == 3 and len(row["seconds"]) == 1
  assert row["real_steps"] <= row["computed_after"] <= row["computed_before"]
  assert row["computed_before"] >= row["max_steps"] * row["clients"]
  assert row["bit_identical"]
