"""DP-FedAvg: client-level differential privacy for FedAvg.

Each sampled client's model delta ``Delta_k = y_k - x`` is clipped to L2
norm ``C`` (over all its parameters at once), the server sums the clipped
deltas, adds Gaussian noise of standard deviation ``z * C`` to the sum and
divides by the expected cohort size ``qN``::

    Delta = (sum_k Delta_k * min(1, C / ||Delta_k||) + N(0, z^2 C^2 I)) / qN

This is Alg. 1 of McMahan et al. with the fixed-denominator estimator
``f~_f`` of Sec. 2 and equal user weights ``w_k = 1`` (so ``qW = qN``).
One client moves the sum by at most ``C``, so a round is the subsampled
Gaussian mechanism with noise multiplier ``z``, and ``T`` rounds are
accounted by :func:`fedjax_dd.privacy.accounting.epsilon` ``(z, q, T,
delta)``.

What the guarantee covers, and what it does not:

* the unit of privacy is a client (all its examples together);
* any server optimizer only post-processes the noised ``Delta``;
* the cohort: the accountant assumes each client joins a round
  independently with probability ``q`` (:class:`fedjax_dd.core.cohorts.
  BernoulliCohort`, up to its redraw of an empty round). For the default
  :class:`~fedjax_dd.core.cohorts.FixedCohort` of ``S`` clients, epsilon at
  ``q = S / N`` is the customary approximation, not a proof;
* BatchNorm statistics would be averaged without noise: such a model is
  refused at ``init``;
* training metrics are simulation diagnostics, not released.

The noise is drawn from the round's ``keys.server_key``
(:class:`fedjax_dd.algorithms.fedavg.KeyedAggregator`), apart from every
client's key, so a resumed run draws the same noise as an uninterrupted one.

With ``z = 0`` and ``C`` above every delta's norm the aggregate is the
unweighted mean ``sum_k Delta_k / qN`` (FedAvg's only when a fixed cohort's
clients hold equally many examples).

Reference: McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private
Recurrent Language Models", ICLR 2018.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjax_dd.algorithms.fedavg import KeyedAggregator, fedavg
from fedjax_dd.core import checks
from fedjax_dd.core.algorithm import CommSpec, Cohort, FederatedAlgorithm
from fedjax_dd.core.local import LocalResult, LocalTraining
from fedjax_dd.privacy import gaussian

PyTree = Any

tree_map = jax.tree_util.tree_map


@dataclasses.dataclass(frozen=True)
class DPFedAvgHyperParams:
  """DP-FedAvg's settings, the ``dp`` config group.

  Attributes:
    clip: ``C > 0``, the L2 bound of each client's delta.
    noise_multiplier: ``z >= 0``; the noise on the sum has std ``z * C``
      (``0``: clipping only, no guarantee).
    delta: the ``δ`` in ``(0, 1)`` of the reported ``ε``.
  """
  clip: float = 1.0
  noise_multiplier: float = 1.0
  delta: float = 1e-5

  def __post_init__(self):
    checks.check_number("clip", self.clip, 0.0, low_open=True)
    checks.check_number("noise_multiplier", self.noise_multiplier, 0.0)
    checks.check_number("delta", self.delta, 0.0, 1.0, low_open=True,
                        high_open=True)


def dp_aggregator(*, clip: float, noise_multiplier: float,
                  expected_clients: float) -> KeyedAggregator:
  """DP-FedAvg's server rule as a :class:`~fedjax_dd.algorithms.fedavg.
  KeyedAggregator`: the clients' deltas as rows of
  :func:`fedjax_dd.privacy.gaussian.noised_sum`, divided by ``qN``.

  Args:
    clip: ``C > 0``.
    noise_multiplier: ``z >= 0``.
    expected_clients: ``qN > 0``, the expected cohort size (``S`` for a
      fixed cohort, ``p N`` for a Bernoulli one).

  Raises:
    fedjax_dd.core.checks.SettingError: an argument outside its range.
  """
  clip = checks.check_number("DP-FedAvg clip", clip, 0.0, low_open=True)
  noise_multiplier = checks.check_number("DP-FedAvg noise_multiplier",
                                         noise_multiplier, 0.0)
  expected = checks.check_number("DP-FedAvg expected_clients",
                                 expected_clients, 0.0, low_open=True)

  def aggregate(deltas: PyTree, cohort: Cohort, result: LocalResult,
                key: jax.Array) -> PyTree:
    del result
    total = gaussian.noised_sum(deltas, key, clip=clip,
                                noise_multiplier=noise_multiplier,
                                valid=cohort.num_examples > 0)
    return tree_map(lambda t: (t.astype(jnp.float32) / expected
                               ).astype(t.dtype), total)

  return KeyedAggregator(aggregate)


def dp_fedavg(training: LocalTraining,
              *,
              clip: float,
              noise_multiplier: float,
              expected_clients: float,
              server_optimizer: optax.GradientTransformation = optax.sgd(1.0),
              comm: CommSpec = CommSpec()) -> FederatedAlgorithm:
  """Builds DP-FedAvg (McMahan et al. 2018, Alg. 1, estimator ``f~_f``).

  Args:
    training: the clients' local training (as :func:`~fedjax_dd.algorithms.
      fedavg.fedavg`'s).
    clip, noise_multiplier: as in :class:`DPFedAvgHyperParams`.
    expected_clients: ``qN > 0``, the expected cohort size the sum is
      divided by (as :func:`dp_aggregator`).
    server_optimizer: applied to the noised delta; ``sgd(1.0)`` is the
      paper's ``x <- x + Delta``.
    comm: model-sized tensors per client per round, for the ledger.

  Returns:
    A :class:`FederatedAlgorithm`; its ``init`` refuses BatchNorm models.

  Raises:
    fedjax_dd.core.checks.SettingError: ``clip <= 0``, ``noise_multiplier
      < 0``, ``expected_clients <= 0`` (or not finite); from ``init``, a
      model with ``batch_stats``.
  """
  algorithm = fedavg(training, server_optimizer=server_optimizer,
                     aggregator=dp_aggregator(
                         clip=clip, noise_multiplier=noise_multiplier,
                         expected_clients=expected_clients),
                     comm=comm)
  base_init = algorithm.init

  def init(params, batch_stats, num_clients):
    if jax.tree_util.tree_leaves(batch_stats):
      raise checks.SettingError(
          "DP-FedAvg: the model has BatchNorm statistics, which the clients "
          "would upload and the server average without noise, outside the "
          "guarantee; use a model without BatchNorm.")
    return base_init(params, batch_stats, num_clients)

  return algorithm._replace(init=init)
