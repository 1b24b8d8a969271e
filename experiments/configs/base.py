"""Defaults shared by every experiment config (not a runnable config).

Every group is built here once, with all its keys and defaults, so that a
misspelled ``--config.<group>.<key>`` override fails instead of adding a key
nobody reads. Groups: top level (``runner``, ``method``, ``seed``: the model
seed, ``rounds``, ``paper_departures``); ``data`` (dataset, split,
partition; ``data.seed`` is the partition seed, independent of ``seed``);
``model`` (server and client architectures, convolution form); ``client``
(local training, also the centralized runner's and FedD3's server
training; sampling; FedProx's ``mu``; HFLDD's pre-training); ``engine``;
``server``; ``run`` (evaluation, checkpoints, logging, time budget);
``eval`` (personalized evaluation); ``audit`` (``docs/privacy.md``); and
method groups added by their configs: :func:`kip`, :func:`dfkd`,
:func:`fedd3`, :func:`hfldd`, ``dp`` (DP-FedAvg).
"""

from __future__ import annotations

import dataclasses

import ml_collections
from ml_collections import config_dict

MNIST = "npz:../shared/datasets/mnist.npz"
FASHION_MNIST = "npz:../shared/datasets/fashion_mnist.npz"
CIFAR10 = "npz:../shared/datasets/cifar10.npz"
TINY_IMAGENET_AUX = "npz:../shared/datasets/tiny_imagenet_val1000_32px.npz"


