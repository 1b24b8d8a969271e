"""Batched KIP: shapes, support init, early stop, backends, padding, quantisation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.distill import kip
from fedjax_dd.kernels.native import fc_kernel


def _clients(seed=0, sizes=(12, 20, 7), n_max=20, classes_of=((0, 1), (1, 2), (0, 2))):
  """Three clients, 6x6x1 images whose bright row encodes the label."""
  rng = np.random.default_rng(seed)
  x = np.zeros((3, n_max, 6, 6, 1), np.uint8)
  y = np.zeros((3, n_max), np.int32)
  for c, (n, cls) in enumerate(zip(sizes, classes_of)):
    labels = rng.choice(cls, n)
    labels[:2] = cls  # every client holds both of its classes
    img = rng.integers(0, 50, (n, 6, 6, 1))
    img[np.arange(n), 2 * labels] += 200
    x[c, :n], y[c, :n] = img, labels
  return x, y, np.asarray(sizes, np.int32)


MEAN, STD = np.array([0.3], np.float32), np.array([0.3], np.float32)
_OPTIONS = {f.name for f in dataclasses.fields(kip.KipOptions)}


def _args(**kw):
  """``distill_clients`` arguments; KipOptions fields go into ``options``."""
  options = {k: kw.pop(k) for k in list(kw) if k in _OPTIONS}
  return dict(kw, options=kip.KipOptions(**options))


def _distill(backend="vmap", **kw):
  x, y, n = _clients()
  args = dict(num_classes=3, kernel_fn=fc_kernel(depth=2), mean=MEAN, std=STD,
              images_per_class=2, max_iterations=20, segment_iterations=10,
              stop_accuracy=2.0, mapper=ClientMapper(backend=backend))
  args.update(kw)
  return (kip.distill_clients(jax.random.PRNGKey(0), x, y, n, **_args(**args)),
          (x, y, n))


def test_shapes_and_support_per_held_class():
  res, (x, y, n) = _distill()
  # Room for 2 classes (the most any client holds) x 2 images: S = 4.
  assert res.x.shape == (3, 4, 6, 6, 1) and res.y.shape == (3, 4, 3)
  np.testing.assert_array_equal(res.counts, [4, 4, 4])
  labels = np.asarray(res.labels)
  for c, held in enumerate([(0, 1), (1, 2), (0, 2)]):
    assert set(labels[c][np.asarray(res.mask[c])]) == set(held)
  assert np.isfinite(np.asarray(res.x)).all()
  np.testing.assert_array_equal(res.iterations, [20, 20, 20])


def _per_class_rows(res, c):
  """Client ``c``'s real support as ``{label: rows sorted}`` (order-free)."""
  mask = np.asarray(res.mask[c])
  x = np.asarray(res.x[c])[mask].reshape(mask.sum(), -1)
  labels = np.asarray(res.labels[c])[mask]
  return {int(k): x[labels == k][np.lexsort(x[labels == k].T)]
          for k in np.unique(labels)}


def test_room_for_every_class_holds_the_same_real_support():
  # S = 3 classes x 2 (one masked block per client) against the compact S = 4.
  wide, _ = _distill(class_blocks=3)
  compact, _ = _distill()
  assert wide.x.shape[1] == 6 and compact.x.shape[1] == 4
  np.testing.assert_array_equal(wide.counts, compact.counts)
  for c in range(3):
    a, b = _per_class_rows(wide, c), _per_class_rows(compact, c)
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-2)
  with pytest.raises(ValueError, match="leaves out classes"):
    _distill(class_blocks=1)


def test_loss_decreases_and_images_move():
  res0, _ = _distill(max_iterations=1, segment_iterations=1)
  res, _ = _distill(max_iterations=60, segment_iterations=30, lr=0.01)
  assert float(jnp.mean(res.loss)) < float(jnp.mean(res0.loss))
  assert float(jnp.abs(res.x - res0.x).max()) > 1.0


