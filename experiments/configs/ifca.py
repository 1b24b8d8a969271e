r"""ifca under DisUE's protocol (a baseline of disue.py; same presets).

Commands (CPU, 2 cores)::

  fedjax-dd --config=experiments/configs/ifca.py:fmnist_dir0.01 --workdir=/tmp/ifca
  ...ifca.py:cifar10_dir0.01 / cifar10_dir0.1 / smoke / *_gpu
  ...ifca.py:<any of them>+iga   IGA plugged into the cluster models
    (DisUE Tab. 2): the evaluated model is distilled from them every round.

See experiments/configs/disue.py for the protocol and the presets.
IFCA (Ghosh et al., NeurIPS 2020): ``ifca.num_clusters`` models; each
client trains the one with the lowest loss on its data, and the server
averages per cluster. The evaluated model is the one most training examples
chose (``ifca.global_model``).

Expected: final test accuracy 0.6993 (fmnist_dir0.01, seed 0,
``--config.rounds=30 --config.run.max_wall_seconds=0``;
experiments/results/disue_tab1_fmnist_dir0.01_30rounds.md).
"""

from fedjax_dd.experiments.configs import disue


def get_config(arg: str = "fmnist_dir0.01"):
  return disue.clustered_baseline("ifca", arg)
