r"""Centralized training: one model on the whole training set (upper bound).

Commands and expected results (CPU, 2 cores):

  fedjax-dd --config=experiments/configs/centralized.py:digits --workdir=/tmp/c
    sklearn digits, small CNN, 20 epochs: >= 0.90 test accuracy.
  fedjax-dd --config=experiments/configs/centralized.py:mnist --workdir=/tmp/m
    MNIST (npz:../shared/datasets/mnist.npz), LeNet-5, Adam, 4 epochs:
    >= 0.985 test accuracy.
  fedjax-dd --config=experiments/configs/centralized.py:cifar10 --workdir=/tmp/cc
    CIFAR-10, HFLDD's CIFAR CNN (``--config.model=convnet3`` for the CPU
    runs next to HFLDD), Adam, 20 epochs; the upper bound of hfldd.py:cifar10_*.
  ...centralized.py:smoke  two epochs on digits, for tests.

One round is one epoch over the pooled data. ``--config.dataset=...``
points any of these at another source.
"""

from fedjax_dd.experiments.configs import base as base_lib


def get_config(arg: str = "digits"):
  presets = {
      "digits": dict(dataset="digits", model="digits_cnn", rounds=20,
                     batch_size=32),
      "smoke": dict(dataset="digits", model="digits_cnn", rounds=2,
                    batch_size=32),
      "mnist": dict(dataset=base_lib.MNIST, model="lenet5", rounds=4,
                    batch_size=64),
      "cifar10": dict(dataset=base_lib.CIFAR10, model="hfldd_cifar_cnn",
                      rounds=20, batch_size=64),
  }
  if arg not in presets:
    raise ValueError(f"Unknown preset {arg!r}; expected one of {sorted(presets)}.")
  p = presets[arg]
  c = base_lib.base(method="centralized", dataset=p["dataset"],
                    model=p["model"])
  c.rounds = p["rounds"]
  c.batch_size = p["batch_size"]
  c.num_clients = 1
  c.optimizer = "adam"
  c.lr = 1e-3
  c.local_epochs = 1.0
  return c
