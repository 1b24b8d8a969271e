"""Config → library glue shared by the experiment runners.

Only ``experiments/`` reads ConfigDicts; everything here turns config fields
into the explicit arguments the library takes.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np
import optax

from fedjax_dd import models
from fedjax_dd import policy
from fedjax_dd.core import clients as clients_lib
from fedjax_dd.core import cohorts
from fedjax_dd.core import keys
from fedjax_dd.core import local as local_lib
from fedjax_dd.core import prepare as prepare_lib
from fedjax_dd.core.local import steps_for
from fedjax_dd.data import partition as partition_lib
from fedjax_dd.data import preprocess
from fedjax_dd.data import sources
from fedjax_dd.data.stacked import ClientData, stack_clients
from fedjax_dd.distill import kip as kip_lib
from fedjax_dd.experiments import checks
from fedjax_dd.experiments import sections
from fedjax_dd.experiments.configs import base as base_config


# The library's floor of the channel std (a constant channel would divide by
# zero) and its prepared dataset + task.
MIN_STD = prepare_lib.MIN_STD
Prepared = prepare_lib.Prepared


class InputError(ValueError):
  """The data cannot serve the config (bad labels, a privacy refusal), found
  before any compute; the entry point reports it in one line."""


def config_value(config: ml_collections.ConfigDict, path: str) -> Any:
  """The value at the dotted ``path`` of ``config`` (``"data.seed"``), as
  plain Python (a sub-dict as a ``dict``)."""
  value = config
  for part in path.split("."):
    value = value[part]
  return value.to_dict() if hasattr(value, "to_dict") else value


def flat_config(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """``config`` as ``{dotted path: leaf value}`` (fingerprints name the
  setting that differs, e.g. ``hfldd.support_size``)."""

  def walk(d: dict[str, Any], prefix: str):
    for k, v in d.items():
      if isinstance(v, dict):
        yield from walk(v, f"{prefix}{k}.")
      else:
        yield f"{prefix}{k}", v

  return dict(walk(config.to_dict(), ""))


# Settings a resumed run may change: the keys marked out of the ``run``
# fingerprint in experiments/configs/base.py (FINGERPRINT_RULES).
RESUME_SAFE = base_config.fingerprint_paths("run")


def fingerprint(config: ml_collections.ConfigDict, name: str = "run"
                ) -> dict[str, Any]:
  """Fingerprint ``name`` of ``config`` as ``{dotted path: value}``, by the
  rules of ``base_config.FINGERPRINT_RULES``.

  ``"run"`` (default): every leaf not under :data:`RESUME_SAFE` (a resume
  with more rounds continues, one with another ``data.num_clients`` is
  refused; :func:`fedjax_dd.core.workdir.record_fingerprint`);
  ``"hfldd_stages"``: every leaf not marked out of it; the others: the
  values (a group's as a dict) of the keys marked into them.
  """
  paths = base_config.fingerprint_paths(name, config)
  if name in base_config.SUBTRACTIVE_FINGERPRINTS:
    return {k: v for k, v in flat_config(config).items()
            if not any(k == p or k.startswith(p + ".") for p in paths)}
  return {p: config_value(config, p) for p in paths}


def distill_fingerprint(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """FedD3's distillation settings (the keys marked ``+fedd3_distill``) and
  the cache format: what a cached upload set is checked against."""
  # pylint: disable-next=g-import-not-at-top
  from fedjax_dd.algorithms import fedd3_stages
  return {**fingerprint(config, "fedd3_distill"),
          "cache_format": fedd3_stages.CACHE_FORMAT}


def data_dir(config: ml_collections.ConfigDict) -> str | None:
  """``config.data.data_dir`` ("" : the loaders' default)."""
  return config.data.data_dir or None


def load_dataset(config: ml_collections.ConfigDict) -> sources.Dataset:
  """Loads ``config.data.dataset``; re-split when ``data.resplit`` is set.

  ``data.num_classes`` (0: inferred, logged for ``npz:``) goes to the
  loader. ``data.resplit`` (0: the dataset's split) is the train fraction
  of :func:`fedjax_dd.data.sources.resplit`, drawn from the partition
  seed's :attr:`fedjax_dd.core.keys.Stream.RESPLIT` stream.

  Raises:
    InputError: the loader refused the data (labels outside
      ``[0, data.num_classes)``) or could not load it (a TFDS name with
      neither a local copy nor network).
  """
  declared = int(_lookup(config, "data.num_classes") or 0) or None
  try:
    ds = sources.load_dataset(config.data.dataset, data_dir=data_dir(config),
                              num_classes=declared)
  except (ValueError, sources.DatasetUnavailableError) as e:
    raise InputError(str(e)) from None
  if declared is None and config.data.dataset.startswith("npz:"):
    logging.warning(
        "%s: %d classes inferred from labels 0..%d; set "
        "--config.data.num_classes to declare it.", config.data.dataset,
        ds.num_classes, ds.num_classes - 1)
  fraction = float(config.data.resplit)
  if fraction:
    ds = sources.resplit(
        ds, fraction,
        rng=keys.numpy_stream(config.data.seed, keys.Stream.RESPLIT))
  return ds


def resize(config: ml_collections.ConfigDict, x: np.ndarray,
           shape: Sequence[int]) -> np.ndarray:
  """``x`` resized to ``shape`` with ``config.data.resize_method`` (if it
  differs)."""
  if x.shape[1:] == tuple(shape):
    return x
  try:
    out = preprocess.resize_images(x, tuple(shape),
                                   method=config.data.resize_method)
  except ValueError as e:
    raise InputError(f"{e} (resizing for model {config.model.name!r})"
                     ) from None
  logging.warning("images resized from %s to %s (%s).",
                  "x".join(map(str, x.shape[1:])), "x".join(map(str, shape)),
                  config.data.resize_method)
  return out


def load_and_prepare(config: ml_collections.ConfigDict) -> Prepared:
  """:func:`load_dataset`, resized for ``config.model.name`` (or
  ``data.input_shape``), and the task, whose inputs the train split's
  channel statistics normalise (std floored at :data:`MIN_STD`)."""
  ds = load_dataset(config)
  try:
    return prepare_lib.prepare(
        ds, config.model.name,
        input_shape=tuple(config.data.input_shape or ()) or None,
        resize_method=config.data.resize_method, conv_impl=conv_impl(config),
        compute_dtype=compute_dtype(config),
        init=_lookup(config, "model.init") or "",
        proj_dim=int(_lookup(config, "model.proj_dim") or 0))
  except ValueError as e:
    # Found once the data is loaded (channels, layout): one line.
    raise InputError(f"{config.data.dataset}: {e} (data.dataset into "
                     f"model.name={config.model.name!r})") from None


def conv_impl(config: ml_collections.ConfigDict,
              model: str | None = None) -> str:
  """``config.model.conv_impl`` (``"auto"`` for configs without the key),
  validated.

  Args:
    config: The run's config.
    model: The class name of the model it is for: ``"auto"`` is then
      resolved for this platform, jax and model
      (:func:`fedjax_dd.policy.conv_form`). None (a registry model, whose
      builder resolves ``"auto"`` for its own class): returned as set.
  """
  impl = _lookup(config, "model.conv_impl") or "auto"
  resolved = models.resolve_conv_impl(impl, model=model)
  return impl if model is None else resolved


def compute_dtype(config: ml_collections.ConfigDict) -> str:
  """``config.model.compute_dtype`` (``"auto"`` without the key) resolved
  by :func:`fedjax_dd.policy.resolve_compute_dtype`: ``"float32"`` or
  ``"bfloat16"``, for every model's and generator's convolutions and
  matmuls."""
  return policy.resolve_compute_dtype(
      _lookup(config, "model.compute_dtype") or "auto")


def make_optimizer(config: ml_collections.ConfigDict, *, lr: Any = None,
                   weight_decay: Any = None) -> optax.GradientTransformation:
  """``config.client.optimizer`` in {sgd, adam, adamw} with ``client.lr``,
  ``client.momentum``, ``client.weight_decay`` and ``client.grad_clip``.

  ``lr`` / ``weight_decay`` replace ``client.lr`` / ``client.weight_decay``
  (e.g. traced grid values of :mod:`fedjax_dd.experiments.axis_sweep`); a
  given ``weight_decay`` is always in the chain (0 adds ``0 * w``, which
  leaves every gradient bit as it is).

  The chain is clip (``client.grad_clip > 0``: to that global norm) ->
  weight decay (sgd, adam: L2 ``wd * w`` added to the clipped gradient, as
  PyTorch's ``SGD(weight_decay=...)`` after ``clip_grad_norm_`` in FedFTG's
  and DisUE's code; adamw: decoupled) -> optimizer. With both 0 (the
  defaults) the optimizer is exactly the bare one.
  """
  c = config.client
  name = c.optimizer
  lr = c.lr if lr is None else lr
  traced_decay = weight_decay is not None
  decay = weight_decay if traced_decay else float(c.weight_decay)
  builders: dict[str, Callable[[], optax.GradientTransformation]] = {
      "sgd": lambda: optax.sgd(lr, momentum=c.momentum or None),
      "adam": lambda: optax.adam(lr),
      "adamw": lambda: optax.adamw(lr, weight_decay=decay),
  }
  if name not in builders:
    raise ValueError(f"Unknown optimizer {name!r}; expected one of {sorted(builders)}.")
  chain = []
  clip = float(_lookup(config, "client.grad_clip") or 0.0)
  if clip > 0:
    chain.append(optax.clip_by_global_norm(clip))
  if name != "adamw" and (traced_decay or decay):
    chain.append(optax.add_decayed_weights(decay))
  if not chain:
    return builders[name]()
  return optax.chain(*chain, builders[name]())


# Augmentations of ``client.augment`` ("": none).
AUGMENTATIONS: dict[str, Callable[[], Callable]] = {
    "flip_crop": lambda: local_lib.flip_and_crop(pad=4),
}


def augmentation(config: ml_collections.ConfigDict) -> Callable | None:
  """The batch augmentation of ``config.client.augment`` (``""``: None)."""
  name = _lookup(config, "client.augment") or ""
  if not name:
    return None
  if name not in AUGMENTATIONS:
    raise ValueError(f"Unknown client.augment {name!r}; expected \"\" or one "
                     f"of {sorted(AUGMENTATIONS)}.")
  return AUGMENTATIONS[name]()


def local_training(config: ml_collections.ConfigDict, task,
                   max_steps: int) -> local_lib.LocalTraining:
  """The clients' local training of ``config.client`` (every algorithm
  factory takes it): :func:`make_optimizer`, ``client.batch_size``,
  :func:`augmentation`, ``client.lr_decay``'s schedule
  (:func:`fedjax_dd.core.local.round_decay`), :func:`mapper`, ``task`` and
  the step bound ``max_steps`` (the largest of :func:`local_steps`)."""
  return local_lib.LocalTraining(
      task=task, optimizer=make_optimizer(config),
      batch_size=int(config.client.batch_size), max_steps=int(max_steps),
      mapper=mapper(config), augment=augmentation(config),
      schedule=local_lib.round_decay(config.client.lr_decay))


PARTITIONERS: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": partition_lib.iid,
    "pathological": partition_lib.pathological,
    "dirichlet": partition_lib.dirichlet,
    "dirichlet_client": partition_lib.dirichlet_client,
    "disjoint_classes": partition_lib.disjoint_classes,
    "quantity_skew": partition_lib.quantity_skew,
}


def partition(config: ml_collections.ConfigDict, labels: np.ndarray) -> list[np.ndarray]:
  """Splits the train labels with ``config.data.partition`` and
  ``config.data.seed``; then :func:`check_upload_privacy`.

  Raises:
    InputError: the data cannot be split so (the partitioner's refusal,
      e.g. fewer examples than clients, or a client left without data),
      or from :func:`check_upload_privacy` and :func:`check_coverage`.
  """
  p = config.data.partition
  if p.name not in PARTITIONERS:
    raise ValueError(f"Unknown partition {p.name!r}; expected one of {sorted(PARTITIONERS)}.")
  kwargs = {k: v for k, v in p.items() if k != "name"}
  rng = keys.numpy_stream(config.data.seed)
  try:
    parts = PARTITIONERS[p.name](labels, config.data.num_clients, rng=rng,
                                 **kwargs)
  except ValueError as e:
    # What the data cannot give (fewer examples than clients, one class for
    # a class-per-client split), known only once it is loaded.
    raise InputError(
        f"data.partition {p.name!r} over data.num_clients="
        f"{config.data.num_clients} of {config.data.dataset} "
        f"({np.size(labels)} training examples, "
        f"{np.unique(labels).size} classes): {str(e).rstrip('.')}; change "
        "--config.data.num_clients or the --config.data.partition.* "
        "options.") from None
  empty = [k for k, idx in enumerate(parts) if np.size(idx) == 0]
  if empty:
    raise InputError(
        f"data.partition {p.name!r} over data.num_clients="
        f"{config.data.num_clients} of {config.data.dataset} "
        f"({np.size(labels)} training examples) leaves {len(empty)} "
        f"client{'s' * (len(empty) != 1)} without data (e.g. client "
        f"{empty[0]}); lower --config.data.num_clients or choose another "
        "--config.data.partition.")
  # The privacy refusal first: it names the client classes themselves.
  check_upload_privacy(config, labels, parts)
  check_coverage(config, labels, parts)
  return parts


def check_coverage(config: ml_collections.ConfigDict, labels: np.ndarray,
                   parts: list[np.ndarray]) -> None:
  """Refuses a partition under which no client holds classes that make up
  more than half of the training data, which the run would still be tested
  on (e.g. ``pathological``, 2 classes per client, one client); a smaller
  share left out is a logged warning.

  Raises:
    InputError: naming the classes, the share of the data left out and the
      settings to change.
  """
  labels = np.asarray(labels)
  held = np.unique(labels[np.concatenate(parts)]) if parts else []
  present = np.unique(labels)
  missing = np.setdiff1d(present, held)
  if missing.size:
    unused = int(np.isin(labels, missing).sum())
    shown = ", ".join(str(int(c)) for c in missing[:10]) + (
        ", ..." if missing.size > 10 else "")
    message = (
        f"data.partition {config.data.partition.name!r} over "
        f"data.num_clients={config.data.num_clients} gives no client "
        f"classes {shown} ({missing.size} of {present.size} classes, "
        f"{unused} of {labels.size} training examples, "
        f"{100 * unused / labels.size:.0f} %); the test set still holds them. "
        "Raise --config.data.num_clients (or the classes per client) so that "
        "every class has a client.")
    if 2 * unused > labels.size:
      raise InputError(message)
    logging.warning("%s", message)


# FedD3 distillers whose upload the privacy guard covers (the random
# control sends raw images by construction).
_GUARDED_DISTILLERS = ("kip", "gmm")


def check_upload_privacy(config: ml_collections.ConfigDict,
                         labels: np.ndarray, parts: list[np.ndarray]) -> None:
  """FedD3's privacy guard (App. G) on the partition, before any compute.

  A client class with at most ``fedd3.images_per_class`` examples would be
  uploaded raw by KIP and the GMM coreset
  (:func:`fedjax_dd.distill.kip.check_privacy`); applies to those
  distillers unless ``fedd3.allow_raw_upload``.

  Raises:
    InputError: naming the client, class, class size and
      ``images_per_class``, and the two settings that lift it.
  """
  f = _lookup(config, "fedd3")
  if (f is None or f.allow_raw_upload or f.distiller not in _GUARDED_DISTILLERS
      or f.distilled_from):
    return
  if f.distiller == "kip" and float(_lookup(config, "kip.dp_clip") or 0) > 0:
    return  # DP-KIP's support starts from noise: no slot is a raw image.
  labels = np.asarray(labels)
  num_classes = int(labels.max()) + 1 if labels.size else 1
  stacked = stack_clients(np.zeros((labels.size, 1), np.uint8), labels, parts)
  try:
    kip_lib.check_privacy(stacked.y, stacked.num_examples, num_classes,
                          images_per_class=int(f.images_per_class))
  except ValueError as e:
    msg = str(e).replace(
        "Lower images_per_class below the smallest class, or set "
        "allow_raw_upload=True to accept raw uploads.",
        "Set --config.fedd3.images_per_class below the smallest client "
        "class, or --config.fedd3.allow_raw_upload=True to accept raw "
        "uploads.")
    raise InputError(f"fedd3: {msg}") from None


def client_data(ds: sources.Dataset, parts: list[np.ndarray]) -> ClientData:
  """Stacked, padded client data moved to the device."""
  stacked = stack_clients(ds.x_train, ds.y_train, parts)
  return jax.device_put(stacked)


# Models whose training gradient XLA:CPU's classic runtime fails to compile;
# their programs keep XLA's default runtime.
CLASSIC_RUNTIME_UNSAFE = policy.CLASSIC_RUNTIME_UNSAFE


def client_models(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The client architectures of ``config.model.client_models``
  (comma-separated); ``()`` for homogeneous clients (empty, or naming only
  ``config.model.name``)."""
  names = tuple(s.strip() for s in config.model.client_models.split(",")
                if s.strip())
  return names if set(names) - {config.model.name} else ()


def classic_runtime(config: ml_collections.ConfigDict,
                    model_names: Sequence[str] | None = None) -> bool:
  """Whether the engine's per-program CPU options apply.

  Args:
    config: the experiment config (``engine.classic_cpu_runtime``, if set,
      overrides).
    model_names: the models of the programs; default every model the config
      names (``model.name`` and ``model.client_models``).
  """
  if config.engine.classic_cpu_runtime is not None:
    return bool(config.engine.classic_cpu_runtime)
  if model_names is None:
    model_names = (config.model.name, *client_models(config))
  return not CLASSIC_RUNTIME_UNSAFE.intersection(model_names)


def clients_per_round(config: ml_collections.ConfigDict, num_clients: int) -> int:
  """``client.clients_per_round`` if set, else ``client.client_fraction`` of
  N (at least 1)."""
  if config.client.clients_per_round:
    return int(config.client.clients_per_round)
  fraction = config.client.client_fraction
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"client_fraction must be in (0, 1], got {fraction}.")
  return max(1, int(round(fraction * num_clients)))


def cohort(config: ml_collections.ConfigDict,
           num_clients: int) -> cohorts.CohortSampler:
  """The rounds' cohort draw: each client joins with probability
  ``client.activity`` when it is set (FedDyn's and FedFTG's ``act_prob``),
  else :func:`clients_per_round` clients."""
  if config.client.activity:
    return cohorts.BernoulliCohort(float(config.client.activity))
  return cohorts.FixedCohort(clients_per_round(config, num_clients))


def expected_clients(config: ml_collections.ConfigDict,
                     num_clients: int) -> float:
  """The expected cohort size of :func:`cohort`: ``S`` for a fixed draw,
  ``p N`` for a Bernoulli one (DP-FedAvg divides its noised sum by it, and
  ``expected / N`` is its sampling rate)."""
  draw = cohort(config, num_clients)
  if isinstance(draw, cohorts.BernoulliCohort):
    return float(draw.probability) * num_clients
  return float(draw.size)


def dp_fedavg_fields(config: ml_collections.ConfigDict, num_clients: int,
                     rounds: int) -> dict[str, Any]:
  """DP-FedAvg's ``summary.json`` fields after ``rounds`` rounds: the
  ``config.dp`` settings and their epsilon at ``dp.delta``
  (:func:`fedjax_dd.privacy.accounting.summary_fields`, sampling rate
  :func:`expected_clients` / N)."""
  from fedjax_dd.privacy import accounting  # pylint: disable=g-import-not-at-top
  d = config.dp
  return accounting.summary_fields(
      clip=d.clip, noise_multiplier=d.noise_multiplier,
      sampling_rate=min(1.0, expected_clients(config, num_clients)
                        / num_clients),
      steps=int(rounds), delta=d.delta)


def dp_kip_fields(config: ml_collections.ConfigDict, num_examples,
                  iterations=None) -> dict[str, Any]:
  """DP-KIP's ``summary.json`` fields (``{}`` unless the run's clients
  distil with KIP, ``fedd3.distiller`` or ``hfldd.member_data`` ``kip``,
  and ``kip.dp_clip > 0``): :func:`fedjax_dd.distill.kip.dp_fields` at the
  rate of the client with the fewest examples among ``num_examples``, for
  the most ``iterations`` any client ran (``kip.max_iterations`` when not
  recorded) and ``kip.dp_delta``."""
  if "kip" not in config or "kip" not in (_lookup(config, "fedd3.distiller"),
                                          _lookup(config, "hfldd.member_data")):
    return {}
  options = kip_options(config)
  if not options.dp:
    return {}
  steps = (int(np.max(iterations)) if iterations is not None
           and np.size(iterations) else options.max_iterations)
  return kip_lib.dp_fields(options, jax.device_get(num_examples),
                           steps=steps, delta=config.kip.dp_delta)


def mapper(config: ml_collections.ConfigDict,
           model_names: Sequence[str] | None = None,
           workload: str = "train") -> clients_lib.ClientMapper:
  """The client mapper; ``model_names`` as in :func:`classic_runtime`.

  ``workload`` (:data:`fedjax_dd.core.clients.WORKLOADS`) picks the measured
  default when ``config.engine.backend`` is ``"auto"``.
  """
  return clients_lib.ClientMapper(backend=config.engine.backend,
                                  chunk_size=config.engine.chunk_size or None,
                                  classic_runtime=classic_runtime(config,
                                                                  model_names),
                                  workload=workload)


def workdir_path(workdir: str, *parts: str) -> str:
  os.makedirs(workdir, exist_ok=True)
  return os.path.join(workdir, *parts)


def local_steps(config: ml_collections.ConfigDict, num_examples) -> jax.Array:
  """``[C]`` active local steps per client, the one rule of every runner.

  ``config.client.local_steps > 0`` fixed steps per client (clients without
  data take none), else ``client.local_epochs`` epochs of
  ``client.batch_size`` (:func:`fedjax_dd.core.local.steps_for`).
  """
  c = config.client
  if c.local_steps:
    return steps_for(num_examples, c.batch_size, steps=c.local_steps)
  return steps_for(num_examples, c.batch_size, epochs=c.local_epochs)


# Architectures of kip.kernel; kip.kernel_impl picks the implementation
# (fedjax_dd.kernels.KERNEL_IMPLS: the neural-tangents one is imported on
# first use, it loads TensorFlow).
KIP_KERNELS = ("fc", "conv")


def kip_kernel(config: ml_collections.ConfigDict, *,
               batched: bool = False) -> kip_lib.KernelFn:
  """The KIP kernel of ``config.kip.kernel`` / ``kernel_depth`` (0: the
  kernel's default, FC 4, conv 3) / ``kernel_kind``, computed by
  ``kernel_impl``: ``"neural_tangents"`` (:mod:`fedjax_dd.kernels.ntk`) or
  ``"native"`` (:mod:`fedjax_dd.kernels.native`, pure JAX).

  ``batched`` evaluates in blocks of ``kip.kernel_batch`` images (if set),
  for KRR over many test images.
  """
  from fedjax_dd import kernels  # pylint: disable=g-import-not-at-top
  k = config.kip
  if k.kernel not in KIP_KERNELS:
    raise ValueError(f"Unknown kip.kernel {k.kernel!r}; expected one "
                     f"of {sorted(KIP_KERNELS)}.")
  impl = k.kernel_impl
  if impl not in kernels.KERNEL_IMPLS:
    raise ValueError(f"Unknown kip.kernel_impl {impl!r}; expected one "
                     f"of {sorted(kernels.KERNEL_IMPLS)}.")
  kwargs: dict = {"kind": k.kernel_kind}
  if k.kernel_depth:
    kwargs["depth"] = int(k.kernel_depth)
  if batched and k.kernel_batch:
    kwargs["batch_size"] = int(k.kernel_batch)
  return kernels.kernel_builder(k.kernel, impl)(**kwargs)


def kip_options(config: ml_collections.ConfigDict) -> kip_lib.KipOptions:
  """:class:`fedjax_dd.distill.kip.KipOptions` from the ``kip`` group (one key
  per field)."""
  return sections.kip(config.kip)



# (path, lower bound, whether the bound is allowed): numbers that must be
# finite and above their bound before any compute.
_POSITIVE = (
    ("rounds", 1, True), ("run.eval_every", 1, True),
    ("run.checkpoint_every", 1, True), ("run.keep_checkpoints", 1, True),
    ("client.batch_size", 1, True), ("client.lr", 0.0, False),
    ("client.momentum", 0.0, True), ("client.weight_decay", 0.0, True),
    ("client.grad_clip", 0.0, True), ("client.lr_decay", 0.0, False),
    ("client.local_epochs", 0.0, True), ("client.local_steps", 0, True),
    ("server.lr", 0.0, False), ("data.num_clients", 1, True),
    ("kip.lr", 0.0, False), ("dfkd.generator_lr", 0.0, False),
    ("dfkd.student_lr", 0.0, False), ("dfkd.student_momentum", 0.0, True),
    ("dfkd.feddf_lr", 0.0, False), ("dfkd.distill_epochs", 1, True),
    # Alg. 2's loss curve L_kj needs two points to have a slope.
    ("dfkd.stratify_steps", 2, True), ("dfkd.stratify_batch_size", 1, True),
    ("eval.batch_size", 1, True), ("eval.finetune_steps", 0, True),
)

# Runners whose clients train once, in one round (the one-shot client
# stage): a schedule over rounds would only give round 0's factor, so
# validate refuses client.lr_decay != 1 for them rather than ignore it.
ONE_ROUND_RUNNERS = ("fedhydra",)

# eval.split: where each client's test data comes from (base.py).
PERSONAL_SPLITS = ("test", "client")


def _lookup(config: ml_collections.ConfigDict, path: str):
  node = config
  for part in path.split("."):
    if not hasattr(node, "keys") or part not in node:
      return None  # a group this method does not have
    node = node[part]
  return node


def validate(config: ml_collections.ConfigDict) -> None:
  """Refuses settings no run can use, before any data is loaded.

  :func:`registry.check_method` first, then :data:`_POSITIVE`, momenta
  below 1, that local training has work and decays
  only over rounds (not :data:`ONE_ROUND_RUNNERS`), the names of
  ``client.augment``, ``model.conv_impl``, ``model.compute_dtype`` and the
  partition, and ``kip.kernel_impl=neural_tangents``'s optional extra.

  Raises:
    ValueError: naming the ``--config.<path>`` to change and its value.
  """
  from fedjax_dd.experiments import registry  # pylint: disable=g-import-not-at-top
  registry.check_method(config)
  for path, bound, inclusive in _POSITIVE:
    value = _lookup(config, path)
    if value is None:
      continue
    try:
      number = float(value)
    except (TypeError, ValueError):
      raise ValueError(f"config.{path} must be a number, got {value!r}.") from None
    ok = np.isfinite(number) and (number >= bound if inclusive else number > bound)
    if not ok:
      rel = ">=" if inclusive else ">"
      raise ValueError(f"config.{path} must be a finite number {rel} {bound}, "
                       f"got {value!r}; set --config.{path}.")
  for path in ("client.momentum", "dfkd.student_momentum"):
    value = _lookup(config, path)
    if value is not None and float(value) >= 1.0:
      raise ValueError(f"config.{path} must be < 1 (SGD momentum), got "
                       f"{value!r}.")
  if (_lookup(config, "client.local_steps") == 0
      and _lookup(config, "client.local_epochs") == 0):
    raise ValueError(
        "Local training has no work: config.client.local_epochs and "
        "config.client.local_steps are both 0; set --config.client."
        "local_epochs > 0 (epochs, may be fractional) or --config.client."
        "local_steps >= 1.")
  augment = _lookup(config, "client.augment")
  if augment and augment not in AUGMENTATIONS:
    raise ValueError(f"config.client.augment must be \"\" or one of "
                     f"{sorted(AUGMENTATIONS)}, got {augment!r}; set "
                     "--config.client.augment.")
  impl = _lookup(config, "model.conv_impl")
  if impl is not None and impl not in models.CONV_IMPLS:
    raise ValueError(f"config.model.conv_impl must be one of "
                     f"{list(models.CONV_IMPLS)}, got {impl!r}; set "
                     "--config.model.conv_impl.")
  dtype = _lookup(config, "model.compute_dtype")
  if dtype is not None and dtype not in ("auto",) + policy.COMPUTE_DTYPES:
    raise ValueError(f"config.model.compute_dtype must be one of "
                     f"{['auto', *policy.COMPUTE_DTYPES]}, got {dtype!r}; "
                     "set --config.model.compute_dtype.")
  if _lookup(config, "data.partition") is not None:
    check_partition(config.data.partition)
  lr_decay = _lookup(config, "client.lr_decay")
  if lr_decay is not None and float(lr_decay) != 1.0 and (
      _lookup(config, "runner") in ONE_ROUND_RUNNERS):
    raise ValueError(
        f"{config.method}'s clients train once, in one round: "
        f"config.client.lr_decay must be 1.0, got {lr_decay!r}; set "
        "--config.client.lr_decay=1.0.")
  check_personal(config)
  check_dp(config)
  check_audit(config)
  if _lookup(config, "kip.kernel_impl") == "neural_tangents":
    import importlib.util  # pylint: disable=g-import-not-at-top
    if importlib.util.find_spec("neural_tangents") is None:
      raise ValueError(
          "config.kip.kernel_impl=neural_tangents needs neural-tangents, an "
          "optional extra that imports only with jax < 0.6: pip install "
          "\"fedjax-dd[nt]\" (or keep the default "
          "--config.kip.kernel_impl=native, the same kernels in pure JAX).")
  # The library's own ranges and names, before the data loads.
  checks.check_values(config)


def check_personal(config: ml_collections.ConfigDict) -> None:
  """``eval.*``: a split of :data:`PERSONAL_SPLITS`, a test fraction in
  ``(0, 1)`` and a runner that evaluates it (the rounds of runner
  ``federated``); the counts are checked with :data:`_POSITIVE`.

  Raises:
    ValueError: naming the ``--config.eval.<key>`` to change.
  """
  e = _lookup(config, "eval")
  if e is None:
    return
  if e.split not in PERSONAL_SPLITS:
    raise ValueError(f"config.eval.split must be one of {PERSONAL_SPLITS}, "
                     f"got {e.split!r}; set --config.eval.split.")
  if not 0.0 < float(e.test_fraction) < 1.0:
    raise ValueError(f"config.eval.test_fraction must lie in (0, 1), got "
                     f"{e.test_fraction!r}; set --config.eval.test_fraction.")
  if e.personal and config.runner != "federated":
    raise ValueError(
        f"config.eval.personal=True: runner {config.runner!r} does not run "
        "personalized evaluation (only the rounds of runner 'federated': the "
        "FedAvg family, IFCA, CFL, CFL-GP, PACFL, FedFTG and DisUE); drop "
        "--config.eval.personal.")


def check_audit(config: ml_collections.ConfigDict) -> None:
  """``audit.*``: the settings
  (:func:`fedjax_dd.audit.workdir.check_settings` and ``check_lira``; LiRA
  only on model uploads) and, with ``audit.enabled``, a runner of
  :data:`fedjax_dd.experiments.auditing.AUDITS`.

  Raises:
    ValueError: one line naming the ``--config.audit.<key>`` to change.
  """
  a = _lookup(config, "audit")
  if a is None:
    return
  from fedjax_dd.audit import workdir as audit_lib  # pylint: disable=g-import-not-at-top
  audit_lib.check_settings(a.holdout, a.psnr_threshold, a.fprs,
                           prefix="config.audit.", fix="set --{name}")
  shadows, _ = audit_lib.check_lira(a.get("lira_shadows", 0),
                                    a.get("lira_pool", 0),
                                    prefix="config.audit.",
                                    fix="set --{name}")
  runner = _lookup(config, "runner")
  if not a.enabled:
    return
  if shadows and runner not in ("federated", "fedhydra"):
    raise ValueError(
        f"config.audit.lira_shadows={shadows}: LiRA audits model uploads "
        f"(runners federated and fedhydra), not runner {runner!r}; set "
        "--config.audit.lira_shadows=0.")
  from fedjax_dd.experiments import auditing  # pylint: disable=g-import-not-at-top
  if runner not in auditing.AUDITS:
    raise ValueError(
        f"config.audit.enabled=True: runner {runner!r} has no audit yet "
        f"(runners {', '.join(auditing.AUDITS)}: FedD3's uploads, HFLDD's "
        "members' uploads, a rounds run's global model, a one-shot run's "
        "client models); drop "
        "--config.audit.enabled.")


def check_dp(config: ml_collections.ConfigDict) -> None:
  """The differential-privacy settings, before the data loads.

  DP-FedAvg's ``dp`` group: method ``dp_fedavg`` (its only reader) and a
  model without BatchNorm (its statistics would be averaged without
  noise). DP-KIP: ``kip.dp_clip >= 0``, ``kip.dp_delta`` in ``(0, 1)`` and
  a KIP that runs it (``fedd3.distiller`` / ``hfldd.member_data`` ``kip``);
  its other refusals are :class:`fedjax_dd.distill.kip.KipOptions`'s.
  Either needs dp-accounting (the ``privacy`` extra).

  Raises:
    ValueError: one line naming the ``--config.<path>`` to change.
  """
  from fedjax_dd.core import checks as checks_lib  # pylint: disable=g-import-not-at-top

  def number(path, low, high=None, **kw):
    return checks_lib.check_number(f"config.{path}", _lookup(config, path),
                                   low, high, fix=f"set --config.{path}",
                                   **kw)

  private = False
  if _lookup(config, "dp") is not None:
    # Its values are DPFedAvgHyperParams' to refuse (registry.check_method).
    method = _lookup(config, "method")
    if method != "dp_fedavg":
      raise ValueError(
          f"config.dp is DP-FedAvg's group, but config.method is "
          f"{method!r}, which does not read it; use "
          "--config=experiments/configs/dp_fedavg.py:<preset>.")
    name = _lookup(config, "model.name")
    try:
      spec = models.get_model(name)
    except (ValueError, KeyError):
      spec = None  # an unknown name is refused by checks.check_values
    if spec is not None and spec.has_batch_stats:
      raise ValueError(
          f"config.model.name={name!r} keeps BatchNorm statistics, which "
          "DP-FedAvg's clients would upload and the server average without "
          "noise, outside the guarantee; set --config.model.name to a model "
          "without BatchNorm.")
    private = True
  if _lookup(config, "kip.dp_clip") is not None:
    clip = number("kip.dp_clip", 0.0)
    number("kip.dp_delta", 0.0, 1.0, low_open=True, high_open=True)
    if clip > 0:
      for path in ("fedd3.distiller", "hfldd.member_data"):
        value = _lookup(config, path)
        if value is not None and value != "kip":
          raise ValueError(
              f"config.kip.dp_clip={clip:g} runs DP-KIP, but config.{path}="
              f"{value!r} uploads no KIP images; set --config.kip.dp_clip=0 "
              f"or --config.{path}=kip.")
      private = True
  if private:
    import importlib.util  # pylint: disable=g-import-not-at-top
    if importlib.util.find_spec("dp_accounting") is None:
      raise ValueError(
          "A differentially private run (config.dp, config.kip.dp_clip > 0) "
          "reports its epsilon through dp-accounting, an optional extra: "
          "pip install \"fedjax-dd[privacy]\".")


def personal_split(config: ml_collections.ConfigDict, prepared: Prepared,
                   parts: list[np.ndarray]
                   ) -> tuple[list[np.ndarray], ClientData | None]:
  """``(training parts, per-client test data)`` of ``config.eval``: the
  partition unchanged and the test split dealt out in each client's label
  proportions (``eval.split="test"``), or each client's own examples split
  per class (``"client"``); both from ``data.seed``'s personal-test stream.
  ``(parts, None)`` without ``eval.personal``."""
  e = config.eval
  if not e.personal:
    return parts, None
  ds = prepared.dataset
  rng = keys.numpy_stream(config.data.seed, keys.Stream.PERSONAL_TEST)
  if e.split == "client":
    parts, test_parts = partition_lib.stratified_split(
        ds.y_train, parts, float(e.test_fraction), rng)
    x, y = ds.x_train, ds.y_train
  else:
    counts = partition_lib.class_counts(ds.y_train, parts,
                                        prepared.task.num_classes)
    test_parts = partition_lib.personal_test_split(ds.y_test, counts, rng)
    x, y = ds.x_test, ds.y_test
  return parts, jax.device_put(stack_clients(x, y, test_parts,
                                             allow_empty=True))


def personal_evaluation(config: ml_collections.ConfigDict, algorithm,
                        task, data: ClientData, test: ClientData | None):
  """The rounds' personalized evaluation of ``config.eval``
  (:func:`fedjax_dd.core.personal.personal_evaluation`), or None."""
  if test is None:
    return None
  from fedjax_dd.core import personal  # pylint: disable=g-import-not-at-top
  e = config.eval
  return personal.personal_evaluation(
      algorithm, task, data, test, mapper=mapper(config),
      batch_size=int(e.batch_size), finetune_steps=int(e.finetune_steps),
      finetune_optimizer=make_optimizer(config),
      finetune_batch_size=int(config.client.batch_size))


def partition_options(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """``(required, optional)`` option names of partition ``name``: the
  keyword arguments of its :data:`PARTITIONERS` function besides the labels,
  the number of clients and the generator."""
  required, optional = [], []
  for param in inspect.signature(PARTITIONERS[name]).parameters.values():
    if param.name in ("labels", "num_clients", "rng", "max_tries"):
      continue
    (required if param.default is param.empty else optional).append(
        param.name)
  return tuple(required), tuple(optional)


def check_partition(group: ml_collections.ConfigDict) -> None:
  """Refuses a ``data.partition`` group whose options do not fit its name
  (overriding only ``data.partition.name`` keeps the preset's options, and
  the partitioner would fail after the data loaded).

  Raises:
    ValueError: one line naming the unknown name, or the options that do not
      apply or are missing, and every partition's options.
  """
  name = group.get("name")
  table = "; ".join(
      f"{n}: {', '.join(r + tuple(f'[{o}]' for o in opt)) or 'no options'}"
      for n in sorted(PARTITIONERS) for r, opt in [partition_options(n)])
  if name not in PARTITIONERS:
    raise ValueError(f"config.data.partition.name={name!r} is not a "
                     f"partition; options by partition ([optional]): {table}.")
  required, optional = partition_options(name)
  given = set(group.keys()) - {"name"}
  extra = sorted(given - set(required) - set(optional))
  missing = [k for k in required if k not in given]
  if extra or missing:
    problems = ([f"it does not take {', '.join(extra)}"] if extra else []) + (
        [f"it needs {', '.join(missing)}"] if missing else [])
    raise ValueError(
        f"config.data.partition.name={name!r} does not fit the config's "
        f"partition options: {' and '.join(problems)}. Options by partition "
        f"([optional]): {table}. A flag cannot add or drop options: use a "
        f"preset whose partition is {name!r}, or keep the preset's name.")


def initialised_clients(config: ml_collections.ConfigDict):
  """Data, partition and the common initial model of HFLDD and FedSeq.

  Returns:
    ``(prepared, data, root_key, params, batch_stats)``; the model is
    initialised from ``stage_key(root, Stage.INIT)``.
  """
  prepared = load_and_prepare(config)
  data = client_data(prepared.dataset,
                     partition(config, prepared.dataset.y_train))
  root = keys.model_root(config.seed)
  params, batch_stats = prepared.task.init(
      keys.stage_key(root, keys.Stage.INIT))
  return prepared, data, root, params, batch_stats


def label_knowledge_clusters(config: ml_collections.ConfigDict,
                             prepared: Prepared, data: ClientData, params,
                             batch_stats, root: jax.Array):
  """HFLDD's stages 1-2 (shared with FedSeq's grouping):
  :func:`fedjax_dd.algorithms.hfldd_stages.label_knowledge_clusters` on
  ``data.aux_*``, pretraining from ``stage_key(root, Stage.PRETRAIN)``."""
  from fedjax_dd.algorithms import hfldd_stages  # pylint: disable=g-import-not-at-top

  def load_aux():
    x = sources.load_unlabeled(
        config.data.aux_dataset, num=config.data.aux_size,
        rng=keys.numpy_stream(config.data.seed, keys.Stream.AUX_DATA),
        data_dir=data_dir(config))
    return resize(config, x, prepared.task.input_shape)

  c = config.client
  # HFLDD's pretraining is plain local SGD (Sec. IV-A): without the rounds'
  # augment and lr_decay. max_steps=1 is a placeholder that
  # pretrain_clients replaces with the largest client step count.
  pretraining = dataclasses.replace(
      local_training(config, prepared.task, 1),
      batch_size=int(c.pretrain_batch_size), augment=None, schedule=None)
  return hfldd_stages.label_knowledge_clusters(
      pretraining, params, batch_stats, data, load_aux,
      keys.stage_key(root, keys.Stage.PRETRAIN),
      num_homogeneous=config.hfldd.num_homogeneous, kmeans_seed=config.seed,
      kmeans_n_init=config.hfldd.kmeans_n_init,
      pretrain_epochs=c.pretrain_epochs, pretrain_steps=c.pretrain_steps)
