"""DynaFed: the matching loss by hand, the round schedule against FedAvg,
no recompilation, and kill-and-resume."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms.dynafed import (DynaFedHyperParams, dynafed,
                                          matching_loss, synthetic_labels)
from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.algorithm import ExperimentState
from fedjax_dd.core.checkpoint import CheckpointStore
from fedjax_dd.core.local import LocalTraining, steps_for
from fedjax_dd.data.stacked import ClientData
from tests.conftest import rounds_compile_nothing, synthetic_clients, tiny_task

# L = 2: rounds 1-2 store the trajectory, round 2 synthesises, rounds 3-4
# fine-tune.
HP = DynaFedHyperParams(images_per_class=2, trajectory_rounds=2,
                        expert_rounds=1, student_steps=2, iterations=6,
                        image_lr=0.05, lr_lr=1e-3, initial_syn_lr=0.1,
                        finetune_epochs=2, finetune_batch_size=4,
                        finetune_lr=1e-2)
BATCH = 4


def _data():
  x, y, n = synthetic_clients()
  return jax.device_put(ClientData(x=x, y=y, num_examples=n))


def _state(alg, task):
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, 4)
  return ExperimentState(server, clients, jax.random.PRNGKey(1),
                         jnp.asarray(0, jnp.int32))


def _build(task, data, hparams=HP):
  num_steps = steps_for(data.num_examples, BATCH, epochs=1)
  alg = dynafed(LocalTraining(task, optax.sgd(0.1), batch_size=BATCH,
                              max_steps=int(jnp.max(num_steps))),
                hparams=hparams)
  return alg, num_steps


@pytest.fixture(scope="module")
def built():
  """``(task, data, algorithm, num_steps)`` shared by the tests, so that its
  programs compile once."""
  task = tiny_task()
  data = _data()
  return (task, data, *_build(task, data))


def _per_round(alg, task, data, num_steps, rounds):
  states = []
  opts = rounds_lib.RoundsOptions(num_rounds=rounds, clients_per_round=4,
                                  progress=False)
  _, ledger, rows = rounds_lib.run_rounds(
      alg, _state(alg, task), data, num_steps, opts,
      on_round=lambda s, row: states.append(s))
  return states, ledger, rows


def test_matching_loss_by_hand():
  """One student step ``θ_s − α g``: against ``θ_s − 2 α g`` the normalised
  distance is ``|α g|² / |2 α g|² = 1/4``; against itself 0; with α = 0
  the student does not move, so the distance is 1."""
  task = tiny_task()
  start, stats = task.init(jax.random.PRNGKey(3))
  images = jax.random.normal(jax.random.PRNGKey(4), (6, 4, 4, 1))
  labels = synthetic_labels(3, 2)
  np.testing.assert_array_equal(labels, [0, 0, 1, 1, 2, 2])

  def ce(p):
    logits, _ = task.apply(p, stats, images, train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits,
                                                           labels).mean()

  g = jax.grad(ce)(start)
  alpha = jnp.float32(0.5)
  moved = lambda k: jax.tree_util.tree_map(lambda p, d: p - k * alpha * d,
                                           start, g)
  jitted = jax.jit(matching_loss, static_argnums=(0, 1))
  loss = lambda lr, target: float(jitted(
      task, 1, images, labels, jnp.float32(lr), stats, start, target))
  np.testing.assert_allclose(loss(alpha, moved(2.0)), 0.25, rtol=1e-5)
  np.testing.assert_allclose(loss(alpha, moved(1.0)), 0.0, atol=1e-10)
  np.testing.assert_allclose(loss(0.0, moved(2.0)), 1.0, rtol=1e-6)
  # Two steps at α/2 from θ_s are not one step at α (the gradient moves):
  # the rate is applied per step, not to the sum.
  two = float(matching_loss(task, 2, images, labels, alpha / 2, stats,
                            start, moved(1.0)))
  assert 0.0 < two < 0.25


def test_rounds_follow_fedavg_then_synthesis_then_fine_tuning(built):
  """Rounds 1-2 are FedAvg's and fill the trajectory; round 2 synthesises
  (its matching loss falls); rounds 3-4 fine-tune; the ledger is FedAvg's."""
  task, data, alg, num_steps = built
  states, ledger, rows = _per_round(alg, task, data, num_steps, 4)
  fa = fedavg(LocalTraining(task, optax.sgd(0.1), batch_size=BATCH,
                            max_steps=int(jnp.max(num_steps))))
  fa_states, fa_ledger, _ = _per_round(fa, task, data, num_steps, 4)

  leaves = lambda s: jax.tree_util.tree_leaves(s.server.params)
  assert ledger.to_dict() == fa_ledger.to_dict()
  # Rounds 1-2 (no fine-tuning yet) are FedAvg's.
  for r in (0, 1):
    for a, b in zip(leaves(states[r]), leaves(fa_states[r])):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)

  init = jax.tree_util.tree_leaves(task.init(jax.random.PRNGKey(0))[0])
  traj = jax.tree_util.tree_leaves(states[-1].server.extra["trajectory"])
  for b, p0, p1, p2 in zip(traj, init, leaves(fa_states[0]),
                           leaves(fa_states[1])):
    assert b.shape[0] == 3  # [θ_0, θ_1, θ_2]
    np.testing.assert_array_equal(b[0], p0)
    np.testing.assert_allclose(b[1], p1, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(b[2], p2, rtol=1e-6, atol=1e-7)

  images = [np.asarray(s.server.extra["images"]) for s in states]
  assert images[0].shape == (6, 4, 4, 1) and not images[0].any()
  assert images[1].any() and np.isfinite(images[1]).all()
  np.testing.assert_array_equal(images[1], images[3])  # synthesised once
  assert [r["match_loss_first"] > 0 for r in rows] == [False, True, False,
                                                      False]
  assert rows[1]["match_loss_last"] < rows[1]["match_loss_first"]
  assert [r["finetune_loss"] > 0 for r in rows] == [False, False, True, True]
  assert rows[0]["syn_lr"] == pytest.approx(0.1)
  assert rows[1]["syn_lr"] != pytest.approx(0.1, abs=1e-6)  # α is learned
  # Fine-tuning moved rounds 3-4 away from FedAvg's.
  diff = max(float(jnp.max(jnp.abs(a - b)))
             for a, b in zip(leaves(states[2]), leaves(fa_states[2])))
  assert diff > 1e-4


def test_settings_that_cannot_run_are_refused():
  with pytest.raises(ValueError, match="^expert_rounds must be <= "
                     "trajectory_rounds = 2"):
    DynaFedHyperParams(trajectory_rounds=2, expert_rounds=3)
  with pytest.raises(ValueError, match="^images_per_class must be an int"):
    DynaFedHyperParams(images_per_class=0)
  with pytest.raises(ValueError, match="^finetune_lr must be a finite"):
    DynaFedHyperParams(finetune_lr=float("nan"))


def test_no_recompilation_across_the_phases(caplog, built):
  """One program per round whatever the phase: rounds 2 (synthesis) to 4
  (fine-tuning) compile nothing after round 1."""
  task, data, alg, num_steps = built
  _, rows = rounds_compile_nothing(caplog, alg, _state(alg, task), data,
                                   num_steps, clients_per_round=4, rounds=4)
  assert [r["round"] for r in rows] == [2, 3, 4]


# The kill points: apply (a round starts), row (a row written, before its
# checkpoint), and any the builder ticks itself (DisUE: iga, mid-round).
from tests.algorithms.kill_resume import Killed as _Killed  # pylint: disable=g-import-not-at-top
from tests.algorithms.kill_resume import Plan as _Plan  # pylint: disable=g-import-not-at-top
from tests.algorithms.kill_resume import _Writer  # pylint: disable=g-import-not-at-top
from tests.algorithms.kill_resume import assert_same_run  # pylint: disable=g-import-not-at-top


def test_killed_at_every_phase_resumes_bit_identically(tmp_path, built):
  """Killed before and after the synthesis round and in the fine-tuning
  rounds, the run resumes to the rows, state (trajectory, synthetic set,
  α) and ledger of an uninterrupted one."""
  task, data, alg, num_steps = built
  opts = rounds_lib.RoundsOptions(num_rounds=4, clients_per_round=3,
                                  progress=False, checkpoint_every=1)

  def train(directory, plan=None):
    def apply(*args):
      if plan is not None:
        plan.tick("apply")
      return alg.apply(*args)

    ticking = alg._replace(apply=apply)
    return rounds_lib.resume_and_run(
        ticking, _state(alg, task), data, num_steps, opts,
        writer=_Writer(directory / "metrics.jsonl", plan),
        store=CheckpointStore(str(directory / "ck"), save_every=1))

  full = train(tmp_path / "full")
  assert [r["round"] for r in full.rows] == [1, 2, 3, 4]
  part = tmp_path / "part"
  for point, n in [("apply", 2),  # round 1 saved; the synthesis round starts
                   ("row", 1),    # round 2 written (synthesised), not saved
                   ("apply", 2),  # restored at 2; round 4 starts
                   ("row", 1)]:   # round 3 written, not saved
    with pytest.raises(_Killed):
      train(part, _Plan(point, n))
  assert_same_run(full, train(part))
