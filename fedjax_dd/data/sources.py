"""Dataset loaders returning host NumPy arrays.

Every loader returns a :class:`Dataset` with images ``[N, H, W, C]`` uint8 and
labels ``[N]`` int32. Images stay uint8 on the host (4x smaller than float32);
:mod:`fedjax_dd.data.preprocess` converts them on device.

Names accepted by :func:`load_dataset`:

* ``"digits"``: scikit-learn's embedded 8x8 handwritten digits (1,797 images,
  no download). The offline default, used by tests and smoke runs.
* TFDS names ``"mnist"``, ``"fashion_mnist"``, ``"cifar10"``, ``"cifar100"``,
  ``"svhn_cropped"``: loaded through ``tensorflow_datasets`` (the ``tfds``
  extra, ``pip install "fedjax-dd[tfds]"``); see :func:`_load_tfds` for when
  TensorFlow is needed.
* ``"npz:PATH"``: a NumPy archive with keys ``x_train``, ``y_train``,
  ``x_test``, ``y_test`` (Keras ``load_data``'s convention), e.g.
  ``load_dataset("npz:../shared/datasets/mnist.npz")``.

:func:`resplit` pools a dataset's two splits and cuts them again at a given
train fraction (HFLDD's 80 % / 20 %).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import logging
import os
import sys
import zipfile
from typing import Any, Callable

import numpy as np

from fedjax_dd.data import validate

_NPZ_PREFIX = "npz:"
_NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")

# Fixed seed of the digits train/test split, so every run sees the same split.
_DIGITS_SPLIT_SEED = 0
_DIGITS_NUM_TEST = 360


# eq=False: field-wise == on arrays is ambiguous; compare arrays explicitly.
@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
  """A labelled image classification dataset held on the host.

  Attributes:
    name: The name it was loaded under (e.g. ``"digits"``, ``"npz:PATH"``).
    x_train: Train images ``[N, H, W, C]`` uint8.
    y_train: Train labels ``[N]`` int32 in ``[0, num_classes)``.
    x_test: Test images ``[M, H, W, C]`` uint8.
    y_test: Test labels ``[M]`` int32 in ``[0, num_classes)``.
    num_classes: Number of classes.
  """

  name: str
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int

  @property
  def image_shape(self) -> tuple[int, int, int]:
    """Shape ``(H, W, C)`` of one image."""
    return tuple(self.x_train.shape[1:])


def _check_images(x: np.ndarray, what: str, source: str) -> np.ndarray:
  """Validates one image array and adds a channel axis to ``[N, H, W]``."""
  x = np.asarray(x)
  if x.dtype != np.uint8:
    raise ValueError(
        f"{source}: {what} must have dtype uint8 with values 0..255, got "
        f"{x.dtype}. Convert it first, e.g. "
        "`np.clip(np.round(x * 255), 0, 255).astype(np.uint8)` for floats in "
        "[0, 1] or `x.astype(np.uint8)` for integers in 0..255.")
  if x.ndim == 3:  # Grayscale stored as [N, H, W].
    x = x[..., None]
  if x.ndim != 4:
    raise ValueError(
        f"{source}: {what} must have shape [N, H, W, C] or [N, H, W], got "
        f"shape {x.shape}.")
  if x.shape[0] == 0:
    raise ValueError(f"{source}: {what} is empty (0 examples).")
  return x


def _check_labels(y: np.ndarray, what: str, source: str) -> np.ndarray:
  """Validates one label array; ``[N, 1]`` (Keras CIFAR) is flattened."""
  y = np.asarray(y)
  if y.ndim == 2 and y.shape[1] == 1:
    y = y[:, 0]
  if y.ndim != 1:
    raise ValueError(
        f"{source}: {what} must have shape [N], got shape {y.shape}.")
  if not np.issubdtype(y.dtype, np.integer):
    raise ValueError(
        f"{source}: {what} must have an integer dtype, got {y.dtype}. "
        "Convert it with `y.astype(np.int32)`.")
  if y.size == 0:
    raise ValueError(f"{source}: {what} is empty (0 examples).")
  if y.min() < 0:
    raise ValueError(
        f"{source}: {what} contains negative labels (min {y.min()}); labels "
        "must be class indices 0..num_classes-1.")
  if y.max() > np.iinfo(np.int32).max:
    raise ValueError(
        f"{source}: {what} contains labels out of the int32 range "
        f"(max {y.max()}).")
  return y.astype(np.int32)


def _make_dataset(name: str, x_train, y_train, x_test, y_test,
                  num_classes: int | None = None) -> Dataset:
  """Validates raw arrays and builds a :class:`Dataset`.

  Args:
    name: Dataset name, also used as the source in error messages.
    x_train: Train images ``[N, H, W, C]`` or ``[N, H, W]`` uint8.
    y_train: Train labels ``[N]`` (or ``[N, 1]``), any integer dtype.
    x_test: Test images, same image shape as ``x_train``.
    y_test: Test labels.
    num_classes: Known number of classes, or None for max label + 1; a
      class without a training example is logged as a warning.

  Returns:
    The validated dataset.

  Raises:
    ValueError: On a wrong dtype, rank, empty split, mismatched lengths or
      image shapes, ``num_classes < 1``, or labels outside it.
  """
  x_train = _check_images(x_train, "x_train", name)
  x_test = _check_images(x_test, "x_test", name)
  y_train = _check_labels(y_train, "y_train", name)
  y_test = _check_labels(y_test, "y_test", name)
  for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
    if x.shape[0] != y.shape[0]:
      raise ValueError(
          f"{name}: x_{split} has {x.shape[0]} examples but y_{split} has "
          f"{y.shape[0]}.")
  if x_train.shape[1:] != x_test.shape[1:]:
    raise ValueError(
        f"{name}: train images have shape {x_train.shape[1:]} but test images "
        f"have shape {x_test.shape[1:]}.")
  max_label = int(max(y_train.max(), y_test.max()))
  if num_classes is None:
    num_classes = max_label + 1
  else:
    num_classes = validate.positive_int(f"{name}: num_classes", num_classes)
    for split, y in (("y_train", y_train), ("y_test", y_test)):
      bad = y >= num_classes
      if bad.any():
        vals = np.unique(y[bad])
        shown = ", ".join(str(v) for v in vals[:5])
        raise ValueError(
            f"{name}: {split} must hold class indices in [0, {num_classes}) "
            f"(num_classes={num_classes}), got {int(bad.sum())} labels "
            f"outside it ({shown}{', ...' if vals.size > 5 else ''}).")
  empty = np.flatnonzero(np.bincount(y_train, minlength=num_classes) == 0)
  if empty.size:
    logging.warning(
        "%s: %d of %d classes have no training example (classes %s%s).",
        name, empty.size, num_classes, empty[:10].tolist(),
        ", ..." if empty.size > 10 else "")
  return Dataset(name=name, x_train=x_train, y_train=y_train, x_test=x_test,
                 y_test=y_test, num_classes=int(num_classes))


def _largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
  """Integer counts proportional to ``weights`` summing exactly to ``total``."""
  exact = total * weights / weights.sum()
  counts = np.floor(exact).astype(np.int64)
  short = total - counts.sum()
  # Stable sort: ties go to the lower index, so the result is deterministic.
  order = np.argsort(-(exact - counts), kind="stable")
  counts[order[:short]] += 1
  return counts


def _load_digits(data_dir: str | None) -> Dataset:
  """scikit-learn's 8x8 digits with a fixed stratified 1437/360 split.

  Pixel values 0..16 are mapped to uint8 by ``round(v * 255 / 16)``. The
  ``_DIGITS_NUM_TEST`` test images are spread over the classes by largest
  remainder and chosen within each by ``_DIGITS_SPLIT_SEED``; both splits
  keep scikit-learn's order.
  """
  del data_dir  # Embedded in scikit-learn.
  from sklearn import datasets as sk_datasets  # Host-only dependency.

  digits = sk_datasets.load_digits()
  x = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
  y = digits.target.astype(np.int32)
  classes, sizes = np.unique(y, return_counts=True)
  quota = _largest_remainder(_DIGITS_NUM_TEST, sizes.astype(np.float64))
  rng = np.random.default_rng(_DIGITS_SPLIT_SEED)
  is_test = np.zeros(y.shape[0], dtype=bool)
  for c, q in zip(classes, quota):
    members = np.flatnonzero(y == c)
    is_test[rng.choice(members, size=q, replace=False)] = True
  return _make_dataset("digits", x[~is_test], y[~is_test], x[is_test],
                       y[is_test], num_classes=10)


# TFDS's GCS mirror, where most of its sources live: if this host cannot be
# reached, a download cannot succeed.
TFDS_PROBE_HOST = "storage.googleapis.com"
TFDS_PROBE_PORT = 443
TFDS_PROBE_TIMEOUT = 3.0


def tfds_data_dir(data_dir: str | None) -> str:
  """The directory TFDS reads: ``data_dir``, else ``$TFDS_DATA_DIR``, else
  ``~/tensorflow_datasets`` (TFDS's own default)."""
  return os.path.expanduser(data_dir or os.environ.get("TFDS_DATA_DIR")
                            or "~/tensorflow_datasets")


def tfds_prepared(tfds_name: str, data_dir: str | None) -> bool:
  """Whether ``data_dir`` holds a prepared copy of ``tfds_name`` (a
  ``dataset_info.json`` under ``<data_dir>/<name>/[<config>/]<version>``)."""
  root = os.path.join(tfds_data_dir(data_dir), tfds_name)
  if not os.path.isdir(root):
    return False
  return any("dataset_info.json" in names for _, _, names in os.walk(root))


def network_reachable(host: str = TFDS_PROBE_HOST, port: int = TFDS_PROBE_PORT,
                      timeout: float = TFDS_PROBE_TIMEOUT) -> bool:
  """Whether a TCP connection to ``host:port`` opens within ``timeout`` s.

  The probe runs in a daemon thread abandoned after ``timeout``, since name
  resolution has no timeout; behind ``$https_proxy`` the proxy is probed.
  """
  import socket  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  import urllib.parse  # pylint: disable=g-import-not-at-top

  proxy = os.environ.get("https_proxy") or os.environ.get("HTTPS_PROXY")
  if proxy:
    parsed = urllib.parse.urlsplit(proxy if "://" in proxy else "//" + proxy)
    if parsed.hostname:
      host, port = parsed.hostname, parsed.port or 80
  result = []

  def connect():
    try:
      socket.create_connection((host, port), timeout=timeout).close()
      result.append(True)
    except OSError:
      result.append(False)

  thread = threading.Thread(target=connect, daemon=True)
  thread.start()
  thread.join(timeout)
  return bool(result and result[0])


class DatasetUnavailableError(RuntimeError):
  """A named dataset could not be loaded (no copy, no network, no TFDS)."""


# Installs tensorflow-datasets and TensorFlow, the TFDS names' extras.
TFDS_EXTRA_INSTALL = 'pip install "fedjax-dd[tfds]"'

# The splits every TFDS name is loaded from, in Dataset order.
_TFDS_SPLITS = ("train", "test")

# Examples decoded per read of a data source (bounds the encoded bytes held).
_SOURCE_CHUNK = 4096


def _tfds_error(tfds_name: str, data_dir: str | None, reason: str
                ) -> DatasetUnavailableError:
  """The loader's one message: why, and how to load the data offline."""
  return DatasetUnavailableError(
      f"Could not load {tfds_name!r} with tensorflow_datasets "
      f"(data_dir={data_dir!r}): {reason}. Without internet "
      "access, pass `npz:PATH` instead, where PATH is a .npz file with uint8 "
      "images under keys 'x_train', 'x_test' ([N, H, W, C] or [N, H, W]) "
      "and integer labels under 'y_train', 'y_test' ([N]); e.g. "
      f"'npz:../shared/datasets/{tfds_name}.npz'.")


class _Unavailable(Exception):
  """A reason to stop before asking TFDS (it would retry or fail obscurely)."""


def _module_available(name: str) -> bool:
  """Whether ``import name`` can succeed, without importing it.

  A ``None`` entry in ``sys.modules`` (how tests hide a module) counts as
  missing; any other entry as present.
  """
  if name in sys.modules:
    return sys.modules[name] is not None
  try:
    return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError):
    return False


