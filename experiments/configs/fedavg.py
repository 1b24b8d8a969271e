"""FedAvg on 100 clients (HFLDD protocol: all clients every round).

The baseline of three protocols; presets by protocol (CPU, 2 cores):

  fedjax-dd --config=experiments/configs/fedavg.py:mnist_iid --workdir=/tmp/fa
    MNIST, IID, LeNet-5, 30 rounds, E=2, B=32, SGD lr 0.05.
  ...fedavg.py:mnist_c2 / mnist_c1 / cifar10_c1 / cifar10_c2   HFLDD's
    pathological C = 1, 2 splits (the baselines of hfldd.py).
  ...fedavg.py:mnist_fedd3 / mnist_iid_fedd3 / cifar10_fedd3   FedD3's
    protocol (Tab. 2 multi-shot baselines, App. C: 500 clients, C_k = 2,
    10 local epochs, SGD momentum 0.9, batch 50, lr 0.01), shared by
    fedprox.py, scaffold.py and fednova.py.
  ...fedavg.py:fmnist_dir0.01 / fmnist_dir0.1 / cifar10_dir0.01 /
    cifar10_dir0.1 / svhn_gpu / cifar10_gpu / cifar100_gpu   DisUE's
    protocol (disue.py).
  ...fedavg.py:smoke  digits, 8 clients, 2 rounds.

FedD3- and HFLDD-protocol presets set ``server.gce_gammas``, so
``summary.json`` reports ``gce``, ``gce_best`` and ``gce_cohort``.

Expected: test accuracy >= 0.97 (mnist_iid, seed 0;
experiments/results/fedavg_presets.md).
"""

from fedjax_dd.experiments.configs import base as base_lib


MNIST_GCE_GAMMAS = (0.01, 0.5)
CIFAR10_GCE_GAMMAS = (0.1, 2.0)

FEDD3_PRESETS = ("mnist_fedd3", "mnist_iid_fedd3", "cifar10_fedd3")


def fedd3_protocol(method: str, arg: str):
  """FedD3's multi-shot baseline protocol (Tab. 2, App. C)."""
  if arg.startswith("cifar10"):
    c = base_lib.base(method=method, dataset=base_lib.CIFAR10,
                      model="alexcifarnet")
    c.rounds = 6
    c.server.gce_gammas = CIFAR10_GCE_GAMMAS
  else:
    c = base_lib.base(method=method, dataset=base_lib.MNIST, model="lenet5")
    c.rounds = 18
    c.server.gce_gammas = MNIST_GCE_GAMMAS
  c.data.partition = (base_lib.ml_collections.ConfigDict({"name": "iid"})
                      if arg == "mnist_iid_fedd3"
                      else base_lib.pathological(2, style="fedd3"))
  c.data.num_clients = 500
  c.client.local_epochs = 10.0
  c.client.batch_size = 50
  c.client.optimizer = "sgd"
  c.client.momentum = 0.9
  c.client.lr = 0.01
  c.run.eval_every = 1
  return c


def federated_preset(method: str, arg: str):
  """Shared presets of the FedAvg family (FedAvg, FedProx, SCAFFOLD, FedNova)."""
  if arg == "smoke":
    c = base_lib.base(method=method, dataset="digits", model="digits_cnn")
    c.data.num_clients = 8
    c.rounds = 2
    c.client.batch_size = 16
    c.client.local_epochs = 1.0
    c.data.partition = base_lib.pathological(2)
    c.server.gce_gammas = MNIST_GCE_GAMMAS
    return c
  if arg in FEDD3_PRESETS:
    return fedd3_protocol(method, arg)
  partitions = {
      "mnist_iid": base_lib.ml_collections.ConfigDict({"name": "iid"}),
      # HFLDD's split (equal clients per class), the same as hfldd.py's, so
      # that the two compare on one partition.
      "mnist_c1": base_lib.pathological(1, style="balanced"),
      "mnist_c2": base_lib.pathological(2, style="balanced"),
      "mnist_c10": base_lib.pathological(10, style="balanced"),
      "cifar10_c1": base_lib.pathological(1, style="balanced"),
      "cifar10_c2": base_lib.pathological(2, style="balanced"),
  }
  if arg not in partitions:
    raise ValueError(f"Unknown preset {arg!r}; expected one of "
                     f"{sorted([*partitions, *FEDD3_PRESETS, 'smoke'])}.")
  if arg.startswith("cifar10"):
    c = base_lib.base(method=method, dataset=base_lib.CIFAR10,
                      model="hfldd_cifar_cnn")
    c.server.gce_gammas = CIFAR10_GCE_GAMMAS
  else:
    c = base_lib.base(method=method, dataset=base_lib.MNIST, model="lenet5")
    c.server.gce_gammas = MNIST_GCE_GAMMAS
  c.data.partition = partitions[arg]
  c.data.num_clients = 100
  c.rounds = 30
  c.client.batch_size = 32
  c.client.local_epochs = 2.0
  # HFLDD's protocol (lr 0.01) for the non-IID presets it compares against;
  # the IID preset uses 0.05 so that FedAvg converges within its 30 rounds.
  c.client.lr = 0.05 if arg == "mnist_iid" else 0.01
  return c


# Preset names of DisUE's protocol (disue.py's presets).
DISUE_SUFFIXES = ("_dir0.01", "_dir0.1", "_gpu", "_paper")


def disue_preset(method: str, arg: str):
  """DisUE's protocol for ``method`` (a baseline of its Tab. 1)."""
  from fedjax_dd.experiments.configs import disue  # pylint: disable=g-import-not-at-top
  return disue.protocol(method, arg)


def get_config(arg: str = "mnist_iid"):
  if arg.endswith(DISUE_SUFFIXES):
    return disue_preset("fedavg", arg)
  return federated_preset("fedavg", arg)