def base(*, method: str, dataset: str, model: str, runner: str = "federated"
         ) -> ml_collections.ConfigDict:
  """The common groups; every config overrides what it needs (on the
  command line ``--config.<key>=...`` or ``--config.<group>.<key>=...``).
  """
  c = ml_collections.ConfigDict()
  c.runner = runner
  c.method = method
  c.seed = 0  # model init and training; data.seed drives the partition.
  c.rounds = 1
  # Where this preset departs from its paper's protocol, one sentence each;
  # copied into summary.json["paper_departures"].
  c.paper_departures = ()
  c.data = ml_collections.ConfigDict({
      "dataset": dataset,
      "data_dir": "",
      # Classes of the dataset; every label must lie in [0, num_classes).
      # 0: inferred (npz: max label + 1, logged; named datasets know theirs).
      "num_classes": 0,
      # The model's input shape; set to resize the images to another.
      "input_shape": (),
      # bilinear | pad (fedjax_dd.data.resize_images)
      "resize_method": "bilinear",
      # > 0: pool train + test, re-split with this train fraction (HFLDD:
      # 0.8; sources.resplit, seeded by data.seed). 0: the dataset's split.
      "resplit": 0.0,
      "partition": ml_collections.ConfigDict({"name": "iid"}),
      "num_clients": 1,
      "seed": 0,  # the partition (and re-split, auxiliary and public draws)
      # HFLDD's unlabelled D_g: a source and how many images to draw.
      "aux_dataset": "",
      "aux_size": 0,
      # FedDF's unlabelled public set: public_size images drawn with data.seed.
      "public_data": "",
      "public_size": 1000,
  })
  c.model = ml_collections.ConfigDict({
      "name": model,
      # Comma-separated client architectures; "": every client uses `name`.
      "client_models": "",
      # Convolutions: "lax" (lax.conv_general_dilated), "patches" (patch
      # extraction + matmul) or "auto" (the faster for the platform,
      # models.layers.resolve_conv_impl). Results equal to float rounding.
      "conv_impl": "auto",
      # Dtype of convolutions and matmuls: "float32", "bfloat16" or "auto"
      # (float32 on CPU, bfloat16 on GPU/TPU; policy.resolve_compute_dtype).
      # Parameters, optimizer state, BatchNorm stats, losses stay float32.
      "compute_dtype": "auto",
      # Initialisation: "" Flax's (LeCun-normal kernels, zero biases),
      # "torch" PyTorch's (uniform +-1/sqrt(fan_in)), as a PyTorch reference
      # starts (fedjax_dd.models.param_init).
      "init": "",
      # Width of MOON's projection head (a "<name>_proj" model only):
      # 0 the model's default, 256 (MOON's --out_dim).
      "proj_dim": 0,
  })
  c.client = ml_collections.ConfigDict({
      "batch_size": 64,
      "local_epochs": 1.0,
      "local_steps": 0,  # > 0 overrides local_epochs with a fixed step count.
      "optimizer": "sgd",  # sgd | adam | adamw
      "lr": 0.01,
      "momentum": 0.0,
      # sgd/adam: L2 term added to the clipped gradient (PyTorch's SGD
      # weight_decay); adamw: decoupled. 0: off.
      "weight_decay": 0.0,
      # > 0: clip each local gradient to this global norm (FedFTG/DisUE: 10).
      "grad_clip": 0.0,
      # Client learning rate of round t (1-based): lr * lr_decay**(t - 1)
      # (FedFTG/DisUE: 0.998). 1.0: constant. FedAvg family and SCAFFOLD.
      "lr_decay": 1.0,
      # Batch augmentation: "" | "flip_crop" (random flip, zero-pad-4 random
      # crop; wrong for digits). FedAvg family and SCAFFOLD.
      "augment": "",
      "clients_per_round": 0,  # > 0: sampled clients per round (seeded) ...
      "client_fraction": 1.0,  # ... else this fraction of all clients.
      # > 0: instead, each client joins a round with this probability
      # (FedDyn's/FedFTG's act_prob; an empty draw is redrawn; core.cohorts).
      "activity": 0.0,
      "mu": 0.0,  # FedProx's proximal weight.
      # One-shot runner (FedHydra, DENSE, FedDF, Co-Boosting, OT, one-shot
      # FedAvg): every client starts from its own initialisation instead of
      # the shared global model (one_shot.independent_starts); rounds = 1.
      "independent_init": False,
      # HFLDD's label-knowledge pre-training (stage 1): pretrain_steps steps
      # of pretrain_batch_size; pretrain_epochs > 0 overrides the steps.
      "pretrain_batch_size": 64,
      "pretrain_epochs": 0.0,
      "pretrain_steps": 0,
  })
  c.engine = ml_collections.ConfigDict({
      "backend": "auto",  # vmap | chunked | sharded | loop | auto
      # Clients per vectorised chunk (per device); 0: measured default.
      "chunk_size": 0,
      "multihost": False,
      # XLA:CPU's classic runtime for the engine's per-client programs; unset:
      # on unless a model is in common.CLASSIC_RUNTIME_UNSAFE.
      "classic_cpu_runtime": config_dict.placeholder(bool),
      # With --seeds (runner federated): the seeds as one program on a
      # vmapped run axis (core.run_axis), not one process per seed.
      "run_axis": False,
      # With run_axis: runs vectorised together per round, in chunks run in
      # sequence, to bound memory; 0: the platform's policy (CPU: 1, each
      # run's clients mapped as a run alone; GPU, TPU: all runs in one vmap).
      "run_chunk_size": 0,
  })
  c.server = ml_collections.ConfigDict({
      "lr": 1.0,  # SCAFFOLD's server learning rate.
      "initial_model_as_seed": True,
      # Workdir of an earlier run with the same client protocol (checked)
      # whose round-1 client models the one-shot runner reuses.
      "teachers_from": "",
      # >= 0: the one-shot server stage's key comes from this seed instead of
      # `seed`; with teachers_from it repeats stratification and distillation
      # over the same clients (not part of the client protocol).
      "seed": -1,
      # FedD3's GCE (Tab. 2) in summary.json for these gammas; (): none.
      "gce_gammas": (),
  })
  c.run = ml_collections.ConfigDict({
      "eval_every": 1,
      "checkpoint_every": 1,
      "keep_checkpoints": 2,
      "progress": True,
      "tensorboard": False,  # also write TensorBoard scalars to DIR/tensorboard
      # Also log each class's test accuracy (test_class_accuracy, and
      # test_class_accuracy_before_iga with iga.evaluate_before).
      "class_accuracy": False,
      # > 0: stop after the first round that ends this many seconds after the
      # run's start ("as many rounds as fit"); the summary then says
      # stopped_by_time_budget. Resuming continues towards ``rounds``.
      "max_wall_seconds": 0.0,
      # Stop (exit non-zero, last good checkpoint kept) at the first round or
      # server epoch whose loss is NaN or infinite; False writes it and goes on.
      "stop_on_nonfinite": True,
      # > 0: the one-shot runner's clients train in checkpointed spans of
      # this many local steps (DIR/r1/client_spans), so a stopped run resumes
      # inside local training; same models as one call. 0: one call.
      "client_span_steps": 0,
  })
  # Personalized evaluation (core.personal; runner "federated"): each client
  # is also scored with the model it would deploy (its cluster's for IFCA,
  # CFL, CFL-GP, PACFL; else the global one) on test data drawn like its own:
  # personal_accuracy (example-weighted) and its _sd, _min, _max.
  c.eval = ml_collections.ConfigDict({
      "personal": False,
      # "test": the test split dealt out in the clients' label proportions
      # (partition.personal_test_split); "client": test_fraction of each
      # client's own examples per class, trained on the rest
      # (partition.stratified_split). Both drawn from data.seed.
      "split": "test",
      "test_fraction": 0.2,
      # > 0: each client first makes this many local steps (client.*) on its
      # data, the "fine-tuned" score of FL-bench and pfl-research.
      "finetune_steps": 0,
      "batch_size": 500,  # test examples per evaluated batch of a client
  })
  # Privacy audits of what the server kept (audit.workdir, docs/privacy.md),
  # run after a run with enabled, or on a finished one by `python -m
  # fedjax_dd.experiments.audit --workdir=DIR`; writes DIR/audit.json and
  # summary.json["audit"]. Not part of the run's identity.
  c.audit = ml_collections.ConfigDict({
      "enabled": False,
      # The attacker's population data: this many test examples (data.seed's
      # audit stream; 0: all), not training ones, which would change the run.
      "holdout": 0,
      # dB at or above which a client image counts as reconstructed.
      "psnr_threshold": 30.0,
      # The false-positive rates of the reported TPRs (Carlini et al. 2022).
      "fprs": (0.01, 0.001),
      # A rounds run also audits each client's upload: FedAvg's local training
      # from the final global model (one-round run: the initial one).
      "client_uploads": True,
      # > 0: offline LiRA with this many OUT shadows (>= 2) trained on test
      # examples outside the holdout, beside the loss threshold (model
      # uploads and the global model).
      "lira_shadows": 0,
      # Test examples of the shadow pool; 0: all outside the holdout.
      "lira_pool": 0,
  })
  return c


