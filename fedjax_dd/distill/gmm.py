"""FedD3's Gaussian-mixture coreset (host side, NumPy + scikit-learn).

FedD3 (Song et al., "Federated Learning via Decentralized Dataset
Distillation in Resource-Constrained Edge Environments", Sec. 3.1) lets each
client upload, instead of raw data, the component means of a Gaussian
mixture fitted per class to its local images (scikit-learn, on flattened
pixels). Pass NumPy arrays; randomness comes only from the given
``np.random.Generator``.

Privacy (FedD3 App. G). A mean is a raw image whenever a component is fitted
to a single image. Unless ``allow_raw_upload=True``, the guard refuses (1)
before fitting, a class with ``distinct <= images_per_class`` distinct
images (each component then gets its own image); and (2) after fitting, a
class with a rounded mean byte-identical to one of its images. So with the
guard on, no uploaded image equals a raw image of its class.
"""

from __future__ import annotations

import numpy as np
from sklearn import mixture

from fedjax_dd.data import validate

_COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")


def _check_common(images_per_class, rng, covariance_type, max_iter) -> None:
  validate.positive_int("images_per_class", images_per_class)
  if not isinstance(rng, np.random.Generator):
    raise ValueError(f"rng must be a np.random.Generator, got {type(rng)}.")
  if covariance_type not in _COVARIANCE_TYPES:
    raise ValueError(f"covariance_type must be one of {_COVARIANCE_TYPES}, "
                     f"got {covariance_type!r}.")
  if not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
    raise ValueError(f"max_iter must be an int >= 1, got {max_iter!r}.")


def _check_raw_classes(x: np.ndarray, y: np.ndarray,
                       images_per_class: int) -> None:
  """Refuses a class with at most ``images_per_class`` distinct images."""
  flat = x.reshape(x.shape[0], int(np.prod(x.shape[1:])))
  for c in np.unique(y):
    members = flat[y == c]
    count = members.shape[0]
    distinct = np.unique(members, axis=0).shape[0]
    if distinct <= images_per_class:
      what = (f"{count} example{'s' * (count != 1)}" if distinct == count
              else f"{count} examples, {distinct} distinct")
      raise ValueError(
          f"class {int(c)} holds {what} <= images_per_class="
          f"{images_per_class}: each Gaussian-mixture mean would be one of "
          "its raw images, which would leak them (FedD3 App. G). Lower "
          f"images_per_class below {distinct}, or pass allow_raw_upload=True "
          "to accept this.")


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

  For every class in ``y`` (ascending), a ``GaussianMixture`` with
  ``n_components = min(images_per_class, distinct)`` (``distinct``: the
  class's distinct images) is fitted to its flattened float64 images; its
  means, clipped to ``[0, 255]`` and rounded, are the distilled images.
  Components with no responsibility (effective count below 1e-6) are
  dropped: their "mean" is a meaningless near-black image.
  ``covariance_type="full"`` stores ``[n_components, D, D]`` covariances
  (``D = H * W * Ch``), practical only for small images.

  Each class's mixture is seeded with one int drawn from ``rng`` per class,
  in class order, so results are reproducible for a fixed generator state.

  Args:
    x: images ``[N, H, W, Ch]`` (any ``[N, ...]`` shape) of dtype uint8.
    y: integer labels ``[N]``.
    images_per_class: mixture components per class, >= 1.
    rng: NumPy generator; the only source of randomness.
    covariance_type: ``"diag"`` (default), ``"full"``, ``"tied"`` or
      ``"spherical"``.
    max_iter: EM iterations.
    allow_raw_upload: permit uploads equal to raw images (module
      docstring); a class with a single distinct image is uploaded once.

  Returns:
    ``(x_distilled [M, H, W, Ch] uint8, y_distilled [M] int32)``, grouped
    by ascending class, ``M <= sum_c min(images_per_class, count_c)``.

  Raises:
    ValueError: on bad arguments or shapes, non-uint8 images, non-integer
      or negative labels, or, unless ``allow_raw_upload``, a raw upload
      (module docstring: before or after fitting, naming the class).
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
  validate.labels_in_range("y", y, np.iinfo(np.int32).max)
  if not allow_raw_upload:
    _check_raw_classes(x, y, images_per_class)

  image_shape = x.shape[1:]
  xs, ys = [], []
  for c in np.unique(y):
    members = x[y == c].reshape(-1, int(np.prod(image_shape)))
    count = members.shape[0]
    unique = np.unique(members, axis=0)
    distinct = unique.shape[0]
    seed = int(rng.integers(0, 2**31 - 1))
    if distinct == 1:
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
      if not allow_raw_upload:
        sent = np.clip(np.rint(means), 0, 255).astype(np.uint8)
        raw = {r.tobytes() for r in unique}
        same = sum(m.tobytes() in raw for m in sent)
        if same:
          raise ValueError(
              f"class {int(c)} ({count} examples, images_per_class="
              f"{images_per_class}): {same} of its {len(sent)} "
              "Gaussian-mixture means are byte-identical to raw images "
              "(components fitted to a single image), which would leak them "
              "(FedD3 App. G). Lower images_per_class, or pass "
              "allow_raw_upload=True to accept this.")
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

  Client ``i`` uses ``x[i, :num_examples[i]]`` and the child generator
  ``rng.spawn(C)[i]``, so its result does not depend on the other clients.
  Outputs are zero-padded up to ``S_max``; ``counts`` gives each row's valid
  prefix.

  Args:
    x: padded images ``[C, N_max, H, W, Ch]`` uint8.
    y: padded labels ``[C, N_max]`` int.
    num_examples: valid examples per client ``[C]``.
    images_per_class: mixture components per class.
    rng: NumPy generator.
    covariance_type: as in :func:`gmm_coreset`.
    max_iter: as in :func:`gmm_coreset`.
    allow_raw_upload: as in :func:`gmm_coreset`.
    pad_to: fixed ``S_max``, to keep shapes stable across calls; default
      the largest count.

  Returns:
    ``(x_out [C, S_max, H, W, Ch] uint8, y_out [C, S_max] int32,
    counts [C] int32)``.

  Raises:
    ValueError: on inconsistent shapes, a ``pad_to`` below some count, or
      any error of :func:`gmm_coreset` (prefixed with the client index);
      every client's arguments and privacy are checked before any is fitted.
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
  if not np.issubdtype(num_examples.dtype, np.integer):
    raise ValueError(f"num_examples must be [C] = [{num_clients}] integer "
                     f"counts, got dtype {num_examples.dtype}.")
  if np.any(num_examples < 0) or np.any(num_examples > n_max):
    raise ValueError(f"num_examples must lie in [0, {n_max}], got "
                     f"{num_examples}.")
  if pad_to is not None and pad_to < 0:
    raise ValueError(f"pad_to must be None or >= 0, got {pad_to!r}.")

  if x.dtype != np.uint8:
    raise ValueError(f"x must be [C, N_max, ...] uint8 pixel images in "
                     f"[0, 255], got dtype {x.dtype}.")
  if not np.issubdtype(y.dtype, np.integer):
    raise ValueError(f"y must be [C, N_max] integer class indices, got dtype "
                     f"{y.dtype}.")
  # Every client's privacy check before any client is fitted.
  for i in range(num_clients):
    n = int(num_examples[i])
    try:
      validate.labels_in_range("y", y[i, :n], np.iinfo(np.int32).max)
      if not allow_raw_upload:
        _check_raw_classes(x[i, :n], y[i, :n], images_per_class)
    except ValueError as e:
      raise ValueError(f"client {i}: {e}") from None

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
