"""FedD3 stages: upload size, union, hybrid data, distillers."""

import jax
import numpy as np
import pytest

from fedjax_dd.algorithms import fedd3
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill.kip import KipOptions
from fedjax_dd.kernels.native import fc_kernel


def _distilled(learned=False):
  x = np.arange(3 * 2 * 2 * 1, dtype=np.uint8).reshape(3, 2, 2, 1)
  y = np.array([0, 1, 1], np.int32)
  return fedd3.DistilledSet(x=x, y=y, y_soft=np.eye(2, dtype=np.float32)[y],
                            owner=np.array([0, 0, 2]), learned_labels=learned)


def test_upload_bits_by_hand():
  # 3 images of 2x2x1 at 8 bits + 3 hard labels at 8 bits = 96 + 24.
  assert fedd3.upload_bits(_distilled()) == 3 * 4 * 8 + 3 * 8
  # Learned labels travel as 2 float32 entries each: 96 + 3 * 2 * 32.
  assert fedd3.upload_bits(_distilled(learned=True)) == 96 + 192
  # The widths are the payload's: e.g. 4-bit pixels, 16-bit soft labels.
  assert fedd3.upload_bits(_distilled(), bits_per_pixel_channel=4,
                           bits_per_hard_label=2) == 3 * 4 * 4 + 3 * 2
  assert fedd3.upload_bits(_distilled(learned=True),
                           bits_per_soft_label=16) == 96 + 3 * 2 * 16


def test_distilled_set_round_trips_through_arrays():
  d = _distilled(learned=True).replace(iterations=np.array([3, 0, 5]))
  arrays = d.arrays()
  assert set(arrays) == {"x", "y", "y_soft", "owner", "iterations"}
  back = fedd3.DistilledSet.from_arrays(arrays, learned_labels=True,
                                        centered_labels=False)
  assert back.learned_labels and back.x_float is None
  np.testing.assert_array_equal(back.iterations, [3, 0, 5])
  np.testing.assert_array_equal(back.x, d.x)


def test_pad_uploads_by_hand_and_back():
  d = _distilled()  # owners 0, 0, 2
  u = fedd3.pad_uploads(d, num_clients=3, size=2)
  assert u.x.shape == (3, 2, 2, 2, 1) and u.y_soft.shape == (3, 2, 2)
  np.testing.assert_array_equal(u.count, [2, 0, 1])
  np.testing.assert_array_equal(u.x[0], d.x[:2])
  np.testing.assert_array_equal(u.x[2, 0], d.x[2])
  assert not u.x[1].any() and not u.x[2, 1].any()  # padding is zeros
  back = u.distilled()
  for f in ("x", "y", "y_soft", "owner"):
    np.testing.assert_array_equal(getattr(back, f), getattr(d, f))
  with pytest.raises(ValueError, match="more than the padded size 1"):
    fedd3.pad_uploads(d, num_clients=3, size=1)
  with pytest.raises(ValueError, match=r"owner must lie in \[0, 2\)"):
    fedd3.pad_uploads(d, num_clients=2, size=2)


def test_one_shot_refuses_empty_sizes():
  from tests.conftest import tiny_task
  import optax
  for bad in ("num_classes", "images_per_class", "batch_size"):
    kwargs = dict(num_classes=3, images_per_class=1, batch_size=4)
    kwargs[bad] = 0
    with pytest.raises(ValueError, match=f"{bad} must be >= 1"):
      fedd3.fedd3(None, tiny_task(), optax.sgd(0.1), **kwargs)


def _server_set(d, num_clients, size):
  """What FedD3's server trains on: its setup over the padded uploads."""
  import optax
  from tests.conftest import tiny_task
  algo = fedd3.fedd3(None, tiny_task(), optax.sgd(0.1),
                        num_classes=d.y_soft.shape[-1], images_per_class=1,
                        batch_size=2)
  uploads = fedd3.pad_uploads(d, num_clients, size)
  return algo.setup(uploads, None), uploads


def test_server_trains_on_exactly_the_received_rows():
  out, uploads = _server_set(_distilled(), num_clients=3, size=2)
  # Client blocks of 2: client 0's rows 0, 1 and client 2's row 4.
  np.testing.assert_array_equal(out["index"], [0, 1, 4])
  np.testing.assert_array_equal(out["y"], [0, 1, 1])
  flat = np.asarray(uploads.x).reshape(6, 2, 2, 1)
  np.testing.assert_array_equal(flat[np.asarray(out["index"])],
                                _distilled().x)


