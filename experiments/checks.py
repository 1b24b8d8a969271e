"""Value checks of a config that run before the dataset loads.

:func:`fedjax_dd.experiments.common.validate` calls :func:`check_values`
after its own checks. Each check stands in for a library check that would
fire only after the data loaded (a partition's ``alpha``,
``iga.iterations``, the optimizer's name, ...), so a wrong setting costs
seconds and its message names the ``--config.<path>`` to change. The
refusals are the library's (:mod:`fedjax_dd.core.checks`): an options
dataclass (:class:`fedjax_dd.distill.iga.IGAHyperParams`,
:class:`fedjax_dd.distill.kip.KipOptions`) is built from its group, its
message re-worded; the other ranges are repeated in :func:`_ranges`.
"""

from __future__ import annotations

import os
from typing import Any

import ml_collections

from fedjax_dd.core import checks

# One name per optimizer of common.make_optimizer.
OPTIMIZERS = ("sgd", "adam", "adamw")


def _lookup(config: ml_collections.ConfigDict, path: str) -> Any:
  node = config
  for part in path.split("."):
    if not hasattr(node, "keys") or part not in node:
      return None  # a group or key this config does not have
    node = node[part]
  return node


def _fail(path: str, want: str, value: Any) -> None:
  checks.refuse(f"config.{path}", want, value, f"set --config.{path}")


_is_int = checks.is_int


def _int(path: str, value: Any, low: int, high: int | None = None) -> None:
  checks.check_int(f"config.{path}", value, low, high,
                   fix=f"set --config.{path}")


def _number(path: str, value: Any, low: float | None, high: float | None,
            *, low_open: bool = False, high_open: bool = False) -> None:
  checks.check_number(f"config.{path}", value, low, high, low_open=low_open,
                      high_open=high_open, fix=f"set --config.{path}")


def _choice(path: str, value: Any, choices) -> None:
  checks.check_choice(f"config.{path}", value, choices,
                      fix=f"set --config.{path}")


# (path, kind, bounds) of settings whose library check runs after the data
# loads. Kinds: "int" (low, high or None), "num" (low, high, low open, high
# open), "choice" (a callable returning the names, imported on use).
def _ranges() -> tuple[tuple[str, str, tuple], ...]:
  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core import clients
  from fedjax_dd.core import keys
  from fedjax_dd.data import partition
  from fedjax_dd.data import preprocess
  from fedjax_dd.distill import dfkd
  from fedjax_dd.distill import ensemble
  # pylint: enable=g-import-not-at-top
  return (
      # A JAX key holds 32 bits of its seed (core.keys.check_seed).
      ("seed", "int", (0, keys.SEED_LIMIT - 1)),
      ("data.seed", "int", (0, keys.SEED_LIMIT - 1)),
      ("data.num_classes", "int", (0, None)),  # 0: inferred
      ("data.resplit", "num", (0.0, 1.0, False, True)),
      ("data.resize_method", "choice", preprocess._RESIZE_METHODS),  # pylint: disable=protected-access
      ("data.aux_size", "int", (0, None)),
      ("data.public_size", "int", (0, None)),
      ("data.partition.alpha", "num", (0.0, None, True, False)),
      ("data.partition.min_size", "int", (1, None)),
      ("data.partition.num_classes_per_client", "int", (1, None)),
      ("data.partition.style", "choice", partition._STYLES),  # pylint: disable=protected-access
      ("data.partition.client_size", "int", (0, None)),
      ("data.partition.classes_per_client", "int", (1, None)),
      ("data.partition.sigma", "num", (0.0, None, False, False)),
      ("model.proj_dim", "int", (0, None)),
      ("client.optimizer", "choice", OPTIMIZERS),
      ("client.clients_per_round", "int", (0, None)),
      ("client.client_fraction", "num", (0.0, 1.0, True, False)),
      ("client.activity", "num", (0.0, 1.0, False, False)),
      ("client.pretrain_batch_size", "int", (1, None)),
      ("client.pretrain_epochs", "num", (0.0, None, False, False)),
      ("client.pretrain_steps", "int", (0, None)),
      ("client.mu", "num", (0.0, None, False, False)),
      ("engine.backend", "choice", ("auto", *clients.BACKENDS)),
      ("engine.chunk_size", "int", (0, None)),
      ("engine.run_chunk_size", "int", (0, None)),
      # 0: no budget; a negative budget is not "none" (core.checks).
      ("run.max_wall_seconds", "num", (0.0, None, False, False)),
      ("server.seed", "int", (-1, keys.SEED_LIMIT - 1)),
      ("iga.nz", "int", (1, None)),
      ("iga.ngf", "int", (1, None)),
      ("dfkd.nz", "int", (1, None)),
      ("dfkd.ngf", "int", (1, None)),
      ("dfkd.synthetic_batch_size", "int", (1, None)),
      ("dfkd.generator_steps", "int", (1, None)),
      ("dfkd.student_steps", "int", (0, None)),
      ("dfkd.pool_size", "int", (0, None)),
      ("dfkd.stratify_steps", "int", (1, None)),
      ("dfkd.stratify_batch_size", "int", (1, None)),
      ("dfkd.feddf_steps", "int", (1, None)),
      ("dfkd.augment_shift", "int", (0, None)),
      ("dfkd.aggregation", "choice", ("sa", "ae", "sa_predicted")),
      ("dfkd.adv_mask", "choice", ensemble.ADV_MASKS),
      ("dfkd.protocol", "choice", dfkd.PROTOCOLS),
      ("dfkd.temperature", "num", (0.0, None, True, False)),
      ("dfkd.lambda_bn", "num", (0.0, None, False, False)),
      ("dfkd.lambda_adv", "num", (0.0, None, False, False)),
      ("dfkd.beta", "num", (0.0, None, False, False)),
      ("dfkd.generator_b1", "num", (0.0, 1.0, False, True)),
      ("kip.kernel_depth", "int", (0, None)),
      ("kip.kernel_kind", "choice", ("ntk", "nngp")),
      ("kip.kernel_batch", "int", (0, None)),
  )


