"""FedD3: one-shot FL by decentralized dataset distillation (Song et al.).

Each client distils its data with KIP (or a GMM coreset, or sends random
real images as the control) and uploads it once; the server trains on the
union (App. C: SGD, momentum 0.9, batch 50, lr 0.01, ``rounds`` = server
epochs). KIP presets use the paper's early-stop rule (App. C: stop at target
accuracy 0.999, at most 3000 iterations) and ``fedd3.allow_raw_upload=True``,
since the rule can leave uploads byte-identical to raw images.

Commands (CPU, 2 cores):

  fedjax-dd --config=experiments/configs/fedd3.py:mnist_noniid_kip --workdir=/tmp/d3
    MNIST, 500 clients, C_k = 2, 1 image per class per client, 4-layer FC
    NTK, LeNet-5 server.
  ...fedd3.py:mnist_noniid_kip_full    no early stop (all 3000 iterations).
  ...fedd3.py:mnist_noniid_kip_labels  KIP also learns soft labels.
  ...fedd3.py:mnist_iid_kip / mnist_noniid_gmm / cifar10_noniid_kip
  ...fedd3.py:mnist_noniid_random / mnist_iid_random / cifar10_noniid_random
    the control: random real images, as many as KIP sends.
  ...fedd3.py:mnist_noniid_hybrid   multi-shot hybrid (App. F).
  ...fedd3.py:smoke   digits, 10 clients, 20 KIP iterations.

FedD3 as its authors run it (``rruisong/FedD3``, the README's non-IID
MNIST command): every setting their code uses that the paper does not
state (:data:`AUTHORS`: centred one-hot labels, class-balanced KIP target
batches, per-client standardisation, float32 uploads, a server trained by
Adam for 500 epochs; results: experiments/results/fedd3_authors_mnist.md):

  fedjax-dd --config=experiments/configs/fedd3.py:mnist_noniid_kip_authors --workdir=/tmp/d3a
  ...fedd3.py:cifar10_noniid_kip_authors   the same switches on CIFAR-10
    (the README gives no CIFAR-10 command; its server code is the one above).
  ...fedd3.py:mnist_noniid_random_authors / cifar10_noniid_random_authors
    the random-image control under the same settings: KIP's own start with
    no KIP iteration (``kip.max_iterations=0``), so it differs from the KIP
    preset by the distillation only.
  ...fedd3.py:smoke_authors   digits, with the same switches on.

``--config.fedd3.distilled_from=DIR`` trains on the distilled set of the run
in DIR (cached in ``WORKDIR/stages/distilled``).

Expected: final test accuracy about 0.94 (mnist_noniid_kip, seeds 0-2,
``--seeds=0,1,2``; experiments/results/fedd3_presets.md).
"""

from fedjax_dd.experiments.configs import base as base_lib

_IID = {"name": "iid"}

# What the authors' code (rruisong/FedD3) runs that the paper does not state.
AUTHORS = {
    # utils/dd_kip.py: one_hot(..., center=True), class_balanced_sample for
    # every target batch.
    "kip.centered_labels": True,
    "kip.balanced_targets": True,
    # utils/dd_kip.py: get_normalization_data(x_train_raw) per client; the
    # support is returned and uploaded as it is (no quantisation).
    "kip.client_normalization": True,
    "fedd3.float_upload": True,
    # fedd3/fedd3_server.py: torch.optim.Adam(lr=self._lr,
    # weight_decay=1e-4); README: -slr 0.001 -sne 500 -sbs 50 (its -smt 0.9
    # is not read by Adam).
    "client.optimizer": "adam",
    "client.lr": 1e-3,
    "client.weight_decay": 1e-4,
    "client.momentum": 0.0,
    "rounds": 500,
}
AUTHORS_DEPARTURES = (
    "The authors' code's settings the paper does not state: centred one-hot "
    "labels, class-balanced KIP target batches, per-client standardisation, "
    "float32 uploads (32 bits per pixel channel; the paper counts 8), server "
    "Adam lr 1e-3 with weight decay 1e-4 for 500 epochs (paper: SGD with "
    "momentum 0.9, lr from {0.001, 0.025}).",
    "KIP target batch is a fixed 10, the authors' README (paper: 10 % of the "
    "local set).",
    "KIP in float32 (the authors' code enables float64).",
    "The ledger charges 8 bits per hard label (the paper counts images "
    "only).")