def set_path(c: ml_collections.ConfigDict, path: str, value) -> None:
  """Sets the existing key ``path`` (dotted, e.g. ``"kip.lr"``) of ``c``.

  Raises:
    KeyError: ``path`` names no key of ``c`` (a misspelled preset field).
  """
  *parents, leaf = path.split(".")
  for p in parents:
    c = c[p]
  if leaf not in c:
    raise KeyError(f"{path!r} is not a key of the config.")
  c[leaf] = value


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


def dirichlet_client(alpha: float, client_size: int = 0
                     ) -> ml_collections.ConfigDict:
  """``fedjax_dd.data.partition.dirichlet_client``: FedFTG's / DisUE's split
  (a ``Dir(alpha)`` class prior per client, equal client sizes;
  ``client_size`` 0: ``N // data.num_clients``)."""
  return ml_collections.ConfigDict({"name": "dirichlet_client",
                                    "alpha": alpha,
                                    "client_size": client_size})


# The fields of ``fedjax_dd.distill.kip.KipOptions``, the keys :func:`kip`
# derives from it (named here for the fingerprint rules, without importing
# the library; tests/experiments/test_config_sections.py compares them).
KIP_OPTION_KEYS = ("lr", "max_iterations", "target_batch_size", "reg",
                   "learn_labels", "centered_labels", "balanced_targets",
                   "clip_pixels", "client_normalization", "stop_accuracy",
                   "min_iterations", "segment_iterations", "dp_clip",
                   "dp_noise_multiplier")
