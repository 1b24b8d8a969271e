"""A run axis ``[R, ...]`` above the client axis: R runs as one program.

:func:`fit_runs` runs a seed sweep (or a grid of traceable hyperparameters)
side by side rather than as R processes, each compiling the same round
program and too small to fill an accelerator. Every leaf of the
:class:`~fedjax_dd.core.algorithm.ExperimentState` gains a leading run axis
(server ``[R, ...]``, client states ``[R, C, ...]``, keys ``[R, 2]``,
rounds ``[R]``), and one round of all R runs is ONE jitted program: a
``jax.vmap`` over the runs around the algorithm's unchanged ``apply``,
inside which the client mapper vectorises the client axis in place
(:mod:`fedjax_dd.core.clients`). The test evaluation is one program too
(:func:`fedjax_dd.core.evaluate.make_run_evaluator`), split as the round
is. Where ``[R, S, ...]`` does not fit in memory, or where the platform's
policy says so (on CPU a vmap over runs x clients leaves the cache, so the
runs go one after another inside the program), ``run_chunk_size=k`` maps
the runs in chunks of ``k`` (:func:`_map_runs`); the layout stays
``[R, ...]``.

What each run keeps of its own, exactly as :func:`fedjax_dd.fit` derives
it (:mod:`fedjax_dd.core.keys`):

* its seed: initial model, the rounds' key, hence its cohorts and batches;
* its clients: one ``ClientData`` per run when the partition depends on the
  seed, stacked to ``[R, C, N_max, H, W, Ch]`` (:func:`stack_client_data`),
  or one shared stack;
* traced hyperparameters (``hparams``: learning rates, FedProx's ``mu``,
  FedDyn's ``alpha``, ...), which the algorithm builder receives as per-run
  tracers and hands to the algorithm's factory as scalars (a factory checks
  only concrete values, :func:`fedjax_dd.core.checks.check_scalar`).

Settings that change shapes or Python control flow (model, cohort size,
number of clusters, local batch size) are separate programs: separate calls.

An algorithm whose ``apply`` needs concrete values (CFL's and DisUE's NumPy
clustering, a Bernoulli cohort's host draw) is refused before anything is
written (:class:`RunAxisError`).

Checkpoints hold the ``[R, ...]`` state as ONE unit (``WORKDIR/checkpoints``)
with the R ledgers in its meta; each run writes its rows to
``WORKDIR/<name>/metrics.jsonl`` (``seed_<S>`` by default, the layout
``fedjax-dd-sweep`` reads), and a killed sweep resumes all R runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import sys
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd import policy
from fedjax_dd.core import checks
from fedjax_dd.core import clients as clients_lib
from fedjax_dd.core import cohorts
from fedjax_dd.core import definition as definition_lib
from fedjax_dd.core import fit as fit_lib
from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core import workdir as workdir_lib
from fedjax_dd.core.algorithm import Cohort, ExperimentState, FederatedAlgorithm
from fedjax_dd.core.checkpoint import CheckpointStore, as_restored
from fedjax_dd.core.evaluate import make_run_evaluator
from fedjax_dd.core.local import effective_batch_size
from fedjax_dd.core.prepare import Prepared
from fedjax_dd.data import validate
from fedjax_dd.data.stacked import ClientData

PyTree = Any
tree_map = jax.tree_util.tree_map
_log = logging.getLogger(__name__)

# ``build(seed, hparams) -> FederatedAlgorithm``: called per run with
# concrete values (``init``), and once in the round program with run 0's
# seed and traced ``hparams`` (``apply``).
Builder = Callable[[int, Mapping[str, Any]], FederatedAlgorithm]

CHECKPOINTS = "checkpoints"
"""The store of the ``[R, ...]`` state under the sweep's workdir."""

# Errors JAX raises when traced code asks for a concrete value: host logic
# (NumPy, Python branches on arrays) in an algorithm's apply.
_HOST_LOGIC_ERRORS = (jax.errors.ConcretizationTypeError,
                      jax.errors.TracerArrayConversionError,
                      jax.errors.TracerBoolConversionError,
                      jax.errors.TracerIntegerConversionError)

