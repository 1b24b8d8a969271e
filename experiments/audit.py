"""Privacy audits of a run: ``--config.audit.enabled=True``, or afterwards.

Glue only: the attacks and their summary are
:mod:`fedjax_dd.audit.workdir`; this module rebuilds what they compare
against from the run's config, as its runner built it (the clients' data,
the attacker's holdout from the test split), and writes
``WORKDIR/audit.json``:

* runner ``fedd3``: the clients' uploads from the stage cache (the run's
  own, or ``fedd3.distilled_from``'s);
* runner ``federated``: the final global model from ``WORKDIR/checkpoints``.

A finished workdir is audited from its ``summary.json``'s config::

  python -m fedjax_dd.experiments.audit --workdir=DIR
  fedjax-dd-audit --workdir=DIR --holdout=200

which prints the headline figures (those a run with ``audit.enabled`` puts
into ``summary.json["audit"]``); a run and the command on its workdir give
the same numbers.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from absl import app
from absl import flags
from absl import logging
import ml_collections
import numpy as np

from fedjax_dd.audit import workdir as audit_lib
from fedjax_dd.core import checks
from fedjax_dd.core import keys
from fedjax_dd.experiments import common
from fedjax_dd.experiments.configs import base as base_config


def attacker_data(config: ml_collections.ConfigDict,
                  prepared: common.Prepared
                  ) -> tuple[np.ndarray, np.ndarray, np.random.Generator]:
  """``(holdout_x, holdout_y, rng)``: ``audit.holdout`` test examples drawn
  from ``data.seed``'s audit stream, and that stream for the non-members.

  Raises:
    common.InputError: ``audit.holdout`` above the test split's size.
  """
  ds = prepared.dataset
  rng = keys.numpy_stream(config.data.seed, keys.Stream.AUDIT)
  num_test = int(np.shape(ds.y_test)[0])
  try:
    idx = audit_lib.holdout_indices(
        num_test, config.audit.holdout, rng, name="config.audit.holdout",
        fix=f"the test split of {config.data.dataset} holds {num_test} "
        "examples; set --config.audit.holdout (0: all of them)")
  except checks.SettingError as e:
    raise common.InputError(str(e)) from None
  return ds.x_test[idx], ds.y_test[idx], rng


def _nonmembers(config, prepared, data):
  hx, hy, rng = attacker_data(config, prepared)
  try:
    return audit_lib.nonmembers(hx, hy, data, rng), int(hy.shape[0])
  except checks.SettingError as e:
    raise common.InputError(
        f"config.audit.{e}".replace("; raise it", "; raise "
                                    "--config.audit.holdout")) from None


def audit_fedd3(config: ml_collections.ConfigDict, workdir: str, *,
                prepared: common.Prepared | None = None,
                data=None) -> dict[str, Any]:
  """The audit of a FedD3 run's uploads (its stage cache), written to
  ``workdir/audit.json``; ``prepared`` and ``data`` are rebuilt as
  ``run_fedd3.run`` builds them when not given."""
  from fedjax_dd.experiments import run_fedd3  # pylint: disable=g-import-not-at-top
  if prepared is None:
    prepared = common.load_and_prepare(config)
  if data is None:
    data = common.client_data(
        prepared.dataset, common.partition(config, prepared.dataset.y_train))
  nonmembers, size = _nonmembers(config, prepared, data)
  uploads = audit_lib.load_uploads(
      config.fedd3.distilled_from or workdir,
      run_fedd3.distill_fingerprint(config), data.num_clients)
  summary = audit_lib.audit_image_uploads(
      data, nonmembers, uploads, num_classes=prepared.dataset.num_classes,
      psnr_threshold=float(config.audit.psnr_threshold),
      fprs=tuple(config.audit.fprs),
      projection_key=_projection_key(config), mapper=common.mapper(config))
  return _finish(config, workdir, summary, size)


def audit_federated(config: ml_collections.ConfigDict, workdir: str, *,
                    prepared: common.Prepared | None = None, data=None,
                    algorithm=None) -> dict[str, Any]:
  """The audit of a rounds run's final global model (its checkpoint),
  written to ``workdir/audit.json``; ``prepared``, ``data`` and
  ``algorithm`` are rebuilt as ``runners.run_federated`` builds them when
  not given."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_dd.core import fit as fit_lib  # pylint: disable=g-import-not-at-top
  from fedjax_dd.experiments import runners  # pylint: disable=g-import-not-at-top
  if prepared is None:
    prepared = common.load_and_prepare(config)
  if data is None:
    parts, _ = common.personal_split(
        config, prepared, runners._client_partition(config, prepared))  # pylint: disable=protected-access
    data = common.client_data(prepared.dataset, parts)
  if algorithm is None:
    num_steps = common.local_steps(config, data.num_examples)
    training = common.local_training(config, prepared.task,
                                     int(jnp.max(num_steps)))
    build = runners.DATA_BUILDERS.get(config.method)
    algorithm = (build(config, training, data) if build is not None
                 else runners.BUILDERS[config.method](config, training))
  nonmembers, size = _nonmembers(config, prepared, data)
  template = fit_lib.initial_state(algorithm, prepared.task, data.num_clients,
                                   seed=config.seed)
  params, batch_stats, rounds = audit_lib.load_global_model(workdir,
                                                            template)
  summary = audit_lib.audit_global_model(
      prepared.task, params, batch_stats, data, nonmembers,
      fprs=tuple(config.audit.fprs), mapper=common.mapper(config))
  summary["rounds"] = rounds
  return _finish(config, workdir, summary, size)


