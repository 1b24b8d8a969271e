"""Kill-and-resume check of a rounds run (the pattern of test_disue.py).

A run is killed at chosen points (``apply``: a round starts; ``row``: a
metrics row is written, before its checkpoint; any point the algorithm's
builder ticks itself, e.g. mid-round), restarted from its workdir each time,
and must end with the rows, state and ledger of an uninterrupted run.
"""

import jax
import numpy as np
import pytest

from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.checkpoint import CheckpointStore
from fedjax_dd.core.evaluate import make_evaluator
from fedjax_dd.core.metrics import MetricsWriter


class Killed(Exception):
  pass


class Plan:
  """The ``n``-th call of ``point`` raises :class:`Killed`."""

  def __init__(self, point, n):
    self.point, self.n, self.counts = point, n, {}

  def tick(self, point):
    self.counts[point] = self.counts.get(point, 0) + 1
    if point == self.point and self.counts[point] == self.n:
      raise Killed(f"{point} #{self.n}")


class _Writer(MetricsWriter):

  def __init__(self, path, plan=None):
    super().__init__(path)
    self._plan = plan

  def write(self, row):
    super().write(row)
    if self._plan is not None:
      self._plan.tick("row")


def evaluated_options(task, data, *, clients_per_round: int,
                      batch_size: int = 32):
  """``(evaluate, options)`` of a kill-and-resume run: four rounds,
  evaluated and checkpointed every two, ``task`` scored on the clients'
  pooled data (``data.x`` ``[C, N, H, W, Ch]``)."""
  evaluate = make_evaluator(task, data.x.reshape(-1, *data.x.shape[2:]),
                            data.y.reshape(-1), batch_size=batch_size)
  options = rounds_lib.RoundsOptions(
      num_rounds=4, clients_per_round=clients_per_round, progress=False,
      eval_every=2, checkpoint_every=2)
  return evaluate, options


def stale_row_resume(tmp_path, alg, state0, data, num_steps, *, evaluate,
                     clients_per_round, rounds: int, killed_after: int):
  """A run of ``rounds`` rounds, checkpointed every round, and the same run
  killed after round ``killed_after`` with a row of the next round written
  but never checkpointed, then resumed to ``rounds``.

  Returns:
    ``(full, full_ledger, resumed, full_rows, resumed_rows)``: the final
    states and rows of both runs and the uninterrupted run's ledger.
  """
  opts = dict(clients_per_round=clients_per_round, progress=False,
              checkpoint_every=1)
  w_full = MetricsWriter(tmp_path / "full" / "metrics.jsonl")
  full, full_ledger, _ = rounds_lib.run_rounds(
      alg, state0, data, num_steps,
      rounds_lib.RoundsOptions(num_rounds=rounds, **opts), evaluate=evaluate,
      writer=w_full, store=CheckpointStore(tmp_path / "full" / "ckpt"))
  part_dir = tmp_path / "part"
  w_part = MetricsWriter(part_dir / "metrics.jsonl")
  store = CheckpointStore(part_dir / "ckpt", save_every=killed_after)
  rounds_lib.run_rounds(alg, state0, data, num_steps,
                        rounds_lib.RoundsOptions(num_rounds=killed_after,
                                                 **opts),
                        evaluate=evaluate, writer=w_part, store=store)
  w_part.write({"round": killed_after + 1, "test_accuracy": -1.0})  # stale
  store.close()
  store = CheckpointStore(part_dir / "ckpt")
  restored, ledger = rounds_lib.resume(store, state0, w_part)
  assert int(restored.round) == killed_after
  resumed, _, _ = rounds_lib.run_rounds(
      alg, restored, data, num_steps,
      rounds_lib.RoundsOptions(num_rounds=rounds, **opts), evaluate=evaluate,
      ledger=ledger, writer=w_part, store=store)
  return full, full_ledger, resumed, w_full.rows(), w_part.rows()


def assert_same_run(full, resumed) -> None:
  """Every row, state leaf and ledger entry of ``resumed`` equals ``full``'s."""
  assert resumed.rows == full.rows
  for a, b in zip(jax.tree_util.tree_leaves(full.state),
                  jax.tree_util.tree_leaves(resumed.state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert resumed.ledger.to_dict() == full.ledger.to_dict()


def check(tmp_path, build, initial_state, data, num_steps, options, kills, *,
          evaluate=None, personal=None):
  """Asserts that a run killed at every ``(point, n)`` of ``kills`` in turn
  and then resumed equals an uninterrupted run, row for row.

  Args:
    build: ``tick -> FederatedAlgorithm``, called once (every run shares its
      compiled programs); the algorithm may call ``tick(point)`` at its own
      points, which kills the run when the current plan says so.
    initial_state: ``algorithm -> ExperimentState``.
    personal: ``algorithm -> (state -> figures)``: personalized evaluation
      beside ``evaluate`` (:func:`fedjax_dd.core.personal.
      personal_evaluation`).
    options: :class:`fedjax_dd.core.rounds.RoundsOptions` (checkpointing
      every ``options.checkpoint_every`` rounds).
  """

  current = {"plan": None}

  def tick(point):
    if current["plan"] is not None:
      current["plan"].tick(point)

  alg = build(tick)
  apply = alg.apply

  def ticking(*args):
    tick("apply")
    return apply(*args)

  alg = alg._replace(apply=ticking)

  def train(directory, plan=None):
    current["plan"] = plan
    return rounds_lib.resume_and_run(
        alg, initial_state(alg), data, num_steps, options,
        writer=_Writer(directory / "metrics.jsonl", plan),
        store=CheckpointStore(str(directory / "ck"),
                              save_every=options.checkpoint_every),
        evaluate=evaluate,
        personal=None if personal is None else personal(alg))

  full = train(tmp_path / "full")
  assert [r["round"] for r in full.rows] == list(
      range(1, options.num_rounds + 1))
  part = tmp_path / "part"
  for point, n in kills:
    with pytest.raises(Killed):
      train(part, Plan(point, n))
  assert_same_run(full, train(part))
  return full
