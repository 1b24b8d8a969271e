r"""HFLDD with random real samples: the control for the distillation.

Same partitions, seeds, clustering and head training as ``hfldd.py``, but
each member sends ``hfldd.support_size`` (400) of its raw images drawn at
random (``hfldd.member_data="random"``) instead of 400 KIP images: the same
upload budget and traffic, so HFLDD's gain over this run is what KIP adds
beyond sending that many real samples. ``summary.json["privacy"]`` reads 1.0
identical to raw. Presets are those of ``hfldd.py`` (``<preset>_paper``;
``<preset>_gpu`` is an alias).

  fedjax-dd --config=experiments/configs/hfldd_random.py:mnist_c1 --workdir=/tmp/r1
  ...hfldd_random.py:smoke    digits, for tests.

Expected: test accuracy 0.9700 after round 7 (mnist_c1, seed 0,
``--config.rounds=7``; experiments/results/fedd3_hfldd_mnist_c8d33f3.md).
"""

from fedjax_dd.experiments.configs import hfldd


def get_config(arg: str = "mnist_c1"):
  return hfldd.hfldd_preset(arg, method="hfldd_random", member_data="random")
