r"""Tables of IGA / FedFTG gains over seeds.

:func:`gains_report` — DisUE's IGA (Eq. 9's generator, Sec. 4.4) and
FedFTG's fine-tuning (Zhang et al., CVPR 2022, Alg. 1) measured as the
*gain* of a round: ``test_accuracy - test_accuracy_before_iga`` of
``metrics.jsonl`` (written with ``iga.evaluate_before=True``). Runs without
the "before" column (FedAvg) show their accuracy only. A per-run summary
and a per-window table, as mean ± sample sd over the seeds
(:func:`fmt_mean_sd`).

Host-side only; every function takes explicit paths or arrays.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any, Mapping, Sequence

import numpy as np

Rows = dict[int, dict[str, Any]]  # {round: metrics row}
Group = dict[int, Rows]  # {seed: rows}


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """The JSON objects of a JSON-lines file (blank lines skipped)."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def sample_sd(values: Sequence[float]) -> float:
  """Sample sd (``ddof=1``) of ``values``; 0 for a single value."""
  a = np.asarray(values, float)
  return float(a.std(ddof=1)) if a.size > 1 else 0.0


def fmt_mean_sd(values: Sequence[float], digits: int = 3,
                sign: bool = False) -> str:
  """``"mean ± sd"`` of ``values`` (sample sd; 0 for a single value)."""
  a = np.asarray(values, float)
  return (f"{a.mean():{'+' if sign else ''}.{digits}f} ± "
          f"{sample_sd(a):.{digits}f}")


# --------------------------------------------------------------------------
# Gains per round (DisUE's IGA, FedFTG), FedAvg alongside.


def read_run(workdir: str) -> Rows:
  """``{round: row}`` of the evaluated rounds of one run's metrics.jsonl."""
  rows = {}
  for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")):
    if "test_accuracy" in r:
      rows[int(r["round"])] = r
  return rows


def read_group(path: str) -> Group:
  """``{seed: rows}`` of a sweep workdir's ``seed_*/`` runs that have a
  metrics.jsonl (runs still going count), or ``{0: rows}`` of one run."""
  seeds = {}
  for d in glob.glob(os.path.join(path, "seed_*")):
    m = re.fullmatch(r"seed_(\d+)", os.path.basename(d))
    if m and os.path.isfile(os.path.join(d, "metrics.jsonl")):
      seeds[int(m.group(1))] = read_run(d)
  if not seeds:
    seeds[0] = read_run(path)
  return dict(sorted(seeds.items()))


def common_rounds(groups: Mapping[str, Group]) -> int:
  """The number R of first rounds 1..R (without gaps) every run has."""
  def depth(rows):
    r = 0
    while r + 1 in rows:
      r += 1
    return r
  return min(depth(rows) for g in groups.values() for rows in g.values())


def series(rows: Rows, rounds: int) -> tuple[np.ndarray | None, np.ndarray]:
  """(before, after) test accuracy over rounds 1..R, each [R]; before is
  ``None`` when a round lacks ``test_accuracy_before_iga`` (no distillation)."""
  after = np.array([rows[t]["test_accuracy"] for t in range(1, rounds + 1)])
  if all("test_accuracy_before_iga" in rows[t]
         for t in range(1, rounds + 1)):
    before = np.array([rows[t]["test_accuracy_before_iga"]
                       for t in range(1, rounds + 1)])
    return before, after
  return None, after


def gain_tables(groups: Mapping[str, Group], rounds: int, window: int = 5,
                extra: Sequence[str] = ()) -> str:
  """Markdown: the per-run summary and the per-window table.

  Args:
    groups: ``{label: {seed: rows}}`` (:func:`read_group`).
    rounds: rounds 1..R compared (every run must have them).
    window: rounds per row of the second table.
    extra: metrics.jsonl keys shown as their mean over the rounds (± sd over
      the seeds; "–" for runs that lack them).
  """
  out = [f"Rounds 1–{rounds} of every run; gain = accuracy after the "
         "server's distillation minus just before it, every round.", "",
         "| run | seeds | mean gain/round (per seed) | mean gain ± sd | "
         "rounds lowered | final accuracy (per seed) | final ± sd | "
         "mean accuracy over the rounds ± sd |"
         + "".join(f" mean {k} |" for k in extra),
         "|---|---|---|---|---|---|---|---|" + "---|" * len(extra)]
  for label, g in groups.items():
    gains, lowered, finals, means = [], 0, [], []
    for rows in g.values():
      b, a = series(rows, rounds)
      finals.append(float(a[-1]))
      means.append(float(a.mean()))
      if b is not None:
        gains.append(float(np.mean(a - b)))
        lowered += int(np.sum(a < b))
    seeds = ", ".join(str(s) for s in g)
    tail = ""
    for key in extra:
      vals = [np.mean([rows[t][key] for t in range(1, rounds + 1)])
              for rows in g.values()
              if all(key in rows[t] for t in range(1, rounds + 1))]
      tail += f" {fmt_mean_sd(vals)} |" if vals else " – |"
    per_seed_finals = " / ".join(f"{x:.3f}" for x in finals)
    if gains:
      gcol = " / ".join(f"{x:+.3f}" for x in gains)
      out.append(f"| {label} | {seeds} | {gcol} | "
                 f"{fmt_mean_sd(gains, sign=True)} | "
                 f"{lowered} of {rounds * len(gains)} | {per_seed_finals}"
                 f" | {fmt_mean_sd(finals)} | {fmt_mean_sd(means)} |" + tail)
    else:
      out.append(f"| {label} | {seeds} | – | – | – | {per_seed_finals}"
                 f" | {fmt_mean_sd(finals)} | {fmt_mean_sd(means)} |" + tail)
  out += ["", "Per window of rounds: mean over the window's rounds, then "
          "mean ± sd over the seeds (accuracy after; gain for the runs that "
          "distil).", ""]
  head, sep = "| rounds |", "|---|"
  for label in groups:
    head += f" {label} accuracy | {label} gain |"
    sep += "---|---|"
  out += [head, sep]
  for lo in range(0, rounds, window):
    hi = min(lo + window, rounds)
    cells = [f"{lo + 1}–{hi}"]
    for g in groups.values():
      acc, gain = [], []
      for rows in g.values():
        b, a = series(rows, rounds)
        acc.append(float(a[lo:hi].mean()))
        if b is not None:
          gain.append(float((a - b)[lo:hi].mean()))
      cells += [fmt_mean_sd(acc),
                fmt_mean_sd(gain, sign=True) if gain else "–"]
    out.append("| " + " | ".join(cells) + " |")
  return "\n".join(out)


def gains_report(runs: Mapping[str, str], rounds: int = 0, window: int = 5,
                 extra: Sequence[str] = ()) -> str:
  """:func:`gain_tables` of ``{label: workdir}`` (a sweep or one run).

  Every run is cut to ``rounds``, or when 0 to the rounds every run has
  (:func:`common_rounds`).

  Raises:
    ValueError: ``rounds`` is more than some run has.
  """
  groups = {label: read_group(path) for label, path in runs.items()}
  have = common_rounds(groups)
  if rounds > have:
    raise ValueError(f"--rounds={rounds}: some run has only {have} "
                     "consecutive evaluated rounds.")
  return gain_tables(groups, rounds or have, window, tuple(extra))