def test_hybrid_client_data_appends_others_only():
  x = np.full((3, 4, 2, 2, 1), 200, np.uint8)
  y = np.full((3, 4), 1, np.int32)
  data = ClientData(x=x, y=y, num_examples=np.array([4, 2, 3], np.int32))
  h = fedd3.hybrid_client_data(data, _distilled())
  # Client 0 sent 2 images (receives 1), client 1 none (3), client 2 one (2).
  np.testing.assert_array_equal(h.num_examples, [5, 5, 5])
  np.testing.assert_array_equal(h.x[0, 4, :, :, 0], [[8, 9], [10, 11]])
  np.testing.assert_array_equal(h.y[1, 2:5], [0, 1, 1])
  np.testing.assert_array_equal(h.y[2, 3:5], [0, 1])
  # Round-1 download: each client receives the others' sets (1 + 3 + 2 images).
  per_image = 4 * 8 + 8
  assert fedd3.hybrid_download_bits(_distilled(), 3) == 6 * per_image


def _clients():
  rng = np.random.default_rng(0)
  x = np.zeros((2, 8, 4, 4, 1), np.uint8)
  y = np.zeros((2, 8), np.int32)
  for c in range(2):
    lab = np.array([c, c + 1] * 4)
    img = rng.integers(0, 40, (8, 4, 4, 1))
    img[np.arange(8), lab] += 200
    x[c], y[c] = img, lab
  return ClientData(x=x, y=y, num_examples=np.array([8, 6], np.int32))


def test_kip_and_gmm_distillers_shapes():
  data = _clients()
  kip = fedd3.kip_distiller(fc_kernel(depth=2), num_classes=3, mean=[0.3],
                            std=[0.3], images_per_class=1,
                            options=KipOptions(max_iterations=5,
                                               segment_iterations=5,
                                               stop_accuracy=None))
  d = kip(jax.random.PRNGKey(0), data)
  assert d.size == 4 and d.x.dtype == np.uint8 and d.x_float.shape == (4, 4, 4, 1)
  np.testing.assert_array_equal(np.bincount(d.owner), [2, 2])
  np.testing.assert_array_equal(sorted(d.y[d.owner == 1]), [1, 2])
  # One component per class of 3-4 images: a mean, not a raw image (two
  # components on 3 images put one on a single image, which the guard
  # refuses).
  g = fedd3.gmm_distiller(num_classes=3, images_per_class=1)(jax.random.PRNGKey(0), data)
  assert g.size == 4 and g.x.dtype == np.uint8
  np.testing.assert_array_equal(g.y_soft.sum(-1), np.ones(4))


def test_privacy_guard_refuses_single_sample_classes():
  data = _clients()
  data = data.replace(num_examples=np.array([8, 3], np.int32))  # client 1: 1x class 2
  kip = fedd3.kip_distiller(fc_kernel(depth=2), num_classes=3, mean=[0.3],
                            std=[0.3], images_per_class=1,
                            options=KipOptions(max_iterations=2))
  with pytest.raises(ValueError, match="raw image"):
    kip(jax.random.PRNGKey(0), data)


def test_privacy_guard_refuses_whole_class_supports():
  # Client 1 holds 3 examples each of classes 1 and 2 (6 rows): with 3
  # images per class its supports would be those raw images.
  data = _clients()
  kip = lambda ipc, allow: fedd3.kip_distiller(
      fc_kernel(depth=2), num_classes=3, mean=[0.3], std=[0.3],
      images_per_class=ipc,
      options=KipOptions(max_iterations=5, stop_accuracy=None),
      allow_raw_upload=allow)
  with pytest.raises(ValueError, match=r"client 1 class 1 holds 3 examples "
                     r"<= images_per_class=3.*client 1 class 2 \(3\)"):
    kip(3, False)(jax.random.PRNGKey(0), data)
  # Below the class size (or with the escape hatch) it distils.
  assert kip(2, False)(jax.random.PRNGKey(0), data).size == 8
  assert kip(3, True)(jax.random.PRNGKey(0), data).size == 12


# ---------------------------------------------------------------- per client


def test_client_upload_bits_by_hand():
  # Owners [0, 0, 2]: client 0 sends 2 images, client 1 none, client 2 one;
  # an image is 4 pixels * 8 bits + an 8-bit label = 40 bits.
  np.testing.assert_array_equal(fedd3.client_upload_bits(_distilled(), 3),
                                [80, 0, 40])
  # Learned labels: 32 + 2 * 32 = 96 bits per image.
  np.testing.assert_array_equal(
      fedd3.client_upload_bits(_distilled(learned=True), 4), [192, 0, 96, 0])
  # Downloads of the hybrid: client i receives M - M_i = 1, 3, 2 images.
  np.testing.assert_array_equal(
      fedd3.hybrid_client_download_bits(_distilled(), 3), [40, 120, 80])


