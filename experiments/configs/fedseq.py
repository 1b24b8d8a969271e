r"""FedSeq: O superclients of J clients, sequential ring training inside each.

The HFLDD baseline. Superclients mix the homogeneous clusters found from
label knowledge (as FedSeq groups clients by a pretrained model's view of
their data) unless ``hfldd.group_by_similarity=False`` (random groups).

  fedjax-dd --config=experiments/configs/fedseq.py:mnist_c1 --workdir=/tmp/s1
    MNIST, 100 clients, C=1, 10 superclients of 10, LeNet-5, E=2, B=32,
    SGD lr 0.01.
  ...fedseq.py:mnist_c2 / mnist_c10 / cifar10_c1 / cifar10_c2
  ...fedseq.py:<preset>_paper  the paper's protocol (T = 300, 80/20
    re-split); ``<preset>_gpu`` is an alias.
  ...fedseq.py:smoke    digits, for tests.

Partitions are those of ``hfldd.py``. Traffic is HFLDD Eq. 19 as printed,
``O |w| B1 ((2T - 1) + T J)``; ``--config.hfldd.fedseq_traffic=physical``
counts the ring's ``J - 1`` hand-offs per round instead.

Expected: test accuracy 0.7639 after round 7 (mnist_c1, seed 0,
``--config.rounds=7``; experiments/results/hfldd_fig3_mnist_c1_7rounds.md).
"""

from fedjax_dd.experiments.configs import base as base_lib
from fedjax_dd.experiments.configs import hfldd


def get_config(arg: str = "mnist_c1"):
  c = hfldd.shared_preset(arg, method="fedseq", runner="fedseq")
  # Stage 5 of the HFLDD presets (the members' uploads and their KIP);
  # FedSeq has no member stage.
  del c.kip
  for key in base_lib.hfldd_only_keys()[0]:
    del c.hfldd[key]
  # O superclients, J = data.num_clients / O.
  c.hfldd.num_groups = 5 if arg == "smoke" else 10
  return c
