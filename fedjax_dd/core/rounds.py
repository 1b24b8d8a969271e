"""The one rounds loop shared by every multi-round method.

Round ``r`` (1-based) derives all its randomness from
``fold_in(state.key, r)``: client sampling and local training. So the whole
run is a function of the :class:`ExperimentState` at any round boundary, and a
run resumed from a checkpoint reproduces an uninterrupted one bit for bit.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core.algorithm import Cohort, ExperimentState, FederatedAlgorithm
from fedjax_dd.core.checkpoint import CheckpointStore
from fedjax_dd.core.metrics import MetricsWriter
from fedjax_dd.data.stacked import ClientData

PyTree = Any
tree_map = jax.tree_util.tree_map


@dataclasses.dataclass(frozen=True)
class RoundsOptions:
  """Options of :func:`run_rounds`.

  Attributes:
    num_rounds: total rounds of the run (a resumed run continues to this).
    clients_per_round: sampled clients ``S`` per round (``<= N``).
    eval_every: evaluate the global model every this many rounds (and at the
      last round); ``0`` disables evaluation.
    checkpoint_every: save every this many rounds (and at the last round).
    progress: show a tqdm bar (only on a TTY).
    bits_per_param: ledger size of one model parameter.
    initial_model_as_seed: if True the round-1 model download is not counted
      (clients regenerate the initial model from a shared seed), giving HFLDD
      Eq. 3's ``N·(2T−1)·|ω|``.
    max_seconds: wall-clock budget of this call; ``0`` means none. The loop
      stops after the first round that ends past it, and treats that round as
      the last one (evaluated and checkpointed), so a resumed run with a new
      budget continues from it. At least one round always runs.
    clock: the clock the budget is read from (injectable for tests).
  """
  num_rounds: int
  clients_per_round: int
  eval_every: int = 1
  checkpoint_every: int = 1
  progress: bool = True
  bits_per_param: int = 32
  initial_model_as_seed: bool = True
  max_seconds: float = 0.0
  clock: Callable[[], float] = time.monotonic


def sample_clients(key: jax.Array, num_clients: int, num_sampled: int) -> jax.Array:
  """Sorted client ids sampled without replacement (all clients if S == N)."""
  if num_sampled == num_clients:
    return jnp.arange(num_clients)
  return jnp.sort(jax.random.choice(key, num_clients, (num_sampled,),
                                    replace=False))


@jax.jit
def gather_cohort(data: ClientData, num_steps: jax.Array,
                  ids: jax.Array) -> Cohort:
  """Gathers the sampled clients' rows on the device."""
  return Cohort(x=data.x[ids], y=data.y[ids],
                num_examples=data.num_examples[ids], num_steps=num_steps[ids],
                client_ids=ids)


def _gather(tree: PyTree, ids: jax.Array) -> PyTree:
  return tree_map(lambda a: a[ids], tree)


def _scatter(tree: PyTree, ids: jax.Array, values: PyTree) -> PyTree:
  return tree_map(lambda a, v: a.at[ids].set(v), tree, values)


def num_params(tree: PyTree) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(tree)))


