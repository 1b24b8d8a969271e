r"""FedSeq: O superclients of J clients, sequential ring training inside each.

The HFLDD baseline (Eq. 19 traffic). Superclients mix the homogeneous
clusters found from label knowledge (as in FedSeq, which groups clients by a
pretrained model's view of their data) unless ``group_by_similarity=False``,
which groups at random.

  fedjax-dd --config=experiments/configs/fedseq.py:mnist_c1 --workdir=/tmp/s1
    MNIST, 100 clients, C=1, 10 superclients of 10, LeNet-5, E=2, B=32,
    SGD lr 0.01.
  ...fedseq.py:mnist_c2 / mnist_c10
  ...fedseq.py:smoke    digits, for tests.
"""

from fedjax_dd.experiments.configs import hfldd


def get_config(arg: str = "mnist_c1"):
  c = hfldd.hfldd_preset(arg, method="fedseq", distill_members=False)
  c.runner = "fedseq"
  c.num_groups = 5 if arg == "smoke" else 10  # O; J = num_clients / O.
  c.group_by_similarity = True
  return c