# ---------------------------------------------------------------- random control


def _random_clients():
  # Client 0: classes 0 (5 images) and 1 (3); client 1: class 1 (1 image),
  # class 2 (4); client 2: class 0 only (2). Every image is unique.
  labels = [[0, 1, 0, 1, 0, 1, 0, 0], [2, 1, 2, 2, 2], [0, 0]]
  x = np.zeros((3, 8, 2, 2, 1), np.uint8)
  y = np.zeros((3, 8), np.int32)
  for c, lab in enumerate(labels):
    y[c, :len(lab)] = lab
    x[c, :len(lab)] = (100 * c + np.arange(len(lab)) + 1)[:, None, None, None]
  return ClientData(x=x, y=y, num_examples=np.array([8, 5, 2], np.int32))


def test_random_distiller_sends_raw_images_at_kips_budget():
  data = _random_clients()
  d = fedd3.random_distiller(num_classes=3, images_per_class=2)(
      jax.random.PRNGKey(0), data)
  assert d.x.dtype == np.uint8 and not d.learned_labels
  # min(2, n_class) per held class: client 0 2 + 2, client 1 1 + 2, client 2 2.
  counts = {(int(o), int(k)): int(((d.owner == o) & (d.y == k)).sum())
            for o in range(3) for k in range(3)}
  assert counts == {(0, 0): 2, (0, 1): 2, (0, 2): 0, (1, 0): 0, (1, 1): 1,
                    (1, 2): 2, (2, 0): 2, (2, 1): 0, (2, 2): 0}
  np.testing.assert_array_equal(d.owner, [0, 0, 0, 0, 1, 1, 1, 2, 2])
  for img, lab, own in zip(d.x, d.y, d.owner):
    # Each image is one of its owner's raw images, with that image's label.
    n = data.num_examples[own]
    hits = np.flatnonzero((data.x[own, :n] == img).all(axis=(1, 2, 3)))
    assert hits.size == 1 and data.y[own, hits[0]] == lab
  # Drawn without replacement: no image twice.
  assert len({img.tobytes() for img in d.x}) == d.size
  np.testing.assert_array_equal(d.y_soft, np.eye(3, dtype=np.float32)[d.y])
  # Same budget as KIP: 9 images of 4 pixels.
  assert fedd3.upload_bits(d) == 9 * (4 * 8 + 8)


def test_random_distiller_is_a_function_of_the_key():
  data = _random_clients()
  make = fedd3.random_distiller(num_classes=3, images_per_class=2)
  a = make(jax.random.PRNGKey(3), data)
  b = make(jax.random.PRNGKey(3), data)
  np.testing.assert_array_equal(a.x, b.x)
  # Over a few keys the draw changes (client 0 has C(5, 2) * C(3, 2) = 30
  # possible uploads).
  draws = {make(jax.random.PRNGKey(k), data).x.tobytes() for k in range(6)}
  assert len(draws) > 1


# ---------------------------------------------------------------- learned labels


def test_learned_centred_labels_become_training_distributions():
  # K = 2, centred: one-hot - 1/2. A learned row [0.7, -0.2] maps to
  # [1.2, 0.3] / 1.5 = [0.8, 0.2]; a fixed centred row back to one-hot.
  y_soft = np.array([[0.7, -0.2], [-0.5, 0.5]], np.float32)
  d = fedd3.DistilledSet(x=np.zeros((2, 1, 1, 1), np.uint8),
                         y=np.array([0, 1], np.int32), y_soft=y_soft,
                         owner=np.array([0, 1]), learned_labels=True,
                         centered_labels=True)
  np.testing.assert_allclose(d.targets(), [[0.8, 0.2], [0.0, 1.0]], atol=1e-6)
  s, _ = _server_set(d, num_clients=2, size=1)
  assert s["y"].shape == (2, 2) and s["y"].dtype == np.float32
  np.testing.assert_allclose(s["y"], d.targets(), atol=1e-6)
  # Fixed labels: the server trains on the hard labels.
  hard, _ = _server_set(d.replace(learned_labels=False), num_clients=2,
                        size=1)
  np.testing.assert_array_equal(hard["y"], [0, 1])


