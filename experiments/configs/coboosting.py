r"""Co-Boosting (one-shot): hard synthetic samples and a re-weighted ensemble.

Same presets, partitions, seeds and client protocol as ``fedhydra.py`` (see
there for the CPU and ``_gpu`` scales), so ``--config.server.teachers_from``
reuses FedHydra's client models. The generator, synthetic batch, pool,
``T_G``, epochs and the student's SGD (lr 0.01, momentum 0.9) are the shared
``dfkd`` group's, as for DENSE; the ``coboosting`` group holds Co-Boosting's
own settings, the defaults of the authors' code (``rong-dai/Co-Boosting``;
listed in ``fedjax_dd.algorithms.coboosting.CoBoostingHyperParams``, with
the algorithm and its departures from that code).

  fedjax-dd --config=experiments/configs/coboosting.py:mnist_a0.5 --workdir=/tmp/cb5 \
      --config.server.teachers_from=/tmp/fh5
    MNIST, Dirichlet α = 0.5, on the clients of fedhydra.py:mnist_a0.5.
    Results: experiments/results/oneshot_baselines_mnist.md.
  ...coboosting.py:mnist_a0.1   Dirichlet α = 0.1.
  ...coboosting.py:smoke        sklearn digits, 3 clients; only checks that
    the loop runs.

Every FedHydra preset name works (``<dataset>_<partition>[_hetero][_gpu]``);
the authors' example command (``co_boosting.sh``) is at the scale of the
``_gpu`` presets.

Expected: final test accuracy 0.5726 (mnist_a0.01 with
``--config.client.independent_init=True``, seed 0;
experiments/results/fedhydra_independent_init_mnist_a0.01_cpu.md).
"""

from fedjax_dd.experiments.configs import base as base_lib
from fedjax_dd.experiments.configs import fedhydra


def get_config(arg: str = "mnist_a0.5"):
  c = fedhydra.preset("coboosting", arg)
  return base_lib.coboosting(c)
