"""The runner table: a config's ``runner`` field -> ``run(config, workdir)``.

``RUNNERS`` maps each runner to a function ``(config, workdir) -> summary``:
``federated`` (every FedAvg-family method, :func:`fedjax_dd.experiments.
runners.run_federated`, whose method builders :func:`~fedjax_dd.experiments.
runners.register` extends) and one ``run_*`` module per other runner.

This module sits above every runner: the ``run_*`` modules import
:mod:`fedjax_dd.experiments.runners` for the shared glue and never this
table, so the imports have no cycle. They are imported on first use, so one
method's dependencies never slow down or break another's start-up. The
quickstart runs its members through this table, which it is handed
(:func:`fedjax_dd.experiments.run_quickstart.run`'s ``run_member``).
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable

import ml_collections

from fedjax_dd.core import workdir as workdir_lib
from fedjax_dd.experiments import common
from fedjax_dd.experiments import runners

Runner = Callable[[ml_collections.ConfigDict, str], dict[str, Any]]


def _lazy(module: str) -> Runner:
  """``run(config, workdir)`` of ``fedjax_dd.experiments.<module>``,
  imported on the first call."""

  def run(config, workdir):
    return importlib.import_module(f"fedjax_dd.experiments.{module}").run(
        config, workdir)

  return run


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs ``config`` through its runner, ``RUNNERS[config.runner]``."""
  return RUNNERS[config.runner](config, workdir)


def run_recorded(config: ml_collections.ConfigDict, workdir: str
                 ) -> dict[str, Any]:
  """:func:`run` after recording what defines the run in ``workdir``, as the
  entry point does for its own: a member of a comparison resumed with other
  settings is refused, and one whose runner writes files before its rounds
  (HFLDD's stage cache) is not taken for a run made before settings were
  recorded."""
  workdir_lib.record_fingerprint(workdir, common.fingerprint(config))
  return run(config, workdir)


def _quickstart(config, workdir):
  module = importlib.import_module("fedjax_dd.experiments.run_quickstart")
  return module.run(config, workdir, run_member=run_recorded)


# The methods each runner other than `federated` and `fedhydra` runs (those
# two read their builder tables): a method no runner has is refused before
# the data loads, naming the runner and the config file that has it.
_RUNNER_METHODS: dict[str, tuple[str, ...]] = {
    "fedd3": ("fedd3", "fedd3_hybrid"),
    "hfldd": ("hfldd", "hfldd_random", "hfldd_wodd"),
    "fedseq": ("fedseq",),
    "quickstart": ("quickstart",),
}


def methods(runner: str) -> tuple[str, ...]:
  """The ``method`` values ``runner`` runs (registered ones included)."""
  if runner == "federated":
    return tuple(sorted({*runners.BUILDERS, *runners.DATA_BUILDERS}))
  if runner == "fedhydra":
    # pylint: disable-next=g-import-not-at-top
    from fedjax_dd.experiments import stage_builders
    return tuple(sorted(stage_builders.SERVER_METHODS))
  return _RUNNER_METHODS.get(runner, ())


def check_method(config: ml_collections.ConfigDict) -> None:
  """Refuses, before the data loads, a ``runner`` or ``method`` no runner
  has, or a method of another runner (``--config.method=fedd3`` on a FedAvg
  config), naming the config file to use.

  Raises:
    ValueError: one line with the fix.
  """
  if "runner" not in config:
    raise ValueError("The config must set `runner` (see "
                     "experiments/registry.py).")
  if config.runner not in RUNNERS:
    raise ValueError(f"config.runner must be one of {sorted(RUNNERS)}, got "
                     f"{config.runner!r}; set --config.runner or use the "
                     "config file of the method.")
  method = config.get("method")
  own = methods(config.runner)
  if method in own:
    return
  elsewhere = [r for r in RUNNERS if r != config.runner
               and method in methods(r)]
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
      "method registers itself in its config file, runners.register).")


RUNNERS: dict[str, Runner] = {
    "federated": runners.run_federated,
    "fedd3": _lazy("run_fedd3"),
    "hfldd": _lazy("run_hfldd"),
    "fedseq": _lazy("run_fedseq"),
    "fedhydra": _lazy("run_fedhydra"),
    "quickstart": _quickstart,
}
