"""The client stages refuse malformed client data before training."""

import jax
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms import one_shot
from fedjax_dd.core.local import LocalTraining
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import ensemble
from tests.conftest import synthetic_clients, tiny_task


def _training(task):
  # The stage trains each group's task up to its clients' largest count.
  return LocalTraining(task, optax.sgd(0.1), batch_size=4, max_steps=1)


def _stage():
  task = tiny_task()
  group = ensemble.TeacherGroup(task, lambda x: x, (0, 1, 2, 3))
  stage = one_shot.client_stage([group], _training(task),
                                num_steps=np.array([1, 1, 1, 1]))
  return task, stage


def _run(stage, task, x, y, n):
  params, stats = task.init(jax.random.PRNGKey(0))
  return stage([(params, stats)], ClientData(x=x, y=y, num_examples=n),
               jax.random.PRNGKey(1))


def test_one_shot_stage_refuses_unstacked_images():
  task, stage = _stage()
  x, y, n = synthetic_clients()
  # Refused when the ClientData is built: x's first two axes are not y's.
  with pytest.raises(ValueError, match=r"^y must be \[C, N_max\] = \[12, 4\] "
                     r"\(the first two axes of x\), got shape \(4, 12\)"):
    _run(stage, task, x[0], y, n)


def test_one_shot_stage_refuses_float_images():
  task, stage = _stage()
  x, y, n = synthetic_clients()
  with pytest.raises(ValueError, match=r"^x must be \[C, N_max, H, W, Ch\] "
                     r"uint8 pixels in 0\.\.255, got dtype float64"):
    _run(stage, task, x / 255.0, y, n)


def test_one_shot_stage_refuses_one_hot_labels():
  task, stage = _stage()
  x, y, n = synthetic_clients()
  with pytest.raises(ValueError, match=r"^y must be \[C, N_max\] = \[4, 12\] "
                     r"integer class indices, got shape \(4, 12, 3\)"):
    _run(stage, task, x, np.eye(3, dtype=np.float32)[y], n)


def test_one_shot_stage_refuses_counts_above_the_padding():
  task, stage = _stage()
  x, y, _ = synthetic_clients()
  with pytest.raises(ValueError, match=r"^num_examples must lie in \[0, "
                     r"N_max = 12\] \(the padded length of x\), got 1 outside "
                     r"it \(13\)\.$"):
    _run(stage, task, x, y, np.array([5, 9, 13, 7], np.int32))


def test_one_shot_stage_refuses_other_clients_than_its_groups():
  task, stage = _stage()
  x, y, n = synthetic_clients()
  with pytest.raises(ValueError, match=r"^data must hold the 4 clients of the "
                     r"groups, got 3"):
    _run(stage, task, x[:3], y[:3], n[:3])


def test_one_shot_stage_refuses_bad_step_counts():
  group = ensemble.TeacherGroup(tiny_task(), lambda x: x, (0, 1))
  with pytest.raises(ValueError, match=r"^num_steps must be \[C\] = \[2\] "
                     r"integer step counts, got shape \(3,\)"):
    one_shot.client_stage([group], _training(group.task),
                          num_steps=np.array([1, 1, 1]))
  with pytest.raises(ValueError, match=r"^num_steps must be >= 0, got 1 "
                     r"negative \(-1\)\.$"):
    one_shot.client_stage([group], _training(group.task),
                          num_steps=np.array([1, -1]))