# kip.kernel_impl's default: the native kernels (fedjax_dd.kernels.native),
# equal to neural-tangents' to rounding and needing no extra package.
DEFAULT_KERNEL_IMPL = "native"


def kip(c: ml_collections.ConfigDict, *, max_iterations: int,
        stop_accuracy: float | None, kernel_depth: int = 0,
        segment_iterations: int = 100) -> ml_collections.ConfigDict:
  """Adds the ``kip`` group (one name per setting, shared by FedD3 and HFLDD).

  ``kip.<name>`` for every field of ``fedjax_dd.distill.kip.KipOptions``
  (FedD3 App. C / HFLDD Sec. V-A: Adam lr 0.004, target batches of 10,
  ``lambda = 1e-6``, fixed labels) and the kernel: ``kernel`` (fc | conv),
  ``kernel_depth`` (0: the default, FC 4 / conv 3), ``kernel_kind`` (ntk |
  nngp), ``kernel_batch`` (> 0: KRR evaluation in blocks of that many
  images), ``kernel_impl`` (:data:`DEFAULT_KERNEL_IMPL`). ``stop_accuracy``
  None runs a fixed budget of ``max_iterations``. ``dp_clip`` > 0 runs
  DP-KIP (per-example clipping to that norm, Gaussian noise of
  ``dp_noise_multiplier`` times it), whose epsilon at ``dp_delta``
  ``summary.json`` reports.
  """
  from fedjax_dd.distill.kip import KipOptions  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments import registry  # pylint: disable=g-import-not-at-top
  options = registry.hparams_group(KipOptions).to_dict()
  options.update({
      "max_iterations": max_iterations,
      "segment_iterations": segment_iterations,
      # None (a typed placeholder, so --config.kip.stop_accuracy=X parses):
      # no early stop.
      "stop_accuracy": (config_dict.placeholder(float) if stop_accuracy is None
                        else stop_accuracy),
  })
  c.kip = ml_collections.ConfigDict({
      "kernel": "fc",
      "kernel_depth": kernel_depth,
      "kernel_kind": "ntk",
      "kernel_batch": 0,
      "kernel_impl": DEFAULT_KERNEL_IMPL,
      **options,
      "dp_delta": 1e-5,  # DP-KIP: the delta of the reported epsilon
  })
  return c


