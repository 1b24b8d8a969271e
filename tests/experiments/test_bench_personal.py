"""The personalized-evaluation timing script on the smoke preset."""

from fedjax_dd.experiments.bench import bench_personal


def test_bench_personal_prints_a_line_per_evaluation(capsys):
  bench_personal.main(["--config=fedavg:smoke", "--finetune_steps=0,1"])
  out = capsys.readouterr().out.splitlines()
  assert out[0].startswith("fedavg:smoke: 8 clients,")
  assert [line.split(":")[0] for line in out[1:]] == [
      "personal, finetune_steps=0", "personal, finetune_steps=1",
      "global split"]
