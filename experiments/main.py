r"""The one entry point: ``fedjax-dd --config=CONFIG[:ARG] --workdir=DIR``.

``fedjax-dd --help`` lists its flags, every config file with its presets,
and examples (:func:`usage`); ``--helpfull`` every absl flag.

Examples::

  fedjax-dd --config=experiments/configs/centralized.py:digits --workdir=/tmp/c
  fedjax-dd --config=experiments/configs/fedavg.py:mnist_iid --workdir=/tmp/f \
      --config.rounds=5

Writes ``DIR/metrics.jsonl`` (one JSON object per evaluation round) and
``DIR/summary.json``. Re-running with the same ``--workdir`` resumes from the
newest good checkpoint in ``DIR/checkpoints``. ``DIR/config.json`` records the
settings that define the run (``common.fingerprint``); a re-run with other
ones is refused before the dataset loads, naming them (``rounds``, ``run.*``
and ``engine.*`` may change). Ctrl-C exits with status 130, naming the newest
checkpoint; re-running the same command resumes from it.

Configs are nested by concern (``experiments/configs/base.py``): override a
setting as ``--config.<group>.<key>=VALUE`` (``--config.client.lr=0.1``,
``--config.data.seed=3``) or a top-level one as ``--config.<key>=VALUE``
(``--config.rounds=5``). An unknown key is refused with the nearest valid
one.

``--seeds=0,1,2`` runs the config once per seed (``seed`` and ``data.seed``
both set to it) in ``DIR/seed_<S>`` and writes a mean ± sd report
(``fedjax_dd.experiments.sweep``); with ``--config.engine.run_axis=True``
the seeds run in this process as one program on a vmapped run axis
(``fedjax_dd.experiments.axis_sweep``).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import logging as py_logging
import os
import re
import signal
import sys
from typing import Sequence

import jax
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

import fedjax_dd

from fedjax_dd.core import checkpoint as checkpoint_lib
from fedjax_dd.core import checks as checks_lib
from fedjax_dd.core import server as server_lib
from fedjax_dd.core import stage_cache as stage_cache_lib
from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core import workdir as workdir_lib
from fedjax_dd.experiments import common
from fedjax_dd.experiments import registry
from fedjax_dd.experiments import axis_sweep
from fedjax_dd.experiments import sweep



class ConfigFileParser(flags.ArgumentParser):
  """ml_collections' config-file parsing, the file loaded by ``exec_module``.

  ml_collections loads it with ``SourceFileLoader.load_module``, deprecated
  since Python 3.10 (a DeprecationWarning at every parse) and removed in
  3.15. ``FILE[:ARG]`` gives ``get_config(ARG)`` as there; a missing file is
  named by :func:`_config_file_error` before absl parses.
  """

  def __init__(self, name: str):
    self.name = name

  def flag_type(self) -> str:
    return "config object"

  def parse(self, path):
    file, colon, arg = path.partition(":")
    usage_hint = ("the configs are experiments/configs/*.py, e.g. "
                  "--config=experiments/configs/fedavg.py:smoke")
    if not file.endswith(".py"):
      raise ValueError(f"{file!r} is not a Python config file (FILE.py with "
                       f"a get_config); {usage_hint}.")
    spec = importlib.util.spec_from_file_location(f"{self.name}_config", file)
    if spec is None or spec.loader is None:
      raise ValueError(f"{file!r} cannot be loaded as a Python module; "
                       f"{usage_hint}.")
    module = importlib.util.module_from_spec(spec)
    try:
      spec.loader.exec_module(module)
    except SyntaxError as e:
      raise ValueError(f"{file!r} is not valid Python ({e.msg}, line "
                       f"{e.lineno}); {usage_hint}.") from None
    if not callable(getattr(module, "get_config", None)):
      raise ValueError(f"{file!r} defines no get_config(arg); {usage_hint}.")
    return module.get_config(*([arg] if colon else []))


_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a config file, optionally with ':ARG'.",
    lock_config=False)
flags.FLAGS["config"].parser = ConfigFileParser("config")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
_SEEDS = flags.DEFINE_list(
    "seeds", None,
    "Comma-separated seeds: run the config once per seed S (seed = "
    "data.seed = S) in WORKDIR/seed_S and write WORKDIR/sweep.{md,json} and "
    "WORKDIR/sweep_curves.png (mean ± sd over the seeds).")
_GRID = flags.DEFINE_string(
    "grid", None,
    "With --seeds and --config.engine.run_axis=True: KEY=V,V,... runs every "
    "seed for each value of KEY (client.lr, client.weight_decay; client.mu "
    "for FedProx, feddyn.alpha for FedDyn, server.lr for SCAFFOLD) on the "
    "same run axis, in WORKDIR/KEY_V/seed_S, and writes "
    "WORKDIR/sweep_against.{md,json,png}.")
flags.mark_flags_as_required(["config", "workdir"])

_OVERRIDE = re.compile(r"^--?config\.([^=\s]+)")


def _paths(node, prefix: str = "") -> list[str]:
  """Every key of a ConfigDict tree as a dotted path (groups included)."""
  out = []
  for k in node.keys():
    out.append(prefix + k)
    if hasattr(node[k], "keys"):
      out += _paths(node[k], f"{prefix}{k}.")
  return out


def _nearest(path: str, parent: str, siblings: Sequence[str],
             paths: Sequence[str]) -> str:
  """The valid key nearest to the unknown ``path``: a key of that name or
  spelling elsewhere (``lr`` -> ``client.lr``; ``data_seed`` ->
  ``data.seed``), else the closest path, else the closest sibling."""
  leaf = path.rsplit(".", 1)[-1]
  same = [p for p in paths if p == path.replace("_", ".")
          or p.rsplit(".", 1)[-1] == leaf]
  if same:
    return " or ".join(same[:3])
  others = [p for p in paths if not path.startswith(p + ".")]  # no ancestors
  close = difflib.get_close_matches(path, others, n=1, cutoff=0.6)
  if close:
    return close[0]
  return parent + difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.0)[0]


def unknown_override(config, argv: Sequence[str]) -> str | None:
  """A one-line message for the first ``--config.<path>`` of ``argv`` that
  names no key of ``config``, with the nearest valid key; None if all do.

  Paths may end inside a leaf (e.g. a tuple's index); only keys of
  ConfigDicts are checked.
  """
  for arg in argv[1:]:
    m = _OVERRIDE.match(arg)
    if m is None:
      continue
    node, parent = config, ""
    for part in m.group(1).split("."):
      if not hasattr(node, "keys"):  # inside a leaf value
        break
      if part not in node:
        near = _nearest(parent + part, parent, sorted(node.keys()),
                        _paths(config))
        return (f"Unknown config key {parent}{part} in "
                f"{arg.split('=', 1)[0]}; did you mean {near}?")
      parent += part + "."
      node = node[part]
  return None


def _config_arg(argv: Sequence[str]) -> str | None:
  """The value of ``--config`` in ``argv``."""
  for i, arg in enumerate(argv):
    for prefix in ("--config=", "-config="):
      if arg.startswith(prefix):
        return arg[len(prefix):]
    if arg in ("--config", "-config") and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _config_file_error(argv: Sequence[str]) -> str | None:
  """One line for a ``--config=FILE[:ARG]`` whose ``get_config`` refuses
  its argument (an unknown preset), instead of the traceback that absl's
  flag error would embed; None when it loads (or is absent: absl says so)."""
  path = _config_arg(argv)
  if path is None:
    return None
  file = path.split(":", 1)[0]
  if not os.path.isfile(file):
    return (f"--config={path}: no such file {file!r} (relative to "
            f"{os.getcwd()}); the configs are experiments/configs/*.py, e.g. "
            "--config=experiments/configs/fedavg.py:smoke.")
  try:
    flags.FLAGS["config"].parser.parse(path)
  except Exception as e:  # pylint: disable=broad-except
    cause = e.__cause__ or e.__context__
    while cause is not None and (cause.__cause__ or cause.__context__):
      if isinstance(cause, (ValueError, KeyError)):
        break
      cause = cause.__cause__ or cause.__context__
    if isinstance(cause, (ValueError, KeyError)):
      text = str(cause.args[0]) if cause.args else str(cause)
      return f"--config={path}: {text}"
    text = str(e).strip().splitlines()
    if text and "Traceback" not in str(e):
      return f"--config={path}: {text[-1]}"
    return None  # absl reports it with the file's own traceback
  return None


# The short help's flags; ``--helpfull`` keeps absl's list of every flag.
HELP_FLAGS = ("-h", "--help", "-help", "-?", "--helpshort", "-helpshort")

_EXAMPLES = """\
Examples:
  fedjax-dd --config=experiments/configs/quickstart.py --workdir=workdir/quickstart
  fedjax-dd --config=experiments/configs/fedavg.py:smoke --workdir=workdir/fedavg \\
      --config.rounds=3 --seeds=0,1,2
"""


def usage() -> str:
  """``fedjax-dd --help``: this command's flags, every config file with its
  presets and a one-line description, and examples."""
  from fedjax_dd.experiments import configs  # pylint: disable=g-import-not-at-top
  lines = [
      "fedjax-dd: run one experiment config and write its metrics, figures "
      "and summary.json to a work directory (re-running resumes it).",
      "",
      "Usage: fedjax-dd --config=experiments/configs/FILE.py[:PRESET] "
      "--workdir=DIR [--config.KEY=VALUE ...] [--seeds=S,S,...]",
      "",
      "Flags:"]
  for flag in (_CONFIG, _WORKDIR, _SEEDS, _GRID):
    lines.append(f"  --{flag.name}: {flags.FLAGS[flag.name].help}")
  lines += [
      "  --config.GROUP.KEY=VALUE: override one setting, e.g. "
      "--config.rounds=5, --config.client.lr=0.1 (every key: "
      "experiments/configs/base.py); --config.run.progress=False hides "
      "the progress lines.",
      "  --helpfull: every flag, absl's and the libraries' included.",
      "",
      "Configs (experiments/configs/; FILE.py:PRESET picks a preset):"]
  for file, description, presets in configs.catalog():
    lines += [f"  {file}: {description}", f"      presets: {presets}"]
  return "\n".join(lines) + "\n\n" + _EXAMPLES


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing; an unknown ``--config.<key>`` is a usage error.

  ``-h`` / ``--help`` print :func:`usage` and exit 0 (absl's short help
  names none of this command's flags and exits 1). An override of a key
  the config lacks exits with one line naming the nearest valid key,
  instead of ml_collections' AttributeError traceback.
  """
  if any(arg in HELP_FLAGS for arg in argv[1:]):
    sys.stdout.write(usage())
    sys.exit(0)
  refusal = _config_file_error(argv)
  if refusal is not None:
    sys.stderr.write(f"FATAL Flags parsing error: {refusal}\n")
    sys.exit(1)
  try:
    return app.parse_flags_with_usage(argv)
  except (AttributeError, KeyError) as e:
    message = None
    path = _config_arg(argv)
    if path is not None:
      try:
        message = unknown_override(flags.FLAGS["config"].parser.parse(path),
                                   argv)
      except Exception:  # pylint: disable=broad-except
        message = None  # the config itself fails: report the original error
    if message is None:
      raise e
    sys.stderr.write(f"FATAL Flags parsing error: {message}\n")
    sys.exit(1)


# The exit status of a process stopped by SIGINT, as shells report it.
EXIT_INTERRUPTED = 130
# ... and by SIGTERM (a scheduler's stop), handled as SIGINT.
EXIT_TERMINATED = 143
_exit_status = EXIT_INTERRUPTED


def _on_sigterm(signum, frame) -> None:
  """SIGTERM ends the run as Ctrl-C does (one line, the lock released,
  resumable), with SIGTERM's exit status."""
  del signum, frame
  global _exit_status
  _exit_status = EXIT_TERMINATED
  raise KeyboardInterrupt


def unwritable_message(workdir: str, error: BaseException) -> str | None:
  """One line for a write the workdir refused mid-run (a read-only or
  permission-denied folder, :func:`fedjax_dd.core.checkpoint.unwritable`),
  else None."""
  refused = checkpoint_lib.unwritable(error)
  if refused is None:
    return None
  return (f"{refused.filename or workdir} cannot be written "
          f"({refused.strerror}): the run in {workdir} stopped; its last "
          "committed checkpoint is kept. Make the workdir writable and "
          "re-run the same command to resume.")


def _after_finish(signum, frame) -> None:
  """SIGTERM or Ctrl-C once the run has finished (its summary printed):
  the results are complete, so no traceback from the interpreter's exit
  (an atexit callback interrupted by a ``KeyboardInterrupt``), one line."""
  del frame
  sys.stdout.flush()
  name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
  sys.stderr.write(f"{name} after the run finished: its results in "
                   f"{_WORKDIR.value} are complete.\n")
  sys.stderr.flush()
  os._exit(EXIT_TERMINATED if signum == signal.SIGTERM  # pylint: disable=protected-access
           else EXIT_INTERRUPTED)


def check_backend() -> str | None:
  """One line when JAX cannot start the backend ``JAX_PLATFORMS`` asks for
  (e.g. ``cuda`` on a machine without a GPU), else None."""
  import jax  # pylint: disable=g-import-not-at-top
  try:
    jax.devices()
  except Exception as e:  # pylint: disable=broad-except
    platforms = os.environ.get("JAX_PLATFORMS", "")
    first = (str(e).strip().splitlines() or [
        f"no backend initialised ({type(e).__name__})."])[0]
    asked = (f"JAX_PLATFORMS={platforms}" if platforms
             else "JAX's default platforms")
    return (f"JAX cannot start a backend for {asked}: {first} Set "
            "JAX_PLATFORMS to a platform this machine has (cpu; cuda needs "
            "a GPU and jax[cuda]), or unset it.")
  return None


def interrupted_message(workdir: str) -> str:
  """One line after Ctrl-C: the newest checkpoint and how to resume."""
  latest = workdir_lib.latest_checkpoint(workdir)
  if latest is None:
    return (f"Interrupted: the run in {workdir} stopped before its first "
            "checkpoint; re-running the same command starts it again.")
  path, step = latest
  return (f"Interrupted: the run in {workdir} stopped; its newest checkpoint "
          f"is {path} (step {step}). Re-running the same command resumes "
          "from it.")


class _DiskFullLogFilter(py_logging.Filter):
  """Drops the writers' own log records of a full device (Orbax logs each
  failed write thread's traceback); the entry point's one line says it."""

  def filter(self, record: py_logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    if error is not None and checkpoint_lib.is_disk_full(error):
      return False
    return "RESOURCE_EXHAUSTED" not in str(record.msg)


def disk_full_message(workdir: str, error: BaseException) -> str:
  """One line when the workdir's device is full: what could not be written
  and the checkpoint a re-run resumes from."""
  if isinstance(error, checkpoint_lib.DiskFullError):
    return str(error)
  latest = workdir_lib.latest_checkpoint(workdir)
  kept = ("no checkpoint was written yet" if latest is None else
          f"the last good checkpoint, {latest[0]} (step {latest[1]}), is kept")
  return (f"No space left on the device of {workdir}; {kept}. Free some "
          "space and re-run the same command to resume.")


def _exit_interrupted(message: str) -> None:
  """Prints ``message`` and exits with :data:`EXIT_INTERRUPTED` at once.

  ``os._exit`` skips the interpreter's teardown, whose JAX and Orbax exit
  handlers wait for work nobody needs any more. Checkpoints are written
  blocking and committed by a marker, so nothing half-saved is trusted on
  resume.
  """
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C: same end
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  sys.stdout.flush()
  if _exit_status == EXIT_TERMINATED:
    message = message.replace("Interrupted:", "Terminated (SIGTERM):", 1)
  sys.stderr.write(message + "\n")
  sys.stderr.flush()
  os._exit(_exit_status)  # pylint: disable=protected-access


def _preset_fingerprint() -> dict | None:
  """The fingerprint of the config file's preset without ``--config.*``
  overrides: the defaults of settings a recorded run may predate."""
  path = _config_arg(sys.argv)
  if path is None:
    return None
  return common.fingerprint(flags.FLAGS["config"].parser.parse(path))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    # Orbax logs every checkpoint step at INFO; keep the console readable.
    logging.set_verbosity(logging.WARNING)
  if not (_WORKDIR.value or "").strip():
    raise app.UsageError("--workdir is empty; give the directory the run "
                         "writes to, e.g. --workdir=workdir/run1.")
  config = _CONFIG.value
  try:
    common.validate(config)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  if _SEEDS.value and sweep.seed_flags_in(sys.argv):
    raise app.UsageError(
        "--seeds sets config.seed and config.data.seed itself; drop "
        f"{sweep.seed_flags_in(sys.argv)}.")
  if _GRID.value and _SEEDS.value is None:
    raise app.UsageError("--grid runs each cell for the seeds of --seeds; "
                         "add --seeds=0 (or more) and "
                         "--config.engine.run_axis=True.")
  backend_error = check_backend()
  if backend_error is not None:
    raise app.UsageError(backend_error)
  if _SEEDS.value is not None:
    # Each seed runs as its own `fedjax-dd` command (experiments/sweep.py);
    # every seed's config is checked first, so that no refusal waits for the
    # seeds before it.
    try:
      seeds = sweep.parse_seeds(_SEEDS.value)
      for seed in seeds:
        common.validate(sweep.seed_config(config, seed))
      grid = axis_sweep.parse_grid(_GRID.value)
      if grid is not None and not config.engine.run_axis:
        raise ValueError("--grid runs its cells on the run axis: add "
                         "--config.engine.run_axis=True.")
      if config.engine.run_axis:
        axis_sweep.check(config, grid)
    except ValueError as e:
      raise app.UsageError(str(e)) from None
    try:
      if config.engine.run_axis:
        # The seeds as one program on a vmapped run axis, in this process
        # (experiments/axis_sweep.py).
        report = axis_sweep.run_seeds(config, _WORKDIR.value, seeds,
                                      argv=sys.argv, grid=grid)
      else:
        report = sweep.run_seeds(config, _WORKDIR.value, seeds,
                                 argv=sys.argv)
    except (sweep.SeedFailedError, axis_sweep.RunAxisError,
            workdir_lib.FingerprintMismatchError,
            workdir_lib.WorkdirBusyError, loop_lib.NonFiniteError,
            loop_lib.MetricsFileError, loop_lib.ResumeRefusedError,
            common.InputError, checks_lib.SettingError) as e:
      sys.stderr.write(f"FATAL {e}\n")
      sys.exit(1)
    except KeyboardInterrupt:
      _exit_interrupted(
          f"Interrupted: the sweep in {_WORKDIR.value} stopped; re-running "
          "the same command resumes each unfinished seed from its newest "
          "checkpoint.")
    with open(report["files"]["markdown"]) as f:
      print(f.read())
    if "against" in report:  # a --grid's final accuracy against its key
      with open(report["against"]["files"]["markdown"]) as f:
        print(f.read())
    return
  if config.engine.multihost:
    from fedjax_dd.core import clients  # pylint: disable=g-import-not-at-top
    try:
      clients.initialize_multihost()
    except (ValueError, RuntimeError) as e:
      # Outside a cluster jax discovers itself (SLURM, TPU pods) it cannot
      # know the coordinator or this process's id: one line, before the data.
      raise app.UsageError(
          "--config.engine.multihost=True: jax.distributed could not start "
          f"({(str(e).splitlines() or [type(e).__name__])[0].rstrip('.')}). "
          "The entry point initialises only from a cluster's environment "
          "(SLURM, TPU pods); elsewhere launch experiments/"
          "multiprocess_smoke.py's way (README, 'Several processes').") from None
  # One writer per workdir, and a workdir that can be written, checked
  # before the dataset loads. (Multi-host runs start one process per host on
  # one workdir, so they are not locked.)
  lock = (contextlib.nullcontext() if config.engine.multihost
          else workdir_lib.WorkdirLock(_WORKDIR.value))
  try:
    lock.__enter__()
  except (workdir_lib.WorkdirBusyError, workdir_lib.WorkdirLayoutError,
          NotADirectoryError, PermissionError) as e:
    raise app.UsageError(str(e)) from None
  try:
    # A resumed run must be the same experiment: refused, naming each
    # setting that differs, before the dataset loads.
    try:
      workdir_lib.record_fingerprint(_WORKDIR.value, common.fingerprint(config),
                                     defaults=_preset_fingerprint())
    except workdir_lib.FingerprintMismatchError as e:
      raise app.UsageError(str(e)) from None
    # Another device count, jax, layer form or compute dtype is allowed on
    # a resume, but not bit-identical: one warning, before the data loads.
    # A resume that mixes JAX_ENABLE_X64 modes is refused.
    try:
      workdir_lib.record_environment(
          _WORKDIR.value,
          forms={"model.conv_impl": common.conv_impl(config),
                 "model.compute_dtype": common.compute_dtype(config)})
    except workdir_lib.EnvironmentMismatchError as e:
      raise app.UsageError(str(e)) from None
    if jax.config.jax_enable_x64:
      logging.warning(
          "JAX_ENABLE_X64 is on: the run computes in 64-bit mode, so its "
          "figures differ from the 32-bit runs of the same settings "
          "(recorded in %s/environment.json).", _WORKDIR.value)
    if config.run.progress:  # what runs, before the data loads and compiles
      print(f"{config.method} on {config.data.dataset} -> {_WORKDIR.value}",
            file=sys.stderr, flush=True)
    summary = registry.run(config, _WORKDIR.value)
  except (loop_lib.NonFiniteError, loop_lib.MetricsFileError,
          loop_lib.ResumeRefusedError, common.InputError,
          stage_cache_lib.StaleStageError, checks_lib.SettingError,
          server_lib.TeachersFromError) as e:
    # One line, not a traceback: the message says which step failed, why
    # and what to change.
    sys.stderr.write(f"FATAL {e}\n")
    sys.exit(1)
  except (OSError, ValueError) as e:
    unwritable = unwritable_message(_WORKDIR.value, e)
    if unwritable is not None:
      lock.__exit__(None, None, None)
      sys.stdout.flush()
      sys.stderr.write(f"FATAL {unwritable}\n")
      sys.stderr.flush()
      os._exit(1)  # pylint: disable=protected-access
    if not checkpoint_lib.is_disk_full(e):
      raise
    # Orbax/tensorstore's RESOURCE_EXHAUSTED (a long traceback) or ENOSPC.
    # Exit without the interpreter's teardown, where the failed writers'
    # threads would print more tracebacks of their closed event loops.
    lock.__exit__(None, None, None)
    sys.stdout.flush()
    sys.stderr.write(f"FATAL {disk_full_message(_WORKDIR.value, e)}\n")
    sys.stderr.flush()
    os._exit(1)  # pylint: disable=protected-access
  except KeyboardInterrupt:
    lock.__exit__(None, None, None)
    _exit_interrupted(interrupted_message(_WORKDIR.value))
  finally:
    lock.__exit__(None, None, None)
  # From here on the run is complete; a signal during the interpreter's exit
  # (orbax's and absl's atexit callbacks) must not print their traceback.
  signal.signal(signal.SIGTERM, _after_finish)
  signal.signal(signal.SIGINT, _after_finish)
  logging.info("summary: %s", {k: v for k, v in summary.items() if k != "config"})
  print({k: summary[k] for k in ("method", "dataset", "final_test_accuracy",
                                 "best_test_accuracy",
                                 "final_personal_accuracy", "wall_seconds")
         if k in summary})


def run():
  """Console-script entry point."""
  # One host device per core for the engine's CPU backend, before JAX
  # initialises (importing the package sets nothing).
  try:
    fedjax_dd.configure_cpu()
  except ValueError as e:  # a bad FEDJAX_DD_* environment variable
    sys.stderr.write(f"FATAL {e}\n")
    sys.exit(1)
  signal.signal(signal.SIGTERM, _on_sigterm)
  py_logging.getLogger("absl").addFilter(_DiskFullLogFilter())
  app.run(main, argv=sys.argv, flags_parser=parse_flags)


if __name__ == "__main__":
  run()
