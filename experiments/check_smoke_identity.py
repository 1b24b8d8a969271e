r"""Runs ``:smoke`` presets and compares their outputs with an earlier commit's.

A refactor that must not change results (a code move, arguments bundled
into a dataclass) is checked by running the presets on the tree before it
and on the tree after, and comparing ``metrics.jsonl`` and ``summary.json``
field by field::

  python -m fedjax_dd.experiments.check_smoke_identity --base=COMMIT \
      --out=workdir/identity --presets=fedavg,disue

``--base=COMMIT`` runs the presets on that commit's tree (``git archive`` of
this checkout, laid out as the installed package under
``OUT/_base_COMMIT``; runs already there are reused) and the current tree
into ``OUT/<preset>``. A preset ``NAME:ARG`` runs config ``NAME`` with the
argument ``ARG`` instead of ``smoke`` (``ifca:smoke+iga``).
``--reference=DIR`` compares with runs made earlier instead. Without
``--presets`` every config with a ``smoke`` preset runs (``ALL_PRESETS``).

Fields that differ between two runs of the same code are left out
(:func:`varies`), and the run's own directory in a path reads
``<workdir>``. Every other value, floats included, must be equal as written
(JSON floats are written with ``repr`` and read back exactly). Exit status 1
names each preset and the first field that differs.
"""

from __future__ import annotations

import argparse
import json
import io
import os
import shutil
import subprocess
import sys
import tarfile
from typing import Any, Iterable

# Configs whose ``smoke`` preset is a CPU run of a few seconds to a minute.
ALL_PRESETS = (
    "centralized", "fedavg", "fedprox", "fednova", "scaffold", "feddyn",
    "moon", "os_fedavg", "fedseq", "ifca", "pacfl", "cfl", "cfl_gp",
    "fedd3", "hfldd", "hfldd_random", "hfldd_wodd", "fedhydra", "dense",
    "feddf", "feddf_datafree", "coboosting", "ot_fusion", "disue", "fedftg",
    "dynafed")

# Keys whose values differ between two runs of the same code, at any depth:
# the environment record and every wall-clock count of seconds (a key ending
# in _seconds or _seconds_total; stage_seconds holds only such counts), but
# not the config's time budget.
VARYING = frozenset({"environment", "stage_seconds"})
# Keys that say what a run was given, not what it computed: the commit that
# ran it (another tree's by definition) and the config, which gains every
# setting added since the reference with its default. A refactor compares
# results; a default that changes one shows in the rows.
NOT_RESULTS = frozenset({"code", "config"})
_SECONDS = ("_seconds", "_seconds_total")
_SETTINGS = frozenset({"max_wall_seconds"})


def varies(key: str) -> bool:
  """Whether ``key``'s value differs between two runs of the same code."""
  return (key in VARYING or key in NOT_RESULTS
          or (key.endswith(_SECONDS) and key not in _SETTINGS))

FILES = ("metrics.jsonl", "summary.json")


def _configs_dir() -> str:
  from fedjax_dd.experiments import configs  # pylint: disable=g-import-not-at-top
  return os.path.dirname(configs.__file__)


def base_tree(commit: str, out: str) -> str:
  """``commit``'s sources laid out as the installed package (``kernels``,
  ``models`` and ``experiments`` inside ``fedjax_dd``, as ``package-dir``
  maps them); returns the directory to put on ``PYTHONPATH``."""
  pkg = os.path.join(out, f"_base_{commit}", "pkg")
  if os.path.isdir(os.path.join(pkg, "fedjax_dd")):
    return pkg
  git = ["git", "-C", os.path.dirname(os.path.abspath(__file__))]
  # From the top: in a subdirectory git archive would take only its tree.
  top = subprocess.run([*git, "rev-parse", "--show-toplevel"],
                       capture_output=True, text=True, check=True).stdout
  archive = subprocess.run(["git", "-C", top.strip(), "archive",
                            "--format=tar", commit],
                           capture_output=True, check=True).stdout
  src = os.path.join(out, f"_base_{commit}", "src")
  with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
    tar.extractall(src, filter="data")
  shutil.copytree(os.path.join(src, "fedjax_dd"), os.path.join(pkg, "fedjax_dd"))
  for sub in ("kernels", "models", "experiments"):
    shutil.copytree(os.path.join(src, sub), os.path.join(pkg, "fedjax_dd", sub))
  return pkg


