"""Tests for fedjax_dd.kernels.krr."""

import jax
from tests.conftest import x64 as enable_x64
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dd.kernels import krr


def _problem(n=6, m=4, k=3, seed=0, dtype=np.float32):
  rng = np.random.default_rng(seed)
  a = rng.normal(size=(n, n))
  k_ss = a @ a.T + np.eye(n)
  k_ts = rng.normal(size=(m, n))
  y_s = rng.normal(size=(n, k))
  return k_ss.astype(dtype), k_ts.astype(dtype), y_s.astype(dtype)


def _numpy_krr(k_ss, k_ts, y_s, reg):
  k_ss, k_ts, y_s = (np.asarray(v, np.float64) for v in (k_ss, k_ts, y_s))
  n = k_ss.shape[0]
  ridge = reg * np.trace(k_ss) / n
  return k_ts @ np.linalg.solve(k_ss + ridge * np.eye(n), y_s)


def test_hand_checked_identity_kernel():
  # K_ss = 2 I, reg = 0.5: ridge = 0.5 * tr/n = 1, so pred = K_ts y_s / 3.
  k_ss = 2 * jnp.eye(2)
  k_ts = jnp.array([[3.0, 0.0], [0.0, 6.0], [3.0, 3.0]])
  y_s = jnp.array([[1.0, 0.0], [0.0, 1.0]])
  pred = krr.krr_predict(k_ss, k_ts, y_s, 0.5)
  np.testing.assert_allclose(pred, [[1, 0], [0, 2], [1, 1]], rtol=1e-6)


@pytest.mark.parametrize("reg", [0.0, 1e-3, 0.3])
def test_matches_numpy_solve(reg):
  k_ss, k_ts, y_s = _problem()
  pred, info = krr.krr_predict(k_ss, k_ts, y_s, reg, return_info=True)
  np.testing.assert_allclose(pred, _numpy_krr(k_ss, k_ts, y_s, reg),
                             rtol=2e-4, atol=2e-4)
  assert float(info.jitter) == 0.0
  assert bool(info.finite)
  np.testing.assert_allclose(info.ridge, reg * np.trace(k_ss) / 6, rtol=1e-5)


def test_one_dimensional_labels():
  k_ss, k_ts, y_s = _problem(k=1)
  pred = krr.krr_predict(k_ss, k_ts, y_s[:, 0], 1e-3)
  assert pred.shape == (4,)
  np.testing.assert_allclose(pred, _numpy_krr(k_ss, k_ts, y_s, 1e-3)[:, 0],
                             rtol=2e-4, atol=2e-4)


def test_float64_needs_x64():
  k_ss, k_ts, y_s = _problem()
  with pytest.raises(ValueError, match="jax_enable_x64"):
    krr.krr_predict(k_ss, k_ts, y_s, use_float64=True)
  with pytest.raises(ValueError, match="jax_enable_x64"):
    krr.krr_predict_checked(k_ss, k_ts, y_s, use_float64=True)


def test_float64_matches_numpy_tightly():
  k_ss, k_ts, y_s = _problem(dtype=np.float64)
  expected = _numpy_krr(k_ss, k_ts, y_s, 1e-6)
  with enable_x64():
    pred = krr.krr_predict(k_ss, k_ts, y_s, 1e-6, use_float64=True)
    assert pred.dtype == jnp.float64
    np.testing.assert_allclose(pred, expected, rtol=1e-10)
    # float32 inputs: solved in float64, returned as float32.
    pred32 = krr.krr_predict(k_ss.astype(np.float32),
                             k_ts.astype(np.float32),
                             y_s.astype(np.float32), 1e-6, use_float64=True)
    assert pred32.dtype == jnp.float32


