"""The accountant against published epsilons (dp-accounting's RDP).

* TF-Privacy's ``compute_dp_sgd_privacy`` tests (``tensorflow_privacy/
  privacy/analysis/compute_dp_sgd_privacy_test.py``, which run this RDP
  accountant on the subsampled Gaussian): N = 60,000, batch 150,
  sigma = 1.3, 15 epochs (6,000 steps), delta = 1e-5 gives epsilon =
  0.7242234026109595; N = 100,000, batch 100, sigma = 1.0, 30 epochs
  (30,000 steps), delta = 1e-7 gives 1.4154988495444842.
* Abadi et al., "Deep Learning with Differential Privacy" (CCS 2016),
  Sec. 3.1: q = 0.01, sigma = 4, delta = 1e-5 and 10,000 steps give
  epsilon = 1.26 with the moments accountant. Its conversion of the
  moments to epsilon is ``min_a rdp(a) + log(1 / delta) / (a - 1)``; the
  accountant's (Canonne, Kamath & Steinke 2020) is tighter, so it reads
  below 1.26, and the classical conversion of its own RDP curve gives 1.26.
"""

import math
import sys

import pytest

from fedjax_dd.core import checks
from fedjax_dd.privacy import accounting

dp_accounting = pytest.importorskip("dp_accounting")


@pytest.mark.parametrize("sigma, q, steps, delta, published", [
    (1.3, 150 / 60_000, 6_000, 1e-5, 0.7242234026109595),
    (1.0, 100 / 100_000, 30_000, 1e-7, 1.4154988495444842),
])
def test_tf_privacy_epsilons(sigma, q, steps, delta, published):
  assert accounting.epsilon(sigma, q, steps, delta) == pytest.approx(
      published, rel=1e-9)


def test_arguments_in_the_wrong_order_fail():
  # Rate and noise swapped: a rate above 1 is refused; a noise of 0.001
  # (the second case's rate) gives no privacy to speak of.
  with pytest.raises(checks.SettingError, match="sampling_rate"):
    accounting.epsilon(150 / 60_000, 1.3, 6_000, 1e-5)
  assert accounting.epsilon(1e-3, 1.0, 30_000, 1e-7) > 1e6
  # Steps and delta swapped.
  with pytest.raises(checks.SettingError, match="steps"):
    accounting.epsilon(1.3, 150 / 60_000, 1e-5, 6_000)


def _classical(sigma, q, steps, delta, orders=range(2, 34)):
  """Abadi et al.'s conversion of the RDP curve: one-order accountants'
  epsilons with the improved bound's extra terms taken back out
  (``log1p(-1/a) - log(a) / (a - 1)``, Canonne et al. Prop. 12)."""
  event = dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(
          q, dp_accounting.GaussianDpEvent(sigma)), steps)
  best = math.inf
  for a in orders:
    acc = dp_accounting.rdp.RdpAccountant(orders=[a])
    acc.compose(event)
    improved = acc.get_epsilon(delta)
    best = min(best, improved - math.log1p(-1 / a) + math.log(a) / (a - 1))
  return best


def test_abadi_et_al_moments_accountant_example():
  eps = accounting.epsilon(4.0, 0.01, 10_000, 1e-5)
  assert 1.0 < eps < 1.26  # the tighter conversion: 1.035
  assert eps == pytest.approx(1.0355, abs=1e-3)
  assert _classical(4.0, 0.01, 10_000, 1e-5) == pytest.approx(1.26,
                                                              abs=0.005)


def test_edges():
  assert accounting.epsilon(1.0, 0.01, 0, 1e-5) == 0.0
  assert accounting.epsilon(1.0, 0.0, 100, 1e-5) == 0.0
  assert accounting.epsilon(0.0, 0.01, 100, 1e-5) == math.inf
  # More steps, a higher rate or less noise never spend less.
  base = accounting.epsilon(1.0, 0.01, 100, 1e-5)
  assert accounting.epsilon(1.0, 0.01, 200, 1e-5) > base
  assert accounting.epsilon(1.0, 0.02, 100, 1e-5) > base
  assert accounting.epsilon(0.8, 0.01, 100, 1e-5) > base
  for bad in ({"delta": 0.0}, {"delta": 1.0}, {"noise_multiplier": -1.0},
              {"steps": 2.5}, {"sampling_rate": float("nan")}):
    args = {"noise_multiplier": 1.0, "sampling_rate": 0.01, "steps": 10,
            "delta": 1e-5, **bad}
    with pytest.raises(checks.SettingError, match=next(iter(bad))):
      accounting.epsilon(**args)


def test_noise_for_epsilon_is_the_smallest_noise_within_the_budget():
  sigma = accounting.noise_for_epsilon(1.0, 0.01, 10_000, 1e-5)
  assert accounting.epsilon(sigma, 0.01, 10_000, 1e-5) <= 1.0
  assert accounting.epsilon(sigma - 1e-3, 0.01, 10_000, 1e-5) > 1.0
  # The published case backwards: epsilon 0.7242 needs sigma 1.3.
  assert accounting.noise_for_epsilon(
      0.7242234026109595, 150 / 60_000, 6_000, 1e-5) == pytest.approx(
          1.3, abs=1e-3)
  with pytest.raises(checks.SettingError, match="target_epsilon"):
    accounting.noise_for_epsilon(0.0, 0.01, 100, 1e-5)


def test_summary_fields():
  fields = accounting.summary_fields(clip=0.5, noise_multiplier=1.3,
                                     sampling_rate=0.0025, steps=6_000,
                                     delta=1e-5)
  assert fields["dp_epsilon"] == pytest.approx(0.7242234026109595, rel=1e-9)
  assert (fields["dp_clip"], fields["dp_noise_multiplier"],
          fields["dp_sampling_rate"], fields["dp_steps"],
          fields["dp_delta"]) == (0.5, 1.3, 0.0025, 6_000, 1e-5)


def test_without_dp_accounting_the_error_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "dp_accounting", None)
  with pytest.raises(ImportError, match=r'pip install "fedjax-dd\[privacy\]"'):
    accounting.epsilon(1.0, 0.01, 10, 1e-5)
