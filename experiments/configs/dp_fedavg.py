r"""DP-FedAvg: FedAvg with client-level differential privacy (McMahan et al.).

Each round every sampled client's model delta is clipped to ``dp.clip``
(L2 over all parameters), the server adds Gaussian noise of std
``dp.noise_multiplier * dp.clip`` to their sum and divides by the expected
cohort size (``fedjax_dd.algorithms.dp_fedavg``; ICLR 2018, Alg. 1).
``summary.json`` reports ``dp_epsilon`` at ``dp.delta`` for the rounds run
(``fedjax_dd.privacy.accounting``, the ``privacy`` extra), with
``dp_noise_multiplier``, ``dp_clip``, ``dp_sampling_rate`` and ``dp_steps``.

  fedjax-dd --config=experiments/configs/dp_fedavg.py:mnist_noniid --workdir=/tmp/dpfa
    FedD3's multi-shot protocol (fedavg.py:mnist_fedd3: MNIST, 500 clients,
    C_k = 2, 18 rounds of 10 local epochs, SGD momentum 0.9, batch 50, lr
    0.01, every client every round) with clip 1, noise multiplier 1,
    delta 1e-5.
  ...dp_fedavg.py:cifar10_noniid   the same protocol on CIFAR-10
    (fedavg.py:cifar10_fedd3: AlexNet, 6 rounds).
  ...dp_fedavg.py:smoke   digits, 8 clients, 2 rounds.

Every client takes part in every round in every preset (sampling rate 1,
no amplification); ``--config.client.activity=P`` samples each client with
probability P (the draw the accountant assumes), ``--config.client.
clients_per_round=S`` a fixed S (accounted at rate S / N, an
approximation). The DP settings are part of the run: a workdir resumed
under other ``dp.*`` values is refused.

Expected: final test accuracy 0.7293 at epsilon 7.99 (mnist_noniid, seed
0, the epsilon-8 command of experiments/results/privacy_mnist.md:
``--config.client.activity=0.1 --config.dp.noise_multiplier=0.723``).
"""

from fedjax_dd.experiments import registry
from fedjax_dd.experiments.configs import fedavg as fedavg_config

PRESETS = {"smoke": "smoke", "mnist_noniid": "mnist_fedd3",
           "cifar10_noniid": "cifar10_fedd3"}


def get_config(arg: str = "mnist_noniid"):
  if arg not in PRESETS:
    raise ValueError(f"Unknown preset {arg!r}; expected one of "
                     f"{sorted(PRESETS)}.")
  c = fedavg_config.federated_preset("dp_fedavg", PRESETS[arg])
  return registry.add_group(c, "dp_fedavg")
