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
