"""A grid of images per client (FedD3 Fig. 1, FedHydra's generated samples)."""

from __future__ import annotations

import os

import numpy as np

from fedjax_dd.utils import figures


def save_image_grid(path: str | os.PathLike, images: np.ndarray,
                    labels: np.ndarray, rows: np.ndarray, *, max_rows: int = 10,
                    max_cols: int = 10, row_name: str = "client",
                    title: str | None = None) -> str:
  """Saves a PNG with one row per group (client or class) of its images.

  Args:
    path: output PNG path.
    images: ``[M, H, W, Ch]`` uint8 (or float in ``[0, 255]``) images.
    labels: ``[M]`` labels, written above each image.
    rows: ``[M]`` group of each image (e.g. the owning client).
    max_rows: at most this many groups (the first ones).
    max_cols: at most this many images per group.
    row_name: label of the row axis.
    title: optional figure title.

  Returns:
    The path written.
  """
  images = np.asarray(images)
  if images.ndim != 4 or images.shape[0] == 0:
    raise ValueError(f"images must be a non-empty [M, H, W, Ch] array, got {images.shape}.")
  groups = np.unique(rows)[:max_rows]
  ncols = max(1, min(max_cols, max(int((rows == g).sum()) for g in groups)))
  fig = figures.new_figure(figsize=(1.2 * ncols, 1.3 * len(groups)))
  axes = fig.subplots(len(groups), ncols, squeeze=False)
  for r, g in enumerate(groups):
    idx = np.flatnonzero(rows == g)[:ncols]
    for c in range(ncols):
      ax = axes[r, c]
      ax.axis("off")
      if c < len(idx):
        img = np.clip(images[idx[c]], 0, 255).astype(np.uint8)
        ax.imshow(img[..., 0] if img.shape[-1] == 1 else img,
                  cmap="gray" if img.shape[-1] == 1 else None)
        ax.set_title(str(int(labels[idx[c]])), fontsize=7)
    axes[r, 0].text(-0.1, 0.5, f"{row_name} {int(g)}", transform=axes[r, 0].transAxes,
                    ha="right", va="center", fontsize=7)
  if title:
    fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  return os.fspath(path)