def _check_ranges(config: ml_collections.ConfigDict) -> None:
  for path, kind, bounds in _ranges():
    value = _lookup(config, path)
    if value is None:
      continue
    if kind == "int":
      _int(path, value, *bounds)
    elif kind == "num":
      low, high, low_open, high_open = bounds
      _number(path, value, low, high, low_open=low_open, high_open=high_open)
    else:
      _choice(path, value, bounds)


def _check_datasets(config: ml_collections.ConfigDict) -> None:
  """Dataset names the run loads later (public and auxiliary sets)."""
  from fedjax_dd.data import sources  # pylint: disable=g-import-not-at-top
  if _lookup(config, "method") == "feddf" and not _lookup(
      config, "data.public_data"):
    _fail("data.public_data", "a dataset name or 'npz:PATH' (FedDF "
          "distils on its unlabelled images)", "")
  for path, size in (("data.dataset", None),
                     ("data.public_data", "data.public_size"),
                     ("data.aux_dataset", "data.aux_size")):
    spec = _lookup(config, path)
    if not spec:
      continue
    if (size is None and isinstance(spec, str) and sources.npz_path(spec)
        and not os.path.lexists(sources.npz_path(spec))):
      # The training set's loader names a missing file itself; presets of
      # the real datasets validate where ../shared/datasets is absent.
      continue
    try:
      sources.check_name(spec)
    except ValueError as e:
      raise ValueError(f"config.{path}: {e} Set --config.{path}.") from None
    if size is not None and _lookup(config, size) == 0:
      _fail(size, f"an int >= 1 (images drawn from {path}={spec!r})", 0)


def _known_model(name: str) -> bool:
  """Whether the model registry builds ``name`` (its own lookup, which may
  accept derived names beyond :data:`fedjax_dd.models.MODELS`)."""
  from fedjax_dd import models  # pylint: disable=g-import-not-at-top
  try:
    models.get_model(name)
  except (ValueError, KeyError):
    return False
  return True


def _check_models(config: ml_collections.ConfigDict) -> None:
  from fedjax_dd import models  # pylint: disable=g-import-not-at-top
  name = _lookup(config, "model.name")
  if name is not None and not _known_model(name):
    _fail("model.name", f"one of {sorted(models.MODELS)}", name)
  init = _lookup(config, "model.init")
  if init is not None and init not in models.param_init.INIT_SCHEMES:
    _fail("model.init", f"one of {sorted(models.param_init.INIT_SCHEMES)}",
          init)
  proj_dim = _lookup(config, "model.proj_dim")
  if proj_dim and name not in models.PROJECTED:
    _fail("model.proj_dim",
          f"0 for model {name!r} (it sets the width of MOON's projection "
          "head, which only a '<name>_proj' model has)", proj_dim)
  names = _lookup(config, "model.client_models")
  if not names:
    return
  for name in (s.strip() for s in str(names).split(",")):
    if name and not _known_model(name):
      _fail("model.client_models",
            f"comma-separated names of {sorted(models.MODELS)}", names)


