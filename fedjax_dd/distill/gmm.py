"""FedD3's Gaussian-mixture coreset (host side, NumPy + scikit-learn).

FedD3 (Song et al., "Federated Learning via Decentralized Dataset
Distillation in Resource-Constrained Edge Environments", Sec. 3.1) lets each
client upload, instead of raw data, the component means of a Gaussian
mixture fitted per class to its local images. This module fits those
mixtures with :class:`sklearn.mixture.GaussianMixture` on flattened pixels.

This is a host-side module: pass NumPy arrays (``jax.device_get`` first).
Randomness comes only from the given ``np.random.Generator``.

Privacy (FedD3 App. G). The uploaded means are raw images whenever a
component is fitted to a single sample. A class with a single distinct image
(in particular a class with one sample) is refused unless
``allow_raw_upload=True``. The guard does not cover every such case: when a
class has ``1 < distinct <= images_per_class`` distinct images,
``n_components = distinct`` and each component typically collapses onto one
image (k-means initialisation gives each its own cluster), so the means are,
up to rounding, raw images as well.
"""

from __future__ import annotations

import numpy as np
from sklearn import mixture

_COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")


def _check_common(images_per_class, rng, covariance_type, max_iter) -> None:
  if not isinstance(images_per_class, (int, np.integer)) or (
      images_per_class < 1):
    raise ValueError(f"images_per_class must be an int >= 1, got "
                     f"{images_per_class!r}.")
  if not isinstance(rng, np.random.Generator):
    raise ValueError(f"rng must be a np.random.Generator, got {type(rng)}.")
  if covariance_type not in _COVARIANCE_TYPES:
    raise ValueError(f"covariance_type must be one of {_COVARIANCE_TYPES}, "
                     f"got {covariance_type!r}.")
  if not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
    raise ValueError(f"max_iter must be an int >= 1, got {max_iter!r}.")


