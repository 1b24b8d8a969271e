"""How close an upload of images is to its sender's raw data (host side).

Dataset distillation is meant to send synthetic images, not raw ones (FedD3
App. G, HFLDD Sec. IV), yet an early-stopped KIP, a support that holds a
whole class, or a random sample can send raw training images.
:func:`upload_privacy` measures this on the transmitted uint8 images,
against the images of each one's sender:

* ``identical_to_raw_fraction``: the share of uploaded images equal, byte for
  byte, to one of the sender's raw images;
* ``nearest_raw_l2_min`` / ``nearest_raw_l2_median``: the L2 distance, in
  ``[0, 1]`` pixel space, from each uploaded image to the sender's nearest raw
  image (min and median over uploads).
* ``near_copy_count`` / ``near_copy_fraction``: uploads within
  :data:`NEAR_COPY_RMS` (2 grey levels, root mean square per pixel) of a raw
  image of their sender, byte-identical ones included: a copy moved by a
  grey level passes the byte check but not this one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["NEAR_COPY_RMS", "RawUploadError", "check_no_raw_upload",
           "identical_to_raw", "upload_privacy"]

NEAR_COPY_RMS = 2.0 / 255.0
"""The root-mean-square pixel distance (``[0, 1]`` scale) at or below which
an upload counts as a near-copy of a raw image."""


class RawUploadError(ValueError):
  """An upload would send images byte-identical to the sender's raw data."""


def _check(name: str, a: np.ndarray, rank: int) -> None:
  if a.ndim != rank:
    raise ValueError(f"{name} must have rank {rank}, got shape {a.shape}.")


def _validate(uploaded_x, owner, client_x, num_examples):
  """The arguments of :func:`upload_privacy` as checked host arrays."""
  ux = np.asarray(uploaded_x)
  own = np.asarray(owner)
  cx = np.asarray(client_x)
  n = np.asarray(num_examples)
  _check("uploaded_x", ux, 4)
  _check("client_x", cx, 5)
  _check("owner", own, 1)
  _check("num_examples", n, 1)
  if ux.dtype != np.uint8 or cx.dtype != np.uint8:
    raise ValueError(
        f"uploaded_x and client_x must be uint8 (as transmitted); got "
        f"{ux.dtype} and {cx.dtype}.")
  if ux.shape[1:] != cx.shape[2:]:
    raise ValueError(f"uploaded_x images {ux.shape[1:]} and client_x images "
                     f"{cx.shape[2:]} differ in shape.")
  if own.shape[0] != ux.shape[0] or n.shape[0] != cx.shape[0]:
    raise ValueError(
        f"owner [{own.shape[0]}] must match uploaded_x [{ux.shape[0]}], and "
        f"num_examples [{n.shape[0]}] must match client_x [{cx.shape[0]}].")
  if ux.shape[0] == 0:
    return ux, own, cx, n
  if own.min() < 0 or own.max() >= cx.shape[0]:
    raise ValueError(f"owner must be in [0, {cx.shape[0]}); got values in "
                     f"[{own.min()}, {own.max()}].")
  empty = sorted(set(own.tolist()) & set(np.flatnonzero(n <= 0).tolist()))
  if empty:
    raise ValueError(f"clients {empty[:5]} uploaded images but hold no raw "
                     "data.")
  return ux, own, cx, n


def upload_privacy(uploaded_x: Any, owner: Any, client_x: Any,
                   num_examples: Any, *, block: int = 512) -> dict[str, Any]:
  """Distance of every uploaded image to its sender's raw images.

  Args:
    uploaded_x: ``[M, H, W, Ch]`` uint8 images as transmitted.
    owner: ``[M]`` index of the client that sent each image.
    client_x: ``[C, N_max, H, W, Ch]`` uint8 raw client images (padded).
    num_examples: ``[C]`` real examples per client (padding is ignored).
    block: uploaded images per distance block (bounds host memory).

  Returns:
    ``{"uploaded_images", "identical_to_raw_count",
    "identical_to_raw_fraction", "near_copy_count", "near_copy_fraction",
    "nearest_raw_l2_min", "nearest_raw_l2_median"}``; the distances are
    ``None`` for an empty upload.

  Raises:
    ValueError: on non-uint8 images, mismatched shapes, or an owner outside
      ``[0, C)`` or with no raw data.
  """
  ux, own, cx, n = _validate(uploaded_x, owner, client_x, num_examples)
  m = ux.shape[0]
  if m == 0:
    return {"uploaded_images": 0, "identical_to_raw_count": 0,
            "identical_to_raw_fraction": 0.0, "near_copy_count": 0,
            "near_copy_fraction": 0.0, "nearest_raw_l2_min": None,
            "nearest_raw_l2_median": None}

  identical = _identical(ux, own, cx, n)
  nearest = np.zeros(m, np.float64)
  flat_u = ux.reshape(m, -1)
  for c in np.unique(own):  # host-side, once per run
    rows = np.flatnonzero(own == c)
    raw = cx[c, :int(n[c])].reshape(int(n[c]), -1)
    rf = raw.astype(np.float64) / 255.0
    r2 = (rf * rf).sum(1)
    for start in range(0, rows.size, block):
      idx = rows[start:start + block]
      uf = flat_u[idx].astype(np.float64) / 255.0
      d2 = (uf * uf).sum(1)[:, None] + r2[None, :] - 2.0 * uf @ rf.T
      nearest[idx] = np.sqrt(np.maximum(d2.min(axis=1), 0.0))
  # Byte-identical images are at distance 0 exactly, whatever the rounding
  # of the expansion above.
  nearest[identical] = 0.0
  count = int(identical.sum())
  # L2 over D pixels at an RMS of NEAR_COPY_RMS is NEAR_COPY_RMS * sqrt(D).
  near = int(np.sum(nearest <= NEAR_COPY_RMS * np.sqrt(flat_u.shape[1])))
  return {
      "uploaded_images": int(m),
      "identical_to_raw_count": count,
      "identical_to_raw_fraction": count / m,
      "near_copy_count": near,
      "near_copy_fraction": near / m,
      "nearest_raw_l2_min": float(nearest.min()),
      "nearest_raw_l2_median": float(np.median(nearest)),
  }