# Keys of the composite rows run_loop sees: run i's metric k is "run<i>.k",
# its evaluated figures "test_run<i>.k"; split_row gives each run its own.
_RUN_KEY = re.compile(r"^(test_)?run(\d+)\.(.+)$")


class RunAxisError(ValueError):
  """The runs cannot share one program (host logic in ``apply``, a cohort
  of varying size, runs of other shapes); one line naming why and the fix."""


@dataclasses.dataclass
class RunsResult:
  """What :func:`fit_runs` returns.

  Attributes:
    names: each run's directory name under the workdir.
    state: the final ``[R, ...]`` state (every leaf with the run axis).
    ledgers: each run's final ledger.
    rows: each run's rows (earlier processes' included on a resume).
    out_of_time: the time budget stopped the rounds early.
  """
  names: list[str]
  state: ExperimentState
  ledgers: list[ledger_lib.Ledger]
  rows: list[list[dict[str, Any]]]
  out_of_time: bool

  def run_state(self, i: int) -> ExperimentState:
    """Run ``i``'s state, as :func:`fedjax_dd.fit` would return it."""
    return take_run(self.state, i)


def take_run(tree: PyTree, i: int) -> PyTree:
  """Run ``i``'s slice of a ``[R, ...]`` pytree."""
  return tree_map(lambda a: a[i], tree)


def stack_runs(trees: Sequence[PyTree]) -> PyTree:
  """R pytrees of one structure stacked on a new leading run axis."""
  return tree_map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]),
                  *trees)


def stack_client_data(datas: Sequence[ClientData]) -> ClientData:
  """R client stacks ``[C, N_r, ...]`` as one ``[R, C, N_max, ...]``.

  The zero rows added lie past every client's ``num_examples``, which no
  batch draws (:func:`fedjax_dd.data.stacked.sample_batch`).

  Raises:
    RunAxisError: the runs differ in client count or image shape.
  """
  first = datas[0]
  for i, d in enumerate(datas):
    if d.num_clients != first.num_clients or d.x.shape[2:] != first.x.shape[2:]:
      raise RunAxisError(
          f"fit_runs: run {i}'s clients are {tuple(d.x.shape)}, run 0's "
          f"{tuple(first.x.shape)}; runs on one axis need the same client "
          "count and image shape (only N_max may differ). Run them in "
          "separate calls.")
  n_max = max(int(d.x.shape[1]) for d in datas)

  def pad(a):
    a = np.asarray(jax.device_get(a))
    width = [(0, 0)] * a.ndim
    width[1] = (0, n_max - a.shape[1])
    return np.pad(a, width)

  return ClientData(
      x=jnp.asarray(np.stack([pad(d.x) for d in datas])),
      y=jnp.asarray(np.stack([pad(d.y) for d in datas])),
      num_examples=jnp.asarray(np.stack(
          [np.asarray(jax.device_get(d.num_examples)) for d in datas])))


def split_row(row: Mapping[str, Any], num_runs: int) -> list[dict[str, Any]]:
  """A composite loop row as R rows, one per run.

  ``round`` goes to every run; ``run<i>.k`` to run ``i`` as ``k`` and
  ``test_run<i>.k`` as ``test_k``; the means over runs (for the progress
  line) are dropped.
  """
  out: list[dict[str, Any]] = [{} for _ in range(num_runs)]
  for k, v in row.items():
    m = _RUN_KEY.match(k)
    if m is not None:
      out[int(m.group(2))][(m.group(1) or "") + m.group(3)] = v
    elif k == "round":
      for r in out:
        r[k] = v
  return out


class _RunWriters:
  """The loop's writer: each composite row split over the runs' writers."""

  def __init__(self, writers):
    self.writers = writers

  def write(self, row: Mapping[str, Any]) -> None:
    for writer, part in zip(self.writers, split_row(row, len(self.writers))):
      writer.write(part)


def _as_list(value, num_runs: int, name: str) -> list[Any]:
  if isinstance(value, (list, tuple)):
    if len(value) != num_runs:
      raise ValueError(f"fit_runs: {name} gives {len(value)} entries for "
                       f"{num_runs} runs (one per seed).")
    return list(value)
  return [value] * num_runs


