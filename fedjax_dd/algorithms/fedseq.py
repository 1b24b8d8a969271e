"""FedSeq: sequential training inside superclients, FedAvg across them.

Reference: Zaccone et al., "Speeding up Heterogeneous Federated Learning with
Sequentially Trained Superclients", ICPR 2022; the baseline of HFLDD (Shi et
al., 2024), whose Eq. 19 gives its traffic.

The ``N`` clients are grouped into ``O`` superclients of ``J`` clients
(:func:`fedjax_dd.cluster.sampling.diverse_groups`). In every round each
superclient receives the global model, passes it along a ring of its
members -- each trains ``E`` local epochs from its predecessor's model and
hands it on -- and the last member uploads the result; the server averages
the ``O`` models weighted by the superclients' data sizes.

Data layout: a superclient is one "client" of the rounds loop whose arrays
carry a member axis, ``x [O, J, N_max, H, W, Ch]``, ``y [O, J, N_max]``,
``num_examples [O, J]`` (:func:`group_data`); groups smaller than ``J`` are
padded with empty members (zero examples, zero steps), which leave the model
unchanged. The ring is a ``lax.scan`` over members, written for ONE
superclient and mapped over superclients.

The ring starts at member ``(r - 1) mod J`` in round ``r`` (1-based) so
that, over ``J`` rounds, every member is once the last to train.

Communication: HFLDD Eq. 19 as printed (``traffic="eq19"``, a closed ring of
``J`` transfers; :func:`eq19_bits`) or what this implementation moves
(``"physical"``: ``J - 1`` hand-offs); a hand-off counts as its sender's
upload.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dd.algorithms import stages
from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core.algorithm import (CommSpec, Cohort, FederatedAlgorithm,
                                      ServerState)
from fedjax_dd.core.local import (LocalResult, LocalTraining, RoundContext,
                                  make_local_update)
from fedjax_dd.data.stacked import ClientData

PyTree = Any
tree_map = jax.tree_util.tree_map


def group_data(data: ClientData, num_steps: np.ndarray,
               groups: Sequence[np.ndarray]) -> tuple[ClientData, np.ndarray, np.ndarray]:
  """Stacks clients into superclients ``[O, J, ...]`` (host side).

  Args:
    data: per-client data ``[N, N_max, ...]``.
    num_steps: ``[N]`` local steps per client.
    groups: ``O`` arrays of client ids, each of at most ``J`` clients; ``J``
      is the largest group.

  Returns:
    ``(grouped, grouped_steps [O, J], member_ids [O, J])``; ``grouped`` has
    ``x [O, J, N_max, ...]``, ``y [O, J, N_max]``, ``num_examples [O, J]``
    and ``member_ids`` is ``-1`` on padding members.
  """
  x, y = np.asarray(data.x), np.asarray(data.y)
  n, steps = np.asarray(data.num_examples), np.asarray(num_steps)
  o = len(groups)
  j = max(len(g) for g in groups)
  ids = np.full((o, j), -1, np.int64)
  for g, members in enumerate(groups):
    ids[g, :len(members)] = members
  valid = ids >= 0
  safe = np.where(valid, ids, 0)
  gx = x[safe] * valid.reshape(o, j, *([1] * (x.ndim - 1))).astype(x.dtype)
  gy = y[safe] * valid.reshape(o, j, *([1] * (y.ndim - 1))).astype(y.dtype)
  gn = np.where(valid, n[safe], 0).astype(np.int32)
  gs = np.where(valid, steps[safe], 0).astype(np.int32)
  return ClientData(x=gx, y=gy, num_examples=gn), gs, ids


TRAFFIC = ("eq19", "physical")


def handoffs_per_round(group_size: int, traffic: str = "eq19") -> int:
  """Client-to-client transfers per superclient and round: ``J``
  (``"eq19"``) or ``J - 1`` (``"physical"``)."""
  if traffic not in TRAFFIC:
    raise ValueError(f"traffic must be one of {TRAFFIC}, got {traffic!r}.")
  return group_size if traffic == "eq19" else group_size - 1


def fedseq(training: LocalTraining, *, group_size: int,
           server_optimizer: optax.GradientTransformation = optax.sgd(1.0),
           traffic: str = "eq19") -> FederatedAlgorithm:
  """Builds FedSeq over superclients of ``group_size`` members.

  Args:
    training: each member's local training (the optimizer fresh at every
      hand-off, ``max_steps`` per member; ``mapper``: the backend of the
      superclient axis).
    group_size: ``J``, members per superclient (the member axis length).
    server_optimizer: applied to the aggregated delta (``sgd(1.0)``: FedAvg).
    traffic: ``"eq19"`` (``J`` transfers per superclient and round) or
      ``"physical"`` (``J - 1``); only the ledger's count changes.

  Returns:
    A :class:`FederatedAlgorithm` whose ``apply`` takes a :class:`Cohort` of
    superclients: ``x [S, J, N_max, ...]``, ``y [S, J, N_max]``,
    ``num_examples [S, J]``, ``num_steps [S, J]``, ``client_ids [S]``.
  """
  if group_size < 1:
    raise ValueError(f"group_size must be >= 1, got {group_size}.")
  transfers = handoffs_per_round(group_size, traffic)
  local = make_local_update(training)

  def ring(params, batch_stats, round_index, x, y, n, num_steps, key):
    """One superclient: members train in turn, starting at member
    ``round_index mod J``."""
    start = round_index % group_size

    def member(carry, t):
      params, batch_stats, loss_sum, acc_sum, step_sum = carry
      i = (start + t) % group_size
      ctx = RoundContext(round=round_index, start_params=params,
                         start_batch_stats=batch_stats)
      res = local.run(params, batch_stats, local.optimizer.init(params), x[i],
                      y[i], n[i], num_steps[i], jax.random.fold_in(key, i), ctx)
      w = res.steps
      return (res.params, res.batch_stats, loss_sum + w * res.loss,
              acc_sum + w * res.accuracy, step_sum + w), None

    zero = jnp.zeros((), jnp.float32)
    (params, batch_stats, loss, acc, steps), _ = jax.lax.scan(
        member, (params, batch_stats, zero, zero, zero),
        jnp.arange(group_size))
    denom = jnp.maximum(steps, 1.0)
    return LocalResult(params=params, batch_stats=batch_stats, opt_state=(),
                       loss=loss / denom, accuracy=acc / denom, steps=steps)

  mapped = training.mapper.map(ring, in_axes=(None, None, None, 0, 0, 0, 0, 0))

  @jax.jit
  def aggregate(server: ServerState, result: LocalResult, cohort: Cohort):
    weights = cohort.num_examples.sum(axis=1)
    delta = stages.weighted_mean(stages.deltas(result.params, server.params),
                                 weights)
    batch_stats = stages.weighted_mean(result.batch_stats, weights)
    new = stages.server_step(server_optimizer, server, delta, batch_stats)
    return new, stages.cohort_metrics(result, weights)

  def init(params, batch_stats, num_clients):
    del num_clients
    return ServerState(params, batch_stats, server_optimizer.init(params)), {}

  def apply(server, clients, cohort, key):
    if cohort.x.shape[1] != group_size:
      raise ValueError(
          f"Expected superclients of {group_size} members, got member axis "
          f"{cohort.x.shape[1]}.")
    keys = keys_lib.client_keys(key, cohort.client_ids)
    result = mapped(server.params, server.batch_stats,
                    jnp.asarray(cohort.round, jnp.int32), cohort.x, cohort.y,
                    cohort.num_examples, cohort.num_steps, keys)
    server, metrics = aggregate(server, result, cohort)
    return server, clients, metrics

  return FederatedAlgorithm(init=init, apply=apply,
                            comm=CommSpec(download=1, upload=1 + transfers))


def eq19_bits(*, num_groups: int, group_size: int, num_params: int,
              rounds: int, bits_per_param: int = ledger_lib.BITS_PER_PARAM,
              traffic: str = "eq19") -> int:
  """FedSeq's traffic in bits, HFLDD Eq. 19.

  ``O |w| B1 ((2T - 1) + T J)`` as printed (``traffic="eq19"``), or with
  ``J - 1`` hand-offs per round (``traffic="physical"``).

  Args:
    num_groups: ``O`` superclients.
    group_size: ``J`` clients per superclient.
    num_params: ``|w|``.
    rounds: ``T``.
    bits_per_param: ``B1``.
    traffic: ``"eq19"`` or ``"physical"``.
  """
  transfers = handoffs_per_round(group_size, traffic)
  if rounds == 0:
    return 0
  return int(num_groups * num_params * bits_per_param *
             ((2 * rounds - 1) + transfers * rounds))


def traffic_bytes(*, num_groups: int, group_size: int, num_params: int,
                  rounds: int) -> dict[str, int | float]:
  """HFLDD Eq. 19 in bytes under both counts of :data:`TRAFFIC`:
  ``{"eq19_bytes": ..., "physical_bytes": ...}`` (:func:`eq19_bits`)."""
  return {f"{name}_bytes": ledger_lib.bits_to_bytes(eq19_bits(
      num_groups=num_groups, group_size=group_size, num_params=num_params,
      rounds=rounds, traffic=name)) for name in TRAFFIC}
