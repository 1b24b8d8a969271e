"""Kernel ridge regression with a Cholesky solve and a NaN-safe jitter ladder.

The predictor is the one of KIP (Nguyen et al., ICLR 2021, Eq. 2) and FedD3
(Song et al., Eq. 4)::

    pred = K_ts (K_ss + reg * tr(K_ss) / n * I)^{-1} y_s

The ridge is relative to the mean diagonal ``tr(K_ss) / n`` so that ``reg``
is scale free. All functions here are pure, jit-able, ``jax.vmap``-able over
a leading client axis and reverse-mode differentiable with respect to
``k_ss``, ``k_ts`` and ``y_s``; they work on ONE client.

Ill-conditioning. With duplicate support points and ``reg=0`` (or a tiny
``reg`` in float32) ``K_ss`` is singular and Cholesky returns NaNs, so
:func:`krr_predict` walks a ladder of extra relative jitters
(``DEFAULT_JITTER_LADDER``) and uses the first finite solve; the
``lax.while_loop`` runs only when the first rung failed. The chosen jitter is
a constant, and the solve's custom VJP reuses the forward Cholesky factor
(``ȳ = A⁻¹ḡ``, ``Ā = −ȳ αᵀ``), so a KIP step factorises ``K_ss`` once. The
choice is reported in :class:`KRRInfo`. If every rung fails (e.g. ``K_ss``
holds NaN or inf) ``info.finite`` is False; :func:`krr_predict_checked`
raises then.
"""

from __future__ import annotations

from collections.abc import Sequence
import functools
import numbers
import warnings

import flax
import jax
import jax.numpy as jnp

# Extra ridge, relative to tr(K_ss) / n, tried in order on top of `reg`.
DEFAULT_JITTER_LADDER: tuple[float, ...] = (0.0, 1e-6, 1e-5, 1e-4, 1e-3,
                                            1e-2, 1e-1)


@flax.struct.dataclass
class KRRInfo:
  """Diagnostics of one KRR solve (scalars; ``[C]`` under vmap).

  Attributes:
    jitter: extra relative jitter taken from the ladder (0 when the plain
      ``reg`` solve was finite).
    ridge: absolute value added to the diagonal of ``K_ss``,
      ``(reg + jitter) * tr(K_ss) / n``.
    finite: whether every entry of the prediction is finite.
  """
  jitter: jax.Array
  ridge: jax.Array
  finite: jax.Array


def _check_ladder(jitter_ladder: Sequence[float]) -> tuple[float, ...]:
  ladder = tuple(float(j) for j in jitter_ladder)
  if not ladder:
    raise ValueError("jitter_ladder must hold at least one value.")
  if any(j < 0 for j in ladder) or any(
      b < a for a, b in zip(ladder, ladder[1:])):
    raise ValueError(f"jitter_ladder must be non-negative and non-decreasing, "
                     f"got {ladder}.")
  return ladder


def _check_x64(use_float64: bool) -> None:
  if use_float64 and not jax.config.jax_enable_x64:
    raise ValueError(
        "use_float64=True needs 64-bit JAX, which is off: call "
        "jax.config.update('jax_enable_x64', True) at program start (or run "
        "inside jax.experimental.enable_x64()). Without it float64 arrays are "
        "silently created as float32.")


def _factor_and_solve(a, y, ridge):
  n = a.shape[0]
  factor, _ = jax.scipy.linalg.cho_factor(
      a + ridge * jnp.eye(n, dtype=a.dtype), lower=True)
  alpha = jax.scipy.linalg.cho_solve((factor, True), y)
  return factor, alpha


