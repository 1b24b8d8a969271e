"""Train any :class:`FederatedAlgorithm` for R rounds from a notebook.

The entry point's loop (:func:`fedjax_dd.core.rounds.resume_and_run`): with a
``workdir`` every round is checkpointed and logged to ``metrics.jsonl``, and
calling :func:`fit` again on it resumes bit-identically. The directory
records what defines the run (:func:`run_definition`), refusing another
algorithm, data, cohort or seed, and is held by one call at a time
(:class:`fedjax_dd.core.workdir.WorkdirLock`)::

  import optax, fedjax_dd
  prepared = fedjax_dd.prepare("digits", "digits_cnn")
  ds = prepared.dataset
  parts = fedjax_dd.dirichlet(ds.y_train, 10, 0.5, np.random.default_rng(0))
  data = fedjax_dd.stack_clients(ds.x_train, ds.y_train, parts)
  steps = fedjax_dd.local_steps(data, batch_size=32, epochs=1.0)
  training = fedjax_dd.LocalTraining(prepared.task, optax.sgd(0.05),
                                     batch_size=32,
                                     max_steps=int(steps.max()))
  algo = fedjax_dd.fedavg(training)
  result = fedjax_dd.fit(algo, prepared, data, steps, rounds=5,
                         clients_per_round=5, workdir="runs/fedavg")
  result.rows[-1]["test_accuracy"]
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dd.core import checks
from fedjax_dd.core import cohorts
from fedjax_dd.core import definition as definition_lib
from fedjax_dd.core import keys as keys_lib
from fedjax_dd.core import ledger as ledger_lib
from fedjax_dd.core import loop as loop_lib
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core import workdir as workdir_lib
from fedjax_dd.core.algorithm import ExperimentState, FederatedAlgorithm
from fedjax_dd.core.evaluate import make_evaluator
from fedjax_dd.core.local import steps_for
from fedjax_dd.core.prepare import Prepared
from fedjax_dd.data import validate
from fedjax_dd.data.stacked import ClientData

PyTree = Any


def local_steps(data: ClientData, *, batch_size: int,
                epochs: float | None = None,
                steps: int | None = None) -> jax.Array:
  """``[N]`` active local steps per client: ``ceil(epochs * ceil(n / B))``
  for ``epochs`` local epochs of batch ``B``, or a fixed ``steps``; clients
  without data take none (:func:`fedjax_dd.core.local.steps_for`).
  """
  if (epochs is None) == (steps is None):
    raise ValueError("local_steps: give exactly one of epochs= or steps=.")
  if epochs is not None:
    return steps_for(data.num_examples, batch_size, epochs=epochs)
  return steps_for(data.num_examples, batch_size, steps=steps)


def initial_state(algorithm: FederatedAlgorithm, task, num_clients: int, *,
                  seed: int,
                  initial_model: tuple[PyTree, PyTree] | None = None,
                  run_key: jax.Array | None = None) -> ExperimentState:
  """The state before round 1: the model of ``seed`` (or ``initial_model``),
  the algorithm's server and ``[N]`` client states, and the rounds' key
  (``run_key``, default the seed's, :func:`fedjax_dd.core.keys.init_and_run`).
  """
  init_key, default_run_key = keys_lib.init_and_run(keys_lib.model_root(seed))
  params, batch_stats = (task.init(init_key) if initial_model is None
                         else initial_model)
  server, client_states = algorithm.init(params, batch_stats, num_clients)
  return ExperimentState(
      server=server, clients=client_states,
      key=default_run_key if run_key is None else run_key,
      round=jnp.asarray(0, jnp.int32))


def run_definition(algorithm: FederatedAlgorithm, prepared: Prepared,
                   data: ClientData, num_steps: jax.Array,
                   sampler: cohorts.CohortSampler, *, seed: int,
                   initial_model: tuple[PyTree, PyTree] | None = None,
                   run_key: jax.Array | None = None) -> dict[str, Any]:
  """What defines a :func:`fit` run, as ``{name: JSON value}``.

  The algorithm and the task as :func:`fedjax_dd.core.definition.describe`
  gives them (the hyperparameters their closures hold), digests of the
  clients' data, the step counts and the test split, the cohort draw, the
  seed and any initial model or rounds' key. Settings a resume may change
  (``rounds``, ``eval_every``, checkpointing, the budget, ``progress``,
  ``class_accuracy``) and the layer forms
  (:func:`fedjax_dd.core.workdir.record_environment`) are not in it.
  """
  digest = definition_lib.array_digest
  record: dict[str, Any] = {
      "seed": int(seed),
      "data.x": digest(data.x), "data.y": digest(data.y),
      "data.num_examples": digest(data.num_examples),
      "num_steps": digest(num_steps),
      "test.x": digest(prepared.dataset.x_test),
      "test.y": digest(prepared.dataset.y_test),
      "initial_model": (None if initial_model is None else
                        definition_lib.describe(jax.tree_util.tree_leaves(
                            initial_model))),
      "run_key": None if run_key is None else digest(run_key),
  }
  for name, obj in (("cohort", sampler), ("task", prepared.task),
                    ("algorithm", algorithm)):
    record.update(definition_lib.flatten(definition_lib.describe(obj), name))
  return record


def _whole_number(name: str, value: Any, low: int) -> int:
  """``value`` as an int, refusing fractions (``rounds=2.7`` would run 2)."""
  return checks.check_whole(f"fit: {name}", value, low)


def _check_step_counts(num_steps: Any) -> None:
  """Local step counts: whole and non-negative (a fractional or negative
  count from a hand-made array would be cast or clipped in the loop)."""
  counts = np.asarray(jax.device_get(num_steps))
  if not np.issubdtype(counts.dtype, np.integer):
    raise checks.SettingError(
        f"fit: num_steps must hold ints (local steps per client, "
        f"fedjax_dd.local_steps), got dtype {counts.dtype}.")
  if counts.size and counts.min() < 0:
    raise checks.SettingError(
        f"fit: num_steps must be >= 0 (local steps per client), got "
        f"{int(counts.min())}; build it with fedjax_dd.local_steps.")


def _check_max_steps(record: dict[str, Any], num_steps: jax.Array) -> None:
  """Refuses step counts above the local update's static ``max_steps``, as
  :func:`run_definition` read it from the algorithm (the local loop would
  silently clip them)."""
  bounds = [v for k, v in record.items()
            if k.endswith(".max_steps") and isinstance(v, int)
            and not isinstance(v, bool)]
  most = int(np.max(np.asarray(jax.device_get(num_steps)), initial=0))
  if bounds and most > min(bounds):
    raise ValueError(
        f"fit: num_steps asks up to {most} local steps, but the algorithm's "
        f"local update was built with max_steps={min(bounds)}, its static "
        f"bound; the steps past it would not run. Build the algorithm's "
        f"LocalTraining with max_steps=int(num_steps.max()) (= {most}).")


def fit(algorithm: FederatedAlgorithm,
        prepared: Prepared,
        data: ClientData,
        num_steps: jax.Array,
        *,
        rounds: int,
        clients_per_round: int | cohorts.CohortSampler,
        workdir: str | os.PathLike | None = None,
        seed: int = 0,
        eval_every: int = 1,
        checkpoint_every: int = 1,
        keep_checkpoints: int | None = 2,
        max_seconds: float = 0.0,
        progress: bool = True,
        class_accuracy: bool = False,
        initial_model: tuple[PyTree, PyTree] | None = None,
        ledger: ledger_lib.Ledger | None = None,
        run_key: jax.Array | None = None,
        stop_on_nonfinite: bool = True,
        initial_model_as_seed: bool = True,
        tensorboard: bool = False,
        wall: loop_lib.WallClock | None = None,
        personal: Callable[[ExperimentState], dict[str, Any]] | None = None,
        definition: dict[str, Any] | None = None) -> rounds_lib.TrainResult:
  """Runs (or resumes) ``algorithm`` for ``rounds`` rounds.

  Args:
    algorithm: a :class:`FederatedAlgorithm` (``fedavg``, ``scaffold``,
      ``disue``, your own ...).
    prepared: the task and its dataset (:func:`fedjax_dd.prepare`); its test
      split is evaluated every ``eval_every`` rounds.
    data: all clients' padded data ``[N, N_max, ...]``.
    num_steps: ``[N]`` local steps per client (:func:`local_steps`).
    rounds: total rounds; a resumed run continues to this.
    clients_per_round: sampled clients per round, in ``[1, N]``, or a
      cohort sampler (:class:`fedjax_dd.core.cohorts.BernoulliCohort`).
    workdir: where checkpoints and ``metrics.jsonl`` go; a second call
      resumes the same run (:func:`run_definition`). None: a temporary
      directory, removed on return.
    seed: the model seed (:func:`fedjax_dd.core.keys.init_and_run`), as the
      entry point's ``--config.seed``.
    eval_every, checkpoint_every, keep_checkpoints, max_seconds, progress:
      as :class:`fedjax_dd.core.rounds.RoundsOptions` (``max_seconds`` 0:
      no budget).
    class_accuracy: also log the per-class test accuracy.
    initial_model: ``(params, batch_stats)`` to start from instead of the
      seed's initialisation.
    ledger: traffic recorded before the rounds (e.g. a one-shot upload).
    run_key: the rounds' key; default the seed's.
    stop_on_nonfinite, initial_model_as_seed: as
      :class:`fedjax_dd.core.rounds.RoundsOptions`.
    tensorboard: also write the metrics as TensorBoard scalars.
    wall: the run's wall clock (default: started now).
    personal: personalized evaluation on the same rounds
      (:func:`fedjax_dd.core.personal.personal_evaluation`).
    definition: what defines the run, ``{name: JSON value}``, recorded in
      the workdir's ``config.json`` and compared on a resume
      (:func:`fedjax_dd.core.workdir.record_fingerprint`); default
      :func:`run_definition`.

  Returns:
    :class:`fedjax_dd.core.rounds.TrainResult`: the final state, the ledger
    and every metrics row (earlier processes' rows included on a resume).

  Raises:
    ValueError: ``rounds``, ``eval_every`` or ``checkpoint_every`` not a
      whole number >= 1, ``clients_per_round`` outside ``[1, N]``, a
      Bernoulli probability outside ``(0, 1]`` (or too small to draw anyone),
      ``num_steps`` above the algorithm's ``max_steps``, or a ``seed``
      outside ``[0, 2**32)``.
    fedjax_dd.core.workdir.FingerprintMismatchError: ``workdir`` holds a
      run with another definition (naming what differs).
    fedjax_dd.core.workdir.WorkdirBusyError: another call or process is
      running in ``workdir``.
  """
  rounds = _whole_number("rounds", rounds, 1)
  eval_every = _whole_number("eval_every", eval_every, 1)
  checkpoint_every = _whole_number("checkpoint_every", checkpoint_every, 1)
  max_seconds = checks.check_budget("fit: max_seconds", max_seconds)
  _check_step_counts(num_steps)
  keys_lib.check_seed(seed)
  n = data.num_clients
  sampler = cohorts.as_sampler(clients_per_round)
  try:
    sampler.validate(n)
  except ValueError as e:
    raise ValueError(f"fit: {e}") from None
  with contextlib.ExitStack() as stack:
    if workdir is None:
      workdir = stack.enter_context(tempfile.TemporaryDirectory())
    # One writer per workdir (the processes of a multi-host run share one).
    if jax.process_count() == 1:
      stack.enter_context(workdir_lib.WorkdirLock(workdir, flag="workdir="))
    wall = wall or loop_lib.WallClock(start=time.time())
    task = prepared.task
    # An out-of-range label would surface as a non-finite loss. Grouped
    # layouts (FedSeq's [G, M, N_max, ...]) lead with more axes.
    lead = max(1, np.ndim(data.num_examples))
    validate.image_shape("data.x", data.x, task.input_shape,
                         leading=lead + 1)
    if data.y.ndim == 2 and lead == 1:
      validate.client_stack(data.x, data.y, data.num_examples,
                            num_classes=task.num_classes, fetch=True)
    if definition is None:
      definition = run_definition(algorithm, prepared, data, num_steps,
                                  sampler, seed=seed,
                                  initial_model=initial_model,
                                  run_key=run_key)
      # (The entry point's runners build max_steps from the step counts.)
      _check_max_steps(definition, num_steps)
    state = initial_state(algorithm, task, n, seed=seed,
                          initial_model=initial_model, run_key=run_key)
    work = workdir_lib.Workdir(workdir, tensorboard=tensorboard)
    workdir_lib.record_fingerprint(work.directory, definition,
                                   flag="workdir=")
    workdir_lib.record_environment(
        work.directory, forms=definition_lib.forms_of(task.module))
    options = rounds_lib.RoundsOptions(
        num_rounds=rounds, clients_per_round=sampler,
        eval_every=eval_every, checkpoint_every=checkpoint_every,
        progress=progress, max_seconds=max_seconds,
        stop_on_nonfinite=stop_on_nonfinite,
        initial_model_as_seed=initial_model_as_seed)
    evaluate = make_evaluator(task, prepared.dataset.x_test,
                              prepared.dataset.y_test,
                              per_class=class_accuracy)
    return rounds_lib.resume_and_run(
        algorithm, state, data, num_steps, options, writer=work.writer,
        store=work.store(max_to_keep=keep_checkpoints,
                         save_every=checkpoint_every),
        evaluate=evaluate, ledger=ledger, wall=wall, personal=personal)
