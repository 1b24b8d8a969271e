"""Tests for fedjax_dd.data.sources."""

import os
import sys
import types

import numpy as np
import pytest

from fedjax_dd.data import sources

_DATASETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                         "..", "..", "shared", "datasets")


def _write_npz(path, **arrays):
  np.savez(path, **arrays)
  return f"npz:{path}"


def _good_arrays():
  """3 train / 2 test 2x2 grayscale images, labels 0..2."""
  x_train = np.arange(12, dtype=np.uint8).reshape(3, 2, 2)
  x_test = np.full((2, 2, 2), 7, np.uint8)
  return dict(x_train=x_train, y_train=np.array([0, 2, 1], np.uint8),
              x_test=x_test, y_test=np.array([1, 1], np.int64))


# ---------------------------------------------------------------- digits


def test_digits_shapes_dtypes_and_split_sizes():
  ds = sources.load_dataset("digits")
  assert ds.name == "digits"
  assert ds.x_train.shape == (1437, 8, 8, 1)
  assert ds.x_test.shape == (360, 8, 8, 1)
  assert ds.image_shape == (8, 8, 1)
  assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int32
  assert ds.y_test.dtype == np.int32
  assert ds.num_classes == 10
  # 0..16 maps onto 0..255 (0 -> 0, 16 -> 255).
  assert ds.x_train.min() == 0 and ds.x_train.max() == 255


def test_digits_split_is_stratified_by_largest_remainder():
  # Class sizes 178 182 177 183 181 182 181 179 174 180 (N = 1797); quotas
  # n * 360 / 1797 floor to 35 36 35 36 36 36 36 35 34 36 (355); the 5 left
  # go to the largest fractions: class 8 (.86), 7 (.86), 3 (.66), 0 (.66),
  # then the .46 tie between classes 1 and 5 goes to class 1.
  ds = sources.load_dataset("digits")
  np.testing.assert_array_equal(np.bincount(ds.y_test),
                                [36, 37, 35, 37, 36, 36, 36, 36, 35, 36])
  np.testing.assert_array_equal(
      np.bincount(ds.y_test) + np.bincount(ds.y_train),
      [178, 182, 177, 183, 181, 182, 181, 179, 174, 180])


def test_digits_is_deterministic():
  a = sources.load_dataset("digits")
  b = sources.load_dataset("digits")
  np.testing.assert_array_equal(a.x_train, b.x_train)
  np.testing.assert_array_equal(a.y_test, b.y_test)


def test_dataset_is_frozen():
  ds = sources.load_dataset("digits")
  with pytest.raises(Exception):
    ds.num_classes = 3


# ---------------------------------------------------------------- names


def test_unknown_name_lists_valid_names():
  with pytest.raises(ValueError, match="digits.*mnist|npz:PATH"):
    sources.load_dataset("imagenet")


# The TFDS loader against a fake tensorflow_datasets module: which TFDS calls
# it makes, in which state (copy prepared or not, its format, TensorFlow
# present or not, network or not). The real TFDS is exercised further down.

_EXTRA = 'pip install "fedjax-dd[tfds]"'


def _examples(x, y):
  return [{"image": xi, "label": int(yi)} for xi, yi in zip(x, y)]


class _FakeBuilder:
  """tfds.core.DatasetBuilder's surface that the loader uses."""

  def __init__(self, tfds, name, data_dir):
    self._tfds = tfds
    self.name, self.data_dir = name, data_dir
    self.info = types.SimpleNamespace(
        file_format=tfds.prepared_format, alternative_file_formats=(),
        supervised_keys=("image", "label"))

  def is_prepared(self):
    return self._tfds.prepared_format is not None

  def download_and_prepare(self, **kwargs):
    self._tfds.calls.append(("download_and_prepare", self.name, kwargs))
    self._tfds.prepare(**kwargs)
    file_format = kwargs.get("file_format", "tfrecord")  # TFDS's default.
    self._tfds.prepared_format = self.info.file_format = file_format

  def as_data_source(self, split):
    self._tfds.calls.append(("as_data_source", self.name, split))
    return _examples(*self._tfds.splits[split])


