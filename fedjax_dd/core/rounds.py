"""The one rounds loop shared by every multi-round method.

Round ``r`` (1-based) derives all its randomness from
``fold_in(state.key, r)``, so a run resumed from the
:class:`ExperimentState` at a round boundary reproduces an uninterrupted one
bit for bit.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.core import checks
from fedjax_dd.core import cohorts
from fedjax_dd.core import keys
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core.algorithm import Cohort, ExperimentState, FederatedAlgorithm
from fedjax_dd.core.checkpoint import CheckpointStore, as_restored
from fedjax_dd.core.metrics import MetricsWriter
from fedjax_dd.data import validate
from fedjax_dd.data.stacked import ClientData

PyTree = Any
tree_map = jax.tree_util.tree_map


@dataclasses.dataclass(frozen=True)
class RoundsOptions:
  """Options of :func:`run_rounds`.

  Attributes:
    num_rounds: total rounds of the run (a resumed run continues to this).
    clients_per_round: sampled clients ``S`` per round (``<= N``), or a
      cohort sampler (:mod:`fedjax_dd.core.cohorts`; a Bernoulli cohort's
      rows carry ``cohort_size``).
    eval_every, checkpoint_every, progress: as
      :class:`fedjax_dd.core.loop.LoopOptions` (evaluate / save every this
      many rounds and at the last; ``eval_every=0``: never evaluate).
    bits_per_param: ledger size of one model parameter.
    initial_model_as_seed: the round-1 download is not counted (HFLDD
      Eq. 3's ``N·(2T−1)·|ω|``).
    max_seconds: wall-clock budget of this call; ``0`` means none
      (:class:`fedjax_dd.core.loop.LoopOptions`).
    clock: the clock the budget is read from (injectable for tests).
    stop_on_nonfinite: stop with :class:`fedjax_dd.core.loop.NonFiniteError`
      at the first round whose metrics are not finite.
  """
  num_rounds: int
  clients_per_round: int | cohorts.CohortSampler
  eval_every: int = 1
  checkpoint_every: int = 1
  progress: bool = True
  bits_per_param: int = 32
  initial_model_as_seed: bool = True
  max_seconds: float = 0.0
  clock: Callable[[], float] = time.monotonic
  stop_on_nonfinite: bool = True

  def __post_init__(self):
    checks.check_budget("max_seconds", self.max_seconds)


# Metrics an algorithm's ``apply`` returns under this prefix,
# ``"traffic/<kind>/<tag>"``, are bits it sent beyond the models this round;
# :func:`run_rounds` records them in the ledger (one message of that total).
TRAFFIC_PREFIX = "traffic/"

# Models beside the global one that the loop evaluates on the same schedule:
# ``server.extra[EVAL_MODELS] = {name: {"params", "batch_stats"}}`` adds
# ``test_accuracy_<name>`` and ``test_loss_<name>`` to the evaluated rows
# (e.g. DisUE's ω_G before IGA).
EVAL_MODELS = "eval_models"


def evaluate_server(evaluate: Callable[[PyTree, PyTree], dict[str, Any]],
                    server: Any) -> dict[str, Any]:
  """``evaluate`` on the global model and on every ``extra[EVAL_MODELS]``.

  Returns:
    ``evaluate``'s figures of the global model, plus each extra model's
    suffixed ``_<name>`` (``accuracy_<name>``, ...).
  """
  out = dict(evaluate(server.params, server.batch_stats))
  extra = server.extra if isinstance(server.extra, dict) else {}
  for name, model in extra.get(EVAL_MODELS, {}).items():
    ev = evaluate(model["params"], model["batch_stats"])
    out.update({f"{k}_{name}": v for k, v in ev.items()})
  return out


def sample_clients(key: jax.Array, num_clients: int, num_sampled: int) -> jax.Array:
  """Sorted client ids sampled without replacement (all clients if S == N)."""
  return cohorts.FixedCohort(num_sampled).draw(key, num_clients)


def gather_cohort(data: ClientData, num_steps: jax.Array,
                  ids: jax.Array) -> Cohort:
  """The sampled clients' rows, on the device.

  Device-resident ``data`` is gathered on the device; NumPy ``data`` (a
  population too large for the device) is gathered on the host and only the
  cohort is copied over. Both give the same values.
  """
  if isinstance(data.x, np.ndarray):
    host_ids = np.asarray(jax.device_get(ids))
    return jax.device_put(Cohort(
        x=data.x[host_ids], y=np.asarray(data.y)[host_ids],
        num_examples=np.asarray(data.num_examples)[host_ids],
        num_steps=np.asarray(jax.device_get(num_steps))[host_ids],
        client_ids=host_ids),
        jax.local_devices()[0])
  return _gather_on_device(data, num_steps, ids)


def record_round(ledger: ledger_lib.Ledger, r: int, s: int,
                 metrics: dict[str, Any], row: dict[str, Any], *,
                 comm: Any, model_size: int, bits_per_param: int,
                 initial_model_as_seed: bool
                 ) -> tuple[ledger_lib.Ledger, dict[str, Any]]:
  """Round ``r``'s traffic into the ledger, its other metrics into ``row``.

  The models' traffic of a cohort of ``s`` (:func:`fedjax_dd.core.ledger.
  fedavg_round_bits`, scaled by the algorithm's ``comm``) is one entry per
  direction of ``s`` one-client messages (FedD3's ``V_t``, Eq. 6). Metrics
  under :data:`TRAFFIC_PREFIX` go to the ledger, not the row. The row gains
  the cumulative and this round's ``bytes_*`` counts.

  Returns:
    ``(ledger, row)``.
  """
  down, up = ledger_lib.fedavg_round_bits(
      model_size, s, r, bits_per_param=bits_per_param,
      initial_model_as_seed=initial_model_as_seed,
      upload_multiplier=comm.upload, download_multiplier=comm.download)
  ledger = ledger.record(r, kind="download", bits=down // s, count=s,
                         tag="model")
  ledger = ledger.record(r, kind="upload", bits=up // s, count=s,
                         tag="model")
  for k, v in metrics.items():
    if k.startswith(TRAFFIC_PREFIX):
      kind, tag = k[len(TRAFFIC_PREFIX):].split("/", 1)
      bits = int(v)
      if bits:
        ledger = ledger.record(r, kind=kind, bits=bits, tag=tag)
    else:
      row[k] = v
  row.update({f"{k}_cumulative": v for k, v in ledger.cumulative().items()
              if k.startswith("bytes_")})
  row.update({f"{k}_round": v for k, v in ledger.round_totals(r).items()
              if k.startswith("bytes_")})
  return ledger, row


def round_cohort(run_key: jax.Array, r: int,
                 sampler: cohorts.CohortSampler, data: ClientData,
                 num_steps: jax.Array) -> tuple[jax.Array, Cohort, jax.Array]:
  """Round ``r``'s cohort as :func:`run_rounds` draws it.

  Args:
    run_key: the run's key (``ExperimentState.key``).
    r: the round, 1-based.
    sampler: the cohort draw (:mod:`fedjax_dd.core.cohorts`).
    data: the population.
    num_steps: ``[N]`` local steps per client.

  Returns:
    ``(ids, cohort, train_key)``: ``[S]`` client ids on the device, their
    :func:`gather_cohort` rows with ``cohort.round = r - 1``, and the
    round's training key.
  """
  sample_key, train_key = keys.sample_and_train(keys.round_key(run_key, r))
  # One device copy of a host (Bernoulli) draw for the loop's three gathers.
  ids = jnp.asarray(sampler.draw(sample_key, data.num_clients))
  cohort = gather_cohort(data, num_steps, ids)
  return ids, cohort.replace(round=jnp.asarray(r - 1, jnp.int32)), train_key


@jax.jit
def _gather_on_device(data: ClientData, num_steps: jax.Array,
                      ids: jax.Array) -> Cohort:
  return Cohort(x=data.x[ids], y=data.y[ids],
                num_examples=data.num_examples[ids], num_steps=num_steps[ids],
                client_ids=ids)


def _gather(tree: PyTree, ids: jax.Array) -> PyTree:
  return tree_map(lambda a: a[ids], tree)


def _scatter(tree: PyTree, ids: jax.Array, values: PyTree) -> PyTree:
  return tree_map(lambda a, v: a.at[ids].set(v), tree, values)


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
    wall: loop_lib.WallClock | None = None,
    personal: Callable[[ExperimentState], dict[str, Any]] | None = None,
) -> tuple[ExperimentState, ledger_lib.Ledger, list[dict[str, Any]]]:
  """Runs rounds ``state.round + 1 .. options.num_rounds`` (or fewer, see
  ``options.max_seconds``) through :func:`fedjax_dd.core.loop.run_loop`.

  Args:
    algorithm: the federated algorithm.
    state: the state after ``state.round`` completed rounds.
    data: all clients' padded data ``[N, N_max, ...]``, on the device or in
      host memory (:func:`gather_cohort`).
    num_steps: ``[N]`` active local steps per client.
    options: loop options.
    evaluate: ``(params, batch_stats) -> {"accuracy", "loss"}`` on the test
      split.
    ledger: the communication ledger so far.
    writer: appends one JSON row per round.
    store: checkpoint store; the whole state plus the ledger is saved.
    on_round: optional callback after each round.
    wall: the run's wall clock; each checkpoint records its total.
    personal: ``state -> {"personal_accuracy", ...}`` on the evaluated
      rounds too (:func:`fedjax_dd.core.personal.personal_evaluation`).

  Returns:
    ``(state, ledger, rows)``: final state, ledger and the rows written.
  """
  n = data.num_clients
  # Bad step counts would train on padding: checked before compiling.
  validate.client_fields(data.x, data.y, data.num_examples, fetch=True)
  validate.step_counts("num_steps", num_steps,
                       tuple(np.shape(data.num_examples)), fetch=True)
  sampler = cohorts.as_sampler(options.clients_per_round)
  sampler.validate(n)
  ledger = ledger if ledger is not None else ledger_lib.Ledger()
  model_size = ledger_lib.num_params(state.server.params)
  # One layout for every round, so that round 2's gathers do not recompile.
  state = as_restored(jax.device_put(state, jax.local_devices()[0]))

  def step(carry, r):
    state, ledger = carry
    ids, cohort, train_key = round_cohort(state.key, r, sampler, data,
                                          num_steps)
    s = int(ids.shape[0])
    server, client_slice, metrics = algorithm.apply(
        state.server, _gather(state.clients, ids), cohort, train_key)
    clients = _scatter(state.clients, ids, client_slice)
    # The next round sees the state as a resume restores it (as_restored).
    state = as_restored(ExperimentState(
        server=server, clients=clients, key=state.key,
        round=jnp.asarray(r, jnp.int32)))
    ledger, row = record_round(
        ledger, r, s, metrics, {} if sampler.fixed else {"cohort_size": s},
        comm=algorithm.comm, model_size=model_size,
        bits_per_param=options.bits_per_param,
        initial_model_as_seed=options.initial_model_as_seed)
    return (state, ledger), row

  def save(r, carry, force):
    state, ledger = carry
    if store is None:
      return False
    meta = {"ledger": ledger.to_dict()}
    if wall is not None:
      meta["wall_seconds_total"] = wall.total()
    return store.save(r, state, meta, force=force)

  result = loop_lib.run_loop(
      step, (state, ledger),
      loop_lib.LoopOptions(num_steps=options.num_rounds,
                           eval_every=options.eval_every,
                           progress=options.progress,
                           max_seconds=options.max_seconds,
                           clock=options.clock, desc="rounds",
                           stop_on_nonfinite=options.stop_on_nonfinite),
      start=int(state.round), index=lambda r: {"round": r},
      evaluate=_evaluation(evaluate, personal),
      writer=writer, save=save,
      on_step=None if on_round is None else (
          lambda carry, row: on_round(carry[0], row)))
  state, ledger = result.carry
  return state, ledger, result.rows


def _evaluation(evaluate, personal):
  """The loop's ``carry -> figures``: the test split's, then each client's."""
  if evaluate is None:
    if personal is not None:
      raise ValueError("run_rounds: personal= is evaluated beside the test "
                       "split; give evaluate= too.")
    return None

  def run(carry):
    out = evaluate_server(evaluate, carry[0].server)
    if personal is not None:
      out.update(personal(carry[0]))
    return out

  return run


def resume(store: CheckpointStore | None, template: ExperimentState,
           writer: MetricsWriter | None = None,
           wall: loop_lib.WallClock | None = None
           ) -> tuple[ExperimentState, ledger_lib.Ledger] | None:
  """Restores the newest good checkpoint and trims metrics written after it.

  ``wall`` (if given) takes the earlier processes' time from the checkpoint.

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
    loop_lib.check_rows(writer, step)
  if wall is not None:
    wall.resumed_from(meta)
  return state, ledger_lib.Ledger.from_dict(meta["ledger"])


@dataclasses.dataclass
class TrainResult:
  """What :func:`train` returns.

  Attributes:
    state: the final state.
    ledger: the final ledger.
    rows: every row of the run, earlier processes' included.
    out_of_time: the time budget stopped the rounds early.
  """
  state: ExperimentState
  ledger: ledger_lib.Ledger
  rows: list[dict[str, Any]]
  out_of_time: bool


def resume_and_run(
    algorithm: FederatedAlgorithm,
    state: ExperimentState,
    data: ClientData,
    num_steps: jax.Array,
    options: RoundsOptions,
    *,
    writer: MetricsWriter,
    store: CheckpointStore,
    evaluate: Callable[[PyTree, PyTree], dict[str, float]] | None = None,
    ledger: ledger_lib.Ledger | None = None,
    wall: loop_lib.WallClock | None = None,
    personal: Callable[[ExperimentState], dict[str, Any]] | None = None,
) -> TrainResult:
  """Resumes from ``store`` if it holds a checkpoint, then :func:`run_rounds`.

  A fresh run starts from ``state`` and ``ledger`` (traffic before the
  rounds, e.g. a one-shot upload) and clears ``writer``'s rows; a resumed
  run continues from the checkpoint, rows after it dropped. ``store`` is
  closed on return.

  Raises:
    fedjax_dd.core.loop.ResumeRefusedError: the checkpoint has finished more
      rounds than ``options.num_rounds``.
    fedjax_dd.core.metrics.MetricsFileError: ``writer``'s rows do not reach
      the checkpoint (:func:`fedjax_dd.core.loop.check_rows`).
  """
  try:
    resumed = resume(store, state, writer, wall)
    if resumed is not None:
      state, ledger = resumed
      done = int(state.round)
      if done > options.num_rounds:
        # The loop would run nothing and report round `done` as the answer.
        raise loop_lib.ResumeRefusedError(
            f"{store.directory} holds a run that finished {done} rounds; "
            f"{options.num_rounds} were asked for, and its results describe "
            f"{done}. Ask for {done} rounds or more (fit's rounds=, "
            f"--config.rounds) to report or continue it, or use a new "
            f"workdir (--workdir) for {options.num_rounds}.")
    else:
      writer.start_fresh(store)
    state, ledger, _ = run_rounds(algorithm, state, data, num_steps, options,
                                  evaluate=evaluate, ledger=ledger,
                                  writer=writer, store=store, wall=wall,
                                  personal=personal)
  finally:
    store.close()
  return TrainResult(state=state, ledger=ledger, rows=writer.rows(),
                     out_of_time=int(state.round) < options.num_rounds)
