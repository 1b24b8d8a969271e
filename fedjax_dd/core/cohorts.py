"""How a round's cohort is drawn.

Two draws, both functions of the round's sampling key only, so a resumed run
draws the cohorts of an uninterrupted one:

* :class:`FixedCohort`: ``S`` clients uniformly without replacement (the
  default; FedAvg's ``C·N``, DisUE's "Act" as a fixed fraction).
* :class:`BernoulliCohort`: each client joins independently with
  probability ``p``, as FedDyn's and FedFTG's released code draw their
  active clients (``act_prob``). Each new cohort size compiles the round's
  programs once; the size is bounded (``size_bound``) so that stages with a
  static cohort axis (IGA's teacher stack) can pad to it.

A fixed draw stays on the device; a Bernoulli draw is made on the host, where
the loop needs its size.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.core import keys

# A Bernoulli cohort larger than its size bound is drawn again; by default
# the bound is the size exceeded with probability at most this, so it
# changes the draw's distribution by less than that.
DEFAULT_TAIL = 1e-6

MIN_DRAW_PROBABILITY = 0.01
"""A Bernoulli draw must give a usable cohort (someone, within the bound)
with at least this probability: below it a round redraws more than 100
times on average (``activity=1e-9`` over 10 clients: 1e8 times)."""

MAX_ATTEMPTS = 100_000
"""Redraws after which a Bernoulli draw stops with an error; above
:data:`MIN_DRAW_PROBABILITY` that happens with probability below 1e-400."""


@dataclasses.dataclass(frozen=True)
class FixedCohort:
  """``size`` clients drawn uniformly without replacement (all if ``= N``).

  Attributes:
    size: ``S``, clients per round.
  """
  size: int

  @property
  def fixed(self) -> bool:
    return True

  def size_bound(self, num_clients: int) -> int:
    """The largest cohort a round can have: ``S``."""
    del num_clients
    return int(self.size)

  def validate(self, num_clients: int) -> None:
    """Raises ``ValueError`` unless ``1 <= S <= N``."""
    if not 1 <= int(self.size) <= num_clients:
      raise ValueError(f"clients_per_round must be in [1, {num_clients}], "
                       f"got {self.size}.")

  def draw(self, key: jax.Array, num_clients: int) -> jax.Array:
    """``[S]`` sorted client ids, on the device (no host sync: the size is
    static)."""
    s = int(self.size)
    if s == num_clients:
      return jnp.arange(num_clients)
    return jnp.sort(jax.random.choice(key, num_clients, (s,), replace=False))


def binomial_bound(num_clients: int, probability: float,
                   tail: float = DEFAULT_TAIL) -> int:
  """The smallest ``k`` with ``P(Bin(N, p) > k) <= tail``.

  Args:
    num_clients: ``N``.
    probability: ``p`` in ``(0, 1]``.
    tail: the probability left above ``k``.

  Returns:
    ``k`` in ``[0, N]``.
  """
  n, p = int(num_clients), float(probability)
  if p >= 1.0:
    return n
  log_p, log_q = math.log(p), math.log1p(-p)
  # The tail past 40 sds is below 1e-300: sum down from there, in log space
  # (C(N, k) overflows a float for large N).
  top = min(n, math.ceil(n * p + 40.0 * math.sqrt(n * p * (1 - p)) + 40))
  above = 0.0  # P(X > k) at the top of each iteration.
  for k in range(top, -1, -1):
    if above > tail:
      return k + 1
    above += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1)
                      - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)
  return 0


@dataclasses.dataclass(frozen=True)
class BernoulliCohort:
  """Each client joins a round independently with probability ``p``.

  As FedDyn's and FedFTG's code (``act_prob``); a draw with no client, or
  with more than ``max_size``, is drawn again from ``fold_in(key, attempt)``.

  Attributes:
    probability: ``p`` in ``(0, 1]``.
    max_size: the largest cohort; ``0``: :func:`binomial_bound` of ``N``
      and ``p`` at :data:`DEFAULT_TAIL`.
  """
  probability: float
  max_size: int = 0

  @property
  def fixed(self) -> bool:
    return False

  def size_bound(self, num_clients: int) -> int:
    """The largest cohort a round can have (at least 1)."""
    if self.max_size:
      return min(int(self.max_size), num_clients)
    return max(1, binomial_bound(num_clients, self.probability))

  def validate(self, num_clients: int) -> None:
    """Raises ``ValueError`` for ``p`` outside ``(0, 1]`` or a negative
    ``max_size``."""
    p = float(self.probability)
    if not (math.isfinite(p) and 0.0 < p <= 1.0):
      raise ValueError(f"The cohort's activity probability must be in "
                       f"(0, 1], got {self.probability}.")
    if int(self.max_size) < 0:
      raise ValueError(f"max_size must be >= 0 (0: the binomial bound), got "
                       f"{self.max_size}.")
    if num_clients < 1:
      raise ValueError(f"A cohort needs at least one client, got "
                       f"{num_clients}.")
    nobody = (1.0 - p) ** num_clients
    if 1.0 - nobody < MIN_DRAW_PROBABILITY:
      # The smallest p whose draw has someone with that probability.
      least = -math.expm1(math.log1p(-MIN_DRAW_PROBABILITY) / num_clients)
      raise ValueError(
          f"The cohort's activity probability {p:g} over {num_clients} "
          f"clients expects {p * num_clients:.3g} clients a round: a round "
          f"would redraw about {1 / max(1.0 - nobody, 1e-300):.3g} times "
          f"before anyone joins. Use at least {least:.4g}.")

  def draw(self, key: jax.Array, num_clients: int) -> np.ndarray:
    """``[K]`` sorted int32 client ids, ``1 <= K <= size_bound(N)``."""
    bound = self.size_bound(num_clients)
    for attempt in range(MAX_ATTEMPTS):
      rng = keys.numpy_from_key(jax.random.fold_in(key, attempt))
      ids = np.flatnonzero(rng.random(num_clients) < self.probability)
      if 1 <= ids.size <= bound:
        return ids.astype(np.int32)
    raise RuntimeError(
        f"No cohort of 1 to {bound} clients in {MAX_ATTEMPTS} Bernoulli "
        f"draws with probability {self.probability:g} over {num_clients} "
        "clients; raise the activity probability (validate refuses one "
        "this small).")


CohortSampler = FixedCohort | BernoulliCohort


def as_sampler(clients_per_round: int | CohortSampler) -> CohortSampler:
  """An int ``S`` as :class:`FixedCohort` ``(S)``; a sampler as it is."""
  if isinstance(clients_per_round, (FixedCohort, BernoulliCohort)):
    return clients_per_round
  value = clients_per_round
  if (isinstance(value, (bool, np.bool_))
      or not isinstance(value, (int, float, np.integer, np.floating))
      or int(value) != value):
    raise TypeError(f"clients_per_round must be a whole number or a cohort "
                    f"sampler (FixedCohort, BernoulliCohort), got {value!r}.")
  return FixedCohort(int(value))
