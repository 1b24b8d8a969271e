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
