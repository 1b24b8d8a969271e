r"""MOON (Li, He, Song, CVPR 2021) under DisUE's protocol (a baseline of
disue.py's Tab. 1; same presets).

Commands (CPU, 2 cores)::

  fedjax-dd --config=experiments/configs/moon.py:smoke --workdir=/tmp/moon
    digits, 10 clients, 4 a round, 2 rounds, a plumbing check.
  fedjax-dd --config=experiments/configs/moon.py:fmnist_dir0.01 --workdir=/tmp/moon \
      --config.rounds=30
    Fashion-MNIST Dir(0.01), LeNet-5, 30 rounds. Expected: final test
    accuracy about 0.62 (seed 0;
    experiments/results/moon_feddyn_fmnist_dir0.01_seed0.md).
  ...moon.py:cifar10_dir0.01 / cifar10_dir0.1 / svhn_gpu / cifar10_gpu /
    cifar100_gpu   (mu = 5 on CIFAR-100, MOON Sec. 4.1)

See experiments/configs/disue.py for the protocol and the presets. The
model is the preset's with MOON's projection head (``<model>_proj``: the
model less its output layer, ``d -> d -> 256``, an output layer on the
projection), so its messages are larger than the other baselines'.
``--config.model.proj_dim=W`` sets the head's width (MOON's ``--out_dim``;
0, the default, keeps 256).
"""

from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import disue


def get_config(arg: str = "fmnist_dir0.01"):
  c = registry.add_group(disue.protocol("moon", arg), "moon")
  c.model.name = f"{c.model.name}_proj"
  if arg == "cifar100_gpu":
    c.moon.mu = 5.0
  return c
