"""Config → library glue shared by the experiment runners.

Only ``experiments/`` reads ConfigDicts; everything here turns config fields
into the explicit arguments the library takes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Sequence

import jax
import ml_collections
import numpy as np
import optax

from fedjax_dd import models
from fedjax_dd.core import clients as clients_lib
from fedjax_dd.core.task import Classifier
from fedjax_dd.data import partition as partition_lib
from fedjax_dd.data import preprocess
from fedjax_dd.data import sources
from fedjax_dd.data.stacked import ClientData, stack_clients


@dataclasses.dataclass(frozen=True)
class Prepared:
  """A dataset resized for the model, plus the task built on it."""
  dataset: sources.Dataset
  task: Classifier
  spec: models.ModelSpec
  mean: np.ndarray  # [Ch] train-split channel mean on the [0, 1] scale
  std: np.ndarray   # [Ch] train-split channel std


# Stream of the 80/20 re-split, apart from the partition's
# ``default_rng(data_seed)`` and HFLDD's ``D_g`` draw ``[data_seed, 1]``.
_RESPLIT_STREAM = 5


def load_dataset(config: ml_collections.ConfigDict) -> sources.Dataset:
  """Loads ``config.dataset``; re-split when ``config.resplit`` is set.

  ``resplit`` (0: keep the dataset's own split) is the train fraction of
  :func:`fedjax_dd.data.sources.resplit` (HFLDD: 0.8), drawn from
  ``default_rng([data_seed, 5])``.
  """
  ds = sources.load_dataset(config.dataset,
                            data_dir=config.get("data_dir") or None)
  fraction = float(config.get("resplit", 0.0) or 0.0)
  if fraction:
    ds = sources.resplit(
        ds, fraction,
        rng=np.random.default_rng([config.get("data_seed", 0), _RESPLIT_STREAM]))
  return ds


def load_and_prepare(config: ml_collections.ConfigDict) -> Prepared:
  """Loads ``config.dataset``, resizes it for ``config.model``, builds the task.

  Loading goes through :func:`load_dataset` (so ``config.resplit`` applies).
  """
  ds = load_dataset(config)
  spec = models.get_model(config.model)
  target = tuple(spec.input_shape)
  if config.get("input_shape"):
    target = tuple(config.input_shape)
  if ds.x_train.shape[1:] != target:
    method = config.get("resize_method", "bilinear")
    ds = dataclasses.replace(
        ds,
        x_train=preprocess.resize_images(ds.x_train, target, method=method),
        x_test=preprocess.resize_images(ds.x_test, target, method=method))
  mean, std = preprocess.channel_stats(ds.x_train)
  mean, std = np.asarray(mean, np.float32), np.asarray(std, np.float32)
  module = spec.build(ds.num_classes)
  task = Classifier(module=module, input_shape=target,
                    preprocess=functools.partial(preprocess.normalize,
                                                 mean=mean, std=std),
                    num_classes=ds.num_classes)
  return Prepared(dataset=ds, task=task, spec=spec, mean=mean, std=std)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """``config.optimizer`` in {sgd, adam, adamw} with ``lr``, ``momentum``, ``weight_decay``."""
  name = config.get("optimizer", "sgd")
  lr = config.lr
  builders: dict[str, Callable[[], optax.GradientTransformation]] = {
      "sgd": lambda: optax.sgd(lr, momentum=config.get("momentum") or None),
      "adam": lambda: optax.adam(lr),
      "adamw": lambda: optax.adamw(lr, weight_decay=config.get("weight_decay", 0.0)),
  }
  if name not in builders:
    raise ValueError(f"Unknown optimizer {name!r}; expected one of {sorted(builders)}.")
  return builders[name]()


PARTITIONERS: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": partition_lib.iid,
    "pathological": partition_lib.pathological,
    "dirichlet": partition_lib.dirichlet,
    "disjoint_classes": partition_lib.disjoint_classes,
    "quantity_skew": partition_lib.quantity_skew,
}


def partition(config: ml_collections.ConfigDict, labels: np.ndarray) -> list[np.ndarray]:
  """Splits the train labels with ``config.partition`` and ``config.data_seed``."""
  p = config.partition
  if p.name not in PARTITIONERS:
    raise ValueError(f"Unknown partition {p.name!r}; expected one of {sorted(PARTITIONERS)}.")
  kwargs = {k: v for k, v in p.items() if k != "name"}
  rng = np.random.default_rng(config.data_seed)
  return PARTITIONERS[p.name](labels, config.num_clients, rng=rng, **kwargs)


def client_data(ds: sources.Dataset, parts: list[np.ndarray]) -> ClientData:
  """Stacked, padded client data moved to the device."""
  stacked = stack_clients(ds.x_train, ds.y_train, parts)
  return jax.device_put(stacked)


# Models whose training gradient XLA:CPU's classic runtime fails to compile
# (jax 0.5.3); their programs keep XLA's default runtime.
CLASSIC_RUNTIME_UNSAFE = frozenset({"resnet18"})


def client_models(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The client architectures of ``config.client_models`` (comma-separated).

  Returns ``()`` for homogeneous clients: ``client_models`` unset, empty, or
  naming only ``config.model``.
  """
  names = tuple(s.strip() for s in config.get("client_models", "").split(",")
                if s.strip())
  return names if set(names) - {config.get("model")} else ()


def classic_runtime(config: ml_collections.ConfigDict,
                    model_names: Sequence[str] | None = None) -> bool:
  """Whether the engine's per-program CPU options apply.

  Args:
    config: the experiment config (``classic_cpu_runtime`` overrides).
    model_names: the models of the programs; default every model the config
      names (``model`` and ``client_models``).
  """
  if model_names is None:
    model_names = (config.get("model"), *client_models(config))
  default = not CLASSIC_RUNTIME_UNSAFE.intersection(model_names)
  return bool(config.get("classic_cpu_runtime", default))


def clients_per_round(config: ml_collections.ConfigDict, num_clients: int) -> int:
  """``clients_per_round`` if set, else ``client_fraction`` of N (at least 1)."""
  if config.get("clients_per_round"):
    return int(config.clients_per_round)
  fraction = config.get("client_fraction", 1.0)
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"client_fraction must be in (0, 1], got {fraction}.")
  return max(1, int(round(fraction * num_clients)))


def mapper(config: ml_collections.ConfigDict,
           model_names: Sequence[str] | None = None,
           workload: str = "train") -> clients_lib.ClientMapper:
  """The client mapper; ``model_names`` as in :func:`classic_runtime`.

  ``workload`` (:data:`fedjax_dd.core.clients.WORKLOADS`) picks the measured
  default when ``config.backend`` is ``"auto"``.
  """
  return clients_lib.ClientMapper(backend=config.get("backend", "auto"),
                                  chunk_size=config.get("chunk_size") or None,
                                  classic_runtime=classic_runtime(config,
                                                                  model_names),
                                  workload=workload)


def workdir_path(workdir: str, *parts: str) -> str:
  os.makedirs(workdir, exist_ok=True)
  return os.path.join(workdir, *parts)


def model_key(config: ml_collections.ConfigDict) -> jax.Array:
  """The root model key; independent of ``config.data_seed``."""
  return jax.random.PRNGKey(config.seed)

