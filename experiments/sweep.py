r"""Seed sweeps and method comparisons (glue around ``fedjax_dd.utils.sweep``).

Over seeds: ``--seeds`` on the entry point runs a preset once per seed, with
the partition seed ``data.seed`` and the model seed ``seed`` both set to it::

  fedjax-dd --config=experiments/configs/fedavg.py:smoke --workdir=/tmp/sw \
      --seeds=0,1,2

Seed ``S`` runs in ``/tmp/sw/seed_S`` exactly as the command written to
``/tmp/sw/seed_S/command.txt``::

  fedjax-dd --config=experiments/configs/fedavg.py:smoke \
      --workdir=/tmp/sw/seed_S --config.seed=S --config.data.seed=S

so it resumes from its checkpoints like any run, and a seed finished under
the same config (not cut short by ``run.max_wall_seconds``) is not run
again. Then ``/tmp/sw/sweep.md``, ``sweep.json`` (mean ± sd of final/best
test accuracy, traffic and wall time, the per-seed values and commands, the
averaged curves) and ``sweep_curves.png`` are written. Each seed is its own
process, so its ``wall_seconds`` includes its own compilation.

Several methods on one table and one figure: give their sweep workdirs to
``fedjax-dd-sweep`` (``python -m fedjax_dd.experiments.sweep``)::

  fedjax-dd-sweep --out=/tmp/cmp fedhydra=/tmp/fh dense=/tmp/de /tmp/df

Each argument is ``[LABEL=]DIR``: a sweep workdir (its ``seed_*`` runs) or a
single run's workdir; the label defaults to the runs' ``method``. It writes
``/tmp/cmp/compare.{md,json}`` and ``compare_curves.png``. With
``--against=KEY`` (a dotted config key such as ``data.partition.alpha``) it
also writes ``compare_against.{md,json,png}``: final accuracy (mean ± sd
over each DIR's seeds) against that key, a line per method::

  fedjax-dd-sweep --out=/tmp/eps --against=data.partition.alpha \
      /tmp/eps_0.01 /tmp/eps_0.02 /tmp/eps_0.03

``--metric=personal`` plots (and compares ``--against``) the personalized
accuracy of runs with ``--config.eval.personal=True`` instead of the global
test split's; the tables show both whenever the runs have both. With one sweep
workdir and ``--out`` equal to it and ``--name=sweep`` it re-renders that
sweep's own report (e.g. after more seeds were added).
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import os
import shlex
import subprocess
import sys
from typing import Any, Callable, Sequence

import ml_collections

from fedjax_dd.core import keys
from fedjax_dd.core import metrics as metrics_lib
from fedjax_dd.core import workdir as workdir_lib
from fedjax_dd.experiments.configs import base as base_config
from fedjax_dd.utils import sweep as sweep_lib

# Flags a seed's command sets itself.
_SWEEP_FLAGS = ("--workdir", "--seeds", "--config.seed", "--config.data.seed")
# Config keys (group, key) that do not change a run's result.
_COSMETIC_KEYS = (("run", "progress"),)

# Settings a group's runs may differ in: the seeds, and the resume-safe
# ones (experiments/configs/base.py FINGERPRINT_RULES) but the round count,
# which changes the result.
IGNORED = sweep_lib.SEED_KEYS + tuple(
    p for p in base_config.fingerprint_paths("run") if p != "rounds")

Runner = Callable[[ml_collections.ConfigDict, str], dict[str, Any]]


def parse_seeds(values: Sequence[str] | str) -> list[int]:
  """``"0,1,2"`` or ``["0", "1", "2"]`` -> ``[0, 1, 2]`` (distinct).

  Raises:
    ValueError: one line naming ``--seeds``: no seed, an entry that is not
      an int in ``[0, 2**32)``, or a seed given twice.
  """
  if isinstance(values, str):
    values = values.split(",")
  entries = [str(v).strip() for v in values]
  if not any(entries):
    raise ValueError("--seeds names no seed; give comma-separated ints >= 0, "
                     "e.g. --seeds=0,1,2.")
  seeds = []
  for v in entries:
    if not v:
      continue
    if not v.isdigit() or int(v) >= keys.SEED_LIMIT:
      raise ValueError(f"--seeds entries must be ints in [0, 2**32) (each "
                       f"sets seed and data.seed), got {v!r} in "
                       f"{','.join(entries)}.")
    seeds.append(int(v))
  repeated = sorted({s for s in seeds if seeds.count(s) > 1})
  if repeated:
    raise ValueError(f"--seeds repeats {', '.join(map(str, repeated))}: each "
                     "seed runs once; drop the repeats.")
  return seeds


class SeedFailedError(RuntimeError):
  """A seed's run of a sweep failed; the message ends with its own last
  line (its refusal)."""


def _run_seed(cmd: list[str], seed: int) -> None:
  """Runs one seed's command, passing its output through as it comes, and
  raises :class:`SeedFailedError` with the run's last ``FATAL`` line (else
  its last line) if it fails, so that the refusal is printed last."""
  proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)  # pylint: disable=consider-using-with
  tail = b""
  try:
    while True:
      chunk = os.read(proc.stderr.fileno(), 4096)
      if not chunk:
        break
      sys.stderr.buffer.write(chunk)
      sys.stderr.buffer.flush()
      tail = (tail + chunk)[-16384:]
    returncode = proc.wait()
  except BaseException:
    # Interrupted (Ctrl-C reaches the child too; SIGTERM only this process):
    # stop the child the same way, so its lock and checkpoints stay whole.
    proc.terminate()
    try:
      proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      proc.kill()
    raise
  finally:
    proc.stderr.close()
  if returncode:
    lines = [l.strip() for l in tail.decode(errors="replace").replace(
        "\r", "\n").splitlines() if l.strip()]
    fatal = [l for l in lines if l.startswith("FATAL")]
    last = (fatal or lines or ["(no message)"])[-1].removeprefix("FATAL ")
    raise SeedFailedError(
        f"--seeds: seed {seed} failed (exit {returncode}) in "
        f"{shlex.join(cmd)}: {last}")


def seed_flags_in(argv: Sequence[str]) -> list[str]:
  """The flags of ``argv`` that set ``seed`` or ``data.seed``."""
  return [a for a in argv[1:]
          if a.split("=", 1)[0] in ("--config.seed", "--config.data.seed")]


def seed_args(argv: Sequence[str], workdir: str, seed: int) -> list[str]:
  """The flags of the single run of ``seed`` in a sweep started as ``argv``.

  Args:
    argv: the sweep's command line (``sys.argv``, program first).
    workdir: the sweep's workdir (as given).
    seed: the seed.

  Returns:
    ``argv[1:]`` without ``--workdir``, ``--seeds``, ``--config.seed`` and
    ``--config.data.seed`` (as ``--flag=value`` or ``--flag value``), then
    ``--workdir=WORKDIR/seed_S --config.seed=S --config.data.seed=S``.
  """
  args = list(argv[1:])
  out = []
  i = 0
  while i < len(args):
    name = args[i].split("=", 1)[0]
    if name in _SWEEP_FLAGS:
      i += 1 if "=" in args[i] else 2
      continue
    out.append(args[i])
    i += 1
  return out + [f"--workdir={sweep_lib.seed_dir(workdir, seed)}",
                f"--config.seed={seed}", f"--config.data.seed={seed}"]


def seed_command(argv: Sequence[str], workdir: str, seed: int) -> str:
  """:func:`seed_args` as a shell-quoted ``fedjax-dd`` command."""
  return shlex.join(["fedjax-dd", *seed_args(argv, workdir, seed)])


def seed_config(config: ml_collections.ConfigDict,
                seed: int) -> ml_collections.ConfigDict:
  """A copy of ``config`` with ``seed`` and ``data.seed`` set to ``seed``."""
  c = copy.deepcopy(config)
  c.seed = int(seed)
  c.data.seed = int(seed)
  return c


def _comparable(config_dict: dict[str, Any]) -> str:
  d = json.loads(json.dumps(metrics_lib.to_jsonable(config_dict)))
  for group, key in _COSMETIC_KEYS:
    d.get(group, {}).pop(key, None)
  return json.dumps(d, sort_keys=True)


def is_finished(workdir: str, config: ml_collections.ConfigDict) -> bool:
  """Whether ``workdir`` holds a complete run of exactly ``config``."""
  path = os.path.join(workdir, "summary.json")
  if not os.path.isfile(path) or workdir_lib.summary_is_stale(workdir):
    return False
  with open(path) as f:
    summary = json.load(f)
  if summary.get("stopped_by_time_budget"):
    return False
  return _comparable(summary.get("config") or {}) == _comparable(
      config.to_dict())


def run_seeds(config: ml_collections.ConfigDict, workdir: str,
              seeds: Sequence[int], *, argv: Sequence[str],
              runner: Runner | None = None) -> dict[str, Any]:
  """Runs ``config`` once per seed and writes the sweep's report.

  Args:
    config: the resolved config (flags applied), for the finished-run check
      and the labels.
    workdir: the sweep's workdir; seed ``S`` runs in ``WORKDIR/seed_S``.
    seeds: the seeds; each sets both ``seed`` and ``data.seed``.
    argv: the sweep's command line (``sys.argv``).
    runner: ``(config, workdir) -> summary`` to run each seed in this
      process. Default: each seed runs as its own command
      (``python -m fedjax_dd.experiments.main`` with :func:`seed_args`).

  Returns:
    The report written by :func:`fedjax_dd.utils.sweep.write_report` to
    ``WORKDIR/sweep.{md,json}`` and ``WORKDIR/sweep_curves.png``, covering
    exactly ``seeds``.

  Raises:
    RuntimeError: a seed's run failed or wrote no summary of that seed.
  """
  dirs = []
  for seed in seeds:
    c = seed_config(config, seed)
    d = sweep_lib.seed_dir(workdir, seed)
    if is_finished(d, c):
      print(f"seed {seed}: finished in {d}, skipped", flush=True)
    else:
      print(f"seed {seed}: running in {d}", flush=True)
      if runner is not None:
        runner(c, d)
      else:
        cmd = [sys.executable, "-m", "fedjax_dd.experiments.main",
               *seed_args(argv, workdir, seed)]
        _run_seed(cmd, seed)
    _check_summary(d, seed)
    # Written anew and renamed: a link there is replaced, not followed.
    metrics_lib.write_text(os.path.join(d, "command.txt"),
                           seed_command(argv, workdir, seed) + "\n")
    dirs.append(d)
  label = config.method
  return sweep_lib.write_report(
      {label: dirs}, workdir, name="sweep",
      title=f"{label} on {config.data.dataset}, seeds {list(seeds)}",
      ignore=IGNORED)


def _check_summary(workdir: str, seed: int) -> None:
  path = os.path.join(workdir, "summary.json")
  if not os.path.isfile(path):
    raise RuntimeError(f"seed {seed} wrote no {path}.")
  with open(path) as f:
    recorded = json.load(f).get("config") or {}
  # A JSON dict, not a ConfigDict: a summary written by another program may
  # lack the keys (then it is refused below).
  model_seed = recorded.get("seed")
  data_seed = (recorded.get("data") or {}).get("seed")
  if (model_seed, data_seed) != (seed, seed):
    raise RuntimeError(f"{path} is a run of seed {model_seed} / "
                       f"data.seed {data_seed}, not {seed}.")


def _group_dirs(path: str) -> list[str]:
  """The run workdirs of a sweep workdir, or ``[path]`` for a single run."""
  if not os.path.exists(path):
    raise ValueError(f"{path!r} does not exist; give a sweep workdir "
                     "(seed_* runs) or a run workdir.")
  if not os.path.isdir(path):
    raise ValueError(f"{path!r} is a file; give a sweep workdir (seed_* "
                     "runs) or a run workdir.")
  found = [d for _, d in sweep_lib.find_seed_dirs(path)]
  # Seeds without a summary (running, killed, or resumed and not finished
  # again): left out, and said so, so that the mean's seeds are known.
  unfinished = sorted(d for d in glob.glob(os.path.join(path, "seed_*"))
                      if os.path.isdir(d) and d not in found)
  if found:
    for d in unfinished:
      print(f"{d} has no summary.json (not finished): left out of the "
            "report.", file=sys.stderr)
    return found
  if os.path.isfile(os.path.join(path, "summary.json")):
    return [path]
  if unfinished:
    raise ValueError(f"{path!r}: none of its runs has finished (no "
                     f"summary.json in {', '.join(unfinished)}); let them "
                     "finish, or re-run the sweep's command.")
  raise ValueError(f"{path!r} holds neither seed_*/summary.json nor "
                   "summary.json.")


def compare(specs: Sequence[str], out_dir: str, *, name: str = "compare",
            title: str | None = None, against: str | None = None,
            metric: str = "test") -> dict[str, Any]:
  """Report over ``[LABEL=]DIR`` specs (see the module docstring); with
  ``against`` a config key, also final accuracy against that key;
  ``metric``: the accuracy plotted (``sweep_lib.METRICS``)."""
  groups = _groups(specs)
  report = sweep_lib.write_report(groups, out_dir, name=name, title=title,
                                  metric=metric, ignore=IGNORED)
  if against:
    report["against"] = sweep_lib.against(groups, against, out_dir,
                                          name=f"{name}_against", title=title,
                                          metric=metric)
  return report


def _groups(specs: Sequence[str]) -> dict[str, list[str]]:
  groups: dict[str, list[str]] = {}
  for spec in specs:
    label, sep, path = spec.partition("=")
    if not sep:
      label, path = "", spec
    dirs = _group_dirs(path)
    if not label:
      with open(os.path.join(dirs[0], "summary.json")) as f:
        label = str(json.load(f).get("method", os.path.basename(path)))
    if label in groups:
      label = f"{label} ({os.path.basename(os.path.normpath(path))})"
    if label in groups:
      raise ValueError(f"Two groups are labelled {label!r}; name them "
                       "LABEL=DIR.")
    groups[label] = dirs
  return groups


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(
      prog="fedjax-dd-sweep",
      description="Mean ± sd table and learning curves over seed sweeps; "
                  "several methods on one figure.")
  parser.add_argument("runs", nargs="+", metavar="[LABEL=]DIR",
                      help="a sweep workdir (seed_* runs) or a run workdir")
  parser.add_argument("--out", required=True, help="output directory")
  parser.add_argument("--name", default="compare", help="output file stem")
  parser.add_argument("--title", default=None, help="figure title")
  parser.add_argument("--against", default=None, metavar="KEY",
                      help="also plot final accuracy against this dotted "
                           "config key, one point per DIR (e.g. "
                           "data.partition.alpha)")
  parser.add_argument("--metric", default="test",
                      choices=sorted(sweep_lib.METRICS),
                      help="the accuracy of the curves and of --against: "
                           "the global test split's (test) or each client's "
                           "deployed model on its own test data (personal; "
                           "runs with --config.eval.personal=True)")
  args = parser.parse_args(argv)
  if os.path.exists(args.out) and not os.path.isdir(args.out):
    parser.error(f"--out {args.out} is a file; give a directory for the "
                 "report.")
  try:
    report = compare(args.runs, args.out, name=args.name, title=args.title,
                     against=args.against, metric=args.metric)
  except (ValueError, KeyError, OSError) as e:
    # A missing, empty or damaged input (a summary.json that is not JSON,
    # a metrics.jsonl cut mid-line): one line, not a traceback.
    text = str(e) if not isinstance(e, json.JSONDecodeError) else (
        f"a summary.json or metrics.jsonl under {', '.join(args.runs)} is "
        f"not valid JSON ({e}); re-run that run or leave it out")
    parser.error(text)
  with open(report["files"]["markdown"]) as f:
    print(f.read())
  if args.against:
    with open(report["against"]["files"]["markdown"]) as f:
      print(f.read())
  return report


def run():
  """Console-script entry point (``fedjax-dd-sweep``)."""
  main(sys.argv[1:])


if __name__ == "__main__":
  run()
