"""Reconstruction and label leakage of an upload.

Reconstruction: for each of a client's images (in ``[0, 1]``), the best
match among its upload by PSNR and by SSIM (Wang, Bovik, Sheikh & Simoncelli
2004: 11 x 11 Gaussian window, sigma 1.5, ``K1 = 0.01``, ``K2 = 0.03``, map
averaged over valid positions and channels), and the fraction matched at or
above a PSNR threshold.

Label leakage: the total-variation distance between the label histogram the
server reads from the upload (hard labels, label rows, or a model's mean
softmax on a probe set) and the true one (0: it leaks whole; 1: disjoint).

Each function is written for one client; the ``*_batched`` forms add the
client axis through :class:`fedjax_dd.core.clients.ClientMapper`.
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.audit import _inputs
from fedjax_dd.audit.image_mia import unit_pixels
from fedjax_dd.core import checks
from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.core.task import Classifier

PSNR_THRESHOLD = 30.0
"""Default PSNR (dB) at or above which an image counts as reconstructed: a
root-mean-square error of ``10**(-1.5)``, about 8 grey levels of 255."""

_HI = jax.lax.Precision.HIGHEST


@flax.struct.dataclass
class Reconstruction:
  """One client's best matches among its upload.

  Attributes:
    best_psnr: ``[N]`` the best PSNR (dB) of each image over the uploads;
      ``inf`` for an exact copy.
    best_ssim: ``[N]`` the best SSIM of each image (1.0 for a copy).
    fraction_above: ``[]`` the share of the valid images whose best PSNR is
      at or above the threshold.
  """
  best_psnr: jax.Array
  best_ssim: jax.Array
  fraction_above: jax.Array


def psnr(a: jax.Array, b: jax.Array) -> jax.Array:
  """PSNR in dB of two images ``[H, W, Ch]`` in ``[0, 1]``: ``10
  log10(1 / MSE)``, ``inf`` when they are equal."""
  mse = jnp.mean((a.astype(jnp.float32) - b.astype(jnp.float32)) ** 2)
  return jnp.where(mse > 0, -10.0 * jnp.log10(jnp.where(mse > 0, mse, 1.0)),
                   jnp.inf)


def _window(size: int, length: int, sigma: float) -> jax.Array:
  """``[length - size + 1, length]``: each row a normalised 1-D Gaussian of
  ``size`` taps placed at one valid position (a separable filter)."""
  g = np.exp(-0.5 * ((np.arange(size) - (size - 1) / 2) / sigma) ** 2)
  g /= g.sum()
  rows = np.zeros((length - size + 1, length), np.float32)
  for i in range(length - size + 1):
    rows[i, i:i + size] = g
  return jnp.asarray(rows)


def ssim(a: jax.Array, b: jax.Array, *, window: int = 11,
         sigma: float = 1.5) -> jax.Array:
  """SSIM of two images ``[H, W, Ch]`` in ``[0, 1]`` (Wang et al. 2004).

  Args:
    a: ``[H, W, Ch]`` image.
    b: ``[H, W, Ch]`` image.
    window: Gaussian window size, at most ``min(H, W)``.
    sigma: the window's standard deviation.

  Returns:
    ``[]`` the mean of the SSIM map.
  """
  th = _window(window, a.shape[0], sigma)
  tw = _window(window, a.shape[1], sigma)
  filt = lambda z: jnp.einsum("ih,hwc,jw->ijc", th, z, tw, precision=_HI)
  a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  c1, c2 = 0.01 ** 2, 0.03 ** 2
  ma, mb = filt(a), filt(b)
  va, vb, cov = (filt(a * a) - ma * ma, filt(b * b) - mb * mb,
                 filt(a * b) - ma * mb)
  smap = ((2 * ma * mb + c1) * (2 * cov + c2)
          / ((ma * ma + mb * mb + c1) * (va + vb + c2)))
  return smap.mean()


def reconstruction(x: jax.Array, num_examples: jax.Array, upload_x: jax.Array,
                   num_uploads: jax.Array,
                   psnr_threshold: jax.Array | float = PSNR_THRESHOLD, *,
                   window: int = 11, sigma: float = 1.5) -> Reconstruction:
  """Each of one client's images against its best-matching upload.

  Args:
    x: ``[N, H, W, Ch]`` the client's padded images (uint8 or ``[0, 1]``).
    num_examples: ``[]`` valid rows of ``x``.
    upload_x: ``[M, H, W, Ch]`` its upload, padded.
    num_uploads: ``[]`` valid rows of ``upload_x``.
    psnr_threshold: dB at or above which an image counts as reconstructed.
    window: SSIM's Gaussian window size.
    sigma: SSIM's window standard deviation.

  Returns:
    A :class:`Reconstruction` (PSNR and SSIM maximised separately).
  """
  shape = x.shape[1:]
  a = unit_pixels(x).reshape(x.shape[0], *shape)
  u = unit_pixels(upload_x).reshape(upload_x.shape[0], *shape)
  valid = jnp.arange(u.shape[0]) < num_uploads
  pair_ssim = jax.vmap(functools.partial(ssim, window=window, sigma=sigma),
                       (None, 0))

  def best(image):
    p = jnp.where(valid, jax.vmap(psnr, (None, 0))(image, u), -jnp.inf)
    s = jnp.where(valid, pair_ssim(image, u), -jnp.inf)
    return p.max(), s.max()

  best_psnr, best_ssim = jax.lax.map(best, a)
  rows = jnp.arange(a.shape[0]) < num_examples
  above = jnp.sum(rows & (best_psnr >= psnr_threshold))
  return Reconstruction(best_psnr, best_ssim,
                        above / jnp.maximum(num_examples, 1))


_reconstruction = jax.jit(reconstruction, static_argnames=("window", "sigma"))


@functools.lru_cache(maxsize=None)
def _recon_batched(mapper: ClientMapper):
  return mapper.map(reconstruction, (0, 0, 0, 0, None),
                    static_argnames=("window", "sigma"))


def _check_images(x, upload_x, num_examples, num_uploads, window, sigma,
                  lead):
  rank = 4 + lead
  sx = _inputs.shape("x", x, rank, "images [" + "C, " * lead + "N, H, W, Ch]")
  su = _inputs.shape("upload_x", upload_x, rank,
                     "images [" + "C, " * lead + "M, H, W, Ch]")
  _inputs.same("upload_x", su[lead + 1:], sx[lead + 1:],
               "images of the client images' shape [H, W, Ch] =")
  _inputs.same("upload_x", su[:lead], sx[:lead], "as many clients as x,")
  checks.check_int("window", window, 1, min(sx[lead + 1:lead + 3]),
                   fix="SSIM's window must fit in the image")
  checks.check_number("sigma", sigma, 0.0, low_open=True)
  num = sx[0] if lead else None
  if num_examples is None:
    num_examples = np.full(sx[:lead], sx[lead], np.int32)
  if num_uploads is None:
    num_uploads = np.full(su[:lead], su[lead], np.int32)
  return (_inputs.counts("num_examples", num_examples, num, sx[lead]),
          _inputs.counts("num_uploads", num_uploads, num, su[lead]))


def reconstruction_audit(x: Any, upload_x: Any, num_examples: Any = None,
                         num_uploads: Any = None, *,
                         psnr_threshold: float = PSNR_THRESHOLD,
                         window: int = 11,
                         sigma: float = 1.5) -> Reconstruction:
  """:func:`reconstruction` of one client, its arguments checked first.

  Args:
    x: ``[N, H, W, Ch]`` the client's images.
    upload_x: ``[M, H, W, Ch]`` its upload.
    num_examples: valid rows of ``x`` (default: all).
    num_uploads: valid rows of ``upload_x`` (default: all).
    psnr_threshold: as :func:`reconstruction`.
    window: as :func:`reconstruction`.
    sigma: as :func:`reconstruction`.

  Returns:
    A :class:`Reconstruction`.

  Raises:
    fedjax_dd.core.checks.SettingError: mismatched shapes, an empty image
      set, a window larger than the images, a non-finite threshold.
  """
  n, m = _check_images(x, upload_x, num_examples, num_uploads, window, sigma,
                       0)
  thr = checks.check_number("psnr_threshold", psnr_threshold)
  return _reconstruction(x, n, upload_x, m, thr, window=int(window),
                         sigma=float(sigma))


def reconstruction_batched(x: Any, num_examples: Any, upload_x: Any,
                           num_uploads: Any, *,
                           psnr_threshold: float = PSNR_THRESHOLD,
                           window: int = 11, sigma: float = 1.5,
                           mapper: ClientMapper | None = None
                           ) -> Reconstruction:
  """:func:`reconstruction` of every client, fields ``[C, ...]``.

  Args:
    x: ``[C, N_max, H, W, Ch]`` the clients' images (padded stack).
    num_examples: ``[C]`` valid rows.
    upload_x: ``[C, M_max, H, W, Ch]`` each client's upload (padded).
    num_uploads: ``[C]`` valid upload rows.
    psnr_threshold: as :func:`reconstruction`.
    window: as :func:`reconstruction`.
    sigma: as :func:`reconstruction`.
    mapper: the client-axis backend (default ``ClientMapper()``).

  Returns:
    A :class:`Reconstruction` with ``best_psnr``, ``best_ssim``
    ``[C, N_max]`` and ``fraction_above`` ``[C]``.

  Raises:
    fedjax_dd.core.checks.SettingError: as :func:`reconstruction_audit`.
  """
  n, m = _check_images(x, upload_x, num_examples, num_uploads, window, sigma,
                       1)
  thr = checks.check_number("psnr_threshold", psnr_threshold)
  return _recon_batched(mapper or ClientMapper())(
      x, n, upload_x, m, jnp.float32(thr), window=int(window),
      sigma=float(sigma))


# Label leakage ---------------------------------------------------------------


def label_histogram(y: jax.Array, num_examples: jax.Array,
                    num_classes: int) -> jax.Array:
  """``[K]`` the class shares of the valid rows of hard labels ``y [N]``."""
  valid = (jnp.arange(y.shape[0]) < num_examples).astype(jnp.float32)
  counts = jnp.zeros(num_classes, jnp.float32).at[y].add(valid)
  return counts / jnp.maximum(counts.sum(), 1.0)


def upload_label_histogram(upload_y: jax.Array, num_uploads: jax.Array,
                           num_classes: int) -> jax.Array:
  """``[K]`` the label histogram an upload shows.

  Hard labels ``[M]`` count once each. Label rows ``[M, K]`` (soft, or
  KIP's learned or mean-centred labels) are clipped at 0, scaled to sum 1
  (an all-zero row counts for nothing) and averaged.
  """
  if upload_y.ndim == 1:
    return label_histogram(upload_y, num_uploads, num_classes)
  rows = jnp.maximum(upload_y.astype(jnp.float32), 0.0)
  total = rows.sum(-1, keepdims=True)
  rows = jnp.where(total > 0, rows / jnp.where(total > 0, total, 1.0), 0.0)
  valid = (jnp.arange(rows.shape[0]) < num_uploads)[:, None]
  hist = jnp.where(valid, rows, 0.0).sum(0)
  return hist / jnp.maximum(hist.sum(), 1e-30)


def model_label_histogram(task: Classifier, params: Any, batch_stats: Any,
                          probe_x: jax.Array) -> jax.Array:
  """``[K]`` a model's mean softmax over a probe set ``[P, H, W, Ch]``
  (uint8, as the task's ``preprocess`` takes it)."""
  logits, _ = task.apply(params, batch_stats, task.preprocess(probe_x),
                         train=False)
  return jax.nn.softmax(logits, -1).mean(0)


def tv_distance(p: jax.Array, q: jax.Array) -> jax.Array:
  """Total-variation distance ``0.5 * sum |p - q|`` of two histograms
  ``[K]``, each first scaled to sum 1."""
  p = p / jnp.sum(p, -1, keepdims=True)
  q = q / jnp.sum(q, -1, keepdims=True)
  return 0.5 * jnp.abs(p - q).sum(-1)


def label_leakage(upload_y: jax.Array, num_uploads: jax.Array, y: jax.Array,
                  num_examples: jax.Array, num_classes: int) -> jax.Array:
  """``[]`` TV distance between :func:`upload_label_histogram` and the
  client's :func:`label_histogram` of ``y [N]``."""
  return tv_distance(upload_label_histogram(upload_y, num_uploads,
                                            num_classes),
                     label_histogram(y, num_examples, num_classes))


@functools.lru_cache(maxsize=None)
def _leak_batched(mapper: ClientMapper):
  return mapper.map(label_leakage, (0, 0, 0, 0),
                    static_argnames=("num_classes",))


def label_leakage_batched(upload_y: Any, num_uploads: Any, y: Any,
                          num_examples: Any, num_classes: int, *,
                          mapper: ClientMapper | None = None) -> jax.Array:
  """:func:`label_leakage` of every client, ``[C]``.

  Args:
    upload_y: ``[C, M_max]`` hard labels or ``[C, M_max, K]`` label rows.
    num_uploads: ``[C]`` valid upload rows.
    y: ``[C, N_max]`` the clients' true labels (padded).
    num_examples: ``[C]`` valid rows of ``y``.
    num_classes: ``K``.
    mapper: the client-axis backend (default ``ClientMapper()``).

  Returns:
    ``[C]`` TV distances.

  Raises:
    fedjax_dd.core.checks.SettingError: mismatched shapes, labels outside
      ``[0, K)``, counts outside ``[1, rows]``.
  """
  k = checks.check_int("num_classes", num_classes, 1)
  sy = _inputs.shape("y", y, 2, "labels [C, N_max]")
  su = np.shape(upload_y)
  if su[:1] != sy[:1] or len(su) not in (2, 3) or su[2:] not in ((), (k,)):
    checks.refuse("upload_y", f"[C, M_max] labels or [C, M_max, {k}] rows "
                  f"with C = {sy[0]}", su)
  _inputs.labels("y", y, k)
  if len(su) == 2:
    _inputs.labels("upload_y", upload_y, k)
  m = _inputs.counts("num_uploads", num_uploads, sy[0], su[1])
  n = _inputs.counts("num_examples", num_examples, sy[0], sy[1])
  return _leak_batched(mapper or ClientMapper())(upload_y, m, y, n,
                                                 num_classes=k)


def model_label_leakage(task: Classifier, params: Any, batch_stats: Any,
                        probe_x: jax.Array, y: jax.Array,
                        num_examples: jax.Array) -> jax.Array:
  """``[]`` TV distance between a model's mean softmax on ``probe_x``
  (:func:`model_label_histogram`) and the true histogram of ``y [N]``."""
  return tv_distance(
      model_label_histogram(task, params, batch_stats, probe_x),
      label_histogram(y, num_examples, task.num_classes))


def model_label_leakage_batched(task: Classifier, params: Any,
                                batch_stats: Any, probe_x: Any, y: Any,
                                num_examples: Any, *,
                                mapper: ClientMapper | None = None
                                ) -> jax.Array:
  """:func:`model_label_leakage` of every client's uploaded model, ``[C]``.

  Args:
    task: the clients' classifier.
    params: the uploaded models' parameters, leaves ``[C, ...]``.
    batch_stats: their BatchNorm statistics, ``[C, ...]`` (``{}``: no BN).
    probe_x: ``[P, H, W, Ch]`` uint8 probe images, the server's own, shared.
    y: ``[C, N_max]`` the clients' true labels (padded).
    num_examples: ``[C]`` valid rows of ``y``.
    mapper: the client-axis backend (default ``ClientMapper()``).

  Returns:
    ``[C]`` TV distances.

  Raises:
    fedjax_dd.core.checks.SettingError: an empty probe set, probe images of
      another shape than the task's, labels outside ``[0, K)``, counts
      outside ``[1, N_max]``.
  """
  sp = _inputs.shape("probe_x", probe_x, 4, "images [P, H, W, Ch]")
  _inputs.same("probe_x", sp[1:], task.input_shape,
               "images of the task's input shape")
  if sp[0] == 0:
    checks.refuse("probe_x", "a non-empty set of images", sp)
  sy = _inputs.shape("y", y, 2, "labels [C, N_max]")
  _inputs.labels("y", y, task.num_classes)
  n = _inputs.counts("num_examples", num_examples, sy[0], sy[1])
  fn = functools.partial(model_label_leakage, task)
  return (mapper or ClientMapper()).map(fn, (0, 0, None, 0, 0))(
      params, batch_stats, probe_x, y, n)