def _fake_tfds(monkeypatch, splits=None, *, prepared_format=None,
               prepare=lambda **kwargs: None, tensorflow=True,
               array_record=True):
  """Installs a fake ``tensorflow_datasets`` (and hides or fakes TensorFlow
  and ``array_record``).

  Args:
    splits: ``{"train": (x, y), "test": (x, y)}`` the fake serves.
    prepared_format: None (no prepared copy), "array_record" or "tfrecord".
    prepare: Called by ``download_and_prepare`` (e.g. to raise).
    tensorflow: Whether ``import tensorflow`` may succeed.
    array_record: Whether ``import array_record`` may succeed.

  Returns:
    The fake module; ``calls`` records the TFDS calls.
  """
  if splits is None:
    x = np.zeros((2, 3, 3, 1), np.uint8)
    splits = {"train": (x, [0, 1]), "test": (x, [1, 0])}
  fake = types.ModuleType("tensorflow_datasets")
  fake.splits, fake.calls = splits, []
  fake.prepared_format, fake.prepare = prepared_format, prepare

  def builder(name, **kwargs):
    fake.calls.append(("builder", name, kwargs))
    return _FakeBuilder(fake, name, kwargs.get("data_dir"))

  def load(name, **kwargs):
    fake.calls.append(("load", name, kwargs))
    return [tuple(np.asarray(a) for a in splits[s]) for s in kwargs["split"]]

  fake.builder, fake.load, fake.as_numpy = builder, load, lambda t: t
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
  monkeypatch.setitem(sys.modules, "tensorflow",
                      types.ModuleType("tensorflow") if tensorflow else None)
  monkeypatch.setitem(
      sys.modules, "array_record",
      types.ModuleType("array_record") if array_record else None)
  return fake


def _prepared_dir(tmp_path, name="mnist"):
  """A data_dir that tfds_prepared() accepts for ``name``."""
  version = tmp_path / name / "3.0.1"
  version.mkdir(parents=True)
  (version / "dataset_info.json").write_text("{}")
  return str(tmp_path)


def _no_probe():
  raise AssertionError("the network must not be probed here")


def test_tfds_failure_says_use_npz(monkeypatch, tmp_path):
  monkeypatch.setattr(sources, "network_reachable", lambda: True)

  def prepare(**kwargs):
    raise ConnectionError("no network")

  _fake_tfds(monkeypatch, prepare=prepare)
  with pytest.raises(sources.DatasetUnavailableError) as info:
    sources.load_dataset("cifar10", data_dir=str(tmp_path))
  message = str(info.value)
  assert "npz:PATH" in message and "ConnectionError: no network" in message
  for key in ("x_train", "y_train", "x_test", "y_test"):
    assert key in message


def test_tfds_without_a_copy_prepares_array_record_and_reads_it(monkeypatch):
  monkeypatch.setattr(sources, "network_reachable", lambda: True)
  x = np.arange(4 * 9, dtype=np.uint8).reshape(4, 3, 3, 1)
  fake = _fake_tfds(monkeypatch, {"train": (x, [0, 1, 2, 9]),
                                  "test": (x[:2], [3, 4])})
  ds = sources.load_dataset("mnist", data_dir="tfds_cache")
  assert fake.calls == [
      ("builder", "mnist", {"data_dir": "tfds_cache"}),
      ("download_and_prepare", "mnist", {"file_format": "array_record"}),
      ("as_data_source", "mnist", "train"),
      ("as_data_source", "mnist", "test")]
  np.testing.assert_array_equal(ds.x_train, x)
  np.testing.assert_array_equal(ds.y_train, [0, 1, 2, 9])
  np.testing.assert_array_equal(ds.x_test, x[:2])
  np.testing.assert_array_equal(ds.y_test, [3, 4])
  assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int32
  assert ds.num_classes == 10


def test_tfds_without_array_record_prepares_tfrecord(monkeypatch):
  monkeypatch.setattr(sources, "network_reachable", lambda: True)
  fake = _fake_tfds(monkeypatch, array_record=False)
  ds = sources.load_dataset("mnist", data_dir="tfds_cache")
  assert [c[:3] for c in fake.calls] == [
      ("builder", "mnist", {"data_dir": "tfds_cache"}),
      ("download_and_prepare", "mnist", {}),
      ("load", "mnist", {"split": ["train", "test"], "batch_size": -1,
                         "as_supervised": True, "data_dir": "tfds_cache"})]
  np.testing.assert_array_equal(ds.y_train, [0, 1])