def _per_run(value, num_runs: int, name: str) -> list[Any]:
  """A list gives one value per run; anything else is every run's."""
  if isinstance(value, list):
    if len(value) != num_runs:
      raise ValueError(f"fit_runs: {name} gives {len(value)} entries for "
                       f"{num_runs} runs (a list is one per run).")
    return value
  return [value] * num_runs


def algorithm_name(algorithm: FederatedAlgorithm) -> str:
  """The algorithm's name for messages: the module that built its apply
  (``fedjax_dd.algorithms.cfl`` -> ``cfl``)."""
  module = getattr(algorithm.apply, "__module__", "") or ""
  return module.rsplit(".", 1)[-1] or getattr(
      algorithm.apply, "__qualname__", "the algorithm")


def check_run_chunk_size(run_chunk_size: int | str | None) -> int | None:
  """``run_chunk_size`` if None or a whole number >= 1, the policy's
  (:data:`fedjax_dd.policy.TABLE`, ``run_chunk_size``) if ``"auto"``; one
  line if neither."""
  if run_chunk_size is None:
    return None
  if isinstance(run_chunk_size, str) and run_chunk_size == "auto":
    return policy.lookup().run_chunk_size
  return checks.check_whole(
      "fit_runs: run_chunk_size", run_chunk_size, 1,
      fix=("give the runs per chunk, None for one vmap of all runs, or "
           "'auto' for the platform's policy"))


def run_chunks(num_runs: int, run_chunk_size: int | None) -> int | None:
  """The chunk the round program maps the runs in: None (one vmap of all
  R) when unset or when one chunk holds every run."""
  if run_chunk_size is None or run_chunk_size >= num_runs:
    return None
  return run_chunk_size


