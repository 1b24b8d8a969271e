"""Cohort draws: fixed size, and each client joining with probability p."""

import jax
import numpy as np
import pytest

from fedjax_dd.core import cohorts
from fedjax_dd.core import rounds as rounds_lib


def test_binomial_bound_hand_checked():
  # Bin(10, 0.01): P(X >= 5) = C(10,5)·1e-10·0.99^5 = 2.4e-8 <= 1e-6, but
  # P(X >= 4) = C(10,4)·1e-8·0.99^6 = 2.0e-6 > 1e-6: k = 4.
  assert cohorts.binomial_bound(10, 0.01) == 4
  # Bin(4, 0.5): P(X = 4) = 1/16 > 1e-6: every size can occur.
  assert cohorts.binomial_bound(4, 0.5) == 4
  # Bin(3, 0.5) with tail 0.6: P(X > 1) = 4/8 <= 0.6 < P(X > 0) = 7/8.
  assert cohorts.binomial_bound(3, 0.5, tail=0.6) == 1
  assert cohorts.binomial_bound(7, 1.0) == 7


def test_fixed_cohort_is_the_engines_uniform_draw():
  key = jax.random.PRNGKey(3)
  ids = np.asarray(cohorts.FixedCohort(4).draw(key, 10))
  np.testing.assert_array_equal(ids, rounds_lib.sample_clients(key, 10, 4))
  assert len(set(ids)) == 4 and list(ids) == sorted(ids)
  np.testing.assert_array_equal(cohorts.FixedCohort(5).draw(key, 5),
                                np.arange(5))
  assert cohorts.FixedCohort(4).size_bound(10) == 4
  with pytest.raises(ValueError, match=r"clients_per_round must be in "
                     r"\[1, 3\], got 4"):
    cohorts.FixedCohort(4).validate(3)


def test_bernoulli_cohort_draws():
  sampler = cohorts.BernoulliCohort(0.3)
  draws = [sampler.draw(jax.random.PRNGKey(i), 20) for i in range(400)]
  # A function of the key alone.
  np.testing.assert_array_equal(draws[7],
                                sampler.draw(jax.random.PRNGKey(7), 20))
  sizes = np.array([d.size for d in draws])
  assert len(set(sizes)) > 3  # the size varies ...
  # ... around N·p = 6 (sd of the mean over 400 draws: 0.1).
  assert abs(sizes.mean() - 6.0) < 0.5
  for d in draws:
    assert d.dtype == np.int32 and list(d) == sorted(set(d))
    assert 0 <= d.min() and d.max() < 20
  # Each client joins about 30 % of the rounds (sd 0.023 per client).
  share = np.bincount(np.concatenate(draws), minlength=20) / 400
  assert np.all(np.abs(share - 0.3) < 0.1)


def test_bernoulli_cohort_redraws_empty_and_oversized_cohorts():
  rare = cohorts.BernoulliCohort(0.01)
  assert all(rare.draw(jax.random.PRNGKey(i), 2).size >= 1 for i in range(50))
  capped = cohorts.BernoulliCohort(0.5, max_size=2)
  sizes = {capped.draw(jax.random.PRNGKey(i), 10).size for i in range(50)}
  assert sizes <= {1, 2} and capped.size_bound(10) == 2
  assert cohorts.BernoulliCohort(0.15).size_bound(100) == (
      cohorts.binomial_bound(100, 0.15))


@pytest.mark.parametrize("p", [0.0, -0.1, 1.5, float("nan")])
def test_bernoulli_cohort_rejects_bad_probabilities(p):
  with pytest.raises(ValueError, match=r"activity probability must be in "
                     r"\(0, 1\]"):
    cohorts.BernoulliCohort(p).validate(10)


def test_as_sampler():
  assert cohorts.as_sampler(3) == cohorts.FixedCohort(3)
  assert cohorts.as_sampler(np.int64(3)) == cohorts.FixedCohort(3)
  assert cohorts.as_sampler(3.0) == cohorts.FixedCohort(3)
  b = cohorts.BernoulliCohort(0.2)
  assert cohorts.as_sampler(b) is b
  for bad in (2.5, True, "3", None):
    with pytest.raises(TypeError, match="whole number or a cohort sampler"):
      cohorts.as_sampler(bad)


def test_an_activity_that_cannot_draw_anyone_is_refused_and_draws_bounded(
    monkeypatch):
  # 1e-9 over 10 clients: P(someone) = 1 - (1 - 1e-9)**10 ~ 1e-8, i.e.
  # about 1e8 redraws a round. The least activity whose draw has someone
  # with probability 0.01 is 1 - 0.99**(1/10) = 0.001005.
  with pytest.raises(ValueError, match=r"expects 1e-08 clients a round: a "
                     r"round would redraw about 1e\+08 times before anyone "
                     r"joins. Use at least 0.001005"):
    cohorts.BernoulliCohort(1e-9).validate(10)
  cohorts.BernoulliCohort(0.0011).validate(10)  # P(someone) = 0.0109
  # The draw itself stops (an unvalidated sampler) instead of spinning.
  monkeypatch.setattr(cohorts, "MAX_ATTEMPTS", 5)
  with pytest.raises(RuntimeError, match="No cohort of 1 to 1 clients in 5 "
                                         "Bernoulli draws"):
    cohorts.BernoulliCohort(1e-9).draw(jax.random.PRNGKey(0), 10)
