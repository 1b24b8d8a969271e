"""Defaults shared by every experiment config (not a runnable config).

A config is nested by concern; every group is built here, once, with all its
keys and their defaults, so that a misspelled ``--config.<group>.<key>``
override fails instead of adding a key nobody reads:

* top level: ``runner``, ``method``, ``seed`` (the model seed: init and
  training), ``rounds``, ``paper_departures``;
* ``data``: the dataset, its split and partition (``data.seed`` is the
  partition seed, independent of ``seed``), auxiliary and public sets;
* ``model``: the server / global architecture (``name``), the clients'
  (``model.client_models``) and how convolutions are computed
  (``model.conv_impl``);
* ``client``: local training (also the single model's training in the
  centralized runner and FedD3's server training on the distilled union),
  client sampling, FedProx's ``client.mu`` and HFLDD's pre-training;
* ``engine``: how client programs run (backend, chunks, hosts);
* ``server``: server-side settings shared by several runners;
* ``run``: evaluation, checkpoints, progress, logging and the time budget;
* ``eval``: personalized evaluation (each client's deployed model on test
  data drawn like its own);
* method groups, added by the configs that use them: ``kip`` (:func:`kip`),
  ``dfkd`` (:func:`dfkd`), ``fedd3`` (:func:`fedd3`), ``hfldd``
  (:func:`hfldd`), ``dp`` (:func:`dp`, DP-FedAvg);
* ``audit``: the privacy audits of what the server kept, after a run
  (``docs/privacy.md``).
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

MNIST = "npz:../shared/datasets/mnist.npz"
FASHION_MNIST = "npz:../shared/datasets/fashion_mnist.npz"
CIFAR10 = "npz:../shared/datasets/cifar10.npz"
TINY_IMAGENET_AUX = "npz:../shared/datasets/tiny_imagenet_val1000_32px.npz"


def base(*, method: str, dataset: str, model: str, runner: str = "federated"
         ) -> ml_collections.ConfigDict:
  """The common groups; every config overrides what it needs.

  Overridable as ``--config.<key>=...`` (top level, e.g. ``rounds``,
  ``seed``) or ``--config.<group>.<key>=...`` (e.g. ``data.num_clients``,
  ``data.dataset``, ``client.lr``).
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
      # > 0: pool train + test and re-split, this fraction to train (HFLDD:
      # 0.8; fedjax_dd.data.sources.resplit, seeded by data.seed). 0: the
      # dataset's split.
      "resplit": 0.0,
      "partition": ml_collections.ConfigDict({"name": "iid"}),
      "num_clients": 1,
      "seed": 0,  # the partition (and re-split, auxiliary and public draws)
      # HFLDD's unlabelled D_g: a source and how many images to draw.
      "aux_dataset": "",
      "aux_size": 0,
      # FedDF's unlabelled public set (first public_size images, drawn with
      # data.seed).
      "public_data": "",
      "public_size": 1000,
  })
  c.model = ml_collections.ConfigDict({
      "name": model,
      # Comma-separated client architectures; "": every client uses `name`.
      "client_models": "",
      # How the convolutions of every model are computed: "lax"
      # (lax.conv_general_dilated), "patches" (patch extraction + matmul) or
      # "auto" (the measured-faster one for the platform and jax version,
      # fedjax_dd.models.layers.resolve_conv_impl). Same parameters, results
      # equal to float rounding.
      "conv_impl": "auto",
      # The dtype of every model's convolutions and matmuls: "float32",
      # "bfloat16" or "auto" (the policy's: float32 on CPU, bfloat16 on GPU
      # and TPU; fedjax_dd.policy.resolve_compute_dtype). Parameters,
      # optimizer state, BatchNorm statistics and losses stay float32.
      "compute_dtype": "auto",
      # Parameter initialisation: "" the layers' own (Flax's: LeCun-normal
      # kernels, zero biases), "torch" PyTorch's defaults (uniform
      # +-1/sqrt(fan_in) kernels and biases), as a PyTorch reference starts
      # (fedjax_dd.models.param_init).
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
      # Local batch augmentation: "" (none) | "flip_crop" (random horizontal
      # flip and zero-pad-4 random crop; wrong for digits). FedAvg family
      # and SCAFFOLD.
      "augment": "",
      "clients_per_round": 0,  # > 0: sampled clients per round (seeded) ...
      "client_fraction": 1.0,  # ... else this fraction of all clients.
      # > 0: instead, each client joins a round independently with this
      # probability (FedDyn's and FedFTG's act_prob; an empty draw is drawn
      # again), so the cohort's size varies (fedjax_dd.core.cohorts).
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
      # vmapped run axis (fedjax_dd.core.run_axis) instead of one process
      # per seed.
      "run_axis": False,
      # With run_axis: runs vectorised together per round, in chunks run in
      # sequence, to bound memory; 0: all runs in one vmap.
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
      # Also log each class's test accuracy (metrics.jsonl:
      # test_class_accuracy, and test_class_accuracy_before_iga with
      # iga.evaluate_before).
      "class_accuracy": False,
      # > 0: stop after the first round that ends this many seconds after the
      # run's start ("as many rounds as fit"); the summary then says
      # stopped_by_time_budget. Resuming continues towards ``rounds``.
      "max_wall_seconds": 0.0,
      # Stop (exit non-zero, last good checkpoint kept) at the first round or
      # server epoch whose loss is NaN or infinite; False writes it and goes on.
      "stop_on_nonfinite": True,
      # > 0: the one-shot runner's clients train in spans of this many local
      # steps, each checkpointed (DIR/r1/client_spans), so a run killed or
      # stopped by max_wall_seconds inside a long local training resumes
      # there; the models are those of one call. 0: one call.
      "client_span_steps": 0,
  })
  # Personalized evaluation (fedjax_dd.core.personal; runner "federated"):
  # on the evaluated rounds every client is also scored with the model it
  # would deploy (its cluster's for IFCA, CFL, CFL-GP and PACFL; the global
  # model, DisUE's universal expert, otherwise) on test data drawn like its
  # own; metrics.jsonl adds personal_accuracy (example-weighted over
  # clients) and its spread (_sd, _min, _max over clients).
  c.eval = ml_collections.ConfigDict({
      "personal": False,
      # "test": the test split dealt out to the clients in their training
      # label proportions (partition.personal_test_split; the training data
      # unchanged); "client": test_fraction of each client's own examples,
      # per class (partition.stratified_split; the client trains on the
      # rest). Both drawn from data.seed.
      "split": "test",
      "test_fraction": 0.2,
      # > 0: each client first makes this many local steps (client.batch_size,
      # client.optimizer and lr) on its training data from its model, the
      # "fine-tuned" score of FL-bench and pfl-research.
      "finetune_steps": 0,
      "batch_size": 500,  # test examples per evaluated batch of a client
  })
  # Privacy audits of what the server kept (fedjax_dd.audit.workdir,
  # docs/privacy.md): with enabled, a FedD3 run audits its clients' uploads
  # and a rounds run (runner federated) its final global model once the run
  # ends, writing DIR/audit.json and its headline figures to
  # summary.json["audit"]; `python -m fedjax_dd.experiments.audit
  # --workdir=DIR` audits a finished run. Not part of the run's identity.
  c.audit = ml_collections.ConfigDict({
      "enabled": False,
      # The attacker's population data: this many test-split examples, drawn
      # from data.seed's audit stream; 0: the whole test split. Not a slice
      # of the training split, which would change the partition and the run.
      "holdout": 0,
      # dB at or above which a client image counts as reconstructed.
      "psnr_threshold": 30.0,
      # The false-positive rates of the reported TPRs (Carlini et al. 2022).
      "fprs": (0.01, 0.001),
      # A rounds run also audits each client's upload: FedAvg's local
      # training from the final global model (from the initial model in a
      # one-round run), as the server receives it.
      "client_uploads": True,
      # > 0: offline LiRA with this many OUT shadows (>= 2) trained on the
      # test examples outside the holdout, beside the loss threshold (rounds
      # runs: the global model and the client uploads; one-shot runs: the
      # client models).
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
# kip.kernel_impl's default: the native kernels (fedjax_dd.kernels.native;
# equal to neural-tangents' to rounding, and fedd3.py:mnist_noniid_kip moved
# within seed noise: experiments/results/fedd3_presets.md); "neural_tangents"
# needs that package.
DEFAULT_KERNEL_IMPL = "native"


def kip(c: ml_collections.ConfigDict, *, max_iterations: int,
        stop_accuracy: float | None, kernel_depth: int = 0,
        segment_iterations: int = 100) -> ml_collections.ConfigDict:
  """Adds the ``kip`` group (one name per setting, shared by FedD3 and HFLDD).

  ``kip.<name>`` for every field of ``fedjax_dd.distill.kip.KipOptions``
  (FedD3 App. C / HFLDD Sec. V-A: Adam lr 0.004, target batches of 10,
  ``lambda = 1e-6``, fixed labels) and the kernel: ``kip.kernel`` (fc |
  conv), ``kip.kernel_depth`` (0: the kernel's default, FC 4 / conv 3),
  ``kip.kernel_kind`` (ntk | nngp), ``kip.kernel_batch`` (> 0: blocks of
  that many images when evaluating KRR, FedD3's quantisation check),
  ``kip.kernel_impl`` (neural_tangents | native: which implementation of
  the same kernel computes it; :data:`DEFAULT_KERNEL_IMPL`).
  ``kip.stop_accuracy`` None runs a fixed budget of ``kip.max_iterations``.
  ``kip.dp_clip`` > 0 runs DP-KIP (``fedjax_dd.distill.kip``: per-example
  clipping to that norm, Gaussian noise of ``kip.dp_noise_multiplier``
  times it, a fixed budget); ``summary.json`` then reports its epsilon at
  ``kip.dp_delta``.
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
  """Adds the ``fedd3`` group: what each FedD3 client uploads."""
  c.fedd3 = ml_collections.ConfigDict({
      "distiller": "kip",  # kip | gmm | random
      # The upload budget of every distiller (KIP, GMM and the random
      # control): images per class per client.
      "images_per_class": 1,
      "allow_raw_upload": False,
      # Workdir of another run: train on its cached distilled set (its
      # workdir/stages/distilled) instead of distilling (server-side
      # variants; refused if its distillation settings differ).
      "distilled_from": "",
      # Send KIP's support as float32 pixels (32 bits per pixel channel,
      # FedD3's code) instead of uint8 (8 bits, the paper's count); the
      # one-shot method only.
      "float_upload": False,
  })
  return c


# Keys of the ``hfldd`` group used only by stage 5 (the members' uploads,
# which FedSeq does not have) and only by FedSeq's grouping.
MEMBER_STAGE_KEYS = ("member_data", "support_size", "sent_label_bits",
                     "allow_raw_upload")
FEDSEQ_KEYS = ("num_groups", "group_by_similarity", "fedseq_traffic")


def hfldd(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds the ``hfldd`` group: HFLDD's stages and FedSeq's (its baseline).

  A config keeps the keys its runner reads: HFLDD's presets drop
  :data:`FEDSEQ_KEYS`, FedSeq's :data:`MEMBER_STAGE_KEYS` (and ``kip``).
  """
  c.hfldd = ml_collections.ConfigDict({
      # Stages 1-2: label knowledge on data.aux_* and KMeans into K clusters.
      "num_homogeneous": 10,  # K
      "kmeans_n_init": 10,
      # Stage 5: what members send: "kip" (HFLDD), "random" (support_size
      # random raw samples, the control) or "raw" (all raw data, w/o DD).
      "member_data": "kip",
      "support_size": 400,  # |D~_i|: images per member (kip and random)
      # Send KIP images byte-identical to a raw image of their member (a
      # short KIP budget); False refuses them, as fedd3.allow_raw_upload.
      "allow_raw_upload": False,
      # Bits per label entry of the uploads; -1: what is sent (32 for learned
      # KIP labels, 0 for fixed ones, which Eq. 18 leaves out).
      "sent_label_bits": -1,
      # FedSeq: O superclients (J = data.num_clients / O), grouped across the
      # homogeneous clusters (else at random); traffic "eq19" (HFLDD Eq. 19
      # as printed, J transfers per superclient and round) or "physical" (the
      # J - 1 hand-offs the ring makes).
      "num_groups": 10,
      "group_by_similarity": True,
      "fedseq_traffic": "eq19",
  })
  return c


def dfkd(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds the ``dfkd`` group: the one-shot server stage (FedHydra's CPU scale).

  Generator and synthesis (FedHydra, DENSE), the student, FedHydra's
  stratification and aggregation, and FedDF's public-set distillation.
  """
  c.dfkd = ml_collections.ConfigDict({
      "nz": 100,
      "ngf": 32,
      "synthetic_batch_size": 64,
      "generator_steps": 30,  # T_G of HASA.
      # Student steps per epoch (0: one pass over the pool, as the reference
      # code does with 200 epochs of batch 256). At the CPU scale one pass
      # gives only Σ_e e = 820 steps of 64 images over 40 epochs, too few
      # for the student to leave chance; 40 steps per epoch do
      # (experiments/results/fedhydra_cpu_presets.md, "From the comments of
      # the configs").
      "student_steps": 40,
      "pool_size": 0,  # 0: keep every epoch's batch (pool of distill_epochs).
      "distill_epochs": 40,  # T_g.
      # The synthesis loop (fedjax_dd.distill.dfkd.PROTOCOLS): "dense"
      # (DENSE's released code, which FedHydra's extends; the keys below
      # from reset_generator to augment_flip, pool_size and student_steps
      # as set) or "paper" (FedHydra's Alg. 1 as printed: one generator
      # initialised once, fixed noise, one student step per epoch on the
      # epoch's batch, no pool, L_AD on every sample, student SGD without
      # momentum; those keys and student_momentum are then not read).
      "protocol": "dense",
      # Synthesis protocol of the authors' released code (dfkd module
      # docstring).
      "generator_lr": 1e-3,
      "generator_b1": 0.5,
      "reset_generator": True,
      "learn_noise": True,
      "keep_best": True,
      "adv_mask": "disagree",  # disagree | agree | none
      # DENSE's code augments the generator's images before the teachers
      # (random shift with zero fill, mirror); 0 / False: the papers' text.
      "augment_shift": 0,
      "augment_flip": False,
      "lambda_bn": 1.0,
      "lambda_adv": 1.0,  # FedHydra's λ2; dense.py sets DENSE's own.
      "beta": 1.0,
      "temperature": 1.0,
      # T of L_AD alone (0: temperature); DENSE's code: 1 with its T = 20.
      "adv_temperature": 0.0,
      "stratify_steps": 30,  # T_G of Alg. 2.
      "stratify_batch_size": 16,
      # sa | ae | sa_predicted (Eq. 10's rows by the plain average's
      # prediction instead of the target label; stratify.py says why).
      "aggregation": "sa",
      # Multiply U_c by c so that SA with uninformative U equals AE instead
      # of AE / c (stratify.sa_context). False: Eqs. 6-11 literally (a
      # student far below AE's on mnist_a0.5 at the CPU scale:
      # experiments/results/fedhydra_cpu_presets.md).
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
  """Adds the ``coboosting`` group: Co-Boosting's own settings
  (:class:`fedjax_dd.algorithms.coboosting.CoBoostingHyperParams`; defaults
  from the authors' code). Generator, batch, pool, epochs and the student's
  learning rate and momentum come from the ``dfkd`` group, as for DENSE."""
  c.coboosting = ml_collections.ConfigDict({
      "hardness": 1.0,  # gamma of L_H (--hs)
      "lambda_hard": 1.0,  # --ohg
      "lambda_adv": 1.0,  # beta (--adv)
      "lambda_bn": 0.0,  # --bn
      "adv_temperature": 3.0,
      "temperature": 4.0,  # --kd_T
      "perturb_temperature": 4.0,
      "epsilon": 8.0 / 255.0,  # --odseta, on [0, 1] images here
      "weight_lr": 0.01,  # mu (--mu)
      "weight_decay": 0.99,  # mu's decay per epoch (--wdc)
      "weight_passes": 1,  # --wa_steps
      "generator_clip": 10.0,
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
# * ``run``: ``config.json``, checked on every resume (a resumed run must be
#   the same experiment): every key except those marked ``-run``, which
#   decide how long and how a run goes (rounds, evaluation, checkpoints,
#   logging, budget; the client backend, which gives the same results, and
#   the convolution formulation, equal to rounding), where the TFDS copy
#   sits, or only document it. The paths server.teachers_from and
#   fedd3.distilled_from stay in: their contents change the results;
# * ``hfldd_stages``: HFLDD's cached stages 1-3: every key except those
#   marked ``-hfldd_stages``, which change only the heads' rounds (their
#   local training and sampling; pre-training has its own keys), the
#   summary (GCE, label bits charged) or which implementation computes the
#   same KIP kernel;
# * ``fedd3_distill``: FedD3's cached distilled set (the upload): only the
#   keys marked ``+fedd3_distill`` (KIP's segment length only paces progress
#   reports and kip.kernel_impl only picks the implementation of the same
#   kernel, so neither is);
# * ``client_protocol``: the one-shot runner's round-1 client models
#   (``server.teachers_from`` reuses them): only ``+client_protocol`` keys,
#   ``+client_protocol?COND`` ones when :data:`FINGERPRINT_CONDITIONS`
#   ``[COND]`` holds (a homogeneous protocol does not depend on how "every
#   client uses model.name" is spelled, nor an unresized one on the resize
#   method), so older runs' clients stay reusable;
# * ``server_setup``: the one-shot runner's checkpointed server setup (FedHydra's
#   stratification): only ``+server_setup`` keys.
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
    # Personalized evaluation is part of a run (its rows depend on it, and
    # with eval.split=client the clients' training data); HFLDD's cached
    # stages do not read it; its batch only paces the evaluation.
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