def _projection_key(config):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.random.fold_in(jax.random.key(int(config.data.seed)),
                            int(keys.Stream.AUDIT))


def _finish(config, workdir, summary, size):
  summary = {
      "method": config.method, "dataset": config.data.dataset,
      "holdout": {"source": "test split",
                  "requested": int(config.audit.holdout), "size": size},
      "psnr_threshold": float(config.audit.psnr_threshold),
      "fprs": list(config.audit.fprs), **summary}
  audit_lib.write_audit(workdir, summary)
  return summary


AUDITS = {"fedd3": audit_fedd3, "federated": audit_federated}
"""The audit of each runner of ``common.AUDIT_RUNNERS``."""


def audit_run(config: ml_collections.ConfigDict, workdir: str,
              **built) -> dict[str, Any]:
  """The runner's audit (:data:`AUDITS`); returns the headline figures
  for ``summary.json["audit"]``."""
  return audit_lib.headline(AUDITS[config.runner](config, workdir, **built))


def finished_config(workdir: str) -> ml_collections.ConfigDict:
  """The config of a finished run, from ``workdir/summary.json``, with the
  ``audit`` group's defaults where the run predates it.

  Raises:
    common.InputError: no readable ``summary.json``, or a runner without an
      audit.
  """
  path = os.path.join(workdir, "summary.json")
  try:
    with open(path, encoding="utf-8") as f:
      recorded = json.load(f)["config"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise common.InputError(
        f"{path} cannot be read as a finished run's summary ({type(e).__name__}"
        f": {e}); audit a workdir whose run finished.") from None
  config = ml_collections.ConfigDict(recorded)
  defaults = base_config.base(method="", dataset="", model="").audit
  if "audit" not in config:
    config.audit = defaults
  for k, v in defaults.items():
    if k not in config.audit:
      config.audit[k] = v
  if config.get("runner") not in AUDITS:
    raise common.InputError(
        f"{workdir} holds a run of runner {config.get('runner')!r}, which "
        f"has no audit yet (runners {', '.join(AUDITS)}).")
  return config


def _define_flags() -> None:
  """The command's flags, defined when it runs (the entry point, imported
  beside this module, has its own ``--workdir``)."""
  flags.DEFINE_string("workdir", None, "A finished run's directory.")
  flags.DEFINE_integer(
      "holdout", None, "Test examples the attacker holds (0: all); "
      "default: the run's audit.holdout.")
  flags.DEFINE_float(
      "psnr_threshold", None, "dB at or above which an image counts as "
      "reconstructed; default: the run's audit.psnr_threshold.")
  flags.mark_flags_as_required(["workdir"])


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  if not f["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # Orbax logs every restore
  workdir = (f.workdir or "").strip()
  if not workdir:
    raise app.UsageError("--workdir is empty; give a finished run's "
                         "directory, e.g. --workdir=workdir/run1.")
  try:
    config = finished_config(workdir)
    if f.holdout is not None:
      config.audit.holdout = f.holdout
    if f.psnr_threshold is not None:
      config.audit.psnr_threshold = f.psnr_threshold
    common.check_audit(config)
    headline = audit_run(config, workdir)
  except (ValueError, FileNotFoundError) as e:
    # One line (InputError, SettingError, StaleStageError are ValueErrors).
    sys.stderr.write(f"FATAL {e}\n")
    sys.exit(1)
  print(json.dumps(headline, indent=2, sort_keys=True))


def run() -> None:
  """Console-script entry point (``fedjax-dd-audit``)."""
  _define_flags()
  app.run(main)


if __name__ == "__main__":
  run()
