"""The library checks its inputs at construction (issue 41, item 6):
ClientData, stack_clients, run_rounds' step counts, make_evaluator."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dd.algorithms.fedavg import fedavg
from fedjax_dd.core import rounds as rounds_lib
from fedjax_dd.core.algorithm import ExperimentState
from fedjax_dd.core.evaluate import make_client_evaluator, make_evaluator
from fedjax_dd.core.local import LocalTraining
from fedjax_dd.data.stacked import ClientData, stack_clients
from tests.conftest import synthetic_clients, tiny_task


def test_client_data_refuses_bad_fields_at_construction():
  x, y, n = synthetic_clients()          # x [4, 12, 4, 4, 1], N_max 12
  ClientData(x=x, y=y, num_examples=n)   # fine
  with pytest.raises(ValueError, match=r"^num_examples must lie in \[0, "
                     r"N_max = 12\] \(the padded length of x\), got 1 outside "
                     r"it \(13\)\.$"):
    ClientData(x=x, y=y, num_examples=np.array([5, 9, 13, 7], np.int32))
  with pytest.raises(ValueError, match=r"got 1 outside it \(-2\)"):
    ClientData(x=x, y=y, num_examples=np.array([5, -2, 12, 7], np.int32))
  bad = y.copy()
  bad[1, 0] = -1                           # a real row
  with pytest.raises(ValueError, match=r"^y must hold class indices >= 0, got "
                     r"1 negative \(-1\)\.$"):
    ClientData(x=x, y=bad, num_examples=n)
  bad[1, 0], bad[0, 11] = 0, -1            # padding of client 0: not read
  ClientData(x=x, y=bad, num_examples=n)
  with pytest.raises(ValueError, match=r"images in \[0, 1\] must be scaled "
                     r"first"):
    ClientData(x=x / 255.0, y=y, num_examples=n)
  with pytest.raises(ValueError, match=r"^y must be \[C, N_max\] = \[4, 12\] "
                     r"\(the first two axes of x\), got shape \(4, 10\)\.$"):
    ClientData(x=x, y=y[:, :10], num_examples=n)
  # Soft labels [C, N_max, K] and device copies are accepted as they are.
  ClientData(x=x, y=np.eye(3, dtype=np.float32)[y], num_examples=n)
  jax.device_put(ClientData(x=x, y=y, num_examples=n))


def test_stack_clients_refuses_shared_indices():
  x = np.zeros((6, 2, 2, 1), np.uint8)
  y = np.arange(6) % 3
  with pytest.raises(ValueError, match=r"^partition must give each example to "
                     r"one client, got 1 indices in more than one \(e\.g\. "
                     r"index 2 in clients \[0, 1\]\)"):
    stack_clients(x, y, [np.array([0, 1, 2]), np.array([2, 3])])
  shared = stack_clients(x, y, [np.array([0, 1, 2]), np.array([2, 3])],
                         allow_shared=True)
  np.testing.assert_array_equal(shared.num_examples, [3, 2])


def _fedavg_setup():
  task = tiny_task()
  x, y, n = synthetic_clients()
  alg = fedavg(LocalTraining(task, optax.sgd(0.1), batch_size=4, max_steps=3))
  params, stats = task.init(jax.random.PRNGKey(0))
  server, clients = alg.init(params, stats, 4)
  state = ExperimentState(server, clients, jax.random.PRNGKey(1),
                          jnp.asarray(0, jnp.int32))
  return task, alg, state, ClientData(x=x, y=y, num_examples=n)


def test_run_rounds_refuses_negative_steps_before_compiling():
  _, alg, state, data = _fedavg_setup()
  options = rounds_lib.RoundsOptions(num_rounds=1, clients_per_round=4)
  with pytest.raises(ValueError, match=r"^num_steps must be >= 0, got 1 "
                     r"negative \(-3\)\.$"):
    rounds_lib.run_rounds(alg, state, jax.device_put(data),
                          jnp.array([3, -3, 3, 3], jnp.int32), options)
  with pytest.raises(ValueError, match=r"num_steps must be \[C\] = \[4\] "
                     r"integer step counts, got shape \(3,\)"):
    rounds_lib.run_rounds(alg, state, data, np.array([3, 3, 3], np.int32),
                          options)


def test_evaluators_refuse_mismatched_splits():
  task = tiny_task()                       # [4, 4, 1] images, 3 classes
  x = np.zeros((5, 4, 4, 1), np.uint8)
  y = np.array([0, 1, 2, 0, 1], np.int32)
  make_evaluator(task, x, y)
  for make in (make_evaluator, make_client_evaluator):
    with pytest.raises(ValueError, match=r"^x and y must hold the same number "
                       r"of examples N, got x \(5, 4, 4, 1\) and y \(4,\)\.$"):
      make(task, x, y[:4])
    with pytest.raises(ValueError, match=r"^y must hold class indices in "
                       r"\[0, 3\), got 2 outside it \(-1, 3\)\.$"):
      make(task, x, np.array([0, 1, 3, -1, 1], np.int32))
    with pytest.raises(ValueError, match=r"^x must hold images of the model's "
                       r"input shape \[H, W, Ch\] = \[4, 4, 1\], got "
                       r"\[8, 8, 1\]"):
      make(task, np.zeros((5, 8, 8, 1), np.uint8), y)
    with pytest.raises(ValueError, match=r"dtype float64 with values in "
                       r"\[0.5, 0.5\]; images in \[0, 1\]"):
      make(task, np.full((5, 4, 4, 1), 0.5), y)
