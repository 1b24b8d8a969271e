"""The DisUE stage benchmark on a tiny configuration."""

import json

import pytest

from fedjax_dd.experiments.bench import bench_disue

# A tiny IGA and one local epoch without augmentation.
TINY = ["--model", "digits_cnn", "--examples_per_client", "20", "--set",
        "iga.iterations=1", "--set", "iga.batch_size=8", "--set", "iga.nz=8",
        "--set", "iga.ngf=4", "--set", "client.local_epochs=1.0", "--set",
        "client.augment="]


@pytest.mark.slow
def test_tiny_benchmark_times_every_stage_without_recompiling(tmp_path):
  out = tmp_path / "bench.json"
  report = bench_disue.main([
      "--out", str(out), "--clients", "4", "--cohort", "2", "--rounds", "1",
      "--ks", "1,2", *TINY])
  with open(out) as f:
    assert json.load(f) == json.loads(json.dumps(report))
  assert report["recompile_count"] == 0
  r = report["results"]["digits_cnn"]
  assert set(r["stage_seconds"]) == set(bench_disue.STAGES)
  assert all(v > 0 for v in r["stage_seconds"].values())
  assert r["round_seconds"] > 0
  assert (r["cohort"], r["num_clients"], r["input_shape"]) == (2, 4, [8, 8, 1])
  # 1 iteration of 1 generator step and 5 student steps.
  assert r["iga_steps_by_round"] == [6] and r["iga_steps_per_second"] > 0
  assert [(k["k"], k["real_teachers"]) for k in r["k_sweep"]] == [(1, 1),
                                                                  (2, 2)]
  # The counter sees compiles (the warm-up's), and none afterwards.
  assert r["compiles_in_warmup"] > 0
  assert r["recompiles_timed_rounds"] == r["recompiles_k_sweep"] == 0
  assert 1 <= r["num_groups_by_round"][0] <= 2


@pytest.mark.slow
def test_per_teacher_schedule_counts_one_generator_step_per_group(tmp_path):
  report = bench_disue.main([
      "--out", str(tmp_path / "b.json"), "--clients", "4", "--cohort", "2",
      "--rounds", "1", "--ks", "2", *TINY, "--set",
      "iga.generator_per_teacher=True"])
  r = report["results"]["digits_cnn"]
  # K generator steps (one per group) and 5 student steps.
  assert r["iga_steps_by_round"] == [r["num_groups_by_round"][0] + 5]
  assert r["recompiles_timed_rounds"] == r["recompiles_k_sweep"] == 0


@pytest.mark.slow
def test_bernoulli_activity_times_the_rounds_loops_draw(tmp_path):
  from fedjax_dd.core import cohorts, keys as keys_lib
  report = bench_disue.main([
      "--out", str(tmp_path / "b.json"), "--clients", "6", "--cohort", "2",
      "--rounds", "2", "--ks", "1", *TINY, "--set", "client.activity=0.5"])
  r = report["results"]["digits_cnn"]
  # Timed rounds 2 and 3 draw as run_rounds does: Bernoulli(0.5) on the
  # round's sample key, not a fixed cohort of --cohort clients.
  _, run_key = keys_lib.init_and_run(keys_lib.model_root(0))
  sampler = cohorts.BernoulliCohort(0.5)
  expected = [int(sampler.draw(keys_lib.sample_and_train(
      keys_lib.round_key(run_key, r))[0], 6).shape[0]) for r in (2, 3)]
  # The seed's draws (5 and 2 clients) tell the two apart.
  assert expected != [2, 2]
  assert r["cohort_by_round"] == expected
  assert all(1 <= c <= sampler.size_bound(6) for c in expected)
