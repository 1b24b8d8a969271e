r"""What personalized evaluation costs beside the global split's, on a preset.

  python -m fedjax_dd.experiments.bench.bench_personal \
      --config=fedavg:fmnist_dir0.01 --finetune_steps=0,12

Builds the preset's clients, their personal test data
(``--config.eval.personal=True``'s, :func:`fedjax_dd.experiments.common.
personal_split`) and its algorithm, then times, on the initial model (seed
0), one personalized evaluation of every client for each fine-tuning step
count and one evaluation of the global test split: the first call
(compilation included) and a second one. Prints one line each, with the
personalized accuracy.
"""

from __future__ import annotations

import argparse
import importlib
import time

import numpy as np

import fedjax_dd


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--config", default="fedavg:fmnist_dir0.01",
                  help="CONFIG:PRESET of experiments/configs")
  ap.add_argument("--finetune_steps", default="0,12",
                  help="comma-separated eval.finetune_steps to time")
  args = ap.parse_args(argv)
  fedjax_dd.configure_cpu()
  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core import fit as fit_lib
  from fedjax_dd.core.evaluate import make_evaluator
  from fedjax_dd.experiments import common, registry
  name, _, preset = args.config.partition(":")
  config = importlib.import_module(
      f"fedjax_dd.experiments.configs.{name}").get_config(preset)
  config.eval.personal = True
  prepared = common.load_and_prepare(config)
  parts, test = common.personal_split(
      config, prepared, common.partition(config, prepared.dataset.y_train))
  data = common.client_data(prepared.dataset, parts)
  steps = common.local_steps(config, data.num_examples)
  algorithm = registry.build_rounds(
      config, common.local_training(config, prepared.task, int(steps.max())),
      data)
  state = fit_lib.initial_state(algorithm, prepared.task, data.num_clients,
                                seed=0)

  def timed(fn):
    t = time.time()
    fn()
    first = time.time() - t
    t = time.time()
    out = fn()
    return first, time.time() - t, out

  print(f"{args.config}: {data.num_clients} clients, "
        f"{int(np.sum(test.num_examples))} personal test examples")
  for k in (int(s) for s in args.finetune_steps.split(",")):
    config.eval.finetune_steps = k
    evaluate = common.personal_evaluation(config, algorithm, prepared.task,
                                          data, test)
    first, second, out = timed(lambda: evaluate(state))
    print(f"personal, finetune_steps={k}: first {first:.1f} s, then "
          f"{second:.1f} s; personal_accuracy {out['personal_accuracy']:.4f}")
  split = make_evaluator(prepared.task, prepared.dataset.x_test,
                         prepared.dataset.y_test)
  first, second, out = timed(lambda: split(state.server.params,
                                           state.server.batch_stats))
  print(f"global split: first {first:.1f} s, then {second:.1f} s; "
        f"test_accuracy {out['accuracy']:.4f}")


if __name__ == "__main__":
  main()