def _tensorflow_available() -> bool:
  """Whether TensorFlow can be imported (it is not imported here)."""
  return _module_available("tensorflow")


def _needs_tensorflow(what: str) -> _Unavailable:
  return _Unavailable(
      f"{what} needs TensorFlow, which is not installed; install the TFDS "
      f"extra with `{TFDS_EXTRA_INSTALL}` (a copy prepared in ArrayRecord "
      "format, e.g. on another machine, loads without TensorFlow)")


def _file_formats(builder: Any) -> set[str]:
  """The file formats of a prepared copy, as strings (``"array_record"``)."""
  info = builder.info
  formats = [info.file_format, *getattr(info, "alternative_file_formats", ())]
  return {str(getattr(f, "value", f)) for f in formats if f is not None}


def _source_to_numpy(source: Any, image_key: str, label_key: str
                     ) -> tuple[np.ndarray, np.ndarray]:
  """Decodes a whole TFDS data source into ``(images, labels)`` arrays.

  Reads ``_SOURCE_CHUNK`` examples at a time, in the prepared files' order
  (as ``tfds.load(..., shuffle_files=False)`` does).
  """
  n = len(source)
  images, labels = [], []
  getitems = getattr(source, "__getitems__", None)
  for start in range(0, n, _SOURCE_CHUNK):
    keys = range(start, min(n, start + _SOURCE_CHUNK))
    examples = (getitems(keys) if getitems is not None
                else [source[i] for i in keys])
    images.extend(np.asarray(e[image_key]) for e in examples)
    labels.extend(int(e[label_key]) for e in examples)
  if not images:
    return np.zeros((0, 0, 0, 0), np.uint8), np.zeros((0,), np.int64)
  return np.stack(images), np.asarray(labels, np.int64)


