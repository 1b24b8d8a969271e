"""Figures saved as PNG files; a module of independent plotting functions.

Host-side only. Uses matplotlib's non-interactive ``Agg`` backend, so it works
without a display. Each function takes plain NumPy/JSON data and a path.
"""

from __future__ import annotations

import os
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after selecting the backend)
import numpy as np  # noqa: E402


def topology_layout(heterogeneous: np.ndarray, heads: np.ndarray, *,
                    head_radius: float = 1.0,
                    member_radius: float = 0.28) -> np.ndarray:
  """2-D positions ``[N, 2]`` for HFLDD's server/head/member topology.

  The server sits at the origin, heads evenly on a circle of
  ``head_radius``, and each head's members on an arc of radius
  ``member_radius`` around it, facing away from the server.

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

  The server is a black square; heads are large circles linked to the
  server; members are small circles linked to their head. Colours are the
  homogeneous clusters, so each heterogeneous cluster shows a mix of colours.

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
  cmap = plt.get_cmap("tab10" if num_homo <= 10 else "tab20")
  colours = [cmap(k % cmap.N) for k in homogeneous]
  is_head = np.zeros(homogeneous.shape[0], bool)
  is_head[heads] = True

  fig, ax = plt.subplots(figsize=(7, 7))
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
  plt.close(fig)
  return os.fspath(path)