def _identical(ux: np.ndarray, own: np.ndarray, cx: np.ndarray,
               n: np.ndarray) -> np.ndarray:
  """``[M]`` whether each upload equals one of its sender's raw images."""
  m = ux.shape[0]
  identical = np.zeros(m, bool)
  if m == 0:
    return identical
  flat_u = ux.reshape(m, -1)
  for c in np.unique(own):  # host-side, once per run
    rows = np.flatnonzero(own == c)
    raw = cx[c, :int(n[c])].reshape(int(n[c]), -1)
    raw_bytes = {r.tobytes() for r in raw}
    identical[rows] = [flat_u[i].tobytes() in raw_bytes for i in rows]
  return identical


def identical_to_raw(uploaded_x: Any, owner: Any, client_x: Any,
                     num_examples: Any) -> np.ndarray:
  """``[M]`` bool: uploaded image ``i`` equals, byte for byte, a raw image of
  client ``owner[i]`` (arguments as in :func:`upload_privacy`)."""
  ux, own, cx, n = _validate(uploaded_x, owner, client_x, num_examples)
  return _identical(ux, own, cx, n)


def check_no_raw_upload(uploaded_x: Any, owner: Any, client_x: Any,
                        num_examples: Any, *, what: str = "KIP",
                        more_iterations: str = "a higher kip.min_iterations, "
                        "or no early stop: kip.stop_accuracy above 1, e.g. "
                        "--config.kip.stop_accuracy=2") -> None:
  """FedD3 App. G's guard on what is actually sent: no raw image leaves.

  :func:`fedjax_dd.distill.kip.check_privacy` refuses supports that hold a
  whole class before compute; this guard catches an image the distiller
  barely moved (an early KIP stop), quantised back to its raw bytes. FedD3
  and HFLDD (:func:`fedjax_dd.algorithms.hfldd.distill_members`) both run
  it unless ``allow_raw_upload``.

  Args:
    uploaded_x, owner, client_x, num_examples: as :func:`upload_privacy`.
    what: the uploads' name in the message.
    more_iterations: the settings that give the distiller more iterations.

  Raises:
    RawUploadError: naming how many uploads are raw, from which clients,
      and what to change.
  """
  ux, own_all, cx, n = _validate(uploaded_x, owner, client_x, num_examples)
  identical = _identical(ux, own_all, cx, n)
  if identical.any():
    own = np.asarray(owner)[identical]
    clients = np.unique(own)
    # KIP's gradient is zero on a constant image or a sender whose images
    # are all the same, so "run more iterations" would not help there.
    flat = ux[identical].reshape(int(identical.sum()), -1)
    constant = flat.min(axis=1) == flat.max(axis=1)
    uniform = np.array([
        len({r.tobytes() for r in cx[c, :int(n[c])]}) == 1 for c in own])
    stuck = constant | uniform
    if stuck.all():
      raise RawUploadError(
          f"{int(identical.sum())} of {identical.size} {what} images to "
          f"upload are byte-identical to a raw image of their sender "
          f"({clients.size} clients, e.g. {clients[:5].tolist()}), and "
          f"{int(constant.sum())} of them are constant images (one value in "
          "every pixel)"
          + (f", {int((uniform & ~constant).sum())} from clients whose images"
             " are all the same" if (uniform & ~constant).any() else "")
          + ": an image cannot be distilled away from a set of identical "
          "images (the gradient is zero), so more iterations give the same "
          "images. Check the dataset (constant images carry nothing to "
          "distill), or set allow_raw_upload=True to send them as they are.")
    raise RawUploadError(
        f"{int(identical.sum())} of {identical.size} {what} images to upload "
        f"are byte-identical to a raw image of their sender ({clients.size} "
        f"clients, e.g. {clients[:5].tolist()}): the distiller stopped before "
        f"it moved them (FedD3 App. G). Run more iterations "
        f"({more_iterations}), or set allow_raw_upload=True to accept raw "
        "uploads.")
