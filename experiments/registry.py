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


RUNNERS: dict[str, Runner] = {
    "federated": runners.run_federated,
    "fedd3": _lazy("run_fedd3"),
    "hfldd": _lazy("run_hfldd"),
    "fedseq": _lazy("run_fedseq"),
    "fedhydra": _lazy("run_fedhydra"),
    "quickstart": _quickstart,
}
