r"""fedftg under DisUE's protocol (a baseline of disue.py; same presets).

Commands (CPU, 2 cores)::

  fedjax-dd --config=experiments/configs/fedftg.py:fmnist_dir0.01 --workdir=/tmp/fedftg
  ...fedftg.py:cifar10_dir0.01 / cifar10_dir0.1 / smoke / *_gpu

See experiments/configs/disue.py for the protocol (N = 100, Act = 0.15,
FedFTG's Dirichlet, 5 local epochs, batch 50, SGD lr 0.1·0.998^t, weight
decay 1e-3, clip 10, flip and crop) and the presets.
FedFTG (Zhang et al., CVPR 2022): FedAvg of the cohort, then IGA with
the cohort's clients as teachers (labels from their class counts, per-class
teacher weights), the ``iga`` group's settings.
Measured: not yet.
"""

from fedjax_dd.experiments.configs import disue


def get_config(arg: str = "fmnist_dir0.01"):
  return disue.protocol("fedftg", arg)