def test_tfds_data_source_is_read_in_chunks(monkeypatch, tmp_path):
  monkeypatch.setattr(sources, "_SOURCE_CHUNK", 3)
  x = np.arange(7, dtype=np.uint8)[:, None, None, None] * np.ones(
      (1, 2, 2, 1), np.uint8)
  _fake_tfds(monkeypatch, {"train": (x, np.arange(7) % 10),
                           "test": (x[:1], [5])},
             prepared_format="array_record", tensorflow=False)
  ds = sources.load_dataset("mnist", data_dir=_prepared_dir(tmp_path))
  np.testing.assert_array_equal(ds.x_train, x)
  np.testing.assert_array_equal(ds.y_train, np.arange(7))


def test_tfds_offline_without_a_local_copy_fails_at_once(monkeypatch,
                                                         tmp_path):
  fake = _fake_tfds(monkeypatch)
  monkeypatch.setattr(sources, "network_reachable", lambda: False)
  with pytest.raises(RuntimeError) as info:
    sources.load_dataset("svhn_cropped", data_dir=str(tmp_path))
  message = str(info.value)
  assert message.startswith("Could not load 'svhn_cropped' with "
                            "tensorflow_datasets")
  assert f"no prepared copy in {tmp_path} and no network" in message
  assert "npz:PATH" in message and "svhn_cropped.npz" in message
  assert fake.calls == []  # TFDS is not asked (it would retry for minutes).


def test_tfds_array_record_copy_needs_neither_network_nor_tensorflow(
    monkeypatch, tmp_path):
  fake = _fake_tfds(monkeypatch, prepared_format="array_record",
                    tensorflow=False)
  monkeypatch.setattr(sources, "network_reachable", _no_probe)
  data_dir = _prepared_dir(tmp_path)
  assert sources.tfds_prepared("mnist", data_dir)
  assert not sources.tfds_prepared("cifar10", data_dir)
  assert sources.load_dataset("mnist", data_dir=data_dir).num_classes == 10
  assert [c[0] for c in fake.calls] == ["builder", "as_data_source",
                                        "as_data_source"]


def test_tfds_tfrecord_copy_is_read_with_tensorflow(monkeypatch, tmp_path):
  fake = _fake_tfds(monkeypatch, prepared_format="tfrecord")
  monkeypatch.setattr(sources, "network_reachable", _no_probe)
  data_dir = _prepared_dir(tmp_path)
  ds = sources.load_dataset("mnist", data_dir=data_dir)
  assert fake.calls[-1] == ("load", "mnist", {
      "split": ["train", "test"], "batch_size": -1, "as_supervised": True,
      "data_dir": data_dir})
  np.testing.assert_array_equal(ds.y_test, [1, 0])


