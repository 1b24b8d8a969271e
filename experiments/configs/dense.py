r"""DENSE: FedHydra's pipeline with the plain logit average (AE), no stratification.

Same presets, partitions, seeds and client protocol as ``fedhydra.py`` (see
there for the CPU vs ``_gpu`` scales), so under one seed DENSE and FedHydra
distil identical client models.

  fedjax-dd --config=experiments/configs/dense.py:mnist_a0.5 --workdir=/tmp/de5
    MNIST, Dirichlet α = 0.5 (paper Tab. 1: DENSE 77.86 %).
  ... --config.teachers_from=/tmp/fh5  reuses the clients of a FedHydra run
    of the same protocol (checked) instead of training them again.
  ...dense.py:mnist_a0.5_hetero  heterogeneous clients (``client_models``),
    server ResNet-18; ...dense.py:smoke_hetero on digits (see fedhydra.py).
"""

from fedjax_dd.experiments.configs import fedhydra


def get_config(arg: str = "mnist_a0.5"):
  return fedhydra.preset("dense", arg)
