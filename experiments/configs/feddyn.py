r"""FedDyn (Acar et al., ICLR 2021) under DisUE's protocol (a baseline of
disue.py's Tab. 1; same presets), alpha = 0.01.

Commands (CPU, 2 cores)::

  fedjax-dd --config=experiments/configs/feddyn.py:smoke --workdir=/tmp/fd
    digits, 10 clients, 4 a round, 2 rounds, a plumbing check.
  fedjax-dd --config=experiments/configs/feddyn.py:fmnist_dir0.01 --workdir=/tmp/fd \
      --config.rounds=30
    Fashion-MNIST Dir(0.01), LeNet-5, 30 rounds. Expected: final test
    accuracy about 0.76 (seed 0;
    experiments/results/moon_feddyn_fmnist_dir0.01_seed0.md).
  ...feddyn.py:cifar10_dir0.01 / cifar10_dir0.1 / svhn_gpu / cifar10_gpu /
    cifar100_gpu

See experiments/configs/disue.py for the protocol and the presets; FedDyn's
own code uses the same client learning-rate decay, weight decay and clip.
"""

from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import disue


def get_config(arg: str = "fmnist_dir0.01"):
  return registry.add_group(disue.protocol("feddyn", arg), "feddyn")