def test_tfds_missing_names_the_extra(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
  monkeypatch.setattr(sources, "network_reachable", _no_probe)
  with pytest.raises(sources.DatasetUnavailableError) as info:
    sources.load_dataset("cifar100", data_dir=str(tmp_path))
  message = str(info.value)
  assert message.startswith(
      "Could not load 'cifar100' with tensorflow_datasets (data_dir=")
  assert ("tensorflow_datasets is not installed; install the TFDS extra "
          f"with `{_EXTRA}`") in message
  assert "npz:PATH" in message


@pytest.mark.parametrize("prepared_format, needed_for", [
    (None, "and preparing one needs TensorFlow"),
    ("tfrecord", "is in tfrecord format; reading it needs TensorFlow")])
def test_tensorflow_missing_names_the_extra(monkeypatch, tmp_path,
                                            prepared_format, needed_for):
  fake = _fake_tfds(monkeypatch, prepared_format=prepared_format,
                    tensorflow=False)
  monkeypatch.setattr(sources, "network_reachable", _no_probe)
  data_dir = (_prepared_dir(tmp_path) if prepared_format
              else str(tmp_path))
  with pytest.raises(sources.DatasetUnavailableError) as info:
    sources.load_dataset("mnist", data_dir=data_dir)
  message = str(info.value)
  assert needed_for in message
  assert (f"which is not installed; install the TFDS extra with `{_EXTRA}` "
          "(a copy prepared in ArrayRecord format") in message
  assert "npz:PATH" in message
  # Nothing downloaded, prepared or read.
  assert [c[0] for c in fake.calls] in ([], ["builder"])


# The real TFDS, offline: a tiny dataset with MNIST's name, version and
# features, generated by TFDS's own builder into tmp_path, then loaded by
# name through TFDS's registered MNIST builder as a prepared copy.


def _png(image):
  """PNG bytes of a [H, W, 1] uint8 image; TFDS stores them as given, where
  encoding an array itself would need TensorFlow."""
  import io
  from PIL import Image
  buffer = io.BytesIO()
  Image.fromarray(image[..., 0]).save(buffer, format="PNG")
  return buffer.getvalue()


def _tiny_mnist_images(n, offset):
  """n 28x28x1 images; image i is ``offset + i`` everywhere but one pixel."""
  x = (offset + np.arange(n, dtype=np.uint8))[:, None, None, None] * np.ones(
      (1, 28, 28, 1), np.uint8)
  x[:, 3, 5, 0] = 255  # Not constant: a transposed image would show.
  return x


_TINY_MNIST = {"train": (_tiny_mnist_images(5, 10), [3, 1, 4, 1, 5]),
               "test": (_tiny_mnist_images(3, 50), [9, 2, 6])}


def _build_tiny_mnist(data_dir, file_format):
  tfds = pytest.importorskip("tensorflow_datasets")
  pytest.importorskip("PIL")
  if file_format == "array_record":
    pytest.importorskip("array_record")

  class TinyMnist(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    name = "mnist"
    VERSION = tfds.builder_cls("mnist").VERSION

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self,
          features=tfds.features.FeaturesDict({
              "image": tfds.features.Image(shape=(28, 28, 1)),
              "label": tfds.features.ClassLabel(num_classes=10)}),
          supervised_keys=("image", "label"))

    def _split_generators(self, dl_manager):
      del dl_manager  # Nothing to download.
      return {split: self._generate_examples(split) for split in _TINY_MNIST}

    def _generate_examples(self, split):
      x, y = _TINY_MNIST[split]
      for i, (image, label) in enumerate(zip(x, y)):
        yield i, {"image": _png(image), "label": label}

  builder = TinyMnist(data_dir=str(data_dir))
  builder.download_and_prepare(file_format=file_format)
  return builder


def _check_tiny_mnist(ds):
  assert ds.name == "mnist" and ds.num_classes == 10
  for split in ("train", "test"):
    x, y = getattr(ds, f"x_{split}"), getattr(ds, f"y_{split}")
    want_x, want_y = _TINY_MNIST[split]
    assert x.shape == want_x.shape and x.dtype == np.uint8
    assert y.shape == (len(want_y),) and y.dtype == np.int32
    # TFDS stores the examples in an order of its own; match them by image.
    order = np.argsort(x[:, 0, 0, 0])
    np.testing.assert_array_equal(x[order], want_x)
    np.testing.assert_array_equal(y[order], want_y)


def test_tfds_array_record_copy_built_by_tfds_loads_without_tensorflow(
    monkeypatch, tmp_path):
  builder = _build_tiny_mnist(tmp_path, "array_record")
  assert str(builder.info.file_format.value) == "array_record"
  assert sources.tfds_prepared("mnist", str(tmp_path))
  monkeypatch.setattr(sources, "network_reachable", _no_probe)
  # Any import of TensorFlow from here on fails (where TensorFlow is
  # installed and already imported, this cannot catch every use of it).
  monkeypatch.setitem(sys.modules, "tensorflow", None)
  _check_tiny_mnist(sources.load_dataset("mnist", data_dir=str(tmp_path)))


def test_tfds_tfrecord_copy_built_by_tfds_loads_with_tensorflow(
    monkeypatch, tmp_path):
  pytest.importorskip("tensorflow")
  _build_tiny_mnist(tmp_path, "tfrecord")
  monkeypatch.setattr(sources, "network_reachable", _no_probe)
  _check_tiny_mnist(sources.load_dataset("mnist", data_dir=str(tmp_path)))


def test_network_probe_of_a_closed_port_is_false_within_the_timeout(
    monkeypatch):
  import socket
  import time
  monkeypatch.delenv("https_proxy", raising=False)
  monkeypatch.delenv("HTTPS_PROXY", raising=False)
  with socket.socket() as s:   # a port nobody listens on once closed
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  start = time.monotonic()
  assert not sources.network_reachable("127.0.0.1", port, timeout=2.0)
  assert time.monotonic() - start < 2.5
  with socket.socket() as server:  # and an open one is reachable
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    assert sources.network_reachable("127.0.0.1", server.getsockname()[1],
                                     timeout=2.0)


# ---------------------------------------------------------------- npz


def test_npz_that_is_not_an_archive_is_named(tmp_path):
  for name, write in (("text.npz", lambda p: p.write_text("x_train,1\n")),
                      ("array.npy", lambda p: np.save(p, np.zeros(3)))):
    path = tmp_path / name
    write(path)
    with pytest.raises(ValueError) as info:
      sources.load_dataset(f"npz:{path}")
    message = str(info.value)
    assert f"{path} is not an npz archive" in message
    assert "pickled" not in message


def test_npz_good_file_adds_channel_axis(tmp_path):
  spec = _write_npz(tmp_path / "good.npz", **_good_arrays())
  ds = sources.load_dataset(spec)
  assert ds.x_train.shape == (3, 2, 2, 1)
  assert ds.x_test.shape == (2, 2, 2, 1)
  assert ds.num_classes == 3  # max label 2, + 1.
  np.testing.assert_array_equal(ds.y_train, [0, 2, 1])
  assert ds.y_train.dtype == np.int32 and ds.y_test.dtype == np.int32
  assert ds.x_train[1, 0, 1, 0] == 5


def test_npz_num_classes_uses_both_splits(tmp_path):
  arrays = _good_arrays()
  arrays["y_test"] = np.array([4, 0])
  ds = sources.load_dataset(_write_npz(tmp_path / "a.npz", **arrays))
  assert ds.num_classes == 5


def test_npz_keras_column_labels_are_flattened(tmp_path):
  arrays = _good_arrays()
  arrays["y_train"] = arrays["y_train"][:, None]
  ds = sources.load_dataset(_write_npz(tmp_path / "a.npz", **arrays))
  assert ds.y_train.shape == (3,)


def test_npz_relative_path_resolves_against_cwd(tmp_path, monkeypatch):
  _write_npz(tmp_path / "rel.npz", **_good_arrays())
  monkeypatch.chdir(tmp_path)
  assert sources.load_dataset("npz:rel.npz").x_train.shape[0] == 3


def test_npz_missing_file(tmp_path):
  with pytest.raises(ValueError, match="not found"):
    sources.load_dataset(f"npz:{tmp_path / 'nope.npz'}")


def test_npz_missing_keys(tmp_path):
  arrays = _good_arrays()
  del arrays["y_test"]
  with pytest.raises(ValueError, match=r"missing keys \['y_test'\]"):
    sources.load_dataset(_write_npz(tmp_path / "a.npz", **arrays))


def test_npz_float_images_rejected_with_conversion_hint(tmp_path):
  arrays = _good_arrays()
  arrays["x_train"] = arrays["x_train"].astype(np.float32) / 255
  with pytest.raises(ValueError, match="uint8.*astype"):
    sources.load_dataset(_write_npz(tmp_path / "a.npz", **arrays))


def test_npz_wrong_rank(tmp_path):
  arrays = _good_arrays()
  arrays["x_test"] = np.zeros((2, 4), np.uint8)
  with pytest.raises(ValueError, match=r"\[N, H, W, C\]"):
    sources.load_dataset(_write_npz(tmp_path / "a.npz", **arrays))


def test_npz_negative_labels(tmp_path):
  arrays = _good_arrays()
  arrays["y_train"] = np.array([0, -1, 1])
  with pytest.raises(ValueError, match="negative"):
    sources.load_dataset(_write_npz(tmp_path / "a.npz", **arrays))


def test_npz_float_labels(tmp_path):
  arrays = _good_arrays()
  arrays["y_train"] = np.array([0.0, 1.0, 2.0])
  with pytest.raises(ValueError, match="integer"):
    sources.load_dataset(_write_npz(tmp_path / "a.npz", **arrays))


def test_npz_empty_split(tmp_path):
  arrays = _good_arrays()
  arrays["x_test"] = np.zeros((0, 2, 2), np.uint8)
  arrays["y_test"] = np.zeros((0,), np.int64)
  with pytest.raises(ValueError, match="empty"):
    sources.load_dataset(_write_npz(tmp_path / "a.npz", **arrays))


def test_npz_mismatched_lengths(tmp_path):
  arrays = _good_arrays()
  arrays["y_train"] = np.array([0, 1])
  with pytest.raises(ValueError, match="3 examples but y_train has 2"):
    sources.load_dataset(_write_npz(tmp_path / "a.npz", **arrays))


def test_npz_mismatched_image_shapes(tmp_path):
  arrays = _good_arrays()
  arrays["x_test"] = np.zeros((2, 3, 3), np.uint8)
  with pytest.raises(ValueError, match="shape"):
    sources.load_dataset(_write_npz(tmp_path / "a.npz", **arrays))


def test_tfds_labels_out_of_range(monkeypatch):
  monkeypatch.setattr(sources, "network_reachable", lambda: True)
  x = np.zeros((2, 3, 3, 1), np.uint8)
  _fake_tfds(monkeypatch, {"train": (x, [0, 10]), "test": (x, [0, 1])})
  with pytest.raises(ValueError, match=r"^mnist: y_train must hold class indices in "
                     r"\[0, 10\) \(num_classes=10\), got 1 labels outside it "
                     r"\(10\)\.$"):
    sources.load_dataset("mnist")


# ---------------------------------------------------------------- unlabeled


def test_load_unlabeled_prefers_x_unlabeled(tmp_path):
  x = np.arange(5, dtype=np.uint8)[:, None, None, None] * np.ones(
      (1, 2, 2, 3), np.uint8)  # Image i is filled with value i.
  path = tmp_path / "aux.npz"
  np.savez(path, x_unlabeled=x, x_train=np.zeros((9, 2, 2, 3), np.uint8))
  out = sources.load_unlabeled(f"npz:{path}", num=3,
                               rng=np.random.default_rng(0))
  assert out.shape == (3, 2, 2, 3) and out.dtype == np.uint8
  values = out[:, 0, 0, 0]
  assert len(set(values.tolist())) == 3  # Without replacement.
  assert set(values.tolist()) <= set(range(5))
  # Which images: exactly what the generator chooses.
  expected = np.random.default_rng(0).choice(5, size=3, replace=False)
  np.testing.assert_array_equal(values, expected)


def test_load_unlabeled_falls_back_to_x_train(tmp_path):
  spec = _write_npz(tmp_path / "a.npz", **_good_arrays())
  out = sources.load_unlabeled(spec, num=3, rng=np.random.default_rng(1))
  assert out.shape == (3, 2, 2, 1)
  # All 3 train images, in some order: their sums are 6, 22, 38.
  assert sorted(out.reshape(3, -1).sum(1).tolist()) == [6, 22, 38]


def test_load_unlabeled_from_dataset_name():
  out = sources.load_unlabeled("digits", num=10, rng=np.random.default_rng(0))
  assert out.shape == (10, 8, 8, 1) and out.dtype == np.uint8


def test_load_unlabeled_errors(tmp_path):
  spec = _write_npz(tmp_path / "a.npz", **_good_arrays())
  with pytest.raises(ValueError, match="only 3"):
    sources.load_unlabeled(spec, num=4, rng=np.random.default_rng(0))
  with pytest.raises(ValueError, match="positive"):
    sources.load_unlabeled(spec, num=0, rng=np.random.default_rng(0))
  with pytest.raises(TypeError, match="Generator"):
    sources.load_unlabeled(spec, num=1, rng=0)
  bad = tmp_path / "b.npz"
  np.savez(bad, other=np.zeros(3))
  with pytest.raises(ValueError, match="x_unlabeled"):
    sources.load_unlabeled(f"npz:{bad}", num=1, rng=np.random.default_rng(0))


# ---------------------------------------------------------------- resplit


def _tagged_dataset():
  """8 train + 2 test 1x1 images whose pixel is the pooled index 0..9."""
  x = np.arange(10, dtype=np.uint8).reshape(10, 1, 1, 1)
  y = (np.arange(10) % 3).astype(np.int32)
  return sources.Dataset(name="tagged", x_train=x[:8], y_train=y[:8],
                         x_test=x[8:], y_test=y[8:], num_classes=3)


def test_resplit_pools_and_cuts_80_20():
  out = sources.resplit(_tagged_dataset(), 0.8, rng=np.random.default_rng(0))
  assert out.x_train.shape == (8, 1, 1, 1) and out.x_test.shape == (2, 1, 1, 1)
  train, test = out.x_train.ravel(), out.x_test.ravel()
  # Every pooled image once, labels travel with their image, pooled order.
  np.testing.assert_array_equal(np.sort(np.concatenate([train, test])),
                                np.arange(10))
  np.testing.assert_array_equal(out.y_train, train % 3)
  np.testing.assert_array_equal(out.y_test, test % 3)
  assert np.all(np.diff(train.astype(int)) > 0)
  assert out.num_classes == 3 and out.name == "tagged"
  again = sources.resplit(_tagged_dataset(), 0.8, rng=np.random.default_rng(0))
  np.testing.assert_array_equal(again.x_test, out.x_test)
  tests = {tuple(sources.resplit(_tagged_dataset(), 0.8,
                                 rng=np.random.default_rng(s)).x_test.ravel())
           for s in range(6)}
  assert len(tests) > 1  # the seed matters
  # round(0.75 * 10) = round(7.5) = 8 train images.
  assert sources.resplit(_tagged_dataset(), 0.75,
                         rng=np.random.default_rng(0)).x_train.shape[0] == 8


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.2, 0.01, 0.99])
def test_resplit_rejects_empty_splits(fraction):
  with pytest.raises(ValueError, match="train_fraction"):
    sources.resplit(_tagged_dataset(), fraction, rng=np.random.default_rng(0))