def _read_data_source(builder: Any) -> list[tuple[np.ndarray, np.ndarray]]:
  """Train and test ``(images, labels)`` of a prepared ArrayRecord copy."""
  keys = getattr(builder.info, "supervised_keys", None) or ("image", "label")
  image_key, label_key = keys
  return [_source_to_numpy(builder.as_data_source(split=split), image_key,
                           label_key)
          for split in _TFDS_SPLITS]


def _load_tfds(tfds_name: str, num_classes: int,
               data_dir: str | None) -> Dataset:
  """Loads a TFDS dataset fully into memory as NumPy arrays.

  The attempts, in order:

  1. ``import tensorflow_datasets``; missing, the error names the ``tfds``
     extra (:data:`TFDS_EXTRA_INSTALL`).
  2. A prepared copy in the data directory (:func:`tfds_prepared`, then
     ``is_prepared()``), no network needed: an ArrayRecord copy is read
     through the builder's data source without TensorFlow; a TFRecord copy
     with ``tfds.load`` and ``tfds.as_numpy``, which need TensorFlow.
  3. No prepared copy: download and prepare one (ArrayRecord where the
     ``array_record`` package exists, else TFRecord), then read it as in 2.
     TFDS's builders use ``tf.io.gfile`` and ``tf.image.encode_png``, so
     preparing needs TensorFlow; without it the error names the extra
     before anything is downloaded.

  Without a copy or network TFDS retries its downloads for minutes; a
  probe of :data:`TFDS_PROBE_HOST` fails in seconds instead.

  Args:
    tfds_name: TFDS registered name, with ``train`` and ``test`` splits and
      supervised keys ``("image", "label")``.
    num_classes: The dataset's number of classes.
    data_dir: TFDS data directory, or None for :func:`tfds_data_dir`'s
      default.

  Returns:
    The validated dataset.

  Raises:
    DatasetUnavailableError: TFDS or TensorFlow missing where needed (naming
      the ``tfds`` extra), no copy and no network, or any error of TFDS.
    ValueError: The loaded arrays fail validation.
  """
  try:
    try:
      import tensorflow_datasets as tfds  # Heavy; only needed on this path.
    except ModuleNotFoundError as e:
      if e.name != "tensorflow_datasets":
        raise
      raise _Unavailable(
          "tensorflow_datasets is not installed; install the TFDS extra with "
          f"`{TFDS_EXTRA_INSTALL}`") from None

    builder = None
    if tfds_prepared(tfds_name, data_dir):
      builder = tfds.builder(tfds_name, data_dir=data_dir)
      if not builder.is_prepared():  # E.g. another version of the dataset.
        builder = None
    if builder is None:
      if not _tensorflow_available():
        raise _needs_tensorflow(
            f"no prepared copy in {tfds_data_dir(data_dir)}, and preparing "
            "one")
      if not network_reachable():
        raise _Unavailable(
            f"no prepared copy in {tfds_data_dir(data_dir)} and no network "
            f"({TFDS_PROBE_HOST}:{TFDS_PROBE_PORT} unreachable within "
            f"{TFDS_PROBE_TIMEOUT:g} s)")
      builder = tfds.builder(tfds_name, data_dir=data_dir)
      if _module_available("array_record"):
        builder.download_and_prepare(file_format="array_record")
      else:  # TFDS installs it on Linux only: TFRecord, read as before.
        builder.download_and_prepare()

    formats = _file_formats(builder)
    if "array_record" in formats:
      (x_train, y_train), (x_test, y_test) = _read_data_source(builder)
    else:
      if not _tensorflow_available():
        raise _needs_tensorflow(
            f"the prepared copy in {tfds_data_dir(data_dir)} is in "
            f"{' / '.join(sorted(formats)) or 'TFRecord'} format; reading it")
      (x_train, y_train), (x_test, y_test) = tfds.as_numpy(
          tfds.load(tfds_name, split=list(_TFDS_SPLITS), batch_size=-1,
                    as_supervised=True, data_dir=data_dir))
  except _Unavailable as e:
    raise _tfds_error(tfds_name, data_dir, str(e)) from None
  except Exception as e:  # pylint: disable=broad-except
    raise _tfds_error(tfds_name, data_dir, f"{type(e).__name__}: {e}") from e
  return _make_dataset(tfds_name, x_train, y_train, x_test, y_test,
                       num_classes=num_classes)


