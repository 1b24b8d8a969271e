"""FedDF: distillation on public data moves the student towards the ensemble."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms import stages
from fedjax_dd.algorithms.feddf import feddf
from fedjax_dd.algorithms.one_shot import local_stage
from fedjax_dd.core.algorithm import Cohort, Teachers
from fedjax_dd.core.local import LocalTraining, steps_for
from fedjax_dd.distill import ensemble
from tests.conftest import synthetic_clients, tiny_task


def test_feddf_raises_agreement_with_the_ensemble(caplog):
  task = tiny_task()
  x, y, n = synthetic_clients()
  num_steps = steps_for(jnp.asarray(n), 4, epochs=5)
  params, stats = task.init(jax.random.PRNGKey(0))
  train = local_stage(LocalTraining(task, optax.sgd(0.2), batch_size=4,
                                    max_steps=int(jnp.max(num_steps))))
  result = train(params, stats, Cohort(jnp.asarray(x), jnp.asarray(y),
                                       jnp.asarray(n), num_steps, jnp.arange(4)),
                 jax.random.PRNGKey(1))
  group = ensemble.TeacherGroup(task, lambda v: v, (0, 1, 2, 3))
  tv = ((result.params, result.batch_stats),)
  public = jnp.asarray(x.reshape(-1, 4, 4, 1)[:40])
  algo = feddf(None, (group,), task, lambda v: v, public,
               optimizer=optax.adam(0.02), batch_size=8, steps_per_epoch=20)
  # Two groups of the same clients (as if heterogeneous): the student starts
  # from the given fresh model rather than the average, so there is much to
  # learn; the teacher function sees the one group.
  fresh = task.init(jax.random.PRNGKey(7))
  state = algo.init(jax.random.PRNGKey(2), {}, Teachers(tv + tv, jnp.asarray(n)),
                    *fresh)
  np.testing.assert_array_equal(
      jax.tree_util.tree_leaves(state.params)[0],
      jax.tree_util.tree_leaves(fresh[0])[0])
  teachers_in = Teachers(tv, jnp.asarray(n))
  teachers = ensemble.make_teacher_fn((group,))
  x01 = public.astype(jnp.float32) / 255.0

  def agreement(s):
    ens = ensemble.average_ensemble(teachers(tv, x01)[0], None, ())
    logits, _ = task.apply(s.params, s.batch_stats, x01, train=False)
    return float(jnp.mean(jnp.argmax(ens, -1) == jnp.argmax(logits, -1)))

  before = agreement(state)
  state, metrics = algo.epoch(state, teachers_in)
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    for _ in range(2):
      state, metrics = algo.epoch(state, teachers_in)
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
  assert int(state.epoch) == 3
  assert np.isfinite(float(metrics["student_kl"]))
  assert agreement(state) > before
  assert agreement(state) >= 0.9
  # With homogeneous clients the student starts from their average
  # (one-shot FedAvg).
  avg = stages.weighted_mean(result.params, jnp.asarray(n))
  start = algo.init(jax.random.PRNGKey(2), {}, teachers_in, *fresh)
  for a, b in zip(jax.tree_util.tree_leaves(avg),
                  jax.tree_util.tree_leaves(start.params)):
    np.testing.assert_array_equal(a, b)


def test_feddf_refuses_empty_epochs():
  group = ensemble.TeacherGroup(tiny_task(), lambda v: v, (0,))
  with pytest.raises(ValueError, match="steps_per_epoch"):
    feddf(None, (group,), tiny_task(), lambda v: v,
          jnp.zeros((2, 4, 4, 1), jnp.uint8), steps_per_epoch=0)
