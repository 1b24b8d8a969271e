r"""FedNova (plain local SGD, so a_i = tau_i) under the FedAvg presets.

  fedjax-dd --config=experiments/configs/fednova.py:mnist_c2 --workdir=/tmp/fn
    MNIST, pathological C=2, 100 clients, 30 rounds.
"""

from fedjax_dd.experiments.configs import fedavg as fedavg_config


def get_config(arg: str = "mnist_c2"):
  return fedavg_config.federated_preset("fednova", arg)
