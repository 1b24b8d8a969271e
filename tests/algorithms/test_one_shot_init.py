"""One-shot clients from independent initialisations (``independent_init``)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dd.algorithms import one_shot
from fedjax_dd.core.algorithm import Cohort
from fedjax_dd.core.local import LocalTraining, steps_for
from fedjax_dd.data.stacked import ClientData
from fedjax_dd.distill import ensemble
from tests.conftest import synthetic_clients, tiny_task

leaves = jax.tree_util.tree_leaves


def test_independent_starts_are_each_clients_own_init():
  task = tiny_task(bn=True)
  key = jax.random.PRNGKey(3)
  ids = jnp.array([2, 0, 1])
  params, stats = one_shot.independent_starts(task, key, ids)
  assert leaves(params)[0].shape[0] == 3
  for row, k in enumerate([2, 0, 1]):
    want_p, want_s = task.init(jax.random.fold_in(key, k))
    for a, b in zip(leaves((params, stats)), leaves((want_p, want_s))):
      np.testing.assert_array_equal(a[row], b)
  # Different clients, different starts; the shared init is none of them.
  flat = lambda tree: np.concatenate([np.ravel(a) for a in leaves(tree)])
  shared = flat(task.init(key)[0])
  firsts = [flat(jax.tree_util.tree_map(lambda a, i=i: a[i], params))
            for i in range(3)]
  assert not np.array_equal(firsts[0], firsts[1])
  assert all(not np.array_equal(f, shared) for f in firsts)


def _stage(task, num_steps, independent_init):
  groups = (ensemble.TeacherGroup(task=task, input_fn=lambda x: x,
                                  client_ids=(0, 1, 2, 3)),)
  return one_shot.client_stage(groups,
                               LocalTraining(task, optax.sgd(0.1),
                                             batch_size=4, max_steps=1),
                               num_steps=num_steps,
                               independent_init=independent_init)


def test_client_stage_starts_each_client_from_its_own_init():
  task = tiny_task()
  x, y, n = synthetic_clients()
  data = jax.device_put(ClientData(x=x, y=y, num_examples=n))
  start = task.init(jax.random.PRNGKey(0))
  init_key = jax.random.PRNGKey(5)
  # Clients 0-2 take no step: their models are their starts.
  few = jnp.array([0, 0, 0, 1], jnp.int32)
  shared = _stage(task, few, None)((start,), data, jax.random.PRNGKey(1))
  own = _stage(task, few, init_key)((start,), data, jax.random.PRNGKey(1))
  want = one_shot.independent_starts(task, init_key, jnp.arange(4))
  for a, b in zip(leaves(own.vars[0]), leaves(want)):
    np.testing.assert_array_equal(a[:3], b[:3])
  for a, b in zip(leaves(shared.vars[0][0]), leaves(start[0])):
    np.testing.assert_array_equal(a[:3], np.broadcast_to(b, a[:3].shape))
  # Trained: client 2 equals client 2 trained alone from its own init.
  num_steps = steps_for(data.num_examples, 4, epochs=2)
  key = jax.random.PRNGKey(1)
  teachers = _stage(task, num_steps, init_key)((start,), data, key)
  solo_train = one_shot.local_stage(LocalTraining(task, optax.sgd(0.1),
                                                  batch_size=4,
                                                  max_steps=int(num_steps[2])),
                                    per_client_start=True)
  ids = jnp.array([2])
  solo = solo_train(*one_shot.independent_starts(task, init_key, ids),
                    Cohort(data.x[ids], data.y[ids], data.num_examples[ids],
                           num_steps[ids], ids), key)
  for a, b in zip(leaves(teachers.vars[0][0]), leaves(solo.params)):
    np.testing.assert_allclose(a[2], b[0], rtol=1e-5, atol=1e-6)
