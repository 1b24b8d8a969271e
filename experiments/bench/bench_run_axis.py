r"""Run-axis benchmark: a seed sweep as one program against one process per seed.

  python -m fedjax_dd.experiments.bench.bench_run_axis --out run_axis.json
  python -m fedjax_dd.experiments.bench.bench_run_axis --quick --out q.json

Runs the same sweep twice through the entry point, each as its own command
(so each side pays its own start-up and compilation, as a user's would):

* ``run_axis``: ``fedjax-dd --seeds=S,... --config.engine.run_axis=True``,
  every seed on one run axis in one process (:mod:`fedjax_dd.core.run_axis`;
  the runs vmapped or, per the platform's policy, in sequence inside the
  program);
* ``sequential``: ``fedjax-dd --seeds=S,...``, one process per seed
  (:func:`fedjax_dd.experiments.sweep.run_seeds`).

The default sweep is five seeds of ``fedavg.py:fmnist_dir0.01`` at 30
rounds (the full FMNIST dataset; meant for an accelerator). ``--quick`` is
two seeds of ``fedavg.py:smoke`` (digits, 2 rounds), to check the script on
a CPU.

Both sides run with ``--config.run.max_wall_seconds=0``: a preset's time
budget would otherwise stop the slower side early on a loaded machine; a
side whose runs did not finish every round is an error, not a measurement.

Writes a JSON report: each side's wall seconds, CPU seconds (user + system,
which other jobs on the machine inflate less than wall time) and command,
the ratios ``sequential / run_axis`` of both, each side's final test
accuracy per seed and the largest difference between the two (a vmapped
run axis rounds differently in the last bits, ``tests/core/test_run_axis.py``), and
the environment (:func:`fedjax_dd.core.workdir.current_environment`) and
the code (:func:`fedjax_dd.versions.source_commit`: commit and whether
tracked files differ from it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

FULL = {"config": "experiments/configs/fedavg.py:fmnist_dir0.01",
        "seeds": "0,1,2,3,4", "rounds": 30}
QUICK = {"config": "experiments/configs/fedavg.py:smoke", "seeds": "0,1",
         "rounds": 2}

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def command(config: str, seeds: str, rounds: int, workdir: str, *,
            run_axis: bool, extra: Sequence[str] = ()) -> list[str]:
  """The entry point's sweep command of one side."""
  cmd = [sys.executable, "-m", "fedjax_dd.experiments.main",
         f"--config={config}", f"--workdir={workdir}", f"--seeds={seeds}",
         f"--config.rounds={rounds}", "--config.run.progress=False",
         "--config.run.max_wall_seconds=0", *extra]
  if run_axis:
    cmd.append("--config.engine.run_axis=True")
  return cmd


def finals(workdir: str, rounds: int | None = None) -> dict[int, float]:
  """``{seed: final test accuracy}`` from a sweep's ``sweep.json``.

  Raises:
    RuntimeError: with ``rounds``, a seed's run finished fewer rounds.
  """
  with open(os.path.join(workdir, "sweep.json")) as f:
    report = json.load(f)
  (table,) = report["tables"]
  if rounds is not None:
    for run in table["runs"]:
      with open(os.path.join(workdir, f"seed_{int(run['seed'])}",
                             "summary.json")) as f:
        done = int(json.load(f)["rounds"])
      if done < rounds:
        raise RuntimeError(f"{workdir}: seed {run['seed']} finished {done} "
                           f"of {rounds} rounds; not a measurement.")
  return {int(run["seed"]): float(run["final_test_accuracy"])
          for run in table["runs"]}


def _children_cpu_seconds() -> float:
  """User + system seconds of this process' finished children (and theirs:
  a sweep's per-seed processes)."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def measure(config: str, seeds: str, rounds: int, workdir: str, *,
            extra: Sequence[str] = ()) -> dict[str, Any]:
  """Both sides of one sweep, one after the other (see the module doc)."""
  out: dict[str, Any] = {"config": config, "seeds": seeds, "rounds": rounds}
  for side, run_axis in (("run_axis", True), ("sequential", False)):
    d = os.path.join(workdir, side)
    cmd = command(config, seeds, rounds, d, run_axis=run_axis, extra=extra)
    cpu = _children_cpu_seconds()
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=_REPO, capture_output=True, text=True,
                          check=False)
    seconds = time.perf_counter() - start
    cpu = _children_cpu_seconds() - cpu
    if proc.returncode:
      raise RuntimeError(f"{side} failed (exit {proc.returncode}): "
                         f"{proc.stderr.strip()[-2000:]}")
    out[side] = {"seconds": seconds, "cpu_seconds": cpu,
                 "command": " ".join(cmd[1:]),
                 "final_test_accuracy": finals(d, rounds)}
  out["speedup"] = out["sequential"]["seconds"] / out["run_axis"]["seconds"]
  out["cpu_speedup"] = (out["sequential"]["cpu_seconds"]
                        / out["run_axis"]["cpu_seconds"])
  a = out["run_axis"]["final_test_accuracy"]
  b = out["sequential"]["final_test_accuracy"]
  out["max_final_accuracy_difference"] = max(abs(a[s] - b[s]) for s in a)
  return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(prog="bench_run_axis",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="two seeds of fedavg.py:smoke (digits) instead "
                           "of five of fedavg.py:fmnist_dir0.01")
  parser.add_argument("--config", default=None)
  parser.add_argument("--seeds", default=None)
  parser.add_argument("--rounds", type=int, default=None)
  parser.add_argument("--workdir", default=None,
                      help="where both sweeps run (default: a temporary "
                           "directory, removed)")
  parser.add_argument("--out", default=None, help="the JSON report")
  args = parser.parse_args(argv)
  preset = QUICK if args.quick else FULL
  config = args.config or preset["config"]
  seeds = args.seeds or preset["seeds"]
  rounds = args.rounds or preset["rounds"]
  # pylint: disable-next=g-import-not-at-top
  from fedjax_dd import versions
  # Before the sides run: the code their processes load.
  code = versions.source_commit()
  with tempfile.TemporaryDirectory() as tmp:
    report = measure(config, seeds, rounds, args.workdir or tmp)
  # pylint: disable-next=g-import-not-at-top
  from fedjax_dd.core import workdir as workdir_lib
  report["environment"] = workdir_lib.current_environment()
  report["code"] = code
  text = json.dumps(report, indent=1, sort_keys=True)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text + "\n")
  print(text)
  return report


if __name__ == "__main__":
  main()
