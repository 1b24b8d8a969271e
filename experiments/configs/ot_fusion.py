r"""OT fusion (one-shot): the clients' neurons aligned by optimal transport, averaged.

Same presets, partitions, seeds and client protocol as ``fedhydra.py``, so
``--config.server.teachers_from`` reuses FedHydra's client models and every
summary reports one-shot FedAvg of the same clients beside OT fusion. No
server epochs, no data: the transports are solved once on the uploaded
weights (``ot_fusion.mode=weights``, the default) or on the pre-activations
of ``ot_fusion.num_samples`` = 200 images of the unlabeled public set
(``ot_fusion.mode=activations``; FedDF's ``data.public_data``: Fashion-MNIST
for MNIST). Needs POT (``pip install 'fedjax-dd[ot]'``).

  fedjax-dd --config=experiments/configs/ot_fusion.py:mnist_a0.5 --workdir=/tmp/ot5 \
      --config.server.teachers_from=/tmp/fh5
    MNIST, Dirichlet α = 0.5, the clients of fedhydra.py:mnist_a0.5.
    Expected with --config.client.local_epochs=2 (seed 0): about 0.90
    (experiments/results/oneshot_baselines_mnist.md).
  ...ot_fusion.py:mnist_a0.1   Dirichlet α = 0.1.
  ...ot_fusion.py:smoke        sklearn digits, 3 clients, seconds.

Every FedHydra preset name works (``<dataset>_<partition>[_gpu]``);
heterogeneous clients are refused (fusion averages parameters).
"""

from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import fedhydra


def get_config(arg: str = "mnist_a0.5"):
  c = fedhydra.preset("ot_fusion", arg)
  return registry.add_group(c, "ot_fusion")