def test_resplit_needs_a_generator():
  with pytest.raises(TypeError, match="Generator"):
    sources.resplit(_tagged_dataset(), 0.8, rng=0)


# ---------------------------------------------------------------- real data


def test_real_mnist_npz():
  path = os.path.join(_DATASETS, "mnist.npz")
  if not os.path.exists(path):
    pytest.skip("../shared/datasets/mnist.npz is absent")
  ds = sources.load_dataset(f"npz:{path}")
  assert ds.x_train.shape == (60000, 28, 28, 1)
  assert ds.x_test.shape == (10000, 28, 28, 1)
  assert ds.num_classes == 10
  assert np.bincount(ds.y_train)[0] == 5923
  # HFLDD's 80/20 re-split of the 70,000 pooled images.
  re = sources.resplit(ds, 0.8, rng=np.random.default_rng(0))
  assert re.x_train.shape[0] == 56000 and re.x_test.shape[0] == 14000
  assert np.bincount(np.concatenate([re.y_train, re.y_test]))[0] == 5923 + 980


def test_real_tiny_imagenet_unlabeled():
  path = os.path.join(_DATASETS, "tiny_imagenet_val1000_32px.npz")
  if not os.path.exists(path):
    pytest.skip("../shared/datasets/tiny_imagenet_val1000_32px.npz is absent")
  out = sources.load_unlabeled(f"npz:{path}", num=1000,
                               rng=np.random.default_rng(0))
  assert out.shape == (1000, 32, 32, 3) and out.dtype == np.uint8