_LOADERS: dict[str, Callable[[str | None], Dataset]] = {
    "digits": _load_digits,
    "mnist": functools.partial(_load_tfds, "mnist", 10),
    "fashion_mnist": functools.partial(_load_tfds, "fashion_mnist", 10),
    "cifar10": functools.partial(_load_tfds, "cifar10", 10),
    "cifar100": functools.partial(_load_tfds, "cifar100", 100),
    "svhn_cropped": functools.partial(_load_tfds, "svhn_cropped", 10),
}


_NUM_CLASSES = {"digits": 10, "mnist": 10, "fashion_mnist": 10, "cifar10": 10,
                "cifar100": 100, "svhn_cropped": 10}


def _open_npz(spec: str) -> tuple[str, dict[str, np.ndarray]]:
  """Reads every array of the archive named by ``npz:PATH``."""
  path = spec[len(_NPZ_PREFIX):]
  if not path:
    raise ValueError(f"{spec!r}: missing path after 'npz:'.")
  full = os.path.abspath(os.path.expanduser(path))  # Relative to the CWD.
  return full, dict(_npz_arrays(full, spec))


def _check_npz_file(spec: str, full: str) -> None:
  """Refuses a path that is not a regular file holding a zip archive,
  naming what it is, since np.load reports any non-zip as "pickled data"."""
  if not os.path.exists(full):
    raise ValueError(f"{spec!r}: file not found: {full}")
  if os.path.isdir(full):
    raise ValueError(f"{spec!r}: {full} is a directory, not an npz file; "
                     "name the .npz archive in it.")
  if not os.path.isfile(full):
    raise ValueError(f"{spec!r}: {full} is not a regular file (a device, "
                     "pipe or socket); name an .npz archive written by "
                     "np.savez.")
  if not zipfile.is_zipfile(full):
    raise ValueError(
        f"{spec!r}: {full} is not an npz archive (a zip of .npy arrays, as "
        "written by np.savez); convert it with np.savez(PATH, x_train=..., "
        "y_train=..., x_test=..., y_test=...).")