def test_duplicate_points_reg_zero_uses_jitter_not_nan():
  # Two identical support points with labels 1 and 0: K_ss = [[1, 1], [1, 1]]
  # is singular, the plain Cholesky fails (zero pivot). With ridge eps,
  # (1, 1) is an eigenvector of K + eps I with eigenvalue 2 + eps, so
  # pred on a target with k_t = (1, 1) is (y1 + y2) / (2 + eps) ~= 0.5.
  k_ss = jnp.ones((2, 2))
  k_ts = jnp.ones((1, 2))
  y_s = jnp.array([[1.0], [0.0]])
  # Precondition: without the ladder this would be a NaN.
  assert not bool(jnp.all(jnp.isfinite(jnp.linalg.cholesky(k_ss))))
  pred, info = krr.krr_predict(k_ss, k_ts, y_s, 0.0, return_info=True)
  assert bool(info.finite)
  np.testing.assert_allclose(pred, [[0.5]], rtol=1e-4)
  assert float(info.jitter) > 0

  with pytest.warns(RuntimeWarning, match="jitter"):
    checked, _ = krr.krr_predict_checked(k_ss, k_ts, y_s, 0.0)
  np.testing.assert_allclose(checked, pred, rtol=1e-6)


def test_rank_deficient_gram_from_duplicate_inputs():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(3, 5)).astype(np.float32)
  x = np.concatenate([x, x])  # 6 points, rank 3
  k_ss = x @ x.T
  k_ts = rng.normal(size=(2, 5)).astype(np.float32) @ x.T
  y_s = np.eye(6, 2, dtype=np.float32)
  pred, info = krr.krr_predict(k_ss, k_ts, y_s, 0.0, return_info=True)
  assert bool(info.finite)
  assert bool(jnp.all(jnp.isfinite(pred)))


def test_gradient_through_singular_solve_is_finite():
  k_ss = jnp.ones((2, 2))
  k_ts = jnp.array([[1.0, 0.5]])
  y_s = jnp.array([[1.0], [0.0]])
  grads = jax.grad(
      lambda a, b, c: jnp.sum(krr.krr_predict(a, b, c, 0.0)),
      argnums=(0, 1, 2))(k_ss, k_ts, y_s)
  for g in grads:
    assert bool(jnp.all(jnp.isfinite(g)))
  assert float(jnp.max(jnp.abs(grads[2]))) > 0


def _direct_loss(x, t, y_s, reg, jitter):
  """A plain ``jnp.linalg.solve`` KRR loss, differentiated by JAX itself."""
  k_ss, k_ts = x @ x.T, t @ x.T
  n = k_ss.shape[0]
  ridge = (reg + jitter) * jnp.trace(k_ss) / n
  pred = k_ts @ jnp.linalg.solve(k_ss + ridge * jnp.eye(n), y_s)
  return jnp.sum(jnp.sin(pred))


def _krr_loss(x, t, y_s, reg):
  return jnp.sum(jnp.sin(krr.krr_predict(x @ x.T, t @ x.T, y_s, reg)))


@pytest.mark.parametrize("duplicate", [False, True])
def test_custom_gradient_matches_a_direct_solve(duplicate):
  # The solve's VJP reuses the forward factor; it must equal autodiff of a
  # direct solve, for the support points, labels and ridge, also when the
  # ladder added a jitter (duplicated points, reg = 0).
  with enable_x64():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 7))
    if duplicate:
      x = np.concatenate([x[:3], x[:2]])
    t = rng.normal(size=(4, 7))
    y_s = rng.normal(size=(5, 2))
    reg = 0.0 if duplicate else 1e-2
    _, info = krr.krr_predict(x @ x.T, t @ x.T, y_s, reg, return_info=True)
    assert (float(info.jitter) > 0) == duplicate
    got = jax.grad(_krr_loss, argnums=(0, 2, 3))(x, t, y_s, reg)
    want = jax.grad(_direct_loss, argnums=(0, 2, 3))(x, t, y_s, reg,
                                                      float(info.jitter))
    # K_ss + jitter is conditioned ~1e6 in the duplicate case.
    rtol = 1e-4 if duplicate else 1e-6
    for g, w in zip(got, want):
      np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-8)


