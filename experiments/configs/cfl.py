r"""CFL under DisUE's protocol (a clustered baseline of disue.py; same presets).

Commands (CPU, 2 cores)::

  fedjax-dd --config=experiments/configs/cfl.py:smoke --workdir=/tmp/cfl
  fedjax-dd --config=experiments/configs/cfl.py:fmnist_dir0.01 --workdir=/tmp/cfl
  ...cfl.py:cifar10_dir0.01 / cifar10_dir0.1 / *_gpu
  ...cfl.py:<any of them>+iga   IGA plugged into the cluster models
    (DisUE Tab. 2): the evaluated model is distilled from them every round.

See experiments/configs/disue.py for the protocol and the presets.
CFL (Sattler et al., IEEE TNNLS 2020; :mod:`fedjax_dd.algorithms.cfl`): one
cluster at first; a cluster whose mean update norm is below ``cfl.eps1``
while its largest is above ``cfl.eps2`` splits in two by the cosines of its
clients' updates, from round ``cfl.warmup + 1`` on, up to
``cfl.max_clusters``. ``eps1 = 0.4``, ``eps2 = 1.6`` and the warm-up of 20
are the authors' EMNIST values; ``num_clusters_by_round`` in
``summary.json`` shows whether a run split. The smoke preset splits from
round 2 (warm-up 1, ``eps1`` large, ``eps2 = 0``) so that it exercises the
tree.

Expected: ``cfl.py:smoke`` splits 1 -> 2 -> 4 clusters in its 3 rounds
(experiments/results/smoke_presets.md).
"""

from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import disue


def get_config(arg: str = "fmnist_dir0.01"):
  c = registry.add_group(disue.clustered_baseline("cfl", arg), "cfl")
  if arg.startswith("smoke"):
    c.rounds = 3
    c.cfl.update({"warmup": 1, "eps1": 1e3, "eps2": 0.0, "max_clusters": 4})
  return c
