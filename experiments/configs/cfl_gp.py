r"""CFL-GP under DisUE's protocol (a clustered baseline of disue.py; same
presets).

Commands (CPU, 2 cores)::

  fedjax-dd --config=experiments/configs/cfl_gp.py:smoke --workdir=/tmp/cfl_gp
  fedjax-dd --config=experiments/configs/cfl_gp.py:fmnist_dir0.01 --workdir=/tmp/cfl_gp
  ...cfl_gp.py:cifar10_dir0.01 / cifar10_dir0.1 / *_gpu
  ...cfl_gp.py:<any of them>+iga   IGA plugged into the cluster models
    (DisUE Tab. 2): the evaluated model is distilled from them every round.

See experiments/configs/disue.py for the protocol and the presets.
CFL-GP (Kim, Kim, de Veciana, ICML 2024; :mod:`fedjax_dd.algorithms.cfl_gp`):
each sampled client's update, cut to 1/``cfl_gp.compression`` of its
coordinates, is averaged into its row of the gradient profile; in rounds
1, 1 + ``cfl_gp.period``, ... up to ``cfl_gp.stop_round`` the server
partitions the clients into ``cfl_gp.num_clusters`` by K-Means on the
profile's top singular vectors. Period 2, stop at round 10 and 1/100 of the
coordinates are the authors' code's defaults; K = 4 is this library's
choice. The smoke preset keeps
every coordinate and partitions every round into 2.

Expected: final test accuracy about 0.46 (fmnist_dir0.01, seed 0,
``--config.rounds=10 --config.run.eval_every=1
--config.run.max_wall_seconds=0``);
experiments/results/cfl_gp_fmnist_dir0.01_seed0.md.
"""

from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import disue


def get_config(arg: str = "fmnist_dir0.01"):
  c = registry.add_group(disue.clustered_baseline("cfl_gp", arg), "cfl_gp")
  if arg.startswith("smoke"):
    c.rounds = 3
    c.cfl_gp.update({"num_clusters": 2, "period": 1, "compression": 1})
  return c
