r"""FedD3: one-shot FL by decentralized dataset distillation (Song et al.).

Commands (CPU, 2 cores; figures measured are in the project notes):

  fedjax-dd --config=experiments/configs/fedd3.py:mnist_noniid_kip --workdir=/tmp/d3
    MNIST, 500 clients, C_k = 2 (FedD3 style), 1 image per class per client,
    KIP with the 4-layer FC NTK, LeNet-5 server model. Paper Tab. 2: 94.74 %.
    This preset uses the paper's early-stop rule as written (stop once the
    target batch of 10 reaches accuracy 0.999, ``min_iterations = 0``, as in
    the authors' code, which has no minimum). With the former
    ``min_iterations = 100`` the server reached 92.2 %; 1000 forced iterations
    gave 77.3 %: every KIP step (Adam, lr 0.004 in normalised space) moves
    each pixel, background included, by about 0.3 grey levels, and LeNet-5
    generalises worse from the noisier images (the FC-NTK KRR test accuracy of
    the union also falls, 90.3 % -> 87.8 %, since a 2-class client's KIP fits
    only its own two classes). With 2-class clients the rule fires after a few
    to a few tens of iterations, so the upload stays close to real local
    samples (as in the paper); the privacy guard (App. G) still applies.
    Measured (seed 0): 0.9448 final / 0.9452 best, GCE(0.01) 0.0431,
    GCE(0.5) 0.1781, 785,000 bytes, 50 s wall.
  fedjax-dd --config=experiments/configs/fedd3.py:mnist_iid_kip --workdir=/tmp/d3i
    Same, IID clients (10 classes each). Paper: 94.37 %. Measured: 0.9599 /
    0.9607, 3,925,000 bytes.
  fedjax-dd --config=experiments/configs/fedd3.py:mnist_noniid_gmm --workdir=/tmp/d3g
    GMM coreset instead of KIP. Paper: 77.29 %. Measured: 0.7563 / 0.7565.
  fedjax-dd --config=experiments/configs/fedd3.py:cifar10_noniid_kip --workdir=/tmp/d3c
    CIFAR-10, 500 clients, C_k = 2, AlexNet server model. Measured with
    --config.max_wall_seconds=600 (32 of 200 epochs, still rising): 0.4108;
    the FC-NTK KRR on the same 1,000 images 0.382. About 15 s per epoch
    with other jobs on the machine.
  fedjax-dd --config=experiments/configs/fedd3.py:mnist_noniid_hybrid --workdir=/tmp/d3h
    Multi-shot hybrid (App. F): FedAvg on local + all distilled data.
  ...fedd3.py:smoke  digits, 10 clients, a few KIP iterations.

Server training: SGD (momentum 0.9, batch 50) is the paper's setting and the
default; ``--config.optimizer=adamw --config.weight_decay=...`` is exposed.
``rounds`` counts server epochs over the distilled union (one-shot) or FedAvg
rounds (hybrid). ``summary.json`` adds ``gce`` for ``gce_gammas``,
``distilled_images_total`` and ``bytes_total`` (the single upload).
``--config.distilled_from=/tmp/d3/distilled.npz`` reuses a distillation.
"""

from fedjax_dd.experiments.configs import base as base_lib


def get_config(arg: str = "mnist_noniid_kip"):
  c = base_lib.base(method="fedd3", dataset=base_lib.MNIST, model="lenet5",
                    runner="fedd3")
  c.num_clients = 500
  c.partition = base_lib.pathological(2, style="fedd3")
  c.distiller = "kip"
  c.kernel = "fc"
  c.kernel_depth = 4
  c.kernel_kind = "ntk"
  c.kernel_batch = 0
  c.images_per_class = 1
  c.kip_lr = 0.004
  c.kip_max_iterations = 3000
  c.kip_target_batch = 10
  c.kip_reg = 1e-6
  c.learn_labels = False
  c.centered_labels = False
  c.stop_accuracy = 0.999
  c.min_iterations = 100
  c.allow_raw_upload = False
  # Path of another run's distilled.npz: train on it instead of distilling
  # (server-side variants; refused if its distillation settings differ).
  c.distilled_from = ""
  # Server training on the union (paper: SGD, momentum 0.9, batch 50).
  c.optimizer = "sgd"
  c.lr = 0.01
  c.momentum = 0.9
  c.batch_size = 50
  c.rounds = 200
  c.eval_every = 10
  c.checkpoint_every = 50
  c.gce_gammas = (0.01, 0.5)
  presets = {
      # Paper's stop rule with no minimum (see the module docstring).
      "mnist_noniid_kip": {"min_iterations": 0},
      "mnist_iid_kip": {"partition": base_lib.ml_collections.ConfigDict({"name": "iid"})},
      "mnist_noniid_gmm": {"distiller": "gmm"},
      "mnist_noniid_hybrid": {"method": "fedd3_hybrid", "rounds": 10,
                              "batch_size": 32, "local_epochs": 1.0,
                              "momentum": 0.0, "eval_every": 1,
                              "checkpoint_every": 1},
      "cifar10_noniid_kip": {"dataset": base_lib.CIFAR10, "model": "alexnet",
                             "gce_gammas": (0.1, 2.0)},
      "smoke": {"dataset": "digits", "model": "digits_cnn", "num_clients": 10,
                "kip_max_iterations": 20, "min_iterations": 0, "rounds": 3,
                "eval_every": 1, "checkpoint_every": 1,
                "images_per_class": 2},
  }
  if arg not in presets:
    raise ValueError(f"Unknown preset {arg!r}; expected one of {sorted(presets)}.")
  for k, v in presets[arg].items():
    c[k] = v
  return c
