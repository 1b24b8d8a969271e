"""KIP's per-client standardisation (FedD3's code): hand-checked statistics,
and the run equals plain KIP under each client's own statistics."""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.core.clients import ClientMapper
from fedjax_dd.distill import kip
from fedjax_dd.kernels.native import fc_kernel


def test_client_stats_hand_checked_padding_ignored():
  # Two real 1x2 images, one of them padding-free: pixels 0, 255 | 51, 51
  # -> [0, 1, 0.2, 0.2]: mean 0.35, var (0.35² + 0.65² + 2 · 0.15²) / 4.
  x = np.zeros((3, 1, 2, 1), np.uint8)
  x[0, 0, :, 0] = [0, 255]
  x[1, 0, :, 0] = [51, 51]
  x[2] = 200  # padding
  mean, std = kip.client_stats(jnp.asarray(x), jnp.asarray(2))
  np.testing.assert_allclose(mean, [0.35], rtol=1e-6)
  var = (0.35**2 + 0.65**2 + 2 * 0.15**2) / 4
  np.testing.assert_allclose(std, [np.sqrt(var)], rtol=1e-5)
  # A constant channel (and a client with no images) is only centred.
  _, flat = kip.client_stats(jnp.full((2, 1, 2, 1), 7, jnp.uint8),
                             jnp.asarray(2))
  np.testing.assert_array_equal(flat, [1.0])
  m0, s0 = kip.client_stats(jnp.asarray(x), jnp.asarray(0))
  assert np.all(np.isfinite(m0)) and np.all(s0 == 1.0)


def _client(seed, offset):
  rng = np.random.default_rng(seed)
  y = np.array([0, 1] * 6, np.int32)
  img = rng.integers(0, 60, (12, 4, 4, 1)) + offset
  img[np.arange(12), y + 1] += 120
  return img.astype(np.uint8), y


def test_each_client_runs_as_plain_kip_under_its_own_statistics():
  """With ``client_normalization`` a client's support is what plain KIP
  gives with that client's channel statistics as ``mean``/``std``, read
  back through the caller's statistics (FedD3's code: the support leaves in
  the client's standardised space)."""
  xs, ys = zip(*[_client(0, 0), _client(1, 60)])
  x, y = np.stack(xs), np.stack(ys)
  n = np.array([12, 12], np.int32)
  mean, std = np.array([0.3], np.float32), np.array([0.25], np.float32)
  common = dict(num_classes=2, kernel_fn=fc_kernel(depth=2),
                images_per_class=1, mapper=ClientMapper("vmap"))
  opts = dict(max_iterations=6, segment_iterations=6, stop_accuracy=None,
              balanced_targets=True, centered_labels=True)
  key = jax.random.PRNGKey(0)
  ours = kip.distill_clients(
      key, x, y, n, mean=mean, std=std,
      options=kip.KipOptions(client_normalization=True, **opts), **common)
  assert not kip.KipOptions().client_normalization  # off by default
  # Client c draws from fold_in(key, c) either way: distil both clients
  # under client c's statistics and read row c.
  for c in range(2):
    m, s = (np.asarray(v) for v in kip.client_stats(jnp.asarray(x[c]),
                                                    jnp.asarray(12)))
    plain = kip.distill_clients(key, x, y, n, mean=m, std=s,
                                options=kip.KipOptions(**opts), **common)
    z_ours = (np.asarray(ours.x[c]) / 255.0 - mean) / std
    z_plain = (np.asarray(plain.x[c]) / 255.0 - m) / s
    np.testing.assert_allclose(z_ours, z_plain, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ours.loss[c], plain.loss[c], rtol=1e-4)
  # The two clients' statistics differ, so a global standardisation would
  # not have given these supports.
  s0 = kip.client_stats(jnp.asarray(x[0]), jnp.asarray(12))
  s1 = kip.client_stats(jnp.asarray(x[1]), jnp.asarray(12))
  assert abs(float(s0[0][0]) - float(s1[0][0])) > 0.1