# ------------------------------------------------------- declared classes


def _labelled(tmp_path, y_train, y_test, name="l.npz"):
  x = np.zeros((len(y_train), 2, 2), np.uint8)
  xt = np.zeros((len(y_test), 2, 2), np.uint8)
  return _write_npz(tmp_path / name, x_train=x, y_train=np.array(y_train),
                    x_test=xt, y_test=np.array(y_test))


def test_npz_declared_num_classes_refuses_stray_labels(tmp_path):
  spec = _labelled(tmp_path, [0, 1, 12, 2, 100000, 12], [0, 1])
  with pytest.raises(ValueError) as e:
    sources.load_dataset(spec, num_classes=3)
  assert str(e.value) == (
      f"{spec}: y_train must hold class indices in [0, 3) (num_classes=3), "
      "got 3 labels outside it (12, 100000).")
  spec = _labelled(tmp_path, [0, 1, 2], [0, 7], name="t.npz")
  with pytest.raises(ValueError, match=r"y_test must hold class indices in "
                     r"\[0, 3\) \(num_classes=3\), got 1 labels outside it "
                     r"\(7\)"):
    sources.load_dataset(spec, num_classes=3)


def test_npz_declared_num_classes_keeps_classes_absent_from_the_data(
    tmp_path, caplog):
  spec = _labelled(tmp_path, [0, 1, 1, 3], [0, 1])
  with caplog.at_level("WARNING"):
    ds = sources.load_dataset(spec, num_classes=5)
  assert ds.num_classes == 5
  warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert warned == [f"{spec}: 2 of 5 classes have no training example "
                    "(classes [2, 4])."]


