r"""Side-by-side table of DENSE server distillations: the reference (the
adapter's JSON lines, ``dense_adapter.py``) against ours (``metrics.jsonl``
of ``experiments/configs/dense.py`` runs on the same teachers).

  .venv/bin/python experiments/reference/compare_dense.py \
      --ref=ref_seed0.jsonl,ref_seed1.jsonl,ref_seed2.jsonl \
      --ours=OURS/seed_0,OURS/seed_1,OURS/seed_2 [--names=reference,ours]

Prints Markdown: per seed the final and best test accuracy of each side over
the epochs both ran, their mean ± sd, the per-epoch accuracy as mean ± sd,
and the bar (the two final means within the larger of the two seed sds).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np


def read_ref(path: str) -> np.ndarray:
  """Per-epoch test accuracy of a reference run."""
  rows = [json.loads(l) for l in open(path) if l.strip()]
  return np.array([r["test_accuracy"] for r in rows if "epoch" in r])


def read_ours(workdir: str) -> np.ndarray:
  """Per-epoch test accuracy of our run (rows of evaluated epochs)."""
  rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))
          if l.strip()]
  return np.array([r["test_accuracy"] for r in rows
                   if "test_accuracy" in r and r.get("step", 0) > 0])


def _ms(a) -> str:
  a = np.asarray(a, float)
  return f"{a.mean():.4f} ± {a.std(ddof=1) if a.size > 1 else 0.0:.4f}"


def table(ref, ours, names=("reference", "ours")) -> str:
  """The Markdown table (see the module doc)."""
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
  out.append(f"| mean ± sd | {_ms(fin[0])} | {_ms(fin[1])} | "
             f"{_ms(best[0])} | {_ms(best[1])} |")
  out += ["", f"| epoch | {names[0]} | {names[1]} |", "|---|---|---|"]
  for t in range(k):
    out.append(f"| {t + 1} | {_ms([x[t] for x in ref[:n]])} | "
               f"{_ms([x[t] for x in ours[:n]])} |")
  sd = max(np.std(fin[0], ddof=1) if n > 1 else 0.0,
           np.std(fin[1], ddof=1) if n > 1 else 0.0)
  gap = abs(np.mean(fin[0]) - np.mean(fin[1]))
  out += ["", f"Bar: final means {np.mean(fin[0]):.4f} ({names[0]}) and "
          f"{np.mean(fin[1]):.4f} ({names[1]}) after {k} epochs, apart by "
          f"{gap:.4f} against the larger seed sd {sd:.4f}: "
          f"{'met' if gap <= sd else 'not met'}."]
  return "\n".join(out)


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--ref", required=True, help="comma-separated JSON lines")
  ap.add_argument("--ours", required=True, help="comma-separated workdirs")
  ap.add_argument("--names", default="reference,ours")
  args = ap.parse_args(argv)
  ref = [read_ref(p) for p in args.ref.split(",")]
  ours = [read_ours(p) for p in args.ours.split(",")]
  print(table(ref, ours, tuple(args.names.split(","))))


if __name__ == "__main__":
  main()