def test_non_finite_input_is_flagged_and_checked_raises():
  k_ss, k_ts, y_s = _problem()
  k_ss[0, 0] = np.nan
  _, info = krr.krr_predict(k_ss, k_ts, y_s, return_info=True)
  assert not bool(info.finite)
  with pytest.raises(ValueError, match="non-finite.*NaN/inf"):
    krr.krr_predict_checked(k_ss, k_ts, y_s)


def test_exhausted_ladder_raises_clear_error():
  # Indefinite K_ss: no small jitter makes it positive definite.
  k_ss = jnp.array([[1.0, 0.0], [0.0, -1.0]])
  with pytest.raises(ValueError, match="singular even with the largest"):
    krr.krr_predict_checked(k_ss, jnp.ones((1, 2)), jnp.ones((2, 1)), 0.0)


def test_vmap_over_clients_mixed_conditioning():
  k_ss, k_ts, y_s = _problem(n=2, m=3, k=1)
  k_ss_c = jnp.stack([jnp.asarray(k_ss), jnp.ones((2, 2))])
  k_ts_c = jnp.stack([jnp.asarray(k_ts)] * 2)
  y_c = jnp.stack([jnp.asarray(y_s)] * 2)
  fn = jax.jit(jax.vmap(
      lambda a, b, c: krr.krr_predict(a, b, c, 0.0, return_info=True)))
  pred, info = fn(k_ss_c, k_ts_c, y_c)
  assert pred.shape == (2, 3, 1)
  assert float(info.jitter[0]) == 0 and float(info.jitter[1]) > 0
  assert bool(jnp.all(info.finite))
  for c in range(2):
    np.testing.assert_allclose(
        pred[c], krr.krr_predict(k_ss_c[c], k_ts_c[c], y_c[c], 0.0),
        rtol=1e-5)
  fn(k_ss_c + 1.0, k_ts_c, y_c)
  assert fn._cache_size() == 1


def test_invalid_arguments():
  k_ss, k_ts, y_s = _problem()
  with pytest.raises(ValueError, match="square"):
    krr.krr_predict(k_ss[:, :5], k_ts, y_s)
  with pytest.raises(ValueError, match="k_ts"):
    krr.krr_predict(k_ss, k_ts[:, :5], y_s)
  with pytest.raises(ValueError, match="y_s"):
    krr.krr_predict(k_ss, k_ts, y_s[:5])
  with pytest.raises(ValueError, match="reg"):
    krr.krr_predict(k_ss, k_ts, y_s, -1.0)
  with pytest.raises(ValueError, match="non-decreasing"):
    krr.krr_predict(k_ss, k_ts, y_s, jitter_ladder=(1e-3, 1e-6))
  with pytest.raises(ValueError, match="empty"):
    krr.krr_predict(jnp.zeros((0, 0)), jnp.zeros((1, 0)), jnp.zeros((0, 1)))


def test_checked_names_the_non_finite_input():
  k_ss = jnp.eye(3)
  k_ts = jnp.ones((2, 3))
  y_s = jnp.eye(3)
  with pytest.raises(ValueError, match=r"non-finite prediction: y_s contains "
                     r"NaN/inf \(the support labels\)\.$"):
    krr.krr_predict_checked(k_ss, k_ts, y_s.at[0, 0].set(jnp.nan))
  with pytest.raises(ValueError, match=r"non-finite prediction: k_ss and k_ts "
                     r"contain NaN/inf; k_ss and k_ts come from the kernel: its "
                     r"images are non-finite \(e\.g\. KIP run with lr or std "
                     r"NaN\) or degenerate"):
    krr.krr_predict_checked(k_ss * jnp.nan, k_ts * jnp.nan, y_s)


def test_checked_names_a_constant_kernel_matrix():
  with pytest.raises(ValueError, match=r"K_ss is constant \(2 everywhere\): the "
                     r"support points are identical \(e\.g\. constant images\), "
                     r"so the kernel matrix has zero variance and is singular"):
    krr.krr_predict_checked(jnp.full((3, 3), 2.0), jnp.ones((2, 3)), jnp.eye(3),
                        reg=0.0, jitter_ladder=(0.0,))
