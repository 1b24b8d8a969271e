r"""SCAFFOLD (option II variates, server lr 1) under the FedAvg presets.

  fedjax-dd --config=experiments/configs/scaffold.py:mnist_c2 --workdir=/tmp/sc
    MNIST, pathological C=2, 100 clients, 30 rounds; figures in the notes.
"""

from fedjax_dd.experiments.configs import fedavg as fedavg_config


def get_config(arg: str = "mnist_c2"):
  c = fedavg_config.federated_preset("scaffold", arg)
  c.server.lr = 1.0
  return c