def _check_input_shape(config: ml_collections.ConfigDict) -> None:
  shape = _lookup(config, "data.input_shape")
  if shape is None or tuple(shape) == ():
    return
  if len(tuple(shape)) != 3 or not all(_is_int(v) and v >= 1 for v in shape):
    _fail("data.input_shape", "() (the model's) or (H, W, Ch) of positive "
          "ints", tuple(shape))


def _check_sampling(config: ml_collections.ConfigDict) -> None:
  per_round = _lookup(config, "client.clients_per_round")
  num_clients = _lookup(config, "data.num_clients")
  if per_round and num_clients and per_round > num_clients:
    raise ValueError(
        f"config.client.clients_per_round must be at most "
        f"config.data.num_clients = {num_clients} (0: client_fraction of "
        f"them), got {per_round}; set --config.client.clients_per_round.")
  activity = _lookup(config, "client.activity")
  if activity and num_clients:
    from fedjax_dd.core import cohorts  # pylint: disable=g-import-not-at-top
    try:
      cohorts.BernoulliCohort(float(activity)).validate(int(num_clients))
    except ValueError as e:
      raise ValueError(f"config.client.activity: {e} Set "
                       "--config.client.activity.") from None
  clusters = _lookup(config, "ifca.num_clusters")
  if clusters and num_clients and clusters > num_clients:
    raise ValueError(
        f"config.ifca.num_clusters must be at most config.data.num_clients "
        f"= {num_clients}, got {clusters}; set --config.ifca.num_clusters.")


def _options(group: str, section: ml_collections.ConfigDict) -> None:
  """Builds the library's options from the config group ``section``
  (:mod:`fedjax_dd.experiments.sections`; their checks run in
  ``__post_init__``); a refusal names ``config.<group>.<field>``."""
  from fedjax_dd.experiments import registry  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments import sections  # pylint: disable=g-import-not-at-top
  try:
    getattr(sections, group)(section)
  except (ValueError, TypeError) as e:
    raise ValueError(registry.field_message(group, e)) from None


def _check_options(config: ml_collections.ConfigDict) -> None:
  i = _lookup(config, "iga")
  if i is not None and i.enabled:
    _options("iga", i)
  k = _lookup(config, "kip")
  if k is not None:
    _options("kip", k)


def _check_teachers_from(config: ml_collections.ConfigDict) -> None:
  path = _lookup(config, "server.teachers_from")
  if not path:
    return
  from fedjax_dd.core import server  # pylint: disable=g-import-not-at-top
  try:
    server.check_teachers_from(str(path))
  except server.TeachersFromError as e:
    raise ValueError(f"config.server.{e} Set --config.server.teachers_from."
                     ) from None


def check_one_shot(config: ml_collections.ConfigDict, methods: list[str],
                   archs: tuple[str, ...]) -> None:
  """The one-shot runner's refusals: a method it has, one round with
  independent or heterogeneous clients (``archs``, the client architectures
  besides ``model.name``), no parameter average across architectures."""
  if config.method not in methods:
    raise ValueError(f"Unknown method {config.method!r} for the fedhydra "
                     f"runner; expected one of {methods}.")
  if archs and config.method == "os_fedavg":
    raise ValueError(
        "One-shot FedAvg averages parameters, which is undefined across the "
        f"client architectures model.client_models="
        f"{config.model.client_models!r}; use "
        "fedhydra, dense or feddf, or homogeneous clients.")
  if config.client.independent_init and config.rounds > 1:
    raise ValueError(
        "config.client.independent_init needs rounds = 1: from round 2 the "
        f"clients start from the distilled model (got rounds = "
        f"{config.rounds}); set --config.rounds=1.")
  if archs and config.rounds > 1:
    raise ValueError(
        "Heterogeneous clients (model.client_models) need rounds=1: the "
        f"distilled {config.model.name!r} cannot seed clients of other "
        "architectures.")


def check_values(config: ml_collections.ConfigDict) -> None:
  """Refuses, before the dataset loads, settings the library would refuse
  later: numeric ranges and names (:func:`_ranges`), public and auxiliary
  dataset names, client models, sampling counts and the IGA / KIP options.

  Raises:
    ValueError: one line naming ``config.<path>``, what it must be and the
      value given, and the ``--config.<path>`` to set.
  """
  _check_ranges(config)
  _check_models(config)
  _check_input_shape(config)
  _check_sampling(config)
  _check_datasets(config)
  _check_options(config)
  _check_teachers_from(config)
