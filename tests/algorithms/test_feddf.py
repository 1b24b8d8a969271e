"""FedDF: distillation on public data moves the student towards the ensemble."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms import stages
from fedjax_dd.algorithms.feddf import feddf
from fedjax_dd.algorithms.fedhydra import local_stage
from fedjax_dd.core.algorithm import Cohort
from fedjax_dd.core.local import steps_for
from fedjax_dd.distill import dfkd
from tests.conftest import synthetic_clients, tiny_task


def test_feddf_raises_agreement_with_the_ensemble(caplog):
  task = tiny_task()
  x, y, n = synthetic_clients()
  num_steps = steps_for(jnp.asarray(n), 4, epochs=5)
  params, stats = task.init(jax.random.PRNGKey(0))
  train = local_stage(task, optax.sgd(0.2), batch_size=4,
                      max_steps=int(jnp.max(num_steps)))
  result = train(params, stats, Cohort(jnp.asarray(x), jnp.asarray(y),
                                       jnp.asarray(n), num_steps, jnp.arange(4)),
                 jax.random.PRNGKey(1))
  group = dfkd.TeacherGroup(task, lambda v: v, (0, 1, 2, 3))
  tv = ((result.params, result.batch_stats),)
  algo = feddf((group,), task, lambda v: v, optimizer=optax.adam(0.02),
               batch_size=8, steps_per_epoch=20)
  public = jnp.asarray(x.reshape(-1, 4, 4, 1)[:40])
  # Start from a fresh model rather than the average, so there is much to learn.
  state = algo.init(jax.random.PRNGKey(2), *task.init(jax.random.PRNGKey(7)))
  teachers = dfkd.make_teacher_fn((group,))
  x01 = public.astype(jnp.float32) / 255.0

  def agreement(s):
    ens = dfkd.average_ensemble(teachers(tv, x01)[0], None, ())
    logits, _ = task.apply(s.params, s.batch_stats, x01, train=False)
    return float(jnp.mean(jnp.argmax(ens, -1) == jnp.argmax(logits, -1)))

  before = agreement(state)
  state, metrics = algo.epoch(state, tv, public)
  caplog.set_level(logging.WARNING)
  with jax.log_compiles(True):
    for _ in range(2):
      state, metrics = algo.epoch(state, tv, public)
  assert not [r for r in caplog.records if "Compiling" in r.getMessage()]
  assert int(state.epoch) == 3
  assert np.isfinite(float(metrics["student_kl"]))
  assert agreement(state) > before
  assert agreement(state) >= 0.9
  # One-shot FedAvg of the same clients is a valid FedDF starting point.
  avg = stages.weighted_mean(result.params, jnp.asarray(n))
  assert jax.tree_util.tree_structure(avg) == jax.tree_util.tree_structure(params)


def test_feddf_refuses_empty_epochs():
  group = dfkd.TeacherGroup(tiny_task(), lambda v: v, (0,))
  with pytest.raises(ValueError, match="steps_per_epoch"):
    feddf((group,), tiny_task(), lambda v: v, steps_per_epoch=0)
