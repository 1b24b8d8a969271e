r"""The one entry point: ``fedjax-dd --config=CONFIG[:ARG] --workdir=DIR``.

Examples::

  fedjax-dd --config=experiments/configs/centralized.py:digits --workdir=/tmp/c
  fedjax-dd --config=experiments/configs/fedavg.py:mnist_iid --workdir=/tmp/f \
      --config.rounds=5

Writes ``DIR/metrics.jsonl`` (one JSON object per evaluation round) and
``DIR/summary.json``. Re-running with the same ``--workdir`` resumes from the
newest good checkpoint in ``DIR/checkpoints``.

``--seeds=0,1,2`` runs the config once per seed (``seed`` and ``data_seed``
both set to it) in ``DIR/seed_<S>`` and writes ``DIR/sweep.md``,
``DIR/sweep.json`` and ``DIR/sweep_curves.png`` (mean ± sd over the seeds);
see ``fedjax_dd.experiments.sweep``::

  fedjax-dd --config=experiments/configs/fedavg.py:smoke --workdir=/tmp/sw \
      --seeds=0,1,2
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

import fedjax_dd

from fedjax_dd.experiments import runners
from fedjax_dd.experiments import sweep

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a config file, optionally with ':ARG'.",
    lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
_SEEDS = flags.DEFINE_list(
    "seeds", None,
    "Comma-separated seeds: run the config once per seed S (seed = "
    "data_seed = S) in WORKDIR/seed_S and write WORKDIR/sweep.{md,json} and "
    "WORKDIR/sweep_curves.png (mean ± sd over the seeds).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    # Orbax logs every checkpoint step at INFO; keep the console readable.
    logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  if "runner" not in config:
    raise ValueError("The config must set `runner` (see experiments/runners.py).")
  if config.runner not in runners.RUNNERS:
    raise ValueError(f"Unknown runner {config.runner!r}; expected one of "
                     f"{sorted(runners.RUNNERS)}.")
  if _SEEDS.value and sweep.seed_flags_in(sys.argv):
    raise app.UsageError(
        "--seeds sets config.seed and config.data_seed itself; drop "
        f"{sweep.seed_flags_in(sys.argv)}.")
  if _SEEDS.value:
    # Each seed runs as its own `fedjax-dd` command (experiments/sweep.py).
    report = sweep.run_seeds(config, _WORKDIR.value,
                             sweep.parse_seeds(_SEEDS.value), argv=sys.argv)
    with open(report["files"]["markdown"]) as f:
      print(f.read())
    return
  if config.get("multihost"):
    from fedjax_dd.core import clients  # pylint: disable=g-import-not-at-top
    clients.initialize_multihost()
  summary = runners.RUNNERS[config.runner](config, _WORKDIR.value)
  logging.info("summary: %s", {k: v for k, v in summary.items() if k != "config"})
  print({k: summary[k] for k in ("method", "dataset", "final_test_accuracy",
                                 "best_test_accuracy", "wall_seconds")
         if k in summary})


def run():
  """Console-script entry point."""
  # One host device per core for the engine's CPU backend, before JAX
  # initialises (importing the package sets nothing).
  fedjax_dd.configure_cpu()
  app.run(main, argv=sys.argv)


if __name__ == "__main__":
  run()
