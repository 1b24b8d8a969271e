r"""HFLDD w/o DD (paper Fig. 5): members send raw data instead of KIP data.

Same partitions, seeds, clustering and head training as ``hfldd.py``
(``hfldd.member_data="raw"``); only stage 5 changes, so the gap to HFLDD
isolates the effect of distillation. ``summary.json["privacy"]`` reads 1.0
identical to raw. Presets are those of ``hfldd.py`` (``<preset>_paper``;
``<preset>_gpu`` is an alias).

  fedjax-dd --config=experiments/configs/hfldd_wodd.py:mnist_c1 --workdir=/tmp/w1
  ...hfldd_wodd.py:smoke    digits, for tests.

Expected: test accuracy 0.9752 after round 7 (mnist_c1, seed 0,
``--config.rounds=7``; experiments/results/hfldd_mnist_presets.md).
"""

from fedjax_dd.experiments.configs import hfldd


def get_config(arg: str = "mnist_c1"):
  return hfldd.hfldd_preset(arg, method="hfldd_wodd", member_data="raw")
