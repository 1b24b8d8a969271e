"""Every method the command line runs, each declared once.

A method is one :class:`Method`, declared with :func:`declare` next to the
glue that builds it: its name, its shape (a rounds method, a server-side
distillation after the shared one-shot client stage, or a host pipeline
with its own driver), its hyperparameter dataclass and config group, and
the data its builder needs. From it follow its runner (:func:`run`), its
config group (:func:`hparams_group`), its validation before the data loads
(:func:`check_method`) and its fingerprint (the group's keys are config
leaves, so a resume with other settings is refused).

A method defined outside this package declares itself in its own module,
which its config file imports::

  # fedavgm.py
  @dataclasses.dataclass(frozen=True)
  class FedAvgM:
    server_lr: float = 1.0
    momentum: float = 0.9

  registry.declare(registry.Method(
      "fedavgm", hparams=FedAvgM,
      rounds=lambda config, training, hparams: fedavg(
          training, server_optimizer=optax.sgd(hparams.server_lr,
                                               momentum=hparams.momentum))))

The built-in declarations live in the modules of :data:`_BUILT_IN`,
imported on the first lookup; this module imports no runner at import
time, so every runner module can import it.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
from typing import Any, Callable

import ml_collections
from ml_collections import config_dict

# The runner of each shape; a pipeline names its own.
FEDERATED = "federated"
ONE_SHOT = "fedhydra"

# What a builder may ask for besides the config (``Method.needs``):
# ``client_data``: the clients' data before round 1 (PACFL's subspaces).
NEEDS = ("client_data",)

# The modules whose import declares the built-in methods.
_BUILT_IN = ("runners", "stage_builders", "run_fedd3", "run_hfldd",
             "run_fedseq", "run_quickstart")

Runner = Callable[[ml_collections.ConfigDict, str], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Method:
  """One method, declared once.

  At least one of ``rounds``, ``server`` and ``pipeline`` is set; a method
  may have a rounds and a server form (one-shot FedAvg), the config's
  ``runner`` then picks.

  Attributes:
    name: the config's ``method``.
    rounds: ``(config, training, **inputs) -> FederatedAlgorithm``, driven
      by the shared rounds loop; ``training`` is the run's
      :class:`~fedjax_dd.core.local.LocalTraining`.
    server: ``(config, stage, groups, task, input_fn, **inputs) ->
      ServerDistillation``, after the shared one-shot client stage
      (:func:`fedjax_dd.algorithms.one_shot.client_stage`).
    pipeline: ``(config, workdir) -> summary``, a host pipeline with its own
      driver (FedD3's distillation, HFLDD's clusters).
    runner: a pipeline's runner name (its configs' ``runner``; default
      ``name``).
    hparams: the method's hyperparameter dataclass: its config group
      (``group``) holds one key per field, and the builder receives
      ``hparams=`` the dataclass built from it.
    group: the config group of ``hparams`` (default ``name``).
    needs: inputs of the builder from :data:`NEEDS` (``client_data`` is
      passed as ``data=``).
    server_epochs: a server method trains for ``dfkd.distill_epochs``
      epochs a round (none: one step, an average or a transport).
    summary_fields: ``(config, num_clients, rounds) -> fields`` the summary
      adds after the run (DP-FedAvg's epsilon).
    check: ``check(config)`` raises ``ValueError`` (one line naming the
      ``--config`` setting to change) on settings the method cannot run,
      before the data loads.
  """
  name: str
  rounds: Callable[..., Any] | None = None
  server: Callable[..., Any] | None = None
  pipeline: Runner | None = None
  runner: str = ""
  hparams: type | None = None
  group: str = ""
  needs: tuple[str, ...] = ()
  server_epochs: bool = False
  summary_fields: Callable[..., dict[str, Any]] | None = None
  check: Callable[[ml_collections.ConfigDict], None] | None = None

  def __post_init__(self):
    if not self.name or not isinstance(self.name, str):
      raise ValueError(f"Method.name must be a non-empty string, got "
                       f"{self.name!r}.")
    if self.rounds is None and self.server is None and self.pipeline is None:
      raise ValueError(f"Method {self.name!r} needs a rounds, server or "
                       "pipeline builder.")
    if self.pipeline is not None and (self.rounds or self.server):
      raise ValueError(f"Method {self.name!r}: a pipeline has no rounds or "
                       "server form.")
    unknown = sorted(set(self.needs) - set(NEEDS))
    if unknown:
      raise ValueError(f"Method {self.name!r}: needs {unknown} are not in "
                       f"{list(NEEDS)}.")
    if self.hparams is not None and not dataclasses.is_dataclass(
        self.hparams):
      raise ValueError(f"Method {self.name!r}: hparams must be a dataclass, "
                       f"got {self.hparams!r}.")
    if self.group and self.hparams is None:
      raise ValueError(f"Method {self.name!r}: group {self.group!r} without "
                       "an hparams dataclass.")

  @property
  def runners(self) -> tuple[str, ...]:
    """The runners (configs' ``runner`` values) that drive this method."""
    if self.pipeline is not None:
      return (self.runner or self.name,)
    return tuple(r for r, f in ((FEDERATED, self.rounds),
                                (ONE_SHOT, self.server)) if f is not None)

  @property
  def config_group(self) -> str | None:
    """The config group of :attr:`hparams` (``None`` without one)."""
    return (self.group or self.name) if self.hparams is not None else None


_DECLARED: dict[str, Method] = {}
_OWNERS: dict[str, str] = {}
_loaded = False


def declare(method: Method) -> Method:
  """Declares ``method`` and returns it; declaring its name again from the
  same module (loaded twice) replaces it, from another module is refused.

  Raises:
    ValueError: the name is declared by another module (a built-in method
      cannot be replaced).
  """
  owner = next(f for f in (method.rounds, method.server, method.pipeline)
               if f is not None).__module__
  if method.name in _DECLARED and _OWNERS[method.name] != owner:
    raise ValueError(f"method {method.name!r} is declared by "
                     f"{_OWNERS[method.name]}; declare another name.")
  _DECLARED[method.name] = method
  _OWNERS[method.name] = owner
  return method


def _load_built_ins() -> None:
  global _loaded
  if not _loaded:
    _loaded = True
    for module in _BUILT_IN:
      importlib.import_module(f"fedjax_dd.experiments.{module}")


def get(name: str) -> Method:
  """The declaration of method ``name``.

  Raises:
    KeyError: no such method.
  """
  _load_built_ins()
  if name not in _DECLARED:
    raise KeyError(f"No method {name!r} is declared; declared: "
                   f"{sorted(_DECLARED)}.")
  return _DECLARED[name]


def methods(runner: str | None = None) -> tuple[str, ...]:
  """The declared methods (those ``runner`` drives), sorted."""
  _load_built_ins()
  return tuple(sorted(n for n, m in _DECLARED.items()
                      if runner is None or runner in m.runners))


def runner_names() -> tuple[str, ...]:
  """Every runner a declared method names."""
  _load_built_ins()
  return tuple(sorted({r for m in _DECLARED.values() for r in m.runners}))


def hparams_group(cls: type, *, exclude: tuple[str, ...] = (),
                  **defaults: Any) -> ml_collections.ConfigDict:
  """The config group of hyperparameter dataclass ``cls``: one key per
  field, its default (a field without one is refused).

  Args:
    cls: the dataclass.
    exclude: fields the glue derives from other keys (no key of their own).
    **defaults: the group's own default of a field, where the config's
      scale differs from the dataclass's.
  """
  unknown = sorted((set(exclude) | set(defaults))
                   - {f.name for f in dataclasses.fields(cls)})
  if unknown:
    raise ValueError(f"{cls.__name__} has no fields {unknown}.")
  values = {}
  for f in dataclasses.fields(cls):
    if f.name in exclude:
      continue
    if f.name in defaults:
      values[f.name] = defaults[f.name]
    elif f.default is None:
      # A typed placeholder, so that --config.<group>.<field>=V parses.
      values[f.name] = config_dict.placeholder(_optional_type(f))
    elif f.default is not dataclasses.MISSING:
      values[f.name] = f.default
    elif f.default_factory is not dataclasses.MISSING:
      values[f.name] = f.default_factory()
    else:
      raise ValueError(f"{cls.__name__}.{f.name} has no default; a config "
                       "group needs one per field.")
  return ml_collections.ConfigDict(values)


def _optional_type(f: dataclasses.Field) -> type:
  """``T`` of a field annotated ``T | None`` (``Optional[T]``)."""
  names = str(f.type).replace("Optional[", "").replace("]", "").split("|")
  types = {"float": float, "int": int, "str": str, "bool": bool}
  for name in names:
    if name.strip() in types:
      return types[name.strip()]
  raise ValueError(f"{f.name}: a field whose default is None needs a type "
                   f"of {sorted(types)} or None, got {f.type!r}.")


def add_group(config: ml_collections.ConfigDict, name: str, *,
              set_method: bool = True) -> ml_collections.ConfigDict:
  """``config`` with ``method = name`` (unless not ``set_method``) and
  method ``name``'s hparams group (:func:`hparams_group`), if it declares
  one."""
  method = get(name)
  if set_method:
    config.method = name
  if method.config_group is not None:
    config[method.config_group] = hparams_group(method.hparams)
  return config


def hparams(config: ml_collections.ConfigDict,
            method: Method | None = None) -> Any:
  """The method's hyperparameter dataclass built from its config group
  (``None`` for a method without one).

  Raises:
    ValueError: the group is missing, holds a key that is not a field, or a
      value the dataclass refuses; one line naming ``--config.<group>``.
  """
  method = method or get(config.method)
  group = method.config_group
  if group is None:
    return None
  if group not in config:
    raise ValueError(f"Method {method.name!r} reads config group {group!r}, "
                     "which this config does not have; build the config with "
                     f"registry.add_group(config, {method.name!r}).")
  section = config[group]
  fields = {f.name for f in dataclasses.fields(method.hparams)}
  stray = sorted(set(section.keys()) - fields)
  if stray:
    raise ValueError(f"config.{group} holds {stray}, which are not fields of "
                     f"{method.hparams.__name__}; remove them.")
  try:
    return method.hparams(**{k: section[k] for k in section.keys()})
  except (TypeError, ValueError) as e:
    raise ValueError(field_message(group, e)) from None


_FIELD = re.compile(r"^(?:\w+\.)?(\w+) (must .*)$", re.S)


def field_message(group: str, error: Exception) -> str:
  """A group's dataclass refusal (``"FIELD must ..."``) as the command
  line's one line: ``config.GROUP.FIELD must ...; set
  --config.GROUP.FIELD.``."""
  text = str(error)
  m = _FIELD.match(text)
  if m is None:
    return f"config.{group}: {text} Set the --config.{group}.* setting it names."
  field, rest = m.groups()
  return (f"config.{group}.{field} {rest.rstrip('.')}; set "
          f"--config.{group}.{field}.")


def _check_declared(config: ml_collections.ConfigDict,
                    method: Method) -> Any:
  """The method's hyperparameters (:func:`hparams`), after its own
  ``check``: what every path to its builder refuses."""
  built = hparams(config, method)
  if method.check is not None:
    method.check(config)
  return built


def build_inputs(config: ml_collections.ConfigDict, method: Method, *,
                 data=None) -> dict[str, Any]:
  """The keyword inputs of ``method``'s builder: ``hparams`` and what it
  ``needs``, after :func:`check_method`'s refusals, so a builder reached
  without the entry point refuses what the entry point does."""
  inputs = {}
  built = _check_declared(config, method)
  if method.hparams is not None:
    inputs["hparams"] = built
  if "client_data" in method.needs:
    inputs["data"] = data
  return inputs


def build_rounds(config: ml_collections.ConfigDict, training, data=None):
  """The ``FederatedAlgorithm`` of ``config.method``'s rounds form."""
  method = get(config.method)
  return method.rounds(config, training,
                       **build_inputs(config, method, data=data))


def check_method(config: ml_collections.ConfigDict) -> None:
  """Refuses, before the data loads, a ``runner`` or ``method`` no
  declaration has, a method of another runner (``--config.method=fedd3`` on
  a FedAvg config), naming the config file to use, and hyperparameters its
  dataclass refuses.

  Raises:
    ValueError: one line with the fix.
  """
  if "runner" not in config:
    raise ValueError("The config must set `runner` (see "
                     "experiments/registry.py).")
  runners = runner_names()
  if config.runner not in runners:
    raise ValueError(f"config.runner must be one of {list(runners)}, got "
                     f"{config.runner!r}; set --config.runner or use the "
                     "config file of the method.")
  method = config.get("method")
  own = methods(config.runner)
  if method in own:
    _check_declared(config, get(method))
    return
  elsewhere = [r for r in runners if method in methods(r)]
  if elsewhere:
    configs = os.path.join(os.path.dirname(__file__), "configs")
    name = (f"experiments/configs/{method}.py" if os.path.isfile(
        os.path.join(configs, f"{method}.py")) else
            f"a config of runner {elsewhere[0]!r}")
    raise ValueError(
        f"config.method={method!r} runs under runner {elsewhere[0]!r}, not "
        f"this config's {config.runner!r}, whose groups it does not have: "
        f"use --config={name}:<preset> (e.g. :smoke) instead of "
        "--config.method.")
  raise ValueError(
      f"config.method must be one of {list(own)} for runner "
      f"{config.runner!r}, got {method!r}; set --config.method (a new "
      "method declares itself, registry.declare, in a module its config "
      "imports).")


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs ``config`` by its method's declaration, under ``config.runner``,
  after :func:`check_method`."""
  check_method(config)
  method = get(config.method)
  if method.pipeline is not None:
    return method.pipeline(config, workdir)
  # pylint: disable=g-import-not-at-top
  if config.runner == FEDERATED:
    from fedjax_dd.experiments import runners
    return runners.run_federated(config, workdir)
  from fedjax_dd.experiments import run_fedhydra
  return run_fedhydra.run(config, workdir)


def run_recorded(config: ml_collections.ConfigDict, workdir: str
                 ) -> dict[str, Any]:
  """:func:`run` after recording the run's fingerprint in ``workdir``, as
  the entry point does: a resume with other settings is refused, and
  files written before the rounds (HFLDD's stage cache) are not taken for
  an unrecorded run's."""
  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core import workdir as workdir_lib
  from fedjax_dd.experiments import common
  workdir_lib.record_fingerprint(workdir, common.fingerprint(config))
  return run(config, workdir)
