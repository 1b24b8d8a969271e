r"""Side-by-side table of FedFTG runs: the reference (the adapter's JSON lines)
against ours (``metrics.jsonl`` with ``iga.evaluate_before=True``).

  .venv/bin/python experiments/reference/compare_fedftg.py \
      --ref=ref_seed0.jsonl,ref_seed1.jsonl --ours=DIR/seed_0,DIR/seed_1 \
      [--rounds=R]

Prints Markdown: per seed the mean fine-tuning gain per round (test accuracy
of the global model just after fine-tuning minus just before) and the final
accuracy; the per-round accuracy (after fine-tuning) as mean ± sd over the
seeds for each side; and the bar (our mean gain within the
reference's seed range or within 0.01 of its mean; the per-round curves
overlap within one sd of each side):
:func:`fedftg_report`.
"""

from __future__ import annotations

import argparse
import os
from typing import Sequence

import numpy as np

from fedjax_dd.utils.gains import fmt_mean_sd, read_jsonl, sample_sd

# (before, after) test accuracy per round, each [R].
BeforeAfter = tuple[np.ndarray, np.ndarray]


def read_fedftg_reference(path: str, rounds: int | None = None
                          ) -> BeforeAfter:
  """(before, after) fine-tuning accuracy per round of a reference run, the
  first ``rounds`` (all when ``None`` or 0)."""
  rows = read_jsonl(path)
  rows = rows[:rounds] if rounds else rows
  return (np.array([r["test_accuracy_before_ft"] for r in rows]),
          np.array([r["test_accuracy"] for r in rows]))


def read_fedftg_ours(workdir: str, rounds: int | None = None) -> BeforeAfter:
  """(before, after) accuracy per round of our run (the rows that carry
  ``test_accuracy_before_iga``), the first ``rounds``."""
  rows = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
          if "test_accuracy_before_iga" in r]
  rows = rows[:rounds] if rounds else rows
  return (np.array([r["test_accuracy_before_iga"] for r in rows]),
          np.array([r["test_accuracy"] for r in rows]))


def fedftg_table(ref: Sequence[BeforeAfter], ours: Sequence[BeforeAfter],
                 names: Sequence[str] = ("reference", "ours")) -> str:
  """Markdown: per seed (paired by position) the mean gain per round over
  the rounds both ran and the final accuracy; the per-round curves as mean ±
  sd over the seeds; the gain and curve bars (module doc)."""
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
  out.append(f"| mean ± sd | {fmt_mean_sd(gains[0])} | "
             f"{fmt_mean_sd(gains[1])} | {fmt_mean_sd(finals[0])} | "
             f"{fmt_mean_sd(finals[1])} | |")
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
    out.append(f"| {t + 1} | {fmt_mean_sd(rb)} | {fmt_mean_sd(ra)} | "
               f"{fmt_mean_sd(ob)} | {fmt_mean_sd(oa)} |")
    overlap.append(abs(np.mean(ra) - np.mean(oa)) <= sample_sd(ra) + sample_sd(oa))
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


def fedftg_report(ref_paths: Sequence[str], our_workdirs: Sequence[str],
                  rounds: int = 0,
                  names: Sequence[str] = ("reference", "ours")) -> str:
  """:func:`fedftg_table` of reference JSON lines and our workdirs (seed
  ``s`` of each side paired by position), cut to the first ``rounds``
  (0: all)."""
  r = rounds or None
  return fedftg_table([read_fedftg_reference(p, r) for p in ref_paths],
                      [read_fedftg_ours(p, r) for p in our_workdirs],
                      tuple(names))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--ref", required=True, help="comma-separated JSON lines")
  ap.add_argument("--ours", required=True, help="comma-separated workdirs")
  ap.add_argument("--rounds", type=int, default=0)
  ap.add_argument("--names", default="reference,ours")
  args = ap.parse_args(argv)
  print(fedftg_report(args.ref.split(","), args.ours.split(","),
                            args.rounds, args.names.split(",")))


if __name__ == "__main__":
  main()
