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


def test_tfds_failure_says_use_npz(monkeypatch):
  monkeypatch.setattr(sources, "network_reachable", lambda: True)

  def failing_load(*args, **kwargs):
    raise ConnectionError("no network")

  fake = types.ModuleType("tensorflow_datasets")
  fake.load = failing_load
  fake.as_numpy = lambda t: t
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
  with pytest.raises(RuntimeError) as info:
    sources.load_dataset("cifar10")
  message = str(info.value)
  assert "npz:PATH" in message and "no network" in message
  for key in ("x_train", "y_train", "x_test", "y_test"):
    assert key in message


def test_tfds_success_path_validates(monkeypatch):
  monkeypatch.setattr(sources, "network_reachable", lambda: True)
  x = np.zeros((4, 3, 3, 1), np.uint8)
  calls = {}

  def fake_load(name, **kwargs):
    calls["name"], calls["kwargs"] = name, kwargs
    return [(x, np.array([0, 1, 2, 9])), (x[:2], np.array([3, 4]))]

  fake = types.ModuleType("tensorflow_datasets")
  fake.load = fake_load
  fake.as_numpy = lambda t: t
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
  ds = sources.load_dataset("mnist", data_dir="tfds_cache")
  assert calls["name"] == "mnist"
  assert calls["kwargs"]["batch_size"] == -1
  assert calls["kwargs"]["as_supervised"] is True
  assert calls["kwargs"]["data_dir"] == "tfds_cache"
  assert ds.num_classes == 10 and ds.y_train.dtype == np.int32


def _fake_tfds(monkeypatch, load):
  fake = types.ModuleType("tensorflow_datasets")
  fake.load = load
  fake.as_numpy = lambda t: t
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)


def test_tfds_offline_without_a_local_copy_fails_at_once(monkeypatch,
                                                         tmp_path):
  def load(*args, **kwargs):
    raise AssertionError("TFDS must not be asked to download")

  _fake_tfds(monkeypatch, load)
  monkeypatch.setattr(sources, "network_reachable", lambda: False)
  with pytest.raises(RuntimeError) as info:
    sources.load_dataset("svhn_cropped", data_dir=str(tmp_path))
  message = str(info.value)
  assert message.startswith("Could not load 'svhn_cropped' with "
                            "tensorflow_datasets")
  assert f"no prepared copy in {tmp_path} and no network" in message
  assert "npz:PATH" in message and "svhn_cropped.npz" in message


def test_tfds_local_copy_skips_the_network_probe(monkeypatch, tmp_path):
  version = tmp_path / "mnist" / "3.0.1"
  version.mkdir(parents=True)
  (version / "dataset_info.json").write_text("{}")
  x = np.zeros((2, 3, 3, 1), np.uint8)
  _fake_tfds(monkeypatch, lambda *a, **k: [(x, np.array([0, 1])),
                                           (x, np.array([1, 0]))])

  def probe():
    raise AssertionError("a prepared copy needs no network")

  monkeypatch.setattr(sources, "network_reachable", probe)
  assert sources.tfds_prepared("mnist", str(tmp_path))
  assert not sources.tfds_prepared("cifar10", str(tmp_path))
  assert sources.load_dataset("mnist", data_dir=str(tmp_path)).num_classes == 10


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
  fake = types.ModuleType("tensorflow_datasets")
  fake.load = lambda *a, **k: [(x, np.array([0, 10])), (x, np.array([0, 1]))]
  fake.as_numpy = lambda t: t
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
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
