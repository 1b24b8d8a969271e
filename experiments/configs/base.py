"""Defaults shared by every experiment config (not a runnable config)."""

from __future__ import annotations

import ml_collections

MNIST = "npz:../shared/datasets/mnist.npz"
FASHION_MNIST = "npz:../shared/datasets/fashion_mnist.npz"
CIFAR10 = "npz:../shared/datasets/cifar10.npz"
TINY_IMAGENET_AUX = "npz:../shared/datasets/tiny_imagenet_val1000_32px.npz"


def base(*, method: str, dataset: str, model: str, runner: str = "federated"
         ) -> ml_collections.ConfigDict:
  """The common keys; every config overrides what it needs.

  Top-level keys ``rounds``, ``num_clients``, ``seed`` and ``dataset`` are
  overridable as ``--config.<key>=...``. ``seed`` drives model init and
  training; ``data_seed`` drives the partition, independently.
  """
  c = ml_collections.ConfigDict()
  c.runner = runner
  c.method = method
  c.dataset = dataset
  c.data_dir = ""
  c.model = model
  c.input_shape = ()  # the model's input shape; set to resize the images to another
  c.resize_method = "bilinear"  # bilinear | pad (fedjax_dd.data.resize_images)
  c.client_models = ""  # comma-separated client architectures; "": all `model`
  c.seed = 0
  c.data_seed = 0
  c.num_clients = 1
  c.clients_per_round = 0  # > 0: sampled clients per round (seeded) ...
  c.client_fraction = 1.0  # ... else this fraction of all clients.
  c.rounds = 1
  # > 0: stop after the first round that ends this many seconds after the
  # run's start ("as many rounds as fit"); the summary then says
  # stopped_by_time_budget. Resuming continues towards ``rounds``.
  c.max_wall_seconds = 0.0
  c.batch_size = 64
  c.local_epochs = 1.0
  c.local_steps = 0  # > 0 overrides local_epochs with a fixed step count.
  c.optimizer = "sgd"
  c.lr = 0.01
  c.momentum = 0.0
  c.weight_decay = 0.0
  c.partition = ml_collections.ConfigDict({"name": "iid"})
  # > 0: pool train + test and re-split, this fraction to train (HFLDD: 0.8;
  # fedjax_dd.data.sources.resplit, seeded by data_seed). 0: the dataset's split.
  c.resplit = 0.0
  c.backend = "auto"  # vmap | chunked | sharded | loop | auto
  c.chunk_size = 0  # clients per vectorised chunk (per device); 0: measured default
  c.eval_every = 1
  c.checkpoint_every = 1
  c.keep_checkpoints = 2
  c.progress = True
  c.tensorboard = False  # also write TensorBoard scalars to DIR/tensorboard
  c.initial_model_as_seed = True
  c.multihost = False
  # Where this preset departs from its paper's protocol, one sentence each;
  # copied into summary.json["paper_departures"].
  c.paper_departures = ()
  return c


def pathological(num_classes_per_client: int, style: str = "hfldd"
                 ) -> ml_collections.ConfigDict:
  """``fedjax_dd.data.partition.pathological`` with ``C`` classes per client.

  ``style``: ``"balanced"`` (equal clients per class; the HFLDD presets),
  ``"hfldd"`` (random label sets, uneven clients per class; the default
  here, kept for the presets measured with it) or ``"fedd3"``.
  """
  return ml_collections.ConfigDict({
      "name": "pathological",
      "num_classes_per_client": num_classes_per_client,
      "style": style,
  })


def dirichlet(alpha: float, min_size: int = 10) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({"name": "dirichlet", "alpha": alpha,
                                    "min_size": min_size})


# The KIP keys set by :func:`kip`: ``kip_<field>`` of
# ``fedjax_dd.distill.kip.KipOptions`` plus the kernel's.
KIP_OPTION_KEYS = ("kip_lr", "kip_max_iterations", "kip_target_batch_size",
                   "kip_reg", "kip_learn_labels", "kip_centered_labels",
                   "kip_stop_accuracy", "kip_min_iterations",
                   "kip_segment_iterations")
KIP_KERNEL_KEYS = ("kip_kernel", "kip_kernel_depth", "kip_kernel_kind",
                   "kip_kernel_batch")
KIP_KEYS = KIP_OPTION_KEYS + KIP_KERNEL_KEYS


def kip(c: ml_collections.ConfigDict, *, max_iterations: int,
        stop_accuracy: float | None, kernel_depth: int = 0,
        segment_iterations: int = 100) -> ml_collections.ConfigDict:
  """Adds the KIP keys (one name per setting, shared by FedD3 and HFLDD).

  ``kip_<name>`` for every field of ``fedjax_dd.distill.kip.KipOptions``
  (FedD3 App. C / HFLDD Sec. V-A: Adam lr 0.004, target batches of 10,
  ``lambda = 1e-6``, fixed labels) and the kernel: ``kip_kernel`` (fc |
  conv), ``kip_kernel_depth`` (0: the kernel's default, FC 4 / conv 3),
  ``kip_kernel_kind`` (ntk | nngp), ``kip_kernel_batch`` (> 0: blocks of
  that many images when evaluating KRR, FedD3's quantisation check).
  ``kip_stop_accuracy`` None runs a fixed budget of ``kip_max_iterations``.
  """
  c.kip_kernel = "fc"
  c.kip_kernel_depth = kernel_depth
  c.kip_kernel_kind = "ntk"
  c.kip_kernel_batch = 0
  c.kip_lr = 0.004
  c.kip_max_iterations = max_iterations
  c.kip_target_batch_size = 10
  c.kip_reg = 1e-6
  c.kip_learn_labels = False
  c.kip_centered_labels = False
  c.kip_stop_accuracy = stop_accuracy
  c.kip_min_iterations = 0
  c.kip_segment_iterations = segment_iterations
  return c
