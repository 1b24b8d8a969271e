"""Privacy audits of a run: ``--config.audit.enabled=True``, or afterwards.

The command: the attacks are :mod:`fedjax_dd.audit.workdir`, the runners'
glue to them :mod:`fedjax_dd.experiments.auditing` (one audit per runner,
``AUDITS``); this module rebuilds what they compare against from a finished
run's config, as its runner built it, and writes ``WORKDIR/audit.json``. A
one-shot run is audited by resuming it with the audit on (every stage
restores; nothing trains again). A finished workdir is audited from its
``summary.json``'s config::

  python -m fedjax_dd.experiments.audit --workdir=DIR
  fedjax-dd-audit --workdir=DIR --holdout=200

which prints the headline figures (those a run with ``audit.enabled`` puts
into ``summary.json["audit"]``); a run and the command on its workdir give
the same numbers, SSIM to float rounding.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from absl import app
from absl import flags
from absl import logging
import ml_collections

from fedjax_dd.core import workdir as workdir_lib
from fedjax_dd.experiments import auditing
from fedjax_dd.experiments import common


def _built(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """What the run's runner built, built again from its config: the
  prepared task, the clients' data and, for a rounds run, the algorithm
  (as ``runners.run_federated`` builds them); a FedD3 audit rebuilds its
  own."""
  if config.runner != "federated":
    return {}
  # pylint: disable-next=g-import-not-at-top
  import jax.numpy as jnp
  # pylint: disable-next=g-import-not-at-top
  from fedjax_dd.experiments import registry
  # pylint: disable-next=g-import-not-at-top
  from fedjax_dd.experiments import runners
  prepared = common.load_and_prepare(config)
  parts, _ = common.personal_split(
      config, prepared, runners._client_partition(config, prepared))  # pylint: disable=protected-access
  data = common.client_data(prepared.dataset, parts)
  num_steps = common.local_steps(config, data.num_examples)
  training = common.local_training(config, prepared.task,
                                   int(jnp.max(num_steps)))
  algorithm = registry.build_rounds(config, training, data)
  return {"prepared": prepared, "data": data, "algorithm": algorithm}


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
    config = auditing.finished_config(workdir)
    if f.holdout is not None:
      config.audit.holdout = f.holdout
    if f.psnr_threshold is not None:
      config.audit.psnr_threshold = f.psnr_threshold
    common.check_audit(config)
    # The run's own lock: the audit writes audit.json, and a one-shot
    # run's audit resumes the run, so no run may write the workdir now.
    with workdir_lib.WorkdirLock(workdir):
      headline = auditing.audit_run(config, workdir, **_built(config))
  except (ValueError, FileNotFoundError, workdir_lib.WorkdirBusyError,
          NotADirectoryError, PermissionError) as e:
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
