r"""FedDF (one-shot): ensemble distillation on an unlabeled public set.

Same presets and client protocol as ``fedhydra.py``. The student starts from the
one-shot FedAvg average and is distilled with Adam (lr 1e-3) towards the
averaged client logits for ``dfkd.distill_epochs`` x ``dfkd.feddf_steps`` steps
of ``dfkd.synthetic_batch_size`` public images. Public sets
(``data.public_data``, first ``data.public_size`` images drawn from
``data.seed``): Fashion-MNIST train images for MNIST, MNIST for Fashion-MNIST,
and the 1000 Tiny-ImageNet images of ``../shared/datasets`` for CIFAR-10 -- an
unlabeled set of the same image shape from another domain, since the clients'
own domain is private.

  fedjax-dd --config=experiments/configs/feddf.py:mnist_a0.5 --workdir=/tmp/df5
    Expected: final test accuracy about 0.94 (seed 0, the clients of
    fedhydra.py:mnist_a0.5 via --config.server.teachers_from;
    experiments/results/fedhydra_cpu_presets.md).

With heterogeneous clients (``*_hetero`` presets, ``model.client_models``) there
is no average to start from: the student starts from a fresh init of
``model.name``.

FedDF has no generator and its own student optimiser (``dfkd.feddf_lr``, Adam),
so the data-free keys of the shared presets (``dfkd.lambda_adv``,
``dfkd.lambda_bn``, ``dfkd.student_lr``, ...) are unused here.
"""

from fedjax_dd.experiments.configs import fedhydra


def get_config(arg: str = "mnist_a0.5"):
  c = fedhydra.preset("feddf", arg)
  c.dfkd.distill_epochs = 20
  return c
