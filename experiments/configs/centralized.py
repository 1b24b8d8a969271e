r"""Centralized training: one model on the whole training set (upper bound).

Commands (CPU, 2 cores):

  fedjax-dd --config=experiments/configs/centralized.py:digits --workdir=/tmp/c
    sklearn digits, small CNN, 20 epochs.
  fedjax-dd --config=experiments/configs/centralized.py:mnist --workdir=/tmp/m
    MNIST (npz:../shared/datasets/mnist.npz), LeNet-5, Adam, 4 epochs.
  fedjax-dd --config=experiments/configs/centralized.py:cifar10 --workdir=/tmp/cc
    CIFAR-10, HFLDD's CIFAR CNN (``--config.model.name=convnet3`` for the CPU
    runs next to HFLDD), Adam, 20 epochs; the upper bound of hfldd.py:cifar10_*.
  ...centralized.py:smoke  two epochs on digits, for tests.

HFLDD's centralized baseline (Shi et al., 2024, Sec. V-A: "For centralized
learning, the training batch size is 64, and the learning rate is 0.01";
"all other configurations are consistent with the pretraining phase", which
uses SGD) is a separate preset so that the Adam presets above keep their
settings:

  ...centralized.py:mnist_hfldd / cifar10_hfldd   SGD (no momentum), lr
    0.01, batch 64, LeNet-5 / HFLDD CIFAR CNN, the dataset's own split (as
    the CPU presets of hfldd.py), 20 / 50 epochs (the paper does not give
    CL's epochs).
  ...centralized.py:mnist_hfldd_paper / cifar10_hfldd_paper   as above on
    the paper's 80 % / 20 % re-split of the pooled dataset
    (``data.resplit = 0.8``, as hfldd.py's ``_paper`` presets), 300 epochs
    (T of the paper); ``mnist_hfldd_gpu`` / ``cifar10_hfldd_gpu`` are
    aliases.

One round is one epoch over the pooled data. ``--config.data.dataset=...``
points any of these at another source.

Expected: test accuracy >= 0.985 (mnist).
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
  # HFLDD's CL: SGD, lr 0.01, batch 64 (the other presets use Adam).
  hfldd_cl = dict(optimizer="sgd", lr=0.01, batch_size=64)
  presets.update({
      "mnist_hfldd": dict(dataset=base_lib.MNIST, model="lenet5", rounds=20,
                          **hfldd_cl),
      "cifar10_hfldd": dict(dataset=base_lib.CIFAR10, model="hfldd_cifar_cnn",
                            rounds=50, **hfldd_cl),
      "mnist_hfldd_paper": dict(dataset=base_lib.MNIST, model="lenet5",
                                rounds=300, resplit=0.8, **hfldd_cl),
      "cifar10_hfldd_paper": dict(dataset=base_lib.CIFAR10,
                                  model="hfldd_cifar_cnn", rounds=300,
                                  resplit=0.8, **hfldd_cl),
  })
  # Aliases of the _paper presets.
  presets["mnist_hfldd_gpu"] = presets["mnist_hfldd_paper"]
  presets["cifar10_hfldd_gpu"] = presets["cifar10_hfldd_paper"]
  if arg not in presets:
    raise ValueError(f"Unknown preset {arg!r}; expected one of {sorted(presets)}.")
  p = presets[arg]
  c = base_lib.base(method="centralized", dataset=p["dataset"],
                    model=p["model"])
  c.rounds = p["rounds"]
  c.client.batch_size = p["batch_size"]
  c.data.num_clients = 1
  c.client.optimizer = p.get("optimizer", "adam")
  c.client.lr = p.get("lr", 1e-3)
  c.data.resplit = p.get("resplit", 0.0)
  c.client.local_epochs = 1.0
  return c
