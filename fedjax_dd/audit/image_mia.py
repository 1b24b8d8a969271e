"""Membership inference on image uploads: the nearest upload of the class.

Threat model (``docs/privacy.md``): an honest-but-curious server keeps
every upload and holds population data disjoint from every client's. An
image upload (FedD3's and HFLDD's KIP images) leaks membership when a
client's training images lie closer to it than other images of the same
classes. A candidate scores minus its distance to the nearest upload of its
class, judged as in Carlini et al. 2022 (:mod:`fedjax_dd.audit.membership`)
against held-out non-members of the same classes.

Distances are taken in pixels in ``[0, 1]`` and in a fixed random feature
space ``sqrt(2 / F) relu(x W)``, ``W [D, F] ~ N(0, 1)``
(:func:`random_projection`): Cho & Saul's 2009 arc-cosine features, whose
inner products approach the one-hidden-layer ReLU NNGP kernel KIP distils
with. The ``*_batched`` forms add the client axis through
:class:`fedjax_dd.core.clients.ClientMapper`.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.audit import _inputs
from fedjax_dd.audit.membership import FPRS, MIAResult, mia_metrics
from fedjax_dd.audit.membership import mia_metrics_batched
from fedjax_dd.core import checks
from fedjax_dd.core.clients import ClientMapper


def random_projection(key: jax.Array, image_shape: Sequence[int],
                      dim: int = 2048) -> jax.Array:
  """The fixed feature space's weights ``W [D, F] ~ N(0, 1)``.

  Args:
    key: the embedding's key; one key, one feature space.
    image_shape: ``[H, W, Ch]`` of the images (``D = H * W * Ch``).
    dim: the number of features ``F``.

  Returns:
    ``[D, F]`` float32.
  """
  checks.check_int("dim", dim, 1)
  d = math.prod(int(s) for s in image_shape)
  return jax.random.normal(key, (d, dim), jnp.float32)


def unit_pixels(x: jax.Array) -> jax.Array:
  """``[N, H, W, Ch]`` images as ``[N, D]`` float32 in ``[0, 1]``: uint8
  pixels are divided by 255, float images are taken as already scaled."""
  flat = x.reshape(x.shape[0], -1)
  if jnp.issubdtype(x.dtype, jnp.integer):
    return flat.astype(jnp.float32) / 255.0
  return flat.astype(jnp.float32)


def embed(x: jax.Array, projection: jax.Array | None) -> jax.Array:
  """``[N, H, W, Ch]`` images in the audit's space: ``[N, D]`` pixels for
  ``projection=None``, else ``[N, F]`` features ``sqrt(2 / F) relu(x W)``."""
  pixels = unit_pixels(x)
  if projection is None:
    return pixels
  h = jnp.dot(pixels, projection, precision=jax.lax.Precision.HIGHEST)
  return jnp.sqrt(2.0 / projection.shape[1]) * jax.nn.relu(h)


def upload_classes(upload_y: jax.Array) -> jax.Array:
  """``[M]`` the class of each upload: hard labels as given, soft or KIP
  label rows ``[M, K]`` by their argmax."""
  return upload_y if upload_y.ndim == 1 else jnp.argmax(upload_y, axis=-1)


def nearest_upload_distance(x: jax.Array, y: jax.Array, upload_x: jax.Array,
                            upload_y: jax.Array, num_uploads: jax.Array,
                            projection: jax.Array | None = None) -> jax.Array:
  """L2 distance from each candidate to the nearest upload of its class.

  Args:
    x: ``[N, H, W, Ch]`` candidate images (uint8, or floats in ``[0, 1]``).
    y: ``[N]`` their classes.
    upload_x: ``[M, H, W, Ch]`` uploaded images (padded).
    upload_y: ``[M]`` hard labels or ``[M, K]`` label rows.
    num_uploads: ``[]`` valid upload rows; rows past it are ignored.
    projection: ``None`` (pixel space) or :func:`random_projection`'s
      ``[D, F]``.

  Returns:
    ``[N]`` float32 distances; ``inf`` where no upload has the class.
  """
  a, b = embed(x, projection), embed(upload_x, projection)
  # Differences, not |a|^2 + |b|^2 - 2ab: a copy is at 0 exactly and a
  # near-copy survives float32 rounding. Steps hold about 2^24 elements.
  rows = max(1, min(a.shape[0], 2 ** 24 // max(b.size, 1)))
  d2 = jax.lax.map(lambda ai: jnp.sum((ai - b) ** 2, -1), a, batch_size=rows)
  same = ((upload_classes(upload_y)[None, :] == y[:, None])
          & (jnp.arange(b.shape[0]) < num_uploads)[None, :])
  return jnp.sqrt(jnp.where(same, d2, jnp.inf).min(1))


def image_mia_scores(x: jax.Array, y: jax.Array, upload_x: jax.Array,
                     upload_y: jax.Array, num_uploads: jax.Array,
                     projection: jax.Array | None = None) -> jax.Array:
  """``[N]`` membership scores, minus :func:`nearest_upload_distance`
  (arguments as there): higher means more likely a member."""
  return -nearest_upload_distance(x, y, upload_x, upload_y, num_uploads,
                                  projection)


_scores = jax.jit(image_mia_scores)


@functools.lru_cache(maxsize=None)
def _batched(mapper: ClientMapper):
  return mapper.map(image_mia_scores, (0, 0, 0, 0, 0, None))


def _check(x, y, upload_x, upload_y, num_uploads, projection, lead,
           prefix=""):
  """Checks one client's (``lead=0``) or a stack's (``lead=1``) arguments
  (the candidates named ``prefix + "x"``) and returns the upload counts."""
  rank = 4 + lead
  sx = _inputs.shape(prefix + "x", x, rank,
                     "images [" + "C, " * lead + "N, H, W, Ch]")
  su = _inputs.shape("upload_x", upload_x, rank,
                     "images [" + "C, " * lead + "M, H, W, Ch]")
  _inputs.same(prefix + "y", np.shape(y), sx[:lead + 1],
               "one class per candidate, shape")
  _inputs.labels(prefix + "y", y)
  _inputs.same("upload_x", su[lead + 1:], sx[lead + 1:],
               "images of the candidates' shape [H, W, Ch] =")
  _inputs.same("upload_x", su[:lead], sx[:lead],
               f"as many clients as {prefix}x,")
  sy = np.shape(upload_y)
  if sy[:lead + 1] != su[:lead + 1] or len(sy) not in (lead + 1, lead + 2):
    checks.refuse("upload_y", f"labels of shape {su[:lead + 1]} or label "
                  f"rows {su[:lead + 1] + ('K',)}", sy)
  if len(sy) == lead + 1:
    _inputs.labels("upload_y", upload_y)
  if projection is not None:
    _inputs.same("projection", np.shape(projection)[:1],
                 (math.prod(sx[lead + 1:]),),
                 "[D, F] weights with D = H * W * Ch, D =")
  if num_uploads is None:
    num_uploads = np.full(su[:lead], su[lead], np.int32)
  return _inputs.counts("num_uploads", num_uploads, su[0] if lead else None,
                        su[lead])


def image_mia(members_x: Any, members_y: Any, nonmembers_x: Any,
              nonmembers_y: Any, upload_x: Any, upload_y: Any,
              num_uploads: Any = None, *, projection: Any = None,
              fprs: Sequence[float] = FPRS) -> MIAResult:
  """One client's image upload audited for membership.

  Args:
    members_x: ``[N, H, W, Ch]`` the client's training images.
    members_y: ``[N]`` their classes.
    nonmembers_x: ``[N', H, W, Ch]`` held-out images of the same classes.
    nonmembers_y: ``[N']`` their classes.
    upload_x: ``[M, H, W, Ch]`` what the client uploaded.
    upload_y: ``[M]`` its hard labels or ``[M, K]`` label rows.
    num_uploads: valid upload rows (default: all ``M``).
    projection: ``None`` for pixel space, or :func:`random_projection`'s
      ``[D, F]`` for the feature space.
    fprs: FPRs of the reported TPRs, each in ``(0, 1)``.

  Returns:
    The :class:`~fedjax_dd.audit.membership.MIAResult`.

  Raises:
    fedjax_dd.core.checks.SettingError: empty member or non-member sets,
      mismatched shapes, labels that are no class indices, counts outside
      ``[1, M]``, an FPR outside ``(0, 1)``.
  """
  fprs = _inputs.fprs(fprs)
  n = _check(members_x, members_y, upload_x, upload_y, num_uploads,
             projection, 0, "members_")
  _check(nonmembers_x, nonmembers_y, upload_x, upload_y, n, projection, 0,
         "nonmembers_")
  for name, a in (("members_x", members_x), ("nonmembers_x", nonmembers_x)):
    if np.shape(a)[0] == 0:
      checks.refuse(name, "a non-empty set of images", np.shape(a))
  scores = [_scores(a, b, upload_x, upload_y, n, projection)
            for a, b in ((members_x, members_y),
                         (nonmembers_x, nonmembers_y))]
  return mia_metrics(*scores, fprs=fprs)


def image_mia_scores_batched(x: Any, y: Any, upload_x: Any, upload_y: Any,
                             num_uploads: Any, projection: Any = None, *,
                             mapper: ClientMapper | None = None) -> jax.Array:
  """:func:`image_mia_scores` of every client, ``[C, N_max]``.

  Args:
    x: ``[C, N_max, H, W, Ch]`` candidates (padded client stack).
    y: ``[C, N_max]`` their classes.
    upload_x: ``[C, M_max, H, W, Ch]`` each client's upload (padded).
    upload_y: ``[C, M_max]`` or ``[C, M_max, K]``.
    num_uploads: ``[C]`` valid upload rows, each in ``[1, M_max]``.
    projection: as :func:`image_mia_scores`, shared by every client.
    mapper: the client-axis backend (default ``ClientMapper()``).

  Returns:
    ``[C, N_max]`` scores; rows past a client's count are padding.
  """
  n = _check(x, y, upload_x, upload_y, num_uploads, projection, 1)
  return _batched(mapper or ClientMapper())(x, y, upload_x, upload_y, n,
                                            projection)


def image_mia_batched(members_x: Any, members_y: Any, num_members: Any,
                      nonmembers_x: Any, nonmembers_y: Any,
                      num_nonmembers: Any, upload_x: Any, upload_y: Any,
                      num_uploads: Any, *, projection: Any = None,
                      fprs: Sequence[float] = FPRS,
                      mapper: ClientMapper | None = None) -> list[MIAResult]:
  """:func:`image_mia` of every client of padded stacks.

  Args:
    members_x: ``[C, N_max, H, W, Ch]`` the clients' training images
      (:class:`fedjax_dd.data.stacked.ClientData`'s ``x``).
    members_y: ``[C, N_max]`` their classes.
    num_members: ``[C]`` valid member rows.
    nonmembers_x: ``[C, N'_max, H, W, Ch]`` held-out images per client.
    nonmembers_y: ``[C, N'_max]`` their classes.
    num_nonmembers: ``[C]`` valid non-member rows.
    upload_x: ``[C, M_max, H, W, Ch]`` each client's upload.
    upload_y: ``[C, M_max]`` or ``[C, M_max, K]``.
    num_uploads: ``[C]`` valid upload rows.
    projection: as :func:`image_mia`.
    fprs: as :func:`image_mia`.
    mapper: the client-axis backend (default ``ClientMapper()``).

  Returns:
    ``C`` :class:`~fedjax_dd.audit.membership.MIAResult`, in client order.

  Raises:
    fedjax_dd.core.checks.SettingError: as :func:`image_mia`, and a count
      outside ``[1, N_max]``.
  """
  fprs = _inputs.fprs(fprs)
  n = _check(members_x, members_y, upload_x, upload_y, num_uploads,
             projection, 1, "members_")
  _check(nonmembers_x, nonmembers_y, upload_x, upload_y, n, projection, 1,
         "nonmembers_")
  for name, a, k in (("num_members", members_x, num_members),
                     ("num_nonmembers", nonmembers_x, num_nonmembers)):
    _inputs.counts(name, k, np.shape(a)[0], np.shape(a)[1])
  scores = _batched(mapper or ClientMapper())
  members = scores(members_x, members_y, upload_x, upload_y, n, projection)
  nonmembers = scores(nonmembers_x, nonmembers_y, upload_x, upload_y, n,
                      projection)
  return mia_metrics_batched(members, num_members, nonmembers,
                             num_nonmembers, fprs=fprs)
