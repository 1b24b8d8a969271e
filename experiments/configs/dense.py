"""DENSE: FedHydra's pipeline with the plain logit average (AE), no stratification.

Same presets, partitions, seeds and client protocol as ``fedhydra.py`` (see
there for the CPU vs ``_gpu`` scales), so under one seed DENSE and FedHydra
distil identical client models. The one other difference: DENSE's own
adversarial weight ``dfkd.lambda_adv`` (λ2) = 0.5 (:data:`LAMBDA_ADV`), not
FedHydra's 1; ``--config.dfkd.lambda_adv=1`` gives FedHydra's weight.
Sources for 0.5: experiments/results/dense_presets.md.

  fedjax-dd --config=experiments/configs/dense.py:mnist_a0.5 --workdir=/tmp/de5
    MNIST, Dirichlet α = 0.5.
  ... --config.server.teachers_from=/tmp/fh5  reuses the clients of a FedHydra
    run of the same protocol (checked) instead of training them again.
  ...dense.py:mnist_a0.5_hetero / smoke / smoke_hetero   as in fedhydra.py.

Expected: final test accuracy about 0.93 (mnist_a0.5 on FedHydra's
clients; experiments/results/fedhydra_cpu_presets.md).
"""

from fedjax_dd.experiments.configs import fedhydra

LAMBDA_ADV = 0.5
"""DENSE's adversarial weight λ2 (sources: experiments/results/dense_presets.md)."""


def get_config(arg: str = "mnist_a0.5"):
  c = fedhydra.preset("dense", arg)
  c.dfkd.lambda_adv = LAMBDA_ADV
  return c