def split_line(num_runs: int, chunk: int | None) -> str:
  """How the round program splits the runs, in one line."""
  if chunk is None:
    return f"run axis: {num_runs} runs in one vmap per round"
  count = -(-num_runs // chunk)
  pad = count * chunk - num_runs
  return (f"run axis: {num_runs} runs in chunks of {chunk} ({count} chunks "
          "in sequence per round, one program" +
          (f"; the last chunk padded with {pad} "
           f"{'copy' if pad == 1 else 'copies'} of the last run)"
           if pad else ")"))


def _map_runs(fn: Callable[..., Any], axes: tuple[int | None, ...],
              chunk: int | None) -> Callable[..., Any]:
  """``fn`` over the leading run axis: one vmap, or ``lax.map`` over
  chunks of ``chunk`` runs, as
  :func:`fedjax_dd.core.clients.map_leading_axis` does for clients."""
  return clients_lib.map_leading_axis(fn, axes, chunk)


def round_program(apply_algorithm: Callable[[Mapping[str, Any]],
                                            FederatedAlgorithm],
                  sampler: cohorts.CohortSampler, num_clients: int, *,
                  shared_data: bool,
                  run_chunk: int | None = None) -> Callable[..., Any]:
  """One round of R runs as one jitted program.

  Per run it is :func:`fedjax_dd.core.rounds.run_rounds`' round: the same
  keys and cohort, ``apply`` on the gathered client states, scattered back.

  Args:
    apply_algorithm: ``hparams -> FederatedAlgorithm`` whose ``apply`` runs
      (``hparams``: the run's traced values).
    sampler: a fixed-size cohort draw.
    num_clients: ``C``.
    shared_data: the clients' data is one ``[C, N_max, ...]`` stack for all
      runs (broadcast) rather than ``[R, C, N_max, ...]``.
    run_chunk: runs vectorised together (:func:`_map_runs`), chunks in
      sequence to bound peak memory; None: one vmap of all R.

  Returns:
    ``program(server [R], clients [R, C], keys [R], x, y, num_examples,
    num_steps [R, C], hparams {k: [R]}, r) -> (server [R], clients [R, C],
    metrics {k: [R]})`` with ``r`` the 1-based round, an int32 scalar.
  """

  def one_run(server, clients, key, x, y, n, steps, hparams, r):
    algorithm = apply_algorithm(hparams)
    sample_key, train_key = keys_lib.sample_and_train(
        keys_lib.round_key(key, r))
    ids = jnp.asarray(sampler.draw(sample_key, num_clients))
    cohort = Cohort(x=x[ids], y=y[ids], num_examples=n[ids],
                    num_steps=steps[ids], client_ids=ids,
                    round=jnp.asarray(r - 1, jnp.int32))
    part = tree_map(lambda a: a[ids], clients)
    server, part, metrics = algorithm.apply(server, part, cohort, train_key)
    clients = tree_map(lambda a, v: a.at[ids].set(v), clients, part)
    return server, clients, metrics

  data_axis = None if shared_data else 0
  return jax.jit(_map_runs(
      one_run, (0, 0, 0, data_axis, data_axis, data_axis, 0, 0, None),
      run_chunk))


def sweep_definition(names: Sequence[str],
                     hparams: Mapping[str, Sequence[float]],
                     records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  """What defines a :func:`fit_runs` sweep, as ``{name: JSON value}``: the
  runs' names, the traced hyperparameters' values and each run's
  :func:`fedjax_dd.core.fit.run_definition` (``records``) under
  ``<name>.``."""
  definition: dict[str, Any] = {"runs": list(names)}
  for k, values in sorted(hparams.items()):
    definition[f"hparams.{k}"] = [float(v) for v in values]
  for name, record in zip(names, records):
    definition.update({f"{name}.{k}": v for k, v in record.items()})
  return definition


def fit_runs(algorithm: FederatedAlgorithm | Builder,
             prepared: Prepared,
             datas: ClientData | Sequence[ClientData],
             num_steps: jax.Array | Sequence[jax.Array],
             *,
             seeds: Sequence[int],
             rounds: int,
             clients_per_round: int | cohorts.CohortSampler,
             workdir: str | os.PathLike | None = None,
             hparams: Mapping[str, Sequence[float]] | None = None,
             names: Sequence[str] | None = None,
             eval_every: int = 1,
             checkpoint_every: int = 1,
             keep_checkpoints: int | None = 2,
             max_seconds: float = 0.0,
             progress: bool = True,
             class_accuracy: bool = False,
             stop_on_nonfinite: bool = True,
             initial_model_as_seed: bool = True,
             initial_model: tuple[PyTree, PyTree] | list[tuple[PyTree, PyTree]]
             | None = None,
             ledger: ledger_lib.Ledger | Sequence[ledger_lib.Ledger] | None
             = None,
             run_key: jax.Array | list[jax.Array] | None = None,
             tensorboard: bool = False,
             personal: Callable[[ExperimentState], dict[str, Any]] | None
             = None,
             wall: loop_lib.WallClock | None = None,
             definition: dict[str, Any] | None = None,
             name: str | None = None,
             run_chunk_size: int | str | None = "auto") -> RunsResult:
  """Runs (or resumes) R runs of a rounds algorithm on one run axis.

  Each run computes what :func:`fedjax_dd.fit` computes for its seed, data
  and hyperparameters (up to the batched program's rounding)::

    result = fedjax_dd.fit_runs(algo, prepared, [data0, data1, data2],
                                [steps0, steps1, steps2], seeds=[0, 1, 2],
                                rounds=30, clients_per_round=10,
                                workdir="runs/fedavg_sweep")
    result.rows[2][-1]["test_accuracy"]    # seed 2's last row

  Args:
    algorithm: a :class:`FederatedAlgorithm` for every run, or a builder
      ``build(seed, hparams)`` (``Builder``); ``apply`` may depend on the
      seed only through ``init``.
    prepared: the task and its dataset (one test split for all runs).
    datas: the clients' padded data ``[C, N_max, ...]``: one for all runs,
      or one per run.
    num_steps: ``[C]`` local steps per client: one, or one per run.
    seeds: the R model seeds.
    rounds: total rounds; a resumed sweep continues to this.
    clients_per_round: a fixed cohort size ``S`` (a Bernoulli cohort's
      size varies per run and round: refused).
    workdir: the sweep's directory; None: a temporary one, removed on
      return.
    hparams: ``{name: [R values]}`` handed to ``build`` per run, traced in
      the round program (e.g. ``{"client.lr": [0.01, 0.1]}``); builder only.
    names: each run's directory name (default ``seed_<S>``), distinct.
    eval_every, checkpoint_every, keep_checkpoints, max_seconds, progress,
      class_accuracy, stop_on_nonfinite, initial_model_as_seed, wall: as
      :func:`fedjax_dd.fit`, acting on all runs together (one diverging run
      stops the sweep).
    initial_model, ledger, run_key: as :func:`fedjax_dd.fit`'s, one for
      every run or a list of one per run.
    tensorboard: also write each run's metrics as TensorBoard scalars.
    personal: refused unless None (not on the run axis).
    definition: what defines the sweep, recorded in ``config.json``;
      default :func:`sweep_definition`.
    name: the algorithm's name in a refusal (default
      :func:`algorithm_name`, the module of its ``apply``).
    run_chunk_size: runs vectorised together in the round program, to
      bound its memory; the split is said in one line (stderr with
      ``progress``, else INFO). Speed and memory only: the layout stays
      ``[R, ...]``, so a sweep may resume with another value. None (or
      >= R): one vmap of all R runs. ``"auto"``: the platform's
      :data:`fedjax_dd.policy.TABLE` row (CPU: 1, the runs in sequence,
      each run's clients mapped as a run alone; GPU and TPU: None).

  Returns:
    :class:`RunsResult`.

  Raises:
    RunAxisError: the algorithm's ``apply`` is not vmappable (host logic),
      the cohort's size varies, the runs' data differ in shape,
      ``personal`` is given, or the clients are grouped (FedSeq's layout).
    ValueError: as :func:`fedjax_dd.fit`, per run.
  """
  if personal is not None:
    raise RunAxisError(
        "fit_runs: personal= (personalized evaluation on each client's own "
        "test data) is not on the run axis; run the seeds separately "
        "(fedjax_dd.fit per seed).")
  seeds = [keys_lib.check_seed(s) for s in seeds]
  r_count = len(seeds)
  if r_count < 1:
    raise ValueError("fit_runs: give at least one seed.")
  names = ([f"seed_{s}" for s in seeds] if names is None else
           [str(n) for n in names])
  if len(names) != r_count or len(set(names)) != r_count:
    raise ValueError(f"fit_runs: names must be {r_count} distinct directory "
                     f"names, one per run, got {names} (seeds {seeds}; name "
                     "the runs of a grid, e.g. cell_0, cell_1, ...).")
  hparams = {k: [float(v) for v in vs] for k, vs in (hparams or {}).items()}
  if hparams and isinstance(algorithm, FederatedAlgorithm):
    raise ValueError("fit_runs: hparams need a builder build(seed, hparams) "
                     "as the algorithm, which receives them per run.")
  for k, vs in hparams.items():
    if len(vs) != r_count:
      raise ValueError(f"fit_runs: hparams[{k!r}] has {len(vs)} values for "
                       f"{r_count} runs.")
  rounds = checks.check_whole("fit_runs: rounds", rounds, 1)
  run_chunk_size = check_run_chunk_size(run_chunk_size)
  eval_every = checks.check_whole("fit_runs: eval_every", eval_every, 1)
  checkpoint_every = checks.check_whole("fit_runs: checkpoint_every",
                                        checkpoint_every, 1)
  max_seconds = checks.check_budget("fit_runs: max_seconds", max_seconds)
  datas = _as_list(datas, r_count, "datas")
  num_steps = _as_list(num_steps, r_count, "num_steps")
  initial_models = _per_run(initial_model, r_count, "initial_model")
  run_keys = _per_run(run_key, r_count, "run_key")
  start_ledgers = _as_list(ledger, r_count, "ledger")
  shared_data = all(d is datas[0] for d in datas)
  n = datas[0].num_clients
  sampler = cohorts.as_sampler(clients_per_round)
  if not sampler.fixed:
    raise RunAxisError(
        "fit_runs: a Bernoulli cohort's size varies per run and round, so "
        "the runs cannot share one program; give a fixed clients_per_round, "
        "or run the seeds separately (fedjax_dd.fit per seed).")
  try:
    sampler.validate(n)
  except ValueError as e:
    raise ValueError(f"fit_runs: {e}") from None
  task = prepared.task
  for data, steps in zip(datas, num_steps):
    if np.ndim(data.num_examples) != 1:
      raise RunAxisError(
          "fit_runs: grouped client data (num_examples of shape "
          f"{tuple(np.shape(data.num_examples))}, e.g. FedSeq's [G, M, "
          "N_max, ...]) is not on the run axis; give each run's clients as "
          "[C, N_max, ...], or run the seeds separately (fedjax_dd.fit per "
          "seed).")
    fit_lib._check_step_counts(steps)  # pylint: disable=protected-access
    validate.image_shape("data.x", data.x, task.input_shape, leading=2)
    validate.client_stack(data.x, data.y, data.num_examples,
                          num_classes=task.num_classes, fetch=True)
    validate.step_counts("num_steps", steps,
                         tuple(np.shape(data.num_examples)), fetch=True)
  if isinstance(algorithm, FederatedAlgorithm):
    algorithms = [algorithm] * r_count
    apply_algorithm = lambda hp: algorithm
  else:
    algorithms = [algorithm(s, {k: vs[i] for k, vs in hparams.items()})
                  for i, s in enumerate(seeds)]
    apply_algorithm = lambda hp: algorithm(seeds[0], hp)
  name = name or algorithm_name(algorithms[0])

  with contextlib.ExitStack() as stack:
    if workdir is None:
      workdir = stack.enter_context(tempfile.TemporaryDirectory())
    workdir = os.fspath(workdir)
    if jax.process_count() == 1:
      stack.enter_context(workdir_lib.WorkdirLock(workdir, flag="workdir="))
    wall = wall or loop_lib.WallClock(start=time.time())
    records = [fit_lib.run_definition(a, prepared, d, s, sampler, seed=seed,
                                      initial_model=m, run_key=k)
               for a, d, s, seed, m, k in zip(algorithms, datas, num_steps,
                                              seeds, initial_models,
                                              run_keys)]
    _check_batches(records, datas)
    if definition is None:
      definition = sweep_definition(names, hparams, records)
      # As fit: the entry point builds max_steps from the step counts.
      for record, steps in zip(records, num_steps):
        fit_lib._check_max_steps(record, steps)  # pylint: disable=protected-access
    workdir_lib.record_fingerprint(workdir, definition, flag="workdir=")
    forms = definition_lib.forms_of(task.module)
    workdir_lib.record_environment(workdir, forms=forms)
    works = [workdir_lib.Workdir(os.path.join(workdir, run_name),
                                 tensorboard=tensorboard)
             for run_name in names]
    for work in works:
      workdir_lib.record_environment(work.directory, forms=forms)

    data = (datas[0] if shared_data else stack_client_data(datas))
    data = ClientData(x=jnp.asarray(data.x), y=jnp.asarray(data.y),
                      num_examples=jnp.asarray(data.num_examples))
    steps = jnp.stack([jnp.asarray(s, jnp.int32) for s in num_steps])
    traced = {k: jnp.asarray(vs, jnp.float32) for k, vs in hparams.items()}
    states = [fit_lib.initial_state(a, task, n, seed=s, initial_model=m,
                                    run_key=k)
              for a, s, m, k in zip(algorithms, seeds, initial_models,
                                    run_keys)]
    model_size = ledger_lib.num_params(states[0].server.params)
    state = stack_runs(states)
    run_chunk = run_chunks(r_count, run_chunk_size)
    program = round_program(apply_algorithm, sampler, n,
                            shared_data=shared_data, run_chunk=run_chunk)
    if progress:
      print(split_line(r_count, run_chunk), file=sys.stderr, flush=True)
    else:
      _log.info("%s", split_line(r_count, run_chunk))
    _check_vmappable(program, name, state, data, steps, traced)

    store = CheckpointStore(os.path.join(workdir, CHECKPOINTS),
                            max_to_keep=keep_checkpoints,
                            save_every=checkpoint_every)
    writers = [work.writer for work in works]
    try:
      ledgers = [ledger_lib.Ledger() if l is None else l
                 for l in start_ledgers]
      restored = store.restore(state)
      if restored is not None:
        done, state, meta = restored
        for writer in writers:
          writer.truncate_after(done)
          loop_lib.check_rows(writer, done)
        wall.resumed_from(meta)
        ledgers = [ledger_lib.Ledger.from_dict(d) for d in meta["ledgers"]]
        if done > rounds:
          raise loop_lib.ResumeRefusedError(
              f"{store.directory} holds runs that finished {done} rounds; "
              f"{rounds} were asked for. Ask for {done} rounds or more, or "
              "use a new workdir.")
      else:
        for writer in writers:
          writer.start_fresh(store)
      state, ledgers, out_of_time = _run(
          program, algorithms[0], state, ledgers, data, steps, traced,
          cohort_size=sampler.size_bound(n), model_size=model_size,
          names=names, store=store,
          writers=writers, wall=wall, prepared=prepared,
          options=loop_lib.LoopOptions(
              num_steps=rounds, eval_every=eval_every, progress=progress,
              max_seconds=max_seconds, desc="rounds",
              stop_on_nonfinite=stop_on_nonfinite),
          class_accuracy=class_accuracy,
          initial_model_as_seed=initial_model_as_seed, run_chunk=run_chunk)
    finally:
      store.close()
    return RunsResult(names=names, state=state, ledgers=ledgers,
                      rows=[w.rows() for w in writers],
                      out_of_time=out_of_time)


def _check_batches(records: Sequence[Mapping[str, Any]],
                   datas: Sequence[ClientData]) -> None:
  """Refuses padding that would change a run's batch: a batch larger than
  a run's own ``N_max`` is capped to it (:func:`fedjax_dd.core.local.
  effective_batch_size`), and to the larger padded length on the axis."""
  n_max = max(int(d.x.shape[1]) for d in datas)
  for i, (record, d) in enumerate(zip(records, datas)):
    # The local updates' batches, not a server stage's.
    sizes = [v for k, v in record.items()
             if k.endswith(("local.batch_size", "local.run.batch_size"))
             and isinstance(v, int) and not isinstance(v, bool)]
    own = int(d.x.shape[1])
    for b in sizes:
      if (effective_batch_size(b, own) != effective_batch_size(b, n_max)):
        raise RunAxisError(
            f"fit_runs: run {i}'s largest client has {own} examples, fewer "
            f"than the batch size {b}, so its batches hold {own} draws; "
            f"padded to the axis' N_max={n_max} they would hold "
            f"{min(b, n_max)}. Lower the batch size to {own} or run it "
            "separately.")


def _check_vmappable(program, name: str, state: ExperimentState,
                     data: ClientData, steps, traced) -> None:
  """Traces one round without running it; host logic in ``apply`` raises
  :class:`RunAxisError` here, before anything is written."""
  try:
    jax.eval_shape(program, state.server, state.clients, state.key, data.x,
                   data.y, data.num_examples, steps, traced,
                   jnp.asarray(1, jnp.int32))
  except _HOST_LOGIC_ERRORS as e:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if traced:
      raise RunAxisError(
          f"fit_runs: {name}'s builder or apply needs a concrete value of "
          f"the traced hyperparameters {sorted(traced)} or runs host logic "
          f"({type(e).__name__}: {first[:120]}), so its runs cannot share "
          "one vmapped program; pass each value to the algorithm's factory "
          "as a scalar it computes with (no float(), no Python branch on "
          "it), or run the values separately.") from None
    raise RunAxisError(
        f"fit_runs: {name}'s apply runs host logic between its jitted steps "
        f"({type(e).__name__}: {first[:120]}), so its runs cannot share one "
        "vmapped program; run its seeds separately (fedjax_dd.fit per seed, "
        "or --seeds without --config.engine.run_axis).") from None


def evaluate_server_runs(
    evaluate_runs: Callable[[PyTree, PyTree], list[dict[str, Any]]],
    server: Any) -> list[dict[str, Any]]:
  """:func:`fedjax_dd.core.rounds.evaluate_server` of R runs at once.

  Args:
    evaluate_runs: ``evaluate(params [R, ...], batch_stats [R, ...])``
      giving R dicts (:func:`fedjax_dd.core.evaluate.make_run_evaluator`).
    server: the ``[R, ...]`` server state.

  Returns:
    Each run's figures as ``evaluate_server`` gives them; each model kind
    is one program over the R runs.
  """
  out = [dict(e) for e in evaluate_runs(server.params, server.batch_stats)]
  extra = server.extra if isinstance(server.extra, dict) else {}
  for name, model in extra.get(rounds_lib.EVAL_MODELS, {}).items():
    for run, ev in zip(out, evaluate_runs(model["params"],
                                          model["batch_stats"])):
      run.update({f"{k}_{name}": v for k, v in ev.items()})
  return out


def _run(program, algorithm: FederatedAlgorithm, state: ExperimentState,
         ledgers: list[ledger_lib.Ledger], data: ClientData, steps, traced,
         *, cohort_size: int, model_size: int, names: Sequence[str],
         store: CheckpointStore, writers, wall: loop_lib.WallClock,
         prepared: Prepared, options: loop_lib.LoopOptions,
         class_accuracy: bool, initial_model_as_seed: bool,
         run_chunk: int | None):
  """The rounds of R runs through :func:`fedjax_dd.core.loop.run_loop`."""
  r_count = len(names)
  evaluate_runs = make_run_evaluator(prepared.task, prepared.dataset.x_test,
                                     prepared.dataset.y_test,
                                     per_class=class_accuracy,
                                     run_chunk=run_chunk)
  # One layout for every round, as run_rounds commits its state.
  state = as_restored(jax.device_put(state, jax.local_devices()[0]))

  def step(carry, r):
    state, ledgers = carry
    server, clients, metrics = program(
        state.server, state.clients, state.key, data.x, data.y,
        data.num_examples, steps, traced, jnp.asarray(r, jnp.int32))
    state = as_restored(ExperimentState(
        server=server, clients=clients, key=state.key,
        round=jnp.full((r_count,), r, jnp.int32)))
    host = jax.device_get(metrics)
    row: dict[str, Any] = {}
    new_ledgers = []
    for i, ledger in enumerate(ledgers):
      one = {k: v[i] for k, v in host.items()}
      # As run_rounds records a round; a fixed cohort: no cohort_size.
      ledger, run_row = rounds_lib.record_round(
          ledger, r, cohort_size, one, {}, comm=algorithm.comm,
          model_size=model_size, bits_per_param=32,
          initial_model_as_seed=initial_model_as_seed)
      new_ledgers.append(ledger)
      row.update({f"run{i}.{k}": v for k, v in run_row.items()})
    return (state, new_ledgers), row

  def evaluate(carry):
    state = carry[0]
    out: dict[str, Any] = {}
    per_run = evaluate_server_runs(evaluate_runs, state.server)
    out["accuracy"] = float(np.mean([e["accuracy"] for e in per_run]))
    out["loss"] = float(np.mean([e["loss"] for e in per_run]))
    for i, ev in enumerate(per_run):
      out.update({f"run{i}.{k}": v for k, v in ev.items()})
    return out

  def save(r, carry, force):
    state, ledgers = carry
    meta = {"ledgers": [l.to_dict() for l in ledgers], "runs": list(names),
            "wall_seconds_total": wall.total()}
    return store.save(r, state, meta, force=force)

  start = int(np.max(np.asarray(jax.device_get(state.round))))
  result = loop_lib.run_loop(
      step, (state, ledgers), options, start=start,
      index=lambda r: {"round": r}, evaluate=evaluate,
      writer=_RunWriters(writers), save=save)
  state, ledgers = result.carry
  done = int(np.max(np.asarray(jax.device_get(state.round))))
  return state, ledgers, done < options.num_steps