def test_hybrid_with_learned_labels_has_k_dim_targets():
  x = np.full((3, 4, 2, 2, 1), 200, np.uint8)
  y = np.array([[1, 0, 1, 1], [0, 1, 0, 0], [1, 1, 1, 0]], np.int32)
  data = ClientData(x=x, y=y, num_examples=np.array([4, 2, 3], np.int32))
  d = _distilled().replace(y_soft=np.array([[0.9, 0.1], [0.3, 0.7],
                                            [0.2, 0.8]], np.float32),
                           learned_labels=True)
  h = fedd3.hybrid_client_data(data, d)
  assert h.y.shape == (3, 5, 2) and h.y.dtype == np.float32
  # Client 1: its 2 local rows one-hot, then all 3 received soft rows.
  np.testing.assert_allclose(h.y[1, :2], [[1, 0], [0, 1]])
  np.testing.assert_allclose(h.y[1, 2:5], d.y_soft)
  # Client 2 receives what clients 0 sent.
  np.testing.assert_allclose(h.y[2, 3:5], d.y_soft[:2])


def test_kip_learned_labels_reach_server_training_as_soft_targets():
  import optax
  from tests.conftest import tiny_task

  data = _clients()
  kip = fedd3.kip_distiller(
      fc_kernel(depth=2), num_classes=3, mean=[0.3], std=[0.3],
      images_per_class=1,
      options=KipOptions(max_iterations=5, segment_iterations=5,
                         learn_labels=True, stop_accuracy=None))
  d = kip(jax.random.PRNGKey(0), data)
  assert d.learned_labels and d.y_soft.shape == (4, 3)
  # Learned labels moved off the one-hot they started from.
  assert not np.allclose(d.y_soft, np.eye(3)[d.y])
  # Per-client KIP statistics: a fixed budget of 5 iterations for both.
  np.testing.assert_array_equal(d.iterations, [5, 5])
  assert np.isfinite(d.first_loss).all() and np.isfinite(d.last_loss).all()
  assert not d.converged.any()
  task = tiny_task()
  params, stats = task.init(jax.random.PRNGKey(1))

  def train(distilled):
    # FedD3's server, three steps on the union as received.
    algo = fedd3.fedd3(lambda key, data: distilled, task, optax.sgd(0.5),
                          num_classes=3, images_per_class=1, batch_size=4,
                          local_steps=3,
                          learned_labels=distilled.learned_labels,
                          centered_labels=distilled.centered_labels)
    uploads = algo.client_stage(None, data, None)
    setup = algo.setup(uploads, None)
    if distilled.learned_labels:
      np.testing.assert_allclose(np.sum(setup["y"], -1), np.ones(4),
                                 rtol=1e-6)
    state = algo.init(jax.random.PRNGKey(2), setup, uploads, params, stats)
    state, metrics = algo.epoch(state, uploads)
    assert np.isfinite(float(metrics["train_loss"]))
    return algo.model(state)[0]

  soft = train(d)
  # One-hot [M, K] targets train exactly as the int labels they encode ...
  hard_int = train(d.replace(learned_labels=False))
  hard_onehot = train(d.replace(y_soft=np.eye(3, dtype=np.float32)[d.y],
                                centered_labels=False))
  for a, b in zip(jax.tree_util.tree_leaves(hard_int),
                  jax.tree_util.tree_leaves(hard_onehot)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # ... and the learned soft targets train differently.
  assert any(not np.allclose(a, b) for a, b in zip(
      jax.tree_util.tree_leaves(soft), jax.tree_util.tree_leaves(hard_int)))


def test_hybrid_ledger_by_hand():
  # 2x2x1 uint8 images with a byte label: 40 bits each. Owners 0, 0, 2.
  ledger = fedd3.hybrid_ledger(_distilled(), num_clients=3)
  totals = ledger.cumulative()
  assert totals["bytes_uploaded"] * 8 == 2 * 40 + 40
  # Client 0 receives 1 image, client 1 all 3, client 2 the other 2.
  assert totals["bytes_downloaded"] * 8 == (1 + 3 + 2) * 40


def test_privacy_guard_refuses_uploads_kip_did_not_move():
  # lr so small that no pixel moves by half a grey level: every quantised
  # image is its raw source, which the guard refuses after KIP.
  data = _clients()
  kip = lambda allow: fedd3.kip_distiller(
      fc_kernel(depth=2), num_classes=3, mean=[0.3], std=[0.3],
      images_per_class=1,
      options=KipOptions(max_iterations=1, lr=1e-9, stop_accuracy=None),
      allow_raw_upload=allow)
  with pytest.raises(ValueError, match=r"4 of 4 KIP images to upload are "
                     r"byte-identical to a raw image of their sender"):
    kip(False)(jax.random.PRNGKey(0), data)
  d = kip(True)(jax.random.PRNGKey(0), data)
  from fedjax_dd.distill import privacy
  host = jax.device_get(data)
  assert privacy.identical_to_raw(d.x, d.owner, host.x,
                                  host.num_examples).all()
