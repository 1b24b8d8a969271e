"""PACFL under DisUE's protocol (a clustered baseline of disue.py; same
presets).

Commands (CPU, 2 cores)::

  fedjax-dd --config=experiments/configs/pacfl.py:smoke --workdir=/tmp/pacfl
  fedjax-dd --config=experiments/configs/pacfl.py:fmnist_dir0.01 --workdir=/tmp/pacfl
  ...pacfl.py:cifar10_dir0.01 / cifar10_dir0.1 / *_gpu
  ...pacfl.py:<any of them>+iga   IGA plugged into the cluster models
    (DisUE Tab. 2): the evaluated model is distilled from them every round.

See experiments/configs/disue.py for the protocol and the presets.
PACFL (Vahidian et al., AAAI 2023; :mod:`fedjax_dd.algorithms.pacfl`):
before round 1 every client sends the top ``pacfl.rank`` left singular
vectors of each of its classes' raw pixels; the server clusters their
angles (``pacfl.proximity``) by average-linkage agglomerative clustering,
stopping at ``pacfl.threshold`` degrees (or a fixed ``pacfl.num_clusters``
with ``threshold = 0``). ``p = 3`` and the linkage are the authors'; the
full presets keep their 4.9 degrees, the smoke preset uses 6.

Expected: final test accuracy about 0.23 (fmnist_dir0.01, seed 0,
``--config.rounds=20 --config.run.eval_every=1
--config.run.max_wall_seconds=0``;
experiments/results/pacfl_fmnist_dir0.01_seed0.md).
"""

from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import disue


def get_config(arg: str = "fmnist_dir0.01"):
  c = registry.add_group(disue.clustered_baseline("pacfl", arg), "pacfl")
  if arg.startswith("smoke"):
    c.pacfl.threshold = 6.0
  return c
