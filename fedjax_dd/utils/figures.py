"""Figures saved as PNG files; a module of independent plotting functions.

Host-side only. matplotlib is imported lazily, so importing this module
costs nothing, and figures use ``matplotlib.figure.Figure``, not pyplot, so
saving needs no display and a notebook's backend is never switched. Each
function takes plain NumPy/JSON data and a path.
"""

from __future__ import annotations

import collections
import functools
import io
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np


def new_figure(**kwargs):
  """A ``matplotlib.figure.Figure`` outside pyplot (imported on first use)
  that a notebook shows when a cell returns it (:func:`_figure_class`)."""
  return _figure_class()(**kwargs)


@functools.cache
def _figure_class():
  """``Figure`` with IPython's ``_repr_png_``.

  The inline backend registers its PNG formatter only once pyplot is
  imported, so a figure made outside pyplot would show only its text repr.
  """
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

  class NotebookFigure(Figure):

    def _repr_png_(self) -> bytes:
      buffer = io.BytesIO()
      self.savefig(buffer, format="png", bbox_inches="tight")
      return buffer.getvalue()

  return NotebookFigure


def integer_ticks(axis) -> None:
  """Ticks at whole numbers only on ``axis`` (rounds and epochs have no
  halves)."""
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  axis.set_major_locator(ticker.MaxNLocator(integer=True))