def test_per_client_early_stop_freezes_converged_clients():
  res, _ = _distill(stop_accuracy=0.999, max_iterations=50, min_iterations=3)
  its = np.asarray(res.iterations)
  conv = np.asarray(res.converged)
  assert (its[conv] >= 3).all() and (its[conv] <= 50).all()
  assert (its[~conv] == 50).all()
  # A converged client's support equals what it would be after its own stop.
  c = int(np.argmax(conv)) if conv.any() else None
  if c is not None:
    again, _ = _distill(stop_accuracy=0.999, max_iterations=int(its[c]),
                        min_iterations=3)
    np.testing.assert_allclose(again.x[c], res.x[c], rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("backend", ["chunked", "loop"])
def test_backends_agree(backend):
  ref, _ = _distill("vmap")
  out, _ = _distill(backend, max_iterations=20)
  np.testing.assert_allclose(out.x, ref.x, rtol=1e-4, atol=1e-2)


def test_padding_does_not_change_results():
  x, y, n = _clients()
  args = _args(num_classes=3, kernel_fn=fc_kernel(depth=2), mean=MEAN,
               std=STD, support_size=5, max_iterations=10,
               segment_iterations=10, stop_accuracy=2.0)
  a = kip.distill_clients(jax.random.PRNGKey(1), x, y, n, **args)
  xp = np.concatenate([x, np.full((3, 15, 6, 6, 1), 255, np.uint8)], axis=1)
  yp = np.concatenate([y, np.full((3, 15), 2, np.int32)], axis=1)
  # The support init draws a uniform per row, so padding changes the draw;
  # compare against a reference with the same padded N_max but clean padding.
  xq = np.concatenate([x, np.zeros((3, 15, 6, 6, 1), np.uint8)], axis=1)
  yq = np.concatenate([y, np.zeros((3, 15), np.int32)], axis=1)
  b = kip.distill_clients(jax.random.PRNGKey(1), xp, yp, n, **args)
  c = kip.distill_clients(jax.random.PRNGKey(1), xq, yq, n, **args)
  np.testing.assert_array_equal(b.x, c.x)
  np.testing.assert_array_equal(a.counts, [5, 5, 5])
  del a


def test_support_size_is_capped_with_warning(caplog):
  x, y, n = _clients()
  res = kip.distill_clients(jax.random.PRNGKey(0), x, y, n, num_classes=3,
                            kernel_fn=fc_kernel(depth=2), mean=MEAN, std=STD,
                            support_size=10,
                            options=kip.KipOptions(max_iterations=2,
                                                   segment_iterations=2,
                                                   stop_accuracy=2.0))
  np.testing.assert_array_equal(res.counts, [10, 10, 7])
  assert "fewer than 10" in caplog.text


def test_quantize_roundtrip_and_flatten():
  v = jnp.array([-3.0, 0.4, 0.6, 254.6, 300.0])
  np.testing.assert_array_equal(kip.quantize(v), [0, 0, 1, 255, 255])
  np.testing.assert_array_equal(kip.dequantize(kip.quantize(v)), [0, 0, 1, 255, 255])
  res, _ = _distill(max_iterations=2, segment_iterations=2)
  xs, ys, owner = kip.flatten_support(res)
  assert xs.dtype == np.uint8 and xs.shape == (12, 6, 6, 1)
  assert ys.shape == (12, 3)
  np.testing.assert_array_equal(np.bincount(owner), [4, 4, 4])


def test_privacy_guard():
  y = np.array([[0, 0, 1, 1, 1], [2, 2, 2, 0, 1]])
  n = np.array([5, 3])
  kip.check_privacy(y, n, 3)  # client 1's lone class-0 sample is padding
  with pytest.raises(ValueError, match="client 1 class 0 holds 1 example <= "
                     "images_per_class=1"):
    kip.check_privacy(y, np.array([5, 4]), 3)
  kip.check_privacy(y, np.array([5, 4]), 3, allow_raw_upload=True)
  # Labels outside [0, K) on real rows are refused (fedjax_dd.data.class_counts).
  with pytest.raises(ValueError, match="labels must lie"):
    kip.check_privacy(y, n, 2)


def test_options_validate_and_host_loop_settings_share_programs():
  with pytest.raises(ValueError, match="target_batch_size"):
    kip.KipOptions(target_batch_size=0)
  with pytest.raises(ValueError, match="segment_iterations"):
    kip.KipOptions(segment_iterations=0)
  a = kip.KipOptions(max_iterations=5, segment_iterations=2, lr=0.1)
  b = kip.KipOptions(max_iterations=50, lr=0.1)
  assert a.program() == b.program() != kip.KipOptions().program()


def test_invalid_arguments():
  with pytest.raises(ValueError, match="exactly one"):
    kip.make_distiller(fc_kernel(), num_classes=2, mean=MEAN, std=STD)
  with pytest.raises(ValueError, match="exactly one"):
    kip.make_distiller(fc_kernel(), num_classes=2, mean=MEAN, std=STD,
                       images_per_class=1, support_size=3)


def _one_class_clients(n=12):
  """Two clients that each hold a single class (HFLDD's C = 1 members)."""
  rng = np.random.default_rng(3)
  x = rng.integers(0, 60, (2, n, 6, 6, 1)).astype(np.uint8)
  y = np.zeros((2, n), np.int32)
  y[1] = 2
  x[0, :, 0] += 150
  x[1, :, 4] += 150
  return x, y, np.full(2, n, np.int32)


def _distill_one_class(seed, support_size, max_iterations):
  x, y, n = _one_class_clients()
  res = kip.distill_clients(
      jax.random.PRNGKey(seed), x, y, n, num_classes=3,
      kernel_fn=fc_kernel(depth=2), mean=MEAN, std=STD,
      support_size=support_size,
      options=kip.KipOptions(max_iterations=max_iterations,
                             segment_iterations=10, stop_accuracy=0.999,
                             lr=0.05),
      mapper=ClientMapper(backend="vmap"))
  return res, (x, y, n)


def test_single_class_target_batches_never_stop_early():
  res, _ = _distill_one_class(0, support_size=3, max_iterations=30)
  # Every target batch is single-class, so accuracy 1.0 at iteration 1 must
  # not count as convergence: both clients run the whole budget.
  np.testing.assert_array_equal(np.asarray(res.iterations), [30, 30])
  assert not np.asarray(res.converged).any()
  first, last = np.asarray(res.first_loss), np.asarray(res.loss)
  assert np.all(np.isfinite(first)) and np.all(np.isfinite(last))
  assert np.all(last < first)


def test_stop_accuracy_none_runs_the_fixed_budget():
  res, _ = _distill(stop_accuracy=None, max_iterations=15)
  np.testing.assert_array_equal(np.asarray(res.iterations), [15, 15, 15])


def test_single_class_member_uploads_no_raw_image():
  from fedjax_dd.distill import privacy
  res, (x, _, n) = _distill_one_class(1, support_size=4, max_iterations=40)
  ux, _, owner = kip.flatten_support(res, quantized=True)
  p = privacy.upload_privacy(ux, owner, x, n)
  assert p["uploaded_images"] == 8
  assert p["identical_to_raw_count"] == 0
  assert p["nearest_raw_l2_min"] > 0.0
  # The initial support (iteration 0) is raw: the control the figure reads.
  raw_init = privacy.upload_privacy(x[:, :4].reshape(8, 6, 6, 1),
                                    np.repeat([0, 1], 4), x, n)
  assert raw_init["identical_to_raw_fraction"] == 1.0


# --- The privacy guard covers every support that holds a whole class. ---


def test_privacy_guard_refuses_a_support_that_holds_a_whole_class():
  x, y, n = _clients()           # client 2 holds 7 examples of 2 classes
  counts = kip._stack_class_counts(y, n, 3)
  smallest = int(counts[counts > 0].min())
  kip.check_privacy(y, n, 3, images_per_class=smallest - 1)
  with pytest.raises(ValueError) as e:
    kip.check_privacy(y, n, 3, images_per_class=smallest)
  c, k = np.argwhere(counts == smallest)[0]
  assert str(e.value).startswith(
      f"client {c} class {k} holds {smallest} examples <= "
      f"images_per_class={smallest}: its KIP support would be those raw "
      "images")
  assert "allow_raw_upload=True" in str(e.value)
  kip.check_privacy(y, n, 3, images_per_class=50, allow_raw_upload=True)


def test_distill_clients_refuses_raw_supports_before_compute():
  x, y, n = _clients()
  calls = []
  kernel = lambda a, b: calls.append(1) or fc_kernel(depth=2)(a, b)
  with pytest.raises(ValueError, match=r"images_per_class=7: its KIP support"):
    kip.distill_clients(jax.random.PRNGKey(0), x, y, n, num_classes=3,
                        kernel_fn=kernel, mean=MEAN, std=STD,
                        images_per_class=7, allow_raw_upload=False)
  assert not calls                       # refused before anything ran


def test_with_the_guard_on_no_uploaded_image_is_raw():
  from fedjax_dd.distill import privacy
  x, y, n = _clients()
  counts = kip._stack_class_counts(y, n, 3)
  ipc = int(counts[counts > 0].min()) - 1          # the largest the guard allows
  res = kip.distill_clients(
      jax.random.PRNGKey(0), x, y, n, num_classes=3,
      kernel_fn=fc_kernel(depth=2), mean=MEAN, std=STD, images_per_class=ipc,
      allow_raw_upload=False,
      options=kip.KipOptions(max_iterations=20, segment_iterations=10,
                             stop_accuracy=None, lr=0.05),
      mapper=ClientMapper(backend="vmap"))
  ux, _, owner = kip.flatten_support(res, quantized=True)
  p = privacy.upload_privacy(ux, owner, x, n)
  assert p["uploaded_images"] == int(np.minimum(counts, ipc).sum())
  assert p["identical_to_raw_count"] == 0, p


def test_raw_support_allowed_runs_when_images_per_class_exceeds_the_data():
  # images_per_class > N_max used to crash inside JAX ("mul got incompatible
  # shapes"); with the escape hatch it runs, every image in the support.
  x, y, n = _clients()
  res = kip.distill_clients(
      jax.random.PRNGKey(0), x, y, n, num_classes=3,
      kernel_fn=fc_kernel(depth=2), mean=MEAN, std=STD, images_per_class=25,
      allow_raw_upload=True,
      options=kip.KipOptions(max_iterations=2, segment_iterations=2),
      mapper=ClientMapper(backend="vmap"))
  np.testing.assert_array_equal(res.counts, n)
  assert res.x.shape == (3, 50, 6, 6, 1)


# --- Every bad input is refused before compute, naming the argument. ---


def _call(x=None, y=None, n=None, **kw):
  cx, cy, cn = _clients()
  args = dict(num_classes=3, kernel_fn=fc_kernel(depth=2), mean=MEAN,
              std=STD, images_per_class=2,
              options=kip.KipOptions(max_iterations=1))
  args.update(kw)
  return kip.distill_clients(jax.random.PRNGKey(0),
                             cx if x is None else x, cy if y is None else y,
                             cn if n is None else n, **args)


@pytest.mark.parametrize("index, value, count", [
    ((1, 3), 3, 1),               # at num_classes
    ((0, slice(0, 2)), -1, 2)])   # negative
def test_refuses_labels_outside_the_classes(index, value, count):
  _, y, _ = _clients()
  y = y.copy()
  y[index] = value
  with pytest.raises(ValueError, match=rf"^y must hold class indices in "
                     rf"\[0, 3\), got {count} outside it \({value}\)\.$"):
    _call(y=y)


def test_refuses_float_images_in_unit_range():
  x, _, _ = _clients()
  with pytest.raises(ValueError, match=r"^x must be \[C, N_max, H, W, Ch\] "
                     r"uint8 pixels in 0\.\.255, got dtype float32 with values "
                     r"in \[0, 0\.\d+\]; images in \[0, 1\] must be scaled"):
    _call(x=(x / 255.0).astype(np.float32))


def test_refuses_unstacked_images():
  x, _, _ = _clients()
  with pytest.raises(ValueError, match=r"^x must be \[C, N_max, H, W, Ch\] "
                     r"uint8 images, got shape \(20, 6, 6, 1\) \(one client"):
    _call(x=x[0])


def test_refuses_three_channel_stats_on_one_channel_images():
  with pytest.raises(ValueError, match=r"^mean must be \[Ch\] = \[1\] "
                     r"per-channel values .* got shape \(3,\)\.$"):
    _call(mean=np.full(3, 0.3), std=np.full(3, 0.3))


def test_refuses_zero_std():
  with pytest.raises(ValueError, match=r"^std must be > 0 in every channel"):
    _call(std=np.zeros(1))


def test_refuses_nan_learning_rate():
  with pytest.raises(ValueError, match=r"^KipOptions\.lr must be a finite "
                     r"number > 0, got nan\.$"):
    kip.KipOptions(lr=float("nan"))


def test_refuses_labels_shorter_than_images():
  _, y, _ = _clients()
  with pytest.raises(ValueError, match=r"^y must be \[C, N_max\] = \[3, 20\] "
                     r"\(the first two axes of x\), got shape \(3, 15\)\.$"):
    _call(y=y[:, :15])


def test_refuses_labels_with_a_trailing_axis():
  _, y, _ = _clients()
  with pytest.raises(ValueError, match=r"^y must be \[C, N_max\] = \[3, 20\] "
                     r"integer class indices, got shape \(3, 20, 1\) dtype "
                     r"int32; drop the last axis"):
    _call(y=y[..., None])


def test_refuses_one_hot_labels():
  _, y, _ = _clients()
  with pytest.raises(ValueError, match=r"got shape \(3, 20, 3\) dtype float32; "
                     r"one-hot or soft labels\? pass class indices"):
    _call(y=np.eye(3, dtype=np.float32)[y])


def test_refuses_zero_classes():
  with pytest.raises(ValueError, match=r"^num_classes must be an int >= 1, "
                     r"got 0\.$"):
    _call(num_classes=0)


@pytest.mark.parametrize("ipc", [0, -1])
def test_refuses_images_per_class_below_one(ipc):
  with pytest.raises(ValueError, match=rf"^images_per_class must be an int "
                     rf">= 1, got {ipc}\.$"):
    _call(images_per_class=ipc)


def test_refuses_counts_above_the_padding():
  with pytest.raises(ValueError, match=r"^num_examples must lie in \[0, "
                     r"N_max = 20\], got 1 outside it \(21\)\.$"):
    _call(n=np.array([12, 21, 7], np.int32))


def test_constant_images_are_named_as_the_cause_of_a_nan_loss():
  # A cosine kernel divides by the norms: constant images normalised to
  # zero (mean = their pixel value) make it 0/0.
  x, y, n = _clients()
  x = np.zeros_like(x)

  def cosine(a, b):
    a, b = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
    return (a @ b.T) / (jnp.linalg.norm(a, axis=1)[:, None]
                        * jnp.linalg.norm(b, axis=1)[None, :])

  with pytest.raises(ValueError, match=r"^KIP gave a non-finite loss or "
                     r"support for 3 clients \(clients \[0, 1, 2\]\): client "
                     r"0's images are constant \(every pixel 0\): the kernel "
                     r"matrix has zero variance and is singular\.$"):
    _call(x=x, kernel_fn=cosine, mean=np.array([0.0]))


# --- Label learning (issue: learned labels must match KIP's reference) ----


def _linear_kernel(a, b):
  """``k(a, b) = <a, b>`` on flattened inputs: hand-checkable Gram matrices."""
  return a.reshape(a.shape[0], -1) @ b.reshape(b.shape[0], -1).T


def test_label_gradient_has_the_reference_form():
  # KIP Eq. (2) with dL/dy_s = A^{-1} K_st (pred - y_t) / m, A = K_ss + reg
  # tr(K_ss)/n I. Support e1, e2 (K_ss = I, reg 0: A = I), targets (1, 1)
  # and (2, 0): K_ts = [[1, 1], [2, 0]]. Centred labels, K = 2:
  # y_s = [[.5, -.5], [-.5, .5]], pred = K_ts y_s = [[0, 0], [1, -1]],
  # y_t (classes 0, 1) = y_s, residual = [[-.5, .5], [1.5, -1.5]],
  # K_st r / m = [[1, 2], [1, 0]] r / 2 = [[1.25, -1.25], [-.25, .25]].
  from fedjax_dd.kernels.kip_loss import kip_loss, one_hot_labels
  xs = jnp.array([[1.0, 0.0], [0.0, 1.0]])
  xt = jnp.array([[1.0, 1.0], [2.0, 0.0]])
  ys = one_hot_labels(jnp.array([0, 1]), 2, centered=True)
  yt = one_hot_labels(jnp.array([0, 1]), 2, centered=True)
  grad = jax.grad(lambda y: kip_loss(_linear_kernel, xs, y, xt, yt, 0.0)[0])(ys)
  np.testing.assert_allclose(grad, [[1.25, -1.25], [-0.25, 0.25]], atol=1e-6)
  # The reference's loss, 0.5 * mean over targets AND classes, has the same
  # gradient divided by K: Adam's steps agree (up to its epsilon).
  def reference_loss(y):
    pred = _linear_kernel(xt, xs) @ jnp.linalg.solve(_linear_kernel(xs, xs), y)
    return 0.5 * jnp.mean((pred - yt) ** 2)
  np.testing.assert_allclose(jax.grad(reference_loss)(ys) * 2, grad, atol=1e-6)
  # The ridge is relative to the mean diagonal: reg = 1 on K_ss = I gives
  # A = 2 I, so alpha, pred and the gradient's A^{-1} all halve.
  g_reg = jax.grad(lambda y: kip_loss(_linear_kernel, xs, y, xt, yt, 1.0)[0])(ys)
  r = _linear_kernel(xt, xs) @ ys / 2 - yt
  np.testing.assert_allclose(g_reg, _linear_kernel(xs, xt) @ r / 2 / 2,
                             atol=1e-6)


def test_learned_labels_take_one_adam_step_of_lr_against_the_gradient():
  # The labels share the images' Adam and learning rate (the reference's
  # single optimiser over {x, y}): Adam's first step is lr * sign(grad).
  x, y, n = _clients()
  lr = 0.05
  common = dict(num_classes=3, kernel_fn=fc_kernel(depth=2), mean=MEAN,
                std=STD, images_per_class=2, max_iterations=1,
                segment_iterations=1, stop_accuracy=None, lr=lr,
                centered_labels=True, target_batch_size=8)
  fixed = kip.distill_clients(jax.random.PRNGKey(0), x, y, n,
                              **_args(**common))
  learned = kip.distill_clients(jax.random.PRNGKey(0), x, y, n,
                                **_args(**common, learn_labels=True))
  y0 = np.asarray(fixed.y)  # unchanged: centred one-hot
  mask = np.asarray(fixed.mask)
  np.testing.assert_allclose(y0[mask].sum(-1), 0.0, atol=1e-6)
  step = np.abs(np.asarray(learned.y) - y0)[mask]
  assert step.max() <= lr * (1 + 1e-3)
  assert np.median(step) > 0.5 * lr


def test_balanced_batch_draws_each_held_class_equally():
  # A client holding classes 1 and 3 (of 5), 9 of one and 2 of the other,
  # with padding rows labelled 0 that must never be drawn.
  y = jnp.array([1] * 9 + [3] * 2 + [0] * 5, jnp.int32)
  x = jnp.arange(16, dtype=jnp.float32).reshape(16, 1, 1, 1)
  xb, yb = jax.jit(kip.balanced_batch, static_argnums=(4, 5))(
      jax.random.PRNGKey(0), x, y, jnp.int32(11), 8, 5)
  np.testing.assert_array_equal(np.bincount(np.asarray(yb), minlength=5),
                                [0, 4, 0, 4, 0])
  rows = np.asarray(xb).reshape(-1).astype(int)
  assert rows.max() < 11  # no padding row
  np.testing.assert_array_equal(np.asarray(y)[rows], np.asarray(yb))
  # An odd batch: the first held class gets the extra slot.
  _, yb = kip.balanced_batch(jax.random.PRNGKey(1), x, y, jnp.int32(11), 5, 5)
  np.testing.assert_array_equal(np.bincount(np.asarray(yb), minlength=5),
                                [0, 3, 0, 2, 0])


def test_clip_pixels_keeps_the_optimised_support_in_the_pixel_range():
  # A large rate drives unconstrained pixels out of [0, 255]; with
  # clip_pixels the support stays inside, so quantising changes it by at
  # most half a grey level (what was optimised is what is sent).
  free, _ = _distill(lr=0.5, max_iterations=20, learn_labels=True)
  boxed, _ = _distill(lr=0.5, max_iterations=20, learn_labels=True,
                      clip_pixels=True)
  xf, xb = np.asarray(free.x), np.asarray(boxed.x)
  assert xf.min() < -1.0 or xf.max() > 256.0
  assert xb.min() >= -1e-3 and xb.max() <= 255.0 + 1e-3
  q = np.asarray(kip.dequantize(kip.quantize(boxed.x)))
  assert np.abs(q - xb).max() <= 0.5 + 1e-3


def test_balanced_targets_run_the_fixed_budget():
  res, _ = _distill(balanced_targets=True, centered_labels=True,
                    learn_labels=True, max_iterations=10)
  assert np.isfinite(np.asarray(res.loss)).all()
  np.testing.assert_array_equal(res.iterations, [10, 10, 10])
