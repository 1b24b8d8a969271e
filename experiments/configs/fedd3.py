r"""FedD3: one-shot FL by decentralized dataset distillation (Song et al.).

Commands (CPU, 2 cores; figures measured are in the project notes):

  fedjax-dd --config=experiments/configs/fedd3.py:mnist_noniid_kip --workdir=/tmp/d3
    MNIST, 500 clients, C_k = 2 (FedD3 style), 1 image per class per client,
    KIP with the 4-layer FC NTK, LeNet-5 server model. Paper Tab. 2: 94.74 %.
    Every KIP preset uses the paper's early-stop rule as written (App. C:
    stop once the target batch reaches accuracy 0.999, at most 3000
    iterations; ``kip.min_iterations = 0``, as in the authors' code, which
    has no minimum). With a former minimum of 100 iterations the server
    reached 92.2 %; 1000 forced iterations gave 77.3 %: every KIP step (Adam, lr
    0.004 in normalised space) moves each pixel, background included, by
    about 0.3 grey levels, and LeNet-5 generalises worse from the noisier
    images (the FC-NTK KRR test accuracy of the union also falls, 90.3 % ->
    87.8 %, since a 2-class client's KIP fits only its own two classes).
    With 2-class clients the rule fires after a few to a few tens of
    iterations, so the upload stays close to real local samples (as in the
    paper; ``summary.json["privacy"]`` measures how close). The privacy
    guard (App. G) refuses any upload byte-identical to a raw image, so
    these early-stop presets set ``fedd3.allow_raw_upload=True`` to send
    what the paper sends; with ``--config.fedd3.allow_raw_upload=False``
    the run stops after KIP naming how many uploads are raw. Measured (seed 0, CPU): 0.9417 final / 0.9418
    best; GCE(0.01) 0.0712, GCE(0.5) 0.2864 (paper: 7.17 %, 30.43 %), cohort
    GCE 0.0429 / 0.1727; 785,000 bytes; KIP iterations median 6 (1-320,
    all stopped early), loss first/last median 0.253 / 0.225; privacy: 168
    of 1,000 uploaded images byte-identical to a raw image of their sender,
    median nearest-raw L2 0.18 (two different digits: 5-10); 52 s wall.
    These figures used neural-tangents' kernel; with the native kernel (the
    default ``kip.kernel_impl``) the same run gives 0.9437 final and best,
    union KRR test accuracy 0.9025 (0.903), the same 168 raw images and KIP
    losses equal to 4 digits (neural-tangents again: 0.9419 / 0.9421 on the
    current code; the 3-seed sd is 0.0016).
  ...fedd3.py:mnist_noniid_kip_full
    The same with no early stop: every client runs all 3000 iterations
    (``kip.stop_accuracy = None``), what "distilled" means without the rule.
  ...fedd3.py:mnist_noniid_random / mnist_iid_random / cifar10_noniid_random
    The control: random real images, the same number per class per client
    as KIP sends (1), same server training. Measured (mnist_noniid_random,
    seed 0): 0.9392 final / 0.9395 best, GCE(0.01) 0.0709, GCE(0.5)
    0.2797, all 1,000 images raw, 39 s wall: KIP as the paper runs it is
    0.25 points above sending real images.
  ...fedd3.py:mnist_noniid_kip_labels
    KIP also learns the support labels (not the paper's Tab. 2 setting,
    which sends hard labels; FedD3's code never learns them) and keeps the
    support in the pixel range (``kip.clip_pixels``), so the uint8 upload
    is what KIP fitted; the server trains on the soft labels as sent
    (10 float32 entries per image in the ledger). Measured (3 seeds,
    experiments/results/fedd3_mnist_noniid_kip_labels_3seeds.md):
    0.9163 ± 0.0093 final, 0.9373 ± 0.0041 best, against 0.9404 ± 0.0016
    / 0.9411 ± 0.0014 for mnist_noniid_kip re-measured beside it; the
    union's KRR test accuracy is equal (0.9005 against 0.9000).
  fedjax-dd --config=experiments/configs/fedd3.py:mnist_iid_kip --workdir=/tmp/d3i
    Same, IID clients (10 classes each). Paper: 94.37 %. Measured with the
    former minimum of 100 iterations: 0.9599 / 0.9607, 3,925,000 bytes.
  fedjax-dd --config=experiments/configs/fedd3.py:mnist_noniid_gmm --workdir=/tmp/d3g
    GMM coreset instead of KIP. Paper: 77.29 %. Measured: 0.7563 / 0.7565.
  fedjax-dd --config=experiments/configs/fedd3.py:cifar10_noniid_kip --workdir=/tmp/d3c
    CIFAR-10, 500 clients, C_k = 2, the paper's AlexNet: the two-conv
    ``alexcifarnet`` (1,756,426 parameters), the size whose
    ``log2(|w|·32 + 1)`` reproduces Tab. 2's baseline GCE cells (the
    five-conv ``alexnet``, 3.9 M, does not). Paper: 38.27 %. Measured with
    the former ``alexnet`` and ``kip.min_iterations = 100`` under
    --config.run.max_wall_seconds=600 (32 of 200 epochs, still rising): 0.4108.
  fedjax-dd --config=experiments/configs/fedd3.py:mnist_noniid_hybrid --workdir=/tmp/d3h
    Multi-shot hybrid (App. F): FedAvg on local + all distilled data, batch
    50, lr 0.025 (Fig. E.2's rate for C_k in {10, 2}), E_k = 1.
  ...fedd3.py:smoke  digits, 10 clients, 2 images per class, a fixed budget
    of 20 KIP iterations (``kip.stop_accuracy = None``). With the paper's stop
    rule every client stopped after 1-5 iterations and 24 of the 40 uploaded
    images were byte-identical to raw ones, which the privacy guard (it
    refuses supports holding a whole class, before compute) cannot see;
    with the fixed budget none is (nearest raw L2 median 0.17).

Measured over 3 seeds (seed = data.seed = 0, 1, 2; mean ± sd; 2-core CPU;
``fedjax-dd --config=experiments/configs/fedd3.py:<preset> --workdir=DIR
--seeds=0,1,2``; the full-budget row is seed 0 only):

  preset               final acc        GCE 0.01  GCE 0.5   identical  L2 med  wall
  mnist_noniid_kip     0.9405 ± 0.0016  0.0710    0.2832    0.167      0.18     47 s
  mnist_noniid_kip_labels 0.9163 ± 0.0093 0.0686  0.2322    0.167      0.18     85 s
  mnist_noniid_random  0.9418 ± 0.0026  0.0712    0.2869    1.0        0        32 s
  mnist_noniid_gmm     0.7799 ± 0.0229  0.0582    0.1225    0          5.05     52 s
  mnist_noniid_kip_full 0.7596 (seed 0) 0.0566    0.1138    0          4.99    112 s
  mnist_iid_kip        0.9640 ± 0.0036  0.0625    0.3198    0.0007     1.17    166 s
  mnist_iid_random     0.9762 ± 0.0009  0.0636    0.3975    1.0        0       104 s

Baselines on the same non-IID split (GCE from one client's model upload per
round): os_fedavg.py:mnist_noniid 0.3332 ± 0.0267 (3 seeds), GCE 0.0164 /
0.0200; fedavg.py:mnist_fedd3 (seed 0, 18 rounds) 0.8211 final / 0.8971
best, GCE 0.0023 / 0.0053 (paper cell: 0.20 % at γ = 0.01), 3.11 GB, 736 s;
fedprox.py:mnist_fedd3 (seed 0) 0.8932, GCE 0.0025 / 0.0074, 878 s.

(Paper Tab. 2: non-IID KIP 94.74 %, 0.01-GCE 7.17 %, 0.5-GCE 30.43 %; GMM
77.29 %.) KIP with the paper's stop rule is not distinguishable from sending
one random real image per class (non-IID), and is 1.2 points below it on IID
clients, where the rule fires later and the images drift further; run to its
full budget, KIP loses 18 points. So Tab. 2's FedD3 accuracy is reproduced,
but on this protocol it measures a near-raw sample (17 % of the uploads are
byte-identical to a raw image), not distillation.

Server training follows App. C: SGD, momentum 0.9, batch 50. The paper
gives the learning rate only as "from {0.001, 0.025}", the same for FedD3
and the baselines, without saying which one Tab. 2 used per dataset; the
presets keep lr 0.01 (and the baselines' FedD3-protocol presets use the same
rate, as the paper does). The number of server epochs is not stated either
(``rounds = 200``).

Departures from the paper: KIP's target batch is a fixed 10 (the paper:
10 % of the local set, about 12 for these 120-example clients), since the
batched KIP program needs one static batch size; the ledger also charges one
byte per hard label (the paper counts the images only: 12,544 bits instead of
our 12,560 per non-IID MNIST client, a 0.01 % change of ``log2 V``).

``rounds`` counts server epochs over the distilled union (one-shot) or FedAvg
rounds (hybrid). ``summary.json`` adds ``gce`` (FedD3's Tab. 2 GCE: one
client's upload per round), ``gce_best``, ``gce_cohort`` (the cohort's total
traffic per round) for ``server.gce_gammas``, ``privacy``, ``kip_loss``,
``kip_iterations``, ``distilled_images_total`` and ``bytes_total`` (the single
upload). The distilled set is cached in ``WORKDIR/stages/distilled`` (a
resumed run does not distill again); ``--config.fedd3.distilled_from=/tmp/d3``
trains on the distilled set of the run in ``/tmp/d3``.
"""

from fedjax_dd.experiments.configs import base as base_lib

_IID = {"name": "iid"}


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
  # App. C's early stop leaves some uploads byte-identical to raw images
  # (mnist_noniid_kip: 168 of 1,000), which the privacy guard refuses; the
  # paper sends them, so its presets accept them (summary.json["privacy"]
  # reports how many). Presets that run KIP to a fixed budget keep the guard.
  c.fedd3.allow_raw_upload = True
  # Server training on the union (paper App. C: SGD, momentum 0.9, batch 50;
  # lr not stated per dataset, see the module docstring).
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
  if arg not in presets:
    raise ValueError(f"Unknown preset {arg!r}; expected one of {sorted(presets)}.")
  for path, value in presets[arg].items():
    base_lib.set_path(c, path, value)
  return c
