r"""SCAFFOLD (option II variates, server lr 1) under the FedAvg presets.

  fedjax-dd --config=experiments/configs/scaffold.py:mnist_c2 --workdir=/tmp/sc
    MNIST, pathological C=2, 100 clients, 30 rounds.
  fedjax-dd --config=experiments/configs/scaffold.py:fmnist_dir0.01 --workdir=/tmp/sc \
      --config.rounds=30
    DisUE's protocol (a baseline of its Tab. 1; disue.py's presets).
    Expected: final test accuracy about 0.73
    (experiments/results/disue_tab1_fmnist_dir0.01_30rounds.md).
"""

from fedjax_dd.experiments.configs import fedavg as fedavg_config


def get_config(arg: str = "mnist_c2"):
  c = (fedavg_config.disue_preset("scaffold", arg)
       if arg.endswith(fedavg_config.DISUE_SUFFIXES)
       else fedavg_config.federated_preset("scaffold", arg))
  c.server.lr = 1.0
  return c