def _npz_arrays(full: str, spec: str | None = None):
  """``(key, array)`` of each member of the npz archive ``full``, in key
  order, after each member's declared size was checked against its bytes.

  A damaged archive otherwise surfaces as ``BadZipFile``, zlib's ``error``
  or, for a header declaring an impossible shape, a ``MemoryError``.

  Raises:
    ValueError: one line naming the file, what is wrong and the fix.
  """
  spec = spec or f"{_NPZ_PREFIX}{full}"
  _check_npz_file(spec, full)
  damaged = (f"{spec!r}: {full} is a damaged npz archive ({{}}); it was cut "
             "or corrupted: write it again with np.savez(PATH, x_train=..., "
             "y_train=..., x_test=..., y_test=...).")
  import zlib  # pylint: disable=g-import-not-at-top
  try:
    with zipfile.ZipFile(full) as z:
      for info in z.infolist():
        if not info.filename.endswith(".npy"):
          continue
        with z.open(info) as member:
          version = np.lib.format.read_magic(member)
          if version not in ((1, 0), (2, 0)):
            continue  # np.load reads (and checks) the others itself
          read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                  else np.lib.format.read_array_header_2_0)
          shape, _, dtype = read(member)
        declared = float(np.prod(shape, dtype=np.float64)) * dtype.itemsize
        if declared > info.file_size:
          raise ValueError(damaged.format(
              f"{info.filename} declares shape {tuple(shape)} of {dtype}, "
              f"{declared / 2**30:.1f} GiB, in a member of "
              f"{info.file_size} bytes"))
      with np.load(full, allow_pickle=False) as f:
        for k in sorted(f.files):
          yield k, f[k]
  except ValueError as e:
    if str(e).startswith(repr(spec)):
      raise
    raise ValueError(damaged.format(f"{type(e).__name__}: {e}")) from None
  except (zipfile.BadZipFile, zlib.error, EOFError, OSError,
          MemoryError) as e:
    raise ValueError(damaged.format(f"{type(e).__name__}: {e}")) from None


