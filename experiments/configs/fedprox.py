r"""FedProx under the FedAvg presets (mu = 0.01; FedD3's protocol: mu = 0.1).

  fedjax-dd --config=experiments/configs/fedprox.py:mnist_c2 --workdir=/tmp/fp
    MNIST, pathological C=2, 100 clients, 30 rounds.
  fedjax-dd --config=experiments/configs/fedprox.py:mnist_fedd3 --workdir=/tmp/fp3
    FedD3's multi-shot baseline (Tab. 2, App. C: mu = 0.1): 500 clients,
    C_k = 2 FedD3-style, 18 rounds of 10 local epochs (see fedavg.py).
  ...fedprox.py:mnist_iid_fedd3 / cifar10_fedd3   the other FedD3 cells.
  fedjax-dd --config=experiments/configs/fedprox.py:fmnist_dir0.01 --workdir=/tmp/fp \
      --config.rounds=30
    DisUE's protocol (a baseline of its Tab. 1; disue.py's presets, mu =
    0.01). Expected: final test accuracy about 0.70
    (experiments/results/disue_tab1_fmnist_dir0.01_30rounds.md).
"""

from fedjax_dd.experiments.configs import fedavg as fedavg_config


def get_config(arg: str = "mnist_c2"):
  if arg.endswith(fedavg_config.DISUE_SUFFIXES):
    c = fedavg_config.disue_preset("fedprox", arg)
    c.client.mu = 0.01
    return c
  c = fedavg_config.federated_preset("fedprox", arg)
  c.client.mu = 0.1 if arg in fedavg_config.FEDD3_PRESETS else 0.01
  return c