def get_config(arg: str = "mnist_noniid_kip"):
  c = base_lib.base(method="fedd3", dataset=base_lib.MNIST, model="lenet5",
                    runner="fedd3")
  c.data.num_clients = 500
  c.data.partition = base_lib.pathological(2, style="fedd3")
  base_lib.fedd3(c)  # KIP, 1 image per class per client, no raw upload.
  # KIP (base.kip): 4-layer FC NTK; FedD3's rule (App. C): stop at
  # target-batch accuracy 0.999, no minimum, at most 3000 iterations.
  # kip.stop_accuracy None runs every client for kip.max_iterations.
  base_lib.kip(c, max_iterations=3000, stop_accuracy=0.999, kernel_depth=4)
  # App. C's early stop leaves some uploads byte-identical to raw images,
  # which the privacy guard refuses; the paper sends them, so its presets
  # accept them (summary.json["privacy"] reports how many). Presets that run
  # KIP to a fixed budget keep the guard.
  c.fedd3.allow_raw_upload = True
  # Server training on the union (paper App. C: SGD, momentum 0.9, batch 50;
  # lr only "from {0.001, 0.025}", not per dataset).
  c.client.optimizer = "sgd"
  c.client.lr = 0.01
  c.client.momentum = 0.9
  c.client.batch_size = 50
  c.rounds = 200
  c.run.eval_every = 10
  c.run.checkpoint_every = 50
  c.server.gce_gammas = (0.01, 0.5)  # Tab. 2: MNIST 0.01, 0.5; CIFAR-10 0.1, 2
  c.paper_departures = (
      "KIP target batch is a fixed 10 (paper: 10 % of the local set).",
      "Server lr 0.01 and 200 server epochs (paper: lr from {0.001, 0.025}, "
      "epochs not stated).",
      "The ledger charges 8 bits per hard label (the paper counts images "
      "only).")
  cifar = {"data.dataset": base_lib.CIFAR10, "model.name": "alexcifarnet",
           "server.gce_gammas": (0.1, 2.0)}
  presets = {
      "mnist_noniid_kip": {},
      "mnist_noniid_kip_full": {"kip.stop_accuracy": None,
                                "fedd3.allow_raw_upload": False},
      # Learned labels with the support kept in the pixel range, so the
      # uint8 upload is what KIP fitted (fedjax_dd.distill.kip docstring).
      "mnist_noniid_kip_labels": {"kip.learn_labels": True,
                                  "kip.clip_pixels": True},
      "mnist_iid_kip": {
          "data.partition": base_lib.ml_collections.ConfigDict(_IID)},
      "mnist_noniid_gmm": {"fedd3.distiller": "gmm",
                           "fedd3.allow_raw_upload": False},
      "mnist_noniid_random": {"fedd3.distiller": "random"},
      "mnist_iid_random": {
          "fedd3.distiller": "random",
          "data.partition": base_lib.ml_collections.ConfigDict(_IID)},
      "mnist_noniid_hybrid": {"method": "fedd3_hybrid", "rounds": 10,
                              "client.lr": 0.025, "client.local_epochs": 1.0,
                              "run.eval_every": 1, "run.checkpoint_every": 1},
      "cifar10_noniid_kip": dict(cifar),
      "cifar10_noniid_random": {**cifar, "fedd3.distiller": "random"},
      "smoke": {"data.dataset": "digits", "model.name": "digits_cnn",
                "data.num_clients": 10, "kip.max_iterations": 20,
                "kip.stop_accuracy": None, "fedd3.allow_raw_upload": False,
                "rounds": 3,
                "run.eval_every": 1, "run.checkpoint_every": 1,
                "fedd3.images_per_class": 2},
  }
  authors = {**AUTHORS, "paper_departures": AUTHORS_DEPARTURES}
  presets.update({
      "mnist_noniid_kip_authors": dict(authors),
      "cifar10_noniid_kip_authors": {**cifar, **authors},
      # The control: KIP's initial support, no iteration.
      "mnist_noniid_random_authors": {**authors, "kip.max_iterations": 0},
      "cifar10_noniid_random_authors": {**cifar, **authors,
                                        "kip.max_iterations": 0},
      # The smoke run with the authors' switches; its own size and budget.
      "smoke_authors": {**presets["smoke"], **authors, "rounds": 3},
  })
  if arg not in presets:
    raise ValueError(f"Unknown preset {arg!r}; expected one of {sorted(presets)}.")
  for path, value in presets[arg].items():
    base_lib.set_path(c, path, value)
  return c
