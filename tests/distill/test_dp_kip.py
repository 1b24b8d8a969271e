"""DP-KIP (Vinaroz & Park, TMLR 2023): per-example clipping, noise, the
data-independent support, and what it equals without privacy."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.core import checks
from fedjax_dd.distill import kip
from fedjax_dd.kernels.kip_loss import kip_loss, one_hot_labels
from fedjax_dd.kernels.native import fc_kernel
from fedjax_dd.privacy import accounting
from tests.distill.test_kip import MEAN, STD, _clients

KERNEL = fc_kernel(depth=2)


def _options(**kw):
  kw = {"max_iterations": 5, "segment_iterations": 5, "stop_accuracy": None,
        "lr": 0.01, "dp_clip": 1.0, "dp_noise_multiplier": 1.0, **kw}
  return kip.KipOptions(**kw)


def _distill(options, x=None, key=jax.random.PRNGKey(0), **kw):
  cx, y, n = _clients()
  return kip.distill_clients(
      key, cx if x is None else x, y, n, num_classes=3, kernel_fn=KERNEL,
      mean=MEAN, std=STD, options=options, **{"images_per_class": 2, **kw})


def test_dp_is_off_by_default_and_zero_is_plain_kip():
  assert not kip.KipOptions().dp
  plain = dict(max_iterations=10, segment_iterations=5, stop_accuracy=None)
  a = _distill(kip.KipOptions(**plain))
  b = _distill(kip.KipOptions(**plain, dp_clip=0.0, dp_noise_multiplier=0.0))
  for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
  assert a.x.shape[1] == 4  # room for the 2 classes a client holds


def test_private_gradient_by_hand():
  # Norms 5, 0.5, 50 clipped to 1: [0.6, 0.8], [0, 0.5], [0.6, 0.8]; their
  # sum over B = 3.
  g = jnp.asarray([[3.0, 4.0], [0.0, 0.5], [30.0, 40.0]])
  key = jax.random.PRNGKey(0)
  out = kip.private_gradient(g, jnp.asarray([True, True, True]), key,
                             clip=1.0, noise_multiplier=0.0, batch_size=3)
  np.testing.assert_allclose(out, [0.4, 0.7], rtol=1e-6)
  # A slot that is no example counts for nothing; B stays the divisor.
  out = kip.private_gradient(g, jnp.asarray([True, True, False]), key,
                             clip=1.0, noise_multiplier=0.0, batch_size=3)
  np.testing.assert_allclose(out, [0.2, 1.3 / 3], rtol=1e-6)


def test_each_example_moves_the_gradient_by_at_most_clip_over_b():
  rng = np.random.default_rng(0)
  grads = (jnp.asarray(rng.normal(size=(6, 4, 3)) * 100.0),
           jnp.asarray(rng.normal(size=(6, 5)) * 100.0))
  take = jnp.ones((6,), bool)
  key = jax.random.PRNGKey(0)
  full = kip.private_gradient(grads, take, key, clip=0.5,
                              noise_multiplier=0.0, batch_size=6)
  for i in range(6):
    without = kip.private_gradient(grads, take.at[i].set(False), key,
                                   clip=0.5, noise_multiplier=0.0,
                                   batch_size=6)
    moved = np.sqrt(sum(float(jnp.sum((a - b) ** 2))
                        for a, b in zip(full, without)))
    # Each example's clipped gradient has norm exactly C here (all exceed
    # it): removing it moves the sum over B by C / B.
    np.testing.assert_allclose(moved, 0.5 / 6, rtol=1e-5)


def test_noise_std_is_sigma_clip_over_b():
  zeros = jnp.zeros((4, 100_000))
  out = np.asarray(kip.private_gradient(
      zeros, jnp.ones((4,), bool), jax.random.PRNGKey(3), clip=0.5,
      noise_multiplier=2.0, batch_size=4), np.float64)
  assert abs(out.std() - 0.25) < 0.003 and abs(out.mean()) < 0.003


def test_per_example_gradients_average_to_the_batch_gradient():
  rng = np.random.default_rng(1)
  z = jnp.asarray(rng.normal(size=(4, 6, 6, 1)), jnp.float32)
  ys = one_hot_labels(jnp.asarray([0, 1, 2, 0]), 3)
  mask = jnp.ones((4,), bool)
  xt = jnp.asarray(rng.normal(size=(8, 6, 6, 1)), jnp.float32)
  yt = one_hot_labels(jnp.asarray(rng.integers(0, 3, 8)), 3)
  losses, _, (gz, gy) = kip.example_gradients(KERNEL, z, ys, mask, xt, yt,
                                              1e-6)
  (loss, _), (bz, by) = jax.value_and_grad(
      lambda p: kip_loss(KERNEL, p[0], p[1], xt, yt, 1e-6,
                         support_mask=mask), has_aux=True)((z, ys))
  np.testing.assert_allclose(losses.mean(), loss, rtol=1e-5)
  np.testing.assert_allclose(gz.mean(0), bz, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(gy.mean(0), by, rtol=1e-4, atol=1e-7)
  # At a very large epsilon (a clip above every example's norm, noise
  # 1e-9 of it) the private gradient is the batch gradient.
  norms = np.sqrt(np.sum(np.square(np.asarray(gz)).reshape(8, -1), 1))
  out = kip.private_gradient(gz, jnp.ones((8,), bool), jax.random.PRNGKey(0),
                             clip=10.0 * norms.max(), noise_multiplier=1e-9,
                             batch_size=8)
  np.testing.assert_allclose(out, bz, rtol=1e-4, atol=1e-6)


def _reference_kip(options, key, x, y, n, client):
  """Non-private KIP from DP-KIP's start: Adam on the batch gradient of
  kip_loss over the same target batches (the module's key derivations)."""
  ckey = jax.random.fold_in(key, client)
  z, labels, mask = kip._dp_init_support(
      jax.random.fold_in(ckey, 2**31 - 1), x.shape[2:], num_classes=3,
      images_per_class=2, support_size=None, class_blocks=3)
  ys = one_hot_labels(labels, 3)
  opt = optax.adam(options.lr)
  state = opt.init((z, ys))
  norm = lambda v: (v.astype(jnp.float32) / 255.0 - MEAN) / STD
  for t in range(options.max_iterations):
    xb, yb, take = kip.dp_target_batch(jax.random.fold_in(ckey, t),
                                       jnp.asarray(x[client]),
                                       jnp.asarray(y[client]), n[client],
                                       options.target_batch_size)
    assert bool(take.all())
    grad = jax.grad(lambda zz: kip_loss(
        KERNEL, zz, ys, norm(xb), one_hot_labels(yb, 3), options.reg,
        support_mask=mask)[0])(z)
    updates, state = opt.update((grad, jnp.zeros_like(ys)), state)
    z = optax.apply_updates(z, updates[0])
  return z


def test_at_a_very_large_epsilon_dp_kip_is_kip_from_its_start():
  # Clip 1e3 (above every per-example norm here) and noise 1e-12 of it:
  # each step's gradient is the batch's, and 5 Adam steps end where plain
  # KIP from DP-KIP's start and target batches ends, to 1e-4 in normalised
  # pixels.
  options = _options(dp_clip=1e3, dp_noise_multiplier=1e-12,
                     target_batch_size=5)  # at most the smallest client's 7
  x, y, n = _clients()
  key = jax.random.PRNGKey(4)
  res = _distill(options, key=key)
  z = (np.asarray(res.x) / 255.0 - MEAN) / STD
  for c in range(3):
    np.testing.assert_allclose(z[c], _reference_kip(options, key, x, y, n, c),
                               rtol=1e-4, atol=1e-4)


def test_the_support_starts_from_noise_with_every_class():
  options = _options(max_iterations=0)
  x, _, _ = _clients()
  a = _distill(options)
  b = _distill(options, x=(255 - x).astype(np.uint8))  # other images
  np.testing.assert_array_equal(np.asarray(a.x), np.asarray(b.x))
  np.testing.assert_array_equal(np.asarray(a.labels),
                                [[0, 0, 1, 1, 2, 2]] * 3)
  assert bool(np.asarray(a.mask).all())
  s = _distill(options, images_per_class=None, support_size=5)
  np.testing.assert_array_equal(np.asarray(s.labels), [[0, 1, 2, 0, 1]] * 3)


def test_a_dp_run_moves_the_support_and_stays_finite():
  res = _distill(_options(max_iterations=10))
  start = _distill(_options(max_iterations=0))
  np.testing.assert_array_equal(res.iterations, [10, 10, 10])
  assert np.isfinite(np.asarray(res.x)).all()
  assert float(np.abs(np.asarray(res.x) - np.asarray(start.x)).max()) > 1.0
  assert not np.asarray(res.converged).any()


def test_dp_fields_are_the_accountants_epsilon_at_the_worst_client():
  _, _, n = _clients()  # 12, 20, 7 examples; B = 5: q = 5 / 7
  assert kip.dp_sampling_rate(n, 5) == pytest.approx(5 / 7)
  assert kip.dp_sampling_rate([0, 12], 20) == 1.0
  assert kip.dp_sampling_rate([0, 0], 5) == 0.0
  options = _options(target_batch_size=5, dp_noise_multiplier=2.0)
  fields = kip.dp_fields(options, n, steps=40, delta=1e-5)
  assert fields["dp_epsilon"] == accounting.epsilon(2.0, 5 / 7, 40, 1e-5)
  assert (fields["dp_clip"], fields["dp_noise_multiplier"],
          fields["dp_steps"], fields["dp_delta"]) == (1.0, 2.0, 40, 1e-5)


@pytest.mark.parametrize("kwargs, message", [
    ({"dp_clip": -1.0},
     "KipOptions.dp_clip must be a finite number >= 0, got -1.0."),
    ({"dp_clip": 0.0, "dp_noise_multiplier": 1.0},
     "KipOptions.dp_clip must be > 0 when dp_noise_multiplier > 0 (the "
     "noise is sigma * dp_clip), got 0.0."),
    ({"dp_noise_multiplier": float("nan")},
     "KipOptions.dp_noise_multiplier must be a finite number >= 0, got "
     "nan."),
    ({"stop_accuracy": 0.999},
     "KipOptions.stop_accuracy must be None or above 1 (no early stop) with "
     "DP-KIP (dp_clip > 0): a stop on a target batch's accuracy is not "
     "private, got 0.999."),
    ({"balanced_targets": True},
     "KipOptions.balanced_targets must be False with DP-KIP (dp_clip > 0): "
     "the uniform draw without replacement is the one the accountant's "
     "sampling rate describes, got True."),
])
def test_options_refuse_what_the_guarantee_does_not_cover(kwargs, message):
  with pytest.raises(checks.SettingError) as e:
    _options(**kwargs)
  assert str(e.value) == message


@pytest.mark.skipif(not hasattr(kip.KipOptions(), "client_normalization"),
                    reason="KipOptions has no client_normalization")
def test_client_normalization_is_refused_with_dp():
  with pytest.raises(checks.SettingError, match=r"^KipOptions."
                     r"client_normalization must be False with DP-KIP"):
    _options(client_normalization=True)


def test_room_for_fewer_classes_than_k_is_refused():
  with pytest.raises(ValueError, match=r"class_blocks must be num_classes = "
                     r"3 with DP-KIP"):
    _distill(_options(), class_blocks=2)


def test_a_dp_kip_loss_may_rise_but_not_turn_non_finite():
  from fedjax_dd.core import loop  # pylint: disable=g-import-not-at-top
  loop.check_not_diverged([0.40, 0.41], [0.45, 0.46], what="fedd3: KIP",
                          advice="", allow_rise=True)
  with pytest.raises(loop.DivergedError, match="median loss rose"):
    loop.check_not_diverged([0.40, 0.41], [0.45, 0.46], what="fedd3: KIP",
                            advice="")
  with pytest.raises(loop.DivergedError, match="not finite"):
    loop.check_not_diverged([0.40, 0.41], [0.45, np.nan], what="fedd3: KIP",
                            advice="", allow_rise=True)