def fedd3(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds the ``fedd3`` group (what each FedD3 client uploads): one key per
  field of :class:`fedjax_dd.experiments.run_fedd3.FedD3Options`."""
  from fedjax_dd.experiments import registry  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments.run_fedd3 import FedD3Options  # pylint: disable=g-import-not-at-top
  c.fedd3 = registry.hparams_group(FedD3Options)
  return c


def _hfldd_classes():
  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments.run_fedseq import FedSeqOptions
  from fedjax_dd.experiments.run_hfldd import HFLDDOptions
  return HFLDDOptions, FedSeqOptions


def hfldd_only_keys() -> tuple[tuple[str, ...], tuple[str, ...]]:
  """The ``hfldd`` keys only HFLDD reads (stage 5, the members' uploads) and
  those only FedSeq reads (its grouping)."""
  hfldd_fields, fedseq_fields = (
      [f.name for f in dataclasses.fields(cls)] for cls in _hfldd_classes())
  return (tuple(k for k in hfldd_fields if k not in fedseq_fields),
          tuple(k for k in fedseq_fields if k not in hfldd_fields))


def hfldd(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds the ``hfldd`` group: the fields of
  :class:`~fedjax_dd.experiments.run_hfldd.HFLDDOptions` and of
  :class:`~fedjax_dd.experiments.run_fedseq.FedSeqOptions` (its baseline).

  A config keeps the keys its runner reads: HFLDD's presets drop FedSeq's
  own keys, FedSeq's HFLDD's (and ``kip``); :func:`hfldd_only_keys`.
  """
  from fedjax_dd.experiments import registry  # pylint: disable=g-import-not-at-top
  hfldd_cls, fedseq_cls = _hfldd_classes()
  c.hfldd = registry.hparams_group(hfldd_cls)
  c.hfldd.update(registry.hparams_group(fedseq_cls))
  return c


def dfkd(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds the ``dfkd`` group: the one-shot server stage (FedHydra's CPU scale).

  One key per field of :class:`fedjax_dd.distill.dfkd.DFKDHyperParams`
  (``batch_size`` is ``synthetic_batch_size``; ``pool_size`` 0 keeps every
  epoch's batch), and the generator, the student, FedHydra's
  stratification and aggregation, and FedDF's public-set distillation.
  """
  from fedjax_dd.distill.dfkd import DFKDHyperParams  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments import registry  # pylint: disable=g-import-not-at-top
  # 40 student steps per epoch: one pass over the pool (0, the reference's)
  # leaves the student at chance in 40 epochs (see
  # experiments/results/fedhydra_cpu_presets.md).
  c.dfkd = registry.hparams_group(DFKDHyperParams, exclude=("batch_size",),
                                  student_steps=40, pool_size=0)
  c.dfkd.update({
      "nz": 100,
      "ngf": 32,
      "synthetic_batch_size": 64,
      "distill_epochs": 40,  # T_g.
      # The generator's Adam (the authors' code).
      "generator_lr": 1e-3,
      "generator_b1": 0.5,
      "stratify_steps": 30,  # T_G of Alg. 2.
      "stratify_batch_size": 16,
      # sa | ae | sa_predicted (Eq. 10's rows by the plain average's
      # prediction instead of the target label; stratify.py says why).
      "aggregation": "sa",
      # Multiply U_c by c so that SA with uninformative U equals AE instead
      # of AE / c (stratify.sa_context); False: Eqs. 6-11 literally.
      "sa_average_scale": True,
      # Paper: student SGD lr 0.01 (momentum unstated); 0.9 is the reference
      # code's KD optimiser (fedhydra.py's docstring).
      "student_lr": 0.01,
      "student_momentum": 0.9,
      "feddf_lr": 1e-3,  # FedDF's student (Adam).
      "feddf_steps": 10,  # FedDF student steps per epoch on the public set.
  })
  return c


def coboosting(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds the ``coboosting`` group: one key per field of
  :class:`fedjax_dd.algorithms.coboosting.CoBoostingHyperParams` (defaults
  from the authors' code) but the batch, step counts, pool and epochs, which
  come from the ``dfkd`` group as for DENSE; and the student's optimiser."""
  from fedjax_dd.algorithms.coboosting import CoBoostingHyperParams  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments import registry  # pylint: disable=g-import-not-at-top
  c.coboosting = registry.hparams_group(
      CoBoostingHyperParams, exclude=("batch_size", "generator_steps",
                                      "student_steps", "pool_size",
                                      "num_epochs"))
  c.coboosting.update({
      "student_weight_decay": 1e-4,
      "student_clip": 10.0,
      "cosine": True,  # cosine learning-rate schedule over the epochs
  })
  return c


def iga(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds the ``iga`` group: DisUE's inter-group aggregation / FedFTG's
  server fine-tuning. One key per field of
  :class:`fedjax_dd.distill.iga.IGAHyperParams` with its default (FedFTG's
  code and DisUE Sec. 5.1), and the run's own switches."""
  from fedjax_dd.distill.iga import IGAHyperParams  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments import registry  # pylint: disable=g-import-not-at-top
  c.iga = registry.hparams_group(IGAHyperParams)
  c.iga.update({
      "enabled": True,  # False: the "−IGA" ablation (FedAvg of the groups).
      # True: also evaluate ω_G before IGA (test_accuracy_before_iga).
      "evaluate_before": False,
      # The conditional generator (FedFTG's CGeneratorA).
      "nz": 100,  # 256 for CIFAR-100
      "ngf": 64,
  })
  return c


def disue_protocol(c: ml_collections.ConfigDict, *, dataset: str,
                   model: str, alpha: float) -> ml_collections.ConfigDict:
  """DisUE Sec. 5.1's federated protocol, shared by DisUE and its baselines:
  N = 100 clients, Act = 0.15, FedFTG's Dirichlet (a class prior per client,
  equal client sizes), 5 local epochs of batch 50, SGD lr 0.1·0.998^t, weight
  decay 1e-3, gradient clip 10, random flip and pad-4 crop."""
  c.data.dataset = dataset
  c.model.name = model
  c.data.num_clients = 100
  c.client.clients_per_round = 15
  c.data.partition = dirichlet_client(alpha)
  c.client.local_epochs = 5.0
  c.client.batch_size = 50
  c.client.lr = 0.1
  c.client.lr_decay = 0.998
  c.client.weight_decay = 1e-3
  c.client.grad_clip = 10.0
  c.client.augment = "flip_crop"
  return c


# The fingerprints of a run, and each config key's rule, declared once per
# key (a dotted path; a group stands for all its keys). A fingerprint is
# ``{path: value}`` (``fedjax_dd.experiments.common.fingerprint``):
#
# * ``run``: ``config.json``, checked on every resume: every key except
#   those marked ``-run``, which decide how long and how a run goes (rounds,
#   evaluation, checkpoints, logging, budget, the client backend and the
#   convolution form, which give the same results), where the data sits, or
#   only document it. server.teachers_from and fedd3.distilled_from stay in:
#   their contents change the results;
# * ``hfldd_stages``: HFLDD's cached stages 1-3: every key except those
#   marked ``-hfldd_stages`` (the heads' rounds, the summary, the KIP kernel
#   implementation);
# * ``fedd3_distill``: FedD3's cached upload: only ``+fedd3_distill`` keys
#   (not KIP's segment length nor kip.kernel_impl, which leave it as is);
# * ``client_protocol``: the one-shot runner's round-1 client models
#   (reused by ``server.teachers_from``): ``+client_protocol`` keys, and
#   ``+client_protocol?COND`` ones when :data:`FINGERPRINT_CONDITIONS`
#   ``[COND]`` holds (a homogeneous protocol does not depend on how
#   client_models is spelled, nor an unresized one on the resize method);
# * ``server_setup``: the one-shot runner's checkpointed server setup
#   (FedHydra's stratification): only ``+server_setup`` keys.
_RUN_ONLY = ("-run", "-hfldd_stages")
_UPLOAD = ("+fedd3_distill", "+client_protocol")
_CLIENTS = ("-hfldd_stages", "+client_protocol")
FINGERPRINT_RULES: dict[str, tuple[str, ...]] = {
    "rounds": _RUN_ONLY,
    "run": _RUN_ONLY,
    "engine": _RUN_ONLY,
    "paper_departures": _RUN_ONLY,
    "expected": _RUN_ONLY,  # the quickstart's expected ranges
    # How many of the quickstart's members run at once, and in which order
    # they start: each member computes the same either way.
    "workers": _RUN_ONLY,
    "start_order": _RUN_ONLY,
    "audit": _RUN_ONLY,  # reads a finished run, changes none of it
    "model.conv_impl": _RUN_ONLY,
    # Part of a run (its rows, with eval.split=client the training data);
    # HFLDD's cached stages do not read it; its batch only paces it.
    "eval": ("-hfldd_stages",),
    "eval.batch_size": _RUN_ONLY,
    # Another compute dtype on a resume is named (environment.json), not
    # refused, as another layer form is; HFLDD's cached stages are redone.
    "model.compute_dtype": ("-run",),
    "data.data_dir": ("-run",),
    "seed": _UPLOAD,
    "data.dataset": _UPLOAD,
    "data.num_classes": _UPLOAD,
    "data.resplit": _UPLOAD,
    "data.input_shape": _UPLOAD,
    "data.resize_method": ("+fedd3_distill", "+client_protocol?resized"),
    "data.num_clients": _UPLOAD,
    "data.seed": _UPLOAD,
    "data.partition": _UPLOAD,
    "model.name": _UPLOAD,
    "model.client_models": ("+client_protocol?heterogeneous",),
    "model.init": ("+client_protocol",),
    "model.proj_dim": ("+client_protocol",),
    "client.batch_size": _CLIENTS,
    "client.local_epochs": _CLIENTS,
    "client.local_steps": _CLIENTS,
    "client.optimizer": ("+client_protocol",),
    "client.lr": ("+client_protocol",),
    "client.momentum": ("+client_protocol",),
    "client.weight_decay": ("+client_protocol",),
    "client.grad_clip": ("+client_protocol",),
    "client.independent_init": ("+client_protocol",),
    "client.clients_per_round": ("-hfldd_stages",),
    "client.client_fraction": ("-hfldd_stages",),
    "client.activity": ("-hfldd_stages",),
    "server.initial_model_as_seed": ("-hfldd_stages",),
    "server.gce_gammas": ("-hfldd_stages",),
    "server.seed": ("+server_setup",),
    "hfldd.sent_label_bits": ("-hfldd_stages",),
    "fedd3.distiller": ("+fedd3_distill",),
    "fedd3.images_per_class": ("+fedd3_distill",),
    "fedd3.allow_raw_upload": ("+fedd3_distill",),
    "fedd3.float_upload": ("+fedd3_distill",),
    "kip.kernel": ("+fedd3_distill",),
    "kip.kernel_depth": ("+fedd3_distill",),
    "kip.kernel_kind": ("+fedd3_distill",),
    "kip.kernel_impl": ("-hfldd_stages",),
    # Only the reported epsilon reads it.
    "kip.dp_delta": ("-hfldd_stages",),
    **{f"kip.{k}": ("+fedd3_distill",) for k in KIP_OPTION_KEYS
       if k != "segment_iterations"},
    **{f"dfkd.{k}": ("+server_setup",) for k in (
        "stratify_steps", "stratify_batch_size", "nz", "ngf", "generator_lr",
        "generator_b1")},
    # OT fusion's transports (its setup); the public set only when the
    # transports come from its activations.
    "ot_fusion": ("+server_setup?ot_fusion",),
    "data.public_data": ("+server_setup?ot_activations",),
    "data.public_size": ("+server_setup?ot_activations",),
}

# Conditions of ``+NAME?COND`` rules: config -> whether the key joins.
FINGERPRINT_CONDITIONS = {
    "ot_fusion": lambda c: "ot_fusion" in c,
    "ot_activations": lambda c: ("ot_fusion" in c and
                                 c.ot_fusion.mode == "activations"),
    "resized": lambda c: bool(c.data.input_shape),
    "heterogeneous": lambda c: bool(
        {s.strip() for s in c.model.client_models.split(",") if s.strip()}
        - {c.model.name}),
}

# The fingerprints holding every key not marked out of them; the others
# hold only the keys marked into them.
SUBTRACTIVE_FINGERPRINTS = ("run", "hfldd_stages")


def fingerprint_paths(name: str, c: ml_collections.ConfigDict | None = None
                      ) -> tuple[str, ...]:
  """The declared paths of fingerprint ``name``: those marked out of a
  subtractive one, or those in an additive one (with ``c``: the conditional
  ones whose condition holds on ``c``; without: all)."""
  sign = "-" if name in SUBTRACTIVE_FINGERPRINTS else "+"
  out = []
  for path, rules in FINGERPRINT_RULES.items():
    for rule in rules:
      rule_name, _, cond = rule[1:].partition("?")
      if rule[0] == sign and rule_name == name and (
          not cond or c is None or FINGERPRINT_CONDITIONS[cond](c)):
        out.append(path)
  return tuple(out)
