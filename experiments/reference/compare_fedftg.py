r"""Side-by-side table of FedFTG runs: the reference (the adapter's JSON lines)
against ours (``metrics.jsonl`` with ``iga.evaluate_before=True``).

  .venv/bin/python experiments/reference/compare_fedftg.py \
      --ref=ref_seed0.jsonl,ref_seed1.jsonl --ours=DIR/seed_0,DIR/seed_1 \
      [--rounds=R]

Prints Markdown: per seed the mean fine-tuning gain per round (test accuracy
of the global model just after fine-tuning minus just before) and the final
accuracy; the per-round accuracy (after fine-tuning) as mean ± sd over the
seeds for each side; and the issue's bar (our mean gain within the
reference's seed range or within 0.01 of its mean; the per-round curves
overlap within one sd of each side).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np


def read_ref(path, rounds=None):
  rows = [json.loads(l) for l in open(path) if l.strip()]
  rows = rows[:rounds] if rounds else rows
  return (np.array([r["test_accuracy_before_ft"] for r in rows]),
          np.array([r["test_accuracy"] for r in rows]))


def read_ours(workdir, rounds=None):
  rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))
          if l.strip()]
  rows = [r for r in rows if "test_accuracy_before_iga" in r]
  rows = rows[:rounds] if rounds else rows
  return (np.array([r["test_accuracy_before_iga"] for r in rows]),
          np.array([r["test_accuracy"] for r in rows]))


def _ms(a):
  a = np.asarray(a, float)
  return f"{a.mean():.3f} ± {a.std(ddof=1) if a.size > 1 else 0.0:.3f}"


def table(ref, ours, names=("reference", "ours")) -> str:
  out = []
  n = min(len(ref), len(ours))
  out.append(f"| seed | {names[0]} gain/round | {names[1]} gain/round | "
             f"{names[0]} final | {names[1]} final | rounds |")
  out.append("|---|---|---|---|---|---|")
  gains = {0: [], 1: []}
  finals = {0: [], 1: []}
  for s in range(n):
    r, o = ref[s], ours[s]
    k = min(len(r[0]), len(o[0]))
    cells = []
    for side, (b, a) in enumerate((r, o)):
      g = float(np.mean(a[:k] - b[:k]))
      gains[side].append(g)
      finals[side].append(float(a[k - 1]))
      cells.append(g)
    out.append(f"| {s} | {cells[0]:+.3f} | {cells[1]:+.3f} | "
               f"{finals[0][-1]:.3f} | {finals[1][-1]:.3f} | {k} |")
  out.append(f"| mean ± sd | {_ms(gains[0])} | {_ms(gains[1])} | "
             f"{_ms(finals[0])} | {_ms(finals[1])} | |")
  out.append("")
  k = min(min(len(x[0]) for x in ref[:n]), min(len(x[0]) for x in ours[:n]))
  out.append(f"| round | {names[0]} before | {names[0]} after | "
             f"{names[1]} before | {names[1]} after |")
  out.append("|---|---|---|---|---|")
  overlap = []
  for t in range(k):
    rb = [x[0][t] for x in ref[:n]]
    ra = [x[1][t] for x in ref[:n]]
    ob = [x[0][t] for x in ours[:n]]
    oa = [x[1][t] for x in ours[:n]]
    out.append(f"| {t + 1} | {_ms(rb)} | {_ms(ra)} | {_ms(ob)} | {_ms(oa)} |")
    sr = np.std(ra, ddof=1) if n > 1 else 0.0
    so = np.std(oa, ddof=1) if n > 1 else 0.0
    overlap.append(abs(np.mean(ra) - np.mean(oa)) <= sr + so)
  g_ref, g_ours = np.array(gains[0]), np.array(gains[1])
  within = (g_ref.min() <= g_ours.mean() <= g_ref.max()
            or abs(g_ours.mean() - g_ref.mean()) <= 0.01)
  out.append("")
  out.append(f"Bar, gain: ours {g_ours.mean():+.3f} against the reference's "
             f"{g_ref.mean():+.3f} (seed range {g_ref.min():+.3f} … "
             f"{g_ref.max():+.3f}): {'met' if within else 'not met'}.")
  out.append(f"Bar, curves: after-fine-tuning means within the sum of the two "
             f"seed sds in {sum(overlap)} of {len(overlap)} rounds: "
             f"{'met' if all(overlap) else 'not met'}.")
  return "\n".join(out)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--ref", required=True, help="comma-separated JSON lines")
  ap.add_argument("--ours", required=True, help="comma-separated workdirs")
  ap.add_argument("--rounds", type=int, default=0)
  ap.add_argument("--names", default="reference,ours")
  args = ap.parse_args(argv)
  r = args.rounds or None
  ref = [read_ref(p, r) for p in args.ref.split(",")]
  ours = [read_ours(p, r) for p in args.ours.split(",")]
  print(table(ref, ours, tuple(args.names.split(","))))


if __name__ == "__main__":
  main()
