r"""Tables of server-distillation runs over seeds: gains, and ours against a
reference implementation.

Three Markdown reports, each a reader of runs' rows plus the table
arithmetic (mean ± sample sd, ``ddof=1``, over the seeds; 0 with one seed):

* :func:`gains_report` — DisUE's IGA (Eq. 9's generator, Sec. 4.4) and
  FedFTG's fine-tuning (Zhang et al., CVPR 2022, Alg. 1) measured as the
  *gain* of a round: test accuracy of the global model just after the
  server's distillation minus just before it (``test_accuracy -
  test_accuracy_before_iga`` of ``metrics.jsonl``, written with
  ``iga.evaluate_before=True``). Runs without the "before" column (FedAvg)
  show their accuracy only. A per-run summary and a per-window table.
* :func:`fedftg_report` — FedFTG's reference (the adapter's JSON lines,
  ``test_accuracy_before_ft`` / ``test_accuracy`` per round) against ours:
  per-seed gains and finals, the per-round curves and the two bars (our mean
  gain within the reference's seed range or within 0.01 of its mean; the
  after-fine-tuning curves within the sum of the two seed sds every round).
* :func:`dense_report` — DENSE's reference (per-epoch JSON lines with an
  ``epoch`` key) against ours (``metrics.jsonl`` rows with ``step > 0``):
  per-seed final and best accuracy, per-epoch curves and the bar (final
  means apart by at most the larger seed sd).

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
# (before, after) test accuracy per round, each [R].
BeforeAfter = tuple[np.ndarray, np.ndarray]


def _jsonl(path: str) -> list[dict[str, Any]]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _sd(values: Sequence[float]) -> float:
  """Sample sd (``ddof=1``) of ``values``; 0 for a single value."""
  a = np.asarray(values, float)
  return float(a.std(ddof=1)) if a.size > 1 else 0.0


def fmt_mean_sd(values: Sequence[float], digits: int = 3,
                sign: bool = False) -> str:
  """``"mean ± sd"`` of ``values`` (sample sd; 0 for a single value)."""
  a = np.asarray(values, float)
  return f"{a.mean():{'+' if sign else ''}.{digits}f} ± {_sd(a):.{digits}f}"


# --------------------------------------------------------------------------
# Gains per round (DisUE's IGA, FedFTG), FedAvg alongside.


def read_run(workdir: str) -> Rows:
  """``{round: row}`` of the evaluated rounds of one run's metrics.jsonl."""
  rows = {}
  for r in _jsonl(os.path.join(workdir, "metrics.jsonl")):
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

  Every run is cut to the same rounds: ``rounds``, or when 0 the most that
  every run has (:func:`common_rounds`), so runs stopped at different depths
  are compared on the rounds they share.

  Raises:
    ValueError: ``rounds`` is more than some run has.
  """
  groups = {label: read_group(path) for label, path in runs.items()}
  have = common_rounds(groups)
  if rounds > have:
    raise ValueError(f"--rounds={rounds}: some run has only {have} "
                     "consecutive evaluated rounds.")
  return gain_tables(groups, rounds or have, window, tuple(extra))


# --------------------------------------------------------------------------
# FedFTG: the reference's per-round JSON lines against ours.


def read_fedftg_reference(path: str, rounds: int | None = None
                          ) -> BeforeAfter:
  """(before, after) fine-tuning accuracy per round of a reference run, the
  first ``rounds`` (all when ``None`` or 0)."""
  rows = _jsonl(path)
  rows = rows[:rounds] if rounds else rows
  return (np.array([r["test_accuracy_before_ft"] for r in rows]),
          np.array([r["test_accuracy"] for r in rows]))


def read_fedftg_ours(workdir: str, rounds: int | None = None) -> BeforeAfter:
  """(before, after) accuracy per round of our run (the rows that carry
  ``test_accuracy_before_iga``), the first ``rounds``."""
  rows = [r for r in _jsonl(os.path.join(workdir, "metrics.jsonl"))
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
    overlap.append(abs(np.mean(ra) - np.mean(oa)) <= _sd(ra) + _sd(oa))
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


# --------------------------------------------------------------------------
# DENSE: the reference's per-epoch JSON lines against ours.


def read_dense_reference(path: str) -> np.ndarray:
  """Per-epoch test accuracy [E] of a reference run (rows with ``epoch``)."""
  return np.array([r["test_accuracy"] for r in _jsonl(path) if "epoch" in r])


def read_dense_ours(workdir: str) -> np.ndarray:
  """Per-epoch test accuracy [E] of our run (evaluated rows of step > 0)."""
  return np.array([r["test_accuracy"]
                   for r in _jsonl(os.path.join(workdir, "metrics.jsonl"))
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
  sd = max(_sd(fin[0]), _sd(fin[1]))
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