def colormap(name: str):
  """A registered matplotlib colormap, e.g. ``"tab10"``."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  return matplotlib.colormaps[name]


def topology_layout(heterogeneous: np.ndarray, heads: np.ndarray, *,
                    head_radius: float = 1.0,
                    member_radius: float = 0.28) -> np.ndarray:
  """2-D positions ``[N, 2]`` for HFLDD's server/head/member topology.

  Server at the origin, heads evenly on a circle, each head's members on an
  arc around it facing away from the server.

  Args:
    heterogeneous: ``[N]`` heterogeneous cluster id of each client.
    heads: ``[H]`` head client id of each cluster.
    head_radius: distance server -> heads.
    member_radius: distance head -> members.

  Returns:
    ``[N, 2]`` float positions of the clients.
  """
  heterogeneous = np.asarray(heterogeneous)
  heads = np.asarray(heads)
  num_heads = heads.shape[0]
  pos = np.zeros((heterogeneous.shape[0], 2))
  for h, head in enumerate(heads):
    theta = 2 * np.pi * h / max(num_heads, 1)
    centre = head_radius * np.array([np.cos(theta), np.sin(theta)])
    pos[head] = centre
    members = [c for c in np.flatnonzero(heterogeneous == h) if c != head]
    if not members:
      continue
    spread = min(np.pi, 0.35 * len(members))
    angles = theta + (np.linspace(-spread / 2, spread / 2, len(members))
                      if len(members) > 1 else np.zeros(1))
    for c, a in zip(members, angles):
      pos[c] = centre + member_radius * np.array([np.cos(a), np.sin(a)])
  return pos


def plot_topology(homogeneous: Sequence[int], heterogeneous: Sequence[int],
                  heads: Sequence[int], path: str | os.PathLike, *,
                  title: str | None = None, dpi: int = 150) -> str:
  """HFLDD's hybrid topology (paper Fig. 4) as a PNG.

  Server: black square; heads: large circles; members: small circles
  linked to their head. Colours are the homogeneous clusters.

  Args:
    homogeneous: ``[N]`` homogeneous cluster id per client.
    heterogeneous: ``[N]`` heterogeneous cluster id per client.
    heads: ``[H]`` head client ids.
    path: output PNG path.
    title: optional title.
    dpi: resolution.

  Returns:
    The path written.
  """
  homogeneous = np.asarray(homogeneous)
  heterogeneous = np.asarray(heterogeneous)
  heads = np.asarray(heads)
  pos = topology_layout(heterogeneous, heads)
  num_homo = int(homogeneous.max()) + 1 if homogeneous.size else 1
  cmap = colormap("tab10" if num_homo <= 10 else "tab20")
  colours = [cmap(k % cmap.N) for k in homogeneous]
  is_head = np.zeros(homogeneous.shape[0], bool)
  is_head[heads] = True

  fig = new_figure(figsize=(7, 7))
  ax = fig.subplots()
  for h, head in enumerate(heads):
    ax.plot([0, pos[head, 0]], [0, pos[head, 1]], color="0.3", lw=1.2,
            zorder=1)
    for c in np.flatnonzero(heterogeneous == h):
      if c != head:
        ax.plot([pos[head, 0], pos[c, 0]], [pos[head, 1], pos[c, 1]],
                color="0.7", lw=0.6, zorder=1)
  members = ~is_head
  ax.scatter(pos[members, 0], pos[members, 1], s=40,
             c=[colours[i] for i in np.flatnonzero(members)],
             edgecolors="none", zorder=2)
  ax.scatter(pos[is_head, 0], pos[is_head, 1], s=160,
             c=[colours[i] for i in np.flatnonzero(is_head)],
             edgecolors="black", linewidths=1.2, zorder=3)
  ax.scatter([0], [0], s=260, marker="s", c="black", zorder=4)
  ax.annotate("server", (0, 0), textcoords="offset points", xytext=(0, 12),
              ha="center")
  for k in range(min(num_homo, 20)):
    ax.scatter([], [], s=40, color=cmap(k % cmap.N), label=f"homog. {k}")
  ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
            frameon=False)
  ax.set_aspect("equal")
  ax.axis("off")
  ax.set_title(title or f"{heads.shape[0]} heads, "
               f"{int(members.sum())} members, {num_homo} homogeneous clusters")
  fig.tight_layout()
  fig.savefig(path, dpi=dpi)
  return os.fspath(path)


LINE_STYLES = ("-", "--", ":", "-.")


def line_style(i: int, cmap: Any) -> tuple[Any, str]:
  """The ``i``-th curve's (colour, line style): the colour map's colours in
  order, then again with the next line style, so more methods than colours
  stay apart."""
  return cmap(i % cmap.N), LINE_STYLES[(i // cmap.N) % len(LINE_STYLES)]


def plot_learning_curves(curves: Mapping[str, Mapping[str, Any]],
                         path: str | os.PathLike, *,
                         endpoints: Mapping[str, tuple[float, float, float]]
                         | None = None,
                         title: str | None = None, dpi: int = 120,
                         ylabel: str = "test accuracy") -> str:
  """Test accuracy over rounds and over traffic, mean ± sd over seeds.

  Two panels, against the round (or distillation epoch) and against the
  cumulative bytes sent; each method is a mean line in a ± sd band.

  Args:
    curves: ``{label: curve}``; a curve has ``x`` ``[P]``, ``mean`` ``[P]``,
      ``sd`` ``[P]`` (NaN: no band), optional ``bytes`` ``[P]`` mean
      cumulative bytes at each point (``None``: not in the traffic panel)
      and optional ``x_label``.
    path: output PNG path.
    endpoints: ``{label: (bytes, mean, sd)}`` drawn as a point with an error
      bar in the traffic panel, for curves without per-point traffic (e.g.
      one-shot runs).
    title: optional figure title.
    dpi: resolution.
    ylabel: the figure's name of the accuracy (e.g. personalized).

  Returns:
    The path written.
  """
  endpoints = dict(endpoints or {})
  # Endpoints at one traffic side by side, 4 % apart, not over one another.
  sharing = collections.defaultdict(list)
  for label, (b, _, _) in endpoints.items():
    sharing[b].append(label)
  dodge = lambda label: 1.0 + 0.04 * (
      sharing[endpoints[label][0]].index(label)
      - (len(sharing[endpoints[label][0]]) - 1) / 2)
  fig = new_figure(figsize=(11, 4))
  ax_r, ax_b = fig.subplots(1, 2)
  cmap = colormap("tab10")
  x_labels = []
  traffic = []
  for i, (label, c) in enumerate(curves.items()):
    colour, style = line_style(i, cmap)
    x = np.asarray(c["x"], np.float64)
    mean = np.asarray(c["mean"], np.float64)
    sd = np.asarray(c["sd"], np.float64)
    lo, hi = mean - sd, mean + sd  # NaN where sd is NaN: no band there.
    if c.get("x_label") and c["x_label"] not in x_labels:
      x_labels.append(c["x_label"])
    ax_r.plot(x, mean, marker=".", color=colour, linestyle=style,
              label=label)
    ax_r.fill_between(x, lo, hi, color=colour, alpha=0.2, linewidth=0)
    if c.get("bytes") is not None:
      b = np.asarray(c["bytes"], np.float64)
      traffic.extend(b.tolist())
      ax_b.plot(b, mean, marker=".", color=colour, linestyle=style,
                label=label)
      ax_b.fill_between(b, lo, hi, color=colour, alpha=0.2, linewidth=0)
    if label in endpoints:
      b, m, s = endpoints[label]
      traffic.append(b)
      ax_b.errorbar([b * dodge(label)], [m], yerr=[s], fmt="o",
                    color=colour, capsize=4, label=f"{label} (final)")
  integer_ticks(ax_r.xaxis)
  ax_r.set_xlabel(" / ".join(x_labels) or "round")
  ax_b.set_xlabel("bytes sent (cumulative)")
  if not traffic:
    ax_b.text(0.5, 0.5, "no traffic recorded", ha="center", va="center",
              transform=ax_b.transAxes)
  positive = [b for b in traffic if b > 0 and math.isfinite(b)]
  # Traffic can span orders of magnitude across methods.
  if positive and len(positive) == len(traffic) and (
      max(positive) / min(positive) >= 100):
    ax_b.set_xscale("log")
  for ax in (ax_r, ax_b):
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
  handles, _ = ax_r.get_legend_handles_labels()
  if handles:
    ax_r.legend(fontsize=8)
  handles, _ = ax_b.get_legend_handles_labels()
  if handles:
    ax_b.legend(fontsize=8)
  if title:
    fig.suptitle(title)
  return _save(fig, path, dpi)


def _save(fig, path: str | os.PathLike, dpi: int) -> str:
  fig.tight_layout()
  fig.savefig(path, dpi=dpi)
  return os.fspath(path)


def plot_against(series: Mapping[str, Sequence[Mapping[str, Any]]],
                 path: str | os.PathLike, *, xlabel: str,
                 title: str | None = None, dpi: int = 120,
                 ylabel: str = "final test accuracy") -> str:
  """Final test accuracy against one setting, a line per method.

  Args:
    series: ``{method: [{"x", "mean", "sd"}, ...]}`` sorted by ``x``; ``sd``
      ``None`` (one seed) draws no error bar.
    path: output PNG path.
    xlabel: the setting's name.
    title: optional figure title.
    dpi: resolution.
    ylabel: the accuracy's name.

  Returns:
    The path written.
  """
  fig = new_figure(figsize=(5.5, 4))
  ax = fig.subplots()
  cmap = colormap("tab10")
  for i, (method, points) in enumerate(series.items()):
    x = [p["x"] for p in points]
    mean = [np.nan if p["mean"] is None else p["mean"] for p in points]
    sd = [0.0 if p["sd"] is None else p["sd"] for p in points]
    colour, style = line_style(i, cmap)
    ax.errorbar(x, mean, yerr=sd, marker="o", capsize=4, color=colour,
                linestyle=style, label=method)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  if title:
    ax.set_title(title)
  return _save(fig, path, dpi)


def plot_u_r(u_r: np.ndarray, path: str | os.PathLike, *,
             class_shares: np.ndarray | None = None, dpi: int = 100) -> str:
  """FedHydra's ``U_r`` (paper Fig. 5b) as a heat map, next to the truth.

  Args:
    u_r: ``[c, m]`` row-normalised stratification matrix.
    path: output PNG path.
    class_shares: ``[c, m]`` each class's share held by each client (the
      truth ``U_r`` estimates), drawn as a second panel when given.
    dpi: resolution.

  Returns:
    The path written.
  """
  u_r = np.asarray(u_r)
  panels = [("U_r", u_r)]
  if class_shares is not None:
    panels.append(("class share n_kj / Σ_k n_kj (truth)",
                   np.asarray(class_shares)))
  fig = new_figure(figsize=(len(panels) * (1.5 + 0.6 * u_r.shape[1]), 4))
  axes = np.atleast_1d(fig.subplots(1, len(panels), squeeze=False)[0])
  im = None
  for ax, (title, mat) in zip(axes, panels):
    im = ax.imshow(mat, cmap="viridis", aspect="auto", vmin=0, vmax=1)
    ax.set_xlabel("client k")
    ax.set_ylabel("class j")
    ax.set_title(title, fontsize=9)
  fig.colorbar(im, ax=list(axes))
  fig.savefig(path, dpi=dpi, bbox_inches="tight")
  return os.fspath(path)


def plot_class_samples(x: np.ndarray, y: np.ndarray, num_classes: int,
                       path: str | os.PathLike, *, per_class: int = 8,
                       dpi: int = 80) -> str:
  """Up to ``per_class`` images of each class, one row per class.

  Args:
    x: ``[B, H, W, Ch]`` images in ``[0, 1]``.
    y: ``[B]`` their labels.
    num_classes: rows.
    path: output PNG path.
    per_class: columns.
    dpi: resolution.

  Returns:
    The path written.
  """
  x, y = np.asarray(x), np.asarray(y)
  fig = new_figure(figsize=(per_class, num_classes))
  axes = fig.subplots(num_classes, per_class, squeeze=False)
  for j in range(num_classes):
    idx = np.flatnonzero(y == j)[:per_class]
    for i in range(per_class):
      ax = axes[j, i]
      ax.axis("off")
      if i < idx.size:
        img = x[idx[i]]
        gray = img.shape[-1] == 1
        ax.imshow(img[..., 0] if gray else img, cmap="gray" if gray else None,
                  vmin=0, vmax=1)
  fig.savefig(path, dpi=dpi, bbox_inches="tight")
  return os.fspath(path)


def plot_accuracy(points: Sequence[Sequence[float]], path: str | os.PathLike,
                  *, xlabel: str = "distillation epoch", dpi: int = 100) -> str:
  """Test accuracy against a step index, from ``[[step, accuracy], ...]``."""
  fig = new_figure(figsize=(5, 3.5))
  ax = fig.subplots()
  ax.plot(*zip(*points), marker=".")
  integer_ticks(ax.xaxis)
  ax.set_xlabel(xlabel)
  ax.set_ylabel("test accuracy")
  fig.savefig(path, dpi=dpi, bbox_inches="tight")
  return os.fspath(path)


def plot_one_shot(report: Mapping[str, Any],
                  rows: Sequence[Mapping[str, Any]], *,
                  class_counts: np.ndarray, num_classes: int,
                  directory: str | os.PathLike) -> list[str]:
  """A finished one-shot run's figures, each when there is something to draw.

  ``u_r.png`` (FedHydra's ``U_r``, Alg. 2, beside the true class shares),
  ``samples.png`` (synthetic samples by class) and ``accuracy.png``.

  Args:
    report: the server's ``algorithm.report(state, setup)`` (``{}`` without
      one), read for ``U_r`` and ``samples``.
    rows: the metrics rows (``step``, ``test_accuracy``).
    class_counts: ``[m, c]`` examples of class ``j`` held by client ``k``.
    num_classes: ``c``.
    directory: where the figures go.

  Returns:
    The file names written.
  """
  from fedjax_dd.algorithms import stratify  # pylint: disable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  path = lambda name: os.path.join(directory, name)
  written = []
  if "U_r" in report:
    written.append(plot_u_r(report["U_r"], path("u_r.png"),
                            class_shares=stratify.class_shares(class_counts)))
  if "samples" in report:
    written.append(plot_class_samples(*report["samples"], num_classes,
                                      path("samples.png")))
  points = [[r["step"], r["test_accuracy"]] for r in rows
            if "test_accuracy" in r]
  if points:
    written.append(plot_accuracy(points, path("accuracy.png")))
  return [os.path.basename(w) for w in written]


def plot_comparison(rows: Sequence[Mapping[str, Any]],
                    path: str | os.PathLike, *, title: str | None = None,
                    dpi: int = 120) -> str:
  """Methods side by side: final test accuracy and total bytes sent.

  Horizontal bars, one row per method, names once on the shared y axis so
  long names need no rotation. A row's ``expected`` ``(low, high)`` range is
  drawn over its accuracy bar as a black interval, and a row outside it is
  labelled ``below``/``above`` as the printed table marks it.

  Args:
    rows: one per method, with ``method``, ``final_test_accuracy`` and
      ``bytes_total``; optional ``expected``.
    path: output PNG path.
    title: optional figure title.
    dpi: resolution.

  Returns:
    The path written.
  """
  names = [str(r["method"]) for r in rows]
  acc = [float(r["final_test_accuracy"] or 0.0) for r in rows]
  traffic = [max(float(r["bytes_total"] or 0.0), 1.0) for r in rows]
  fig = new_figure(figsize=(10, 1.2 + 0.42 * len(rows)))
  ax_a, ax_b = fig.subplots(1, 2, sharey=True)
  colours = [colormap("tab10")(i % 10) for i in range(len(rows))]
  pos = np.arange(len(rows))
  ax_a.barh(pos, acc, color=colours)
  ax_a.set_yticks(pos, names)
  ax_a.invert_yaxis()  # the first row on top, as in the printed table
  ax_a.set_xlim(0, 1.12)
  ax_a.set_xlabel("final test accuracy")
  ranged = False
  for i, (a, r) in enumerate(zip(acc, rows)):
    label = f"{a:.3f}"
    expected = r.get("expected")
    if expected:
      low, high = (float(v) for v in expected)
      ranged = True
      # The interval sits on the bar's centre line, caps at both ends.
      ax_a.errorbar((low + high) / 2, i, xerr=(high - low) / 2, fmt="none",
                    ecolor="black", capsize=4, linewidth=1.5)
      if a < low:
        label += " (below)"
      elif a > high:
        label += " (above)"
    ax_a.text(max(a, float(expected[1]) if expected else a) + 0.01, i,
              label, va="center", fontsize=8)
  if ranged:
    ax_a.set_xlabel("final test accuracy (black: expected range)")
  ax_b.barh(pos, traffic, color=colours)
  # One-shot uploads and rounds of exchange differ by orders of magnitude.
  ax_b.set_xscale("log")
  ax_b.set_xlabel("bytes sent")
  ax_b.tick_params(axis="y", left=False)
  for ax in (ax_a, ax_b):
    ax.grid(axis="x", alpha=0.3)
  if title:
    fig.suptitle(title)
  # w_pad: the panels' outermost x tick labels would otherwise meet.
  fig.tight_layout(w_pad=3.0)
  fig.savefig(path, dpi=dpi)
  return os.fspath(path)


def plot_history(histories: Mapping[str, Sequence[Mapping[str, Any]]]
                 | Sequence[Mapping[str, Any]],
                 path: str | os.PathLike | None = None, *,
                 key: str = "test_accuracy", title: str | None = None,
                 dpi: int = 100):
  """One run's (or several runs') metric against the round.

  Args:
    histories: a run's metrics rows (``fit(...).rows`` or a
      ``metrics.jsonl``'s), or ``{label: rows}``; rows without ``key`` are
      skipped.
    path: output PNG path; None returns the figure unsaved.
    key: the row field to plot.
    title: optional figure title.
    dpi: resolution of a saved PNG.

  Returns:
    The path written, or the ``matplotlib.figure.Figure`` when ``path`` is
    None.

  Raises:
    ValueError: no row of any run has ``key``.
  """
  if not isinstance(histories, Mapping):
    histories = {key: histories}
  fig = new_figure(figsize=(5.5, 3.8))
  ax = fig.subplots()
  drawn = 0
  for label, rows in histories.items():
    points = [(r["round"], r[key]) for r in rows
              if r.get(key) is not None and "round" in r]
    if points:
      ax.plot(*zip(*points), marker=".", label=label)
      drawn += 1
  if not drawn:
    raise ValueError(f"plot_history: no row has {key!r}.")
  ax.set_xlabel("round")
  integer_ticks(ax.xaxis)
  ax.set_ylabel(key.replace("_", " "))
  ax.grid(alpha=0.3)
  if len(histories) > 1:
    ax.legend(fontsize=8)
  if title:
    ax.set_title(title)
  if path is None:
    fig.tight_layout()
    return fig
  return _save(fig, path, dpi)


def plot_partition(labels: np.ndarray, parts: Sequence[np.ndarray],
                   path: str | os.PathLike | None = None, *,
                   num_classes: int | None = None, title: str | None = None,
                   dpi: int = 100):
  """Each client's label distribution as stacked bars (one bar per client).

  Args:
    labels: ``[N]`` train labels.
    parts: each client's index array into ``labels`` (a partitioner's
      output, e.g. :func:`fedjax_dd.data.partition.dirichlet`).
    path: output PNG path; None returns the figure.
    num_classes: classes ``K`` (default max label + 1).
    title: optional figure title.
    dpi: resolution of a saved PNG.

  Returns:
    The path written, or the figure when ``path`` is None.
  """
  labels = np.asarray(labels)
  k = int(num_classes or (labels.max() + 1))
  counts = np.stack([np.bincount(labels[np.asarray(p, np.int64)],
                                 minlength=k)[:k] for p in parts])  # [M, K]
  fig = new_figure(figsize=(max(4.0, 0.25 * len(parts) + 2), 3.8))
  ax = fig.subplots()
  cmap = colormap("tab10" if k <= 10 else "tab20")
  bottom = np.zeros(len(parts))
  clients = np.arange(len(parts))
  for j in range(k):
    ax.bar(clients, counts[:, j], bottom=bottom, color=cmap(j % cmap.N),
           label=str(j), width=0.85)
    bottom += counts[:, j]
  ax.set_xlabel("client")
  ax.set_ylabel("examples")
  ax.legend(title="class", fontsize=7, ncol=2 if k > 10 else 1,
            bbox_to_anchor=(1.01, 1), loc="upper left")
  if title:
    ax.set_title(title)
  if path is None:
    fig.tight_layout()
    return fig
  fig.savefig(path, dpi=dpi, bbox_inches="tight")
  return os.fspath(path)
