r"""Side-by-side table of DENSE server distillations: the reference (the
adapter's JSON lines, ``dense_adapter.py``) against ours (``metrics.jsonl``
of ``experiments/configs/dense.py`` runs on the same teachers).

  .venv/bin/python experiments/reference/compare_dense.py \
      --ref=ref_seed0.jsonl,ref_seed1.jsonl,ref_seed2.jsonl \
      --ours=OURS/seed_0,OURS/seed_1,OURS/seed_2 [--names=reference,ours]

Prints Markdown: per seed the final and best test accuracy of each side over
the epochs both ran, their mean ± sd, the per-epoch accuracy as mean ± sd,
and the bar (the two final means within the larger of the two seed sds):
:func:`dense_report`.
"""

from __future__ import annotations

import argparse
import os
from typing import Sequence

import numpy as np

from fedjax_dd.utils.gains import fmt_mean_sd, read_jsonl, sample_sd


def read_dense_reference(path: str) -> np.ndarray:
  """Per-epoch test accuracy [E] of a reference run (rows with ``epoch``)."""
  return np.array([r["test_accuracy"] for r in read_jsonl(path) if "epoch" in r])


def read_dense_ours(workdir: str) -> np.ndarray:
  """Per-epoch test accuracy [E] of our run (evaluated rows of step > 0)."""
  return np.array([r["test_accuracy"]
                   for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
                   if "test_accuracy" in r and r.get("step", 0) > 0])


def dense_table(ref: Sequence[np.ndarray], ours: Sequence[np.ndarray],
                names: Sequence[str] = ("reference", "ours")) -> str:
  """Markdown: per seed the final and best accuracy of each side over the
  epochs every run has, their mean ± sd, the per-epoch curves and the bar."""
  n = min(len(ref), len(ours))
  k = min(min(len(x) for x in ref[:n]), min(len(x) for x in ours[:n]))
  out = [f"| seed | {names[0]} final | {names[1]} final | {names[0]} best | "
         f"{names[1]} best |", "|---|---|---|---|---|"]
  fin, best = ([], []), ([], [])
  for s in range(n):
    for side, run in enumerate((ref[s], ours[s])):
      fin[side].append(float(run[k - 1]))
      best[side].append(float(run[:k].max()))
    out.append(f"| {s} | {fin[0][-1]:.4f} | {fin[1][-1]:.4f} | "
               f"{best[0][-1]:.4f} | {best[1][-1]:.4f} |")
  out.append(f"| mean ± sd | {fmt_mean_sd(fin[0], 4)} | "
             f"{fmt_mean_sd(fin[1], 4)} | {fmt_mean_sd(best[0], 4)} | "
             f"{fmt_mean_sd(best[1], 4)} |")
  out += ["", f"| epoch | {names[0]} | {names[1]} |", "|---|---|---|"]
  for t in range(k):
    out.append(f"| {t + 1} | {fmt_mean_sd([x[t] for x in ref[:n]], 4)} | "
               f"{fmt_mean_sd([x[t] for x in ours[:n]], 4)} |")
  sd = max(sample_sd(fin[0]), sample_sd(fin[1]))
  gap = abs(np.mean(fin[0]) - np.mean(fin[1]))
  out += ["", f"Bar: final means {np.mean(fin[0]):.4f} ({names[0]}) and "
          f"{np.mean(fin[1]):.4f} ({names[1]}) after {k} epochs, apart by "
          f"{gap:.4f} against the larger seed sd {sd:.4f}: "
          f"{'met' if gap <= sd else 'not met'}."]
  return "\n".join(out)


def dense_report(ref_paths: Sequence[str], our_workdirs: Sequence[str],
                 names: Sequence[str] = ("reference", "ours")) -> str:
  """:func:`dense_table` of reference JSON lines and our workdirs."""
  return dense_table([read_dense_reference(p) for p in ref_paths],
                     [read_dense_ours(p) for p in our_workdirs],
                     tuple(names))


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--ref", required=True, help="comma-separated JSON lines")
  ap.add_argument("--ours", required=True, help="comma-separated workdirs")
  ap.add_argument("--names", default="reference,ours")
  args = ap.parse_args(argv)
  print(dense_report(args.ref.split(","), args.ours.split(","),
                           args.names.split(",")))


if __name__ == "__main__":
  main()