def _search(a, y, scale, ladder):
  """First ladder rung with a finite solve: ``(factor, alpha, jitter)``."""
  ladder_arr = jnp.asarray(ladder, a.dtype)
  finite = lambda x: jnp.all(jnp.isfinite(x))
  factor, alpha = _factor_and_solve(a, y, ladder_arr[0] * scale)

  def cond(state):
    i, _, alpha = state
    return (i < len(ladder)) & jnp.logical_not(finite(alpha))

  def body(state):
    i = state[0]
    factor, alpha = _factor_and_solve(a, y, ladder_arr[i] * scale)
    return i + 1, factor, alpha

  i_end, factor, alpha = jax.lax.while_loop(
      cond, body, (jnp.int32(1), factor, alpha))
  # The loop stops one past the rung that worked (or past the last rung).
  return factor, alpha, ladder_arr[i_end - 1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _psd_solve(a, y, scale, ladder):
  """``((a + jitter·scale·I)⁻¹ y, jitter)`` with the jitter of :func:`_search`."""
  _, alpha, jitter = _search(a, y, scale, ladder)
  return alpha, jitter


def _psd_solve_fwd(a, y, scale, ladder):
  factor, alpha, jitter = _search(a, y, scale, ladder)
  return (alpha, jitter), (factor, alpha, jitter)


def _psd_solve_bwd(ladder, residuals, cotangents):
  del ladder
  factor, alpha, jitter = residuals
  g_alpha, _ = cotangents  # the jitter is a constant of the ladder
  y_bar = jax.scipy.linalg.cho_solve((factor, True), g_alpha)
  a_bar = -y_bar @ alpha.T
  # d(jitter·scale·I)/d scale = jitter·I, so scalē = jitter · tr(Ā).
  scale_bar = -jitter * jnp.sum(y_bar * alpha)
  return a_bar, y_bar, scale_bar


_psd_solve.defvjp(_psd_solve_fwd, _psd_solve_bwd)


def krr_predict(
    k_ss: jax.Array,
    k_ts: jax.Array,
    y_s: jax.Array,
    reg: float | jax.Array = 1e-6,
    *,
    use_float64: bool = False,
    jitter_ladder: Sequence[float] = DEFAULT_JITTER_LADDER,
    return_info: bool = False,
) -> jax.Array | tuple[jax.Array, KRRInfo]:
  """Kernel ridge regression prediction via Cholesky.

  Computes ``K_ts (K_ss + (reg + jitter) * tr(K_ss) / n * I)^{-1} y_s`` where
  ``jitter`` is the first entry of ``jitter_ladder`` giving a finite solve
  (module docstring). If ``tr(K_ss) <= 0`` (an all-zero kernel) or is not
  finite, the ridge scale ``tr(K_ss) / n`` is replaced by 1.

  Args:
    k_ss: support-support kernel ``[n, n]``, symmetric PSD.
    k_ts: target-support kernel ``[m, n]``.
    y_s: support labels ``[n, K]`` (or ``[n]``).
    reg: relative ridge, >= 0; may be a traced scalar (e.g. learned).
    use_float64: factorise and solve in float64. Needs
      ``jax_enable_x64``; the prediction is cast back to the input dtype.
    jitter_ladder: non-decreasing non-negative extra relative ridges tried
      in order; the first must usually be 0 so well-posed problems are
      unchanged.
    return_info: also return a :class:`KRRInfo`.

  Returns:
    ``pred [m, K]`` (``[m]`` for 1-D ``y_s``), or ``(pred, info)`` if
    ``return_info``.

  Raises:
    ValueError: on inconsistent shapes, an empty support, a negative Python
      ``reg``, a bad ladder, or ``use_float64`` without ``jax_enable_x64``.
  """
  ladder = _check_ladder(jitter_ladder)
  _check_x64(use_float64)
  if isinstance(reg, numbers.Real) and not reg >= 0:
    raise ValueError(f"reg must be >= 0, got {reg!r}.")
  k_ss, k_ts, y_s = jnp.asarray(k_ss), jnp.asarray(k_ts), jnp.asarray(y_s)
  if k_ss.ndim != 2 or k_ss.shape[0] != k_ss.shape[1]:
    raise ValueError(f"k_ss must be square [n, n], got {k_ss.shape}.")
  n = k_ss.shape[0]
  if n == 0:
    raise ValueError("the support set is empty (k_ss is [0, 0]).")
  if k_ts.ndim != 2 or k_ts.shape[1] != n:
    raise ValueError(f"k_ts must be [m, {n}], got {k_ts.shape}.")
  if y_s.ndim not in (1, 2) or y_s.shape[0] != n:
    raise ValueError(f"y_s must be [{n}, K] or [{n}], got {y_s.shape}.")

  out_dtype = jnp.result_type(k_ss.dtype, k_ts.dtype, y_s.dtype)
  if not jnp.issubdtype(out_dtype, jnp.floating):
    out_dtype = jnp.result_type(float)
  work_dtype = jnp.float64 if use_float64 else out_dtype
  squeeze = y_s.ndim == 1
  y = y_s[:, None] if squeeze else y_s
  k_ss = k_ss.astype(work_dtype)
  k_ts = k_ts.astype(work_dtype)
  y = y.astype(work_dtype)
  reg = jnp.asarray(reg, work_dtype)

  eye = jnp.eye(n, dtype=work_dtype)
  trace_scale = jnp.trace(k_ss) / n
  scale = jnp.where((trace_scale > 0) & jnp.isfinite(trace_scale),
                    trace_scale, jnp.ones_like(trace_scale))
  a = k_ss + reg * scale * eye

  alpha, jitter = _psd_solve(a, y, scale, ladder)
  pred = (k_ts @ alpha).astype(out_dtype)
  if squeeze:
    pred = pred[:, 0]
  if not return_info:
    return pred
  info = KRRInfo(
      jitter=jitter,
      ridge=jax.lax.stop_gradient((reg + jitter) * scale),
      finite=jnp.all(jnp.isfinite(pred)))
  return pred, info


def _nonfinite_cause(k_ss, k_ts, y_s, reg, ladder) -> str:
  """Which input made a KRR prediction non-finite (host side)."""
  bad = [name for name, a in (("k_ss", k_ss), ("k_ts", k_ts), ("y_s", y_s))
         if not bool(jax.device_get(jnp.all(jnp.isfinite(jnp.asarray(a)))))]
  if bad:
    labels = " (the support labels)" if bad == ["y_s"] else ""
    kernels = [b for b in bad if b != "y_s"]
    source = ""
    if kernels:
      source = (f"; {' and '.join(kernels)} come from the kernel: its images "
                "are non-finite (e.g. KIP run with lr or std NaN) or "
                "degenerate (e.g. constant images normalised to zero)")
    return (f"{' and '.join(bad)} contain{'s' * (len(bad) == 1)} NaN/inf"
            f"{labels}{source}")
  k = jnp.asarray(k_ss)
  if bool(jax.device_get(jnp.all(k == k[0, 0]))):
    return (f"K_ss is constant ({float(k[0, 0]):g} everywhere): the support "
            "points are identical (e.g. constant images), so the kernel "
            "matrix has zero variance and is singular; with "
            f"reg={reg:g} and the largest jitter {ladder[-1]:g} it stays "
            "singular")
  return (f"K_ss stays singular even with the largest jitter "
          f"{ladder[-1]:g} x tr(K_ss)/n; increase reg, extend "
          f"jitter_ladder or use use_float64=True")


@functools.partial(
    jax.jit, static_argnames=("use_float64", "jitter_ladder"))
def _krr_predict_jit(k_ss, k_ts, y_s, reg, *, use_float64, jitter_ladder):
  return krr_predict(k_ss, k_ts, y_s, reg, use_float64=use_float64,
                     jitter_ladder=jitter_ladder, return_info=True)


def krr_predict_checked(
    k_ss: jax.Array,
    k_ts: jax.Array,
    y_s: jax.Array,
    reg: float = 1e-6,
    *,
    use_float64: bool = False,
    jitter_ladder: Sequence[float] = DEFAULT_JITTER_LADDER,
    warn_on_jitter: bool = True,
) -> tuple[jax.Array, KRRInfo]:
  """Host-side :func:`krr_predict` that raises on a non-finite prediction.

  Not for use under ``jit``/``vmap``: it reads the diagnostics back to the
  host. Use it for evaluation and in tests; inside compiled code use
  ``krr_predict(..., return_info=True)`` and check ``info.finite``.

  Args:
    k_ss: ``[n, n]`` support-support kernel.
    k_ts: ``[m, n]`` target-support kernel.
    y_s: ``[n, K]`` or ``[n]`` support labels.
    reg: relative ridge, >= 0.
    use_float64: as in :func:`krr_predict`.
    jitter_ladder: as in :func:`krr_predict`.
    warn_on_jitter: emit a ``RuntimeWarning`` when a non-zero jitter had to
      be added.

  Returns:
    ``(pred, info)`` as :func:`krr_predict` with ``return_info=True``.

  Raises:
    ValueError: as :func:`krr_predict`, and if the prediction is not finite
      even with the largest jitter; the message names the input that is
      non-finite (``k_ss``, ``k_ts`` or ``y_s``) or degenerate (a constant
      ``K_ss``: identical support points).
  """
  ladder = _check_ladder(jitter_ladder)
  _check_x64(use_float64)
  if not reg >= 0:
    raise ValueError(f"reg must be >= 0, got {reg!r}.")
  pred, info = _krr_predict_jit(k_ss, k_ts, y_s, reg,
                                use_float64=use_float64, jitter_ladder=ladder)
  finite, jitter = jax.device_get((info.finite, info.jitter))
  if not bool(finite):
    raise ValueError(f"kernel ridge regression gave a non-finite prediction: "
                     f"{_nonfinite_cause(k_ss, k_ts, y_s, reg, ladder)}.")
  if warn_on_jitter and float(jitter) > 0:
    warnings.warn(f"K_ss was numerically singular with reg={reg:g}; added "
                  f"jitter {float(jitter):g} x tr(K_ss)/n.", RuntimeWarning,
                  stacklevel=2)
  return pred, info
