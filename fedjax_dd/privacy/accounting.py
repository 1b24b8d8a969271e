"""``(epsilon, delta)`` of the subsampled Gaussian mechanism, by dp-accounting.

DP-SGD (Abadi et al., "Deep Learning with Differential Privacy", CCS 2016,
Alg. 1), DP-FedAvg (McMahan et al., "Learning Differentially Private
Recurrent Language Models", ICLR 2018, Alg. 1) and DP-KIP (Vinaroz & Park,
"Differentially Private Kernel Inducing Points using features from
ScatterNets", TMLR 2023, Alg. 1) all release, at each of ``T`` steps, a sum
of per-record contributions clipped to L2 norm ``C`` plus Gaussian noise
``N(0, sigma^2 C^2 I)``, over a batch in which each record takes part with
probability ``q``. Under add-or-remove-one adjacency the step is the
Poisson-subsampled Gaussian mechanism with noise multiplier ``sigma``
(sensitivity 1 after dividing by ``C``), composed ``T`` times.

This module wraps Google's ``dp-accounting`` (the optional ``privacy``
extra, ``pip install "fedjax-dd[privacy]"``), imported on first use, so no
accountant is written here:

* the event is ``SelfComposedDpEvent(PoissonSampledDpEvent(q,
  GaussianDpEvent(sigma)), T)``;
* the accountant is ``dp_accounting.rdp.RdpAccountant`` (Mironov, CSF 2017;
  Mironov, Talwar & Zhang 2019) over its default orders, converted with
  Canonne, Kamath & Steinke 2020 (Prop. 12), tighter than Abadi et al.'s
  conversion, so the same run reads a smaller epsilon than that paper;
* :func:`noise_for_epsilon` calibrates ``sigma`` with
  ``dp_accounting.calibrate_dp_mechanism``.

Sampling: the accountant assumes Poisson sampling. Where a method draws a
fixed number of records without replacement (the engine's default cohort,
DP-KIP's target batch), epsilon at ``q = batch / population`` is the
customary approximation (as TF-Privacy reports), not a proof.
"""

from __future__ import annotations

import math
from typing import Any

from fedjax_dd.core import checks

__all__ = ["epsilon", "noise_for_epsilon", "summary_fields"]

EXTRA = "privacy"
"""The optional extra that installs ``dp-accounting``."""


def _dp_accounting():
  """The ``dp_accounting`` module, or an ImportError naming the extra."""
  try:
    import dp_accounting  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        "fedjax_dd.privacy needs dp-accounting, the optional "
        f"'{EXTRA}' extra: pip install \"fedjax-dd[{EXTRA}]\" (or pip "
        "install \"dp-accounting>=0.4\").") from None
  return dp_accounting


def _check(noise_multiplier, sampling_rate, steps, delta):
  sigma = checks.check_number("noise_multiplier", noise_multiplier, 0.0)
  q = checks.check_number("sampling_rate", sampling_rate, 0.0, 1.0)
  t = checks.check_int("steps", steps, 0)
  d = checks.check_number("delta", delta, 0.0, 1.0, low_open=True,
                          high_open=True)
  return sigma, q, t, d


def _event(noise_multiplier: float, sampling_rate: float, steps: int):
  dpa = _dp_accounting()
  return dpa.SelfComposedDpEvent(
      dpa.PoissonSampledDpEvent(sampling_rate,
                                dpa.GaussianDpEvent(noise_multiplier)),
      steps)


def _rdp_accountant():
  return _dp_accounting().rdp.RdpAccountant()


def epsilon(noise_multiplier: float, sampling_rate: float, steps: int,
            delta: float) -> float:
  """The ``epsilon`` of ``steps`` Poisson-subsampled Gaussian steps.

  Args:
    noise_multiplier: ``sigma``, the noise standard deviation over the
      clipping norm (``>= 0``).
    sampling_rate: ``q`` in ``[0, 1]``, the probability that a record
      (an example, a client) takes part in a step.
    steps: ``T >= 0``, the number of noisy releases.
    delta: the ``delta`` of the guarantee, in ``(0, 1)``.

  Returns:
    ``epsilon >= 0``: ``0.0`` when nothing is released (``steps = 0`` or
    ``q = 0``), ``inf`` without noise (``sigma = 0``), else the RDP
    accountant's bound.

  Raises:
    fedjax_dd.core.checks.SettingError: an argument outside its range.
    ImportError: dp-accounting is not installed (the ``privacy`` extra).
  """
  sigma, q, t, d = _check(noise_multiplier, sampling_rate, steps, delta)
  if t == 0 or q == 0.0:
    return 0.0
  if sigma == 0.0:
    return math.inf
  accountant = _rdp_accountant()
  accountant.compose(_event(sigma, q, t))
  return float(accountant.get_epsilon(d))


def noise_for_epsilon(target_epsilon: float, sampling_rate: float,
                      steps: int, delta: float, *,
                      tolerance: float = 1e-4) -> float:
  """The smallest noise multiplier whose :func:`epsilon` is at most the
  target.

  Calibrated by ``dp_accounting.calibrate_dp_mechanism`` (Brent's method
  from a bracket grown from ``[0, 1]``), on the private side of the target:
  ``epsilon(noise_for_epsilon(e, q, T, d), q, T, d) <= e``.

  Args:
    target_epsilon: the budget, ``> 0``.
    sampling_rate: ``q`` in ``(0, 1]``.
    steps: ``T >= 1``.
    delta: in ``(0, 1)``.
    tolerance: the search's tolerance on the noise multiplier.

  Returns:
    ``sigma > 0``.

  Raises:
    fedjax_dd.core.checks.SettingError: an argument outside its range.
    ImportError: dp-accounting is not installed (the ``privacy`` extra).
  """
  target = checks.check_number("target_epsilon", target_epsilon, 0.0,
                               low_open=True)
  _, q, t, d = _check(0.0, sampling_rate, steps, delta)
  checks.check_number("sampling_rate", q, 0.0, 1.0, low_open=True)
  checks.check_int("steps", t, 1)
  tol = checks.check_number("tolerance", tolerance, 0.0, low_open=True)
  dpa = _dp_accounting()
  sigma = dpa.calibrate_dp_mechanism(
      _rdp_accountant, lambda s: _event(s, q, t), target, d,
      bracket_interval=dpa.LowerEndpointAndGuess(0.0, 1.0), tol=tol)
  return float(sigma)


def summary_fields(*, clip: float, noise_multiplier: float,
                   sampling_rate: float, steps: int,
                   delta: float) -> dict[str, Any]:
  """The fields a DP run adds to ``summary.json``.

  Args:
    clip: the clipping norm ``C`` of each contribution.
    noise_multiplier: ``sigma`` (noise std ``sigma * C`` on the sum).
    sampling_rate: ``q`` the accountant used.
    steps: ``T``, the noisy releases made.
    delta: the guarantee's ``delta``.

  Returns:
    ``{"dp_epsilon", "dp_delta", "dp_noise_multiplier", "dp_clip",
    "dp_sampling_rate", "dp_steps", "dp_accountant"}``; ``dp_epsilon`` is
    :func:`epsilon` (``inf`` without noise).
  """
  return {
      "dp_epsilon": epsilon(noise_multiplier, sampling_rate, steps, delta),
      "dp_delta": float(delta),
      "dp_noise_multiplier": float(noise_multiplier),
      "dp_clip": float(clip),
      "dp_sampling_rate": float(sampling_rate),
      "dp_steps": int(steps),
      "dp_accountant": "rdp (dp-accounting, Poisson-subsampled Gaussian)",
  }
