"""Results over seeds: mean ± sd tables and learning curves with bands.

A *seed sweep* runs one preset once per seed, each in its own sub-workdir
``WORKDIR/seed_<S>`` (:func:`seed_dir`) with the run's ``summary.json``,
``metrics.jsonl`` and ``command.txt``. This module turns such runs into

* a table (:func:`seed_table`, :func:`format_tables`): mean ± sample sd
  (``ddof=1``) over the seeds of the final and best test accuracy, traffic
  and wall time, next to the per-seed values and commands;
* learning curves (:func:`learning_curve`): test accuracy against the round
  (or distillation epoch ``step``) averaged over the seeds, with the
  cumulative traffic; runs that stop early are aligned by round and each
  point's ``n`` says how many seeds it averages.

:func:`write_report` writes both for one or several groups of runs (one per
method) to ``NAME.md``, ``NAME.json`` and ``NAME_curves.png``.

Host-side only; every function takes explicit rows, summaries or paths.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import re
from typing import Any, Mapping, Sequence

import numpy as np

from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import metrics as metrics_lib
from fedjax_dd.core import workdir as workdir_lib
from fedjax_dd.utils import reporting

Row = Mapping[str, Any]

STATS = ("final_test_accuracy", "best_test_accuracy", "bytes_total",
         "wall_seconds")
"""Summary keys averaged over the seeds. ``wall_seconds`` is read as the
run's time over every resumed process (:data:`RUN_TOTALS`)."""

RUN_TOTALS = {"wall_seconds": "wall_seconds_total"}
"""Summary keys whose whole-run value lives under another key: a resumed
run's ``wall_seconds`` is its last process's, ``wall_seconds_total`` the
sum over every process. Summaries without the total (older runs) fall back
to the key itself."""

PERSONAL_STATS = ("final_personal_accuracy", "best_personal_accuracy",
                  "final_personal_accuracy_sd", "final_personal_accuracy_min")
"""Personalized evaluation's summary keys (:mod:`fedjax_dd.core.
personal`), averaged when any run reports them."""

METRICS = {"test": "test_accuracy", "personal": "personal_accuracy"}
"""The accuracies a report can plot and compare ``against`` a setting: the
global test split's, or the example-weighted mean over clients of each
client's deployed model on its own test data."""

NESTED_STATS = {"gce": None,
                "privacy": ("identical_to_raw_fraction",
                            "nearest_raw_l2_median"),
                "before_iga": ("final_test_accuracy", "mean_iga_gain")}
"""Nested summary entries also averaged when the runs report them, as
``"<entry>/<key>"``: FedD3's GCE per gamma (every key), the upload's
privacy figure and ω_G before IGA (DisUE/FedFTG, the keys named)."""


def get_stat(summary: Mapping[str, Any], key: str) -> Any:
  """``summary[key]``, or ``summary[a][b]`` for ``key = "a/b"`` (else None).

  For a key of :data:`RUN_TOTALS`, the whole run's value when recorded.
  """
  if key in RUN_TOTALS and summary.get(RUN_TOTALS[key]) is not None:
    key = RUN_TOTALS[key]
  value: Any = summary
  for part in key.split("/"):
    if not isinstance(value, Mapping) or part not in value:
      return None
    value = value[part]
  return value


