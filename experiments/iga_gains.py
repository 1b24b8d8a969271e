r"""Per-seed and per-window table of server-distillation gains, from runs'
``metrics.jsonl`` (DisUE's IGA, FedFTG's fine-tuning; FedAvg alongside).

  python experiments/iga_gains.py [--rounds=R] [--window=5] \
      [--extra=iga_ensemble_accuracy,iga_student_cd] \
      kl=DIR/kl l1_logits=DIR/l1 fedavg=DIR/fedavg

Each argument is ``LABEL=DIR``, ``DIR`` a sweep workdir (``seed_*/``) or a
single run's workdir, every round evaluated (``run.eval_every=1``), with
``iga.evaluate_before=True`` for the runs that distil. The gain of a round is
the test accuracy of the global model just after the server's distillation
minus just before it (``test_accuracy - test_accuracy_before_iga``); runs
without ``test_accuracy_before_iga`` (FedAvg) show their accuracy only.
Every run is cut to the same rounds: ``--rounds``, or by default the fewest
any run has, so runs stopped at different depths are compared on the rounds
they share. Prints Markdown.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re

import numpy as np


def read_run(workdir: str) -> dict[int, dict]:
  """``{round: row}`` of the evaluated rounds of one run's metrics.jsonl."""
  rows = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      if line.strip():
        r = json.loads(line)
        if "test_accuracy" in r:
          rows[int(r["round"])] = r
  return rows


def read_group(path: str) -> dict[int, dict[int, dict]]:
  """``{seed: rows}`` of a sweep workdir (or ``{0: rows}`` of one run)."""
  seeds = {}
  for d in glob.glob(os.path.join(path, "seed_*")):
    m = re.fullmatch(r"seed_(\d+)", os.path.basename(d))
    if m and os.path.isfile(os.path.join(d, "metrics.jsonl")):
      seeds[int(m.group(1))] = read_run(d)
  if not seeds:
    seeds[0] = read_run(path)
  return dict(sorted(seeds.items()))


def _ms(a) -> str:
  a = np.asarray(a, float)
  return f"{a.mean():+.3f} ± {a.std(ddof=1) if a.size > 1 else 0.0:.3f}"


def _m(a) -> str:
  a = np.asarray(a, float)
  return f"{a.mean():.3f} ± {a.std(ddof=1) if a.size > 1 else 0.0:.3f}"


def common_rounds(groups: dict[str, dict[int, dict[int, dict]]]) -> int:
  """The first rounds every run has (1..R without gaps)."""
  def depth(rows):
    r = 0
    while r + 1 in rows:
      r += 1
    return r
  return min(depth(rows) for g in groups.values() for rows in g.values())


def series(rows: dict[int, dict], rounds: int):
  """(before, after) arrays over rounds 1..R; before is None without IGA."""
  after = np.array([rows[t]["test_accuracy"] for t in range(1, rounds + 1)])
  if all("test_accuracy_before_iga" in rows[t]
         for t in range(1, rounds + 1)):
    before = np.array([rows[t]["test_accuracy_before_iga"]
                       for t in range(1, rounds + 1)])
    return before, after
  return None, after


def tables(groups: dict[str, dict[int, dict[int, dict]]], rounds: int,
           window: int = 5, extra: tuple[str, ...] = ()) -> str:
  """Markdown: the per-run summary and the per-window table. ``extra``:
  metrics.jsonl keys shown as their mean over the rounds (± sd over the
  seeds; "–" for runs that lack them)."""
  out = [f"Rounds 1–{rounds} of every run; gain = accuracy after the "
         "server's distillation minus just before it, every round.", "",
         "| run | seeds | mean gain/round (per seed) | mean gain ± sd | "
         "rounds lowered | final accuracy (per seed) | final ± sd | "
         "mean accuracy over the rounds ± sd |"
         + "".join(f" mean {k} |" for k in extra),
         "|---|---|---|---|---|---|---|---|" + "---|" * len(extra)]
  per = {}
  for label, g in groups.items():
    gains, lowered, finals, means = [], 0, [], []
    for rows in g.values():
      b, a = series(rows, rounds)
      finals.append(float(a[-1]))
      means.append(float(a.mean()))
      if b is not None:
        gains.append(float(np.mean(a - b)))
        lowered += int(np.sum(a < b))
    per[label] = g
    seeds = ", ".join(str(s) for s in g)
    tail = ""
    for key in extra:
      vals = [np.mean([rows[t][key] for t in range(1, rounds + 1)])
              for rows in g.values()
              if all(key in rows[t] for t in range(1, rounds + 1))]
      tail += f" {_m(vals)} |" if vals else " – |"
    if gains:
      gcol = " / ".join(f"{x:+.3f}" for x in gains)
      out.append(f"| {label} | {seeds} | {gcol} | {_ms(gains)} | "
                 f"{lowered} of {rounds * len(gains)} | "
                 + " / ".join(f"{x:.3f}" for x in finals)
                 + f" | {_m(finals)} | {_m(means)} |" + tail)
    else:
      out.append(f"| {label} | {seeds} | – | – | – | "
                 + " / ".join(f"{x:.3f}" for x in finals)
                 + f" | {_m(finals)} | {_m(means)} |" + tail)
  out += ["", "Per window of rounds: mean over the window's rounds, then "
          "mean ± sd over the seeds (accuracy after; gain for the runs that "
          "distil).", ""]
  head = "| rounds |"
  sep = "|---|"
  for label in per:
    head += f" {label} accuracy | {label} gain |"
    sep += "---|---|"
  out += [head, sep]
  for lo in range(0, rounds, window):
    hi = min(lo + window, rounds)
    cells = [f"{lo + 1}–{hi}"]
    for label, g in per.items():
      acc, gain = [], []
      for rows in g.values():
        b, a = series(rows, rounds)
        acc.append(float(a[lo:hi].mean()))
        if b is not None:
          gain.append(float((a - b)[lo:hi].mean()))
      cells += [_m(acc), _ms(gain) if gain else "–"]
    out.append("| " + " | ".join(cells) + " |")
  return "\n".join(out)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("runs", nargs="+", metavar="LABEL=DIR")
  ap.add_argument("--rounds", type=int, default=0,
                  help="rounds to compare (default: the fewest any run has)")
  ap.add_argument("--window", type=int, default=5)
  ap.add_argument("--extra", default="",
                  help="comma-separated metrics.jsonl keys to average")
  args = ap.parse_args(argv)
  groups = {}
  for spec in args.runs:
    label, _, path = spec.partition("=")
    if not path:
      label, path = os.path.basename(os.path.normpath(spec)), spec
    groups[label] = read_group(path)
  have = common_rounds(groups)
  if args.rounds > have:
    raise SystemExit(f"--rounds={args.rounds}: some run has only {have} "
                     "consecutive evaluated rounds.")
  rounds = args.rounds or have
  extra = tuple(k for k in args.extra.split(",") if k)
  print(tables(groups, rounds, args.window, extra))


if __name__ == "__main__":
  main()