def run_rounds(
    algorithm: FederatedAlgorithm,
    state: ExperimentState,
    data: ClientData,
    num_steps: jax.Array,
    options: RoundsOptions,
    *,
    evaluate: Callable[[PyTree, PyTree], dict[str, float]] | None = None,
    ledger: ledger_lib.Ledger | None = None,
    writer: MetricsWriter | None = None,
    store: CheckpointStore | None = None,
    on_round: Callable[[ExperimentState, dict[str, Any]], None] | None = None,
) -> tuple[ExperimentState, ledger_lib.Ledger, list[dict[str, Any]]]:
  """Runs rounds ``state.round + 1 .. options.num_rounds`` (or fewer, see
  ``options.max_seconds``).

  Args:
    algorithm: the federated algorithm.
    state: the state after ``state.round`` completed rounds.
    data: all clients' padded data ``[N, N_max, ...]`` (device-resident).
    num_steps: ``[N]`` active local steps per client.
    options: loop options.
    evaluate: ``(params, batch_stats) -> {"accuracy", "loss"}`` on the test
      split.
    ledger: the communication ledger so far.
    writer: appends one JSON row per round.
    store: checkpoint store; the whole state plus the ledger is saved.
    on_round: optional callback after each round.

  Returns:
    ``(state, ledger, rows)``: final state, ledger and the rows written.
  """
  n = data.num_clients
  s = options.clients_per_round
  if not 1 <= s <= n:
    raise ValueError(f"clients_per_round must be in [1, {n}], got {s}.")
  ledger = ledger if ledger is not None else ledger_lib.Ledger()
  model_size = num_params(state.server.params)
  start = int(state.round)
  # One layout for every round: the client mapper hands results back
  # committed to the default device, so a state that starts uncommitted (fresh
  # init) would make round 2's eager gathers/scatters compile again.
  state = jax.device_put(state, jax.devices()[0])
  show = options.progress and sys.stderr.isatty()
  rows = []
  t_start = options.clock()
  bar = tqdm.tqdm(range(start + 1, options.num_rounds + 1), disable=not show,
                  initial=start, total=options.num_rounds, desc="rounds")
  for r in bar:
    round_key = jax.random.fold_in(state.key, r)
    sample_key, train_key = jax.random.split(round_key)
    ids = sample_clients(sample_key, n, s)
    cohort = gather_cohort(data, num_steps, ids)
    server, client_slice, metrics = algorithm.apply(
        state.server, _gather(state.clients, ids), cohort, train_key)
    clients = _scatter(state.clients, ids, client_slice)
    state = ExperimentState(server=server, clients=clients, key=state.key,
                            round=jnp.asarray(r, jnp.int32))

    down, up = ledger_lib.fedavg_round_bits(
        model_size, s, r, bits_per_param=options.bits_per_param,
        initial_model_as_seed=options.initial_model_as_seed,
        upload_multiplier=algorithm.comm.upload,
        download_multiplier=algorithm.comm.download)
    # One entry per direction: s messages of one client's size, so that
    # FedD3's per-message GCE (Eq. 6) reads V_t off the ledger directly.
    ledger = ledger.record(r, kind="download", bits=down // s, count=s,
                           tag="model")
    ledger = ledger.record(r, kind="upload", bits=up // s, count=s,
                           tag="model")

    row: dict[str, Any] = {"round": r}
    # device_get waits for the round, so the budget check below sees its cost.
    row.update({k: float(v) for k, v in jax.device_get(metrics).items()})
    out_of_time = bool(options.max_seconds) and (
        options.clock() - t_start >= options.max_seconds)
    last = r == options.num_rounds or out_of_time
    row.update({f"{k}_cumulative": v for k, v in ledger.cumulative().items()
                if k.startswith("bytes_")})
    row.update({f"{k}_round": v for k, v in ledger.round_totals(r).items()
                if k.startswith("bytes_")})
    if evaluate is not None and options.eval_every and (
        r % options.eval_every == 0 or last):
      ev = evaluate(state.server.params, state.server.batch_stats)
      row["test_accuracy"] = ev["accuracy"]
      row["test_loss"] = ev["loss"]
      bar.set_postfix(acc=f"{ev['accuracy']:.4f}")
    rows.append(row)
    if writer is not None:
      writer.write(row)
    if store is not None:
      store.save(r, state, {"ledger": ledger.to_dict()}, force=last)
    if on_round is not None:
      on_round(state, row)
    if out_of_time:
      break
  bar.close()
  return state, ledger, rows


def resume(store: CheckpointStore | None, template: ExperimentState,
           writer: MetricsWriter | None = None
           ) -> tuple[ExperimentState, ledger_lib.Ledger] | None:
  """Restores the newest good checkpoint and trims metrics written after it.

  Returns:
    ``(state, ledger)`` or ``None`` when there is nothing to resume.
  """
  if store is None:
    return None
  restored = store.restore(template)
  if restored is None:
    return None
  step, state, meta = restored
  if writer is not None:
    writer.truncate_after(step)
  return state, ledger_lib.Ledger.from_dict(meta["ledger"])