def stats_for(summaries: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
  """:data:`STATS` plus the :data:`NESTED_STATS` that any summary reports."""
  extra = []
  for entry, keys in NESTED_STATS.items():
    found = set()
    for s in summaries:
      if isinstance(s.get(entry), Mapping):
        found.update(s[entry] if keys is None else
                     [k for k in keys if k in s[entry]])
    extra += [f"{entry}/{k}" for k in sorted(found)]
  personal = tuple(k for k in PERSONAL_STATS
                   if any(s.get(k) is not None for s in summaries))
  return STATS + personal + tuple(extra)

X_LABELS = {"round": "round", "step": "distillation epoch"}

_SEED_DIR = re.compile(r"^seed_(-?\d+)$")


def seed_dir(workdir: str | os.PathLike, seed: int) -> str:
  """The sub-workdir of ``seed`` in a sweep: ``WORKDIR/seed_<seed>``."""
  return os.path.join(os.fspath(workdir), f"seed_{int(seed)}")


def find_seed_dirs(workdir: str | os.PathLike) -> list[tuple[int, str]]:
  """``(seed, path)`` of every ``seed_<S>`` directory with a ``summary.json``,
  sorted by seed."""
  found = []
  for path in glob.glob(os.path.join(os.fspath(workdir), "seed_*")):
    m = _SEED_DIR.match(os.path.basename(path))
    if m and os.path.isfile(os.path.join(path, "summary.json")):
      found.append((int(m.group(1)), path))
  return sorted(found)


@dataclasses.dataclass(frozen=True)
class Run:
  """One finished run read from its workdir."""
  workdir: str
  summary: dict[str, Any]
  rows: list[dict[str, Any]]
  command: str | None


def load_summary(workdir: str | os.PathLike) -> dict[str, Any]:
  """A finished run's ``summary.json``."""
  with open(os.path.join(os.fspath(workdir), "summary.json")) as f:
    return json.load(f)


def load_run(workdir: str | os.PathLike) -> Run:
  """Reads ``summary.json``, ``metrics.jsonl`` and (if any) ``command.txt``.

  Raises:
    ValueError: the summary does not describe the run's rows: the run is
      still going on, or was resumed after it and has not finished again
      (:func:`fedjax_dd.core.workdir.summary_is_stale`).
  """
  workdir = os.fspath(workdir)
  stale = workdir_lib.summary_is_stale(workdir)
  if stale is not None:
    raise ValueError(f"{stale}; let it finish (or re-run its command) "
                     "before reporting it, or leave it out.")
  summary = load_summary(workdir)
  metrics = os.path.join(workdir, "metrics.jsonl")
  rows = ledger_lib.load_metrics(metrics) if os.path.exists(metrics) else []
  command = None
  cmd_path = os.path.join(workdir, "command.txt")
  if os.path.exists(cmd_path):
    with open(cmd_path) as f:
      command = f.read().strip() or None
  return Run(workdir=workdir, summary=summary, rows=rows, command=command)


def _number(v: Any) -> float | None:
  """A finite float, or ``None`` (missing, null, NaN, or a string)."""
  if v is None or isinstance(v, (bool, str)):
    return None
  v = float(v)
  return v if math.isfinite(v) else None


def mean_sd(values: Sequence[Any]) -> dict[str, Any]:
  """Mean and sample sd (``ddof=1``), skipping ``None`` and non-finite values.

  Returns:
    ``{"mean", "sd", "n"}``: ``mean`` is ``None`` without values, ``sd`` is
    ``None`` with fewer than two.
  """
  xs = [x for x in map(_number, values) if x is not None]
  n = len(xs)
  return {"mean": float(np.mean(xs)) if n else None,
          "sd": float(np.std(xs, ddof=1)) if n > 1 else None,
          "n": n}


def seed_table(name: str, summaries: Sequence[Mapping[str, Any]], *,
               commands: Sequence[str | None] | None = None,
               workdirs: Sequence[str] | None = None,
               stats: Sequence[str] | None = None) -> dict[str, Any]:
  """The table entry of one group of runs (one method over several seeds).

  Args:
    name: the group's label (e.g. the method).
    summaries: one ``summary.json`` dict per seed.
    commands: the command of each run (``None`` if unknown).
    workdirs: the workdir of each run.
    stats: summary keys to average (``"a/b"`` for a nested entry); default
      :func:`stats_for` the summaries.

  Returns:
    ``{"name", "method", "dataset", "num_seeds", "seeds", "stats", "runs"}``:
    ``stats[key]`` is :func:`mean_sd` over the runs; ``runs`` holds per
    run its ``seed``, ``data_seed``, ``rounds``, ``stats`` values,
    :func:`provenance`, ``command`` and ``workdir``.
  """
  n = len(summaries)
  stats = stats_for(summaries) if stats is None else tuple(stats)
  commands = list(commands) if commands is not None else [None] * n
  workdirs = list(workdirs) if workdirs is not None else [None] * n
  if not len(commands) == len(workdirs) == n:
    raise ValueError("summaries, commands and workdirs differ in length: "
                     f"{n}, {len(commands)}, {len(workdirs)}.")
  runs = []
  for s, cmd, wd in zip(summaries, commands, workdirs):
    config = s.get("config") or {}
    run = {"seed": config.get("seed"),
           "data_seed": (config.get("data") or {}).get("seed"),
           "rounds": s.get("rounds")}
    run.update({k: _number(get_stat(s, k)) for k in stats})
    run.update(provenance(s))
    run.update(command=cmd, workdir=wd)
    runs.append(run)
  methods = sorted({str(s.get("method")) for s in summaries})
  datasets = sorted({str(s.get("dataset")) for s in summaries})
  return {
      "name": name,
      "method": ",".join(methods),
      "dataset": ",".join(datasets),
      "num_seeds": n,
      "seeds": [r["seed"] for r in runs],
      "stats": {k: mean_sd([get_stat(s, k) for s in summaries])
                for k in stats},
      "runs": runs,
  }


def provenance(summary: Mapping[str, Any]) -> dict[str, str | None]:
  """Where a run's figures were computed, from its ``summary.json``:
  ``code`` (short commit, ``+modified`` for a dirty tree), ``jax`` and
  ``machine`` (platform, device kind and count, ``+resumed elsewhere``);
  ``None`` for what the summary does not record."""
  code = summary.get("code") if isinstance(summary.get("code"), Mapping) else {}
  commit = code.get("commit")
  if commit:
    commit = str(commit)[:7] + ("+modified" if code.get("modified") else "")
  env = summary.get("environment")
  env = env if isinstance(env, Mapping) else {}
  started = env.get("started") if isinstance(env.get("started"), Mapping) else {}
  machine = None
  if started.get("platform"):
    machine = (f"{started['platform']} {started.get('device_kind', '')} "
               f"×{started.get('devices', '?')}").replace("  ", " ")
    if env.get("resumed"):
      machine += " +resumed elsewhere"
  return {"code": commit or None, "jax": started.get("jax"),
          "machine": machine}


PROVENANCE = ("code", "jax", "machine")
SEED_KEYS = ("seed", "data.seed")
"""Config keys a group's runs may differ in: what a seed sweep varies."""


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
  if not isinstance(tree, Mapping):
    return {prefix[:-1]: tree}
  out: dict[str, Any] = {}
  for k, v in tree.items():
    out.update(_flat(v, f"{prefix}{k}."))
  return out


def check_one_setting(label: str, summaries: Sequence[Mapping[str, Any]],
                      workdirs: Sequence[str], *,
                      ignore: Sequence[str] = SEED_KEYS) -> None:
  """Refuses a group whose runs were made with other settings.

  A mean ± sd over seeds describes one setting; two learning rates or
  round counts in one group would be reported as one setting's spread.

  Args:
    label: the group's label.
    summaries: its runs' ``summary.json`` dicts (their ``config``).
    workdirs: where each run lives, for the message.
    ignore: dotted config keys (or their groups) the runs may differ in:
      the seeds, and settings that do not change a result.

  Raises:
    ValueError: naming the first differing key and two runs' values.
  """
  skip = lambda k: any(k == p or k.startswith(p + ".") for p in ignore)
  configs = [{k: v for k, v in _flat(s.get("config") or {}).items()
              if not skip(k)} for s in summaries]
  if len(configs) < 2 or not all(configs):
    return
  first = configs[0]
  for config, where in zip(configs[1:], workdirs[1:]):
    for k in sorted(set(first) | set(config)):
      a, b = first.get(k, "(unset)"), config.get(k, "(unset)")
      if a != b:
        raise ValueError(
            f"Group {label!r}: its runs differ in {k} besides the seed "
            f"({json.dumps(a)} in {workdirs[0]}, {json.dumps(b)} in "
            f"{where}): a mean over them would report two settings as one. "
            "Give each setting its own [LABEL=]DIR, or re-run the odd run "
            "with the group's settings.")


def _fmt(key: str, v: float | None) -> str:
  if v is None:
    return "-"
  if key.startswith("bytes"):
    return reporting.format_bytes(v)
  if "accuracy" in key or "/" in key:
    return f"{v:.4f}"
  return f"{v:.1f}"


def _fmt_stat(key: str, stat: Mapping[str, Any]) -> str:
  if stat["mean"] is None:
    return "-"
  if stat["sd"] is None:
    return _fmt(key, stat["mean"])
  return f"{_fmt(key, stat['mean'])} ± {_fmt(key, stat['sd'])}"


_NONE = {"mean": None, "sd": None, "n": 0}
_HEADERS = {"privacy/identical_to_raw_fraction": "identical to raw",
            "privacy/nearest_raw_l2_median": "nearest-raw L2 (median)",
            "before_iga/final_test_accuracy": "final acc before IGA",
            "before_iga/mean_iga_gain": "IGA gain (mean over rounds)",
            "final_test_accuracy": "final acc",
            "best_test_accuracy": "best acc", "bytes_total": "traffic",
            "final_personal_accuracy": "final personal acc",
            "best_personal_accuracy": "best personal acc",
            "final_personal_accuracy_sd": "personal acc sd over clients",
            "final_personal_accuracy_min": "personal acc min over clients",
            "wall_seconds": "wall s"}


def format_tables(tables: Sequence[Mapping[str, Any]]) -> str:
  """Markdown: mean ± sd per group, then every run with its
  :func:`provenance` and command."""
  # Columns: every stat any group reports (groups may differ).
  stats = list(dict.fromkeys(k for t in tables for k in t["stats"])) or list(
      STATS)
  head = [_HEADERS.get(k, k) for k in stats]
  lines = ["| method | dataset | seeds | " + " | ".join(head) + " |",
           "|---|---|---|" + "---|" * len(stats)]
  for t in tables:
    lines.append(f"| {t['name']} | {t['dataset']} | {t['num_seeds']} | "
                 + " | ".join(_fmt_stat(k, t["stats"].get(k, _NONE))
                              for k in stats)
                 + " |")
  lines += ["", "Mean ± sample sd (ddof = 1) over the seeds; per run:", "",
            "| method | seed | data_seed | rounds | " + " | ".join(head)
            + " | " + " | ".join(PROVENANCE) + " | command |",
            "|---|---|---|---|" + "---|" * (len(stats) + len(PROVENANCE))
            + "---|"]
  for t in tables:
    for r in t["runs"]:
      cmd = f"`{r['command']}`" if r.get("command") else "-"
      lines.append(f"| {t['name']} | {r['seed']} | {r['data_seed']} | "
                   f"{'-' if r['rounds'] is None else r['rounds']} | "
                   + " | ".join(_fmt(k, r.get(k)) for k in stats) + " | "
                   + " | ".join(r.get(k) or "-" for k in PROVENANCE)
                   + f" | {cmd} |")
  return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class Curve:
  """A learning curve averaged over seeds.

  Attributes:
    x_key: the row key of the x axis (``"round"`` or ``"step"``).
    x: ``[P]`` x values present in at least one run, ascending.
    mean: ``[P]`` mean accuracy over the runs that have that x.
    sd: ``[P]`` sample sd (``ddof=1``) over those runs; NaN where ``n < 2``.
    n: ``[P]`` number of runs with that x.
    bytes_mean: ``[P]`` mean cumulative traffic over the same runs, or
      ``None`` when the rows carry no traffic column.
  """
  x_key: str
  x: np.ndarray
  mean: np.ndarray
  sd: np.ndarray
  n: np.ndarray
  bytes_mean: np.ndarray | None

  def to_json(self) -> dict[str, Any]:
    nan_to_none = lambda a: [None if not math.isfinite(v) else float(v)
                             for v in a]
    return {"x_key": self.x_key, "x": self.x.tolist(),
            "mean": nan_to_none(self.mean), "sd": nan_to_none(self.sd),
            "n": self.n.tolist(),
            "bytes_mean": (None if self.bytes_mean is None
                           else nan_to_none(self.bytes_mean))}


def curve_x_key(runs: Sequence[Sequence[Row]],
                y_key: str = "test_accuracy") -> str:
  """``"step"`` if evaluated rows carry a distillation ``step``, else round."""
  for rows in runs:
    for r in rows:
      if r.get(y_key) is not None and "step" in r:
        return "step"
  return "round"


def learning_curve(runs: Sequence[Sequence[Row]], *, x_key: str | None = None,
                   y_key: str = "test_accuracy",
                   bytes_key: str = "bytes_total_cumulative") -> Curve:
  """Averages ``y_key`` over runs, aligned by ``x_key``.

  Args:
    runs: the metric rows of each run (one ``metrics.jsonl`` each).
    x_key: row key to align on; default :func:`curve_x_key`.
    y_key: the value to average; rows without it (rounds that were not
      evaluated) are skipped.
    bytes_key: the cumulative traffic column.

  Returns:
    The :class:`Curve`. Where one run logs the same x twice, its last row
    counts.
  """
  x_key = x_key or curve_x_key(runs, y_key)
  points: dict[float, list[tuple[float, float | None]]] = {}
  for rows in runs:
    seen: dict[float, tuple[float, float | None]] = {}
    for r in rows:
      y = _number(r.get(y_key))
      x = _number(r.get(x_key))
      if y is None or x is None:
        continue
      seen[x] = (y, _number(r.get(bytes_key)))
    for x, v in seen.items():
      points.setdefault(x, []).append(v)
  xs = np.asarray(sorted(points), np.float64)
  mean, sd, n, traffic = [], [], [], []
  for x in xs:
    ys = [y for y, _ in points[x]]
    bs = [b for _, b in points[x]]
    mean.append(float(np.mean(ys)))
    sd.append(float(np.std(ys, ddof=1)) if len(ys) > 1 else math.nan)
    n.append(len(ys))
    traffic.append(None if any(b is None for b in bs) else float(np.mean(bs)))
  has_bytes = bool(traffic) and all(b is not None for b in traffic)
  if xs.size and np.all(xs == np.round(xs)):
    xs = xs.astype(np.int64)
  return Curve(x_key=x_key, x=xs, mean=np.asarray(mean, np.float64),
               sd=np.asarray(sd, np.float64), n=np.asarray(n, np.int64),
               bytes_mean=(np.asarray(traffic, np.float64) if has_bytes
                           else None))


def write_report(groups: Mapping[str, Sequence[str | os.PathLike]],
                 out_dir: str | os.PathLike, *, name: str = "sweep",
                 title: str | None = None,
                 metric: str = "test",
                 ignore: Sequence[str] = SEED_KEYS) -> dict[str, Any]:
  """Table and learning curves of one or several groups of runs.

  Args:
    groups: ``{label: [run workdir, ...]}``, one group per method.
    out_dir: where ``<name>.md``, ``<name>.json``, ``<name>_curves.png`` go.
    name: the file stem.
    title: the figure title.
    metric: the curves' accuracy, a key of :data:`METRICS`.
    ignore: config keys a group's runs may differ in
      (:func:`check_one_setting`).

  Returns:
    The JSON written: ``{"tables": [...], "curves": {label: ...},
    "files": {...}}``.

  Raises:
    ValueError: a group without runs, one whose runs differ in a setting
      besides ``ignore``, or a run whose summary is stale (:func:`load_run`).
  """
  from fedjax_dd.utils import figures  # pylint: disable=g-import-not-at-top
  y_key = _metric_key(metric)
  out_dir = os.fspath(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  tables, curves, plotted, endpoints = [], {}, {}, {}
  for label, dirs in groups.items():
    if not dirs:
      raise ValueError(f"Group {label!r} has no runs.")
    runs = [load_run(d) for d in dirs]
    check_one_setting(label, [r.summary for r in runs],
                      [r.workdir for r in runs], ignore=ignore)
    table = seed_table(label, [r.summary for r in runs],
                       commands=[r.command for r in runs],
                       workdirs=[r.workdir for r in runs])
    curve = learning_curve([r.rows for r in runs], y_key=y_key)
    tables.append(table)
    curves[label] = curve.to_json()
    shown = f"{label} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
    plotted[shown] = {"x": curve.x, "mean": curve.mean, "sd": curve.sd,
                      "bytes": curve.bytes_mean,
                      "x_label": X_LABELS.get(curve.x_key, curve.x_key)}
    if curve.bytes_mean is None:
      traffic = table["stats"]["bytes_total"]["mean"]
      final = table["stats"].get(f"final_{y_key}", _NONE)
      if traffic is not None and final["mean"] is not None:
        endpoints[shown] = (traffic, final["mean"], final["sd"] or 0.0)
  paths = {"markdown": os.path.join(out_dir, f"{name}.md"),
           "json": os.path.join(out_dir, f"{name}.json"),
           "curves": os.path.join(out_dir, f"{name}_curves.png")}
  figures.plot_learning_curves(plotted, paths["curves"], endpoints=endpoints,
                               title=title, ylabel=y_key.replace("_", " "))
  metrics_lib.write_text(paths["markdown"], format_tables(tables))
  report = {"tables": tables, "curves": curves, "files": paths}
  metrics_lib.write_json(paths["json"], report)
  return report


def _metric_key(metric: str) -> str:
  if metric not in METRICS:
    raise ValueError(f"metric must be one of {sorted(METRICS)}, got "
                     f"{metric!r}.")
  return METRICS[metric]


def config_value(summary: Mapping[str, Any], key: str) -> Any:
  """The value of a dotted config ``key`` (``"data.partition.alpha"``) in a
  run's ``summary.json``.

  Raises:
    KeyError: the summary's config has no such key.
  """
  node: Any = summary.get("config")
  for part in key.split("."):
    if not isinstance(node, Mapping) or part not in node:
      raise KeyError(f"The run's config has no {key!r} (missing {part!r}).")
    node = node[part]
  return node


def against(groups: Mapping[str, Sequence[str | os.PathLike]], key: str,
            out_dir: str | os.PathLike, *, name: str = "against",
            title: str | None = None, metric: str = "test") -> dict[str, Any]:
  """Final accuracy against one config value (e.g. DisUE Fig. 2a–b).

  Each group is one setting: its runs (seeds) must agree on ``key``. Groups
  are gathered into one series per method, ordered by the value.

  Args:
    groups: ``{label: [run workdir, ...]}``.
    key: a dotted config key, e.g. ``"data.partition.alpha"``.
    out_dir: where ``<name>.md``, ``<name>.json`` and ``<name>.png`` go.
    name: the file stem.
    title: the figure title.
    metric: the final accuracy compared, a key of :data:`METRICS`.

  Returns:
    The JSON written: ``{"key", "series": {method: [{"x", "mean", "sd", "n",
    "labels"}, ...]}, "files"}``.

  Raises:
    ValueError: a group without runs, whose runs disagree on ``key``, or
      whose value is not a number.
  """
  from fedjax_dd.utils import figures  # pylint: disable=g-import-not-at-top
  final = f"final_{_metric_key(metric)}"
  series: dict[str, list[dict[str, Any]]] = {}
  for label, dirs in groups.items():
    if not dirs:
      raise ValueError(f"Group {label!r} has no runs.")
    summaries = [load_summary(d) for d in dirs]
    raw = [config_value(s, key) for s in summaries]
    values = {json.dumps(v) for v in raw}
    if len(values) != 1:
      raise ValueError(f"Group {label!r}: its runs disagree on {key}: "
                       f"{sorted(values)}.")
    x = _number(raw[0])
    if x is None:
      raise ValueError(f"Group {label!r}: {key} = {values.pop()} is not a "
                       "finite number.")
    stat = mean_sd([s.get(final) for s in summaries])
    method = str(summaries[0].get("method", label))
    series.setdefault(method, []).append(
        {"x": x, "mean": stat["mean"], "sd": stat["sd"], "n": stat["n"],
         "labels": [label]})
  for points in series.values():
    points.sort(key=lambda p: p["x"])
    xs = [p["x"] for p in points]
    if len(set(xs)) != len(xs):
      raise ValueError(f"Two groups of one method share {key} = {xs}; give "
                       "one group per value.")
  out_dir = os.fspath(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  paths = {"markdown": os.path.join(out_dir, f"{name}.md"),
           "json": os.path.join(out_dir, f"{name}.json"),
           "figure": os.path.join(out_dir, f"{name}.png")}
  figures.plot_against(series, paths["figure"], xlabel=key, title=title,
                       ylabel=final.replace("_", " "))
  lines = [f"| method | {key} | {_HEADERS[final]} | seeds | group |",
           "|---|---|---|---|---|"]
  for method, points in series.items():
    for p in points:
      acc = _fmt_stat(final, {"mean": p["mean"], "sd": p["sd"], "n": p["n"]})
      lines.append(f"| {method} | {p['x']:g} | {acc} | {p['n']} | "
                   f"{', '.join(p['labels'])} |")
  metrics_lib.write_text(paths["markdown"], "\n".join(lines) + "\n")
  report = {"key": key, "series": series, "files": paths}
  metrics_lib.write_json(paths["json"], report)
  return report