def check_name(spec: str) -> None:
  """Refuses a dataset name :func:`load_dataset` cannot load, without
  loading it: an unknown name, ``npz:`` without a path, or an ``npz:`` path
  that is not a regular file holding a zip archive (missing, a directory,
  ``/dev/zero``); its arrays are checked when it loads.

  Raises:
    ValueError: naming the spec and the valid names (or the missing file).
  """
  if not isinstance(spec, str):
    raise ValueError(f"A dataset must be a name or 'npz:PATH', got "
                     f"{type(spec).__name__} {spec!r}.")
  if spec.startswith(_NPZ_PREFIX):
    path = npz_path(spec)
    if path is None:
      raise ValueError(f"{spec!r}: missing path after 'npz:'.")
    _check_npz_file(spec, path)
  elif spec not in _LOADERS:
    raise ValueError(
        f"Unknown dataset {spec!r}. Valid names: {sorted(_LOADERS)} or "
        "'npz:PATH'.")


def npz_path(spec: str) -> str | None:
  """The absolute file of ``npz:PATH`` (relative to the CWD), None for
  other names."""
  if not isinstance(spec, str) or not spec.startswith(_NPZ_PREFIX):
    return None
  path = spec[len(_NPZ_PREFIX):]
  return os.path.abspath(os.path.expanduser(path)) if path else None


def npz_digest(path: str) -> str:
  """SHA-256 of an npz archive's arrays: each key, dtype, shape and bytes,
  in key order.

  Hashes arrays, not file bytes, so re-saving with another compression
  keeps the digest.

  Raises:
    ValueError: the file is no npz archive or a damaged one.
  """
  h = hashlib.sha256()
  for k, a in _npz_arrays(os.path.abspath(path)):
    a = np.ascontiguousarray(a)
    h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def _load_npz(spec: str, num_classes: int | None = None) -> Dataset:
  """Loads ``npz:PATH`` (keys x_train, y_train, x_test, y_test)."""
  _, arrays = _open_npz(spec)
  missing = [k for k in _NPZ_KEYS if k not in arrays]
  if missing:
    raise ValueError(
        f"{spec!r}: missing keys {missing}; expected {list(_NPZ_KEYS)}, found "
        f"{sorted(arrays)}.")
  return _make_dataset(spec, *(arrays[k] for k in _NPZ_KEYS),
                       num_classes=num_classes)


def load_dataset(name: str, *, data_dir: str | None = None,
                 num_classes: int | None = None) -> Dataset:
  """Loads a labelled dataset into host memory.

  Args:
    name: ``"digits"``, a TFDS name (``"mnist"``, ``"fashion_mnist"``,
      ``"cifar10"``, ``"cifar100"``, ``"svhn_cropped"``) or ``"npz:PATH"``.
      A relative PATH is resolved against the working directory; grayscale
      ``[N, H, W]`` images get a channel axis.
    data_dir: TFDS data directory (default ``$TFDS_DATA_DIR``, else
      ``~/tensorflow_datasets``); ignored by ``digits`` and ``npz:``.
    num_classes: the declared number of classes: every label of both
      splits must lie in ``[0, num_classes)``. None infers it (``npz:``:
      max label + 1 over both splits); a named dataset's value must match.
      A class without training examples is logged as a warning.

  Returns:
    The dataset, images ``[N, H, W, C]`` uint8 and labels ``[N]`` int32.

  Raises:
    ValueError: Unknown name; an ``npz:`` file that is missing, lacks keys,
      or holds bad arrays; labels outside ``[0, num_classes)``; or a
      ``num_classes`` that differs from a named dataset's.
    DatasetUnavailableError: A TFDS dataset cannot be loaded (see
      :func:`_load_tfds`); a subclass of ``RuntimeError``.
  """
  if num_classes is not None:
    validate.positive_int("num_classes", num_classes)
  if name.startswith(_NPZ_PREFIX):
    return _load_npz(name, num_classes)
  loader = _LOADERS.get(name)
  if loader is None:
    raise ValueError(
        f"Unknown dataset {name!r}. Valid names: {sorted(_LOADERS)} or "
        "'npz:PATH'.")
  known = _NUM_CLASSES[name]
  if num_classes is not None and num_classes != known:
    raise ValueError(
        f"num_classes must be {known} for {name!r} (its number of classes), "
        f"got {num_classes}.")
  return loader(data_dir)


