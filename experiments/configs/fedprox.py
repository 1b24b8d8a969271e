r"""FedProx (mu = 0.01) under the FedAvg presets.

  fedjax-dd --config=experiments/configs/fedprox.py:mnist_c2 --workdir=/tmp/fp
    MNIST, pathological C=2, 100 clients, 30 rounds; figures in the notes.
"""

from fedjax_dd.experiments.configs import fedavg as fedavg_config


def get_config(arg: str = "mnist_c2"):
  c = fedavg_config.federated_preset("fedprox", arg)
  c.mu = 0.01
  return c
