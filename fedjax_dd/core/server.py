"""The driver of server-side methods: clients once per round, then epochs.

:func:`run_server_rounds` runs a
:class:`~fedjax_dd.core.algorithm.ServerDistillation` for ``T`` rounds (one
for the one-shot methods; FedHydra's multi-round variant, Tab. 5, uses more):

::

    round r:  key_r = keys.round_key(run_key, r)
      1. teachers = client_stage(starts, data, train key)    -> r<r>/clients
         (round 1 may reuse another run's clients: ``teachers_from``; a
         SpannedClientStage may train in checkpointed spans of local steps,
         ``client_span_steps``                               -> r<r>/client_spans)
      2. ledger: one model down (r > 1) and one up per client (or each
         client's upload as ``upload_bits`` measures it, e.g. FedD3's data)
      3. setup = setup(teachers, setup key)                  -> r<r>/setup
      4. state = init(epochs key, setup, teachers, global model)
         E × epoch(state, teachers) in core.loop.run_loop    -> r<r>/server
      5. global model = model(state); clients restart from it

Every step is checkpointed, so a run killed anywhere resumes bit-identically:
finished stages are restored, the epoch loop continues from its last
checkpoint, and ``metrics.jsonl`` is trimmed to it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.core import keys
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core import workdir as workdir_lib
from fedjax_dd.core.algorithm import ServerDistillation, SpannedClientStage
from fedjax_dd.core.algorithm import Teachers
from fedjax_dd.core.checkpoint import COMMIT_MARKER, CheckpointStore, as_restored
from fedjax_dd.core.metrics import MetricsWriter
from fedjax_dd.core.stage_cache import StageCache, fingerprint_differences
from fedjax_dd.data.stacked import ClientData

PyTree = Any
Evaluate = Callable[[PyTree, PyTree], dict[str, float]]


@dataclasses.dataclass(frozen=True)
class ServerOptions:
  """Options of :func:`run_server_rounds`.

  Attributes:
    num_rounds: ``T`` (1: one-shot).
    num_epochs: server epochs per round (0: none, e.g. one-shot FedAvg).
    eval_every: evaluate every this many epochs and at the last.
    checkpoint_every: save the server state every this many epochs (and at
      the last).
    progress: report the client stage, the setup and each epoch on stderr
      (:func:`fedjax_dd.core.loop.progress_bar`).
    max_seconds: wall-clock budget of the call (0: none), as
      :class:`fedjax_dd.core.loop.LoopOptions`'.
    initial_model_as_seed: round 1's download is not counted (clients
      regenerate the initial model from a shared seed).
    server_seed: ``>= 0`` draws the server stages' keys from this seed
      instead of the round key (repeat the server over fixed clients).
    teachers_from: a workdir whose round-1 client models are reused; its
      ``protocol`` must match ours (:func:`protocol_differences`).
    protocol: a string (or JSON object) naming everything that determines
      the client models, checked against ``teachers_from``.
    stop_on_nonfinite: stop with :class:`fedjax_dd.core.loop.NonFiniteError`
      at the first epoch whose metrics are not finite.
    setup_fingerprint: the settings that determine ``setup`` besides the
      clients (a JSON dict); a cached setup with another one is refused.
    client_span_steps: ``> 0`` with a
      :class:`~fedjax_dd.core.algorithm.SpannedClientStage`: the clients
      train in checkpointed spans of this many local steps
      (``r<r>/client_spans``), with ``max_seconds`` checked after each; the
      models equal those of one call. ``0``: one call.
  """
  num_rounds: int = 1
  num_epochs: int = 1
  eval_every: int = 1
  checkpoint_every: int = 1
  progress: bool = True
  max_seconds: float = 0.0
  initial_model_as_seed: bool = True
  server_seed: int = -1
  teachers_from: str | None = None
  protocol: str = ""
  stop_on_nonfinite: bool = True
  setup_fingerprint: dict[str, Any] = dataclasses.field(default_factory=dict)
  client_span_steps: int = 0

  def __post_init__(self):
    if self.client_span_steps < 0:
      raise ValueError("client_span_steps must be >= 0 (0: one call), got "
                       f"{self.client_span_steps}.")


@dataclasses.dataclass
class ServerResult:
  """What :func:`run_server_rounds` returns (host values).

  Attributes:
    params, batch_stats: the global model after the last round run.
    state: the last round's server state.
    setup: the last round's setup.
    teachers: the last round's client models (or uploads, for a method
      with ``upload_template``).
    ledger: the communication ledger.
    per_round: per round: ``round``, ``test_accuracy`` and what
      ``on_clients`` returned.
    rounds: rounds completed.
    out_of_time: the budget stopped the run early.
    client_steps: ``(done, total)`` local steps of a client stage the
      budget stopped; ``None`` otherwise.
    seconds: wall time per stage (``client``, ``setup``, ``server``) spent
      in this call (restored stages count 0).
  """
  params: PyTree
  batch_stats: PyTree
  state: PyTree
  setup: dict[str, Any]
  teachers: Teachers
  ledger: ledger_lib.Ledger
  per_round: list[dict[str, Any]]
  rounds: int
  out_of_time: bool
  seconds: dict[str, float]
  client_steps: tuple[int, int] | None = None


def protocol_differences(theirs: Any, ours: str) -> list[str]:
  """How a ``teachers_from`` run's client protocol differs from ours.

  Two JSON objects are compared field by field as stage fingerprints are
  (:func:`~fedjax_dd.core.stage_cache.fingerprint_differences`); anything
  else as a whole string.

  Returns:
    The differing fields (or both strings), empty when they match.
  """
  try:
    a, b = json.loads(theirs), json.loads(ours)
  except (TypeError, ValueError):
    a = b = None
  if isinstance(a, dict) and isinstance(b, dict):
    return fingerprint_differences(a, b, names=("theirs", "ours"))
  return [] if theirs == ours else [f"theirs: {theirs!r}, ours: {ours!r}"]


def _teachers_template(starts, sizes, num_examples) -> Teachers:
  stack = lambda tree, m: jax.tree_util.tree_map(
      lambda a: jax.ShapeDtypeStruct((m, *a.shape), a.dtype), tree)
  return Teachers(vars=tuple((stack(p, m), stack(s, m))
                             for (p, s), m in zip(starts, sizes)),
                  num_examples=jax.ShapeDtypeStruct(num_examples.shape,
                                                    num_examples.dtype))


def _train_in_spans(stage: SpannedClientStage, directory: str, starts, data,
                    train_key, span: int, deadline: float | None
                    ) -> tuple[Teachers | None, int]:
  """Trains ``stage`` span by span, checkpointing its progress after each.

  Returns:
    ``(teachers, steps_done)``; ``teachers`` is ``None`` when ``deadline``
    (a ``time.monotonic`` value) passed before the last span (each run
    makes at least one span).
  """
  total = stage.total_steps
  with CheckpointStore(directory, max_to_keep=1) as store:
    restored = store.restore(jax.eval_shape(stage.begin, starts, data))
    if restored is not None:
      done, progress = restored[0], restored[1]
    else:
      done, progress = 0, stage.begin(starts, data)
    while done < total:
      stop = min(done + span, total)
      # One layout for trained and restored progress (as in ``_clients``).
      progress = as_restored(jax.device_put(
          stage.advance(progress, data, train_key, done, stop),
          jax.devices()[0]))
      store.save(stop, progress, {"total_steps": total}, force=True)
      done = stop
      # As the epoch loop: stop after the first span past the budget.
      if (done < total and deadline is not None
          and time.monotonic() > deadline):
        return None, done
  return stage.finish(progress, data), done


class TeachersFromError(ValueError):
  """``teachers_from`` names no usable client stage of another run."""


def check_teachers_from(path: str) -> None:
  """Refuses a ``teachers_from`` without a committed round-1 client
  checkpoint (``PATH/r1/clients/<step>``) before a store creates anything
  in it.

  Raises:
    TeachersFromError: one line naming the path and the fix.
  """
  clients = os.path.join(path, "r1", "clients")
  if not os.path.isdir(path):
    raise TeachersFromError(
        f"teachers_from={path!r} is not a directory; name the workdir of a "
        "run whose client stage finished (it holds r1/clients/).")
  if not os.path.isdir(clients) or not any(
      os.path.isfile(os.path.join(clients, n, COMMIT_MARKER))
      for n in os.listdir(clients) if n.isdigit()):
    raise TeachersFromError(
        f"teachers_from={path!r} holds no committed round-1 client "
        f"checkpoint ({clients}/<step>); name the workdir of a run whose "
        "client stage finished (e.g. a --config.method=os_fedavg run).")


def _clients(algorithm, directory, r, starts, sizes, data, train_key,
             options, deadline=None) -> tuple[Teachers | None, bool, int]:
  """Round ``r``'s client models: restored, reused, or trained and saved.

  Returns:
    ``(teachers, trained_here, steps_done)``; ``teachers`` is ``None`` when
    the budget stopped a client stage run in spans (``steps_done`` of
    ``algorithm.client_stage.total_steps``).
  """
  template = (_teachers_template(starts, sizes, data.num_examples)
              if algorithm.upload_template is None
              else algorithm.upload_template(starts, sizes, data))
  spans = os.path.join(directory, f"r{r}", "client_spans")
  done = 0
  with CheckpointStore(os.path.join(directory, f"r{r}", "clients"),
                       max_to_keep=1) as store:
    restored = store.restore(template)
    if restored is not None:
      return restored[1], False, 0
    if r == 1 and options.teachers_from:
      check_teachers_from(options.teachers_from)
      with CheckpointStore(os.path.join(options.teachers_from, "r1", "clients"),
                           max_to_keep=1) as other:
        theirs = other.restore(template)
      if theirs is None:
        raise TeachersFromError(
            f"teachers_from={options.teachers_from!r} holds no round-1 client "
            "checkpoint that restores (each was damaged or cut); train the "
            "clients again in that workdir, or name another.")
      diffs = protocol_differences(theirs[2].get("protocol"),
                                   options.protocol)
      if diffs:
        raise TeachersFromError(
            f"teachers_from={options.teachers_from!r} was trained under "
            "another client protocol; differing: " + "; ".join(diffs) +
            ". Use clients trained with these settings, or drop "
            "teachers_from.")
      teachers, trained = theirs[1], False
    else:
      # One layout whether trained or restored (as_restored), so a resume
      # compiles the same server programs.
      stage = algorithm.client_stage
      if (isinstance(stage, SpannedClientStage)
          and options.client_span_steps > 0):
        teachers, done = _train_in_spans(stage, spans, starts, data,
                                         train_key, options.client_span_steps,
                                         deadline)
        if teachers is None:
          return None, True, done
      else:
        teachers = stage(starts, data, train_key)
      teachers = as_restored(jax.device_put(teachers, jax.devices()[0]))
      jax.block_until_ready(teachers)
      trained = True
    store.save(r, teachers, {"protocol": options.protocol}, force=True)
    if trained and os.path.isdir(spans):
      # The finished models are saved; their partial progress is not needed.
      shutil.rmtree(spans)
  return teachers, trained, done


def _setup(algorithm, directory, r, teachers, key, options
           ) -> tuple[dict[str, Any], bool]:
  """Round ``r``'s setup, from the stage cache when the fingerprint matches.

  Kept in the fingerprinted :class:`~fedjax_dd.core.stage_cache.StageCache`
  (entry ``r<r>/setup``); one computed under another fingerprint is refused.

  Returns:
    ``(setup, computed_here)``.
  """
  cache = StageCache(os.path.join(directory, f"r{r}"))
  hit = cache.load("setup", options.setup_fingerprint)
  if hit is not None:
    return {k: jnp.asarray(v) for k, v in hit.arrays.items()}, False
  setup = as_restored(algorithm.setup(teachers, key))
  if setup:  # Nothing to cache for a method without a setup.
    cache.save("setup", options.setup_fingerprint, jax.device_get(setup),
               {"round": r})
  return setup, True


def _stage_bar(desc: str, show: bool):
  """The progress of a stage that runs as one long program (the clients'
  training, the setup): a line when it starts and one when it ends."""
  bar = loop_lib.progress_bar(1, desc, show=show)
  loop_lib.report(bar, 0)
  return bar


def run_server_rounds(
    algorithm: ServerDistillation,
    data: ClientData,
    *,
    run_key: jax.Array,
    initial_models: Sequence[tuple[PyTree, PyTree]],
    global_model: tuple[PyTree, PyTree],
    group_sizes: Sequence[int],
    options: ServerOptions,
    directory: str,
    evaluate: Evaluate,
    writer: MetricsWriter | None = None,
    on_clients: Callable[[int, Teachers], dict[str, Any]] | None = None,
    wall: loop_lib.WallClock | None = None,
) -> ServerResult:
  """Runs ``options.num_rounds`` rounds of ``algorithm`` (see module doc).

  Args:
    algorithm: the method.
    data: every client's padded data ``[m, N_max, ...]``.
    run_key: the rounds' key (:func:`keys.init_and_run`).
    initial_models: round 1's start, per architecture group.
    global_model: ``(params, batch_stats)`` the server state starts from in
      round 1 (the student's initialisation).
    group_sizes: clients per group (group order).
    options: see :class:`ServerOptions`.
    directory: where the round checkpoints go (``r<r>/...``).
    evaluate: ``(params, batch_stats) -> {"accuracy", "loss"}``.
    writer: one row per evaluated epoch; ``step`` counts epochs over rounds.
    on_clients: ``(r, teachers) -> dict`` for the round's record (e.g.
      client accuracies).
    wall: the run's wall clock (:class:`fedjax_dd.core.loop.WallClock`).

  Returns:
    A :class:`ServerResult`.

  Raises:
    ValueError: ``num_rounds > 1`` with several architecture groups (the
      global model cannot seed other architectures).
  """
  if options.num_rounds > 1 and len(initial_models) != 1:
    raise ValueError(
        "Several rounds need homogeneous clients: the distilled global model "
        f"cannot seed {len(initial_models)} client architectures.")
  t_start = time.monotonic()
  # A resume on other devices or another jax: warned, not refused.
  workdir_lib.record_environment(directory)
  bits = [ledger_lib.model_bits(p) for p, _ in initial_models]
  ledger = ledger_lib.Ledger()
  seconds = {"client": 0.0, "setup": 0.0, "server": 0.0}
  per_round: list[dict[str, Any]] = []
  starts = tuple(initial_models)
  params, batch_stats = global_model
  state, setup, teachers = None, {}, None
  out_of_time = False
  client_steps = None
  deadline = t_start + options.max_seconds if options.max_seconds else None
  e_total = options.num_epochs
  r_done = 0
  for r in range(1, options.num_rounds + 1):
    round_key = keys.round_key(run_key, r)
    _, train_key = keys.sample_and_train(round_key)
    server_key = (keys.server_seed_key(options.server_seed, r)
                  if options.server_seed >= 0 else keys.server_key(round_key))
    setup_key, epochs_key = keys.server_parts(server_key)
    if r > 1:  # The clients restart from the global model.
      starts = ((params, batch_stats),)
    if r > 1 or not options.initial_model_as_seed:
      for b, m in zip(bits, group_sizes):
        ledger = ledger.record(r, kind="download", bits=b, count=m, tag="model")

    label = f"round {r} " if options.num_rounds > 1 else ""
    bar = _stage_bar(f"{label}clients", options.progress)
    t0 = time.monotonic()
    teachers, trained, done = _clients(algorithm, directory, r, starts,
                                       group_sizes, data, train_key, options,
                                       deadline)
    loop_lib.report(bar)
    bar.close()
    if trained:
      seconds["client"] += time.monotonic() - t0
    if teachers is None:  # The budget ran out inside the client stage.
      out_of_time = True
      client_steps = (done, algorithm.client_stage.total_steps)
      break
    if algorithm.upload_bits is None:
      for b, m in zip(bits, group_sizes):
        ledger = ledger.record(r, kind="upload", bits=b, count=m, tag="model")
    else:  # One message per client, so the ledger knows each one (GCE).
      tag, client_bits = algorithm.upload_bits(teachers)
      ledger = ledger.record_messages(r, kind="upload", tag=tag,
                                      bits=np.asarray(client_bits))
    record = {"round": r}
    if on_clients is not None:
      record.update(on_clients(r, teachers))

    bar = _stage_bar(f"{label}server setup", options.progress)
    t0 = time.monotonic()
    setup, computed = _setup(algorithm, directory, r, teachers, setup_key,
                             options)
    loop_lib.report(bar)
    bar.close()
    if computed:
      seconds["setup"] += time.monotonic() - t0

    state = as_restored(jax.device_put(
        algorithm.init(epochs_key, setup, teachers, params, batch_stats),
        jax.devices()[0]))
    offset = (r - 1) * e_total
    with CheckpointStore(os.path.join(directory, f"r{r}", "server"),
                         max_to_keep=2,
                         save_every=options.checkpoint_every) as store:
      restored = store.restore(state)
      start = 0
      if restored is not None:
        start, state = restored[0], restored[1]
        if wall is not None:
          wall.resumed_from(restored[2])

      def meta(r=r):
        out = {"round": r}
        if wall is not None:
          out["wall_seconds_total"] = wall.total()
        return out

      if writer is not None:
        # Rows past the checkpoint are dropped only in an unfinished round;
        # a finished round's later rows belong to a later round.
        if e_total == 0:
          if restored is None and r == 1:
            writer.start_fresh(store)
          elif restored is None:
            writer.truncate_after(r - 1, key="step")
        elif start == 0 and r == 1:
          writer.start_fresh(store)
        elif start < e_total:
          writer.truncate_after(offset + start, key="step")
        if e_total:  # Every step up to the checkpoint wrote its row.
          loop_lib.check_rows(writer, offset + start, key="step")
      budget = 0.0
      if options.max_seconds:
        budget = max(options.max_seconds - (time.monotonic() - t_start), 1e-6)
      t0 = time.monotonic()
      # Set when an evaluation of the final model already gave it.
      final_accuracy = None
      if e_total == 0:
        # Nothing to iterate: one row for the round's model.
        ev = evaluate(*algorithm.model(state))
        final_accuracy = ev["accuracy"]
        if writer is not None and start == 0:
          writer.write({"step": r, "round": r, "epoch": 0,
                        "test_accuracy": ev["accuracy"],
                        "test_loss": ev["loss"]})
        if restored is None:
          store.save(0, state, meta(), force=True)
      else:
        result = loop_lib.run_loop(
            lambda st, e: algorithm.epoch(st, teachers), state,
            loop_lib.LoopOptions(num_steps=e_total,
                                 eval_every=options.eval_every,
                                 progress=options.progress,
                                 max_seconds=budget,
                                 desc=f"{label}epochs",
                                 stop_on_nonfinite=options.stop_on_nonfinite),
            start=start,
            index=lambda e, r=r, offset=offset: {"step": offset + e,
                                                 "round": r, "epoch": e},
            evaluate=lambda st: evaluate(*algorithm.model(st)),
            writer=writer,
            save=lambda e, st, force, store=store: store.save(
                e, st, meta(), force=force))
        state = result.carry
        out_of_time = result.out_of_time
        if result.rows:  # The last row ran evaluate on the final state.
          final_accuracy = result.rows[-1].get("test_accuracy")
      seconds["server"] += time.monotonic() - t0
    params, batch_stats = algorithm.model(state)
    if final_accuracy is None:  # Restored finished: nothing evaluated yet.
      final_accuracy = evaluate(params, batch_stats)["accuracy"]
    record["test_accuracy"] = final_accuracy
    per_round.append(record)
    r_done = r
    if out_of_time:
      break
  host_setup = jax.device_get(setup)
  return ServerResult(params=params, batch_stats=batch_stats, state=state,
                      setup={k: np.asarray(v) for k, v in host_setup.items()},
                      teachers=teachers, ledger=ledger, per_round=per_round,
                      rounds=r_done, out_of_time=out_of_time, seconds=seconds,
                      client_steps=client_steps)