def run(names: Iterable[str], out: str, *, pythonpath: str = "",
        skip_done: bool = False) -> dict[str, int]:
  """Runs each preset afresh into ``out/<name>`` (kept with ``skip_done``
  when it has both files); returns each exit status.

  With ``pythonpath`` the runs import the package from there (an earlier
  commit's tree from :func:`base_tree`) and start outside this checkout, so
  its sources never shadow that tree.
  """
  env, cwd = dict(os.environ), None
  configs = _configs_dir()
  if pythonpath:
    env["PYTHONPATH"] = os.path.abspath(pythonpath)
    cwd = os.path.dirname(os.path.abspath(pythonpath))
    configs = os.path.join(env["PYTHONPATH"], "fedjax_dd", "experiments",
                           "configs")
  status = {}
  for name in names:
    workdir = os.path.abspath(os.path.join(out, name))
    if skip_done and all(os.path.exists(os.path.join(workdir, f))
                         for f in FILES):
      status[name] = 0
      continue
    # A run into a used workdir would resume it; each check starts afresh.
    shutil.rmtree(workdir, ignore_errors=True)
    config, _, arg = name.partition(":")
    cmd = [sys.executable, "-m", "fedjax_dd.experiments.main",
           f"--config={os.path.join(configs, config)}.py:{arg or 'smoke'}",
           f"--workdir={workdir}", "--config.run.progress=False"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          env=env, cwd=cwd)
    status[name] = proc.returncode
    if proc.returncode:
      print(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}",
            file=sys.stderr)
  return status


def strip(value: Any, workdir: str = "") -> Any:
  """``value`` without the keys that :func:`varies`, at any depth, and with the
  run's ``workdir`` in a string (a figure's path) written ``<workdir>``."""
  if isinstance(value, dict):
    return {k: strip(v, workdir) for k, v in value.items() if not varies(k)}
  if isinstance(value, list):
    return [strip(v, workdir) for v in value]
  if workdir and isinstance(value, str):
    return value.replace(workdir, "<workdir>")
  return value


def _records(path: str) -> list[Any]:
  workdir = os.path.dirname(os.path.abspath(path))
  with open(path, encoding="utf-8") as f:
    if path.endswith(".jsonl"):
      return [strip(json.loads(line), workdir) for line in f if line.strip()]
    return [strip(json.load(f), workdir)]


def first_difference(a: Any, b: Any, where: str = "") -> str | None:
  """The path of the first value that differs between ``a`` and ``b``."""
  if isinstance(a, dict) and isinstance(b, dict):
    for k in sorted(set(a) | set(b)):
      if k not in a or k not in b:
        return f"{where}.{k} (only in {'new' if k in b else 'reference'})"
      found = first_difference(a[k], b[k], f"{where}.{k}")
      if found:
        return found
    return None
  if isinstance(a, list) and isinstance(b, list):
    if len(a) != len(b):
      return f"{where} (length {len(a)} vs {len(b)})"
    for i, (x, y) in enumerate(zip(a, b)):
      found = first_difference(x, y, f"{where}[{i}]")
      if found:
        return found
    return None
  if type(a) is not type(b) or a != b:
    return f"{where}: {a!r} vs {b!r}"
  return None


# What a run's environment.json records that changes its float results:
# the host device count follows the process's CPU affinity (a run under
# `taskset -c 0` has one device, so the clients are laid out differently).
COMPARABLE = ("platform", "devices", "jax", "jaxlib")


def _environment(path: str) -> dict[str, Any]:
  try:
    with open(path, encoding="utf-8") as f:
      started = json.load(f).get("started", {})
  except (OSError, ValueError):
    return {}
  return {k: started.get(k) for k in COMPARABLE}


def compare(reference: str, new: str, names: Iterable[str]) -> dict[str, str]:
  """Each preset whose files differ, with the first difference; runs made
  on another platform, host device count or jax are named as not
  comparable instead."""
  out = {}
  for name in names:
    envs = [_environment(os.path.join(d, name, "environment.json"))
            for d in (reference, new)]
    if all(envs) and envs[0] != envs[1]:
      diff = ", ".join(f"{k} {envs[0][k]} vs {envs[1][k]}" for k in COMPARABLE
                       if envs[0][k] != envs[1][k])
      out[name] = (f"not comparable: {diff} (environment.json); run both "
                   "sides with the same CPU affinity and jax")
      continue
    for fname in FILES:
      paths = [os.path.join(d, name, fname) for d in (reference, new)]
      missing = [p for p in paths if not os.path.exists(p)]
      if missing:
        out[name] = f"missing {missing[0]}"
        break
      found = first_difference(*map(_records, paths), where=fname)
      if found:
        out[name] = found
        break
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="directory for the runs")
  parser.add_argument("--base", default="",
                      help="commit to run the presets on and compare with")
  parser.add_argument("--reference", default="",
                      help="earlier --out to compare with")
  parser.add_argument("--presets", default=",".join(ALL_PRESETS),
                      help="comma-separated config names; NAME:ARG runs "
                      "preset ARG of config NAME (e.g. ifca:smoke+iga)")
  parser.add_argument("--compare-only", action="store_true",
                      help="compare existing runs, do not run")
  args = parser.parse_args(argv)
  names = [n for n in args.presets.split(",") if n]
  reference = args.reference
  failed = False
  if args.base:
    reference = os.path.join(args.out, f"_base_{args.base}", "runs")
    if not args.compare_only:
      failed = any(run(names, reference, skip_done=True,
                       pythonpath=base_tree(args.base, args.out)).values())
  if not args.compare_only:
    failed = any(run(names, args.out).values()) or failed
  if reference:
    diffs = compare(reference, args.out, names)
    for name in names:
      print(f"{name}: {diffs.get(name, 'identical')}")
    failed = failed or bool(diffs)
  return int(failed)


if __name__ == "__main__":
  sys.exit(main())