def load_unlabeled(spec: str, *, num: int, rng: np.random.Generator,
                   data_dir: str | None = None) -> np.ndarray:
  """Draws an auxiliary unlabelled image set (HFLDD's public data).

  Args:
    spec: ``"npz:PATH"`` whose key ``x_unlabeled`` holds the images (falls
      back to ``x_train`` when absent), or any name accepted by
      :func:`load_dataset`, in which case its train images are used.
    num: Number of images to draw, at most the number available.
    rng: Chooses which images, without replacement.
    data_dir: Passed on to :func:`load_dataset`.

  Returns:
    Images ``[num, H, W, C]`` uint8, in the order drawn.

  Raises:
    TypeError: ``rng`` is not a ``np.random.Generator``.
    ValueError: ``num`` is not positive or exceeds the images available, or
      the source is invalid.
  """
  if not isinstance(rng, np.random.Generator):
    raise TypeError(
        f"rng must be a np.random.Generator, got {type(rng).__name__}.")
  if num < 1:
    raise ValueError(f"num must be positive, got {num}.")
  if spec.startswith(_NPZ_PREFIX):
    _, arrays = _open_npz(spec)
    key = "x_unlabeled" if "x_unlabeled" in arrays else "x_train"
    if key not in arrays:
      raise ValueError(
          f"{spec!r}: needs key 'x_unlabeled' (or 'x_train'); found "
          f"{sorted(arrays)}.")
    x = _check_images(arrays[key], key, spec)
  else:
    x = load_dataset(spec, data_dir=data_dir).x_train
  if num > x.shape[0]:
    raise ValueError(
        f"{spec!r}: asked for {num} unlabelled images but only {x.shape[0]} "
        "are available.")
  return x[rng.choice(x.shape[0], size=num, replace=False)]


def resplit(ds: Dataset, train_fraction: float, *, rng: np.random.Generator
            ) -> Dataset:
  """Pools train and test and splits them again, ``train_fraction`` to train.

  HFLDD (Shi et al., 2024, Sec. V-A: "each dataset is divided into 80% for
  training and 20% for testing") uses ``train_fraction=0.8``. One
  permutation from ``rng`` picks ``round(train_fraction * N)`` pooled
  (train then test) images for train; each split keeps pooled order and
  is not stratified.

  Args:
    ds: The dataset as loaded.
    train_fraction: Share of the pooled images that go to train, in
      ``(0, 1)``.
    rng: Draws the permutation.

  Returns:
    A dataset with the same name, image shape and ``num_classes``.

  Raises:
    TypeError: ``rng`` is not a ``np.random.Generator``.
    ValueError: ``train_fraction`` outside ``(0, 1)`` or a split would be
      empty.
  """
  if not isinstance(rng, np.random.Generator):
    raise TypeError(
        f"rng must be a np.random.Generator, got {type(rng).__name__}.")
  f = float(train_fraction)
  if not 0.0 < f < 1.0:
    raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}.")
  x = np.concatenate([ds.x_train, ds.x_test])
  y = np.concatenate([ds.y_train, ds.y_test])
  n_train = int(round(f * x.shape[0]))
  if not 0 < n_train < x.shape[0]:
    raise ValueError(
        f"train_fraction={train_fraction} of {x.shape[0]} images leaves a "
        "split empty.")
  perm = rng.permutation(x.shape[0])
  train, test = np.sort(perm[:n_train]), np.sort(perm[n_train:])
  return Dataset(name=ds.name, x_train=x[train], y_train=y[train],
                 x_test=x[test], y_test=y[test], num_classes=ds.num_classes)
