r"""feddf_datafree under DisUE's protocol (a baseline of disue.py; same presets).

Commands (CPU, 2 cores)::

  fedjax-dd --config=experiments/configs/feddf_datafree.py:fmnist_dir0.01 --workdir=/tmp/feddf_datafree
  ...feddf_datafree.py:cifar10_dir0.01 / cifar10_dir0.1 / smoke / *_gpu

See experiments/configs/disue.py for the protocol and the presets.
Data-free FedDF, as DisUE's Tab. 1 runs FedDF: FedAvg of the cohort,
then distillation of the plain client ensemble (uniform labels, equal teacher
weights) on samples of the same conditional generator.

Expected: final test accuracy 0.6094 (fmnist_dir0.01, seed 0,
``--config.rounds=30 --config.run.max_wall_seconds=0``;
experiments/results/disue_tab1_fmnist_personal.md).
"""

from fedjax_dd.experiments.configs import disue


def get_config(arg: str = "fmnist_dir0.01"):
  return disue.protocol("feddf_datafree", arg)