def gmm_coreset(
    x: np.ndarray,
    y: np.ndarray,
    *,
    images_per_class: int,
    rng: np.random.Generator,
    covariance_type: str = "diag",
    max_iter: int = 100,
    allow_raw_upload: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """Distils one client's images into per-class Gaussian-mixture means.

  For every class present in ``y`` (ascending), a ``GaussianMixture`` with
  ``n_components = min(images_per_class, distinct)`` is fitted to the class's
  images flattened to float64 vectors, where ``distinct`` is the number of
  distinct images of the class (the sample count unless there are exact
  duplicates); its means, clipped to ``[0, 255]`` and rounded, are the
  distilled images. A class with fewer (distinct) samples than
  ``images_per_class`` therefore yields fewer images. Components that end
  with no responsibility (effective count below 1e-6) are dropped: their
  "mean" is a meaningless near-black image. ``covariance_type="full"``
  stores ``[n_components, D, D]`` covariances (``D = H * W * Ch``) and is
  only practical for small images.

  Each class's mixture is seeded with an int drawn from ``rng`` (one draw per
  class, in class order, whatever the class size), so results are
  reproducible for a fixed generator state.

  Args:
    x: images ``[N, H, W, Ch]`` (any ``[N, ...]`` shape) of dtype uint8.
    y: integer labels ``[N]``.
    images_per_class: mixture components per class, >= 1.
    rng: NumPy generator; the only source of randomness.
    covariance_type: ``"diag"`` (default), ``"full"``, ``"tied"`` or
      ``"spherical"``.
    max_iter: EM iterations.
    allow_raw_upload: permit classes with a single distinct image, whose
      "mean" is that raw image (uploaded once).

  Returns:
    ``(x_distilled [M, H, W, Ch] uint8, y_distilled [M] int32)`` with
    ``M <= sum_c min(images_per_class, count_c)`` (equality unless a class has
    duplicates or an empty component), grouped by ascending class.

  Raises:
    ValueError: on bad arguments or shapes, non-uint8 images, or a class
      with a single distinct image while ``allow_raw_upload`` is False.
  """
  _check_common(images_per_class, rng, covariance_type, max_iter)
  x = np.asarray(x)
  y = np.asarray(y)
  if x.dtype != np.uint8:
    raise ValueError(f"x must be uint8 pixel images in [0, 255], got dtype "
                     f"{x.dtype}; the distilled means are clipped to that "
                     f"range.")
  if x.ndim < 2:
    raise ValueError(f"x must be [N, ...] with at least 2 dims, got {x.shape}.")
  if y.shape != (x.shape[0],):
    raise ValueError(f"y must have shape [{x.shape[0]}], got {y.shape}.")
  if not np.issubdtype(y.dtype, np.integer):
    raise ValueError(f"y must hold integer labels, got dtype {y.dtype}.")

  image_shape = x.shape[1:]
  xs, ys = [], []
  for c in np.unique(y):
    members = x[y == c].reshape(-1, int(np.prod(image_shape)))
    count = members.shape[0]
    distinct = np.unique(members, axis=0).shape[0]
    seed = int(rng.integers(0, 2**31 - 1))
    if distinct == 1:
      if not allow_raw_upload:
        what = "a single sample" if count == 1 else (
            f"{count} copies of a single image")
        raise ValueError(
            f"class {int(c)} has {what}: its Gaussian-mixture mean is the raw "
            f"image, which would leak it (FedD3 App. G). Pass "
            f"allow_raw_upload=True to accept this.")
      means = members[:1].astype(np.float64)
    else:
      gm = mixture.GaussianMixture(
          n_components=min(images_per_class, distinct),
          covariance_type=covariance_type,
          max_iter=max_iter,
          random_state=seed)
      gm.fit(members.astype(np.float64))
      # sklearn divides by (N_k + 10 eps): an empty component's mean is ~0.
      means = gm.means_[gm.weights_ * count > 1e-6]
    xs.append(np.clip(np.rint(means), 0, 255).astype(np.uint8))
    ys.append(np.full(means.shape[0], c, dtype=np.int32))
  if not xs:
    return (np.zeros((0,) + image_shape, np.uint8), np.zeros((0,), np.int32))
  x_out = np.concatenate(xs).reshape((-1,) + image_shape)
  return x_out, np.concatenate(ys)


def gmm_coreset_clients(
    x: np.ndarray,
    y: np.ndarray,
    num_examples: np.ndarray,
    *,
    images_per_class: int,
    rng: np.random.Generator,
    covariance_type: str = "diag",
    max_iter: int = 100,
    allow_raw_upload: bool = False,
    pad_to: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """:func:`gmm_coreset` for every client of a padded client stack.

  A host loop over clients (scikit-learn is not batched). Client ``i`` uses
  ``x[i, :num_examples[i]]`` and a child generator ``rng.spawn(C)[i]``, so
  its result does not depend on the other clients. Outputs are padded with
  zeros (images and labels) up to ``S_max``; ``counts`` tells the valid
  prefix of each row, as ``num_examples`` does for the input.

  Args:
    x: padded images ``[C, N_max, H, W, Ch]`` uint8.
    y: padded labels ``[C, N_max]`` int.
    num_examples: valid examples per client ``[C]``.
    images_per_class: mixture components per class.
    rng: NumPy generator.
    covariance_type: as in :func:`gmm_coreset`.
    max_iter: as in :func:`gmm_coreset`.
    allow_raw_upload: as in :func:`gmm_coreset`.
    pad_to: fixed ``S_max`` (e.g. ``images_per_class * num_classes``, to
      keep shapes stable across calls); default the largest count.

  Returns:
    ``(x_out [C, S_max, H, W, Ch] uint8, y_out [C, S_max] int32,
    counts [C] int32)``.

  Raises:
    ValueError: on inconsistent shapes, a ``pad_to`` below some count, or
      any error of :func:`gmm_coreset` (prefixed with the client index).
  """
  _check_common(images_per_class, rng, covariance_type, max_iter)
  x = np.asarray(x)
  y = np.asarray(y)
  num_examples = np.asarray(num_examples)
  if x.ndim < 3:
    raise ValueError(f"x must be [C, N_max, ...], got shape {x.shape}.")
  num_clients, n_max = x.shape[:2]
  if y.shape != (num_clients, n_max):
    raise ValueError(f"y must have shape [{num_clients}, {n_max}], got "
                     f"{y.shape}.")
  if num_examples.shape != (num_clients,):
    raise ValueError(f"num_examples must have shape [{num_clients}], got "
                     f"{num_examples.shape}.")
  if np.any(num_examples < 0) or np.any(num_examples > n_max):
    raise ValueError(f"num_examples must lie in [0, {n_max}], got "
                     f"{num_examples}.")
  if pad_to is not None and pad_to < 0:
    raise ValueError(f"pad_to must be None or >= 0, got {pad_to!r}.")

  image_shape = x.shape[2:]
  children = rng.spawn(num_clients)
  results = []
  for i in range(num_clients):
    n = int(num_examples[i])
    try:
      results.append(gmm_coreset(
          x[i, :n], y[i, :n], images_per_class=images_per_class,
          rng=children[i], covariance_type=covariance_type,
          max_iter=max_iter, allow_raw_upload=allow_raw_upload))
    except ValueError as e:
      raise ValueError(f"client {i}: {e}") from e
  counts = np.array([r[1].shape[0] for r in results], np.int32)
  s_max = int(counts.max(initial=0)) if pad_to is None else int(pad_to)
  if np.any(counts > s_max):
    raise ValueError(f"pad_to={pad_to} is smaller than the largest client "
                     f"coreset ({int(counts.max())} images).")
  x_out = np.zeros((num_clients, s_max) + image_shape, np.uint8)
  y_out = np.zeros((num_clients, s_max), np.int32)
  for i, (xi, yi) in enumerate(results):
    x_out[i, :xi.shape[0]] = xi
    y_out[i, :yi.shape[0]] = yi
  return x_out, y_out, counts