def test_npz_inferred_num_classes_warns_on_empty_classes(tmp_path, caplog):
  # One stray label 12: 13 classes inferred, 10 of them empty.
  spec = _labelled(tmp_path, [0, 1, 12], [0, 1])
  with caplog.at_level("WARNING"):
    ds = sources.load_dataset(spec)
  assert ds.num_classes == 13
  assert any("10 of 13 classes have no training example (classes [2, 3, 4, "
             "5, 6, 7, 8, 9, 10, 11])" in r.getMessage()
             for r in caplog.records)


def test_declared_num_classes_of_a_named_dataset_must_match():
  with pytest.raises(ValueError, match=r"^num_classes must be 10 for 'digits' "
                     r"\(its number of classes\), got 12\.$"):
    sources.load_dataset("digits", num_classes=12)
  assert sources.load_dataset("digits", num_classes=10).num_classes == 10
  with pytest.raises(ValueError, match=r"^num_classes must be an int >= 1, "
                     r"got 0\.$"):
    sources.load_dataset("digits", num_classes=0)


def test_damaged_npz_archives_are_one_line(tmp_path):
  import io  # pylint: disable=g-import-not-at-top
  import struct  # pylint: disable=g-import-not-at-top
  import zipfile  # pylint: disable=g-import-not-at-top
  x = np.arange(6 * 4 * 4, dtype=np.uint8).reshape(6, 4, 4, 1)
  y = np.arange(6, dtype=np.int32) % 2
  good = tmp_path / "good.npz"
  np.savez_compressed(good, x_train=x, y_train=y, x_test=x, y_test=y)
  raw = good.read_bytes()
  cut = tmp_path / "cut.npz"          # the end kept, the middle cut out
  cut.write_bytes(raw[:len(raw) // 3] + raw[-120:])
  corrupt = tmp_path / "corrupt.npz"  # zeros inside the first member
  damaged = bytearray(raw)
  damaged[100:140] = bytes(40)
  corrupt.write_bytes(bytes(damaged))
  # A header claiming 1e5 x 8e4 float64 = 59.6 GiB in 8 + 2 + 119 + 64 bytes.
  huge = tmp_path / "huge.npz"
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w") as z:
    header = ("{'descr': '<f8', 'fortran_order': False, "
              "'shape': (100000, 80000), }")
    header += " " * (118 - len(header)) + "\n"
    z.writestr("x_train.npy", b"\x93NUMPY\x01\x00"
               + struct.pack("<H", len(header)) + header.encode() + bytes(64))
  huge.write_bytes(buf.getvalue())
  for path, why in ((cut, "BadZipFile"), (corrupt, "(BadZipFile|error)"),
                    (huge, r"x_train.npy declares shape \(100000, 80000\) of "
                           r"float64, 59.6 GiB, in a member of 193 bytes")):
    for call in (lambda: sources.load_dataset(f"npz:{path}"),
                 lambda: sources.npz_digest(str(path))):
      with pytest.raises(ValueError, match=f"is a damaged npz archive "
                                           f"\\({why}") as info:
        call()
      assert "\n" not in str(info.value)
      assert "write it again with np.savez" in str(info.value)
  assert sources.npz_digest(str(good))  # an intact one still reads
